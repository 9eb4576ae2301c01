//! The Kubernetes datastore as the reconciler sees it: every `IPPool` and
//! `OverlappingRangeIPReservation` of the namespace (node-slice pools are
//! IPPools too), read page by page; and the two guarded writes that free
//! them, the plugin's own:
//! - a JSON patch per pool that tests each entry's `id` as read before it
//!   removes it (`patch::update`), so an entry an ADD took over since is left;
//! - a DELETE of a reservation with its UID and `resourceVersion` as
//!   preconditions.
//!
//! A delete pass reads only the pools its pods' entries lay in
//! (`pool_index.rs`), and the reservations labelled with the attachments of
//! the entries it found.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{StreamExt, stream};

use http::Method;
use serde_json::{Value, json};

use super::api::{Api, ApiError, FIELD_MANAGER};
use super::held::{Entry, EntryIndex, Holdings, Reservation};
use super::pods::unix_seconds;
use super::pool_index::{PoolIndex, Snapshot};
use crate::datastore::Change;
use crate::datastore::kubernetes::crd::{self, IPPOOLS, PoolObject, RESERVATIONS};
use crate::datastore::kubernetes::patch;

const JSON_PATCH: &str = "application/json-patch+json";
/// Pools of the first page: a pool may be a large object (1 000 entries,
/// 100 KB).
const POOLS_PAGE: u32 = 4;
/// Entries a page of pools should hold, about: the next page's size follows
/// the pools read so far (4 pools of a 1 000-entry range, 40 node-slice pools
/// of 100), so that 5 000 small node pools are not 1 250 requests.
const ENTRIES_PER_PAGE: u128 = 4_000;
const MAX_POOLS_PAGE: u32 = 500;

/// The size of the next page of pools after `pools` pools holding `entries`.
fn pools_page(pools: u128, entries: u128) -> u32 {
    match pools {
        0 => POOLS_PAGE,
        _ => u32::try_from((ENTRIES_PER_PAGE * pools / entries.max(1)).clamp(u128::from(POOLS_PAGE), u128::from(MAX_POOLS_PAGE))).unwrap_or(MAX_POOLS_PAGE),
    }
}
const RESERVATIONS_PAGE: u32 = 500;
/// Attachment labels in one LIST's selector (16 hex digits each: 1.7 KB of URL).
const LABELS_AT_ONCE: usize = 100;

/// What a guarded write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Done,
    /// The object changed since it was read (or is gone): left for the next pass.
    ChangedMeanwhile,
}

/// Pools read by name at once in a delete pass.
const POOL_GETS_AT_ONCE: usize = 16;

pub struct KubeStore {
    pub api: Api,
    pub namespace: String,
    /// Where each pod's entries lay (`pool_index.rs`).
    pub pool_index: PoolIndex,
}

impl KubeStore {
    pub fn new(api: Api, namespace: String) -> Self {
        KubeStore { api, namespace, pool_index: PoolIndex::default() }
    }

    /// Everything the namespace holds (`only`: of these pods); nothing
    /// where the CRDs are not installed (a cluster on the etcd datastore).
    pub async fn read(&self, only: Option<&BTreeSet<String>>) -> Result<Holdings, ApiError> {
        let named = only.and_then(|pods| self.pool_index.pools_of(pods));
        let read = match named {
            Some(names) => self.read_named(&names, only).await,
            None => self.read_all(only).await,
        };
        match read {
            Err(e) if e.code() == Some(404) => Ok(Holdings::default()),
            read => read,
        }
    }

    /// The pools `names` (one LIST by name each, which the controller's
    /// `list` right allows, [`POOL_GETS_AT_ONCE`] at a time; a pool gone
    /// since holds nothing) and the reservations.
    async fn read_named(&self, names: &BTreeSet<Arc<str>>, only: Option<&BTreeSet<String>>) -> Result<Holdings, ApiError> {
        let gets = names.iter().map(|name| async move { (name, self.api.get::<Value>(&crd::named_list_path(&self.namespace, IPPOOLS, name)).await) });
        let answers: Vec<_> = stream::iter(gets).buffer_unordered(POOL_GETS_AT_ONCE).collect().await;
        let mut held = Holdings::default();
        for (name, answer) in answers {
            let list = answer?;
            let Some(object) = crd::named_item(&list, name) else { continue };
            match crd::parse_pool(object) {
                Ok(pool) => add_pool(&mut held, name, &pool, only),
                Err(e) => held.unreadable_pools.push(format!("IPPool {name}: {e}")),
            }
        }
        self.read_reservations(&mut held, only).await?;
        Ok(held)
    }

    async fn read_all(&self, only: Option<&BTreeSet<String>>) -> Result<Holdings, ApiError> {
        let mut held = Holdings::default();
        let mut failures = Vec::new();
        let mut index = Snapshot::default();
        let seen = std::cell::Cell::new((0u128, 0u128));
        self.api
            .list_sized_pages::<Value>(
                &crd::collection_path(&self.namespace, IPPOOLS),
                || {
                    let (pools, entries) = seen.get();
                    pools_page(pools, entries)
                },
                |object| {
                    let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
                    match crd::parse_pool(&object) {
                        Ok(pool) => {
                            let (pools, entries) = seen.get();
                            seen.set((pools + 1, entries + pool.entries.len() as u128));
                            index.add(&name, pool.entries.iter().map(|e| e.pod_ref.as_str()));
                            add_pool(&mut held, &name, &pool, only)
                        }
                        Err(e) => failures.push(format!("IPPool {name}: {e}")),
                    }
                },
            )
            .await?;
        held.unreadable_pools = failures;
        self.pool_index.replace(index);
        self.read_reservations(&mut held, only).await?;
        Ok(held)
    }

    /// The reservations of the pass: every one of the namespace, or, for a
    /// delete pass (`only` its pods), those of the entries read.
    async fn read_reservations(&self, held: &mut Holdings, only: Option<&BTreeSet<String>>) -> Result<(), ApiError> {
        let every = crd::collection_path(&self.namespace, RESERVATIONS);
        let Some(pods) = only else { return self.read_reservations_at(&every, held, None).await };
        // By their attachment label, instead of paging through every
        // reservation of the namespace (120 000 at 60 000 dual-stack pods)
        // before the first entry is freed. A reservation without its entry
        // is an ADD in flight for an unbacked grace, which a full pass
        // frees. whereabouts labels none: when an entry is left without its
        // reservation, every one is read after all.
        let labels: BTreeSet<String> = held.entries.iter().map(|e| crd::attachment_label(&e.holder.container_id, &e.holder.ifname)).collect();
        let labels: Vec<String> = labels.into_iter().collect();
        for chunk in labels.chunks(LABELS_AT_ONCE) {
            self.read_reservations_at(&crd::labelled_reservations_path(&self.namespace, chunk), held, only).await?;
        }
        let index = EntryIndex::for_reservations(&held.entries, &held.reservations);
        let backed: HashSet<(&str, &str)> = held.reservations.iter().flat_map(|r| index.backed_by(r)).map(|e| (e.pool.as_ref(), e.key.as_str())).collect();
        if backed.len() < held.entries.len() {
            held.reservations.clear();
            self.read_reservations_at(&every, held, Some(pods)).await?;
        }
        Ok(())
    }

    /// The reservations `path` lists (`only`: of these pods), page by page.
    async fn read_reservations_at(&self, path: &str, held: &mut Holdings, only: Option<&BTreeSet<String>>) -> Result<(), ApiError> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        self.api
            .list_pages::<Value>(path, RESERVATIONS_PAGE, |object| {
                let r = crd::parse_reservation(&object);
                if only.is_some_and(|o| !o.contains(&r.podref)) {
                    return;
                }
                let created = object.pointer("/metadata/creationTimestamp").and_then(Value::as_str).and_then(unix_seconds);
                held.reservations.push(Reservation {
                    name: r.name,
                    podref: r.podref,
                    containerid: r.containerid,
                    ifname: r.ifname,
                    claim: r.claim,
                    uid: r.uid,
                    version: r.resource_version,
                    age: created.map(|c| Duration::from_secs(now.saturating_sub(c).max(0) as u64)),
                    unbacked_for: None,
                })
            })
            .await?;
        Ok(())
    }

    /// Removes `entries` (all of one pool) in one patch; when an entry changed
    /// since the read, the patch fails as a whole and each entry is tried on
    /// its own. Answers, per entry, what happened.
    pub async fn remove_entries(&self, pool: &str, entries: &[&Entry]) -> Result<Vec<Written>, ApiError> {
        match self.patch_out(pool, entries).await? {
            Written::Done => Ok(vec![Written::Done; entries.len()]),
            Written::ChangedMeanwhile if entries.len() == 1 => Ok(vec![Written::ChangedMeanwhile]),
            Written::ChangedMeanwhile => {
                let mut out = Vec::with_capacity(entries.len());
                for e in entries {
                    out.push(self.patch_out(pool, &[e]).await?);
                }
                Ok(out)
            }
        }
    }

    async fn patch_out(&self, pool: &str, entries: &[&Entry]) -> Result<Written, ApiError> {
        let object = PoolObject {
            entries: entries.iter().map(|e| e.holder.clone()).collect(),
            keys: entries.iter().map(|e| (e.holder.offset, e.key.clone())).collect(),
            ids: entries.iter().map(|e| (e.holder.offset, e.id.clone())).collect(),
            has_allocations: true,
            ..PoolObject::default()
        };
        let changes: Vec<Change> = entries.iter().map(|e| Change::Remove { offset: e.holder.offset }).collect();
        let ops = patch::update(&object, &changes, false).map_err(|detail| ApiError::Transport { method: Method::PATCH, path: pool.into(), detail })?;
        let path = format!("{}?fieldManager={FIELD_MANAGER}", crd::object_path(&self.namespace, IPPOOLS, pool));
        guarded(self.api.send(Method::PATCH, &path, Some((JSON_PATCH, &ops))).await)
    }

    pub async fn delete_reservation(&self, r: &Reservation) -> Result<Written, ApiError> {
        let body = json!({
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"uid": r.uid, "resourceVersion": r.version},
        });
        let path = crd::object_path(&self.namespace, RESERVATIONS, &r.name);
        guarded(self.api.send(Method::DELETE, &path, Some(("application/json", &body))).await)
    }
}

/// 404 (gone), 409 (a precondition) and 422 (a failed test): someone wrote first.
fn guarded(answer: Result<Value, ApiError>) -> Result<Written, ApiError> {
    match answer {
        Ok(_) => Ok(Written::Done),
        Err(e) if matches!(e.code(), Some(404 | 409 | 422)) => Ok(Written::ChangedMeanwhile),
        Err(e) => Err(e),
    }
}

fn add_pool(held: &mut Holdings, name: &str, pool: &PoolObject, only: Option<&BTreeSet<String>>) {
    let range = pool.range.clone().unwrap_or_default();
    let entries = pool.entries.iter().map(|a| {
        let key = pool.keys.get(&a.offset).cloned().unwrap_or_else(|| a.offset.to_string());
        (a, key, pool.ids.get(&a.offset).cloned().unwrap_or(Value::Null))
    });
    held.add_pool(name, &range, &pool.resource_version, pool.unparsable.clone(), entries, only);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_page_of_pools_holds_about_four_thousand_entries() {
        assert_eq!(super::pools_page(0, 0), 4, "the first page, before any pool was seen");
        assert_eq!(super::pools_page(4, 4_000), 4);
        assert_eq!(super::pools_page(44, 4_400), 40, "node-slice pools of 100 entries");
        assert_eq!(super::pools_page(10, 0), 500, "empty pools: the largest page");
        assert_eq!(super::pools_page(4, 400_000), 4, "never fewer than the first page");
    }
}
