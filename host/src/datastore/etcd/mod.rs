//! The etcd datastore (`"datastore": "etcd"`, with `etcd_host` and optionally
//! `etcd_username`/`etcd_password` and `etcd_ca_cert_file`/`etcd_cert_file`/
//! `etcd_key_file`): every node's plugin reads and writes the same keys of an
//! etcd cluster (v3 API, gRPC).
//!
//! - Keys ([`layout`]): `<prefix>pools/<pool name>` holds a pool's allocations
//!   (JSON in the shape of an `IPPool` spec); `<prefix>reservations/<name>` one
//!   reserved address (only with `enable_overlapping_ranges`, the default).
//!   Prefix: `etcd_prefix`, default `/thereabouts/`. Not whereabouts' old
//!   (v0.5) etcd layout, which had no pod references and took a lock per call.
//! - [`load`](super::Transaction::load): one GET of the pool key, or for a
//!   multi-range call the read of all its pool keys in one transaction; the
//!   version is its `mod_revision`, absent = empty pool.
//! - [`commit`](super::Transaction::commit): one transaction for every pool of the call
//!   ([`txn`]): each pool key guarded by the `mod_revision` read (absent:
//!   `create_revision == 0`), each new reservation key guarded absent. Either all
//!   of a multi-range ADD lands, or nothing; a failed guard is
//!   [`Retry::Conflict`](super::Retry::Conflict) and the caller reads again and plans again. No
//!   locks, no leases. When reservations are involved, their keys are read first
//!   (one read-only transaction): one held by another attachment refuses the plan
//!   before anything is written, and the planner avoids its address
//!   ([`Pool::reserved`](super::Pool::reserved); [`Retry::Reserved`](super::Retry::Reserved) when the
//!   reservation is older than the pool as read, a conflict when it is newer).
//!   A removed entry's reservation is deleted in the same transaction, guarded by
//!   its `mod_revision`, when it is still the entry's attachment's.
//! - Uncontended ADD: one read of the pool keys (a GET for one range, a
//!   read-only transaction for several), then one transaction for all ranges
//!   (plus one read of the reservation keys with `enable_overlapping_ranges`).
//! - Failures: unreachable, timed out, no leader are [`DatastoreError::Unavailable`]
//!   (CNI code 11). A commit that timed out may still have landed: the runtime's
//!   retry of the ADD finds the entry and keeps it (idempotent), and a DEL
//!   finds it too, so nothing is ever half-written. Wrong user or password,
//!   missing permissions: [`DatastoreError::Denied`]; TLS trouble:
//!   [`DatastoreError::Rejected`]; unreadable settings or certificate files:
//!   [`DatastoreError::EtcdConfig`] (code 7). Every request is bounded by the
//!   call's deadline and by [`REQUEST_TIMEOUT`]. One that failed fast for
//!   want of a member (its connection broke, no leader) is sent again
//!   ([`RESENDS`]): it then goes to a member that answers.
//! - Shared by every node: CNI GC removes nothing here (see
//!   [`Capabilities::shared_by_nodes`]); the controller frees the entries of
//!   pods gone (`thereabouts controller --etcd-config`).
//!
//! The client runs on a private current-thread tokio runtime, so the
//! [`Datastore`] trait stays synchronous, and connects on first use. Requests
//! go through [`transport::Transport`]: etcd_client in production, an
//! in-memory etcd in the tests.

pub mod failure;
pub mod layout;
#[cfg(test)]
mod memory;
pub mod settings;
#[cfg(test)]
mod tests;
mod transaction;
pub mod transport;
pub mod txn;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use thereabouts_allocator::model::DatastoreSettings;

use super::failure::Class;
use super::retry::Backoff;
use super::{Capabilities, Datastore, DatastoreError, PoolId, Purpose, Transaction};
use crate::logging;
use layout::{Layout, ReservationValue};
use settings::Settings;
use transport::{EtcdClient, Failure, KeyValue, Op, Transport};
use txn::{CommitTxn, StoredReservation};

/// Longest wait for one answer (or for connecting), whatever the call's budget.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times a request is sent again after it failed as unavailable
/// before its wait ran out: a member stopped, or lost its leader, or its
/// connection was reset. The client balances over every endpoint, and the
/// request sent again goes to a member that answers (with a follower down,
/// 55 of 261 ADDs of the fault trials failed without it). Safe for every
/// request the store sends: reads, and transactions whose every written pool
/// is guarded by the revision read, so one that landed before its answer was
/// lost fails its guards when sent again, and the caller plans again on a new
/// read, which shows what landed. A request that waited its whole limit is
/// not sent again: no member answers, and the budget would go in waits.
const RESENDS: u32 = 3;
/// The first pause before a resend (doubling, jittered, up to a second): a
/// new leader is elected in about a second.
const FIRST_RESEND_PAUSE: Duration = Duration::from_millis(100);

/// Pauses after a conflict: from [`FIRST_CONFLICT_PAUSE`] doubling up to
/// [`MAX_CONFLICT_PAUSE`] (jittered). Every writer of a pool competes for one
/// key, and a failed attempt costs a read of each pool and the reservation
/// keys, a transaction and the planning: with the default ceiling (250 ms)
/// 200 plugins starting at once keep trying hundreds of times a second for a
/// few dozen commits a second, and the failed attempts take the CPU the
/// successful ones need (bench_etcd_burst: ~12 re-plans per burst ADD). A
/// longer ceiling spreads the losers out.
const FIRST_CONFLICT_PAUSE: Duration = Duration::from_millis(10);
const MAX_CONFLICT_PAUSE: Duration = Duration::from_secs(1);

pub struct EtcdStore {
    settings: Settings,
    layout: Layout,
    /// Connected on first use (connecting authenticates when a user is set).
    transport: Box<dyn Transport>,
    /// Requests sent so far by this process (for logs and benches).
    requests: AtomicU32,
}

impl EtcdStore {
    /// Reads the settings and certificate files; sends nothing.
    pub fn open(d: &DatastoreSettings) -> Result<Self, DatastoreError> {
        let settings = settings::read(d).map_err(|detail| DatastoreError::EtcdConfig { detail })?;
        let client = EtcdClient::new(settings.clone()).map_err(|detail| DatastoreError::EtcdConfig { detail })?;
        Ok(Self::with_transport(settings, Layout::new(d.etcd_prefix.as_deref()), Box::new(client)))
    }

    /// A store sending its requests through `transport`.
    pub(crate) fn with_transport(settings: Settings, layout: Layout, transport: Box<dyn Transport>) -> Self {
        Self { settings, layout, transport, requests: AtomicU32::new(0) }
    }

    /// etcd requests sent so far (connecting counts as one).
    pub fn requests(&self) -> u32 {
        self.requests.load(Ordering::Relaxed)
    }

    fn error(&self, class: Class, action: &str, detail: String) -> DatastoreError {
        let detail = match class {
            Class::Denied => format!("{detail} (check etcd_username, etcd_password and the user's role on the prefix)"),
            _ => detail,
        };
        class.error(format!("etcd {}", self.settings.endpoints_text()), action, detail)
    }

    fn failure(&self, failure: Failure, action: &str) -> DatastoreError {
        match failure {
            Failure::Config { detail } => DatastoreError::EtcdConfig { detail: format!("{action}: {detail}") },
            Failure::Failed { class, detail } => self.error(class, action, detail),
        }
    }

    /// Sends one request, waiting at most until `deadline` and
    /// [`REQUEST_TIMEOUT`] for each answer; sent again ([`RESENDS`]) when it
    /// failed fast as unavailable.
    fn bounded<T>(&self, action: &str, deadline: Instant, request: impl Fn(Duration) -> Result<T, Failure>) -> Result<T, DatastoreError> {
        let mut backoff = Backoff::between(FIRST_RESEND_PAUSE, Duration::from_secs(1));
        let mut resent = 0;
        loop {
            let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
            let limit = deadline.saturating_duration_since(Instant::now()).min(REQUEST_TIMEOUT);
            if limit.is_zero() {
                return Err(self.error(Class::Transient, action, "the call's time budget ran out before the request".into()));
            }
            let started = Instant::now();
            let outcome = request(limit);
            let fast = started.elapsed() < limit;
            let unavailable = matches!(outcome, Err(Failure::Failed { class: Class::Transient, .. }));
            let outcome = outcome.map_err(|f| self.failure(f, action));
            match &outcome {
                Ok(_) => logging::debug(format!("etcd request #{n}: {action} -> ok")),
                Err(e) => logging::debug(format!("etcd request #{n}: {action} -> {e}")),
            }
            if !(unavailable && fast && resent < RESENDS && backoff.pause(deadline)) {
                return outcome;
            }
            resent += 1;
        }
    }

    /// The transport, connecting (and authenticating) on first use.
    fn client(&self, deadline: Instant) -> Result<&dyn Transport, DatastoreError> {
        if !self.transport.connected() {
            let action = match &self.settings.user {
                Some((user, _)) => format!("connecting as user {user}"),
                None => "connecting".to_string(),
            };
            self.bounded(&action, deadline, |limit| self.transport.connect(limit))?;
        }
        Ok(self.transport.as_ref())
    }

    /// The pool keys of `pools` as stored now (`None`: absent), with the store
    /// revision of the read: one GET for one pool, else every key in one
    /// read-only transaction (one round trip instead of one per range: under a
    /// burst every attempt pays it).
    fn read_pools(&self, pools: &[PoolId], deadline: Instant) -> Result<(Vec<Option<KeyValue>>, i64), DatastoreError> {
        let client = self.client(deadline)?;
        let keys: Vec<String> = pools.iter().map(|p| self.layout.pool_key(&p.name)).collect();
        if let [key] = keys.as_slice() {
            let read = self.bounded(&format!("reading pool key {key}"), deadline, |limit| client.get(key, limit))?;
            return Ok((vec![read.kv], read.revision));
        }
        let gets: Vec<Op> = keys.iter().map(|k| Op::Get { key: k.clone() }).collect();
        let action = format!("reading pool keys {} in one transaction", keys.join(", "));
        let response = self.bounded(&action, deadline, |limit| client.txn(&[], &gets, limit))?;
        Ok((response.gets, response.revision))
    }

    /// The reservation keys `names`, in one read-only transaction.
    pub(super) fn read_reservations(&self, names: &[String], deadline: Instant) -> Result<HashMap<String, Option<StoredReservation>>, DatastoreError> {
        let client = self.client(deadline)?;
        let gets: Vec<Op> = names.iter().map(|n| Op::Get { key: self.layout.reservation_key(n) }).collect();
        let action = format!("reading {} reservation key(s) under {}reservations/", names.len(), self.layout.prefix());
        let response = self.bounded(&action, deadline, |limit| client.txn(&[], &gets, limit))?;
        let mut found: HashMap<String, Option<StoredReservation>> = names.iter().map(|n| (n.clone(), None)).collect();
        for (name, get) in names.iter().zip(response.gets) {
            if let Some(kv) = get {
                found.insert(
                    name.clone(),
                    Some(StoredReservation {
                        value: ReservationValue::decode(&kv.value).ok(),
                        create_revision: kv.create_revision,
                        mod_revision: kv.mod_revision,
                    }),
                );
            }
        }
        Ok(found)
    }

    pub(super) fn send(&self, commit: CommitTxn, pools: &str, deadline: Instant) -> Result<bool, DatastoreError> {
        let client = self.client(deadline)?;
        let ops: Vec<Op> = commit.writes.into_iter().map(Op::Write).collect();
        let action = format!("committing pool(s) {pools} in one transaction");
        let response = self.bounded(&action, deadline, |limit| client.txn(&commit.guards, &ops, limit))?;
        Ok(response.succeeded)
    }
}

impl Datastore for EtcdStore {
    fn describe(&self) -> String {
        let mut text = format!("etcd datastore: prefix {} at {}", self.layout.prefix(), self.settings.endpoints_text());
        if let Some((user, _)) = &self.settings.user {
            text.push_str(&format!(" (user {user})"));
        }
        text
    }

    /// Every node writes the same keys: GC cannot tell another node's live
    /// entry from garbage, so it removes nothing (as with Kubernetes).
    fn capabilities(&self) -> Capabilities {
        Capabilities::shared((FIRST_CONFLICT_PAUSE, MAX_CONFLICT_PAUSE))
    }

    /// One read of the prefix (a key at most): reachable, a leader, credentials
    /// and read permission on the prefix.
    fn check_usable(&self, deadline: Instant) -> Result<(), DatastoreError> {
        let client = self.client(deadline)?;
        let prefix = self.layout.prefix();
        self.bounded(&format!("reading under {prefix}"), deadline, |limit| client.probe(prefix, limit))
    }

    /// No lock, no lease: compare-and-swap alone (see [`transaction`]).
    fn begin<'s>(&'s self, pools: &[PoolId], _purpose: Purpose<'_>, deadline: Instant) -> Result<Box<dyn Transaction + 's>, DatastoreError> {
        Ok(Box::new(transaction::EtcdTransaction::new(self, pools, deadline)))
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        logging::debug(format!("etcd datastore: {} request(s)", self.requests()));
    }
}
