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

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Annotation: `{"<slice>": {"node": "<node>", "since": <unix seconds>}, ...}`,
/// the slices handed back and not claimable yet, with the node that held each.
pub const COOLING_ANNOTATION: &str = "thereabouts.io/cooling-slices";

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
        let cooling = object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(COOLING_ANNOTATION))
            .and_then(Value::as_str)
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default();
        Ok(SliceTable {
            range: text(spec.get("range")),
            slice_size: text(spec.get("sliceSize")),
            allocations,
            cooling,
            resource_version: text(object.pointer("/metadata/resourceVersion")),
            uid: text(object.pointer("/metadata/uid")),
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
