//! Runs the engine component (precompiled by build.rs and embedded in the binary)
//! with a runtime-only wasmtime, and exposes it with the engine's own model types
//! so the rest of the host never sees WIT-generated types.

use anyhow::{Context, Result};
use thereabouts_allocator::{ConfigError, ip::Family, model};
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};

include!("engine_config.rs");

wasmtime::component::bindgen!({ world: "allocator", path: "../wit" });

use exports::thereabouts::ipam::types as wit;

/// The component as built by build.rs: the file the playground transpiles.
pub const COMPONENT_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/thereabouts_allocator.wasm"));
/// The same component precompiled for this host's wasmtime and engine_config().
const COMPONENT_CWASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/thereabouts_allocator.cwasm"));

/// An instantiated engine component. One per process: a CNI call makes a handful
/// of calls into it.
pub struct EngineComponent {
    store: Store<()>,
    instance: Allocator,
}

impl EngineComponent {
    pub fn load() -> Result<Self> {
        let engine = Engine::new(&engine_config()).map_err(anyhow::Error::from).context("creating the wasmtime engine")?;
        // SAFETY: the bytes are the artifact build.rs produced with this very
        // wasmtime version and engine_config(), embedded at compile time; wasmtime
        // still checks version, target and flags and fails cleanly on mismatch.
        let component = unsafe { Component::deserialize(&engine, COMPONENT_CWASM) }.map_err(anyhow::Error::from).context("loading the precompiled engine component")?;
        let mut store = Store::new(&engine, ());
        // The component imports nothing, so an empty linker suffices.
        let instance = Allocator::instantiate(&mut store, &component, &Linker::new(&engine)).map_err(anyhow::Error::from).context("instantiating the engine component")?;
        Ok(Self { store, instance })
    }


    pub fn flat_file_paths(&mut self, network_config: &str) -> Result<Result<Vec<String>, ConfigError>> {
        let api = self.instance.thereabouts_ipam_engine();
        Ok(api.call_flat_file_paths(&mut self.store, network_config)?.map_err(config_error))
    }

    pub fn normalize(&mut self, network_config: &str, flat_file: Option<&str>, cni_args: &str) -> Result<Result<model::NormalizedConfig, ConfigError>> {
        let api = self.instance.thereabouts_ipam_engine();
        let out = api.call_normalize(&mut self.store, network_config, flat_file, cni_args)?;
        Ok(match out {
            Ok(config) => Ok(config_from_wit(config)?),
            Err(e) => Err(config_error(e)),
        })
    }

    pub fn plan(&mut self, range: &model::NormalizedRange, pool: &model::PoolSnapshot, req: &model::Request) -> Result<model::PlanOutcome> {
        let api = self.instance.thereabouts_ipam_engine();
        let out = api.call_plan(&mut self.store, &range_to_wit(range), &pool_to_wit(pool), &request_to_wit(req))?;
        Ok(outcome_from_wit(out))
    }

    pub fn plan_all(
        &mut self,
        config: &model::NormalizedConfig,
        pools: &[model::PoolSnapshot],
        req: &model::Request,
    ) -> Result<Result<Vec<model::PlanOutcome>, model::PlanOutcome>> {
        let api = self.instance.thereabouts_ipam_engine();
        let pools: Vec<_> = pools.iter().map(pool_to_wit).collect();
        let out = api.call_plan_all(&mut self.store, &config_to_wit(config), &pools, &request_to_wit(req))?;
        Ok(out.map(|v| v.into_iter().map(outcome_from_wit).collect()).map_err(outcome_from_wit))
    }

    pub fn release(&mut self, allocations: &[model::Allocation], container_id: &str, ifname: &str) -> Result<Vec<u32>> {
        let api = self.instance.thereabouts_ipam_engine();
        let allocations: Vec<_> = allocations.iter().map(allocation_to_wit).collect();
        Ok(api.call_release(&mut self.store, &allocations, container_id, ifname)?)
    }

    pub fn reservation_name(&mut self, ip: &str, network_name: &str) -> Result<Result<String, ConfigError>> {
        let api = self.instance.thereabouts_ipam_engine();
        Ok(api.call_reservation_name(&mut self.store, ip, network_name)?.map_err(config_error))
    }

    pub fn pool_name(&mut self, cidr: &str, network_name: &str) -> Result<Result<String, ConfigError>> {
        let api = self.instance.thereabouts_ipam_engine();
        Ok(api.call_pool_name(&mut self.store, cidr, network_name)?.map_err(config_error))
    }

    pub fn preview(&mut self, config: &model::NormalizedConfig, pools: &[model::PoolSnapshot], pods: u32) -> Result<Vec<Vec<model::PlanOutcome>>> {
        let api = self.instance.thereabouts_ipam_engine();
        let pools: Vec<_> = pools.iter().map(pool_to_wit).collect();
        let out = api.call_preview(&mut self.store, &config_to_wit(config), &pools, pods)?;
        Ok(out.into_iter().map(|pod| pod.into_iter().map(outcome_from_wit).collect()).collect())
    }
}

fn config_error(e: wit::ConfigError) -> ConfigError {
    ConfigError { code: e.code, field: e.field, message: e.message }
}

fn to_offset(value: u128) -> wit::Offset {
    wit::Offset { high: (value >> 64) as u64, low: value as u64 }
}
fn from_offset(offset: wit::Offset) -> u128 {
    (u128::from(offset.high) << 64) | u128::from(offset.low)
}
fn family(n: u8) -> Family {
    if n == 6 { Family::V6 } else { Family::V4 }
}

fn range_to_wit(r: &model::NormalizedRange) -> wit::NormalizedRange {
    wit::NormalizedRange {
        cidr: r.cidr.clone(),
        prefix_len: r.prefix_len,
        family: r.family.number(),
        first: r.first.clone(),
        last: r.last.clone(),
        first_offset: to_offset(r.first_offset),
        last_offset: to_offset(r.last_offset),
        excludes: r.excludes.clone(),
        exclude_cidrs: r.exclude_cidrs.clone(),
        usable: r.usable.to_string(),
        gateway: r.gateway.clone(),
        pool_name: r.pool_name.clone(),
        requested: r.requested.clone(),
    }
}

fn range_from_wit(r: wit::NormalizedRange) -> Result<model::NormalizedRange> {
    let (first_offset, last_offset) = (from_offset(r.first_offset), from_offset(r.last_offset));
    let (network, excluded) = thereabouts_allocator::range::derived_parts(&r.cidr, first_offset, last_offset, &r.exclude_cidrs)
        .map_err(|e| anyhow::anyhow!("engine returned an inconsistent range: {e}"))?;
    Ok(model::NormalizedRange {
        usable: r.usable.parse().context("engine returned a non-numeric usable count")?,
        family: family(r.family),
        cidr: r.cidr,
        prefix_len: r.prefix_len,
        network,
        first: r.first,
        last: r.last,
        first_offset,
        last_offset,
        excludes: r.excludes,
        exclude_cidrs: r.exclude_cidrs,
        excluded,
        gateway: r.gateway,
        pool_name: r.pool_name,
        requested: r.requested,
    })
}

fn config_to_wit(c: &model::NormalizedConfig) -> wit::NormalizedConfig {
    let d = &c.datastore;
    wit::NormalizedConfig {
        name: c.name.clone(),
        cni_version: c.cni_version.clone(),
        network_name: c.network_name.clone(),
        enable_overlapping_ranges: c.enable_overlapping_ranges,
        ranges: c.ranges.iter().map(range_to_wit).collect(),
        addresses: c
            .addresses
            .iter()
            .map(|a| wit::StaticAddress { address: a.address.clone(), gateway: a.gateway.clone(), family: a.family.number() })
            .collect(),
        routes_json: c.routes_json.clone(),
        dns_json: c.dns_json.clone(),
        pod_ref: c.pod_ref.clone(),
        datastore: wit::DatastoreSettings {
            kind: d.kind.clone(),
            data_dir: d.data_dir.clone(),
            kubeconfig: d.kubeconfig.clone(),
            etcd_hosts: d.etcd_hosts.clone(),
            etcd_username: d.etcd_username.clone(),
            etcd_password: d.etcd_password.clone(),
            etcd_key_file: d.etcd_key_file.clone(),
            etcd_cert_file: d.etcd_cert_file.clone(),
            etcd_ca_cert_file: d.etcd_ca_cert_file.clone(),
            etcd_prefix: d.etcd_prefix.clone(),
        },
        log_file: c.log_file.clone(),
        log_level: c.log_level.clone(),
        configuration_path: c.configuration_path.clone(),
    }
}

fn config_from_wit(c: wit::NormalizedConfig) -> Result<model::NormalizedConfig> {
    let d = c.datastore;
    Ok(model::NormalizedConfig {
        ranges: c.ranges.into_iter().map(range_from_wit).collect::<Result<_>>()?,
        addresses: c
            .addresses
            .into_iter()
            .map(|a| model::StaticAddress { address: a.address, gateway: a.gateway, family: family(a.family) })
            .collect(),
        name: c.name,
        cni_version: c.cni_version,
        network_name: c.network_name,
        enable_overlapping_ranges: c.enable_overlapping_ranges,
        routes_json: c.routes_json,
        dns_json: c.dns_json,
        pod_ref: c.pod_ref,
        datastore: model::DatastoreSettings {
            kind: d.kind,
            data_dir: d.data_dir,
            kubeconfig: d.kubeconfig,
            etcd_hosts: d.etcd_hosts,
            etcd_username: d.etcd_username,
            etcd_password: d.etcd_password,
            etcd_key_file: d.etcd_key_file,
            etcd_cert_file: d.etcd_cert_file,
            etcd_ca_cert_file: d.etcd_ca_cert_file,
            etcd_prefix: d.etcd_prefix,
        },
        log_file: c.log_file,
        log_level: c.log_level,
        configuration_path: c.configuration_path,
    })
}

fn allocation_to_wit(a: &model::Allocation) -> wit::Allocation {
    wit::Allocation { offset: to_offset(a.offset), container_id: a.container_id.clone(), pod_ref: a.pod_ref.clone(), ifname: a.ifname.clone() }
}

fn pool_to_wit(p: &model::PoolSnapshot) -> wit::PoolSnapshot {
    wit::PoolSnapshot {
        taken: p.taken.clone(),
        taken_wide: p.taken_wide.iter().map(|&o| to_offset(o)).collect(),
        reserved: p.reserved.iter().map(|&o| to_offset(o)).collect(),
        held: p.held.iter().map(allocation_to_wit).collect(),
    }
}

fn request_to_wit(r: &model::Request) -> wit::Request {
    wit::Request { container_id: r.container_id.clone(), pod_ref: r.pod_ref.clone(), ifname: r.ifname.clone(), requested_ip: r.requested_ip.clone() }
}

fn assignment_from_wit(a: wit::Assignment) -> model::Assignment {
    model::Assignment { ip: a.ip, address: a.address, offset: from_offset(a.offset), gateway: a.gateway }
}

fn outcome_from_wit(o: wit::PlanOutcome) -> model::PlanOutcome {
    match o {
        wit::PlanOutcome::Reuse(r) => model::PlanOutcome::Reuse { assignment: assignment_from_wit(r.assignment), held_index: r.held_index },
        wit::PlanOutcome::Fresh(a) => model::PlanOutcome::Fresh { assignment: assignment_from_wit(a) },
        wit::PlanOutcome::Exhausted(message) => model::PlanOutcome::Exhausted { message },
        wit::PlanOutcome::Rejected(message) => model::PlanOutcome::Rejected { message },
    }
}
