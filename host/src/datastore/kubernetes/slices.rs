//! `NodeSlicePool`s (`whereabouts.cni.cncf.io/v1alpha1`, `nodeslicepools`): which
//! node holds which slice of a range (`node_slice_size`). The `thereabouts
//! controller` writes them (`controller/`); the plugin reads the one of each
//! sliced range, and claims a free slice itself when its node has none with
//! room. The object is whereabouts': `spec.range`, `spec.sliceSize`, and
//! `status.allocations`, a list of `{nodeName, sliceRange}` in address order
//! where an empty `nodeName` is a free slice.
//!
//! One addition, an annotation whereabouts' clients ignore: slices handed back
//! recently ([`COOLING_ANNOTATION`]). A slice a node gave back may still be
//! written by a call of that node that read the pool before; it is claimable
//! again only once every such call has ended (see `controller/slices.rs`).
//!
//! **Slice objects.** One object cannot hold more than [`ONE_OBJECT_SLICES`]
//! slices (5 000 nodes need more), and every claim in it rewrites it whole.
//! So a layout may instead keep one `NodeSlicePool` per held (or cooling)
//! slice, [`SliceObject`], in whereabouts' shape with that one slice, labelled
//! with its layout and its node: a claim creates one (409: taken), about 600
//! bytes. The layout object then says so in [`SLICE_OBJECTS_ANNOTATION`]
//! ([`Shape`]), and keeps its own list in step while it fits.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Annotation: `{"<slice>": {"node": "<node>", "since": <unix seconds>}, ...}`,
/// the slices handed back and not claimable yet, with the node that held each.
pub const COOLING_ANNOTATION: &str = "thereabouts.io/cooling-slices";

/// Annotation of a layout object: where its slices are held ([`Shape`]).
pub const SLICE_OBJECTS_ANNOTATION: &str = "thereabouts.io/slice-objects";
/// Label of a slice object: its layout's name ([`label_value`]).
pub const SLICE_OF_LABEL: &str = "thereabouts.io/slice-of";
/// Label of a slice object: its node's name ([`label_value`]); none while it cools.
pub const SLICE_NODE_LABEL: &str = "thereabouts.io/slice-node";
/// The most slices whereabouts' shape keeps in one object; past it a layout
/// has slice objects only.
pub const ONE_OBJECT_SLICES: usize = thereabouts_allocator::slices::ONE_OBJECT_SLICES as usize;

/// Where a layout's slices are held, from [`SLICE_OBJECTS_ANNOTATION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Shape {
    /// No annotation: whereabouts' `status.allocations` says it all.
    #[default]
    List,
    /// `"both:<unix seconds>"`: on the way from one shape to the other since
    /// then. A claim writes both (the object first, then the list) and holds
    /// only if both took, so it conflicts with calls that read either shape.
    /// The controller moves on once no call that read the shape before can
    /// still run (its cool-down, longer than an ADD).
    Both { since: u64 },
    /// `"true"`: the slice objects say it all; the list, if any, is a copy
    /// the controller keeps for whereabouts' plugins.
    Objects,
}

impl Shape {
    pub fn of_annotation(value: Option<&str>) -> Shape {
        match value {
            None => Shape::List,
            Some(v) => match v.strip_prefix("both:") {
                Some(since) => Shape::Both { since: since.parse().unwrap_or(0) },
                // "true", or a value from a later version: never the list
                // alone, which may not hold every slice.
                None => Shape::Objects,
            },
        }
    }

    pub fn annotation(self) -> Option<String> {
        match self {
            Shape::List => None,
            Shape::Both { since } => Some(format!("both:{since}")),
            Shape::Objects => Some("true".into()),
        }
    }

    /// Whether calls read and claim slice objects.
    pub fn has_objects(self) -> bool {
        self != Shape::List
    }
}

/// A label value for an object name: the name when it fits (63 characters),
/// else `h` and 40 hex digits of its SHA-256.
pub fn label_value(name: &str) -> String {
    if name.len() <= 63 {
        return name.to_string();
    }
    let digest = Sha256::digest(name.as_bytes());
    format!("h{}", digest.iter().take(20).map(|b| format!("{b:02x}")).collect::<String>())
}

/// Where `node` starts in a layout of `len` slices of objects (a hash of its
/// name): the controller assigns a new node the first free slice from there,
/// a node claiming another slice tries from there, and a node that remembers
/// none of its slices reads the objects from there by name before it lists
/// them. Spread over the layout, so nodes claiming at once rarely meet.
pub fn home(node: &str, len: usize) -> usize {
    let hash = Sha256::digest(node.as_bytes()).iter().take(8).fold(0u64, |n, b| n << 8 | u64::from(*b));
    (hash % len.max(1) as u64) as usize
}

/// The name of `layout`'s object for `slice`: `<layout>-slice-<slice as in a pool name>`.
pub fn slice_object_name(layout: &str, slice: &str) -> String {
    thereabouts_allocator::naming::pool_name_for_network(slice, &format!("{layout}-slice"))
}

/// The `labelSelector` (URL-encoded) of `layout`'s slice objects, or of those `node` holds.
pub fn slice_selector(layout: &str, node: Option<&str>) -> String {
    let mut selector = format!("{SLICE_OF_LABEL}={}", label_value(layout));
    if let Some(node) = node {
        selector.push_str(&format!(",{SLICE_NODE_LABEL}={}", label_value(node)));
    }
    super::crd::escape(&selector)
}

/// One slice held (or cooling) as an object of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceObject {
    pub name: String,
    pub slice: String,
    /// Empty while it cools.
    pub node: String,
    pub cooling: Option<Cooling>,
    pub resource_version: String,
}

impl SliceObject {
    /// Reads a slice object; `Err` names what is wrong.
    pub fn from_object(object: &Value) -> Result<Self, String> {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_string();
        let Some(Value::Array(items)) = object.pointer("/status/allocations") else { return Err("status.allocations is not a list".into()) };
        let [only] = items.as_slice() else { return Err(format!("status.allocations holds {} slices, not one", items.len())) };
        let slice = text(only.get("sliceRange"));
        Ok(SliceObject {
            name: text(object.pointer("/metadata/name")),
            cooling: cooling_of(object).remove(&slice),
            slice,
            node: text(only.get("nodeName")),
            resource_version: text(object.pointer("/metadata/resourceVersion")),
        })
    }

    /// The object for `slice` of `layout` (slices of `/size`), held by `node`
    /// (empty: cooling, with `cooling`).
    pub fn object(layout: &str, namespace: &str, size: &str, slice: &str, node: &str, cooling: Option<&Cooling>) -> Value {
        let mut labels = json!({SLICE_OF_LABEL: label_value(layout), "app.kubernetes.io/managed-by": "thereabouts"});
        if !node.is_empty() {
            labels[SLICE_NODE_LABEL] = json!(label_value(node));
        }
        let mut metadata = json!({"name": slice_object_name(layout, slice), "namespace": namespace, "labels": labels});
        if let Some(c) = cooling {
            metadata["annotations"] = json!({COOLING_ANNOTATION: json!({slice: c}).to_string()});
        }
        json!({
            "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
            "kind": "NodeSlicePool",
            "metadata": metadata,
            "spec": {"range": slice, "sliceSize": size},
            "status": {"allocations": [{"nodeName": node, "sliceRange": slice}]},
        })
    }
}

/// The slices a `NodeSlicePool` names cooling ([`COOLING_ANNOTATION`]); none
/// when the annotation is missing or unreadable.
fn cooling_of(object: &Value) -> BTreeMap<String, Cooling> {
    let annotation = object.pointer("/metadata/annotations").and_then(|a| a.get(COOLING_ANNOTATION)).and_then(Value::as_str);
    annotation.and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default()
}

/// A slice handed back: who held it, since when (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cooling {
    pub node: String,
    pub since: u64,
}

/// A `NodeSlicePool` as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceTable {
    pub range: String,
    pub slice_size: String,
    /// `status.allocations` in order: (nodeName, sliceRange).
    pub allocations: Vec<(String, String)>,
    /// Slices handed back and not claimable yet.
    pub cooling: BTreeMap<String, Cooling>,
    pub resource_version: String,
    pub uid: String,
    /// Where its slices are held.
    pub shape: Shape,
}

impl SliceTable {
    /// Reads a `NodeSlicePool` object; `Err` names what is missing.
    pub fn from_object(object: &Value) -> Result<Self, String> {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_string();
        let spec = object.get("spec").ok_or("no spec")?;
        let allocations = match object.pointer("/status/allocations") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items.iter().map(|a| (text(a.get("nodeName")), text(a.get("sliceRange")))).collect(),
            Some(_) => return Err("status.allocations is not a list".into()),
        };
        Ok(SliceTable {
            range: text(spec.get("range")),
            slice_size: text(spec.get("sliceSize")),
            allocations,
            cooling: cooling_of(object),
            resource_version: text(object.pointer("/metadata/resourceVersion")),
            uid: text(object.pointer("/metadata/uid")),
            shape: Shape::of_annotation(object.pointer("/metadata/annotations").and_then(|a| a.get(SLICE_OBJECTS_ANNOTATION)).and_then(Value::as_str)),
        })
    }

    /// The slices `node` holds, in the pool's order.
    pub fn held_by(&self, node: &str) -> Vec<String> {
        self.allocations.iter().filter(|(n, _)| n == node).map(|(_, s)| s.clone()).collect()
    }

    /// The first slice that is free, not cooling, and `usable`, with its index.
    pub fn first_free(&self, mut usable: impl FnMut(&str) -> bool) -> Option<(usize, String)> {
        self.allocations.iter().enumerate().find(|(_, (n, s))| n.is_empty() && !self.cooling.contains_key(s) && usable(s)).map(|(i, (_, s))| (i, s.clone()))
    }
}

/// The JSON patch that gives the free slice at `index` to `node`, only if that
/// entry is still the free `slice`: two claimants never both get one slice.
pub fn claim_patch(index: usize, slice: &str, node: &str) -> Value {
    json!([
        {"op": "test", "path": format!("/status/allocations/{index}/sliceRange"), "value": slice},
        {"op": "test", "path": format!("/status/allocations/{index}/nodeName"), "value": ""},
        {"op": "replace", "path": format!("/status/allocations/{index}/nodeName"), "value": node},
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> SliceTable {
        SliceTable::from_object(&json!({
            "metadata": {"resourceVersion": "7", "annotations": {COOLING_ANNOTATION: "{\"192.0.2.64/26\":{\"node\":\"b\",\"since\":5}}"}},
            "spec": {"range": "192.0.2.0/24", "sliceSize": "/26"},
            "status": {"allocations": [
                {"nodeName": "a", "sliceRange": "192.0.2.0/26"},
                {"nodeName": "", "sliceRange": "192.0.2.64/26"},
                {"nodeName": "", "sliceRange": "192.0.2.128/26"},
                {"nodeName": "a", "sliceRange": "192.0.2.192/26"}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_node_holds_its_slices_in_order_and_cooling_slices_are_not_free() {
        let t = table();
        assert_eq!(t.held_by("a"), ["192.0.2.0/26", "192.0.2.192/26"]);
        assert!(t.held_by("b").is_empty());
        assert_eq!(t.first_free(|_| true), Some((2, "192.0.2.128/26".to_string())));
        assert_eq!(t.first_free(|s| s != "192.0.2.128/26"), None);
    }

    #[test]
    fn a_claim_tests_that_the_slot_is_still_the_free_slice() {
        let patch = claim_patch(2, "192.0.2.128/26", "b");
        assert_eq!(patch[0]["path"], "/status/allocations/2/sliceRange");
        assert_eq!(patch[1]["value"], "");
        assert_eq!(patch[2]["value"], "b");
    }
}
