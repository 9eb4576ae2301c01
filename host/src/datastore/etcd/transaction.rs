//! One command's cycle on the etcd datastore: the pool values it read (what
//! a commit changes), the store revision of each read, and the addresses it
//! found reserved by others live here and die with it.

use std::collections::HashMap;
use std::time::Instant;

use super::transport::KeyValue;

use super::EtcdStore;
use super::txn::{self, Reads, Refusal};
use crate::datastore::pool_document::PoolDocument;
use crate::datastore::{DatastoreError, Outcome, Pool, PoolId, PoolUpdate, ReservedOffsets, Retry, Transaction, Version};
use crate::logging;

pub(super) struct EtcdTransaction<'s> {
    store: &'s EtcdStore,
    pools: Vec<PoolId>,
    deadline: Instant,
    /// The last read of each pool, by pool name: the value a commit changes.
    read: HashMap<String, PoolDocument>,
    /// Per pool name: the store revision its last read saw, to tell a
    /// reservation older than the read (an overlapping range) from a racer's.
    read_revisions: HashMap<String, i64>,
    /// Offsets found reserved by others, per pool name.
    reserved: ReservedOffsets,
}

impl<'s> EtcdTransaction<'s> {
    pub(super) fn new(store: &'s EtcdStore, pools: &[PoolId], deadline: Instant) -> Self {
        EtcdTransaction { store, pools: pools.to_vec(), deadline, read: HashMap::new(), read_revisions: HashMap::new(), reserved: ReservedOffsets::default() }
    }

    /// Records a pool key as read at store revision `read_revision` (`kv`
    /// None: absent) and returns the pool.
    fn remember(&mut self, pool: &PoolId, kv: Option<&KeyValue>, read_revision: i64) -> Result<Pool, DatastoreError> {
        self.read_revisions.insert(pool.name.clone(), read_revision);
        let reserved = self.reserved.of(&pool.name);
        let Some(kv) = kv else {
            self.read.remove(&pool.name);
            return Ok(Pool { reserved, ..Pool::default() });
        };
        let value = PoolDocument::decode(&kv.value)
            .map_err(|detail| DatastoreError::Malformed { object: format!("etcd key {}", self.store.layout.pool_key(&pool.name)), detail })?;
        let loaded = Pool { version: Version(kv.mod_revision.to_string()), entries: value.entries.clone(), reserved, ..Pool::default() };
        self.read.insert(pool.name.clone(), value);
        Ok(loaded)
    }
}

impl Transaction for EtcdTransaction<'_> {
    /// One GET of the pool key, or for a multi-range call one read-only
    /// transaction of all its pool keys; the version is the key's
    /// `mod_revision`, absent = empty pool.
    fn load(&mut self) -> Result<Vec<Pool>, DatastoreError> {
        let (read, read_revision) = self.store.read_pools(&self.pools, self.deadline)?;
        let pools = self.pools.clone();
        pools.iter().zip(read).map(|(pool, kv)| self.remember(pool, kv.as_ref(), read_revision)).collect()
    }

    fn commit(&mut self, updates: &[PoolUpdate]) -> Result<Outcome, DatastoreError> {
        let names = txn::reservation_names(updates);
        let reservations = if names.is_empty() { HashMap::new() } else { self.store.read_reservations(&names, self.deadline)? };
        let commit = match txn::build(&self.store.layout, updates, &Reads { pools: &self.read, reservations: &reservations }) {
            Ok(commit) => commit,
            Err(Refusal::HeldElsewhere { pool, name, offset, create_revision }) => {
                logging::debug(format!("address of offset {offset} in pool {pool} is reserved as {name} by another attachment; planning around it"));
                self.reserved.add(&pool, [offset]);
                let read_revision = self.read_revisions.get(&pool).copied().unwrap_or(0);
                return Ok(Outcome::Retry(if create_revision <= read_revision { Retry::Reserved { pool, name } } else { Retry::Conflict { pool } }));
            }
            Err(Refusal::Inconsistent { pool, detail }) => return Err(DatastoreError::Inconsistent { pool, detail }),
        };
        if commit.writes.is_empty() {
            return Ok(Outcome::Committed);
        }
        let written: Vec<&str> = updates.iter().filter(|u| !u.changes.is_empty()).map(|u| u.pool.name.as_str()).collect();
        crate::failpoint::hit(crate::failpoint::ETCD_BEFORE_COMMIT);
        let sent = self.store.send(commit, &written.join(", "), self.deadline);
        crate::failpoint::hit(crate::failpoint::ETCD_AFTER_COMMIT);
        let result = match sent {
            // etcd refuses a value over its request limit: the pool is full for it.
            Err(DatastoreError::Rejected { detail, .. }) if detail.contains("request is too large") => {
                let entries = |u: &PoolUpdate| self.read.get(&u.pool.name).map_or(0, |d| d.entries.len()) + u.inserts();
                let entries = updates.iter().map(entries).max().unwrap_or(0);
                Err(DatastoreError::PoolTooLarge { object: format!("etcd pool key(s) {}", written.join(", ")), entries })
            }
            other => other,
        };
        // Whatever happened, the reads of these pools are stale now.
        for name in &written {
            self.read.remove(*name);
        }
        Ok(if result? { Outcome::Committed } else { Outcome::Retry(Retry::Conflict { pool: written.join(", ") }) })
    }
}
