//! The Kubernetes datastore (`"datastore": "kubernetes"`, or a config that only
//! sets `kubernetes.kubeconfig`): whereabouts' `IPPool` and
//! `OverlappingRangeIPReservation` objects, read and written exactly as
//! whereabouts v0.9.4 does, so both plugins can share a cluster's pools.
//!
//! No lock: every pool write is a JSON patch whose changes are each guarded by a
//! `test` of the entry they touch ([`patch`]), and reservations are created
//! before the pools are written. A call's first attempt also tests the version
//! read, so it fails fast; one that lost a race queues for a turn (`turn.rs`),
//! which keeps a burst's writers from all reaching the apiserver at once but is
//! never what safety rests on. The design, the request sequence of each path,
//! the failure classes and why per-entry compare-and-swap is safe next to
//! whereabouts' writers are in `docs/datastores.md` ("The Kubernetes datastore").
//!
//! The client runs on a private current-thread tokio runtime, so the
//! [`Datastore`] trait stays synchronous and nothing of it exists unless this
//! datastore is selected.

mod connection;
pub mod crd;
pub mod failure;
mod held_memory;
pub mod ipam_claims;
pub mod kubeconfig;
#[cfg(test)]
pub mod mock_api;
mod node_turn;
pub mod patch;
mod slice_claim;
pub mod slices;
#[cfg(test)]
mod tests;
mod transaction;
mod turn;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use http::Method;
use kube::core::Status;
use serde_json::{Value, json};

use super::client_runtime::ClientRuntime;
use super::failure::Class;
use super::retry::{self, Backoff};
use super::{Capabilities, Datastore, DatastoreError, NodeSlices, PoolId, Purpose, SliceCandidates, Transaction};
use crate::logging;
use crd::{IPPOOLS, NODE_SLICE_POOLS, RESERVATIONS};
use slices::SliceTable;

/// Longest wait for one answer, whatever the call's budget (whereabouts: 10 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the answer to a pool PATCH: the apiserver's own default
/// `--request-timeout`. Many writers of one pool queue inside the apiserver (it
/// applies each patch to the stored object and retries until its write wins), so
/// a slow answer there is progress, not an outage; abandoning it after
/// [`REQUEST_TIMEOUT`] would fail the call while the write may still land.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Answers 429/503/504 ("try again later": the apiserver's flow control
/// turning requests away under a burst, an overloaded or restarting apiserver)
/// are retried with a jittered backoff from 50 ms to 1 s (or the server's
/// `retryAfterSeconds`) until the call's deadline: a fixed few retries turned a
/// burst of 500 ADDs into 16 failures within a second of flow control's 429s.
const THROTTLE_RETRIES: u32 = u32::MAX;
/// Time allowed to undo a failed commit even when the call's deadline has passed:
/// leaving half a commit behind is worse than answering a little late.
const CLEANUP_GRACE: Duration = Duration::from_secs(2);
/// How many times a read, or a DELETE guarded by a uid, whose connection broke
/// is sent again.
const READ_RETRIES: u32 = 2;

const JSON_PATCH: &str = "application/json-patch+json";
const JSON: &str = "application/json";
const JSON_MERGE_PATCH: &str = "application/merge-patch+json";
/// Said with a 403 on a pod read: what grants it.
const POD_READ_HINT: &str = "the plugin's identity may not read pods: a policy that declares pod-labels or pod-annotations needs deploy/rbac-pod-labels.yaml applied, see docs/policies.md";

pub struct KubernetesStore {
    runtime: ClientRuntime,
    client: kube::Client,
    /// The API server URL, for messages.
    server: String,
    namespace: String,
    kubeconfig: PathBuf,
    /// API requests sent so far by this process (for logs and benches).
    requests: AtomicU32,
}

/// A request as [`KubernetesStore::call_all`] takes it.
struct Request {
    method: Method,
    path: String,
    /// Content type and JSON body.
    body: Option<(String, Value)>,
    /// What it does, for messages.
    action: String,
}

impl Request {
    /// Whether sending it twice does what sending it once does: a read, or a
    /// DELETE whose preconditions name the object's uid.
    fn idempotent(&self) -> bool {
        self.method == Method::GET
            || (self.method == Method::DELETE && self.body.as_ref().is_some_and(|(_, options)| options["preconditions"]["uid"].is_string()))
    }
}

/// An API answer: the object (2xx) or the `Status` of a failure the caller
/// interprets (404, 409, 422, ...).
enum Reply {
    Object(Value),
    Status(Box<Status>),
}

/// A Pod's labels and annotations, in the order the apiserver sent them.
#[derive(Debug, Default)]
pub struct PodMetadata {
    pub labels: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
}

impl KubernetesStore {
    /// Reads the kubeconfig and builds the client; sends nothing.
    pub fn open(kubeconfig_path: &Path) -> Result<Self, DatastoreError> {
        let unusable = |detail: String| DatastoreError::Kubeconfig { path: kubeconfig_path.to_path_buf(), detail };
        let (file, namespace) = kubeconfig::read(kubeconfig_path).map_err(unusable)?;
        let runtime = ClientRuntime::start().map_err(|e| DatastoreError::io(kubeconfig_path, e))?;
        let (client, server) = runtime
            .block_on(async {
                let mut config = kubeconfig::client_config(file).await?;
                // Retries happen here, visibly and within the deadline.
                config.default_retry = false;
                config.connect_timeout = Some(REQUEST_TIMEOUT);
                let server = config.cluster_url.to_string().trim_end_matches('/').to_string();
                // The client spawns its dispatcher task: inside the runtime.
                let client = connection::client(&config)?;
                Ok::<_, String>((client, server))
            })
            .map_err(unusable)?;
        Ok(Self::with_client(runtime, client, server, namespace, kubeconfig_path.to_path_buf()))
    }

    /// The store over `client`, which must have been made inside `runtime`
    /// (its dispatcher runs there). `server` and `kubeconfig` are for messages.
    fn with_client(runtime: ClientRuntime, client: kube::Client, server: String, namespace: String, kubeconfig: PathBuf) -> Self {
        Self { runtime, client, server, namespace, kubeconfig, requests: AtomicU32::new(0) }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The labels and annotations of Pod `namespace/name`: one GET, sent only
    /// for a policy that declared it needs them (the identity needs `get` on
    /// pods there, which deploy/rbac.yaml does not grant; see docs/policies.md).
    pub fn pod_metadata(&self, namespace: &str, name: &str, deadline: Instant) -> Result<PodMetadata, DatastoreError> {
        let path = format!("/api/v1/namespaces/{}/pods/{}", crd::escape(namespace), crd::escape(name));
        let action = format!("reading Pod {namespace}/{name} for a policy");
        match self.call(Method::GET, &path, None, &action, deadline)? {
            Reply::Object(pod) => {
                let pairs = |field: &str| -> Vec<(String, String)> {
                    pod.pointer(&format!("/metadata/{field}"))
                        .and_then(Value::as_object)
                        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
                        .unwrap_or_default()
                };
                Ok(PodMetadata { labels: pairs("labels"), annotations: pairs("annotations") })
            }
            // Forbidden is the shipped RBAC doing its job: say what grants it.
            Reply::Status(status) if status.code == 403 => Err(self.status_error(&status, &format!("{action} ({POD_READ_HINT})"))),
            Reply::Status(status) => Err(self.status_error(&status, &action)),
        }
    }

    /// The apiserver and namespace as a file-name part: what a node's turn
    /// locks (`node_turn.rs`) are scoped to.
    fn lock_scope(&self) -> String {
        let server: String = self.server.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect();
        format!("{server}_{}", self.namespace)
    }

    /// API requests sent so far.
    pub fn requests(&self) -> u32 {
        self.requests.load(Ordering::Relaxed)
    }

    fn pool_path(&self, name: &str) -> String {
        crd::object_path(&self.namespace, IPPOOLS, name)
    }

    fn reservation_path(&self, name: &str) -> String {
        crd::object_path(&self.namespace, RESERVATIONS, name)
    }

    /// One request, bounded by `deadline` and [`REQUEST_TIMEOUT`]; 429/503/504
    /// are retried while time remains ([`THROTTLE_RETRIES`]). Transport failures
    /// are returned as errors, API failures as [`Reply::Status`].
    fn call(&self, method: Method, path: &str, body: Option<(&str, &Value)>, action: &str, deadline: Instant) -> Result<Reply, DatastoreError> {
        let request = Request { method, path: path.to_string(), body: body.map(|(t, v)| (t.to_string(), v.clone())), action: action.to_string() };
        self.call_one(&request, deadline, REQUEST_TIMEOUT, THROTTLE_RETRIES)
    }

    /// [`call`](Self::call) of a [`Request`], with another cap than
    /// [`REQUEST_TIMEOUT`] on the wait for one answer, and another number of
    /// retries of 429/503/504.
    fn call_one(&self, request: &Request, deadline: Instant, cap: Duration, throttle_retries: u32) -> Result<Reply, DatastoreError> {
        self.runtime.block_on(self.send(request, deadline, cap, throttle_retries))
    }

    /// Several requests at once, each as [`call_one`](Self::call_one) would
    /// send it; the answers in the order of `requests`. For the requests of one
    /// stage of a commit that do not depend on each other (a pool per range):
    /// one round trip instead of one per range.
    fn call_all(&self, requests: &[Request], deadline: Instant, cap: Duration, throttle_retries: u32) -> Vec<Result<Reply, DatastoreError>> {
        self.runtime.block_on(futures_util::future::join_all(requests.iter().map(|r| self.send(r, deadline, cap, throttle_retries))))
    }

    /// Many requests, at most `in_flight` of them at the apiserver at a time;
    /// the answers in the order of `requests`. For bulk work that would
    /// otherwise arrive as one stampede (a write serving 256 DELs dismisses
    /// 256 tickets). None starts after `start_by`, and one started runs to its
    /// answer (at most `cap`, with its retries): cut off, the apiserver logs it
    /// as a 504.
    fn call_some_at_a_time(
        &self,
        requests: &[Request],
        in_flight: usize,
        start_by: Instant,
        cap: Duration,
        throttle_retries: u32,
    ) -> Vec<Result<Reply, DatastoreError>> {
        use futures_util::stream::{self, StreamExt};
        let answers = stream::iter(requests.iter().map(|r| async move {
            if Instant::now() >= start_by {
                return Err(self.unavailable(&r.action, "not sent: the time for this work ran out".into()));
            }
            self.send(r, Instant::now() + cap, cap, throttle_retries).await
        }))
        .buffered(in_flight.max(1))
        .collect();
        self.runtime.block_on(answers)
    }

    /// One request and its retries of 429/503/504 while time remains; a read,
    /// or a DELETE guarded by a uid, is also sent again, [`READ_RETRIES`]
    /// times, when its connection broke.
    async fn send(&self, r: &Request, deadline: Instant, cap: Duration, throttle_retries: u32) -> Result<Reply, DatastoreError> {
        let (method, path, action) = (&r.method, r.path.as_str(), r.action.as_str());
        let mut throttled = 0;
        let mut resent = 0;
        let mut backoff = Backoff::between(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(self.unavailable(action, "the call's time limit ran out before the request".into()));
            }
            let limit = remaining.min(cap);
            let mut request = http::Request::builder().method(method.clone()).uri(path).header(http::header::ACCEPT, JSON);
            let bytes = match &r.body {
                Some((content_type, value)) => {
                    request = request.header(http::header::CONTENT_TYPE, content_type.as_str());
                    serde_json::to_vec(value).unwrap_or_default()
                }
                None => Vec::new(),
            };
            let request = request.body(bytes).map_err(|e| self.rejected(action, format!("cannot build the request: {e}")))?;
            let number = self.count_request();
            let started = Instant::now();
            let outcome = tokio::time::timeout(limit, self.client.request_text(request)).await.ok();
            let took = started.elapsed();
            let log = |answer: &str| logging::debug(format!("kubernetes API request #{number}: {method} {path} -> {answer} in {} ms", took.as_millis()));
            match outcome {
                None => {
                    log("no answer");
                    return Err(self.unavailable(action, format!("no answer within {} ms", limit.as_millis())));
                }
                Some(Ok(text)) => {
                    log("ok");
                    let value = if text.trim().is_empty() {
                        Value::Null
                    } else {
                        serde_json::from_str(&text).map_err(|e| self.rejected(action, format!("answer is not JSON: {e}")))?
                    };
                    return Ok(Reply::Object(value));
                }
                Some(Err(kube::Error::Api(status))) => {
                    log(&format!("{} {}", status.code, status.reason));
                    logging::debug(format!("kubernetes API answer #{number}: {}", failure::describe_status(&status)));
                    if matches!(status.code, 429 | 503 | 504) && throttled < throttle_retries {
                        throttled += 1;
                        let asked = status.details.as_ref().map_or(0, |d| d.retry_after_seconds);
                        let pause = if asked > 0 {
                            let pause = Duration::from_secs(u64::from(asked)).min(Duration::from_secs(1));
                            (Instant::now() + pause < deadline).then_some(pause)
                        } else {
                            backoff.next_pause(deadline)
                        };
                        if let Some(pause) = pause {
                            tokio::time::sleep(pause).await;
                            continue;
                        }
                    }
                    return Ok(Reply::Status(status));
                }
                Some(Err(e)) => {
                    let (class, detail) = failure::transport(&e);
                    log(&format!("failed: {detail}"));
                    // A GET changes nothing: sent again, it can only find what
                    // the broken one would have (an HTTP/2 stream reset under a
                    // saturated apiserver failed 1 ADD of 66 000). A DELETE
                    // guarded by the object's uid deletes that object at most
                    // once: sent again after it landed, it answers 404 (or 409
                    // when the name holds another's object now), never deleting
                    // another's.
                    if r.idempotent() && class == Class::Transient && resent < READ_RETRIES {
                        resent += 1;
                        if let Some(pause) = backoff.next_pause(deadline) {
                            tokio::time::sleep(pause).await;
                            continue;
                        }
                    }
                    return Err(self.failure(class, action, detail));
                }
            }
        }
    }

    /// Counts one more request sent; returns its number.
    fn count_request(&self) -> u32 {
        self.requests.fetch_add(1, Ordering::Relaxed) + 1
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

    /// DELETE with a uid precondition (only the object we know, never a successor).
    fn delete_reservation(&self, name: &str, uid: &str, deadline: Instant) -> Result<(), DatastoreError> {
        let action = format!("deleting OverlappingRangeIPReservation {}/{name}", self.namespace);
        let preconditions = (!uid.is_empty()).then(|| json!({"uid": uid}));
        self.delete_guarded(&self.reservation_path(name), preconditions, &action, deadline)
    }

    /// DELETE of the object at `path`, only as `preconditions` (DeleteOptions)
    /// describe it when given. Gone already, or replaced by someone else's (a
    /// precondition failed): fine, nothing of ours is left there.
    fn delete_guarded(&self, path: &str, preconditions: Option<Value>, action: &str, deadline: Instant) -> Result<(), DatastoreError> {
        let mut options = json!({"apiVersion": "v1", "kind": "DeleteOptions"});
        if let Some(preconditions) = preconditions {
            options["preconditions"] = preconditions;
        }
        match self.call(Method::DELETE, path, Some((JSON, &options)), action, deadline)? {
            Reply::Object(_) => Ok(()),
            Reply::Status(s) if s.code == 404 || s.code == 409 => Ok(()),
            Reply::Status(s) => Err(self.status_error(&s, action)),
        }
    }
}

impl Datastore for KubernetesStore {
    fn describe(&self) -> String {
        format!("kubernetes datastore: namespace {} at {} (kubeconfig {})", self.namespace, self.server, self.kubeconfig.display())
    }

    /// Every node writes the same pools; the default pauses after a lost race.
    fn capabilities(&self) -> Capabilities {
        Capabilities::shared(retry::DEFAULT_PAUSES)
    }

    /// A cheap read of the pool collection: reachable, authorized, CRDs installed.
    fn check_usable(&self, deadline: Instant) -> Result<(), DatastoreError> {
        let action = format!("listing IPPools in namespace {}", self.namespace);
        let path = format!("{}?limit=1", crd::collection_path(&self.namespace, IPPOOLS));
        match self.call(Method::GET, &path, None, &action, deadline)? {
            Reply::Object(_) => Ok(()),
            Reply::Status(s) => Err(self.status_error(&s, &action)),
        }
    }

    /// No lock: compare-and-swap alone (see [`transaction`]).
    fn begin<'s>(&'s self, pools: &[PoolId], purpose: Purpose<'_>, deadline: Instant) -> Result<Box<dyn Transaction + 's>, DatastoreError> {
        Ok(Box::new(transaction::begin(self, pools, purpose, deadline)?))
    }

    /// One GET of the `NodeSlicePool`, from the watch cache unless `fresh`,
    /// and a LIST of the node's slice objects when the layout has them.
    fn node_slices(
        &self,
        slice_pool: &str,
        node: &str,
        fresh: bool,
        every: bool,
        candidates: &mut dyn SliceCandidates,
        deadline: Instant,
    ) -> Result<NodeSlices, DatastoreError> {
        self.held_slices(slice_pool, node, fresh, every, candidates, deadline)
    }

    fn slice_holder(&self, slice_pool: &str, slice: &str, deadline: Instant) -> Result<Option<String>, DatastoreError> {
        self.holder_of_slice(slice_pool, slice, deadline)
    }

    /// The notes its node-turn holders left beside their locks (`node_turn.rs`).
    fn pool_notes(&self, pools: &[PoolId]) -> Vec<Option<super::pool_note::PoolNote>> {
        node_turn::notes(&self.lock_scope(), pools)
    }

    /// A fresh read, then (unless the node holds a slice the caller does not
    /// know) a claim that tests the slot it takes, or creates the slice's
    /// object; a slot taken meanwhile reads again (`slice_claim.rs`).
    fn claim_slice(
        &self,
        slice_pool: &str,
        node: &str,
        known: &[String],
        candidates: &mut dyn super::SliceCandidates,
        deadline: Instant,
    ) -> Result<Option<String>, DatastoreError> {
        self.claim_in_layout(slice_pool, node, known, candidates, deadline)
    }
}

impl KubernetesStore {
    fn slice_table(&self, slice_pool: &str, node: &str, fresh: bool, deadline: Instant) -> Result<SliceTable, DatastoreError> {
        let action = format!("reading NodeSlicePool {}/{slice_pool}", self.namespace);
        let mut path = crd::object_path(&self.namespace, NODE_SLICE_POOLS, slice_pool);
        if !fresh {
            path.push_str("?resourceVersion=0");
        }
        match self.call(Method::GET, &path, None, &action, deadline)? {
            Reply::Object(object) => SliceTable::from_object(&object)
                .map_err(|detail| DatastoreError::Malformed { object: format!("NodeSlicePool {}/{slice_pool}", self.namespace), detail }),
            Reply::Status(s) if s.code == 404 => Err(DatastoreError::NoSlice {
                slice_pool: format!("{}/{slice_pool}", self.namespace),
                node: node.to_string(),
                detail: "the NodeSlicePool does not exist (yet); the thereabouts controller creates it from the NetworkAttachmentDefinition".into(),
            }),
            Reply::Status(s) => Err(self.status_error(&s, &action)),
        }
    }
}

impl Drop for KubernetesStore {
    fn drop(&mut self) {
        logging::debug(format!("kubernetes datastore: {} API request(s)", self.requests()));
    }
}
