//! Where allocations live. One trait for every backend (the embedded file store,
//! Kubernetes `IPPool`s, etcd keys). A command begins a [`Transaction`] over its
//! pools: it reads them with opaque versions, then commits changes to several
//! pools at once, all or nothing, only if what the plan relied on is still true
//! (compare-and-swap, see [`Transaction::commit`] for what each backend
//! compares). Planning happens between the two in the engine, so a backend
//! never decides which address anyone gets.

mod client_runtime;
pub mod etcd;
pub mod failure;
pub mod file;
mod file_overlap;
mod flock;
pub mod kubernetes;
pub mod pool_document;
pub mod pool_file;
pub mod pool_note;
pub mod retry;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use thereabouts_allocator::model::{Allocation, Attachment, DatastoreSettings};

/// Where `"datastore": "file"` keeps its pools when `data_dir` is not set.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/thereabouts";

/// A pool: the allocations of one range CIDR (scoped by `network_name`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId {
    /// The engine's pool name, e.g. `192.0.2.0-24` or `blue-2001-db8---64`.
    pub name: String,
    /// The range's canonical CIDR, stored in the pool as its `range`.
    pub cidr: String,
    /// Only this node's calls write it: a node's pool of one of its slices
    /// (`node_slice_size`). Its writers then take turns through a lock on the
    /// node, not through the store (`kubernetes/turn.rs`).
    pub node_local: bool,
}

/// A backend's version of a pool: compared for equality only. The empty version
/// means "the pool does not exist yet".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Version(pub String);

impl Version {
    pub fn absent() -> Self {
        Version(String::new())
    }
    pub fn is_absent(&self) -> bool {
        self.0.is_empty()
    }
}

/// A pool as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pool {
    pub version: Version,
    /// In no particular order; one entry per offset.
    pub entries: Vec<Allocation>,
    /// The CNI network (`name`) whose ADD created, or last adopted, the entry at
    /// each offset, where the store records it: only the file store does, for
    /// GC. An entry without one (any other store; a file-store entry written
    /// before thereabouts recorded it) has no known creator.
    pub created_by: BTreeMap<u128, Arc<str>>,
    /// The offsets whose entry was made without a reservation (by a network
    /// with `enable_overlapping_ranges: false`), where the store records it:
    /// only the file store, whose overlapping pools are each other's
    /// reservations, needs to (see `file_overlap`).
    pub unreserved: std::collections::BTreeSet<u128>,
    /// Offsets someone else holds outside this pool, as far as this cycle found
    /// out (an address an overlapping range of another pool holds, or one a
    /// racing writer just reserved): the planner treats them as taken. Found by
    /// commits that ran into them ([`Retry::Reserved`] when the reservation is
    /// older than the pool as read, [`Retry::Conflict`] when it is newer).
    pub reserved: Vec<u128>,
}

/// One change to a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Record a new allocation at a free offset.
    Insert(Allocation),
    /// Forget the allocation at an offset (DEL, GC).
    Remove { offset: u128 },
    /// Hand an existing allocation to a new container of the same pod (a
    /// StatefulSet pod re-created under the same name keeps its address).
    SetContainerId { offset: u128, container_id: String },
    /// Hand a claim's entry to the claim's new holder (a VM's new launcher
    /// pod, a live migration's target): its container ID, pod and interface
    /// become `holder`'s, the claim stays. Applies only if the entry still
    /// has the container ID `from` as read.
    TakeOver { offset: u128, from: String, holder: Allocation },
    /// Keep the allocation the attachment holds at `offset` (a retried ADD):
    /// nothing changes, but the commit applies only if the entry is still
    /// there with `container_id`. A plan on a read that lags behind the pool
    /// (Kubernetes reads from the apiserver's cache) may find an entry that was
    /// removed since, and must not hand out its address.
    Keep { offset: u128, container_id: String },
    /// Reserve the address of `holder` (an entry this update inserts) cluster-wide
    /// under `name` (whereabouts' `OverlappingRangeIPReservation`), so no
    /// overlapping range of another pool hands it out. Taken before any pool is
    /// written. Only stores that [keep reservations](Capabilities::reservations)
    /// act on it; the others ignore it.
    Reserve { name: String, holder: Allocation },
    /// Drop the reservation `name` of `holder` (an entry this update removes), if
    /// it is still `holder`'s. Done after the pools are written; absence is fine.
    Unreserve { name: String, holder: Allocation },
}

impl Change {
    /// What the change does to a pool's entries (by offset): the one meaning of a
    /// change on every store, which then only encodes the result (file, etcd) or
    /// guards it (the Kubernetes JSON patch). A change that contradicts the
    /// entries it was planned on is an error, never skipped: every store plans
    /// on the entries it commits against. Reservations leave the entries alone.
    pub fn apply_to(&self, entries: &mut BTreeMap<u128, Allocation>) -> Result<(), String> {
        match self {
            Change::Insert(allocation) => {
                if entries.contains_key(&allocation.offset) {
                    return Err(format!("offset {} is already allocated", allocation.offset));
                }
                entries.insert(allocation.offset, allocation.clone());
            }
            Change::Remove { offset } => {
                entries.remove(offset).ok_or_else(|| format!("no allocation at offset {offset} to remove"))?;
            }
            Change::SetContainerId { offset, container_id } => {
                entries.get_mut(offset).ok_or_else(|| format!("no allocation at offset {offset} to update"))?.container_id = container_id.clone();
            }
            Change::TakeOver { offset, from, holder } => {
                let entry = entries
                    .get_mut(offset)
                    .filter(|e| e.container_id == *from)
                    .ok_or_else(|| format!("no allocation of container {from} at offset {offset} to take over"))?;
                entry.container_id = holder.container_id.clone();
                entry.pod_ref = holder.pod_ref.clone();
                entry.ifname = holder.ifname.clone();
            }
            Change::Keep { offset, container_id } => {
                if entries.get(offset).is_none_or(|e| e.container_id != *container_id) {
                    return Err(format!("no allocation of container {container_id} at offset {offset} to keep"));
                }
            }
            Change::Reserve { .. } | Change::Unreserve { .. } => {}
        }
        Ok(())
    }

    /// Whether the change alters the pool's entries (not only reservations,
    /// not a [`Change::Keep`]).
    pub fn touches_entries(&self) -> bool {
        !matches!(self, Change::Reserve { .. } | Change::Unreserve { .. } | Change::Keep { .. })
    }

    /// Whether the commit must check the pool's entries for it: every change
    /// to them, and a [`Change::Keep`].
    pub fn guards_entries(&self) -> bool {
        !matches!(self, Change::Reserve { .. } | Change::Unreserve { .. })
    }
}

/// `changes` applied in order to `entries` (see [`Change::apply_to`]).
pub fn apply_changes(entries: &mut BTreeMap<u128, Allocation>, changes: &[Change]) -> Result<(), String> {
    changes.iter().try_for_each(|change| change.apply_to(entries))
}

/// The changes to one pool, planned on the pool as read at `expected`. How much
/// of that read must still hold for the changes to apply is the backend's
/// compare-and-swap (see [`Transaction::commit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUpdate {
    pub pool: PoolId,
    pub expected: Version,
    pub changes: Vec<Change>,
}

impl PoolUpdate {
    /// How many entries the update adds.
    pub fn inserts(&self) -> usize {
        self.changes.iter().filter(|c| matches!(c, Change::Insert(_))).count()
    }
}

/// Offsets of each pool (by name) one cycle found held by someone else outside
/// the pool: handed to the planner with every later load ([`Pool::reserved`]).
#[derive(Debug, Default)]
pub struct ReservedOffsets(BTreeMap<String, BTreeSet<u128>>);

impl ReservedOffsets {
    pub fn add(&mut self, pool: &str, offsets: impl IntoIterator<Item = u128>) {
        self.0.entry(pool.to_string()).or_default().extend(offsets);
    }

    /// The offsets found held in `pool`, ascending.
    pub fn of(&self, pool: &str) -> Vec<u128> {
        self.0.get(pool).map(|s| s.iter().copied().collect()).unwrap_or_default()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DatastoreError {
    /// The call's time budget ran out (waiting for a lock, or retrying conflicts).
    #[error("datastore busy: {what} did not finish within the time limit")]
    Timeout { what: String },
    /// The storage itself failed (permissions, disk, ...). Possibly transient.
    #[error("datastore I/O error on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The configured location cannot hold a datastore.
    #[error("datastore location {path} is not a directory")]
    NotADirectory { path: PathBuf },
    /// Stored data this build cannot read.
    #[error("pool data {path} is unreadable: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    /// A change that contradicts the pool's content (a bug, never expected).
    #[error("inconsistent change to pool {pool}: {detail}")]
    Inconsistent { pool: String, detail: String },
    /// A shared store (the Kubernetes API server, etcd) could not be reached,
    /// did not answer in time, throttled us, has no leader or failed internally:
    /// may heal by itself. `server` names the store and its address.
    #[error("{server} unavailable while {action}: {detail}")]
    Unavailable { server: String, action: String, detail: String },
    /// A shared store refused our credentials or our identity's permissions:
    /// the install (token, RBAC, etcd user and role) needs fixing.
    #[error("{server} denied {action}: {detail}")]
    Denied { server: String, action: String, detail: String },
    /// Any other answer of a shared store we cannot work with (CRDs not
    /// installed, an object the schema rejects, TLS verification failure, ...).
    #[error("{server} rejected {action}: {detail}")]
    Rejected { server: String, action: String, detail: String },
    /// The config does not say which datastore to use, names one this build does
    /// not have, or lacks a setting the chosen one needs.
    #[error("{message}")]
    Unconfigured { field: &'static str, message: String },
    /// The kubeconfig named by `kubernetes.kubeconfig` cannot be used.
    #[error("kubeconfig {path} is unusable: {detail}")]
    Kubeconfig { path: PathBuf, detail: String },
    /// A pool cannot hold another entry: the store refused to keep an object
    /// that large (etcd's request limit, `--max-request-bytes`, 1.5 MiB by
    /// default, bounds every `IPPool` and etcd key). Retrying does not help.
    #[error(
        "{object} cannot hold another entry: the datastore refused the write as too large ({entries} entries; etcd keeps at most --max-request-bytes per object, 1.5 MiB by default, about 10 000 entries). Use several smaller ranges, or raise etcd's --max-request-bytes"
    )]
    PoolTooLarge { object: String, entries: usize },
    /// A stored object this build cannot read (e.g. an `IPPool` without a usable `spec`).
    #[error("{object} is unreadable: {detail}")]
    Malformed { object: String, detail: String },
    /// `node_slice_size`: the node holds no slice of a range yet, and none could
    /// be claimed now (the `NodeSlicePool` is not there yet, or every slice is
    /// held). May heal: the controller creates pools and hands slices back.
    #[error("no slice of NodeSlicePool {slice_pool} for node {node}: {detail}")]
    NoSlice { slice_pool: String, node: String, detail: String },
    /// The etcd settings cannot be used (no `etcd_host`, a certificate file that
    /// cannot be read, ...).
    #[error("etcd datastore config unusable: {detail}")]
    EtcdConfig { detail: String },
}

impl DatastoreError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DatastoreError::Io { path: path.into(), source }
    }
}

/// What one command's cycle is for, so a store prepares only what that needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose<'a> {
    /// Reading only (CHECK, STATUS, the `pools` command): no locks, no writes.
    Read,
    /// Reading, planning and committing (ADD, GC).
    Update,
    /// A DEL of one attachment in a store that keeps reservations: it also
    /// finds what the attachment holds outside the pools, for
    /// [`Transaction::free_leftovers`]. Kubernetes: one LIST of the reservations
    /// labelled with the attachment.
    Release { container_id: &'a str, ifname: &'a str },
}

/// The slices of a layout a node holds, as a store found them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSlices {
    pub slices: Vec<String>,
    /// Whether these are all the node holds; else some of them (those the
    /// node remembers, read by name).
    pub all: bool,
}

/// Why a commit did not apply, and the cycle should read again, plan again and
/// commit again (how soon is the caller's retry policy, `ipam`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retry {
    /// A pool moved since it was read (a racing writer): read again after a
    /// pause, and count it as contention for the engine.
    Conflict { pool: String },
    /// An address the plan chose turned out to be reserved already, before the
    /// pool was read: by an overlapping range, not by a writer racing for it.
    /// The reservation is now among the pool's [`Pool::reserved`]: plan again
    /// around it at once (lowest free, no pause, not contention).
    Reserved { pool: String, name: String },
    /// Nothing was written: the call queued for its turn on its pools first (a
    /// DEL, see [`Transaction::release_together`]) and now holds it, or was
    /// served meanwhile. Read and plan again at once.
    Turn,
}

/// How a [`Transaction::commit`] ended, when the store answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every update applied.
    Committed,
    /// None applied; see [`Retry`].
    Retry(Retry),
}

/// A datastore: where allocations live. Everything one command needs lives in
/// the [`Transaction`] it begins, never in the store, which only holds what
/// outlives a call (the connection, the directory).
pub trait Datastore {
    /// What and where, for logs and the `pools` command.
    fn describe(&self) -> String;

    /// What kind of store this is, as far as the allocation cycle cares.
    fn capabilities(&self) -> Capabilities;

    /// Whether the datastore can serve an ADD now (CNI STATUS).
    fn check_usable(&self, deadline: Instant) -> Result<(), DatastoreError>;

    /// One command's read-plan-commit cycle over `pools` (each once, in the
    /// config's range order), which must end by `deadline`: no request, lock
    /// wait or retry of the transaction outlasts it. Dropping the transaction
    /// ends the cycle, however it went: the store frees what it kept for a
    /// retry that will not come (Kubernetes: the reservations this call made
    /// for addresses no commit recorded).
    fn begin<'s>(&'s self, pools: &[PoolId], purpose: Purpose<'_>, deadline: Instant) -> Result<Box<dyn Transaction + 's>, DatastoreError>;

    /// `node_slice_size`: the slices of the `NodeSlicePool` `slice_pool` that
    /// `node` holds, in the pool's order. A store may answer from a cache;
    /// `fresh` asks for a read that sees every write completed before the call
    /// (after a cached read found none). Without `every`, a store may answer
    /// with some of them (an ADD needs one with room; a DEL first looks in
    /// those) and says so; `candidates` gives the range's slices where the
    /// store keeps no list of them. Only Kubernetes keeps node slices.
    fn node_slices(
        &self,
        slice_pool: &str,
        node: &str,
        fresh: bool,
        every: bool,
        candidates: &mut dyn SliceCandidates,
        deadline: Instant,
    ) -> Result<NodeSlices, DatastoreError> {
        let _ = (slice_pool, node, fresh, every, candidates, deadline);
        Err(no_node_slices(self))
    }

    /// The node that holds `slice` of `slice_pool`, if one does: where an
    /// address an IPAMClaim keeps lies when its VM moved to another node.
    fn slice_holder(&self, slice_pool: &str, slice: &str, deadline: Instant) -> Result<Option<String>, DatastoreError> {
        let _ = (slice_pool, slice, deadline);
        Err(no_node_slices(self))
    }

    /// A slice of `slice_pool` for `node` beyond the `known` ones it holds: one
    /// it holds already (another call of the node claimed it meanwhile), else
    /// a free slice that `candidates` accepts, given by compare-and-swap (two
    /// claimants never get one slice); `None` when no slice is free.
    fn claim_slice(
        &self,
        slice_pool: &str,
        node: &str,
        known: &[String],
        candidates: &mut dyn SliceCandidates,
        deadline: Instant,
    ) -> Result<Option<String>, DatastoreError> {
        let _ = (slice_pool, node, known, candidates, deadline);
        Err(no_node_slices(self))
    }

    /// What this node noted of each of its slice pools `pools` when its calls
    /// last read or wrote it (`pool_note.rs`), `None` where it noted nothing.
    /// Only Kubernetes keeps node slices.
    fn pool_notes(&self, pools: &[PoolId]) -> Vec<Option<pool_note::PoolNote>> {
        vec![None; pools.len()]
    }
}

/// What a claim may take: the range's slices, as the engine lays them out.
pub trait SliceCandidates {
    /// Whether the node can use `slice` (it holds an address of the range).
    fn usable(&mut self, slice: &str) -> bool;
    /// Every slice of the range, in address order: asked only where the
    /// store keeps no list of them (a layout of slice objects).
    fn layout(&mut self) -> Vec<String>;
    /// The `n` slices of that order from `node`'s home on (wrapping), without
    /// the whole layout: what a node that remembers none of its slices reads.
    fn near_home(&mut self, node: &str, n: usize) -> Vec<String>;
}

/// `node_slice_size` in a store without node slices.
fn no_node_slices<S: Datastore + ?Sized>(store: &S) -> DatastoreError {
    DatastoreError::Unconfigured {
        field: "ipam.node_slice_size",
        message: format!("node_slice_size needs the kubernetes datastore (NodeSlicePools), not the {}", store.describe()),
    }
}

/// One command's cycle: `load` → plan (the engine) → `commit`, again after a
/// [`Retry`], within the deadline given to [`Datastore::begin`].
pub trait Transaction {
    /// The cycle's pools now, in the order given to `begin`; an absent pool is
    /// empty with [`Version::absent`]. Each carries the offsets this cycle found
    /// reserved by others so far ([`Pool::reserved`]).
    ///
    /// - file: takes each existing pool's `flock` in name order first (not for
    ///   [`Purpose::Read`]), held until the commit: writers of one node queue
    ///   instead of invalidating each other's plans, which under a burst makes
    ///   tail latency explode. A pool that does not exist yet is not locked (a
    ///   DEL or GC of nothing writes nothing); its first writers meet in the
    ///   commit's version check.
    /// - kubernetes: one LIST per pool, except after a lost reservation race,
    ///   when the pools refused nothing: then the reads it has (their entry
    ///   guards make a stale read safe).
    /// - etcd: one GET, or one read-only transaction for several pools.
    fn load(&mut self) -> Result<Vec<Pool>, DatastoreError>;

    /// Applies every update or none, each only if the pool still agrees with
    /// what the plan relied on (compare-and-swap); otherwise [`Outcome::Retry`].
    /// What is compared depends on the backend:
    ///
    /// - file: the whole pool's version. Any write since the read is a conflict
    ///   (writers of one node queue on the locks `load` took, so this is rare).
    ///   The locks go when the commit returns.
    /// - kubernetes: each entry the update touches, not the `resourceVersion`
    ///   (`expected` only names the object read). A [`Change::Insert`] applies
    ///   only if its offset is still free, a [`Change::Remove`] or
    ///   [`Change::SetContainerId`] only if the entry still has the container ID
    ///   read; other writers' changes to other entries in the meantime do not
    ///   conflict. That is all an allocation needs (no address twice, never
    ///   removing someone else's entry), and it lets concurrent ADDs that planned
    ///   different addresses all succeed. Why this is safe next to whereabouts:
    ///   `docs/datastores.md`, "Why per-entry compare-and-swap is safe".
    /// - etcd: each pool key's `mod_revision` as read (the whole pool, like the
    ///   file store; `create_revision == 0` for an absent pool) and each new
    ///   reservation key's absence, all in one transaction: every pool of the
    ///   call lands or none does (see [`etcd`]).
    fn commit(&mut self, updates: &[PoolUpdate]) -> Result<Outcome, DatastoreError>;

    /// Whether this transaction now takes its turn alone on its pools (after a
    /// lost race, kubernetes waits for one: `kubernetes/turn.rs`): its next
    /// attempt then needs no pause and no spreading over the free addresses.
    fn serialized(&self) -> bool {
        false
    }

    /// [`Purpose::Release`] only, after the DEL's commit: frees what the
    /// attachment still holds outside the pools, and returns how many.
    /// Kubernetes: reservations an ADD made and could not delete before it
    /// failed (the apiserver went away, the process was killed); no pool entry
    /// leads to those. A reservation named in `in_use` stays: it guards an entry
    /// the DEL left in the pools (a newer container of the same pod adopted it,
    /// [`Change::SetContainerId`]), and a reservation goes only together with
    /// the entry it guards.
    fn free_leftovers(&mut self, _in_use: &[String]) -> Result<usize, DatastoreError> {
        Ok(0)
    }

    /// Group commit of DELs: this DEL (`attachment`) may have its entries
    /// removed by another DEL of the same `group` that holds the turn on the
    /// same pools, in that one's write, and may remove the entries of the DELs
    /// queued behind it in its own ([`Transaction::queued_releases`]). `group`
    /// names what decides a release's plan (the network and its pools): DELs
    /// of one group plan the same removals for an attachment. Stores whose
    /// writers do not queue ignore it.
    fn release_together(&mut self, _group: &str, _attachment: &Attachment) {}

    /// In this call's turn (after [`Transaction::release_together`]): the DELs
    /// of its group queued behind it, whose entries its next commit may remove
    /// with its own. Once that commit lands they are told they were served:
    /// their own next read finds their entries gone, and they write nothing
    /// but what lies outside the pools (their reservations). Asked before every
    /// plan in the turn; a commit that does not land serves nobody.
    fn queued_releases(&mut self) -> Vec<Attachment> {
        Vec::new()
    }
}

/// What DELs must share to be committed together ([`Transaction::release_together`]):
/// the network's name and its pools, which are all the release plan depends on
/// (entries match by container ID and interface; reservation names by network
/// and address).
pub fn release_group(network_name: &str, pools: &[PoolId]) -> String {
    use sha2::Digest;
    let mut digest = sha2::Sha256::new();
    digest.update(network_name.as_bytes());
    for pool in pools {
        digest.update(format!("\n{} {}", pool.name, pool.cidr).as_bytes());
    }
    digest.finalize().iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// What differs between backends beyond how they read and write, in one value
/// rather than a method per question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Other nodes write the same pools (Kubernetes, etcd). CNI GC only knows the
    /// attachments of this node's runtime, so it must not remove entries from
    /// such a store: it cannot tell another node's live entry from garbage.
    pub shared_by_nodes: bool,
    /// The store keeps cluster-wide address reservations ([`Change::Reserve`],
    /// [`Change::Unreserve`]); callers skip computing them for stores that do not.
    pub reservations: bool,
    /// The first and the longest pause between attempts after a
    /// [`Retry::Conflict`], each jittered ([`retry::Backoff::between`]).
    pub conflict_pauses: (Duration, Duration),
}

impl Capabilities {
    /// A store only this node writes, without reservations, with the default pauses.
    pub const NODE_LOCAL: Capabilities = Capabilities { shared_by_nodes: false, reservations: false, conflict_pauses: retry::DEFAULT_PAUSES };
    /// A store every node writes, with reservations.
    pub fn shared(conflict_pauses: (Duration, Duration)) -> Self {
        Capabilities { shared_by_nodes: true, reservations: true, conflict_pauses }
    }
}

/// The datastore a network config asks for. There is no silent default: a config
/// must say where its allocations live.
/// `network` is the config's CNI `name`: the file store records it on the
/// entries it writes.
pub fn open(settings: &DatastoreSettings, network: &str) -> Result<Box<dyn Datastore>, DatastoreError> {
    match settings.kind.as_deref() {
        Some("file") => {
            let dir = settings.data_dir.as_deref().filter(|d| !d.is_empty()).unwrap_or(DEFAULT_DATA_DIR);
            Ok(Box::new(file::FileStore::new(dir, network)))
        }
        Some("kubernetes") => open_kubernetes(settings),
        Some("etcd") => Ok(Box::new(etcd::EtcdStore::open(settings)?)),
        // whereabouts' behaviour: a kubeconfig means the Kubernetes datastore.
        None if settings.kubeconfig.as_deref().is_some_and(|k| !k.is_empty()) => open_kubernetes(settings),
        None => Err(DatastoreError::Unconfigured {
            field: "ipam.datastore",
            message: "ipam.datastore is not set: choose \"file\" (node-local, with \"data_dir\"), \"kubernetes\" (with \"kubernetes\": {\"kubeconfig\": ...}) or \"etcd\" (with \"etcd_host\")".into(),
        }),
        Some(other) => Err(DatastoreError::Unconfigured {
            field: "ipam.datastore",
            message: format!("unknown datastore {other:?}: choose \"file\", \"kubernetes\" or \"etcd\""),
        }),
    }
}

/// The Kubernetes datastore: `IPPool`s and reservations in the namespace of the
/// kubeconfig's current context. Only this path loads anything kube-related.
fn open_kubernetes(settings: &DatastoreSettings) -> Result<Box<dyn Datastore>, DatastoreError> {
    let path = settings.kubeconfig.as_deref().filter(|k| !k.is_empty()).ok_or_else(|| DatastoreError::Unconfigured {
        field: "ipam.kubernetes.kubeconfig",
        message: "the kubernetes datastore needs \"kubernetes\": {\"kubeconfig\": \"<path>\"} in the ipam section or the flat file".into(),
    })?;
    Ok(Box::new(kubernetes::KubernetesStore::open(std::path::Path::new(path))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_that_contradicts_the_entries_is_an_error_on_every_store() {
        let a = |offset: u128, id: &str| Allocation { offset, container_id: id.into(), pod_ref: "ns/p".into(), ifname: "eth0".into(), claim: None };
        let mut entries = BTreeMap::from([(1, a(1, "c1"))]);
        let changes = [Change::Insert(a(2, "c2")), Change::SetContainerId { offset: 1, container_id: "c3".into() }, Change::Remove { offset: 2 }];
        apply_changes(&mut entries, &changes).unwrap();
        assert_eq!(entries.values().map(|e| (e.offset, e.container_id.as_str())).collect::<Vec<_>>(), [(1, "c3")]);
        // The file store used to skip a removal of a free offset; now no store does.
        assert!(Change::Remove { offset: 9 }.apply_to(&mut entries).unwrap_err().contains("offset 9"));
        assert!(Change::Insert(a(1, "x")).apply_to(&mut entries).unwrap_err().contains("already allocated"));
        assert!(Change::SetContainerId { offset: 9, container_id: "x".into() }.apply_to(&mut entries).is_err());
    }

    #[test]
    fn no_silent_default_datastore() {
        let e = open(&DatastoreSettings::default(), "n").err().unwrap();
        assert!(matches!(e, DatastoreError::Unconfigured { field: "ipam.datastore", .. }), "{e:?}");
        for choice in ["\"file\"", "\"kubernetes\"", "\"etcd\""] {
            assert!(e.to_string().contains(choice), "{e}");
        }
        // A kubeconfig alone selects the Kubernetes datastore (whereabouts'
        // behaviour); a missing file is a config error naming it.
        let k8s = DatastoreSettings { kubeconfig: Some("/nonexistent/thereabouts.kubeconfig".into()), ..Default::default() };
        let e = open(&k8s, "n").err().unwrap();
        assert!(matches!(&e, DatastoreError::Kubeconfig { path, .. } if path.ends_with("thereabouts.kubeconfig")), "{e:?}");
        let no_kubeconfig = DatastoreSettings { kind: Some("kubernetes".into()), ..Default::default() };
        let e = open(&no_kubeconfig, "n").err().unwrap();
        assert!(matches!(e, DatastoreError::Unconfigured { field: "ipam.kubernetes.kubeconfig", .. }), "{e:?}");
        // etcd without an endpoint: a config error naming the key.
        let etcd = DatastoreSettings { kind: Some("etcd".into()), ..Default::default() };
        let e = open(&etcd, "n").err().unwrap();
        assert!(matches!(&e, DatastoreError::EtcdConfig { detail } if detail.contains("etcd_host")), "{e:?}");
        let etcd = DatastoreSettings { etcd_hosts: vec!["127.0.0.1:2379".into()], ..etcd };
        assert!(open(&etcd, "n").unwrap().describe().contains("prefix /thereabouts/ at http://127.0.0.1:2379"));
        let file = DatastoreSettings { kind: Some("file".into()), ..Default::default() };
        assert!(open(&file, "n").unwrap().describe().contains(DEFAULT_DATA_DIR));
    }
}
