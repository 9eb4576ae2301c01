//! Runs the engine component (precompiled by build.rs and embedded in the binary)
//! with a runtime-only wasmtime, and exposes it with the engine's own model types
//! so the rest of the host never sees WIT-generated types.

use anyhow::{Context, Result};
use thereabouts_allocator::cluster::ClusterState;
use thereabouts_allocator::{ConfigError, model};
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};

include!("engine_config.rs");

wasmtime::component::bindgen!({ world: "allocator", path: "../wit" });

/// The component as built by build.rs: the file the playground transpiles.
pub const COMPONENT_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/thereabouts_allocator.wasm"));
/// The same component precompiled for this host's wasmtime and engine_config(),
/// page-aligned so its code section (page-aligned inside the artifact) can be
/// made executable where it lies.
static COMPONENT_CWASM: &in_place::PageAligned<[u8]> = &in_place::PageAligned(*include_bytes!(concat!(env!("OUT_DIR"), "/thereabouts_allocator.cwasm")));

/// An instantiated engine component. One per process: a CNI call makes a handful
/// of calls into it.
pub struct EngineComponent {
    store: Store<()>,
    instance: Allocator,
}

impl EngineComponent {
    pub fn load() -> Result<Self> {
        // In place first: the code runs straight from the binary's own read-only
        // pages. Copying the artifact out instead costs each CNI call a fresh
        // half-megabyte of page faults, most of the component's start-up time.
        match Self::load_in_place() {
            Ok(loaded) => Ok(loaded),
            Err(e) => {
                crate::logging::debug(format!("engine component: in-place load failed ({e:#}); loading a copy"));
                Self::load_copy()
            }
        }
    }

    /// Zero-copy: wasmtime uses the embedded artifact where it lies and only
    /// flips its code pages to read+execute (see [`in_place::PublishInPlace`]).
    fn load_in_place() -> Result<Self> {
        let bytes = &COMPONENT_CWASM.0;
        in_place::check_alignment(bytes)?;
        let mut config = engine_config();
        config.with_custom_code_memory(Some(std::sync::Arc::new(in_place::PublishInPlace)));
        let engine = Engine::new(&config).map_err(anyhow::Error::from).context("creating the wasmtime engine")?;
        // SAFETY: as in `load_copy`; in addition the memory is a `static` that
        // lives as long as the process and that nothing writes to.
        let component = unsafe { Component::deserialize_raw(&engine, std::ptr::NonNull::from(bytes)) }
            .map_err(anyhow::Error::from)
            .context("loading the embedded engine component in place")?;
        Self::instantiate(&engine, &component)
    }

    fn load_copy() -> Result<Self> {
        let engine = Engine::new(&engine_config()).map_err(anyhow::Error::from).context("creating the wasmtime engine")?;
        // SAFETY: the bytes are the artifact build.rs produced with this very
        // wasmtime version and engine_config(), embedded at compile time; wasmtime
        // still checks version, target and flags and fails cleanly on mismatch.
        let component =
            unsafe { Component::deserialize(&engine, &COMPONENT_CWASM.0) }.map_err(anyhow::Error::from).context("loading the precompiled engine component")?;
        Self::instantiate(&engine, &component)
    }

    fn instantiate(engine: &Engine, component: &Component) -> Result<Self> {
        let mut store = Store::new(engine, ());
        // The component imports nothing, so an empty linker suffices.
        let instance =
            Allocator::instantiate(&mut store, component, &Linker::new(engine)).map_err(anyhow::Error::from).context("instantiating the engine component")?;
        Ok(Self { store, instance })
    }

    pub fn flat_file_paths(&mut self, network_config: &str) -> Result<Result<Vec<String>, ConfigError>> {
        let api = self.instance.thereabouts_ipam_engine();
        Ok(api.call_flat_file_paths(&mut self.store, network_config)?.map_err(error_from_wit))
    }

    pub fn normalize(&mut self, network_config: &str, flat_file: Option<&str>, cni_args: &str) -> Result<Result<model::NormalizedConfig, ConfigError>> {
        let api = self.instance.thereabouts_ipam_engine();
        let out = api.call_normalize(&mut self.store, network_config, flat_file, cni_args)?;
        Ok(match out {
            Ok(config) => Ok(config_from_wit(config).map_err(inconsistent)?),
            Err(e) => Err(error_from_wit(e)),
        })
    }

    pub fn warnings(&mut self, config: &model::NormalizedConfig) -> Result<Vec<model::ConfigWarning>> {
        let api = self.instance.thereabouts_ipam_engine();
        let out = api.call_warnings(&mut self.store, &config_to_wit(config))?.map_err(error_from_wit).map_err(inconsistent)?;
        Ok(out.into_iter().map(warning_from_wit).collect())
    }

    pub fn plan_all(
        &mut self,
        config: &model::NormalizedConfig,
        pools: &[model::PoolState],
        reservations: model::Reservations,
        req: &model::Request,
    ) -> Result<Result<Vec<model::PlanOutcome>, model::PlanFailure>> {
        let api = self.instance.thereabouts_ipam_engine();
        let pools: Vec<_> = pools.iter().map(pool_to_wit).collect();
        let out = api.call_plan_all(&mut self.store, &config_to_wit(config), &pools, reservations_to_wit(reservations), &request_to_wit(req))?;
        Ok(out.map(|v| v.into_iter().map(outcome_from_wit).collect()).map_err(failure_from_wit))
    }

    /// What a policy is offered in each of `ranges` (see `candidates` in the WIT).
    pub fn candidates(
        &mut self,
        config: &model::NormalizedConfig,
        pools: &[model::PoolState],
        reservations: model::Reservations,
        req: &model::Request,
        ranges: &[u32],
        limit: u32,
    ) -> Result<Result<Vec<model::RangeCandidates>, ConfigError>> {
        let api = self.instance.thereabouts_ipam_engine();
        let pools: Vec<_> = pools.iter().map(pool_to_wit).collect();
        let out =
            api.call_candidates(&mut self.store, &config_to_wit(config), &pools, reservations_to_wit(reservations), &request_to_wit(req), ranges, limit)?;
        Ok(out.map(|listed| listed.into_iter().map(candidates_from_wit).collect()).map_err(error_from_wit))
    }

    pub fn release(
        &mut self,
        range: &model::NormalizedRange,
        network_name: &str,
        allocations: &[model::Allocation],
        attachments: &[model::Attachment],
    ) -> Result<Vec<model::Released>> {
        let api = self.instance.thereabouts_ipam_engine();
        let allocations: Vec<_> = allocations.iter().map(allocation_to_wit).collect();
        let attachments: Vec<_> = attachments.iter().map(attachment_to_wit).collect();
        let out =
            api.call_release(&mut self.store, &range_to_wit(range), network_name, &allocations, &attachments)?.map_err(error_from_wit).map_err(inconsistent)?;
        Ok(out.into_iter().map(released_from_wit).collect())
    }

    pub fn node_slices(&mut self, range: &model::NormalizedRange) -> Result<Result<Vec<String>, ConfigError>> {
        let api = self.instance.thereabouts_ipam_engine();
        Ok(api.call_node_slices(&mut self.store, &range_to_wit(range))?.map_err(error_from_wit))
    }

    pub fn slice_of_range(
        &mut self,
        range: &model::NormalizedRange,
        network_name: &str,
        node: &str,
        slice: &str,
    ) -> Result<Result<model::NormalizedRange, ConfigError>> {
        let api = self.instance.thereabouts_ipam_engine();
        Ok(match api.call_slice_of_range(&mut self.store, &range_to_wit(range), network_name, node, slice)? {
            Ok(r) => Ok(range_from_wit(r).map_err(inconsistent)?),
            Err(e) => Err(error_from_wit(e)),
        })
    }

    pub fn usage(&mut self, config: &model::NormalizedConfig, pools: &[model::PoolState]) -> Result<Vec<model::RangeUsage>> {
        let api = self.instance.thereabouts_ipam_engine();
        let pools: Vec<_> = pools.iter().map(pool_to_wit).collect();
        let out = api.call_usage(&mut self.store, &config_to_wit(config), &pools)?.map_err(error_from_wit).map_err(inconsistent)?;
        out.into_iter().map(|u| usage_from_wit(u).map_err(inconsistent)).collect()
    }

    pub fn preview(&mut self, config: &model::NormalizedConfig, pools: &[model::PoolState], pods: u32) -> Result<model::PreviewTable> {
        let api = self.instance.thereabouts_ipam_engine();
        let pools: Vec<_> = pools.iter().map(pool_to_wit).collect();
        Ok(table_from_wit(api.call_preview(&mut self.store, &config_to_wit(config), &pools, pods)?))
    }

    /// The config's pools in a cluster's objects (`kubectl get ... -o json`); see `cluster-pools` in the WIT.
    pub fn cluster_pools(&mut self, config: &model::NormalizedConfig, objects: &str) -> Result<Result<ClusterState, ConfigError>> {
        let api = self.instance.thereabouts_ipam_engine();
        Ok(api.call_cluster_pools(&mut self.store, &config_to_wit(config), objects)?.map(cluster_from_wit).map_err(error_from_wit))
    }
}

/// The one engine of a test process, one test at a time: an engine is loaded
/// in place, and a second one (or dropping one) would register or unpublish the
/// code pages another is running.
#[cfg(test)]
pub fn test_engine() -> std::sync::MutexGuard<'static, EngineComponent> {
    static ENGINE: std::sync::LazyLock<std::sync::Mutex<EngineComponent>> =
        std::sync::LazyLock::new(|| std::sync::Mutex::new(EngineComponent::load().expect("loading the engine component")));
    ENGINE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Running precompiled code from the binary's read-only data.
mod in_place {
    use anyhow::{Result, bail};

    /// Alignment for the embedded artifact: the largest page size of the hosts
    /// we build for (4 KiB on x86-64; 64 KiB covers arm64 kernels with 64 KiB pages).
    #[repr(C, align(65536))]
    pub struct PageAligned<B: ?Sized>(pub B);

    fn page_size() -> usize {
        // SAFETY: sysconf has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(size).ok().filter(|s| s.is_power_of_two()).unwrap_or(4096)
    }

    pub fn check_alignment(bytes: &[u8]) -> Result<()> {
        if !(bytes.as_ptr() as usize).is_multiple_of(page_size()) {
            bail!("the embedded artifact is not page-aligned");
        }
        Ok(())
    }

    /// wasmtime's hook for making code executable. Its default changes the
    /// protection of memory it mapped itself; here the code is in the binary's
    /// read-only data, mapped from the executable file, so read+execute is all
    /// that changes (it is never writable: W^X holds).
    pub struct PublishInPlace;

    fn protect(ptr: *const u8, len: usize, prot: libc::c_int) -> wasmtime::Result<()> {
        // SAFETY: wasmtime passes the page-aligned text range of an artifact it
        // validated, inside our `static`; changing its protection between R and
        // RX never invalidates a Rust reference to it (both allow reads).
        let rc = unsafe { libc::mprotect(ptr.cast_mut().cast(), len, prot) };
        if rc != 0 {
            return Err(wasmtime::Error::msg(format!("mprotect of the engine's code failed: {}", std::io::Error::last_os_error())));
        }
        Ok(())
    }

    impl wasmtime::CustomCodeMemory for PublishInPlace {
        fn required_alignment(&self) -> usize {
            page_size()
        }
        fn publish_executable(&self, ptr: *const u8, len: usize) -> wasmtime::Result<()> {
            protect(ptr, len, libc::PROT_READ | libc::PROT_EXEC)
        }
        fn unpublish_executable(&self, ptr: *const u8, len: usize) -> wasmtime::Result<()> {
            protect(ptr, len, libc::PROT_READ)
        }
    }
}

thereabouts_allocator::wit_conversions!(crate::component::exports::thereabouts::ipam::types);
use wit_convert::*;

/// The engine never returns an inconsistent record; if it did, that is a host error.
fn inconsistent(e: ConfigError) -> anyhow::Error {
    anyhow::anyhow!("engine returned an inconsistent record: {e}")
}

/// wasmtime could not run the engine: not an answer of the engine, a fault of the
/// host or the embedded artifact. Callers wrap the `anyhow` errors of
/// [`EngineComponent`]'s methods in it so their own error types name the cause.
#[derive(Debug, thiserror::Error)]
#[error("engine component failed: {0:#}")]
pub struct EngineFailure(#[from] pub anyhow::Error);
