//! The Kubernetes datastore (`"datastore": "kubernetes"`, or a config that only
//! sets `kubernetes.kubeconfig`): whereabouts' `IPPool` and
//! `OverlappingRangeIPReservation` objects, read and written exactly as
//! whereabouts v0.9.4 does, so both plugins can share a cluster's pools.
//!
//! - Namespace: the kubeconfig's current context's, `kube-system` if it names none.
//! - [`load`](Datastore::load): GET the `IPPool`; 404 = empty pool (created on commit).
//! - [`commit`](Datastore::commit), all or nothing:
//!   1. reservations first: POST one `OverlappingRangeIPReservation` per new
//!      address. One that exists for the same pod and interface is adopted; one
//!      held by anyone else releases what this commit created, is remembered as
//!      [`reserved`](Datastore::reserved) for that pool, and reports a conflict
//!      (the caller plans again around it);
//!   2. pools in order: POST a missing pool (409 = someone created it: conflict),
//!      PATCH an existing one with a JSON patch that first tests the
//!      `resourceVersion` read (422 = it moved: conflict). If a pool fails, the
//!      pools already written get their new entries removed again and the new
//!      reservations are deleted, then the error is returned;
//!   3. reservations of removed entries are deleted (only when still held by the
//!      removed entry's pod and interface; absence is fine).
//! - No lock, unlike whereabouts' cluster-wide `Lease`: the `resourceVersion`
//!   test is the only serialization, as it is for whereabouts' own writes.
//! - Uncontended ADD: per range one GET, one POST (reservation) and one PATCH (or
//!   POST of a new pool); two without `enable_overlapping_ranges`.
//! - Failures: unreachable, timeouts, 429 and 5xx are [`DatastoreError::Unavailable`]
//!   (CNI code 11); 401/403 [`DatastoreError::Denied`]; a bad kubeconfig
//!   [`DatastoreError::Kubeconfig`] (code 7). Every request is bounded by the
//!   call's deadline (and by [`REQUEST_TIMEOUT`]).
//!
//! The client runs on a private current-thread tokio runtime, so the
//! [`Datastore`] trait stays synchronous and nothing of it exists unless this
//! datastore is selected.

pub mod crd;
pub mod failure;
pub mod kubeconfig;
pub mod patch;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use http::Method;
use kube::core::Status;
use serde_json::{Value, json};
use thereabouts_allocator::model::Allocation;

use super::retry::{self, Backoff};
use super::{Change, Datastore, DatastoreError, Pool, PoolId, PoolUpdate, UpdateLock, Version};
use crate::logging;
use crd::{IPPOOLS, PoolObject, RESERVATIONS};
use failure::Class;

/// Longest wait for one answer, whatever the call's budget (whereabouts: 10 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Answers 429/503/504 are retried this often (jittered backoff from 50 ms,
/// or the server's `retryAfterSeconds`), within the deadline.
const THROTTLE_RETRIES: u32 = 4;
/// Time allowed to undo a failed commit even when the call's deadline has passed:
/// leaving half a commit behind is worse than answering a little late.
const CLEANUP_GRACE: Duration = Duration::from_secs(2);

const JSON_PATCH: &str = "application/json-patch+json";
const JSON: &str = "application/json";

pub struct KubernetesStore {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
    /// The API server URL, for messages.
    server: String,
    namespace: String,
    kubeconfig: PathBuf,
    /// The current call's deadline: set by `lock_for_update` and `commit`, which
    /// receive it; until then the default command budget from opening.
    deadline: Mutex<Instant>,
    requests: AtomicU32,
    /// The last object read per pool name: its keys and shape make the patch.
    pools: Mutex<HashMap<String, PoolObject>>,
    /// Offsets found reserved by others, per pool name.
    reserved: Mutex<HashMap<String, BTreeSet<u128>>>,
}

/// An API answer: the object (2xx) or the `Status` of a failure the caller
/// interprets (404, 409, 422, ...).
enum Reply {
    Object(Value),
    Status(Box<Status>),
}

/// How a reservation attempt ended.
enum Reservation {
    Created { uid: String },
    /// It existed already for the same pod and interface (a retried ADD).
    Adopted,
    HeldElsewhere(crd::ReservationObject),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KubernetesStore {
    /// Reads the kubeconfig and builds the client; sends nothing.
    pub fn open(kubeconfig_path: &Path) -> Result<Self, DatastoreError> {
        let unusable = |detail: String| DatastoreError::Kubeconfig { path: kubeconfig_path.to_path_buf(), detail };
        let (file, namespace) = kubeconfig::read(kubeconfig_path).map_err(unusable)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| DatastoreError::io(kubeconfig_path, e))?;
        let (client, server) = runtime
            .block_on(async {
                let mut config = kubeconfig::client_config(file).await?;
                // Retries happen here, visibly and within the deadline.
                config.default_retry = false;
                config.connect_timeout = Some(REQUEST_TIMEOUT);
                let server = config.cluster_url.to_string().trim_end_matches('/').to_string();
                // The client spawns its dispatcher task: inside the runtime.
                let client = kube::Client::try_from(config).map_err(|e| kubeconfig::error_text(&e))?;
                Ok::<_, String>((client, server))
            })
            .map_err(unusable)?;
        Ok(Self {
            runtime,
            client,
            server,
            namespace,
            kubeconfig: kubeconfig_path.to_path_buf(),
            deadline: Mutex::new(Instant::now() + retry::budget(retry::OTHER_BUDGET)),
            requests: AtomicU32::new(0),
            pools: Mutex::default(),
            reserved: Mutex::default(),
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// API requests sent so far.
    pub fn requests(&self) -> u32 {
        self.requests.load(Ordering::Relaxed)
    }

    fn deadline(&self) -> Instant {
        *lock(&self.deadline)
    }

    fn set_deadline(&self, deadline: Instant) {
        *lock(&self.deadline) = deadline;
    }

    fn pool_path(&self, name: &str) -> String {
        crd::object_path(&self.namespace, IPPOOLS, name)
    }

    fn reservation_path(&self, name: &str) -> String {
        crd::object_path(&self.namespace, RESERVATIONS, name)
    }

    /// One request, bounded by `deadline` and [`REQUEST_TIMEOUT`]; 429/503/504
    /// are retried a few times while time remains. Transport failures are
    /// returned as errors, API failures as [`Reply::Status`].
    fn call(&self, method: Method, path: &str, body: Option<(&str, &Value)>, action: &str, deadline: Instant) -> Result<Reply, DatastoreError> {
        let mut throttled = 0;
        let mut backoff = Backoff::between(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(self.unavailable(action, "the call's time limit ran out before the request".into()));
            }
            let limit = remaining.min(REQUEST_TIMEOUT);
            let mut request = http::Request::builder().method(method.clone()).uri(path).header(http::header::ACCEPT, JSON);
            let bytes = match body {
                Some((content_type, value)) => {
                    request = request.header(http::header::CONTENT_TYPE, content_type);
                    serde_json::to_vec(value).unwrap_or_default()
                }
                None => Vec::new(),
            };
            let request = request.body(bytes).map_err(|e| self.rejected(action, format!("cannot build the request: {e}")))?;
            let number = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
            let started = Instant::now();
            // The timer needs the runtime's context: create it inside.
            let outcome = self.runtime.block_on(async { tokio::time::timeout(limit, self.client.request_text(request)).await });
            let took = started.elapsed();
            let log = |answer: &str| logging::debug(format!("kubernetes API request #{number}: {method} {path} -> {answer} in {} ms", took.as_millis()));
            match outcome {
                Err(_) => {
                    log("no answer");
                    return Err(self.unavailable(action, format!("no answer within {} ms", limit.as_millis())));
                }
                Ok(Ok(text)) => {
                    log("ok");
                    let value = if text.trim().is_empty() { Value::Null } else { serde_json::from_str(&text).map_err(|e| self.rejected(action, format!("answer is not JSON: {e}")))? };
                    return Ok(Reply::Object(value));
                }
                Ok(Err(kube::Error::Api(status))) => {
                    log(&format!("{} {}", status.code, status.reason));
                    logging::debug(format!("kubernetes API answer #{number}: {}", failure::describe_status(&status)));
                    if matches!(status.code, 429 | 503 | 504) && throttled < THROTTLE_RETRIES {
                        throttled += 1;
                        let asked = status.details.as_ref().map_or(0, |d| d.retry_after_seconds);
                        let slept = if asked > 0 {
                            let pause = Duration::from_secs(u64::from(asked)).min(Duration::from_secs(1));
                            Instant::now() + pause < deadline && {
                                std::thread::sleep(pause);
                                true
                            }
                        } else {
                            backoff.pause(deadline)
                        };
                        if slept {
                            continue;
                        }
                    }
                    return Ok(Reply::Status(status));
                }
                Ok(Err(e)) => {
                    let (class, detail) = failure::transport(&e);
                    log(&format!("failed: {detail}"));
                    return Err(self.failure(class, action, detail));
                }
            }
        }
    }

    fn failure(&self, class: Class, action: &str, detail: String) -> DatastoreError {
        let (server, action) = (self.server.clone(), action.to_string());
        match class {
            Class::Transient => DatastoreError::Unavailable { server, action, detail },
            Class::Denied => DatastoreError::Denied { server, action, detail },
            Class::Rejected => DatastoreError::Rejected { server, action, detail },
        }
    }

    fn unavailable(&self, action: &str, detail: String) -> DatastoreError {
        self.failure(Class::Transient, action, detail)
    }

    fn rejected(&self, action: &str, detail: String) -> DatastoreError {
        self.failure(Class::Rejected, action, detail)
    }

    /// An API answer the caller did not expect.
    fn status_error(&self, status: &Status, action: &str) -> DatastoreError {
        self.failure(failure::classify(status.code), action, failure::describe_status(status))
    }

    fn read_pool(&self, pool: &PoolId, deadline: Instant) -> Result<Option<PoolObject>, DatastoreError> {
        let action = format!("reading IPPool {}/{}", self.namespace, pool.name);
        match self.call(Method::GET, &self.pool_path(&pool.name), None, &action, deadline)? {
            Reply::Object(object) => {
                let malformed = |detail: String| DatastoreError::Malformed { object: format!("IPPool {}/{}", self.namespace, pool.name), detail };
                let parsed = crd::parse_pool(&object).map_err(malformed)?;
                if let Some(range) = parsed.range.as_deref().filter(|r| *r != pool.cidr) {
                    return Err(malformed(format!("it holds range {range}, expected {}", pool.cidr)));
                }
                if !parsed.unparsable.is_empty() {
                    logging::debug(format!("IPPool {}: ignoring allocation keys that are no offset: {:?}", pool.name, parsed.unparsable));
                }
                Ok(Some(parsed))
            }
            Reply::Status(s) if failure::is_object_not_found(&s, &pool.name) => Ok(None),
            Reply::Status(s) => Err(self.status_error(&s, &action)),
        }
    }

    /// POSTs the reservation; on AlreadyExists looks at who holds it.
    fn reserve(&self, name: &str, holder: &Allocation, deadline: Instant) -> Result<Reservation, DatastoreError> {
        let action = format!("creating OverlappingRangeIPReservation {}/{name}", self.namespace);
        let body = crd::new_reservation(name, &self.namespace, holder);
        let collection = crd::collection_path(&self.namespace, RESERVATIONS);
        // Twice at most: a reservation deleted between our POST and GET is free again.
        for _ in 0..2 {
            match self.call(Method::POST, &collection, Some((JSON, &body)), &action, deadline)? {
                Reply::Object(created) => return Ok(Reservation::Created { uid: crd::parse_reservation(&created).uid }),
                Reply::Status(s) if s.code == 409 => {}
                Reply::Status(s) => return Err(self.status_error(&s, &action)),
            }
            let reading = format!("reading OverlappingRangeIPReservation {}/{name}", self.namespace);
            match self.call(Method::GET, &self.reservation_path(name), None, &reading, deadline)? {
                Reply::Object(existing) => {
                    let existing = crd::parse_reservation(&existing);
                    return Ok(if existing.is_held_by(holder) { Reservation::Adopted } else { Reservation::HeldElsewhere(existing) });
                }
                Reply::Status(s) if failure::is_object_not_found(&s, name) => continue,
                Reply::Status(s) => return Err(self.status_error(&s, &reading)),
            }
        }
        Err(DatastoreError::Conflict { pool: format!("(reservation {name})") })
    }

    /// DELETE with a uid precondition (only the object we know, never a successor).
    fn delete_reservation(&self, name: &str, uid: &str, deadline: Instant) -> Result<(), DatastoreError> {
        let action = format!("deleting OverlappingRangeIPReservation {}/{name}", self.namespace);
        let mut options = json!({"apiVersion": "v1", "kind": "DeleteOptions"});
        if !uid.is_empty() {
            options["preconditions"] = json!({"uid": uid});
        }
        match self.call(Method::DELETE, &self.reservation_path(name), Some((JSON, &options)), &action, deadline)? {
            Reply::Object(_) => Ok(()),
            // Gone already, or replaced by someone else's (uid precondition failed).
            Reply::Status(s) if s.code == 404 || s.code == 409 => Ok(()),
            Reply::Status(s) => Err(self.status_error(&s, &action)),
        }
    }

    /// Deletes the reservation `name` if `holder`'s pod and interface hold it.
    fn unreserve(&self, name: &str, holder: &Allocation, deadline: Instant) -> Result<(), DatastoreError> {
        let action = format!("reading OverlappingRangeIPReservation {}/{name}", self.namespace);
        match self.call(Method::GET, &self.reservation_path(name), None, &action, deadline)? {
            Reply::Object(object) => {
                let existing = crd::parse_reservation(&object);
                if existing.is_held_by(holder) {
                    self.delete_reservation(name, &existing.uid, deadline)
                } else {
                    logging::debug(format!("reservation {name} is held by {} {}, not by {}; left alone", existing.podref, existing.ifname, holder.pod_ref));
                    Ok(())
                }
            }
            Reply::Status(s) if failure::is_object_not_found(&s, name) => Ok(()),
            Reply::Status(s) => Err(self.status_error(&s, &action)),
        }
    }

    /// Best-effort removal of the reservations this commit created.
    fn release_created(&self, created: &[(String, String)], deadline: Instant) {
        for (name, uid) in created {
            if let Err(e) = self.delete_reservation(name, uid, deadline) {
                logging::error(format!("could not delete reservation {name} of a failed commit: {e}"));
            }
        }
    }

    /// Writes one pool's changes: POST when it did not exist, else the
    /// compare-and-swap PATCH against the version read.
    fn write_pool(&self, update: &PoolUpdate, deadline: Instant) -> Result<(), DatastoreError> {
        let name = &update.pool.name;
        let conflict = || DatastoreError::Conflict { pool: name.clone() };
        let inconsistent = |detail: String| DatastoreError::Inconsistent { pool: name.clone(), detail };
        if update.expected.is_absent() {
            let mut inserts = Vec::new();
            for change in &update.changes {
                match change {
                    Change::Insert(a) => inserts.push(a),
                    Change::Reserve { .. } | Change::Unreserve { .. } => {}
                    other => return Err(inconsistent(format!("{other:?} on a pool that does not exist"))),
                }
            }
            let action = format!("creating IPPool {}/{name}", self.namespace);
            let body = crd::new_pool(name, &self.namespace, &update.pool.cidr, &inserts);
            return match self.call(Method::POST, &crd::collection_path(&self.namespace, IPPOOLS), Some((JSON, &body)), &action, deadline)? {
                Reply::Object(_) => Ok(()),
                Reply::Status(s) if s.code == 409 => Err(conflict()),
                Reply::Status(s) => Err(self.status_error(&s, &action)),
            };
        }
        let read = lock(&self.pools).get(name).filter(|p| p.resource_version == update.expected.0).cloned();
        let read = read.ok_or_else(|| inconsistent(format!("commit against version {:?}, which this process did not read", update.expected.0)))?;
        let patch = patch::update(&read, &update.changes).map_err(inconsistent)?;
        let action = format!("patching IPPool {}/{name}", self.namespace);
        let result = match self.call(Method::PATCH, &self.pool_path(name), Some((JSON_PATCH, &patch)), &action, deadline)? {
            Reply::Object(_) => Ok(()),
            // The resourceVersion test failed (whereabouts retries on exactly this),
            // or the pool was deleted since.
            Reply::Status(s) if failure::is_failed_test(&s) || s.code == 409 || failure::is_object_not_found(&s, name) => Err(conflict()),
            Reply::Status(s) => Err(self.status_error(&s, &action)),
        };
        // Whatever happened, the version read is stale now.
        lock(&self.pools).remove(name);
        result
    }

    /// The [`Change::Unreserve`]s of `updates` (pools already written), best effort.
    fn unreserve_all(&self, updates: &[&PoolUpdate], deadline: Instant) {
        for update in updates {
            for change in &update.changes {
                let Change::Unreserve { name, holder } = change else { continue };
                if let Err(e) = self.unreserve(name, holder, deadline) {
                    logging::error(format!("released offset {} of pool {} but could not delete its reservation {name}: {e}", holder.offset, update.pool.name));
                }
            }
        }
    }

    /// Removes the entries `written` inserted (best effort, see [`patch::rollback`]).
    fn undo(&self, written: &[&PoolUpdate], deadline: Instant) {
        for update in written.iter().rev() {
            let inserted: Vec<&Allocation> = update.changes.iter().filter_map(|c| if let Change::Insert(a) = c { Some(a) } else { None }).collect();
            if inserted.is_empty() {
                continue;
            }
            let action = format!("rolling back IPPool {}/{}", self.namespace, update.pool.name);
            match self.call(Method::PATCH, &self.pool_path(&update.pool.name), Some((JSON_PATCH, &patch::rollback(&inserted))), &action, deadline) {
                Ok(Reply::Object(_)) => {}
                // Our entries are not there any more: nothing to undo.
                Ok(Reply::Status(s)) if s.code == 422 || s.code == 404 => {}
                Ok(Reply::Status(s)) => logging::error(format!("{}", self.status_error(&s, &action))),
                Err(e) => logging::error(format!("could not roll back a failed commit: {e}")),
            }
        }
    }
}

impl Datastore for KubernetesStore {
    fn describe(&self) -> String {
        format!("kubernetes datastore: namespace {} at {} (kubeconfig {})", self.namespace, self.server, self.kubeconfig.display())
    }

    fn load(&self, pool: &PoolId) -> Result<Pool, DatastoreError> {
        match self.read_pool(pool, self.deadline())? {
            Some(object) => {
                let loaded = Pool { version: Version(object.resource_version.clone()), entries: object.entries.clone() };
                lock(&self.pools).insert(pool.name.clone(), object);
                Ok(loaded)
            }
            None => {
                lock(&self.pools).remove(&pool.name);
                Ok(Pool::default())
            }
        }
    }

    fn commit(&self, updates: &[PoolUpdate], deadline: Instant) -> Result<(), DatastoreError> {
        self.set_deadline(deadline);
        let updates: Vec<&PoolUpdate> = updates.iter().filter(|u| !u.changes.is_empty()).collect();
        let cleanup_deadline = || deadline.max(Instant::now() + CLEANUP_GRACE);

        // 1. Reservations of new addresses, before any pool shows the address.
        let mut created: Vec<(String, String)> = Vec::new();
        for update in &updates {
            for change in &update.changes {
                let Change::Reserve { name, holder } = change else { continue };
                match self.reserve(name, holder, deadline) {
                    Ok(Reservation::Created { uid }) => created.push((name.clone(), uid)),
                    Ok(Reservation::Adopted) => {}
                    Ok(Reservation::HeldElsewhere(owner)) => {
                        logging::debug(format!(
                            "address of offset {} in pool {} is reserved as {name} by {} {} (container {}); planning around it",
                            holder.offset, update.pool.name, owner.podref, owner.ifname, owner.containerid
                        ));
                        lock(&self.reserved).entry(update.pool.name.clone()).or_default().insert(holder.offset);
                        self.release_created(&created, cleanup_deadline());
                        return Err(DatastoreError::Conflict { pool: update.pool.name.clone() });
                    }
                    Err(e) => {
                        self.release_created(&created, cleanup_deadline());
                        return Err(e);
                    }
                }
            }
        }

        // 2. Pools, in order; a failure undoes the ones written.
        let mut written: Vec<&PoolUpdate> = Vec::new();
        for update in &updates {
            if update.changes.iter().all(|c| matches!(c, Change::Reserve { .. } | Change::Unreserve { .. })) {
                continue;
            }
            if let Err(e) = self.write_pool(update, deadline) {
                if !written.is_empty() || !created.is_empty() {
                    let cleanup = cleanup_deadline();
                    self.undo(&written, cleanup);
                    self.release_created(&created, cleanup);
                    // Removals are not undone (a DEL may stop half way and is
                    // retried); the entries they removed are gone for good, and
                    // the retry will not see them: free their reservations now.
                    self.unreserve_all(&written, cleanup);
                }
                return Err(e);
            }
            written.push(update);
        }

        // 3. Reservations of removed entries. The pools no longer hold the
        // addresses; a reservation left behind only blocks its address.
        self.unreserve_all(&updates, cleanup_deadline());
        Ok(())
    }

    /// A cheap read of the pool collection: reachable, authorized, CRDs installed.
    fn check_usable(&self) -> Result<(), DatastoreError> {
        let action = format!("listing IPPools in namespace {}", self.namespace);
        let path = format!("{}?limit=1", crd::collection_path(&self.namespace, IPPOOLS));
        match self.call(Method::GET, &path, None, &action, self.deadline())? {
            Reply::Object(_) => Ok(()),
            Reply::Status(s) => Err(self.status_error(&s, &action)),
        }
    }

    /// No lock (CAS alone); records the call's deadline for the loads that follow.
    fn lock_for_update(&self, _pools: &[PoolId], deadline: Instant) -> Result<UpdateLock, DatastoreError> {
        self.set_deadline(deadline);
        Ok(UpdateLock::none())
    }

    fn keeps_reservations(&self) -> bool {
        true
    }

    fn reserved(&self, pool: &PoolId) -> Vec<u128> {
        lock(&self.reserved).get(&pool.name).map(|s| s.iter().copied().collect()).unwrap_or_default()
    }

    fn shared_by_nodes(&self) -> bool {
        true
    }
}

impl Drop for KubernetesStore {
    fn drop(&mut self) {
        logging::debug(format!("kubernetes datastore: {} API request(s)", self.requests()));
    }
}
