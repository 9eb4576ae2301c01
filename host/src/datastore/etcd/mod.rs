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
//!   call's deadline and by [`REQUEST_TIMEOUT`].
//! - Shared by every node: CNI GC removes nothing here (see
//!   [`Capabilities::shared_by_nodes`]); stale entries of pods gone stay (there is
//!   no reconciler yet).
//!
//! The client runs on a private current-thread tokio runtime, so the
//! [`Datastore`] trait stays synchronous, and connects on first use.

pub mod failure;
pub mod layout;
pub mod settings;
mod transaction;
pub mod txn;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, KeyValue, TlsOptions, Txn, TxnOp, TxnOpResponse};
use thereabouts_allocator::model::DatastoreSettings;

use super::failure::Class;
use super::{Capabilities, Datastore, DatastoreError, PoolId, Purpose, Transaction};
use crate::logging;
use layout::{Layout, ReservationValue};
use settings::Settings;
use txn::{CommitTxn, Guard, StoredReservation, Write};

/// Longest wait for one answer (or for connecting), whatever the call's budget.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

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
    runtime: tokio::runtime::Runtime,
    settings: Settings,
    layout: Layout,
    /// Connected on first use (connecting authenticates when a user is set).
    client: Mutex<Option<Client>>,
    /// Requests sent so far by this process (for logs and benches).
    requests: AtomicU32,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl EtcdStore {
    /// Reads the settings and certificate files; sends nothing.
    pub fn open(d: &DatastoreSettings) -> Result<Self, DatastoreError> {
        let settings = settings::read(d).map_err(|detail| DatastoreError::EtcdConfig { detail })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| DatastoreError::EtcdConfig { detail: format!("cannot start the etcd client's runtime: {e}") })?;
        Ok(Self { runtime, settings, layout: Layout::new(d.etcd_prefix.as_deref()), client: Mutex::default(), requests: AtomicU32::new(0) })
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

    fn client_error(&self, e: &etcd_client::Error, action: &str) -> DatastoreError {
        if let etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) = e {
            return DatastoreError::EtcdConfig { detail: format!("{action}: {}", failure::error_text(e)) };
        }
        let (class, detail) = failure::classify(e);
        self.error(class, action, detail)
    }

    /// Runs one request future to completion within `deadline` and [`REQUEST_TIMEOUT`].
    fn bounded<T>(&self, action: &str, deadline: Instant, request: impl Future<Output = Result<T, etcd_client::Error>>) -> Result<T, DatastoreError> {
        let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let limit = deadline.saturating_duration_since(Instant::now()).min(REQUEST_TIMEOUT);
        let outcome = if limit.is_zero() {
            Err(self.error(Class::Transient, action, "the call's time budget ran out before the request".into()))
        } else {
            // The timer must be made inside the runtime: it needs its time driver.
            match self.runtime.block_on(async { tokio::time::timeout(limit, request).await }) {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(e)) => Err(self.client_error(&e, action)),
                Err(_) => Err(self.error(
                    Class::Transient,
                    action,
                    format!("no answer within {} ms (endpoints unreachable, no leader, or a TLS handshake that fails)", limit.as_millis()),
                )),
            }
        };
        match &outcome {
            Ok(_) => logging::debug(format!("etcd request #{n}: {action} -> ok")),
            Err(e) => logging::debug(format!("etcd request #{n}: {action} -> {e}")),
        }
        outcome
    }

    /// The client, connecting (and authenticating) on first use.
    fn client(&self, deadline: Instant) -> Result<Client, DatastoreError> {
        if let Some(client) = lock(&self.client).as_ref() {
            return Ok(client.clone());
        }
        let mut options = ConnectOptions::new().with_connect_timeout(REQUEST_TIMEOUT).with_require_leader(true);
        if let Some((user, password)) = &self.settings.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if let Some(tls) = &self.settings.tls {
            let mut config = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            options = options.with_tls(config);
        }
        let action = match &self.settings.user {
            Some((user, _)) => format!("connecting as user {user}"),
            None => "connecting".to_string(),
        };
        let client = self.bounded(&action, deadline, Client::connect(self.settings.endpoints.clone(), Some(options)))?;
        *lock(&self.client) = Some(client.clone());
        Ok(client)
    }

    /// The pool keys of `pools` as stored now (`None`: absent), with the store
    /// revision of the read: one GET for one pool, else every key in one
    /// read-only transaction (one round trip instead of one per range: under a
    /// burst every attempt pays it).
    fn read_pools(&self, pools: &[PoolId], deadline: Instant) -> Result<(Vec<Option<KeyValue>>, i64), DatastoreError> {
        let mut client = self.client(deadline)?;
        let keys: Vec<String> = pools.iter().map(|p| self.layout.pool_key(&p.name)).collect();
        if let [key] = keys.as_slice() {
            let response = self.bounded(&format!("reading pool key {key}"), deadline, client.get(key.clone(), None))?;
            let read_revision = response.header().map(|h| h.revision()).unwrap_or(0);
            return Ok((vec![response.kvs().first().cloned()], read_revision));
        }
        let gets: Vec<TxnOp> = keys.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
        let action = format!("reading pool keys {} in one transaction", keys.join(", "));
        let response = self.bounded(&action, deadline, client.txn(Txn::new().and_then(gets)))?;
        let read_revision = response.header().map(|h| h.revision()).unwrap_or(0);
        let read = response.op_responses().into_iter().map(|op| if let TxnOpResponse::Get(get) = op { get.kvs().first().cloned() } else { None }).collect();
        Ok((read, read_revision))
    }

    /// The reservation keys `names`, in one read-only transaction.
    pub(super) fn read_reservations(&self, names: &[String], deadline: Instant) -> Result<HashMap<String, Option<StoredReservation>>, DatastoreError> {
        let mut client = self.client(deadline)?;
        let gets: Vec<TxnOp> = names.iter().map(|n| TxnOp::get(self.layout.reservation_key(n), None)).collect();
        let action = format!("reading {} reservation key(s) under {}reservations/", names.len(), self.layout.prefix());
        let response = self.bounded(&action, deadline, client.txn(Txn::new().and_then(gets)))?;
        let mut found: HashMap<String, Option<StoredReservation>> = names.iter().map(|n| (n.clone(), None)).collect();
        for (name, op) in names.iter().zip(response.op_responses()) {
            let TxnOpResponse::Get(get) = op else { continue };
            if let Some(kv) = get.kvs().first() {
                found.insert(
                    name.clone(),
                    Some(StoredReservation {
                        value: ReservationValue::decode(kv.value()).ok(),
                        create_revision: kv.create_revision(),
                        mod_revision: kv.mod_revision(),
                    }),
                );
            }
        }
        Ok(found)
    }

    pub(super) fn send(&self, commit: CommitTxn, pools: &str, deadline: Instant) -> Result<bool, DatastoreError> {
        let mut client = self.client(deadline)?;
        let compares: Vec<Compare> = commit
            .guards
            .into_iter()
            .map(|g| match g {
                Guard::Absent { key } => Compare::create_revision(key, CompareOp::Equal, 0),
                Guard::Unchanged { key, mod_revision } => Compare::mod_revision(key, CompareOp::Equal, mod_revision),
            })
            .collect();
        let ops: Vec<TxnOp> = commit
            .writes
            .into_iter()
            .map(|w| match w {
                Write::Put { key, value } => TxnOp::put(key, value, None),
                Write::Delete { key } => TxnOp::delete(key, None),
            })
            .collect();
        let action = format!("committing pool(s) {pools} in one transaction");
        let response = self.bounded(&action, deadline, client.txn(Txn::new().when(compares).and_then(ops)))?;
        Ok(response.succeeded())
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
        let mut client = self.client(deadline)?;
        let prefix = self.layout.prefix().to_string();
        let options = GetOptions::new().with_prefix().with_keys_only().with_limit(1);
        self.bounded(&format!("reading under {prefix}"), deadline, client.get(prefix.clone(), Some(options))).map(|_| ())
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
