//! An etcd in memory, for the store's in-process tests: keys with etcd's
//! revisions (one store revision, bumped once by each transaction or put that
//! writes; a key's `create_revision` and `mod_revision`; absent = 0 for both),
//! guards evaluated for real, and every request recorded as a short line, keys
//! without the default prefix:
//!
//! `CONNECT`, `GET pools/p`, `PROBE`, `TXN GET pools/a, GET pools/b`,
//! `TXN if create(pools/a)=0, mod(reservations/x)=5 then PUT reservations/x, DELETE pools/a -> failed`.
//!
//! Hooks, by request number (1-based since the log was last taken, connecting
//! included, as the store counts): another writer's change just before a
//! request ([`MemoryEtcd::before`]), or a failure as the answer
//! ([`MemoryEtcd::fail`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::layout::DEFAULT_PREFIX;
use super::transport::{Failure, KeyValue, Op, Read, Transport, TxnAnswer};
use super::txn::{Guard, Write};

/// The keys and the store revision.
pub struct Keys {
    revision: i64,
    kvs: BTreeMap<String, KeyValue>,
}

impl Default for Keys {
    /// An empty etcd is at revision 1.
    fn default() -> Self {
        Keys { revision: 1, kvs: BTreeMap::new() }
    }
}

impl Keys {
    /// Another writer's put, at a revision of its own.
    pub fn put(&mut self, key: &str, value: &str) {
        self.revision += 1;
        self.write(&Write::Put { key: key.into(), value: value.as_bytes().to_vec() });
    }

    /// `write` at the current revision.
    fn write(&mut self, write: &Write) {
        match write {
            Write::Put { key, value } => {
                let create_revision = self.kvs.get(key).map_or(self.revision, |kv| kv.create_revision);
                self.kvs.insert(key.clone(), KeyValue { key: key.clone(), value: value.clone(), create_revision, mod_revision: self.revision });
            }
            Write::Delete { key } => {
                self.kvs.remove(key);
            }
        }
    }

    fn holds(&self, guard: &Guard) -> bool {
        match guard {
            Guard::Absent { key } => self.kvs.get(key).map_or(0, |kv| kv.create_revision) == 0,
            Guard::Unchanged { key, mod_revision } => self.kvs.get(key).map_or(0, |kv| kv.mod_revision) == *mod_revision,
        }
    }
}

type Change = Box<dyn FnOnce(&mut Keys) + Send>;

#[derive(Default)]
struct State {
    keys: Keys,
    /// Since the last [`MemoryEtcd::take_log`].
    log: Vec<String>,
    before: HashMap<usize, Change>,
    failures: HashMap<usize, Failure>,
}

/// One in-memory etcd, and one client's connection to it.
#[derive(Default)]
pub struct MemoryEtcd {
    state: Arc<Mutex<State>>,
    connected: AtomicBool,
}

fn short(key: &str) -> &str {
    key.strip_prefix(DEFAULT_PREFIX).unwrap_or(key)
}

fn guard_text(guard: &Guard) -> String {
    match guard {
        Guard::Absent { key } => format!("create({})=0", short(key)),
        Guard::Unchanged { key, mod_revision } => format!("mod({})={mod_revision}", short(key)),
    }
}

fn op_text(op: &Op) -> String {
    match op {
        Op::Get { key } => format!("GET {}", short(key)),
        Op::Write(Write::Put { key, .. }) => format!("PUT {}", short(key)),
        Op::Write(Write::Delete { key }) => format!("DELETE {}", short(key)),
    }
}

impl MemoryEtcd {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Another client of the same etcd, not connected yet (a plugin process).
    pub fn client(&self) -> MemoryEtcd {
        MemoryEtcd { state: self.state.clone(), connected: AtomicBool::new(false) }
    }

    /// A put as etcd's admin (before the test, or between calls).
    pub fn put(&self, key: &str, value: &str) {
        self.state().keys.put(key, value);
    }

    /// Every key with its value, in key order.
    pub fn dump(&self) -> Vec<(String, String)> {
        self.state().keys.kvs.values().map(|kv| (kv.key.clone(), String::from_utf8_lossy(&kv.value).into_owned())).collect()
    }

    /// The requests since the last call, which the hooks' numbers count from.
    pub fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut self.state().log)
    }

    /// Runs `change` just before request `n`.
    pub fn before(&self, n: usize, change: impl FnOnce(&mut Keys) + Send + 'static) {
        self.state().before.insert(n, Box::new(change));
    }

    /// Answers request `n` with `failure`.
    pub fn fail(&self, n: usize, failure: Failure) {
        self.state().failures.insert(n, failure);
    }

    /// Records the request, runs its hooks, then answers it with `answer`.
    fn serve<T>(&self, line: String, answer: impl FnOnce(&mut State) -> (T, String)) -> Result<T, Failure> {
        let mut state = self.state();
        let n = state.log.len() + 1;
        if let Some(change) = state.before.remove(&n) {
            change(&mut state.keys);
        }
        if let Some(failure) = state.failures.remove(&n) {
            state.log.push(line);
            return Err(failure);
        }
        let (value, outcome) = answer(&mut state);
        state.log.push(line + &outcome);
        Ok(value)
    }
}

impl Transport for MemoryEtcd {
    fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    fn connect(&self, _limit: Duration) -> Result<(), Failure> {
        self.serve("CONNECT".into(), |_| ((), String::new()))?;
        self.connected.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn get(&self, key: &str, _limit: Duration) -> Result<Read, Failure> {
        self.serve(format!("GET {}", short(key)), |s| (Read { revision: s.keys.revision, kv: s.keys.kvs.get(key).cloned() }, String::new()))
    }

    fn probe(&self, _prefix: &str, _limit: Duration) -> Result<(), Failure> {
        self.serve("PROBE".into(), |_| ((), String::new()))
    }

    fn txn(&self, guards: &[Guard], ops: &[Op], _limit: Duration) -> Result<TxnAnswer, Failure> {
        let ops_text = ops.iter().map(op_text).collect::<Vec<_>>().join(", ");
        let line = if guards.is_empty() {
            format!("TXN {ops_text}")
        } else {
            format!("TXN if {} then {ops_text}", guards.iter().map(guard_text).collect::<Vec<_>>().join(", "))
        };
        let guarded = !guards.is_empty();
        self.serve(line, |s| {
            let succeeded = guards.iter().all(|g| s.keys.holds(g));
            let mut gets = Vec::new();
            if succeeded {
                if ops.iter().any(|op| matches!(op, Op::Write(_))) {
                    s.keys.revision += 1;
                }
                for op in ops {
                    match op {
                        Op::Get { key } => gets.push(s.keys.kvs.get(key).cloned()),
                        Op::Write(write) => s.keys.write(write),
                    }
                }
            }
            let outcome = match (guarded, succeeded) {
                (false, _) => "",
                (true, true) => " -> succeeded",
                (true, false) => " -> failed",
            };
            (TxnAnswer { succeeded, revision: s.keys.revision, gets }, outcome.to_string())
        })
    }
}
