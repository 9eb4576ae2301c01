//! Taking turns on a set of pools after a lost race, so that contended writers
//! reach the apiserver one at a time instead of all at once.
//!
//! Why: every writer of one `IPPool` rewrites the whole object, and the
//! apiserver re-applies a patch each time another write landed first. With N
//! writers in flight that is O(N) full write attempts per write, O(N²) for a
//! burst: the cost that made 200 concurrent ADDs take 48 s without
//! `deploy/flowcontrol.yaml`. A writer that lost once (its patch, which tests
//! the `resourceVersion` read, failed at once, or a racer took its address's
//! reservation) queues here, and its next attempt meets nobody but the rare
//! newcomer.
//!
//! How: a queue in the style of etcd's mutex recipe, on `coordination.k8s.io`
//! `Lease` objects (tickets). A writer creates its ticket (a generated name,
//! labelled [`TICKET_LABEL`], the pools in [`POOLS_ANNOTATION`]); the tickets
//! that share a pool with it and have a lower `resourceVersion` are ahead of
//! it. It watches the nearest one ahead of it per pool and goes when that one is
//! deleted (the one ahead went only after everything ahead of it had gone). The
//! holder renews its ticket every [`RENEW_EVERY`]; a queue ahead that shows no
//! change at all for [`STALL`] (no ticket gone, no renewal) has a dead head,
//! which is deleted under a `resourceVersion` precondition. A waiter lists the
//! queue again only when its watch ends without the delete: after [`STALL`]
//! right behind the head, longer the farther back it is (a waiter that dies in
//! the middle of a long queue costs the ones behind it up to that long).
//!
//! Group commit (DELs): a DEL's ticket also names its attachment and its
//! release group ([`RELEASE_GROUP_ANNOTATION`]). The DEL whose turn it is lists
//! the tickets of its group queued behind it ([`queued`]), removes their
//! entries in its own pool write, and then deletes their tickets
//! ([`dismiss`]). A waiter that finds its own ticket gone from the queue was
//! served (or declared dead): it stops waiting, reads the pools as new as the
//! queue it listed, finds its entries gone and writes nothing to them. So a
//! burst of N DELs on one pool costs a few pool writes instead of N, each of
//! which rewrote the whole object.
//!
//! Turns are an optimisation, never a lock the allocation's safety rests on:
//! the pool patches keep their per-entry tests and the reservations their
//! create-if-absent. So every failure here (no right to Leases, an
//! unparsable version, an error, the call's time running short) ends in going
//! ahead without a turn, which is exactly the protocol without turns.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::WatchEvent;
use serde_json::{Value, json};

use super::{CLEANUP_GRACE, JSON, JSON_MERGE_PATCH, KubernetesStore, Reply};
use crate::datastore::PoolId;
use crate::logging;

/// The label every ticket carries (value: [`TICKET_KIND`]); the queue is the LIST by it.
pub const TICKET_LABEL: &str = "thereabouts.io/turn";
const TICKET_KIND: &str = "pools";
/// The pools a ticket queues for, comma-separated.
pub const POOLS_ANNOTATION: &str = "thereabouts.io/pools";
const TICKET_PREFIX: &str = "thereabouts-turn-";
/// A DEL's ticket: its release group (`crate::datastore::release_group`).
pub const RELEASE_GROUP_ANNOTATION: &str = "thereabouts.io/release-group";
/// A DEL's ticket: the container ID and interface whose entries it releases.
pub const RELEASE_CONTAINER_ANNOTATION: &str = "thereabouts.io/release-container";
pub const RELEASE_IFNAME_ANNOTATION: &str = "thereabouts.io/release-ifname";
/// On a ticket as its holder leaves it: the pools it wrote, each with the
/// `resourceVersion` of its write (`pool=version,...`). The next holder reads
/// each pool as new as that from the watch cache: a read of the cache as it
/// is may come before the cache saw that write, and a plan on it fails its
/// entry tests (under load, 1 515 refused patches in a burst of 500 DELs).
/// The delete's own revision would do as well, but an IPPool cache reaches it
/// only with etcd's next progress notification, 40-100 ms later.
pub const WRITTEN_ANNOTATION: &str = "thereabouts.io/written";
/// At most this many DELs are served by one write: its JSON patch holds two
/// operations per entry removed, and a patch of this many stays far below the
/// apiserver's 3 MiB request limit.
pub const SERVE_AT_MOST: usize = 256;

/// Ticket deletes of one dismissal at the apiserver at a time ([`dismiss`]).
const DISMISS_IN_FLIGHT: usize = 16;
/// How long a dismissal starts deletes ([`dismiss`]); the ones started run
/// to their answer.
const DISMISS_WITHIN: Duration = Duration::from_secs(5);
/// Retries of a ticket delete turned away by flow control ([`dismiss`]).
const DISMISS_RETRIES: u32 = 2;
/// How often the holder renews its ticket.
const RENEW_EVERY: Duration = Duration::from_millis(500);
/// A queue ahead that shows no change for this long has a dead head. Also how
/// long one watch waits before the queue is listed again. (Shorter in the
/// in-process tests, which wait for it in real time.)
pub const STALL: Duration = if cfg!(test) { Duration::from_millis(300) } else { Duration::from_secs(2) };
/// Waiting stops this long before the call's deadline: the attempt without a
/// turn still needs time.
const WAIT_MARGIN: Duration = Duration::from_secs(3);

const LEASES: &str = "leases";
/// The answer to a watch from a revision the apiserver no longer keeps.
const GONE: u16 = 410;

pub fn collection_path(namespace: &str) -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/{LEASES}")
}

/// A turn this call holds: its ticket and the task renewing it.
pub(super) struct Turn {
    name: String,
    version: u64,
    /// None once the ticket is gone.
    renewal: Option<Renewal>,
    /// Set when the ticket left the queue while the call waited (a DEL of its
    /// group served it, see the module comment): the revision of the LIST that
    /// found it gone. Reads of the pools ask for one at least as new, which
    /// holds the write that served it.
    served_at: Option<String>,
    /// The queue as the wait last listed it, when that LIST is what ended the
    /// wait: the first [`queued`] of the turn uses it instead of another.
    listed: Option<Vec<Ticket>>,
    /// What the holders that went just before this one wrote: pool, version.
    written_before: BTreeMap<String, String>,
    /// What this holder wrote, left on its ticket when the turn ends.
    written: BTreeMap<String, String>,
}

impl Turn {
    /// The version a read of `pool` asks for at least: the revision that
    /// served this call, else the write of `pool` by the holder before it.
    pub(super) fn read_at(&self, pool: &str) -> Option<&str> {
        self.served_at.as_deref().or_else(|| self.written_before.get(pool).map(String::as_str))
    }

    /// Reads go back to the cache as it is (that revision is unknown to this apiserver).
    pub(super) fn forget_read_at(&mut self) {
        self.served_at = None;
        self.written_before.clear();
    }

    /// This holder wrote `pool` at `version`.
    pub(super) fn record_written(&mut self, pool: &str, version: &str) {
        self.written.insert(pool.to_string(), version.to_string());
    }
}

/// What a DEL's ticket offers for group commit: its attachment, in its group.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ReleaseOffer {
    pub group: String,
    pub container_id: String,
    pub ifname: String,
}

/// A ticket as listed.
#[derive(Debug, Clone, PartialEq)]
struct Ticket {
    name: String,
    version: u64,
    pools: BTreeSet<String>,
    offer: Option<ReleaseOffer>,
}

impl Ticket {
    fn parse(object: &Value) -> Option<Ticket> {
        let name = object.pointer("/metadata/name")?.as_str()?.to_string();
        let version = object.pointer("/metadata/resourceVersion")?.as_str()?.parse().ok()?;
        let annotation = |key: &str| object.pointer(&format!("/metadata/annotations/{}", key.replace('/', "~1"))).and_then(Value::as_str);
        let pools = annotation(POOLS_ANNOTATION)?;
        let offer = match (annotation(RELEASE_GROUP_ANNOTATION), annotation(RELEASE_CONTAINER_ANNOTATION), annotation(RELEASE_IFNAME_ANNOTATION)) {
            (Some(group), Some(container_id), Some(ifname)) => {
                Some(ReleaseOffer { group: group.to_string(), container_id: container_id.to_string(), ifname: ifname.to_string() })
            }
            _ => None,
        };
        Some(Ticket { name, version, pools: pools.split(',').map(str::to_string).collect(), offer })
    }
}

/// The ticket for `pools`, held by `holder` (for people reading the Lease),
/// with a DEL's `offer` for group commit.
fn ticket_body(namespace: &str, pools: &BTreeSet<String>, holder: &str, offer: Option<&ReleaseOffer>) -> Value {
    let now = now();
    let mut annotations = json!({POOLS_ANNOTATION: pools.iter().cloned().collect::<Vec<_>>().join(",")});
    if let Some(offer) = offer {
        annotations[RELEASE_GROUP_ANNOTATION] = json!(offer.group);
        annotations[RELEASE_CONTAINER_ANNOTATION] = json!(offer.container_id);
        annotations[RELEASE_IFNAME_ANNOTATION] = json!(offer.ifname);
    }
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "generateName": TICKET_PREFIX,
            "namespace": namespace,
            "labels": {TICKET_LABEL: TICKET_KIND, "app.kubernetes.io/managed-by": "thereabouts"},
            "annotations": annotations,
        },
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": STALL.as_secs(), "acquireTime": now, "renewTime": now},
    })
}

/// Queues for `pools` and returns once it is this call's turn, or once a DEL
/// of its group served it ([`Turn::read_at`]); `None` when the call goes
/// ahead without one (see the module comment), with why logged.
pub(super) fn take(store: &KubernetesStore, pools: &[PoolId], holder: &str, offer: Option<&ReleaseOffer>, deadline: Instant) -> Option<Turn> {
    let pools: BTreeSet<String> = pools.iter().map(|p| p.name.clone()).collect();
    let give_up = deadline.checked_sub(WAIT_MARGIN).unwrap_or(deadline);
    let mine = match create(store, &pools, holder, offer, deadline) {
        Ok(ticket) => ticket,
        Err(why) => {
            logging::verbose(format!("no turn taken on pools {pools:?}, going ahead: {why}"));
            return None;
        }
    };
    match wait(store, &mine, give_up) {
        Ok(Waited::Ours { after, listed, written_before }) => {
            logging::debug(format!("turn {} on pools {pools:?}: ours after {} ms", mine.name, after.as_millis()));
            let renewal = Some(renew(store, &mine.name));
            Some(Turn { renewal, name: mine.name, version: mine.version, served_at: None, listed, written_before, written: BTreeMap::new() })
        }
        Ok(Waited::Served { after, revision }) => {
            logging::debug(format!("turn {} on pools {pools:?}: served by another DEL after {} ms", mine.name, after.as_millis()));
            let (written_before, written) = (BTreeMap::new(), BTreeMap::new());
            Some(Turn { renewal: None, name: mine.name, version: mine.version, served_at: Some(revision), listed: None, written_before, written })
        }
        Err(why) => {
            logging::verbose(format!("turn {} on pools {pools:?}: going ahead without it: {why}", mine.name));
            delete(store, &mine.name, None, Instant::now() + CLEANUP_GRACE);
            None
        }
    }
}

/// Ends a turn: the next one in the queue goes, told what this one wrote.
/// Its requests may take until `deadline` (the call's, at least
/// [`CLEANUP_GRACE`] from now): under a burst they wait in the apiserver's
/// flow-control queue, and one the call abandons there is logged as a 504
/// ("context canceled"), 103 of them in 500 DELs behind 1 ms of latency.
pub(super) fn end(store: &KubernetesStore, turn: Turn, deadline: Instant) {
    if let Some(renewal) = turn.renewal {
        renewal.stop(store, deadline);
        if !turn.written.is_empty() {
            leave_written(store, &turn.name, &turn.written, deadline);
        }
        delete(store, &turn.name, None, deadline);
    }
}

/// Puts [`WRITTEN_ANNOTATION`] on ticket `name`, best effort: without it the
/// next holder reads the cache as it is, which is safe, only maybe stale.
fn leave_written(store: &KubernetesStore, name: &str, written: &BTreeMap<String, String>, deadline: Instant) {
    let action = format!("leaving what the turn wrote on ticket {}/{name}", store.namespace);
    let text = written.iter().map(|(pool, version)| format!("{pool}={version}")).collect::<Vec<_>>().join(",");
    let patch = json!({"metadata": {"annotations": {WRITTEN_ANNOTATION: text}}});
    match store.call(Method::PATCH, &ticket_path(&store.namespace, name), Some((JSON_MERGE_PATCH, &patch)), &action, deadline) {
        Ok(Reply::Object(_)) => {}
        Ok(Reply::Status(s)) => logging::debug(store.status_error(&s, &action).to_string()),
        Err(e) => logging::debug(format!("{e}")),
    }
}

/// [`WRITTEN_ANNOTATION`] of a deleted ticket, read into `into`.
fn read_written(ticket: &Value, into: &mut BTreeMap<String, String>) {
    let key = format!("/metadata/annotations/{}", WRITTEN_ANNOTATION.replace('/', "~1"));
    let Some(text) = ticket.pointer(&key).and_then(Value::as_str) else { return };
    for (pool, version) in text.split(',').filter_map(|pair| pair.split_once('=')) {
        into.insert(pool.to_string(), version.to_string());
    }
}

/// The DELs of `offer`'s group queued behind `turn` for exactly `pools`,
/// oldest first, at most [`SERVE_AT_MOST`]: their ticket names and
/// attachments. Best effort: any failure serves nobody.
pub(super) fn queued(store: &KubernetesStore, turn: &mut Turn, pools: &[PoolId], offer: &ReleaseOffer, deadline: Instant) -> Vec<(String, String, String)> {
    // Served itself: its ticket is gone, and the DELs behind it go on their own.
    if turn.renewal.is_none() {
        return Vec::new();
    }
    let pools: BTreeSet<String> = pools.iter().map(|p| p.name.clone()).collect();
    let listed = match turn.listed.take().map(Ok).unwrap_or_else(|| list(store, turn.version, deadline).map(|(tickets, _)| tickets)) {
        Ok(tickets) => tickets,
        Err(why) => {
            logging::debug(format!("turn {}: not serving the DELs queued behind it: {why}", turn.name));
            return Vec::new();
        }
    };
    let mut behind: Vec<Ticket> =
        listed.into_iter().filter(|t| t.version > turn.version && t.pools == pools && t.offer.as_ref().is_some_and(|o| o.group == offer.group)).collect();
    behind.sort_by_key(|t| t.version);
    behind.into_iter().take(SERVE_AT_MOST).filter_map(|t| t.offer.map(|o| (t.name, o.container_id, o.ifname))).collect()
}

/// Tells the DELs whose tickets are `names` that a write served them: their
/// tickets go, and they stop waiting. [`DISMISS_IN_FLIGHT`] at a time, for at
/// most [`DISMISS_WITHIN`], each retried [`DISMISS_RETRIES`] times when the
/// apiserver turns it away (429): all at once within 2 s, a loaded apiserver
/// answered a write serving 500 DELs with 461 deletes given up; retried until
/// the call's deadline, the holder kept its turn for a minute, the queue
/// behind it took it for dead, and 80 000 deletes were turned away. Best
/// effort: a DEL whose ticket stays takes its turn and finds nothing to do.
///
/// Newest first: a DEL served wakes when the ticket ahead of it goes, and then
/// looks for its own; deleted oldest first, that one was nearly always still
/// there, and the DEL took itself for the next holder.
pub(super) fn dismiss(store: &KubernetesStore, names: &[String]) {
    let requests: Vec<super::Request> = names
        .iter()
        .rev()
        .map(|name| super::Request {
            method: Method::DELETE,
            path: ticket_path(&store.namespace, name),
            body: None,
            action: format!("deleting served turn ticket {}/{name}", store.namespace),
        })
        .collect();
    for answer in store.call_some_at_a_time(&requests, DISMISS_IN_FLIGHT, Instant::now() + DISMISS_WITHIN, super::REQUEST_TIMEOUT, DISMISS_RETRIES) {
        if let Err(e) = answer {
            logging::debug(format!("{e}"));
        }
    }
}

fn create(store: &KubernetesStore, pools: &BTreeSet<String>, holder: &str, offer: Option<&ReleaseOffer>, deadline: Instant) -> Result<Ticket, String> {
    let action = format!("creating a turn ticket (Lease) in namespace {}", store.namespace);
    let body = ticket_body(&store.namespace, pools, holder, offer);
    match store.call(Method::POST, &collection_path(&store.namespace), Some((JSON, &body)), &action, deadline) {
        Ok(Reply::Object(created)) => Ticket::parse(&created).ok_or_else(|| format!("the created ticket has no numeric resourceVersion: {created}")),
        Ok(Reply::Status(s)) if s.code == 403 => {
            Err(format!("{} (grant create, list, watch, patch and delete on leases, see deploy/rbac.yaml)", store.status_error(&s, &action)))
        }
        Ok(Reply::Status(s)) => Err(store.status_error(&s, &action).to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// How a wait in the queue ended.
enum Waited {
    /// No ticket is ahead any more, after this long; the queue, when a LIST
    /// told; what the holders just ahead wrote, when their deletes told.
    Ours { after: Duration, listed: Option<Vec<Ticket>>, written_before: BTreeMap<String, String> },
    /// Our ticket left the queue (a DEL of our group served us), found by the
    /// LIST of `revision`, after this long.
    Served { after: Duration, revision: String },
}

/// Waits until no ticket is ahead of `mine`, or `mine` is gone from the queue.
fn wait(store: &KubernetesStore, mine: &Ticket, give_up: Instant) -> Result<Waited, String> {
    let started = Instant::now();
    // The queue ahead as last listed, and since when it has looked exactly so.
    let mut unchanged: Option<(Vec<Ticket>, Instant)> = None;
    loop {
        if Instant::now() >= give_up {
            return Err("the call's time is running short".into());
        }
        let (listed, revision) = list(store, mine.version, give_up)?;
        if !listed.iter().any(|t| t.name == mine.name) {
            return Ok(Waited::Served { after: started.elapsed(), revision });
        }
        let ahead = ahead_of(mine, &listed);
        if ahead.is_empty() {
            return Ok(Waited::Ours { after: started.elapsed(), listed: Some(listed), written_before: BTreeMap::new() });
        }
        match &unchanged {
            Some((before, since)) if *before == ahead => {
                if since.elapsed() >= STALL {
                    // Nothing ahead moved for a whole STALL: its head holds
                    // the turn without renewing it, or waits for nothing.
                    let head = &ahead[0];
                    logging::verbose(format!("turn ticket {} shows no sign of life for {} ms; deleting it", head.name, since.elapsed().as_millis()));
                    delete(store, &head.name, Some(head.version), Instant::now() + CLEANUP_GRACE);
                    unchanged = None;
                    continue;
                }
            }
            _ => unchanged = Some((ahead.clone(), Instant::now())),
        }
        // The nearest ticket ahead per pool; when each of them has gone, so has
        // everything ahead of it.
        let mut nearest: Vec<&Ticket> = Vec::new();
        for pool in &mine.pools {
            if let Some(t) = ahead.iter().rev().find(|t| t.pools.contains(pool))
                && !nearest.iter().any(|n| n.name == t.name)
            {
                nearest.push(t);
            }
        }
        // The farther back, the longer the wait before the queue is listed
        // again: only the tickets right behind the head need to notice soon that
        // it died, and a LIST of a long queue is what costs.
        let patience = STALL * (1 + ahead.len() as u32 / 8);
        // The revision of the last delete seen: a ticket goes only after its
        // holder's write, so a read as new as this one holds that write.
        let mut deleted_at = None;
        let mut written_before = BTreeMap::new();
        for ticket in nearest {
            let until = (Instant::now() + patience).min(give_up);
            match watch_until_deleted(store, &ticket.name, &revision, until)? {
                Some((at, gone)) => {
                    read_written(&gone, &mut written_before);
                    deleted_at = Some(at);
                }
                None => {
                    deleted_at = None;
                    break;
                }
            }
        }
        if let Some(at) = deleted_at {
            // Still queued, or served meanwhile (its ticket deleted by the DEL
            // that removed its entries)? One GET of the small ticket, not a
            // LIST of the queue: a write that served many wakes them all.
            return Ok(if still_queued(store, &mine.name, give_up) {
                Waited::Ours { after: started.elapsed(), listed: None, written_before }
            } else {
                Waited::Served { after: started.elapsed(), revision: at }
            });
        }
    }
}

/// The tickets of `listed` ahead of `mine` (sharing a pool, lower version), oldest first.
fn ahead_of(mine: &Ticket, listed: &[Ticket]) -> Vec<Ticket> {
    let mut ahead: Vec<Ticket> = listed.iter().filter(|t| t.version < mine.version && !t.pools.is_disjoint(&mine.pools)).cloned().collect();
    ahead.sort_by_key(|t| t.version);
    ahead
}

/// Every ticket in the queue, as new as `version` at least, and the revision of the LIST.
fn list(store: &KubernetesStore, version: u64, deadline: Instant) -> Result<(Vec<Ticket>, String), String> {
    let action = format!("listing the turn tickets in namespace {}", store.namespace);
    // At least as new as our own ticket, so every ticket made before it is in
    // the answer; no newer needed: the watch cache answers as soon as it has seen
    // our create (a consistent LIST would wait for etcd's next progress
    // notification whenever other kinds were written last).
    let path = format!(
        "{}?labelSelector={}%3D{TICKET_KIND}&resourceVersion={}&resourceVersionMatch=NotOlderThan",
        collection_path(&store.namespace),
        TICKET_LABEL.replace('/', "%2F"),
        version
    );
    let list = match store.call(Method::GET, &path, None, &action, deadline).map_err(|e| e.to_string())? {
        Reply::Object(list) => list,
        Reply::Status(s) => return Err(store.status_error(&s, &action).to_string()),
    };
    let revision = list.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string();
    let items = list.get("items").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    Ok((items.iter().filter_map(Ticket::parse).collect(), revision))
}

/// Whether ticket `name` still exists; a failed read says it does (the call
/// then takes its turn, which is always safe).
fn still_queued(store: &KubernetesStore, name: &str, deadline: Instant) -> bool {
    let action = format!("reading turn ticket {}/{name}", store.namespace);
    !matches!(store.call(Method::GET, &ticket_path(&store.namespace, name), None, &action, deadline), Ok(Reply::Status(s)) if s.code == 404)
}

/// Watches ticket `name` from `revision` on; the revision of its delete and
/// the ticket as deleted, once it is deleted; `None` when `until` came first or
/// the watch ended without it.
fn watch_until_deleted(store: &KubernetesStore, name: &str, revision: &str, until: Instant) -> Result<Option<(String, Value)>, String> {
    let limit = until.saturating_duration_since(Instant::now());
    let path = format!(
        "{}?watch=true&fieldSelector=metadata.name%3D{name}&resourceVersion={revision}&timeoutSeconds={}",
        collection_path(&store.namespace),
        limit.as_secs_f64().ceil().max(1.0) as u64
    );
    let request = http::Request::builder().method(Method::GET).uri(&path).header(http::header::ACCEPT, JSON).body(Vec::new()).map_err(|e| e.to_string())?;
    let number = store.count_request();
    logging::debug(format!("kubernetes API request #{number}: GET {path} (watch)"));
    let client = store.client.clone();
    let watched = store.runtime.within(limit, async move {
        let events = match client.request_events::<Value>(request).await {
            Ok(events) => events,
            Err(kube::Error::Api(s)) if s.code == GONE => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.try_next().await.map_err(|e| e.to_string())? {
            match event {
                WatchEvent::Deleted(gone) => {
                    let at = gone.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or(revision).to_string();
                    return Ok(Some((at, gone)));
                }
                // The revision listed is older than the watch cache's window
                // (a long queue moves fast): list again, not a failure.
                WatchEvent::Error(e) if e.code == GONE => return Ok(None),
                WatchEvent::Error(e) => return Err(format!("watch answered {}: {}", e.code, e.message)),
                WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Bookmark(_) => {}
            }
        }
        Ok(None)
    });
    match watched {
        Some(Ok(deleted)) => Ok(deleted),
        Some(Err(e)) => Err(format!("watching turn ticket {name}: {e}")),
        None => Ok(None),
    }
}

/// The task renewing a holder's ticket.
struct Renewal {
    stop: std::sync::Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Renewal {
    /// Stops the renewal between two requests, never inside one: an aborted
    /// request is one the apiserver logs as a 504 ("context canceled"), 6 of
    /// the 39 in a burst of 500 DELs.
    fn stop(self, store: &KubernetesStore, deadline: Instant) {
        self.stop.notify_one();
        if store.runtime.within(deadline.saturating_duration_since(Instant::now()), self.task).is_none() {
            logging::debug("a ticket renewal did not end in time".to_string());
        }
    }
}

/// Renews ticket `name` every [`RENEW_EVERY`] on the store's runtime (it runs
/// while the call waits for any answer), until stopped or refused.
fn renew(store: &KubernetesStore, name: &str) -> Renewal {
    let client = store.client.clone();
    let path = ticket_path(&store.namespace, name);
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    let task = store.runtime.spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(RENEW_EVERY) => {}
                _ = stopped.notified() => return,
            }
            let body = serde_json::to_vec(&json!({"spec": {"renewTime": now()}})).unwrap_or_default();
            let Ok(request) = http::Request::builder().method(Method::PATCH).uri(&path).header(http::header::CONTENT_TYPE, JSON_MERGE_PATCH).body(body) else {
                return;
            };
            if client.request_text(request).await.is_err() {
                return;
            }
        }
    });
    Renewal { stop, task }
}

/// Deletes ticket `name` (only at `version` when given) by `deadline`, best effort.
fn delete(store: &KubernetesStore, name: &str, version: Option<u64>, deadline: Instant) {
    let action = format!("deleting turn ticket {}/{name}", store.namespace);
    let preconditions = version.map(|v| json!({"resourceVersion": v.to_string()}));
    if let Err(e) = store.delete_guarded(&ticket_path(&store.namespace, name), preconditions, &action, deadline) {
        logging::debug(format!("{e}"));
    }
}

fn ticket_path(namespace: &str, name: &str) -> String {
    format!("{}/{name}", collection_path(namespace))
}

/// Now, as a Lease's `MicroTime`.
fn now() -> Value {
    serde_json::to_value(MicroTime(k8s_openapi::jiff::Timestamp::now())).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_is_read_back_from_its_own_body() {
        let pools: BTreeSet<String> = ["b".to_string(), "a".to_string()].into();
        let offer = ReleaseOffer { group: "g".into(), container_id: "c1".into(), ifname: "eth0".into() };
        let mut body = ticket_body("ns", &pools, "default/pod c1 eth0", Some(&offer));
        body["metadata"]["name"] = json!("thereabouts-turn-x");
        body["metadata"]["resourceVersion"] = json!("42");
        assert_eq!(Ticket::parse(&body), Some(Ticket { name: "thereabouts-turn-x".into(), version: 42, pools, offer: Some(offer) }));
        assert_eq!(body["metadata"]["annotations"][POOLS_ANNOTATION], "a,b");
    }
}
