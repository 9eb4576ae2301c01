//! One node-slice pass: read the NetworkAttachmentDefinitions, the Nodes, the
//! IPPools and the NodeSlicePools; decide each pool's next table
//! (`layout::next`); write the ones that changed, each with its
//! `resourceVersion` (a plugin claiming a slice meanwhile makes the write fail
//! with 409, and the next pass starts from what it did).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use futures_util::StreamExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams, Preconditions};
use kube::discovery::ApiResource;
use serde::Deserialize;
use serde_json::Value;
use thereabouts_allocator::model::{NormalizedConfig, NormalizedRange};
use thereabouts_allocator::slices;

use super::Options;
use super::layout::{self, Desired, SliceUse};
use super::slice_objects::{self, Op};
use crate::component::EngineComponent;
use crate::datastore::kubernetes::slices::{SLICE_OF_LABEL, Shape, SliceObject, SliceTable, label_value};
use crate::logging;

/// A kind the controller reads without compiled-in types.
pub struct Resource {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
}

impl Resource {
    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.into(),
            version: self.version.into(),
            api_version: format!("{}/{}", self.group, self.version),
            kind: self.kind.into(),
            plural: self.plural.into(),
        }
    }
}

pub const NAD_RESOURCE: Resource =
    Resource { group: "k8s.cni.cncf.io", version: "v1", kind: "NetworkAttachmentDefinition", plural: "network-attachment-definitions" };
pub const NODE_SLICE_POOL_RESOURCE: Resource =
    Resource { group: "whereabouts.cni.cncf.io", version: "v1alpha1", kind: "NodeSlicePool", plural: "nodeslicepools" };
pub const IPAM_CLAIM_RESOURCE: Resource = Resource { group: "k8s.cni.cncf.io", version: "v1alpha1", kind: "IPAMClaim", plural: "ipamclaims" };
pub const IPPOOL_RESOURCE: Resource = Resource { group: "whereabouts.cni.cncf.io", version: "v1alpha1", kind: "IPPool", plural: "ippools" };
/// IPPools per page: the pass counts their entries, and a page is held whole
/// while it is decoded (every pool of a large cluster at once was its whole
/// datastore in memory).
const POOLS_PAGE: u32 = 50;
/// Slice object writes of one pass at the apiserver at a time: a large
/// cluster's first pass creates one per node.
const SLICE_OBJECT_WRITES: usize = 16;

/// An IPPool reduced to its name and how many entries it holds.
#[derive(Deserialize)]
struct PoolCount {
    #[serde(default)]
    metadata: PoolName,
    #[serde(default)]
    spec: PoolSpecCount,
}

#[derive(Deserialize, Default)]
struct PoolName {
    #[serde(default)]
    name: String,
}

#[derive(Deserialize, Default)]
struct PoolSpecCount {
    #[serde(default, deserialize_with = "count_members")]
    allocations: u128,
}

/// The members of a JSON object, counted without keeping them.
fn count_members<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u128, D::Error> {
    struct Count;
    impl<'de> serde::de::Visitor<'de> for Count {
        type Value = u128;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_unit<E>(self) -> Result<u128, E> {
            Ok(0)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<u128, A::Error> {
            let mut n = 0;
            while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {
                n += 1;
            }
            Ok(n)
        }
    }
    deserializer.deserialize_any(Count)
}

pub struct SlicePass {
    client: kube::Client,
    api: super::api::Api,
    namespace: String,
    cool_down: Duration,
    /// `--slice-objects`.
    slice_objects: bool,
    engine: EngineComponent,
    /// What the last pass logged: a state that lasts is logged once.
    logged: BTreeSet<String>,
}

/// One sliced range a NAD asks for, with what naming its pools needs.
struct Wanted {
    desired: Desired,
    range: NormalizedRange,
    network_name: String,
}

impl SlicePass {
    /// `engine`: the process's one engine instance (its code is registered
    /// with wasmtime once per process).
    pub fn new(api: super::api::Api, options: &Options, engine: EngineComponent) -> Self {
        SlicePass {
            client: api.client.clone(),
            api,
            namespace: options.namespace.clone(),
            cool_down: options.cool_down,
            slice_objects: options.slice_objects,
            engine,
            logged: BTreeSet::new(),
        }
    }

    pub async fn run(&mut self) -> Result<()> {
        let mut lines = Vec::new();
        let outcome = self.pass(&mut lines).await;
        let now: BTreeSet<String> = lines.into_iter().collect();
        for line in now.difference(&self.logged) {
            logging::verbose(format!("controller: {line}"));
        }
        self.logged = now;
        outcome
    }

    async fn pass(&mut self, log: &mut Vec<String>) -> Result<()> {
        let wanted = self.wanted(log).await?;
        if wanted.is_empty() {
            return Ok(());
        }
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let nodes: BTreeSet<String> =
            nodes.list_metadata(&ListParams::default()).await.context("listing Nodes")?.items.into_iter().filter_map(|n| n.metadata.name).collect();
        let mut entries: BTreeMap<String, u128> = BTreeMap::new();
        let path = crate::datastore::kubernetes::crd::collection_path(&self.namespace, crate::datastore::kubernetes::crd::IPPOOLS);
        self.api
            .list_pages::<PoolCount>(&path, POOLS_PAGE, |p| {
                entries.insert(p.metadata.name, p.spec.allocations);
            })
            .await
            .context("listing IPPools")?;
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.namespace, &NODE_SLICE_POOL_RESOURCE.api_resource());
        let mut current = BTreeMap::new();
        // Slice objects by the label of their layout, then by slice.
        let mut objects: BTreeMap<String, BTreeMap<String, SliceObject>> = BTreeMap::new();
        for object in api.list(&ListParams::default()).await.context("listing NodeSlicePools")?.items {
            let name = object.metadata.name.clone().unwrap_or_default();
            let value = serde_json::to_value(&object)?;
            if let Some(layout) = object.metadata.labels.as_ref().and_then(|l| l.get(SLICE_OF_LABEL)) {
                match SliceObject::from_object(&value) {
                    Ok(o) => {
                        objects.entry(layout.clone()).or_default().insert(o.slice.clone(), o);
                    }
                    Err(e) => logging::error(format!("controller: slice object NodeSlicePool {}/{name} is unreadable ({e}); left alone", self.namespace)),
                }
                continue;
            }
            match SliceTable::from_object(&value) {
                Ok(table) => {
                    current.insert(name, table);
                }
                Err(e) => logging::error(format!("controller: NodeSlicePool {}/{name} is unreadable ({e}); left alone", self.namespace)),
            }
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        for w in &wanted {
            let objects = objects.remove(&label_value(&w.desired.name)).unwrap_or_default();
            let read = current.get(&w.desired.name);
            let table = slice_objects::merged(read, &objects, &w.desired);
            let usage = Usage::of(w, table.as_ref(), &entries);
            let target = slice_objects::target(&w.desired, self.slice_objects);
            let assign = if target == Shape::Objects { layout::Assign::FromHome } else { layout::Assign::InOrder };
            let mut next = layout::next(&w.desired, table.as_ref(), &nodes, &usage, now, self.cool_down.as_secs(), assign);
            for note in &next.notes {
                log.push(format!("NodeSlicePool {}/{}: {note}", self.namespace, w.desired.name));
            }
            let fresh = table.as_ref().is_some_and(|t| !layout::same_layout(t, &w.desired)) && layout::same_layout(&next.table, &w.desired);
            next.table.shape = slice_objects::next_shape(table.as_ref(), fresh, target, !objects.is_empty(), now, self.cool_down.as_secs());
            let ops = match next.table.shape {
                // Leftovers of an earlier move: no call reads them.
                Shape::List => objects.values().map(|o| Op::Delete { object: o.clone() }).collect(),
                _ => slice_objects::ops(&next.table, &objects),
            };
            // A layout says "objects only" once every object it points to exists.
            if next.table.shape == Shape::Objects
                && let Some(before) = table.as_ref().map(|t| t.shape).filter(|s| *s != Shape::Objects)
                && !ops.is_empty()
            {
                next.table.shape = before;
            }
            if next.table.shape != read.map_or(Shape::List, |t| t.shape) {
                log.push(format!("NodeSlicePool {}/{}: slices kept as {:?}", self.namespace, w.desired.name, next.table.shape));
            }
            let rendered = layout::object(&w.desired.name, &self.namespace, &next.table);
            if read.map(|t| layout::object(&w.desired.name, &self.namespace, t)) != Some(rendered.clone()) {
                let object: DynamicObject = serde_json::from_value(rendered)?;
                let written = match read.is_some() {
                    true => api.replace(&w.desired.name, &PostParams::default(), &object).await,
                    false => api.create(&PostParams::default(), &object).await,
                };
                match written {
                    Ok(_) => {}
                    // A plugin claimed a slice, or another replica wrote: the next pass reads again.
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        logging::verbose(format!("controller: NodeSlicePool {} changed meanwhile; next pass", w.desired.name));
                        continue;
                    }
                    Err(e) => return Err(e).with_context(|| format!("writing NodeSlicePool {}/{}", self.namespace, w.desired.name)),
                }
            }
            self.write_slice_objects(&api, w, &next.table, ops).await?;
        }
        Ok(())
    }

    /// The writes to `w`'s slice objects, [`SLICE_OBJECT_WRITES`] at a time,
    /// each guarded (a create by the name, the others by the version read): one
    /// that meets a change (a plugin's claim) waits for the next pass.
    async fn write_slice_objects(&self, api: &Api<DynamicObject>, w: &Wanted, table: &SliceTable, ops: Vec<Op>) -> Result<()> {
        let (layout, namespace, size) = (&w.desired.name, &self.namespace, &table.slice_size);
        let results: Vec<std::result::Result<(), kube::Error>> = futures_util::stream::iter(ops)
            .map(|op| async move {
                match op {
                    Op::Create { slice, node, cooling } => {
                        let object: DynamicObject = serde_json::from_value(SliceObject::object(layout, namespace, size, &slice, &node, cooling.as_ref()))
                            .map_err(kube::Error::SerdeError)?;
                        api.create(&PostParams::default(), &object).await.map(drop)
                    }
                    Op::Replace { object: old, node, cooling } => {
                        let mut value = SliceObject::object(layout, namespace, size, &old.slice, &node, cooling.as_ref());
                        value["metadata"]["resourceVersion"] = serde_json::json!(old.resource_version);
                        let object: DynamicObject = serde_json::from_value(value).map_err(kube::Error::SerdeError)?;
                        api.replace(&old.name, &PostParams::default(), &object).await.map(drop)
                    }
                    Op::Delete { object } => {
                        let guard = DeleteParams {
                            preconditions: Some(Preconditions { resource_version: Some(object.resource_version), uid: None }),
                            ..DeleteParams::default()
                        };
                        api.delete(&object.name, &guard).await.map(drop)
                    }
                }
            })
            .buffer_unordered(SLICE_OBJECT_WRITES)
            .collect()
            .await;
        for result in results {
            match result {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    logging::verbose(format!("controller: a slice object of NodeSlicePool {layout} changed meanwhile; next pass"))
                }
                Err(e) => return Err(e).with_context(|| format!("writing a slice object of NodeSlicePool {namespace}/{layout}")),
            }
        }
        Ok(())
    }

    /// The sliced ranges the NADs ask for, one per NodeSlicePool name. NADs
    /// that share a network name and agree share it; one that disagrees with
    /// an older NAD is ignored and named (whereabouts#558: the NADs fought,
    /// each sync rewriting the layout).
    async fn wanted(&mut self, log: &mut Vec<String>) -> Result<Vec<Wanted>> {
        let nads: Api<DynamicObject> = Api::all_with(self.client.clone(), &NAD_RESOURCE.api_resource());
        let mut nads = match nads.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Vec::new()),
            Err(e) => return Err(e).context("listing NetworkAttachmentDefinitions"),
        };
        nads.sort_by(|a, b| {
            let key = |o: &DynamicObject| (o.metadata.creation_timestamp.clone().map(|t| t.0), o.metadata.namespace.clone(), o.metadata.name.clone());
            key(a).cmp(&key(b))
        });
        let mut wanted: Vec<Wanted> = Vec::new();
        for nad in nads {
            let source = format!("{}/{}", nad.metadata.namespace.clone().unwrap_or_default(), nad.metadata.name.clone().unwrap_or_default());
            let Some(text) = nad.data.pointer("/spec/config").and_then(Value::as_str) else { continue };
            // Another IPAM, or a config the plugin would refuse: not ours to lay out.
            let Ok(Ok(config)) = self.engine.normalize(text, None, "") else { continue };
            for w in self.sliced_ranges(&config, &source)? {
                match wanted.iter().find(|o| o.desired.name == w.desired.name) {
                    None => wanted.push(w),
                    Some(o) if o.desired.range == w.desired.range && o.desired.slice_size == w.desired.slice_size => {}
                    Some(o) => log.push(format!(
                        "{source} asks NodeSlicePool {} for {} in slices of {}, but {} (older) lays it out as {} in slices of {}; {source}'s is ignored",
                        w.desired.name, w.desired.range, w.desired.slice_size, o.desired.source, o.desired.range, o.desired.slice_size
                    )),
                }
            }
        }
        Ok(wanted)
    }

    fn sliced_ranges(&mut self, config: &NormalizedConfig, source: &str) -> Result<Vec<Wanted>> {
        let mut out = Vec::new();
        for range in &config.ranges {
            let Some(slicing) = &range.node_slicing else { continue };
            let layout = self.engine.node_slices(range)?.map_err(|e| anyhow::anyhow!("{source}: {}", e.message))?;
            out.push(Wanted {
                desired: Desired {
                    name: slicing.slice_pool.clone(),
                    range: range.cidr.clone(),
                    slice_size: format!("/{}", slicing.prefix_len),
                    layout,
                    source: source.to_string(),
                },
                range: range.clone(),
                network_name: config.network_name.clone(),
            });
        }
        Ok(out)
    }
}

/// What the IPPools say about a pool's slices. Computed with the engine
/// crate's pure functions natively (the code the component runs): a slice's
/// per-node pool name and capacity, for every slice of every pool, each pass.
struct Usage {
    /// (node, slice) → entries.
    entries: BTreeMap<(String, String), u128>,
    capacity: BTreeMap<String, u128>,
}

impl Usage {
    fn of(w: &Wanted, current: Option<&SliceTable>, pools: &BTreeMap<String, u128>) -> Self {
        // With `node_slice_max_entries` a node's calls prefer a new slice once
        // a pool holds that many, so the room that keeps an extra slice from
        // going back is room under the bound.
        let bound = w.range.node_slicing.as_ref().and_then(|s| s.max_entries).map_or(u128::MAX, u128::from);
        let mut capacity = BTreeMap::new();
        for slice in &w.desired.layout {
            if let Ok(r) = slices::in_slice(&w.range, &w.network_name, "node", slice) {
                capacity.insert(slice.clone(), r.usable.min(bound));
            }
        }
        let mut entries = BTreeMap::new();
        let held = current.into_iter().flat_map(|t| t.allocations.iter().cloned().chain(t.cooling.iter().map(|(s, c)| (c.node.clone(), s.clone()))));
        for (node, slice) in held.filter(|(n, _)| !n.is_empty()) {
            // whereabouts' per-node pool name, for this slice of any layout.
            let Some(cidr) = super::canonical_cidr(&slice) else { continue };
            let pool = thereabouts_allocator::naming::node_pool_name(&cidr, &node, &w.network_name);
            entries.insert((node, slice), pools.get(&pool).copied().unwrap_or(0));
        }
        Usage { entries, capacity }
    }
}

impl SliceUse for Usage {
    fn in_use(&self, node: &str, slice: &str) -> bool {
        self.entries.get(&(node.to_string(), slice.to_string())).is_some_and(|n| *n > 0)
    }
    fn free(&self, node: &str, slice: &str) -> u128 {
        self.capacity(slice).saturating_sub(self.entries.get(&(node.to_string(), slice.to_string())).copied().unwrap_or(0))
    }
    fn capacity(&self, slice: &str) -> u128 {
        self.capacity.get(slice).copied().unwrap_or(0)
    }
    fn usable(&self, slice: &str) -> bool {
        self.capacity.contains_key(slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(max_entries: &str) -> Wanted {
        let text =
            format!(r#"{{"cniVersion":"1.0.0","name":"net1","ipam":{{"type":"thereabouts","range":"192.0.2.0/24","node_slice_size":"/26"{max_entries}}}}}"#);
        let config = thereabouts_allocator::config::normalize(&text, None, "").expect("a valid config");
        let range = config.ranges[0].clone();
        let layout = slices::layout(&range).expect("a sliced range");
        let desired = Desired { name: "net1".into(), range: range.cidr.clone(), slice_size: "/26".into(), layout, source: "ns/net1".into() };
        Wanted { desired, range, network_name: String::new() }
    }

    #[test]
    fn with_node_slice_max_entries_a_slice_holds_that_many_for_the_hand_back_rule() {
        let held = SliceTable {
            range: "192.0.2.0/24".into(),
            slice_size: "/26".into(),
            allocations: vec![("a".into(), "192.0.2.0/26".into())],
            cooling: BTreeMap::new(),
            resource_version: "1".into(),
            uid: "u".into(),
            shape: Default::default(),
        };
        let pools = BTreeMap::from([("a-192.0.2.0-26".to_string(), 5u128)]);
        let unbounded = Usage::of(&wanted(""), Some(&held), &pools);
        assert_eq!((unbounded.capacity("192.0.2.0/26"), unbounded.free("a", "192.0.2.0/26")), (62, 57));
        let bounded = Usage::of(&wanted(r#","node_slice_max_entries":8"#), Some(&held), &pools);
        assert_eq!((bounded.capacity("192.0.2.0/26"), bounded.free("a", "192.0.2.0/26")), (8, 3));
    }

    #[test]
    fn a_pool_is_read_as_its_name_and_its_number_of_entries() {
        let pool: PoolCount = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "blue-node-1-192.0.2.0-28", "managedFields": [{"manager": "x"}]},
            "spec": {"range": "192.0.2.0/28", "allocations": {"1": {"id": "c1", "podref": "ns/a"}, "2": {"id": "c2", "podref": "ns/b"}}},
        }))
        .unwrap();
        assert_eq!((pool.metadata.name.as_str(), pool.spec.allocations), ("blue-node-1-192.0.2.0-28", 2));
        let empty: PoolCount = serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": {"range": "192.0.2.0/28"}})).unwrap();
        assert_eq!(empty.spec.allocations, 0);
    }
}
