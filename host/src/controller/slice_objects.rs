//! Layouts whose slices are objects of their own (`Shape`, see
//! `datastore/kubernetes/slices.rs`): the table a pass decides on, made from
//! the layout object and the slice objects; the writes that make the objects
//! say what the decided table says; and the moves between shapes. Pure
//! decisions, no I/O (`slice_pass.rs` reads and writes).
//!
//! A layout of more than `ONE_OBJECT_SLICES` slices has slice objects only.
//! One of at most that many keeps whereabouts' list unless the controller runs
//! with `--slice-objects`; it moves between the two through `Shape::Both`,
//! where a claim writes both, for one cool-down, so that no call that read one
//! shape ever races a call that read the other unseen.

use std::collections::BTreeMap;

use crate::datastore::kubernetes::slices::{Cooling, ONE_OBJECT_SLICES, Shape, SliceObject, SliceTable};

use super::layout::{self, Desired};

/// A write to one slice object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Create {
        slice: String,
        node: String,
        cooling: Option<Cooling>,
    },
    /// Replace `object` (guarded by its `resourceVersion`).
    Replace {
        object: SliceObject,
        node: String,
        cooling: Option<Cooling>,
    },
    /// Delete `object` (guarded by its `resourceVersion`).
    Delete {
        object: SliceObject,
    },
}

/// The shape the NADs and the controller's `--slice-objects` ask for.
pub fn target(desired: &Desired, slice_objects: bool) -> Shape {
    if slice_objects || desired.layout.len() > ONE_OBJECT_SLICES { Shape::Objects } else { Shape::List }
}

/// The table as the layout object and the slice objects (by slice) say it.
/// While both are kept, an object that contradicts the list loses: a claim
/// in both shapes holds only once the list took it, so such an object is
/// left over from a claim that then failed ([`ops`] rewrites it).
pub fn merged(current: Option<&SliceTable>, objects: &BTreeMap<String, SliceObject>, desired: &Desired) -> Option<SliceTable> {
    let mut table = current?.clone();
    match table.shape {
        Shape::List => {}
        Shape::Both { .. } => {
            for (node, slice) in &mut table.allocations {
                if let Some(object) = objects.get(slice.as_str())
                    && node.is_empty()
                    && !table.cooling.contains_key(slice.as_str())
                {
                    node.clone_from(&object.node);
                }
            }
        }
        Shape::Objects => {
            table.cooling = objects.values().filter_map(|o| Some((o.slice.clone(), o.cooling.clone()?))).collect();
            table.allocations = if layout::same_layout(&table, desired) {
                desired.layout.iter().map(|s| (objects.get(s).map(|o| o.node.clone()).unwrap_or_default(), s.clone())).collect()
            } else {
                // Laid out differently: what is held of the old layout is all
                // a pass needs, to hand it back before the new one applies.
                objects.values().map(|o| (o.node.clone(), o.slice.clone())).collect()
            };
        }
    }
    Some(table)
}

/// The shape after this pass. A layout laid out afresh (nothing held) takes
/// the target at once: no call can hold a read of its slices.
pub fn next_shape(current: Option<&SliceTable>, fresh: bool, target: Shape, leftovers: bool, now: u64, cool_down: u64) -> Shape {
    let Some(current) = current else { return target };
    if fresh {
        return target;
    }
    match (current.shape, target) {
        // Slice objects of an earlier move are deleted first.
        (Shape::List, Shape::Objects) if leftovers => Shape::List,
        (Shape::List, Shape::Objects) | (Shape::Objects, Shape::List) => Shape::Both { since: now },
        (Shape::Both { since }, target) if now.saturating_sub(since) >= cool_down => target,
        (shape, _) => shape,
    }
}

/// The writes that make `objects` (by slice) hold what `table` says.
pub fn ops(table: &SliceTable, objects: &BTreeMap<String, SliceObject>) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut wanted: BTreeMap<&str, (&str, Option<&Cooling>)> = BTreeMap::new();
    for (node, slice) in &table.allocations {
        if !node.is_empty() {
            wanted.insert(slice, (node, None));
        }
    }
    for (slice, cooling) in &table.cooling {
        wanted.entry(slice).or_insert(("", Some(cooling)));
    }
    for (slice, (node, cooling)) in &wanted {
        match objects.get(*slice) {
            None => ops.push(Op::Create { slice: slice.to_string(), node: node.to_string(), cooling: cooling.cloned() }),
            Some(o) if o.node != *node || o.cooling.as_ref() != *cooling => {
                ops.push(Op::Replace { object: o.clone(), node: node.to_string(), cooling: cooling.cloned() })
            }
            Some(_) => {}
        }
    }
    for (slice, object) in objects {
        if !wanted.contains_key(slice.as_str()) {
            ops.push(Op::Delete { object: object.clone() });
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::layout::tests::desired;

    fn table(shape: Shape, held: &[(&str, &str)]) -> SliceTable {
        let mut t = layout::fresh(&desired());
        t.shape = shape;
        for (node, slice) in held {
            t.allocations.iter_mut().find(|(_, s)| s == slice).unwrap().0 = node.to_string();
        }
        t
    }

    fn objects(held: &[(&str, &str)]) -> BTreeMap<String, SliceObject> {
        held.iter()
            .map(|(node, slice)| {
                let object =
                    SliceObject { name: format!("o-{slice}"), slice: slice.to_string(), node: node.to_string(), cooling: None, resource_version: "3".into() };
                (slice.to_string(), object)
            })
            .collect()
    }

    #[test]
    fn with_slice_objects_the_objects_say_who_holds_what_and_the_list_is_a_copy() {
        let current = table(Shape::Objects, &[("a", "192.0.2.0/26")]);
        let t = merged(Some(&current), &objects(&[("b", "192.0.2.128/26")]), &desired()).unwrap();
        assert_eq!((t.held_by("a").len(), t.held_by("b")), (0, vec!["192.0.2.128/26".to_string()]));
    }

    #[test]
    fn in_both_shapes_an_object_claim_counts_and_an_object_the_list_contradicts_is_rewritten() {
        let current = table(Shape::Both { since: 5 }, &[("a", "192.0.2.0/26")]);
        let have = objects(&[("b", "192.0.2.0/26"), ("c", "192.0.2.64/26")]);
        let t = merged(Some(&current), &have, &desired()).unwrap();
        assert_eq!((t.held_by("a"), t.held_by("c")), (vec!["192.0.2.0/26".to_string()], vec!["192.0.2.64/26".to_string()]));
        assert!(matches!(&ops(&t, &have)[..], [Op::Replace { object, node, .. }] if object.node == "b" && node == "a"));
    }

    #[test]
    fn a_layout_moves_between_shapes_through_both_for_one_cool_down() {
        let list = table(Shape::List, &[]);
        assert_eq!(next_shape(Some(&list), false, Shape::Objects, false, 100, 150), Shape::Both { since: 100 });
        assert_eq!(next_shape(Some(&list), false, Shape::Objects, true, 100, 150), Shape::List);
        let both = table(Shape::Both { since: 100 }, &[]);
        assert_eq!(next_shape(Some(&both), false, Shape::Objects, false, 249, 150), Shape::Both { since: 100 });
        assert_eq!(next_shape(Some(&both), false, Shape::Objects, false, 250, 150), Shape::Objects);
        assert_eq!(next_shape(Some(&table(Shape::Objects, &[])), false, Shape::List, false, 7, 150), Shape::Both { since: 7 });
        assert_eq!(next_shape(None, false, Shape::Objects, false, 7, 150), Shape::Objects);
    }

    #[test]
    fn the_objects_follow_the_table_each_write_guarded_by_what_was_read() {
        let mut t = table(Shape::Objects, &[("a", "192.0.2.0/26"), ("b", "192.0.2.64/26")]);
        t.cooling.insert("192.0.2.128/26".into(), Cooling { node: "c".into(), since: 9 });
        let have = objects(&[("x", "192.0.2.64/26"), ("c", "192.0.2.128/26"), ("d", "192.0.2.192/26")]);
        let ops = ops(&t, &have);
        let on = |slice: &str| {
            ops.iter()
                .find(|op| {
                    matches!(op, Op::Create { slice: s, .. } if s == slice)
                        || matches!(op, Op::Replace { object: o, .. } | Op::Delete { object: o } if o.slice == slice)
                })
                .unwrap()
        };
        assert_eq!(*on("192.0.2.0/26"), Op::Create { slice: "192.0.2.0/26".into(), node: "a".into(), cooling: None });
        assert!(matches!(on("192.0.2.64/26"), Op::Replace { object, node, cooling: None } if object.node == "x" && node == "b"));
        assert!(matches!(on("192.0.2.128/26"), Op::Replace { node, cooling: Some(c), .. } if node.is_empty() && c.since == 9));
        assert!(matches!(on("192.0.2.192/26"), Op::Delete { object } if object.node == "d"));
        assert_eq!(ops.len(), 4);
    }
}
