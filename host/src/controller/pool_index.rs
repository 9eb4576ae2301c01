//! Which IPPools hold entries of each pod, so that a delete pass reads those
//! pools by name instead of paging through every pool of the namespace (at
//! 60 000 pods in 5 000 node pools: 15 s a pass, the whole of a 4.5 s p99
//! delete-to-free).
//!
//! Two sources keep it:
//! - every full read of the pools replaces it with what that read saw
//!   (tests, `--once`, and a controller whose pool watch is not running);
//! - the controller's watch of IPPools ([`spawn_pool_watch`]) updates it
//!   pool by pool as the plugins write. While the watch is in step (its list
//!   done), a pod the index does not know held no entry when its delete event
//!   came, and its delete pass reads no pool. Without the watch, the index is
//!   as old as the last full read: a pod it does not know may have an entry
//!   made since, so every pool is read.
//!
//! Pods are keyed by a 64-bit hash: two pods sharing one only make a pass
//! read a pool more. An entry committed after its pod's delete event reached
//! the controller (an ADD racing the delete) is left to the next full pass,
//! as before.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use kube::api::{Api as KubeApi, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;

use crate::datastore::kubernetes::crd;

/// Where a pod's entries lay, by pool, with how it is kept (shared between
/// the store that reads it and the watch that feeds it).
#[derive(Clone, Default)]
pub struct PoolIndex(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    /// Pod keys of each pool's entries.
    pools: HashMap<Arc<str>, Vec<u64>>,
    /// Pools of each pod key (a pod is in a handful of pools at most).
    by_pod: HashMap<u64, Vec<Arc<str>>>,
    /// Whether a full read has filled it (until then it answers nothing).
    filled: bool,
    /// Whether a pool watch feeds it, and whether that watch is in step.
    watch: Watch,
    /// What a restarting watch lists, swapped in when its list is done.
    relisting: Option<Vec<(Arc<str>, Vec<u64>)>>,
}

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum Watch {
    #[default]
    None,
    Listing,
    InStep,
}

fn pod_key(pod_ref: &str) -> u64 {
    crate::datastore::pool_note::fnv1a(pod_ref.as_bytes())
}

fn pod_keys<'a>(pod_refs: impl IntoIterator<Item = &'a str>) -> Vec<u64> {
    let mut keys: Vec<u64> = pod_refs.into_iter().map(pod_key).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

impl State {
    fn set_pool(&mut self, pool: Arc<str>, keys: Vec<u64>) {
        self.remove_pool(&pool);
        for key in &keys {
            self.by_pod.entry(*key).or_default().push(pool.clone());
        }
        if !keys.is_empty() {
            self.pools.insert(pool, keys);
        }
    }

    fn remove_pool(&mut self, pool: &str) {
        let Some(old) = self.pools.remove(pool) else { return };
        for key in old {
            if let Some(pools) = self.by_pod.get_mut(&key) {
                pools.retain(|p| &**p != pool);
                if pools.is_empty() {
                    self.by_pod.remove(&key);
                }
            }
        }
    }

    fn replace_all(&mut self, pools: Vec<(Arc<str>, Vec<u64>)>) {
        self.pools.clear();
        self.by_pod.clear();
        for (pool, keys) in pools {
            self.set_pool(pool, keys);
        }
        self.filled = true;
    }
}

/// A full read's view of the pools, handed to [`PoolIndex::replace`] at its end.
#[derive(Default)]
pub struct Snapshot(Vec<(Arc<str>, Vec<u64>)>);

impl Snapshot {
    pub fn add<'a>(&mut self, pool: &str, pod_refs: impl IntoIterator<Item = &'a str>) {
        self.0.push((pool.into(), pod_keys(pod_refs)));
    }
}

impl PoolIndex {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding it cannot leave it half-updated in a way
        // that frees anything: the index only chooses what a pass reads.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What a full read saw. Ignored while a watch feeds the index: the read
    /// took seconds, and the watch has seen every write since.
    pub fn replace(&self, snapshot: Snapshot) {
        let mut state = self.state();
        if state.watch == Watch::None {
            state.replace_all(snapshot.0);
        }
    }

    /// The pools a delete pass of `pods` reads; `None` when every pool must
    /// be read (nothing known yet, or a pod unknown to an index as old as
    /// the last full read).
    pub fn pools_of(&self, pods: &BTreeSet<String>) -> Option<BTreeSet<Arc<str>>> {
        let state = self.state();
        if !state.filled {
            return None;
        }
        let mut names = BTreeSet::new();
        for pod in pods {
            match state.by_pod.get(&pod_key(pod)) {
                Some(pools) => names.extend(pools.iter().cloned()),
                None if state.watch == Watch::InStep => {}
                None => return None,
            }
        }
        Some(names)
    }

    /// A watch event: a pool written (`Some` its entries' pods) or deleted.
    fn watched(&self, pool: &str, pods: Option<Vec<u64>>) {
        let mut state = self.state();
        match &mut state.relisting {
            Some(listed) => listed.push((pool.into(), pods.unwrap_or_default())),
            None => match pods {
                Some(keys) => state.set_pool(pool.into(), keys),
                None => state.remove_pool(pool),
            },
        }
    }

    /// The watch starts (or restarts) its list: until it is done, the index
    /// keeps what it had and answers as if no watch fed it.
    fn listing(&self) {
        let mut state = self.state();
        state.watch = Watch::Listing;
        state.relisting = Some(Vec::new());
    }

    /// The watch's list is done: what it listed is the index.
    fn in_step(&self) {
        let mut state = self.state();
        let listed = state.relisting.take().unwrap_or_default();
        state.replace_all(listed);
        state.watch = Watch::InStep;
    }
}

/// The pods an IPPool object's entries name (none when it is no pool a
/// plugin wrote: the pass that reads it says so).
fn pods_of(object: &Value) -> Vec<u64> {
    match crd::parse_pool(object) {
        Ok(pool) => pod_keys(pool.entries.iter().map(|e| e.pod_ref.as_str())),
        Err(_) => Vec::new(),
    }
}

/// Feeds `index` from a watch of the namespace's IPPools. Each event costs
/// the apiserver one more encoding of the pool it wrote anyway.
pub fn spawn_pool_watch(client: &kube::Client, namespace: &str, index: PoolIndex) {
    let pools: KubeApi<DynamicObject> = KubeApi::namespaced_with(client.clone(), namespace, &super::slice_pass::IPPOOL_RESOURCE.api_resource());
    tokio::spawn(watcher(pools, watcher::Config::default()).default_backoff().for_each(move |event| {
        apply(&index, event);
        std::future::ready(())
    }));
}

fn apply(index: &PoolIndex, event: Result<watcher::Event<DynamicObject>, watcher::Error>) {
    let name_and_pods = |object: &DynamicObject| {
        let name = object.metadata.name.clone().unwrap_or_default();
        let pods = serde_json::to_value(object).map(|v| pods_of(&v)).unwrap_or_default();
        (name, pods)
    };
    match event {
        Ok(watcher::Event::Init) => index.listing(),
        Ok(watcher::Event::InitApply(object) | watcher::Event::Apply(object)) => {
            let (name, pods) = name_and_pods(&object);
            index.watched(&name, Some(pods));
        }
        Ok(watcher::Event::Delete(object)) => index.watched(&object.metadata.name.clone().unwrap_or_default(), None),
        Ok(watcher::Event::InitDone) => index.in_step(),
        // The watcher backs off and watches on from the last version it saw
        // (nothing is lost, only late), or lists again (an `Init` follows).
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn names(set: Option<BTreeSet<Arc<str>>>) -> Option<Vec<String>> {
        set.map(|s| s.into_iter().map(|n| n.to_string()).collect())
    }

    fn snapshot(pools: &[(&str, &[&str])]) -> Snapshot {
        let mut s = Snapshot::default();
        for (pool, refs) in pools {
            s.add(pool, refs.iter().copied());
        }
        s
    }

    #[test]
    fn a_snapshot_index_reads_every_pool_for_a_pod_it_does_not_know() {
        let index = PoolIndex::default();
        assert_eq!(names(index.pools_of(&pods(&["ns/a"]))), None);
        index.replace(snapshot(&[("p1", &["ns/a", "ns/b"]), ("p2", &["ns/b"])]));
        assert_eq!(names(index.pools_of(&pods(&["ns/b"]))), Some(vec!["p1".into(), "p2".into()]));
        assert_eq!(names(index.pools_of(&pods(&["ns/a", "ns/new"]))), None);
    }

    #[test]
    fn a_watch_in_step_knows_new_pods_and_reads_no_pool_for_pods_without_entries() {
        let index = PoolIndex::default();
        index.listing();
        index.watched("p1", Some(pod_keys(["ns/a"])));
        assert_eq!(names(index.pools_of(&pods(&["ns/a"]))), None, "not in step before the list is done");
        index.in_step();
        index.watched("p2", Some(pod_keys(["ns/new"])));
        index.watched("p1", Some(pod_keys(["ns/b"])));
        assert_eq!(names(index.pools_of(&pods(&["ns/new", "ns/a"]))), Some(vec!["p2".into()]));
        assert_eq!(names(index.pools_of(&pods(&["ns/b"]))), Some(vec!["p1".into()]));
        index.watched("p2", None);
        assert_eq!(names(index.pools_of(&pods(&["ns/new"]))), Some(vec![]));
    }

    #[test]
    fn a_full_read_does_not_overwrite_what_the_watch_saw_since() {
        let index = PoolIndex::default();
        index.listing();
        index.in_step();
        index.watched("p1", Some(pod_keys(["ns/new"])));
        index.replace(snapshot(&[("p1", &["ns/old"])]));
        assert_eq!(names(index.pools_of(&pods(&["ns/new"]))), Some(vec!["p1".into()]));
    }

    #[test]
    fn a_watch_listing_again_answers_as_a_snapshot_until_its_list_is_done() {
        let index = PoolIndex::default();
        index.listing();
        index.watched("p1", Some(pod_keys(["ns/a"])));
        index.in_step();
        apply(&index, Ok(watcher::Event::Init));
        index.watched("p2", Some(pod_keys(["ns/b"])));
        assert_eq!(names(index.pools_of(&pods(&["ns/a"]))), Some(vec!["p1".into()]));
        assert_eq!(names(index.pools_of(&pods(&["ns/unknown"]))), None);
        index.in_step();
        assert_eq!(names(index.pools_of(&pods(&["ns/a", "ns/b"]))), Some(vec!["p2".into()]));
    }
}
