//! One policy, loaded, and its calls. An attachment's hooks are answered by
//! one instance of the policy, made for that attachment at its first call:
//! the policy may keep what it worked out between its `select-ranges` and
//! its `pick-address` calls for the same attachment, never anything from one
//! attachment to the next. A call for another attachment, or for none
//! (`validate-settings`), gets a fresh `Store`, and a store whose call failed
//! (trapped, timed out, went over its memory) is dropped, never entered
//! again. Each store has the config's memory limit (for the instance, over
//! all its calls) and the engine's stack limit, and each call its own
//! wall-clock deadline, kept by the [`Watchdog`]. The component is
//! type-checked against the `policy-extension` world once, at load.

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::time::Duration;

use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, ResourceLimiter, Store, Trap};

use super::bindings::{PolicyExtension, PolicyExtensionPre};
use super::failure::{CallFailure, LoadError};
use super::watchdog::Watchdog;

include!("../policy_engine_config.rs");

/// The per-process policy engine and its watchdog.
pub struct PolicyEngine {
    engine: Engine,
    watchdog: Watchdog,
}

impl PolicyEngine {
    pub fn new() -> Result<Self, LoadError> {
        let engine = Engine::new(&policy_engine_config()).map_err(|e| LoadError::Unloadable { artifact: "(engine)".into(), detail: format!("{e:#}") })?;
        let watchdog = Watchdog::start(&engine).map_err(LoadError::Watchdog)?;
        Ok(PolicyEngine { engine, watchdog })
    }

    /// Loads a trusted artifact (see `artifact::trusted_artifact`).
    pub fn load(&self, artifact: &Path, timeout_ms: u32, memory_mib: u32) -> Result<LoadedPolicy<'_>, LoadError> {
        let unloadable = |e: wasmtime::Error| LoadError::Unloadable { artifact: artifact.to_path_buf(), detail: format!("{e:#}") };
        // SAFETY: `artifact` passed `trusted_artifact`: named by the digest of
        // the policy file and this build's compatibility key, written by the
        // project's compiler into a cache only root can write. wasmtime still
        // checks version, target and settings, and fails cleanly on a mismatch.
        let component = unsafe { Component::deserialize_file(&self.engine, artifact) }.map_err(unloadable)?;
        let linker: Linker<Limits> = Linker::new(&self.engine);
        let pre = linker.instantiate_pre(&component).map_err(unloadable)?;
        let pre = PolicyExtensionPre::new(pre).map_err(unloadable)?;
        Ok(LoadedPolicy { engine: self, pre, timeout_ms, memory_mib, session: RefCell::new(None), instances: Cell::new(0) })
    }
}

pub struct LoadedPolicy<'e> {
    engine: &'e PolicyEngine,
    pre: PolicyExtensionPre<Limits>,
    timeout_ms: u32,
    memory_mib: u32,
    /// The instance serving the attachment of the last successful call.
    session: RefCell<Option<Session>>,
    /// How many instances were made (for tests and the debug log).
    instances: Cell<u32>,
}

/// One attachment's instance of a policy.
struct Session {
    attachment: String,
    store: Store<Limits>,
    instance: PolicyExtension,
}

impl LoadedPolicy<'_> {
    /// Runs `f` in a fresh instance of its own, bounded; classifies what
    /// stopped it.
    pub fn call<R>(&self, f: impl FnOnce(&mut Store<Limits>, &PolicyExtension) -> wasmtime::Result<R>) -> Result<R, CallFailure> {
        self.call_in(None, f)
    }

    /// Runs `f` for `attachment` (any text that names it), bounded: in the
    /// instance that answered this attachment's earlier calls, or in a fresh
    /// one (which then serves its later calls) if there is none, if the last
    /// call was for another attachment, or if it failed.
    pub fn call_for<R>(&self, attachment: &str, f: impl FnOnce(&mut Store<Limits>, &PolicyExtension) -> wasmtime::Result<R>) -> Result<R, CallFailure> {
        self.call_in(Some(attachment), f)
    }

    /// How many instances of the policy were made so far.
    pub fn instances(&self) -> u32 {
        self.instances.get()
    }

    fn call_in<R>(&self, attachment: Option<&str>, f: impl FnOnce(&mut Store<Limits>, &PolicyExtension) -> wasmtime::Result<R>) -> Result<R, CallFailure> {
        let mut slot = self.session.borrow_mut();
        // Another attachment's instance is dropped before anything runs.
        let kept = slot.take().filter(|s| attachment == Some(s.attachment.as_str()));
        let (mut store, instance) = match kept {
            Some(s) => (s.store, Some(s.instance)),
            None => {
                let mut store = Store::new(&self.engine.engine, Limits::new(self.memory_mib));
                store.limiter(|l| l);
                (store, None)
            }
        };
        // One tick from now, whatever ticked before: the watchdog ticks the
        // engine only when a call's deadline passes.
        store.set_epoch_deadline(1);
        let armed = match self.engine.watchdog.arm(Duration::from_millis(u64::from(self.timeout_ms))) {
            Ok(armed) => armed,
            Err(e) => return Err(CallFailure::Trap(format!("cannot arm its deadline: {e}"))),
        };
        let instance = match instance {
            Some(i) => Ok(i),
            None => {
                self.instances.set(self.instances.get() + 1);
                self.pre.instantiate(&mut store)
            }
        };
        let answer = instance.and_then(|instance| f(&mut store, &instance).map(|r| (r, instance)));
        let expired = armed.expired();
        drop(armed);
        match answer {
            Ok((r, instance)) => {
                if let Some(attachment) = attachment {
                    *slot = Some(Session { attachment: attachment.to_string(), store, instance });
                }
                Ok(r)
            }
            // The store is dropped here: a failed instance is never entered again.
            Err(e) => Err(self.classify(&e, store.data(), expired)),
        }
    }

    fn classify(&self, e: &wasmtime::Error, limits: &Limits, expired: bool) -> CallFailure {
        if limits.refused_memory {
            return CallFailure::MemoryLimit { mib: self.memory_mib };
        }
        match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => CallFailure::Timeout { ms: self.timeout_ms },
            Some(Trap::StackOverflow) => CallFailure::StackOverflow,
            _ if expired => CallFailure::Timeout { ms: self.timeout_ms },
            Some(trap) => CallFailure::Trap(trap.to_string()),
            None => CallFailure::Trap(format!("{e:#}")),
        }
    }
}

/// A policy's resources: linear memory up to its limit, and a handful of
/// tables and instances (a Rust component needs a few of each).
pub struct Limits {
    memory_bytes: usize,
    /// A growth past the limit was refused (the guest trapped on it).
    refused_memory: bool,
}

const MAX_TABLE_ELEMENTS: usize = 100_000;
const MAX_INSTANCES: usize = 16;
const MAX_TABLES: usize = 16;
const MAX_MEMORIES: usize = 2;

impl Limits {
    fn new(memory_mib: u32) -> Self {
        Limits { memory_bytes: (memory_mib as usize) << 20, refused_memory: false }
    }
}

impl ResourceLimiter for Limits {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.refused_memory = true;
            // A trap rather than -1: a guest that cannot grow has no good way on.
            return Err(wasmtime::Error::msg(format!("memory limit: {desired} bytes asked, {} allowed", self.memory_bytes)));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}
