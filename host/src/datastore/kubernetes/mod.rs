//! The Kubernetes datastore (`"datastore": "kubernetes"`, or a config that only
//! sets `kubernetes.kubeconfig`): whereabouts' `IPPool` and
//! `OverlappingRangeIPReservation` objects, read and written exactly as
//! whereabouts v0.9.4 does, so both plugins can share a cluster's pools.
//!
//! No lock: every pool write is a JSON patch whose changes are each guarded by a
//! `test` of the entry they touch ([`patch`]), and reservations are created
//! before the pools are written. The design, the request sequence of each path,
//! the failure classes and why per-entry compare-and-swap is safe next to
//! whereabouts' writers are in `docs/datastores.md` ("The Kubernetes datastore").
//!
//! The client runs on a private current-thread tokio runtime, so the
//! [`Datastore`] trait stays synchronous and nothing of it exists unless this
//! datastore is selected.

pub mod crd;
pub mod failure;
pub mod kubeconfig;
#[cfg(test)]
mod mock_api;
pub mod patch;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use http::Method;
use kube::core::Status;
use serde_json::{Value, json};
use thereabouts_allocator::model::Allocation;

use super::failure::Class;
use super::retry::{self, Backoff};
use super::{Capabilities, Change, Datastore, DatastoreError, Pool, PoolId, PoolUpdate, UpdateLock, Version};
use crate::logging;
use crd::{IPPOOLS, PoolObject, RESERVATIONS};

/// Longest wait for one answer, whatever the call's budget (whereabouts: 10 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the answer to a pool PATCH: the apiserver's own default
/// `--request-timeout`. Many writers of one pool queue inside the apiserver (it
/// applies each patch to the stored object and retries until its write wins), so
/// a slow answer there is progress, not an outage; abandoning it after
/// [`REQUEST_TIMEOUT`] would fail the call while the write may still land.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
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
    /// Reservations this process created that no successful commit recorded yet,
    /// by name: kept across a conflict for the retry, deleted when the retry plans
    /// other addresses, when a commit fails otherwise, and by `finish`.
    held: Mutex<HashMap<String, Held>>,
    /// Per pool name: the revision (collection resourceVersion) of its last read.
    read_revisions: Mutex<HashMap<String, String>>,
    /// Set when a commit lost a reservation race: the pools did not refuse
    /// anything, so the retry plans again on the reads it has (see `load`).
    reuse_reads: AtomicBool,
    /// Reservation races this call lost. After the first, a reservation found
    /// taken is not read to see whose it is: see `reserve`.
    races_lost: AtomicU32,
    /// A DEL's attachment and the reservations labelled with it (`begin_release`),
    /// by name; the ones the DEL frees through pool entries leave the map, the
    /// rest are leftovers for `end_release`.
    releasing: Mutex<Option<Releasing>>,
}

/// See [`KubernetesStore::releasing`].
struct Releasing {
    container_id: String,
    ifname: String,
    labelled: HashMap<String, crd::ReservationObject>,
}

/// A reservation this process created.
#[derive(Debug, Clone)]
struct Held {
    uid: String,
    /// The pool the address was planned in.
    pool: String,
    holder: Allocation,
}

impl Held {
    /// Whether it reserves the address for `holder`'s attachment (same container,
    /// pod and interface), so a retry that plans the address again can use it.
    fn serves(&self, holder: &Allocation) -> bool {
        self.holder.container_id == holder.container_id && self.holder.pod_ref == holder.pod_ref && self.holder.ifname == holder.ifname
    }
}

/// An API answer: the object (2xx) or the `Status` of a failure the caller
/// interprets (404, 409, 422, ...).
enum Reply {
    Object(Value),
    Status(Box<Status>),
}

/// How a reservation attempt ended.
enum Reservation {
    Created {
        uid: String,
    },
    /// It existed already for this attachment (a retried ADD), or was made by
    /// whereabouts for the same pod and interface.
    Adopted,
    HeldElsewhere(crd::ReservationObject),
    /// It exists, and this call already lost a race: taken by a racer, not read.
    Taken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KubernetesStore {
    /// Reads the kubeconfig and builds the client; sends nothing.
    pub fn open(kubeconfig_path: &Path) -> Result<Self, DatastoreError> {
        let unusable = |detail: String| DatastoreError::Kubeconfig { path: kubeconfig_path.to_path_buf(), detail };
        let (file, namespace) = kubeconfig::read(kubeconfig_path).map_err(unusable)?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().map_err(|e| DatastoreError::io(kubeconfig_path, e))?;
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
        Ok(Self::with_client(runtime, client, server, namespace, kubeconfig_path.to_path_buf()))
    }

    /// The store over `client`, which must have been made inside `runtime`
    /// (its dispatcher runs there). `server` and `kubeconfig` are for messages.
    fn with_client(runtime: tokio::runtime::Runtime, client: kube::Client, server: String, namespace: String, kubeconfig: PathBuf) -> Self {
        Self {
            runtime,
            client,
            server,
            namespace,
            kubeconfig,
            deadline: Mutex::new(Instant::now() + retry::budget(retry::OTHER_BUDGET)),
            requests: AtomicU32::new(0),
            pools: Mutex::default(),
            reserved: Mutex::default(),
            held: Mutex::default(),
            read_revisions: Mutex::default(),
            reuse_reads: AtomicBool::new(false),
            races_lost: AtomicU32::new(0),
            releasing: Mutex::default(),
        }
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
        self.call_within(method, path, body, action, deadline, REQUEST_TIMEOUT, THROTTLE_RETRIES)
    }

    /// [`call`](Self::call) with another cap than [`REQUEST_TIMEOUT`] on the wait
    /// for one answer, and another number of retries of 429/503/504.
    #[allow(clippy::too_many_arguments, reason = "call's arguments plus its two limits")]
    fn call_within(
        &self,
        method: Method,
        path: &str,
        body: Option<(&str, &Value)>,
        action: &str,
        deadline: Instant,
        cap: Duration,
        throttle_retries: u32,
    ) -> Result<Reply, DatastoreError> {
        let mut throttled = 0;
        let mut backoff = Backoff::between(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(self.unavailable(action, "the call's time limit ran out before the request".into()));
            }
            let limit = remaining.min(cap);
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
                    let value = if text.trim().is_empty() {
                        Value::Null
                    } else {
                        serde_json::from_str(&text).map_err(|e| self.rejected(action, format!("answer is not JSON: {e}")))?
                    };
                    return Ok(Reply::Object(value));
                }
                Ok(Err(kube::Error::Api(status))) => {
                    log(&format!("{} {}", status.code, status.reason));
                    logging::debug(format!("kubernetes API answer #{number}: {}", failure::describe_status(&status)));
                    if matches!(status.code, 429 | 503 | 504) && throttled < throttle_retries {
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
        class.error(format!("Kubernetes API server {}", self.server), action, detail)
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

    /// Reads the pool as a LIST of the one object by name: the answer carries the
    /// revision the read saw (kept in `read_revisions`), which tells reservations
    /// older than this read from ones made since (`reserved_before_read`), and the
    /// apiserver serves it from its watch cache (at 200 entries about a fifth of
    /// the CPU of a GET, which reads etcd). While that cache is not ready (after
    /// the apiserver or the CRD started) the LIST answers 429: then one GET of the
    /// object instead, without a revision.
    fn read_pool(&self, pool: &PoolId, deadline: Instant) -> Result<Option<PoolObject>, DatastoreError> {
        let action = format!("reading IPPool {}/{}", self.namespace, pool.name);
        let path = crd::named_list_path(&self.namespace, IPPOOLS, &pool.name);
        let object = match self.call_within(Method::GET, &path, None, &action, deadline, REQUEST_TIMEOUT, 0)? {
            Reply::Object(list) => {
                let revision = list.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string();
                lock(&self.read_revisions).insert(pool.name.clone(), revision);
                let items = list.get("items").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
                match items.iter().find(|o| o.pointer("/metadata/name").and_then(Value::as_str) == Some(pool.name.as_str())) {
                    Some(object) => object.clone(),
                    None => return Ok(None),
                }
            }
            Reply::Status(s) if s.code == 429 => {
                lock(&self.read_revisions).remove(&pool.name);
                match self.call(Method::GET, &self.pool_path(&pool.name), None, &action, deadline)? {
                    Reply::Object(object) => object,
                    Reply::Status(s) if failure::is_object_not_found(&s, &pool.name) => return Ok(None),
                    Reply::Status(s) => return Err(self.status_error(&s, &action)),
                }
            }
            Reply::Status(s) => return Err(self.status_error(&s, &action)),
        };
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

    /// POSTs the reservation; on AlreadyExists looks at who holds it, unless
    /// this call already lost a reservation race: then the answer is nearly
    /// always another racer (the contended plan picked a random address of a
    /// window that the racers are filling), and reading it would only double
    /// the requests of every lost round. What the read would tell apart — our
    /// own reservation from an earlier attempt of this ADD, or an overlapping
    /// range's — is then planned around like a racer's: the former is freed by
    /// the DEL (it carries our attachment label), the latter was not planned
    /// lowest-first anyway under contention.
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
            if self.races_lost.load(Ordering::Relaxed) > 0 {
                return Ok(Reservation::Taken);
            }
            let reading = format!("reading OverlappingRangeIPReservation {}/{name}", self.namespace);
            match self.call(Method::GET, &self.reservation_path(name), None, &reading, deadline)? {
                Reply::Object(existing) => {
                    let existing = crd::parse_reservation(&existing);
                    return Ok(if existing.is_adoptable_by(holder) { Reservation::Adopted } else { Reservation::HeldElsewhere(existing) });
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
    /// One this DEL's LIST found (`begin_release`) is deleted without reading it
    /// again; others (whereabouts' carry no label) are read first.
    fn unreserve(&self, name: &str, holder: &Allocation, deadline: Instant) -> Result<(), DatastoreError> {
        let listed = lock(&self.releasing).as_mut().and_then(|r| r.labelled.remove(name));
        if let Some(existing) = listed.filter(|r| r.is_held_by(holder)) {
            return self.delete_reservation(name, &existing.uid, deadline);
        }
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

    /// Whether the reservation `owner`, found holding an address planned in
    /// `pool`, existed before this process read the pool (an overlapping range's
    /// address: whereabouts just plans around it) rather than being made by a
    /// writer racing for the address since (contention). Decided by comparing its
    /// resourceVersion with the revision the read saw; the apiserver takes both
    /// from one etcd revision counter, but the API calls them opaque, so this is
    /// only a hint for choosing the next address, never for correctness:
    /// anything unparsable counts as a race.
    fn reserved_before_read(&self, pool: &str, owner: &crd::ReservationObject) -> bool {
        let read = lock(&self.read_revisions).get(pool).and_then(|r| r.parse::<u64>().ok());
        matches!((owner.resource_version.parse::<u64>(), read), (Ok(reserved), Some(read)) if reserved <= read)
    }

    /// Best-effort removal of the reservations this process holds for addresses
    /// it did not get, except those named in `keep`. One whose entry the pool
    /// holds after all, as last read, stays: a write whose answer was lost (a 504
    /// after which the retry found the entry, then the plan reused it) did commit.
    fn release_held(&self, keep: &BTreeSet<&str>, deadline: Instant) {
        let dropped: Vec<(String, Held)> = {
            let mut held = lock(&self.held);
            let names: Vec<String> = held.keys().filter(|n| !keep.contains(n.as_str())).cloned().collect();
            names.into_iter().filter_map(|n| held.remove(&n).map(|h| (n, h))).collect()
        };
        for (name, h) in dropped {
            let committed = lock(&self.pools).get(&h.pool).is_some_and(|p| {
                p.entries.iter().any(|e| e.offset == h.holder.offset && e.container_id == h.holder.container_id && e.ifname == h.holder.ifname)
            });
            if committed {
                logging::debug(format!("reservation {name} (offset {}): the pool holds its entry, kept", h.holder.offset));
                continue;
            }
            logging::debug(format!("deleting reservation {name} (offset {}): not committed", h.holder.offset));
            if let Err(e) = self.delete_reservation(&name, &h.uid, deadline) {
                logging::error(format!("could not delete reservation {name} of an address not committed: {e}"));
            }
        }
    }

    /// Writes one pool's changes: POST when it did not exist, else the PATCH
    /// whose `test`s compare each touched entry with the pool as read.
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
        let result =
            match self.call_within(Method::PATCH, &self.pool_path(name), Some((JSON_PATCH, &patch)), &action, deadline, WRITE_TIMEOUT, THROTTLE_RETRIES)? {
                Reply::Object(_) => Ok(()),
                // An entry's test failed (its offset was taken, or the entry to change
                // is gone or someone else's), or the pool was deleted since.
                Reply::Status(s) if failure::is_failed_test(&s) || s.code == 409 || failure::is_object_not_found(&s, name) => Err(conflict()),
                Reply::Status(s) => Err(self.status_error(&s, &action)),
            };
        // Whatever happened, the object read is stale now.
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
        // After a lost reservation race the pool itself refused nothing: plan again
        // on the object read (the address lost is in `reserved` now). Its entry
        // guards make a stale read safe, and it knows little less than a new GET
        // would: the racing writers hold reservations before the pool shows their
        // entries. A pool write (success or conflict) drops the read.
        if self.reuse_reads.load(Ordering::Relaxed)
            && let Some(object) = lock(&self.pools).get(&pool.name)
        {
            logging::debug(format!(
                "IPPool {}: planning again on the read of version {} (a reservation was taken, not the pool)",
                pool.name, object.resource_version
            ));
            return Ok(Pool { version: Version(object.resource_version.clone()), entries: object.entries.clone(), ..Pool::default() });
        }
        match self.read_pool(pool, self.deadline())? {
            Some(object) => {
                let loaded = Pool { version: Version(object.resource_version.clone()), entries: object.entries.clone(), ..Pool::default() };
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
        let reserves: Vec<(&PoolUpdate, &String, &Allocation)> = updates
            .iter()
            .flat_map(|u| u.changes.iter().filter_map(move |c| if let Change::Reserve { name, holder } = c { Some((*u, name, holder)) } else { None }))
            .collect();
        let planned: BTreeSet<&str> = reserves.iter().map(|(_, name, _)| name.as_str()).collect();

        // 0. Reservations an earlier attempt of this call took for addresses this
        // plan does not use any more: free them for the others first.
        self.release_held(&planned, cleanup_deadline());

        // 1. Reservations of new addresses, before any pool shows the address.
        for (update, name, holder) in &reserves {
            if lock(&self.held).get(name.as_str()).is_some_and(|h| h.serves(holder)) {
                logging::debug(format!("reservation {name}: taken by an earlier attempt of this call, planned again"));
                continue;
            }
            match self.reserve(name, holder, deadline) {
                Ok(Reservation::Created { uid }) => {
                    lock(&self.held).insert(name.to_string(), Held { uid, pool: update.pool.name.clone(), holder: (*holder).clone() });
                }
                Ok(Reservation::Adopted) => {}
                Ok(Reservation::HeldElsewhere(owner)) => {
                    logging::debug(format!(
                        "address of offset {} in pool {} is reserved as {name} by {} {} (container {}); planning around it",
                        holder.offset, update.pool.name, owner.podref, owner.ifname, owner.containerid
                    ));
                    lock(&self.reserved).entry(update.pool.name.clone()).or_default().insert(holder.offset);
                    self.reuse_reads.store(true, Ordering::Relaxed);
                    // The reservations taken so far stay for the retry (see `held`).
                    let pool = update.pool.name.clone();
                    return Err(if self.reserved_before_read(&pool, &owner) {
                        DatastoreError::Reserved { pool, name: name.to_string() }
                    } else {
                        self.races_lost.fetch_add(1, Ordering::Relaxed);
                        DatastoreError::Conflict { pool }
                    });
                }
                Ok(Reservation::Taken) => {
                    logging::debug(format!(
                        "address of offset {} in pool {} is reserved as {name} (by a racer); planning around it",
                        holder.offset, update.pool.name
                    ));
                    lock(&self.reserved).entry(update.pool.name.clone()).or_default().insert(holder.offset);
                    self.reuse_reads.store(true, Ordering::Relaxed);
                    self.races_lost.fetch_add(1, Ordering::Relaxed);
                    return Err(DatastoreError::Conflict { pool: update.pool.name.clone() });
                }
                Err(e) => {
                    self.release_held(&BTreeSet::new(), cleanup_deadline());
                    return Err(e);
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
                let cleanup = cleanup_deadline();
                self.undo(&written, cleanup);
                if !matches!(e, DatastoreError::Conflict { .. }) {
                    self.release_held(&BTreeSet::new(), cleanup);
                }
                // Removals are not undone (a DEL may stop half way and is
                // retried); the entries they removed are gone for good, and
                // the retry will not see them: free their reservations now.
                self.unreserve_all(&written, cleanup);
                return Err(e);
            }
            written.push(update);
        }

        // Every reservation of this plan now backs a committed entry.
        lock(&self.held).retain(|name, _| !planned.contains(name.as_str()));
        self.reuse_reads.store(false, Ordering::Relaxed);

        // 3. Reservations of removed entries. The pools no longer hold the
        // addresses; a reservation left behind only blocks its address.
        self.unreserve_all(&updates, cleanup_deadline());
        Ok(())
    }

    fn begin_release(&self, container_id: &str, ifname: &str, deadline: Instant) -> Result<(), DatastoreError> {
        let action = format!("listing the OverlappingRangeIPReservations of container {container_id} interface {ifname} in namespace {}", self.namespace);
        let path = crd::attachment_reservations_path(&self.namespace, container_id, ifname);
        let labelled = match self.call(Method::GET, &path, None, &action, deadline)? {
            Reply::Object(list) => list
                .get("items")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(crd::parse_reservation)
                .filter(|r| !r.name.is_empty())
                .map(|r| (r.name.clone(), r))
                .collect(),
            // An identity from an older deploy/rbac.yaml (no `list`): the DEL still
            // frees every reservation its pool entries lead to.
            Reply::Status(s) if s.code == 403 => {
                logging::error(format!(
                    "{}; reservations left by failed ADDs stay, nothing else frees them (grant `list` on overlappingrangeipreservations, see deploy/rbac.yaml)",
                    self.status_error(&s, &action)
                ));
                HashMap::new()
            }
            Reply::Status(s) => return Err(self.status_error(&s, &action)),
        };
        *lock(&self.releasing) = Some(Releasing { container_id: container_id.to_string(), ifname: ifname.to_string(), labelled });
        Ok(())
    }

    fn end_release(&self, in_use: &[String], deadline: Instant) -> Result<usize, DatastoreError> {
        let Some(releasing) = lock(&self.releasing).take() else { return Ok(0) };
        let mut freed = 0;
        for (name, r) in &releasing.labelled {
            // The label is a hash: free only what this exact attachment made.
            if !r.is_made_by(&releasing.container_id, &releasing.ifname) {
                continue;
            }
            // Made by this container, but its entry now names a newer container
            // of the pod, which still relies on it (the label is never updated).
            if in_use.contains(name) {
                logging::debug(format!("reservation {name}: made by this attachment, still guards its pod's entry; kept"));
                continue;
            }
            logging::debug(format!("reservation {name}: made by this attachment, no pool entry of it left; deleting"));
            self.delete_reservation(name, &r.uid, deadline.max(Instant::now() + CLEANUP_GRACE))?;
            freed += 1;
        }
        Ok(freed)
    }

    fn finish(&self, deadline: Instant) {
        self.reuse_reads.store(false, Ordering::Relaxed);
        self.races_lost.store(0, Ordering::Relaxed);
        self.release_held(&BTreeSet::new(), deadline.max(Instant::now() + CLEANUP_GRACE));
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

    /// Every node writes the same pools; the default pauses after a lost race.
    fn capabilities(&self) -> Capabilities {
        Capabilities::shared(retry::DEFAULT_PAUSES)
    }

    fn reserved(&self, pool: &PoolId) -> Vec<u128> {
        lock(&self.reserved).get(&pool.name).map(|s| s.iter().copied().collect()).unwrap_or_default()
    }
}

impl Drop for KubernetesStore {
    fn drop(&mut self) {
        // `finish` ran already after every update cycle; this only covers a
        // caller that never reached it.
        if !lock(&self.held).is_empty() {
            self.release_held(&BTreeSet::new(), Instant::now() + CLEANUP_GRACE);
        }
        logging::debug(format!("kubernetes datastore: {} API request(s)", self.requests()));
    }
}
