//! The embedded, node-local datastore (`"datastore": "file"`), for clusters or
//! hosts without a shared store, like host-local but with whereabouts' pools.
//!
//! Layout of `data_dir`:
//! - `<pool>.pool`: one pool, in two slots that are overwritten alternately (see
//!   [`super::pool_file`]). Each slot holds a version number and the pool shaped
//!   like an `IPPool` spec: `{"range": "192.0.2.0/24", "allocations": {"1":
//!   {"id", "podref", "ifname", "network"}}}` (keys are decimal offsets from the
//!   network address, as in whereabouts). `network` is the CNI `name` of the
//!   network whose ADD created the entry (or last adopted it for a new
//!   container): networks on the same range without distinct `network_name`s
//!   share the pool, and a network's GC frees only its own entries. Entries
//!   written before it was recorded have none, and GC never frees them.
//! - `<pool>.lock`: the pool's inter-process lock (`flock`), kept forever.
//! - `.reservations[-<network_name>].lock`: the lock of a `network_name`'s
//!   reservations (below), kept forever.
//! - `.<pool>.pool.tmp`: a new, larger file being built when a pool outgrows its
//!   slots; only the lock holder writes it, so one left behind is a crashed
//!   writer's and the next writer truncates it.
//!
//! Readers take no lock: they read the newest slot whose checksum holds, so they
//! see a whole version, never a torn one. Writers lock every pool they change in
//! name order (no deadlock between multi-pool commits), check the versions they
//! planned against, build any outgrown files first (invisible until renamed),
//! then write every pool's spare slot and flush them together.
//!
//! Crash window: a kill between the slot writes of one multi-pool commit leaves
//! the first pools updated and the others not. No slot is torn and no address is
//! given twice; the ADD never reported success, so the runtime sends DEL (which
//! releases the entries in every pool) or retries the ADD (which finds and reuses
//! the partial entries, keyed by pod and interface); GC removes them otherwise.
//!
//! Overlapping ranges (`enable_overlapping_ranges`, the default): an address
//! that a pool of the same `network_name` with an overlapping range holds is
//! reserved, as the Kubernetes and etcd stores reserve it with one object per
//! address. Those pools are the reservations (see [`super::file_overlap`]): no
//! second record, so no crash can separate an entry from its reservation. A
//! commit that reserves ([`Change::Reserve`]) takes the `network_name`'s
//! reservations lock after its pool locks, reads the overlapping pools, and
//! writes its new versions before letting go; so of two commits racing for one
//! address in two pools, the second sees the first's entry. It then fails with
//! [`Retry::Reserved`] and records every address those pools hold as the
//! pool's [`reserved`](Pool::reserved), and the retry plans around them. The lock
//! goes before the flushes: a later commit that sees a version not yet durable
//! only avoids an address that a power cut may free again.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::time::Instant;
use thereabouts_allocator::model::Allocation;

use super::file_overlap::{Scoped, same_range};
use super::pool_document::{self, Format, PoolDocument};
use super::pool_file;
use super::{Capabilities, Change, Datastore, DatastoreError, Outcome, Pool, PoolId, PoolUpdate, Purpose, ReservedOffsets, Retry, Transaction, Version};

/// A pool file as found under the pool's lock: where its current version lies.
struct OnDisk {
    file: File,
    slot_size: u64,
    current_slot: u64,
    version: u64,
}

impl OnDisk {
    fn try_clone(&self) -> std::io::Result<OnDisk> {
        Ok(OnDisk { file: self.file.try_clone()?, ..*self })
    }
}

/// How a commit writes one pool.
enum PoolWrite {
    /// Into the spare slot of the existing file.
    Slot { file: File, slot_size: u64, index: u64, version: u64, payload: Vec<u8> },
    /// A new or rebuilt file, already written and flushed as `temp`.
    Replace { temp: PathBuf, path: PathBuf },
}

pub struct FileStore {
    dir: PathBuf,
    /// The CNI network of this call, recorded on the entries it writes.
    network: Arc<str>,
}

impl FileStore {
    /// The store in `dir`, writing on behalf of the CNI network `network`.
    pub fn new(dir: impl Into<PathBuf>, network: &str) -> Self {
        Self { dir: dir.into(), network: Arc::from(network) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn pool_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pool"))
    }
    fn lock_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.lock"))
    }
    fn temp_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!(".{name}.pool.tmp"))
    }
    /// The lock of a `network_name`'s reservations (hidden: no pool name starts with a dot).
    fn reservations_lock_path(&self, scope: &str) -> PathBuf {
        self.dir.join(if scope.is_empty() { ".reservations.lock".to_string() } else { format!(".reservations-{scope}.lock") })
    }

    /// Whether `data_dir` exists (a missing one holds empty pools).
    fn dir_exists(&self) -> Result<bool, DatastoreError> {
        match fs::metadata(&self.dir) {
            Ok(meta) if meta.is_dir() => Ok(true),
            Ok(_) => Err(DatastoreError::NotADirectory { path: self.dir.clone() }),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) if e.kind() == ErrorKind::NotADirectory => Err(DatastoreError::NotADirectory { path: self.dir.clone() }),
            Err(e) => Err(DatastoreError::io(&self.dir, e)),
        }
    }

    fn ensure_dir(&self) -> Result<(), DatastoreError> {
        if self.dir_exists()? {
            return Ok(());
        }
        fs::create_dir_all(&self.dir).map_err(|e| match e.kind() {
            ErrorKind::NotADirectory | ErrorKind::AlreadyExists => DatastoreError::NotADirectory { path: self.dir.clone() },
            _ => DatastoreError::io(&self.dir, e),
        })
    }

    /// Takes the pool's lock, waiting until `deadline` at the latest.
    fn lock(&self, name: &str, deadline: Instant) -> Result<File, DatastoreError> {
        super::flock::lock(self.lock_path(name), &format!("pool {name}"), deadline)
    }

    /// The names of the pools in `data_dir`.
    fn pool_names(&self) -> Result<Vec<String>, DatastoreError> {
        let io = |e| DatastoreError::io(&self.dir, e);
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io)? {
            let file_name = entry.map_err(io)?.file_name();
            if let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(".pool")).filter(|n| !n.starts_with('.')) {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }

    /// The pool's newest intact version and where it lies; `None` if the pool
    /// has no file yet.
    fn read_on_disk(&self, pool: &PoolId) -> Result<Option<(OnDisk, Pool)>, DatastoreError> {
        let Some((on_disk, range, read)) = self.read_newest(&pool.name)? else { return Ok(None) };
        if range != pool.cidr {
            return Err(DatastoreError::Corrupt { path: self.pool_path(&pool.name), detail: format!("holds range {range}, expected {}", pool.cidr) });
        }
        Ok(Some((on_disk, read)))
    }

    /// The newest intact version of the pool file `name`, with the range it
    /// says it holds.
    fn read_newest(&self, name: &str) -> Result<Option<(OnDisk, String, Pool)>, DatastoreError> {
        let path = self.pool_path(name);
        let io = |e: std::io::Error| DatastoreError::io(&path, e);
        // A lock-free reader can lose a race against writers that overwrite both
        // slots while it reads; a few fresh reads settle it. Under the lock (every
        // commit) the first read is stable.
        for _ in 0..8 {
            let file = match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
                // A read-only data_dir still serves reads (CHECK, `pools`).
                Err(e) if e.kind() == ErrorKind::PermissionDenied => File::open(&path).map_err(io)?,
                Err(e) => return Err(io(e)),
            };
            let len = file.metadata().map_err(io)?.size();
            let corrupt = |detail: String| DatastoreError::Corrupt { path: path.clone(), detail };
            let Some(slot_size) = pool_file::slot_size(len) else {
                return Err(corrupt(format!("{len} bytes is not a pool file size")));
            };
            if let Some(slot) = pool_file::read_newest(&file, len).map_err(io)? {
                let (range, pool) = decode(&path, &slot.payload)?;
                let on_disk = OnDisk { file, slot_size, current_slot: slot.index, version: slot.version };
                return Ok(Some((on_disk, range, Pool { version: Version(slot.version.to_string()), ..pool })));
            }
        }
        Err(DatastoreError::Corrupt { path, detail: "neither slot holds an intact version".into() })
    }

    /// Builds a new pool file holding one version beside the real one, flushed.
    fn write_new_file(&self, pool: &PoolId, version: u64, payload: &[u8]) -> Result<PathBuf, DatastoreError> {
        let temp = self.temp_path(&pool.name);
        let write = || -> std::io::Result<()> {
            let mut file = OpenOptions::new().create(true).truncate(true).write(true).open(&temp)?;
            file.write_all(&pool_file::new_file(pool_file::slot_size_for(payload.len()), version, payload))?;
            // Data only: the rename and the directory sync make the name durable.
            file.sync_data()
        };
        write().map_err(|e| DatastoreError::io(&temp, e))?;
        Ok(temp)
    }

    fn sync_dir(&self) -> Result<(), DatastoreError> {
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| DatastoreError::io(&self.dir, e))
    }
}

impl Datastore for FileStore {
    fn describe(&self) -> String {
        format!("file datastore in {}", self.dir.display())
    }

    /// Overlapping pools of one `network_name` hold each other's reservations
    /// (see the module documentation).
    fn capabilities(&self) -> Capabilities {
        Capabilities { reservations: true, ..Capabilities::NODE_LOCAL }
    }

    fn check_usable(&self, _deadline: Instant) -> Result<(), DatastoreError> {
        self.ensure_dir()?;
        // Writing is what ADD needs; a probe file proves it (read-only mounts, full disks).
        let probe = self.dir.join(format!(".status-probe-{}", std::process::id()));
        let result = OpenOptions::new().create(true).truncate(true).write(true).open(&probe).and_then(|mut f| f.write_all(b"ok"));
        let _ = fs::remove_file(&probe);
        result.map_err(|e| DatastoreError::io(&self.dir, e))
    }

    fn begin<'s>(&'s self, pools: &[PoolId], purpose: Purpose<'_>, deadline: Instant) -> Result<Box<dyn Transaction + 's>, DatastoreError> {
        Ok(Box::new(FileTransaction {
            store: self,
            pools: pools.to_vec(),
            locking: purpose != Purpose::Read,
            deadline,
            locked: BTreeMap::new(),
            _locks: Vec::new(),
            reserved: ReservedOffsets::default(),
        }))
    }
}

/// One command's cycle on the file store.
struct FileTransaction<'s> {
    store: &'s FileStore,
    pools: Vec<PoolId>,
    /// Whether `load` queues behind other writers (not for [`Purpose::Read`]).
    locking: bool,
    deadline: Instant,
    /// The pools this attempt holds the lock of (taken by `load`), each with
    /// what `load` read under it. `commit` must not take those locks again (a
    /// second `flock` on a new descriptor of the same file would wait for
    /// ourselves), and need not read those pools again: nobody else can have
    /// written them since.
    locked: BTreeMap<String, Option<(OnDisk, Pool)>>,
    /// The `flock`s of `locked`, released when the attempt's commit returns.
    _locks: Vec<File>,
    /// Offsets of each pool (by name) that a commit found held by an
    /// overlapping pool of the same `network_name`: planned around from then on.
    reserved: ReservedOffsets,
}

impl Transaction for FileTransaction<'_> {
    fn load(&mut self) -> Result<Vec<Pool>, DatastoreError> {
        if !self.store.dir_exists()? {
            return Ok(self.pools.iter().map(|_| Pool::default()).collect());
        }
        // Taken anew for every attempt: a pool that did not exist at the first
        // attempt (and so could not be locked) does after a conflict, and an
        // attempt that keeps planning without the lock would lose to lock
        // holders forever.
        if self.locking && self.locked.is_empty() {
            self.lock_existing()?;
        }
        let mut loaded = Vec::with_capacity(self.pools.len());
        for pool in &self.pools {
            let read = self.store.read_on_disk(pool)?;
            if let Some(slot) = self.locked.get_mut(&pool.name) {
                *slot = match &read {
                    Some((disk, content)) => Some((disk.try_clone().map_err(|e| DatastoreError::io(self.store.pool_path(&pool.name), e))?, content.clone())),
                    None => None,
                };
            }
            let mut pool_read = read.map(|(_, p)| p).unwrap_or_default();
            pool_read.reserved = self.reserved.of(&pool.name);
            loaded.push(pool_read);
        }
        Ok(loaded)
    }

    fn commit(&mut self, updates: &[PoolUpdate]) -> Result<Outcome, DatastoreError> {
        let outcome = self.write(updates);
        // The attempt's locks go with it, however it went: a writer that
        // pauses before its retry holds nobody up.
        self.locked.clear();
        self._locks.clear();
        outcome
    }

    /// A writer only loses a race on a pool that did not exist when it read
    /// (an existing one is locked from the read on). The winner created it,
    /// so the next attempt reads under its lock, queued in the kernel behind
    /// the other writers: it plans lowest-free at once, with no pause, and a
    /// burst on a new pool hands out the addresses one call at a time would.
    fn serialized(&self) -> bool {
        self.locking
    }
}

impl FileTransaction<'_> {
    /// Locks the cycle's pools that already exist, in name order (no deadlock
    /// between multi-pool commits). A pool not created yet is not locked (so a
    /// DEL or GC of nothing writes nothing); its first writers meet in the
    /// commit's version check instead, and the losers queue on its lock (see
    /// [`Transaction::serialized`]).
    fn lock_existing(&mut self) -> Result<(), DatastoreError> {
        let mut names: Vec<&str> = self.pools.iter().map(|p| p.name.as_str()).filter(|n| self.store.pool_path(n).exists()).collect();
        names.sort_unstable();
        names.dedup();
        self._locks = names.iter().map(|n| self.store.lock(n, self.deadline)).collect::<Result<Vec<_>, _>>()?;
        self.locked = names.iter().map(|n| (n.to_string(), None)).collect();
        Ok(())
    }

    /// The commit of [`Transaction::commit`], under the locks `load` took and
    /// those of the pools it creates.
    fn write(&mut self, updates: &[PoolUpdate]) -> Result<Outcome, DatastoreError> {
        let (store, deadline) = (self.store, self.deadline);
        // A Keep needs no check here: the pools stay locked from the read on.
        let writes_something = |u: &&PoolUpdate| u.changes.iter().any(|c| !matches!(c, Change::Keep { .. }));
        if !updates.iter().any(|u| writes_something(&u)) {
            return Ok(Outcome::Committed);
        }
        store.ensure_dir()?;
        let mut order: Vec<&PoolUpdate> = updates.iter().filter(writes_something).collect();
        order.sort_by(|a, b| a.pool.name.cmp(&b.pool.name));
        if order.windows(2).any(|w| w[0].pool.name == w[1].pool.name) {
            return Err(DatastoreError::Inconsistent { pool: order[0].pool.name.clone(), detail: "one commit updates the same pool twice".into() });
        }
        // Held until the end of the function: every rename happens under every lock.
        let _locks =
            order.iter().filter(|u| !self.locked.contains_key(&u.pool.name)).map(|u| store.lock(&u.pool.name, deadline)).collect::<Result<Vec<_>, _>>()?;

        // Check every version and reservation and build every outgrown file
        // before touching any pool, so a failure up to here leaves every pool as
        // it was.
        let mut read = Vec::with_capacity(order.len());
        for &update in &order {
            let current = match self.locked.get_mut(&update.pool.name).and_then(Option::take) {
                Some(read) => Some(read),
                None => store.read_on_disk(&update.pool)?,
            };
            let version = current.as_ref().map(|(_, pool)| pool.version.clone()).unwrap_or_default();
            if version != update.expected {
                return Ok(Outcome::Retry(Retry::Conflict { pool: update.pool.name.clone() }));
            }
            read.push((update, current));
        }
        let reservations = match self.check_reservations(&read)? {
            Ok(locks) => locks,
            Err(refused) => return Ok(Outcome::Retry(refused)),
        };
        let mut writes = Vec::with_capacity(order.len());
        for (update, current) in read {
            let (disk, pool) = current.map_or((None, Pool::default()), |(disk, pool)| (Some(disk), pool));
            let stored = apply(&update.pool.name, pool, &update.changes, &store.network)?;
            let payload = pool_document::encode(&update.pool.cidr, &stored.entries, &stored.created_by, &stored.unreserved, Format::Pretty);
            writes.push(match disk {
                Some(disk) if pool_file::fits(disk.slot_size, payload.len()) => {
                    PoolWrite::Slot { index: 1 - disk.current_slot, version: disk.version + 1, file: disk.file, slot_size: disk.slot_size, payload }
                }
                disk => {
                    let version = disk.map_or(1, |disk| disk.version + 1);
                    PoolWrite::Replace { temp: store.write_new_file(&update.pool, version, &payload)?, path: store.pool_path(&update.pool.name) }
                }
            });
        }
        let mut renamed = false;
        let mut written = Vec::new();
        for write in &writes {
            match write {
                PoolWrite::Slot { file, slot_size, index, version, payload } => {
                    pool_file::write_slot(file, *slot_size, *index, *version, payload).map_err(|e| DatastoreError::io(&store.dir, e))?;
                    written.push(file);
                }
                PoolWrite::Replace { temp, path } => {
                    fs::rename(temp, path).map_err(|e| DatastoreError::io(path, e))?;
                    renamed = true;
                }
            }
        }
        // Every new version is in place for readers: the next commit that reserves
        // in these scopes will see it.
        drop(reservations);
        // One data flush per written pool: blocks the files already own, so no
        // journal commit on ext4.
        sync_all_data(&written).map_err(|e| DatastoreError::io(&store.dir, e))?;
        if renamed {
            store.sync_dir()?;
        }
        Ok(Outcome::Committed)
    }

    /// Refuses a commit that reserves an address an overlapping pool of the
    /// same `network_name` holds ([`Retry::Reserved`], with everything those
    /// pools hold now among the pool's [`reserved`](Pool::reserved)). `read`
    /// holds the commit's updates with their pools as read under their locks.
    /// Returns the reservations locks, to hold until the new versions are in place.
    fn check_reservations(&mut self, read: &[(&PoolUpdate, Option<(OnDisk, Pool)>)]) -> Result<Result<Vec<File>, Retry>, DatastoreError> {
        let (store, deadline) = (self.store, self.deadline);
        let mut reserving = Vec::new();
        for (update, _) in read {
            let holders: Vec<(&str, u128)> = update
                .changes
                .iter()
                .filter_map(|c| match c {
                    Change::Reserve { name, holder } => Some((name.as_str(), holder.offset)),
                    _ => None,
                })
                .collect();
            if holders.is_empty() {
                continue;
            }
            let scoped = Scoped::of(&update.pool).ok_or_else(|| DatastoreError::Inconsistent {
                pool: update.pool.name.clone(),
                detail: format!("not the pool name of range {} under any network_name", update.pool.cidr),
            })?;
            reserving.push((update, scoped, holders));
        }
        if reserving.is_empty() {
            return Ok(Ok(Vec::new()));
        }
        let mut scopes: Vec<&str> = reserving.iter().map(|(_, scoped, _)| scoped.scope.as_str()).collect();
        scopes.sort_unstable();
        scopes.dedup();
        let locks = scopes
            .iter()
            .map(|scope| super::flock::lock(store.reservations_lock_path(scope), &format!("the reservations of network_name {scope:?}"), deadline))
            .collect::<Result<Vec<_>, _>>()?;
        // The commit's own pools as read; the others from disk, under the locks
        // every commit that reserves in these scopes takes. An entry made
        // without a reservation is none (as on Kubernetes and etcd, where such
        // an ADD writes no reservation object).
        let before: BTreeMap<&str, Vec<u128>> =
            read.iter().map(|(u, current)| (u.pool.name.as_str(), current.as_ref().map(|(_, p)| reservations_in(p)).unwrap_or_default())).collect();
        let mut names = store.pool_names()?;
        names.extend(before.keys().map(|n| n.to_string()));
        names.sort_unstable();
        names.dedup();
        for (update, scoped, holders) in &reserving {
            let mut held = BTreeSet::new();
            for name in names.iter().filter(|n| **n != update.pool.name) {
                let Some(range) = scoped.peer_range(name).filter(|r| scoped.overlaps(r)) else { continue };
                let offsets = match before.get(name.as_str()) {
                    Some(offsets) => offsets.clone(),
                    None => match store.read_newest(name)? {
                        Some((_, stored_range, pool)) if same_range(&stored_range, &range) => reservations_in(&pool),
                        // Another network_name's pool whose name reads as ours too.
                        _ => continue,
                    },
                };
                held.extend(scoped.offsets_of(&range, offsets.into_iter()));
            }
            if let Some((name, _)) = holders.iter().find(|(_, offset)| held.contains(offset)) {
                self.reserved.add(&update.pool.name, held);
                return Ok(Err(Retry::Reserved { pool: update.pool.name.clone(), name: name.to_string() }));
            }
        }
        Ok(Ok(locks))
    }
}

/// The offsets of a pool's entries that reserve their address for the
/// overlapping pools of its `network_name`.
fn reservations_in(pool: &Pool) -> Vec<u128> {
    pool.entries.iter().map(|e| e.offset).filter(|o| !pool.unreserved.contains(o)).collect()
}

/// A pool's entries by offset, with the network that created each, if known,
/// and those made without a reservation.
#[derive(Debug, Default, PartialEq, Eq)]
struct Stored {
    entries: BTreeMap<u128, Allocation>,
    created_by: BTreeMap<u128, Arc<str>>,
    unreserved: BTreeSet<u128>,
}

/// `pool` after `changes` made on behalf of the CNI network `network`: an
/// entry it inserts, or adopts for a new container, is recorded as that network's.
fn apply(pool_name: &str, pool: Pool, changes: &[Change], network: &Arc<str>) -> Result<Stored, DatastoreError> {
    let mut stored = Stored { entries: pool.entries.into_iter().map(|a| (a.offset, a)).collect(), created_by: pool.created_by, unreserved: pool.unreserved };
    let reserved_here: BTreeSet<u128> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Reserve { holder, .. } => Some(holder.offset),
            _ => None,
        })
        .collect();
    let inconsistent = |detail: String| DatastoreError::Inconsistent { pool: pool_name.to_string(), detail };
    let record = |created_by: &mut BTreeMap<u128, Arc<str>>, offset: u128| {
        if !network.is_empty() {
            created_by.insert(offset, Arc::clone(network));
        }
    };
    for change in changes {
        change.apply_to(&mut stored.entries).map_err(inconsistent)?;
        // Who created an entry: the network that inserted it, or that a new
        // container of the pod took it over for.
        match change {
            Change::Insert(allocation) => {
                record(&mut stored.created_by, allocation.offset);
                // Inserted without a reservation: a network with
                // `enable_overlapping_ranges: false` made it.
                if !reserved_here.contains(&allocation.offset) {
                    stored.unreserved.insert(allocation.offset);
                }
            }
            Change::SetContainerId { offset, .. } | Change::TakeOver { offset, .. } => record(&mut stored.created_by, *offset),
            Change::Remove { offset } => {
                stored.created_by.remove(offset);
                stored.unreserved.remove(offset);
            }
            Change::Keep { .. } | Change::Reserve { .. } | Change::Unreserve { .. } => {}
        }
    }
    Ok(stored)
}

/// A stored pool: the range it says it holds, and its entries with the network
/// that created each where known (the version is the slot's, not set here).
fn decode(path: &Path, bytes: &[u8]) -> Result<(String, Pool), DatastoreError> {
    let doc = PoolDocument::decode(bytes).map_err(|detail| DatastoreError::Corrupt { path: path.to_path_buf(), detail })?;
    Ok((doc.range, Pool { entries: doc.entries, created_by: doc.created_by, unreserved: doc.unreserved, ..Pool::default() }))
}

/// `fdatasync` of every written pool file, one after the other: data-only
/// flushes of blocks the files already own are short, and a helper thread per
/// file (to overlap them) costs a one-shot process more than it saves.
fn sync_all_data(files: &[&File]) -> std::io::Result<()> {
    files.iter().try_for_each(|f| f.sync_data())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("thereabouts-file-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn pool(name: &str, cidr: &str) -> PoolId {
        PoolId { name: name.into(), cidr: cidr.into(), node_local: false }
    }

    fn alloc(offset: u128, id: &str) -> Allocation {
        Allocation { offset, container_id: id.into(), pod_ref: "ns/p".into(), ifname: "eth0".into(), claim: None }
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    /// How a commit in tests fails: asked to retry, or an error.
    #[derive(Debug)]
    enum Refused {
        Retry(Retry),
        Failed(DatastoreError),
    }

    impl FileStore {
        /// One pool, read as a CHECK reads it.
        fn read(&self, pool: &PoolId) -> Result<Pool, DatastoreError> {
            Ok(self.begin(std::slice::from_ref(pool), Purpose::Read, soon())?.load()?.remove(0))
        }

        /// `updates` committed in a transaction of their own (no load first).
        fn commit_alone(&self, updates: &[PoolUpdate], deadline: Instant) -> Result<(), Refused> {
            let pools: Vec<PoolId> = updates.iter().map(|u| u.pool.clone()).collect();
            let mut tx = self.begin(&pools, Purpose::Update, deadline).map_err(Refused::Failed)?;
            match tx.commit(updates).map_err(Refused::Failed)? {
                Outcome::Committed => Ok(()),
                Outcome::Retry(retry) => Err(Refused::Retry(retry)),
            }
        }
    }

    /// A stored pool of `pool`'s range, as `read_on_disk` checks it.
    fn decode_as(path: &Path, bytes: &[u8], pool: &PoolId) -> Result<Pool, DatastoreError> {
        let (range, read) = decode(path, bytes)?;
        if range != pool.cidr {
            return Err(DatastoreError::Corrupt { path: path.to_path_buf(), detail: format!("holds range {range}, expected {}", pool.cidr) });
        }
        Ok(read)
    }

    #[test]
    fn missing_directory_reads_as_empty_pools_and_is_created_on_commit() {
        let dir = temp_dir("create");
        let store = FileStore::new(dir.join("nested"), "net");
        let p = pool("192.0.2.0-24", "192.0.2.0/24");
        assert_eq!(store.read(&p).unwrap(), Pool::default());
        let update = PoolUpdate { pool: p.clone(), expected: Version::absent(), changes: vec![Change::Insert(alloc(1, "c1"))] };
        store.commit_alone(&[update], soon()).unwrap();
        let loaded = store.read(&p).unwrap();
        assert_eq!(loaded.version, Version("1".into()));
        assert_eq!(loaded.entries, vec![alloc(1, "c1")]);
        let (version, payload) = pool_file::read_path(&dir.join("nested/192.0.2.0-24.pool")).unwrap().unwrap();
        assert_eq!(version, 1);
        let doc: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(doc["range"], "192.0.2.0/24");
        // One network created every entry: its name is written once, for the pool.
        // Inserted without a reservation (overlapping ranges off), it says so.
        assert_eq!(
            (&doc["network"], &doc["allocations"]["1"]),
            (&serde_json::json!("net"), &serde_json::json!({"id": "c1", "podref": "ns/p", "ifname": "eth0", "unreserved": true}))
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn entries_record_the_network_that_created_or_adopted_them() {
        let dir = temp_dir("networks");
        fs::create_dir_all(&dir).unwrap();
        let p = pool("p", "192.0.2.0/24");
        // As written before the network was recorded: no creator.
        let old = br#"{"range": "192.0.2.0/24", "allocations": {"7": {"id": "o7", "podref": "ns/q", "ifname": "eth0"}, "8": {"id": "o8", "podref": "ns/r", "ifname": "eth0"}}}"#;
        pool_file::write_path(&dir.join("p.pool"), 1, old).unwrap();
        let (a, b) = (FileStore::new(&dir, "net-a"), FileStore::new(&dir, "net-b"));
        assert!(a.read(&p).unwrap().created_by.is_empty());
        a.commit_alone(&[PoolUpdate { pool: p.clone(), expected: Version("1".into()), changes: vec![Change::Insert(alloc(1, "c1"))] }], soon()).unwrap();
        let adopt = Change::SetContainerId { offset: 8, container_id: "c8".into() };
        b.commit_alone(&[PoolUpdate { pool: p.clone(), expected: Version("2".into()), changes: vec![Change::Insert(alloc(2, "c2")), adopt] }], soon()).unwrap();
        let created_by = |pairs: &[(u128, &str)]| pairs.iter().map(|&(o, n)| (o, Arc::from(n))).collect::<BTreeMap<_, _>>();
        assert_eq!(a.read(&p).unwrap().created_by, created_by(&[(1, "net-a"), (2, "net-b"), (8, "net-b")]));
        b.commit_alone(&[PoolUpdate { pool: p.clone(), expected: Version("3".into()), changes: vec![Change::Remove { offset: 1 }] }], soon()).unwrap();
        let loaded = b.read(&p).unwrap();
        assert_eq!((loaded.entries.len(), loaded.created_by), (3, created_by(&[(2, "net-b"), (8, "net-b")])));
        fs::remove_dir_all(dir).unwrap();
    }

    /// An insert with its reservation, as an ADD with `enable_overlapping_ranges` plans it.
    fn reserving(pool: &PoolId, expected: Version, offset: u128, id: &str) -> PoolUpdate {
        let holder = alloc(offset, id);
        PoolUpdate {
            pool: pool.clone(),
            expected,
            changes: vec![Change::Reserve { name: format!("addr-{offset}"), holder: holder.clone() }, Change::Insert(holder)],
        }
    }

    #[test]
    fn overlapping_pools_of_one_network_name_hold_each_others_reservations() {
        let dir = temp_dir("reserve");
        let store = FileStore::new(&dir, "net");
        let wide = pool("192.0.2.0-24", "192.0.2.0/24");
        let inner = pool("192.0.2.16-28", "192.0.2.16/28");
        let changes = [1, 17, 18, 40].into_iter().flat_map(|o| reserving(&wide, Version::absent(), o, "w").changes).collect();
        store.commit_alone(&[PoolUpdate { pool: wide.clone(), expected: Version::absent(), changes }], soon()).unwrap();
        // An entry made without a reservation (a network with overlapping ranges
        // off) is none: .20, offset 4 of the /28, stays free for it.
        store
            .commit_alone(&[PoolUpdate { pool: wide.clone(), expected: Version("1".into()), changes: vec![Change::Insert(alloc(20, "off"))] }], soon())
            .unwrap();
        // .17 is offset 1 of the /28: refused, and all the /24 holds inside it is
        // reserved for the rest of the cycle.
        let mut tx = store.begin(&[inner.clone(), wide.clone()], Purpose::Update, soon()).unwrap();
        let refused = tx.commit(&[reserving(&inner, Version::absent(), 1, "n")]).unwrap();
        assert_eq!(refused, Outcome::Retry(Retry::Reserved { pool: "192.0.2.16-28".into(), name: "addr-1".into() }));
        assert!(!dir.join("192.0.2.16-28.pool").exists());
        let reserved = |tx: &mut Box<dyn Transaction + '_>| tx.load().unwrap().into_iter().map(|p| p.reserved).collect::<Vec<_>>();
        assert_eq!(reserved(&mut tx), [vec![1, 2], vec![]]);
        assert_eq!(tx.commit(&[reserving(&inner, Version::absent(), 3, "n")]).unwrap(), Outcome::Committed);
        // The other way round, and the commit's own pools count as read.
        let both = [reserving(&wide, Version("2".into()), 19, "m"), reserving(&inner, Version("1".into()), 5, "m")];
        assert!(matches!(tx.commit(&both).unwrap(), Outcome::Retry(Retry::Reserved { .. })));
        assert_eq!(reserved(&mut tx), [vec![1, 2], vec![19]]);
        assert_eq!(tx.commit(&[reserving(&inner, Version("1".into()), 4, "m")]).unwrap(), Outcome::Committed, "unreserved .20");
        drop(tx);
        // Without a reservation (option off), another network_name, or a range
        // that does not overlap, nothing is in the way.
        store
            .commit_alone(&[PoolUpdate { pool: inner.clone(), expected: Version("2".into()), changes: vec![Change::Insert(alloc(2, "off"))] }], soon())
            .unwrap();
        store.commit_alone(&[reserving(&pool("blue-192.0.2.16-28", "192.0.2.16/28"), Version::absent(), 1, "b")], soon()).unwrap();
        store.commit_alone(&[reserving(&pool("198.51.100.0-24", "198.51.100.0/24"), Version::absent(), 1, "o")], soon()).unwrap();
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn of_two_commits_racing_for_one_address_in_overlapping_pools_one_wins() {
        for round in 0..20 {
            let dir = temp_dir(&format!("race-{round}"));
            fs::create_dir_all(&dir).unwrap();
            let barrier = Arc::new(std::sync::Barrier::new(2));
            let racers: Vec<_> = [("192.0.2.0-24", "192.0.2.0/24"), ("192.0.2.0-28", "192.0.2.0/28")]
                .into_iter()
                .map(|(name, cidr)| {
                    let (dir, barrier) = (dir.clone(), Arc::clone(&barrier));
                    std::thread::spawn(move || {
                        let store = FileStore::new(&dir, "net");
                        barrier.wait();
                        store.commit_alone(&[reserving(&pool(name, cidr), Version::absent(), 1, name)], soon())
                    })
                })
                .collect();
            let outcomes: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
            assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 1, "round {round}: {outcomes:?}");
            assert!(outcomes.iter().any(|o| matches!(o, Err(Refused::Retry(Retry::Reserved { .. })))));
            fs::remove_dir_all(dir).unwrap();
        }
    }

    #[test]
    fn stale_versions_conflict_and_change_nothing() {
        let dir = temp_dir("conflict");
        let store = FileStore::new(&dir, "net");
        let a = pool("a", "192.0.2.0/24");
        let b = pool("b", "198.51.100.0/24");
        store.commit_alone(&[PoolUpdate { pool: b.clone(), expected: Version::absent(), changes: vec![Change::Insert(alloc(5, "x"))] }], soon()).unwrap();
        let before_b = fs::read(dir.join("b.pool")).unwrap();
        // `b` moved (it exists now): a two-pool commit planned against the old state fails whole.
        let updates = [
            PoolUpdate { pool: a.clone(), expected: Version::absent(), changes: vec![Change::Insert(alloc(1, "c1"))] },
            PoolUpdate { pool: b.clone(), expected: Version::absent(), changes: vec![Change::Insert(alloc(1, "c1"))] },
        ];
        assert!(matches!(store.commit_alone(&updates, soon()), Err(Refused::Retry(Retry::Conflict { .. }))));
        assert!(!dir.join("a.pool").exists());
        assert_eq!(fs::read(dir.join("b.pool")).unwrap(), before_b);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_commit_under_the_lock_uses_what_load_read_and_only_while_locked() {
        let dir = temp_dir("remembered");
        let store = FileStore::new(&dir, "net");
        let p = pool("p", "192.0.2.0/24");
        store.commit_alone(&[PoolUpdate { pool: p.clone(), expected: Version::absent(), changes: vec![Change::Insert(alloc(1, "a"))] }], soon()).unwrap();
        // Under the lock: load, then commit against that read.
        let mut tx = store.begin(std::slice::from_ref(&p), Purpose::Update, soon()).unwrap();
        let v1 = tx.load().unwrap().remove(0).version;
        assert_eq!(tx.commit(&[PoolUpdate { pool: p.clone(), expected: v1, changes: vec![Change::Insert(alloc(2, "b"))] }]).unwrap(), Outcome::Committed);
        assert_eq!(store.read(&p).unwrap().entries, vec![alloc(1, "a"), alloc(2, "b")]);
        // The commit let the lock go: what its load read must not stand in for
        // the pool's state later, when another writer moved it in between.
        let v2 = tx.load().unwrap().remove(0).version;
        assert_eq!(tx.commit(&[]).unwrap(), Outcome::Committed);
        let other = FileStore::new(&dir, "net");
        other.commit_alone(&[PoolUpdate { pool: p.clone(), expected: v2.clone(), changes: vec![Change::Insert(alloc(3, "c"))] }], soon()).unwrap();
        let stale = PoolUpdate { pool: p.clone(), expected: v2, changes: vec![Change::Insert(alloc(4, "d"))] };
        assert!(matches!(tx.commit(&[stale]).unwrap(), Outcome::Retry(Retry::Conflict { .. })));
        assert_eq!(store.read(&p).unwrap().entries, vec![alloc(1, "a"), alloc(2, "b"), alloc(3, "c")]);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn malformed_pool_documents_and_foreign_ranges_are_corrupt() {
        let p = pool("p", "2001:db8::/64");
        let path = Path::new("/x/p.pool");
        assert_eq!(decode_as(path, br#"{"range": "2001:db8::/64"}"#, &p).unwrap(), Pool::default());
        for bad in [&br#"{"range": "2001:db8::/64", "allocations": []}"#[..], b"{", br#"{"range": "192.0.2.0/24"}"#] {
            assert!(matches!(decode_as(path, bad, &p), Err(DatastoreError::Corrupt { .. })), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn changes_apply_in_order() {
        let dir = temp_dir("changes");
        let store = FileStore::new(&dir, "net");
        let p = pool("p", "192.0.2.0/24");
        store
            .commit_alone(
                &[PoolUpdate { pool: p.clone(), expected: Version::absent(), changes: vec![Change::Insert(alloc(1, "a")), Change::Insert(alloc(2, "b"))] }],
                soon(),
            )
            .unwrap();
        let v = store.read(&p).unwrap().version;
        let changes = vec![Change::Remove { offset: 1 }, Change::SetContainerId { offset: 2, container_id: "b2".into() }];
        store.commit_alone(&[PoolUpdate { pool: p.clone(), expected: v, changes }], soon()).unwrap();
        assert_eq!(store.read(&p).unwrap().entries, vec![alloc(2, "b2")]);
        let bad = PoolUpdate { pool: p.clone(), expected: store.read(&p).unwrap().version, changes: vec![Change::Insert(alloc(2, "dup"))] };
        assert!(matches!(store.commit_alone(&[bad], soon()), Err(Refused::Failed(DatastoreError::Inconsistent { .. }))));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_held_lock_times_out() {
        let dir = temp_dir("lock");
        let store = FileStore::new(&dir, "net");
        store.ensure_dir().unwrap();
        let held = store.lock("p", soon()).unwrap();
        let update = PoolUpdate { pool: pool("p", "192.0.2.0/24"), expected: Version::absent(), changes: vec![Change::Insert(alloc(1, "a"))] };
        let err = store.commit_alone(&[update], Instant::now() + Duration::from_millis(30)).unwrap_err();
        assert!(matches!(err, Refused::Failed(DatastoreError::Timeout { .. })), "{err:?}");
        drop(held);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn commit_under_its_own_update_lock_does_not_wait_for_itself() {
        let dir = temp_dir("ownlock");
        let store = FileStore::new(&dir, "net");
        let p = pool("p", "192.0.2.0/24");
        store.commit_alone(&[PoolUpdate { pool: p.clone(), expected: Version::absent(), changes: vec![Change::Insert(alloc(1, "a"))] }], soon()).unwrap();
        let mut tx = store.begin(std::slice::from_ref(&p), Purpose::Update, Instant::now() + Duration::from_millis(500)).unwrap();
        let version = tx.load().unwrap().remove(0).version;
        let update = PoolUpdate { pool: p.clone(), expected: version, changes: vec![Change::Insert(alloc(2, "b"))] };
        assert_eq!(tx.commit(&[update]).expect("no self-deadlock"), Outcome::Committed);
        assert_eq!(store.read(&p).unwrap().entries.len(), 2);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_second_writer_queues_behind_the_first_ones_load_and_then_proceeds() {
        let dir = temp_dir("queue");
        let first = FileStore::new(&dir, "net");
        let p = pool("p", "192.0.2.0/24");
        first.commit_alone(&[PoolUpdate { pool: p.clone(), expected: Version::absent(), changes: vec![Change::Insert(alloc(1, "a"))] }], soon()).unwrap();
        let mut holding = first.begin(std::slice::from_ref(&p), Purpose::Update, soon()).unwrap();
        holding.load().unwrap();
        let (dir2, p2) = (dir.clone(), p.clone());
        let second = std::thread::spawn(move || {
            let store = FileStore::new(&dir2, "net");
            store.begin(std::slice::from_ref(&p2), Purpose::Update, Instant::now() + Duration::from_secs(5)).unwrap().load().unwrap();
            Instant::now()
        });
        std::thread::sleep(Duration::from_millis(100));
        let released = Instant::now();
        drop(holding);
        let locked = second.join().unwrap();
        assert!(locked >= released, "the second writer must wait for the first");
        // A reader does not queue; a writer that cannot get the lock in time
        // reports a timeout, not a hang.
        let mut holding = first.begin(std::slice::from_ref(&p), Purpose::Update, soon()).unwrap();
        holding.load().unwrap();
        let other = FileStore::new(&dir, "net");
        assert_eq!(other.read(&p).unwrap().entries.len(), 1);
        let late = other.begin(std::slice::from_ref(&p), Purpose::Update, Instant::now() + Duration::from_millis(30)).unwrap().load();
        assert!(matches!(late, Err(DatastoreError::Timeout { .. })), "{late:?}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_file_as_data_dir_is_reported() {
        let dir = temp_dir("notdir");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("f"), b"x").unwrap();
        let store = FileStore::new(dir.join("f"), "net");
        assert!(matches!(store.read(&pool("p", "192.0.2.0/24")), Err(DatastoreError::NotADirectory { .. })));
        let nested = FileStore::new(dir.join("f/sub"), "net");
        assert!(matches!(nested.read(&pool("p", "192.0.2.0/24")), Err(DatastoreError::NotADirectory { .. })));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn corrupt_pool_files_are_errors_not_empty_pools() {
        let dir = temp_dir("corrupt");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("p.pool"), b"{\"range\":").unwrap();
        let store = FileStore::new(&dir, "net");
        assert!(matches!(store.read(&pool("p", "192.0.2.0/24")), Err(DatastoreError::Corrupt { .. })));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn commits_overwrite_the_spare_slot_in_place_until_the_pool_outgrows_it() {
        use std::os::unix::fs::MetadataExt;
        let dir = temp_dir("slots");
        let store = FileStore::new(&dir, "net");
        let p = pool("p", "192.0.2.0/24");
        let path = dir.join("p.pool");
        store.commit_alone(&[PoolUpdate { pool: p.clone(), expected: Version::absent(), changes: vec![Change::Insert(alloc(1, "a"))] }], soon()).unwrap();
        let first = fs::metadata(&path).unwrap();
        for n in 2..5u128 {
            let expected = store.read(&p).unwrap().version;
            store.commit_alone(&[PoolUpdate { pool: p.clone(), expected, changes: vec![Change::Insert(alloc(n, "b"))] }], soon()).unwrap();
            let now = fs::metadata(&path).unwrap();
            assert_eq!((now.ino(), now.len()), (first.ino(), first.len()), "an in-place slot write");
        }
        assert_eq!(store.read(&p).unwrap().version, Version("4".into()));
        // ~60 bytes per entry: 200 entries outgrow a 4 KiB slot.
        let expected = store.read(&p).unwrap().version;
        let many = (10..210u128).map(|n| Change::Insert(alloc(n, "c"))).collect();
        store.commit_alone(&[PoolUpdate { pool: p.clone(), expected, changes: many }], soon()).unwrap();
        let grown = fs::metadata(&path).unwrap();
        assert!(grown.len() > first.len() && grown.ino() != first.ino(), "rebuilt larger");
        let loaded = store.read(&p).unwrap();
        assert_eq!((loaded.version, loaded.entries.len()), (Version("5".into()), 204));
        assert!(!store.temp_path("p").exists());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_torn_slot_reads_as_the_previous_version() {
        use std::os::unix::fs::FileExt;
        let dir = temp_dir("tornslot");
        let store = FileStore::new(&dir, "net");
        let p = pool("p", "192.0.2.0/24");
        store.commit_alone(&[PoolUpdate { pool: p.clone(), expected: Version::absent(), changes: vec![Change::Insert(alloc(1, "a"))] }], soon()).unwrap();
        store.commit_alone(&[PoolUpdate { pool: p.clone(), expected: Version("1".into()), changes: vec![Change::Insert(alloc(2, "b"))] }], soon()).unwrap();
        // Version 2 went to slot 1; damage one byte of its payload.
        let file = OpenOptions::new().write(true).open(dir.join("p.pool")).unwrap();
        file.write_all_at(b"#", 4096 + pool_file::HEADER_LEN as u64 + 5).unwrap();
        let loaded = store.read(&p).unwrap();
        assert_eq!((loaded.version, loaded.entries), (Version("1".into()), vec![alloc(1, "a")]));
        // The next commit builds on version 1 and overwrites the torn slot.
        store.commit_alone(&[PoolUpdate { pool: p.clone(), expected: Version("1".into()), changes: vec![Change::Insert(alloc(3, "c"))] }], soon()).unwrap();
        assert_eq!(store.read(&p).unwrap().entries, vec![alloc(1, "a"), alloc(3, "c")]);
        // Both slots damaged: an error, never an empty pool.
        file.write_all_at(b"#", pool_file::HEADER_LEN as u64 + 5).unwrap();
        file.write_all_at(b"#", 4096 + pool_file::HEADER_LEN as u64 + 5).unwrap();
        assert!(matches!(store.read(&p), Err(DatastoreError::Corrupt { .. })));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_intact_slot_with_a_foreign_range_is_corrupt() {
        let dir = temp_dir("foreign");
        fs::create_dir_all(&dir).unwrap();
        pool_file::write_path(&dir.join("p.pool"), 3, br#"{"range": "198.51.100.0/24", "allocations": {}}"#).unwrap();
        let store = FileStore::new(&dir, "net");
        assert!(matches!(store.read(&pool("p", "192.0.2.0/24")), Err(DatastoreError::Corrupt { .. })));
        assert_eq!(store.read(&pool("p", "198.51.100.0/24")).unwrap().version, Version("3".into()));
        fs::remove_dir_all(dir).unwrap();
    }
}
