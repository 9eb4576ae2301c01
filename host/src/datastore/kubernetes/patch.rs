//! JSON patches (RFC 6902, `application/json-patch+json`) for `IPPool`s, shaped
//! like whereabouts' own so mixed fleets interoperate: a `test` of the
//! `resourceVersion` read makes the whole patch fail with 422 when anyone wrote
//! the pool since (compare-and-swap), then one operation per change under
//! `/spec/allocations/<key>`. Everything else in the object is left alone.

use serde_json::{Value, json};
use thereabouts_allocator::model::Allocation;

use super::crd::{PoolObject, allocation_value};
use crate::datastore::Change;

const ALLOCATIONS: &str = "/spec/allocations";

/// The compare-and-swap patch applying `changes` to `pool` (as read at
/// `pool.resource_version`). Reservation changes add no operation.
pub fn update(pool: &PoolObject, changes: &[Change]) -> Result<Value, String> {
    let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": pool.resource_version})];
    let inserts = changes.iter().any(|c| matches!(c, Change::Insert(_)));
    if inserts && !pool.has_allocations {
        // Missing or null: an `add` creates (or replaces) the member.
        ops.push(json!({"op": "add", "path": ALLOCATIONS, "value": {}}));
    }
    let key = |offset: &u128| pool.keys.get(offset).cloned().ok_or_else(|| format!("no allocation at offset {offset}"));
    for change in changes {
        match change {
            Change::Insert(a) => {
                if pool.keys.contains_key(&a.offset) {
                    return Err(format!("offset {} is already allocated", a.offset));
                }
                let path = format!("{ALLOCATIONS}/{}", a.offset);
                ops.push(json!({"op": "test", "path": path, "value": null}));
                ops.push(json!({"op": "add", "path": path, "value": allocation_value(a)}));
            }
            Change::Remove { offset } => ops.push(json!({"op": "remove", "path": format!("{ALLOCATIONS}/{}", pointer_token(&key(offset)?))})),
            Change::SetContainerId { offset, container_id } => {
                ops.push(json!({"op": "replace", "path": format!("{ALLOCATIONS}/{}/id", pointer_token(&key(offset)?)), "value": container_id}))
            }
            Change::Reserve { .. } | Change::Unreserve { .. } => {}
        }
    }
    Ok(Value::Array(ops))
}

/// Removes entries this process inserted, each only if it is still exactly what
/// was written: no `resourceVersion` test, so other writers' changes in the
/// meantime cannot make the rollback fail, and an entry someone else already
/// removed fails the test instead of being touched (422: nothing to undo).
pub fn rollback(inserted: &[&Allocation]) -> Value {
    let mut ops = Vec::with_capacity(inserted.len() * 2);
    for a in inserted {
        let path = format!("{ALLOCATIONS}/{}", a.offset);
        ops.push(json!({"op": "test", "path": path, "value": allocation_value(a)}));
        ops.push(json!({"op": "remove", "path": path}));
    }
    Value::Array(ops)
}

/// A key as a JSON-pointer token (`~` → `~0`, `/` → `~1`); offsets never need
/// it, keys read from other writers might.
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn alloc(offset: u128, id: &str) -> Allocation {
        Allocation { offset, container_id: id.into(), pod_ref: "ns/pod".into(), ifname: "eth0".into() }
    }

    fn pool(keys: &[(u128, &str)]) -> PoolObject {
        PoolObject {
            resource_version: "41".into(),
            has_allocations: true,
            keys: keys.iter().map(|(o, k)| (*o, k.to_string())).collect::<BTreeMap<_, _>>(),
            ..PoolObject::default()
        }
    }

    #[test]
    fn insert_is_guarded_like_whereabouts() {
        let patch = update(&pool(&[(1, "1")]), &[Change::Reserve { name: "192.0.2.2".into(), holder: alloc(2, "c") }, Change::Insert(alloc(2, "c"))]).unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
                {"op": "test", "path": "/spec/allocations/2", "value": null},
                {"op": "add", "path": "/spec/allocations/2", "value": {"id": "c", "podref": "ns/pod", "ifname": "eth0"}}
            ])
        );
    }

    #[test]
    fn a_missing_allocations_map_is_added_first() {
        let mut bare = pool(&[]);
        bare.has_allocations = false;
        let patch = update(&bare, &[Change::Insert(alloc(3, "c"))]).unwrap();
        assert_eq!(patch[1], json!({"op": "add", "path": "/spec/allocations", "value": {}}));
        assert_eq!(patch.as_array().unwrap().len(), 4);
    }

    #[test]
    fn remove_and_replace_use_the_stored_key() {
        let patch = update(
            &pool(&[(5, "05"), (6, "6")]),
            &[Change::Remove { offset: 5 }, Change::SetContainerId { offset: 6, container_id: "new".into() }, Change::Unreserve { name: "x".into(), holder: alloc(5, "c") }],
        )
        .unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
                {"op": "remove", "path": "/spec/allocations/05"},
                {"op": "replace", "path": "/spec/allocations/6/id", "value": "new"}
            ])
        );
    }

    #[test]
    fn changes_that_contradict_the_pool_are_refused() {
        assert!(update(&pool(&[(2, "2")]), &[Change::Insert(alloc(2, "c"))]).unwrap_err().contains("already allocated"));
        assert!(update(&pool(&[]), &[Change::Remove { offset: 9 }]).unwrap_err().contains("offset 9"));
        assert!(update(&pool(&[]), &[Change::SetContainerId { offset: 9, container_id: "x".into() }]).is_err());
    }

    #[test]
    fn rollback_tests_each_entry_then_removes_it() {
        let a = alloc(7, "c");
        assert_eq!(
            rollback(&[&a]),
            json!([
                {"op": "test", "path": "/spec/allocations/7", "value": {"id": "c", "podref": "ns/pod", "ifname": "eth0"}},
                {"op": "remove", "path": "/spec/allocations/7"}
            ])
        );
    }

    #[test]
    fn pointer_tokens_are_escaped() {
        assert_eq!(pointer_token("a/b~c"), "a~1b~0c");
    }
}
