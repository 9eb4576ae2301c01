//! The etcd datastore as the reconciler sees it: every pool key and
//! reservation key under the prefix (`datastore/etcd/layout.rs`), read page by
//! page, and the guarded writes that free them:
//! - a pool is read again at write time, the entries to free removed only
//!   where they still hold what the pass read (container ID, pod,
//!   interface), and written back in a transaction that requires the pool's
//!   `mod_revision` to be the one just read: the same per-entry
//!   compare-and-swap as the Kubernetes patch's `id` test;
//! - a reservation is deleted in a transaction that requires its
//!   `mod_revision` as the pass read it.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use serde_json::Value;

use super::held::{Entry, Holdings, Reservation};
use super::kube_store::Written;
use super::store::StoreError;
use crate::datastore::etcd::layout::{Layout, ReservationValue};
use crate::datastore::etcd::{settings, transport};
use crate::datastore::pool_document::{self, Format, PoolDocument};
use thereabouts_allocator::model::{Allocation, DatastoreSettings};

/// Keys per page: a pool may be large, and gRPC answers are bounded (4 MiB).
const POOLS_PAGE: i64 = 4;
const RESERVATIONS_PAGE: i64 = 1000;
/// Attempts at a pool write that other writers keep beating.
const WRITE_ATTEMPTS: usize = 5;

pub struct EtcdStore {
    client: Client,
    layout: Layout,
    pub endpoints: String,
}

impl EtcdStore {
    pub async fn connect(d: &DatastoreSettings) -> Result<EtcdStore, StoreError> {
        let s = settings::read(d).map_err(|detail| StoreError::Etcd { endpoints: d.etcd_hosts.join(","), detail })?;
        let endpoints = s.endpoints_text();
        let client = Client::connect(s.endpoints.clone(), Some(transport::connect_options(&s)))
            .await
            .map_err(|e| StoreError::Etcd { endpoints: endpoints.clone(), detail: crate::datastore::etcd::failure::error_text(&e) })?;
        Ok(EtcdStore { client, layout: Layout::new(d.etcd_prefix.as_deref()), endpoints })
    }

    fn failed(&self, action: &str, e: etcd_client::Error) -> StoreError {
        StoreError::Etcd { endpoints: self.endpoints.clone(), detail: format!("{action}: {}", crate::datastore::etcd::failure::error_text(&e)) }
    }

    /// Every key under `prefix`, `page` at a time, each handed to `each`.
    async fn scan(&self, prefix: &str, page: i64, mut each: impl FnMut(&str, &[u8], i64)) -> Result<(), StoreError> {
        let end = prefix_end(prefix);
        let mut from = prefix.to_string();
        loop {
            let options = GetOptions::new().with_range(end.clone()).with_limit(page);
            let answer = self.client.clone().get(from.as_bytes(), Some(options)).await.map_err(|e| self.failed(&format!("reading {prefix}"), e))?;
            for kv in answer.kvs() {
                each(&String::from_utf8_lossy(kv.key()), kv.value(), kv.mod_revision());
            }
            match answer.kvs().last() {
                Some(last) if answer.more() => from = format!("{}\0", String::from_utf8_lossy(last.key())),
                _ => return Ok(()),
            }
        }
    }

    pub async fn read(&self, only: Option<&BTreeSet<String>>) -> Result<Holdings, StoreError> {
        let mut held = Holdings::default();
        let pools = format!("{}pools/", self.layout.prefix());
        let mut failures = Vec::new();
        self.scan(&pools, POOLS_PAGE, |key, value, revision| {
            let name = key.strip_prefix(&pools).unwrap_or(key).to_string();
            match PoolDocument::decode(value) {
                Ok(doc) => add_pool(&mut held, &name, &doc, revision, only),
                Err(e) => failures.push(format!("pool key {key}: {e}")),
            }
        })
        .await?;
        held.unreadable_pools = failures;
        let reservations = format!("{}reservations/", self.layout.prefix());
        self.scan(&reservations, RESERVATIONS_PAGE, |key, value, revision| {
            let name = key.strip_prefix(&reservations).unwrap_or(key).to_string();
            let Ok(r) = ReservationValue::decode(value) else { return };
            if only.is_some_and(|o| !o.contains(&r.podref)) {
                return;
            }
            held.reservations.push(Reservation {
                name,
                claim: r.claim(),
                podref: r.podref,
                containerid: r.containerid,
                ifname: r.ifname,
                uid: String::new(),
                version: revision.to_string(),
                // etcd keeps no creation time: a reservation without its
                // entry is freed only once its pod is gone or completed.
                age: None,
                unbacked_for: None,
            })
        })
        .await?;
        Ok(held)
    }

    pub async fn remove_entries(&self, pool: &str, entries: &[&Entry]) -> Result<Vec<Written>, StoreError> {
        let key = self.layout.pool_key(pool);
        for _ in 0..WRITE_ATTEMPTS {
            let answer = self.client.clone().get(key.as_bytes(), None).await.map_err(|e| self.failed(&format!("reading {key}"), e))?;
            let Some(kv) = answer.kvs().first() else { return Ok(vec![Written::ChangedMeanwhile; entries.len()]) };
            let revision = kv.mod_revision();
            let doc = PoolDocument::decode(kv.value())
                .map_err(|detail| StoreError::Etcd { endpoints: self.endpoints.clone(), detail: format!("{key}: {detail}") })?;
            let mut kept: BTreeMap<u128, Allocation> = doc.entries.iter().map(|a| (a.offset, a.clone())).collect();
            let outcome: Vec<Written> = entries
                .iter()
                .map(|e| match kept.get(&e.holder.offset) {
                    Some(now) if *now == e.holder => {
                        kept.remove(&e.holder.offset);
                        Written::Done
                    }
                    _ => Written::ChangedMeanwhile,
                })
                .collect();
            if !outcome.contains(&Written::Done) {
                return Ok(outcome);
            }
            let created_by = doc.created_by.iter().filter(|(o, _)| kept.contains_key(o)).map(|(o, n)| (*o, n.clone())).collect();
            let unreserved = doc.unreserved.iter().filter(|o| kept.contains_key(o)).copied().collect();
            let value = pool_document::encode(&doc.range, &kept, &created_by, &unreserved, Format::Compact);
            let txn = Txn::new().when([Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)]).and_then([TxnOp::put(key.as_str(), value, None)]);
            let written = self.client.clone().txn(txn).await.map_err(|e| self.failed(&format!("writing {key}"), e))?;
            if written.succeeded() {
                return Ok(outcome);
            }
            // Someone wrote the pool in between: read it again.
        }
        Ok(vec![Written::ChangedMeanwhile; entries.len()])
    }

    pub async fn delete_reservation(&self, r: &Reservation) -> Result<Written, StoreError> {
        let key = self.layout.reservation_key(&r.name);
        let revision: i64 = r.version.parse().unwrap_or(0);
        let txn = Txn::new().when([Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)]).and_then([TxnOp::delete(key.as_str(), None)]);
        let answer = self.client.clone().txn(txn).await.map_err(|e| self.failed(&format!("deleting {key}"), e))?;
        Ok(if answer.succeeded() { Written::Done } else { Written::ChangedMeanwhile })
    }
}

/// The end of the key range of every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn add_pool(held: &mut Holdings, name: &str, doc: &PoolDocument, revision: i64, only: Option<&BTreeSet<String>>) {
    // A pool key has no per-entry id: the guard is the key's mod_revision.
    let entries = doc.entries.iter().map(|a| (a, a.offset.to_string(), Value::String(a.container_id.clone())));
    held.add_pool(name, &doc.range, &revision.to_string(), Vec::new(), entries, only);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefix_range_ends_after_its_last_key() {
        assert_eq!(super::prefix_end("/thereabouts/pools/"), b"/thereabouts/pools0".to_vec());
        assert_eq!(super::prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}
