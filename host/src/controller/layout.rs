//! What the controller wants a `NodeSlicePool` to say, from what it says now:
//! pure decisions, no I/O (the pass in `slice_pass.rs` reads and writes).
//!
//! The rules, each a safety or liveness property the tests below pin:
//! - every live node holds at least one slice (the first free one, in address
//!   order, as whereabouts assigns them);
//! - a slice leaves its node only when the node's pool of it is empty, and it
//!   then cools down (`COOLING_ANNOTATION`) for longer than any plugin call
//!   that read the old table can still run; at the end of the cool-down a
//!   slice whose pool is still empty becomes free, and one a late call wrote
//!   to goes back to its node;
//! - a gone node's slices are handed back the same way; a gone node whose
//!   pool still holds entries keeps its slice (the reconciler frees those);
//! - a node's extra slices go back once empty, when its other slices have half
//!   a slice free;
//! - a new range or slice size is applied only once no slice of the old layout
//!   is held or cooling: held slices whose pools are empty are handed back,
//!   the others wait for their pods to go.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::datastore::kubernetes::slices::{self, COOLING_ANNOTATION, Cooling, ONE_OBJECT_SLICES, SLICE_OBJECTS_ANNOTATION, SliceTable};

/// The layout the NADs ask for: one sliced range of one network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub name: String,
    /// Canonical CIDR of the range.
    pub range: String,
    /// `/N`.
    pub slice_size: String,
    /// Every slice, in address order.
    pub layout: Vec<String>,
    /// The NAD it comes from (`namespace/name`), for messages.
    pub source: String,
}

/// What the controller knows of one node's pool of one slice.
pub trait SliceUse {
    /// Whether the node's pool of the slice holds any entry.
    fn in_use(&self, node: &str, slice: &str) -> bool;
    /// Free addresses left in the node's pool of the slice.
    fn free(&self, node: &str, slice: &str) -> u128;
    /// Addresses a slice can hold.
    fn capacity(&self, slice: &str) -> u128;
    /// Whether a node can use the slice at all (it holds an address of the range).
    fn usable(&self, slice: &str) -> bool;
}

/// The table after one pass, and why it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next {
    pub table: SliceTable,
    pub notes: Vec<String>,
}

/// A free table of `desired`'s layout.
pub fn fresh(desired: &Desired) -> SliceTable {
    SliceTable {
        range: desired.range.clone(),
        slice_size: desired.slice_size.clone(),
        allocations: desired.layout.iter().map(|s| (String::new(), s.clone())).collect(),
        cooling: BTreeMap::new(),
        resource_version: String::new(),
        uid: String::new(),
        shape: Default::default(),
    }
}

fn prefix_of(size: &str) -> Option<u8> {
    size.trim().trim_start_matches('/').parse().ok()
}

/// Whether `table` is laid out as `desired` asks (sizes compared as numbers:
/// whereabouts writes `sliceSize` as the user did, `/22` or `22`).
pub fn same_layout(table: &SliceTable, desired: &Desired) -> bool {
    let range = crate::controller::canonical_cidr(&table.range);
    range.as_deref() == Some(desired.range.as_str()) && prefix_of(&table.slice_size).is_some() && prefix_of(&table.slice_size) == prefix_of(&desired.slice_size)
}

/// One pass over one `NodeSlicePool`.
/// How a node without a slice gets one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assign {
    /// The first free slice in address order, nodes in name order: what
    /// whereabouts' controller does, for a layout it also reads.
    InOrder,
    /// The first free slice from the node's home ([`slices::home`]): a layout
    /// of slice objects, where a node that remembers none of its slices finds
    /// its slice by reading a few objects by name instead of listing them all.
    FromHome,
}

pub fn next(desired: &Desired, current: Option<&SliceTable>, nodes: &BTreeSet<String>, usage: &dyn SliceUse, now: u64, cool_down: u64, assign: Assign) -> Next {
    let mut notes = Vec::new();
    let mut table = current.cloned().unwrap_or_else(|| fresh(desired));
    end_cool_downs(&mut table, usage, now, cool_down, &mut notes);
    let layout_ok = same_layout(&table, desired);
    for i in 0..table.allocations.len() {
        let (node, slice) = table.allocations[i].clone();
        if node.is_empty() {
            continue;
        }
        let gone = !nodes.contains(&node);
        if (gone || !layout_ok) && !usage.in_use(&node, &slice) {
            hand_back(&mut table, i, now);
            notes.push(format!("slice {slice} handed back by {} node {node}", if gone { "gone" } else { "re-laid-out" }));
        } else if gone {
            notes.push(format!("node {node} is gone, but its pool of slice {slice} still holds allocations: kept"));
        }
    }
    if !layout_ok {
        let held = table.allocations.iter().filter(|(n, _)| !n.is_empty()).count();
        if held == 0 && table.cooling.is_empty() {
            notes.push(format!("laid out again as {} in {} slices of {} (from {})", desired.range, desired.layout.len(), desired.slice_size, desired.source));
            let (rv, uid) = (table.resource_version.clone(), table.uid.clone());
            table = SliceTable { resource_version: rv, uid, ..fresh(desired) };
        } else {
            notes.push(format!(
                "range or slice size changed to {} {} ({}): waiting for {held} slice(s) with allocations and {} cooling",
                desired.range,
                desired.slice_size,
                desired.source,
                table.cooling.len()
            ));
            return Next { table, notes };
        }
    }
    hand_back_extras(&mut table, usage, now, &mut notes);
    // One walk over the table for every node without a slice (5 000 nodes on
    // 65 536 slices: a search from the start per node was 300 million steps).
    let holding: BTreeSet<String> = table.allocations.iter().filter(|(n, _)| !n.is_empty()).map(|(n, _)| n.clone()).collect();
    let len = table.allocations.len();
    let free = |table: &SliceTable, i: usize| {
        let (holder, slice) = &table.allocations[i];
        holder.is_empty() && !table.cooling.contains_key(slice) && usage.usable(slice)
    };
    // In order, a search starts after the last slice given; once one found
    // none free, none is (a full table is walked once, not once per node).
    let (mut next_free, mut none_free) = (0, false);
    for node in nodes.iter().filter(|n| !holding.contains(*n)) {
        let found = match assign {
            _ if none_free => None,
            Assign::InOrder => (next_free..len).find(|&i| free(&table, i)),
            Assign::FromHome => {
                let home = slices::home(node, len);
                (home..len).chain(0..home).find(|&i| free(&table, i))
            }
        };
        match found {
            Some(i) => {
                table.allocations[i].0 = node.clone();
                next_free = i + 1;
                notes.push(format!("slice {} assigned to node {node}", table.allocations[i].1));
            }
            None => {
                none_free = true;
                notes.push(format!("no free slice for node {node}"));
            }
        }
    }
    Next { table, notes }
}

fn hand_back(table: &mut SliceTable, index: usize, now: u64) {
    let (node, slice) = std::mem::take(&mut table.allocations[index]);
    table.allocations[index].1 = slice.clone();
    table.cooling.insert(slice, Cooling { node, since: now });
}

fn end_cool_downs(table: &mut SliceTable, usage: &dyn SliceUse, now: u64, cool_down: u64, notes: &mut Vec<String>) {
    let done: Vec<(String, Cooling)> =
        table.cooling.iter().filter(|(_, c)| now.saturating_sub(c.since) >= cool_down).map(|(s, c)| (s.clone(), c.clone())).collect();
    for (slice, cooling) in done {
        table.cooling.remove(&slice);
        if usage.in_use(&cooling.node, &slice)
            && let Some(entry) = table.allocations.iter_mut().find(|(n, s)| n.is_empty() && *s == slice)
        {
            // A call that read the old table wrote to it after all.
            entry.0 = cooling.node.clone();
            notes.push(format!("slice {slice} went back to node {}: its pool was written during the cool-down", cooling.node));
        }
    }
}

/// A node's slices after its first go back when empty, as long as the node
/// keeps half a slice free without them (so a node at the edge does not
/// claim and return a slice on every pod).
fn hand_back_extras(table: &mut SliceTable, usage: &dyn SliceUse, now: u64, notes: &mut Vec<String>) {
    let mut by_node: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, (node, _)) in table.allocations.iter().enumerate() {
        if !node.is_empty() {
            by_node.entry(node.clone()).or_default().push(i);
        }
    }
    for (node, held) in by_node {
        let mut kept: Vec<usize> = held.clone();
        for &i in held.iter().skip(1).rev() {
            let slice = table.allocations[i].1.clone();
            if usage.in_use(&node, &slice) {
                continue;
            }
            let others: u128 = kept.iter().filter(|&&k| k != i).map(|&k| usage.free(&node, &table.allocations[k].1)).sum();
            if others * 2 >= usage.capacity(&slice) {
                hand_back(table, i, now);
                kept.retain(|&k| k != i);
                notes.push(format!("extra slice {slice} of node {node} handed back (empty)"));
            }
        }
    }
}

/// The `NodeSlicePool` object holding `table`, as whereabouts writes it plus the
/// cooling annotation and the shape's (`slices::Shape`); `resourceVersion` set
/// when replacing. A layout of more slices than one object holds lists none:
/// its slice objects say who holds what.
pub fn object(name: &str, namespace: &str, table: &SliceTable) -> Value {
    let mut metadata = json!({"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "thereabouts-controller"}});
    let listed = table.allocations.len() <= ONE_OBJECT_SLICES;
    let mut annotations = serde_json::Map::new();
    if listed && !table.cooling.is_empty() {
        annotations.insert(COOLING_ANNOTATION.into(), json!(serde_json::to_string(&table.cooling).unwrap_or_default()));
    }
    if let Some(shape) = table.shape.annotation() {
        annotations.insert(SLICE_OBJECTS_ANNOTATION.into(), json!(shape));
    }
    if !annotations.is_empty() {
        metadata["annotations"] = Value::Object(annotations);
    }
    if !table.resource_version.is_empty() {
        metadata["resourceVersion"] = json!(table.resource_version);
    }
    let allocations: Vec<Value> = match listed {
        true => table.allocations.iter().map(|(n, s)| json!({"nodeName": n, "sliceRange": s})).collect(),
        false => Vec::new(),
    };
    json!({
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "NodeSlicePool",
        "metadata": metadata,
        "spec": {"range": table.range, "sliceSize": table.slice_size},
        "status": {"allocations": allocations},
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Pools by (node, slice): entries held; slices of 62 addresses.
    #[derive(Default)]
    struct Pools(BTreeMap<(String, String), u128>, BTreeSet<String>);
    impl SliceUse for Pools {
        fn in_use(&self, node: &str, slice: &str) -> bool {
            self.0.get(&(node.into(), slice.into())).is_some_and(|n| *n > 0)
        }
        fn free(&self, node: &str, slice: &str) -> u128 {
            62 - self.0.get(&(node.into(), slice.into())).copied().unwrap_or(0)
        }
        fn capacity(&self, _: &str) -> u128 {
            62
        }
        fn usable(&self, slice: &str) -> bool {
            !self.1.contains(slice)
        }
    }
    impl Pools {
        fn with(mut self, node: &str, slice: &str, entries: u128) -> Self {
            self.0.insert((node.into(), slice.into()), entries);
            self
        }
    }

    /// 192.0.2.0/24 in four /26 slices, from NAD default/net1.
    pub(in crate::controller) fn desired() -> Desired {
        Desired {
            name: "net1".into(),
            range: "192.0.2.0/24".into(),
            slice_size: "/26".into(),
            layout: ["192.0.2.0/26", "192.0.2.64/26", "192.0.2.128/26", "192.0.2.192/26"].map(String::from).into(),
            source: "default/net1".into(),
        }
    }
    fn nodes(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }
    fn holders(t: &SliceTable) -> Vec<&str> {
        t.allocations.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn with_slice_objects_a_node_gets_the_first_free_slice_from_its_home() {
        let d = desired();
        let len = d.layout.len();
        let first = next(&d, None, &nodes(&["a"]), &Pools::default(), 0, 150, Assign::FromHome).table;
        assert_eq!(holders(&first).iter().position(|h| *h == "a"), Some(slices::home("a", len)));
        // b from its home, or the slice after it when that is a's.
        let t = next(&d, Some(&first), &nodes(&["a", "b"]), &Pools::default(), 1, 150, Assign::FromHome).table;
        let home = slices::home("b", len);
        let expected = if home == slices::home("a", len) { (home + 1) % len } else { home };
        assert_eq!(holders(&t).iter().position(|h| *h == "b"), Some(expected));
    }

    #[test]
    fn nodes_get_the_first_free_slices_in_order_and_a_pass_is_stable() {
        let first = next(&desired(), None, &nodes(&["a", "b"]), &Pools::default(), 0, 150, Assign::InOrder);
        assert_eq!(holders(&first.table), ["a", "b", "", ""]);
        let again = next(&desired(), Some(&first.table), &nodes(&["a", "b"]), &Pools::default(), 1, 150, Assign::InOrder);
        assert_eq!(again.table, first.table);
        assert!(again.notes.is_empty());
    }

    #[test]
    fn a_gone_nodes_empty_slice_cools_down_then_is_free_and_a_busy_one_is_kept() {
        let t = next(&desired(), None, &nodes(&["a", "b"]), &Pools::default(), 0, 150, Assign::InOrder).table;
        let pools = Pools::default().with("b", "192.0.2.64/26", 3);
        let gone = next(&desired(), Some(&t), &nodes(&["b"]), &pools, 10, 150, Assign::InOrder).table;
        assert_eq!(holders(&gone), ["", "b", "", ""]);
        assert!(gone.cooling.contains_key("192.0.2.0/26"));
        // A new node never gets a cooling slice.
        let joined = next(&desired(), Some(&gone), &nodes(&["b", "c"]), &pools, 20, 150, Assign::InOrder).table;
        assert_eq!(holders(&joined), ["", "b", "c", ""]);
        let later = next(&desired(), Some(&joined), &nodes(&["c"]), &pools, 200, 150, Assign::InOrder).table;
        assert_eq!(holders(&later), ["", "b", "c", ""], "b is gone but holds entries");
        assert!(later.cooling.is_empty());
    }

    #[test]
    fn a_slice_written_during_its_cool_down_goes_back_to_its_node() {
        let t = next(&desired(), None, &nodes(&["a"]), &Pools::default(), 0, 150, Assign::InOrder).table;
        let cooling = next(&desired(), Some(&t), &nodes(&[]), &Pools::default(), 1, 150, Assign::InOrder).table;
        assert_eq!(holders(&cooling), ["", "", "", ""]);
        let late = Pools::default().with("a", "192.0.2.0/26", 1);
        let back = next(&desired(), Some(&cooling), &nodes(&[]), &late, 151, 150, Assign::InOrder).table;
        assert_eq!(holders(&back), ["a", "", "", ""]);
    }

    #[test]
    fn an_empty_extra_slice_goes_back_only_when_the_others_have_room() {
        let mut t = next(&desired(), None, &nodes(&["a"]), &Pools::default(), 0, 150, Assign::InOrder).table;
        t.allocations[1].0 = "a".into(); // claimed by the plugin when the first ran full
        let full = Pools::default().with("a", "192.0.2.0/26", 62);
        assert_eq!(holders(&next(&desired(), Some(&t), &nodes(&["a"]), &full, 1, 150, Assign::InOrder).table), ["a", "a", "", ""]);
        let drained = Pools::default().with("a", "192.0.2.0/26", 20);
        let back = next(&desired(), Some(&t), &nodes(&["a"]), &drained, 1, 150, Assign::InOrder).table;
        assert_eq!(holders(&back), ["a", "", "", ""]);
        assert!(back.cooling.contains_key("192.0.2.64/26"));
    }

    #[test]
    fn a_range_change_waits_for_the_old_slices_to_empty_then_lays_out_again() {
        let t = next(&desired(), None, &nodes(&["a", "b"]), &Pools::default(), 0, 150, Assign::InOrder).table;
        let wider = Desired {
            range: "198.51.100.0/24".into(),
            layout: vec!["198.51.100.0/25".into(), "198.51.100.128/25".into()],
            slice_size: "/25".into(),
            ..desired()
        };
        let busy = Pools::default().with("a", "192.0.2.0/26", 5);
        let waiting = next(&wider, Some(&t), &nodes(&["a", "b"]), &busy, 1, 150, Assign::InOrder);
        assert_eq!(holders(&waiting.table), ["a", "", "", ""], "b's empty slice is handed back, a's waits");
        assert_eq!(waiting.table.range, "192.0.2.0/24");
        let drained = next(&wider, Some(&waiting.table), &nodes(&["a", "b"]), &Pools::default(), 2, 150, Assign::InOrder).table;
        assert_eq!(drained.range, "192.0.2.0/24", "still cooling");
        let done = next(&wider, Some(&drained), &nodes(&["a", "b"]), &Pools::default(), 200, 150, Assign::InOrder).table;
        assert_eq!((done.range.as_str(), holders(&done)), ("198.51.100.0/24", vec!["a", "b"]));
    }

    #[test]
    fn a_slice_nobody_can_use_is_never_assigned_and_sizes_compare_as_numbers() {
        let mut pools = Pools::default();
        pools.1.insert("192.0.2.0/26".into());
        assert_eq!(holders(&next(&desired(), None, &nodes(&["a"]), &pools, 0, 150, Assign::InOrder).table), ["", "a", "", ""]);
        let mut t = fresh(&desired());
        t.slice_size = "26".into();
        assert!(same_layout(&t, &desired()));
    }
}
