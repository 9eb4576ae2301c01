//! JSON patches (RFC 6902, `application/json-patch+json`) for `IPPool`s with a
//! compare-and-swap per entry: each operation on an entry comes after a `test` of
//! what the plan relied on about that entry, and the apiserver applies the patch
//! atomically to the object as stored, or not at all (422 when a test fails):
//!
//! - insert at offset o: `test /spec/allocations/<o>` against `null`, then `add`.
//!   The apiserver's JSON patch (evanphx/json-patch v4) lets a `test` against
//!   `null` pass when the member is missing or null and fail when it holds
//!   anything: "add if absent". whereabouts guards its own `add`s the same way.
//!   For an offset in [2^63, 2^64) the key whereabouts writes for it (negative,
//!   see [`super::crd::parse_key`]) is tested absent too;
//! - removal, new container ID: `test /spec/allocations/<key>/id` against the id
//!   as read (an entry removed since fails: a missing member is not a string; an
//!   entry of another container at that offset fails on the value), then
//!   `remove` / `replace`;
//! - a missing or null `spec.allocations` is tested `null` before the `add {}`
//!   that creates it: an `add` would replace a map someone created meanwhile.
//!
//! A call's first attempt also tests `metadata.resourceVersion` as read
//! (`fail_fast`). Not for safety (the entry tests are the compare-and-swap),
//! for cost: without it the apiserver re-applies a patch each time another
//! write landed first, a full write attempt each time, quadratic in the writers
//! of a burst. With it a patch against a moved pool fails at once (422), and
//! the call takes a turn ([`super::turn`]) before it tries again. In its turn
//! the test is left out: writes to other entries since the read change nothing
//! the plan relied on, so they must not make it fail. Why this is safe next to
//! whereabouts: `docs/datastores.md`, "Why per-entry compare-and-swap is safe".
//! Everything else in the object is left alone.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use thereabouts_allocator::model::Allocation;

use super::crd::PoolObject;
use crate::datastore::pool_document::entry_value;
use crate::datastore::{Change, apply_changes};

const ALLOCATIONS: &str = "/spec/allocations";

/// The patch applying `changes` to `pool` (as read), each change guarded by a
/// `test` of the entry it touches, and first by a `test` of the version read
/// when `fail_fast`. Reservation changes add no operation.
pub fn update(pool: &PoolObject, changes: &[Change], fail_fast: bool) -> Result<Value, String> {
    // The shared meaning of the changes, on the entries as read: a change that
    // contradicts them is refused here exactly as the other stores refuse it.
    let mut entries: BTreeMap<u128, Allocation> = pool.entries.iter().map(|a| (a.offset, a.clone())).collect();
    apply_changes(&mut entries, changes)?;
    let mut ops = Vec::with_capacity(changes.len() * 2 + 3);
    if fail_fast {
        ops.push(json!({"op": "test", "path": "/metadata/resourceVersion", "value": pool.resource_version}));
    }
    let inserts = changes.iter().any(|c| matches!(c, Change::Insert(_)));
    if inserts && !pool.has_allocations {
        // Missing or null: an `add` creates (or replaces) the member, so only
        // while it is still missing or null.
        ops.push(json!({"op": "test", "path": ALLOCATIONS, "value": null}));
        ops.push(json!({"op": "add", "path": ALLOCATIONS, "value": {}}));
    }
    let key = |offset: &u128| pool.keys.get(offset).cloned().ok_or_else(|| format!("no allocation at offset {offset}"));
    // The id read at `offset`: a removal or replacement applies only to that entry.
    let id_test = |offset: &u128, key: &str| json!({"op": "test", "path": format!("{ALLOCATIONS}/{}/id", pointer_token(key)), "value": pool.ids.get(offset).cloned().unwrap_or(Value::Null)});
    for change in changes {
        match change {
            Change::Insert(a) => {
                let path = format!("{ALLOCATIONS}/{}", a.offset);
                if let Some(alias) = negative_key(a.offset) {
                    ops.push(json!({"op": "test", "path": format!("{ALLOCATIONS}/{alias}"), "value": null}));
                }
                ops.push(json!({"op": "test", "path": path, "value": null}));
                ops.push(json!({"op": "add", "path": path, "value": entry_value(a)}));
            }
            Change::Remove { offset } => {
                let key = key(offset)?;
                ops.push(id_test(offset, &key));
                ops.push(json!({"op": "remove", "path": format!("{ALLOCATIONS}/{}", pointer_token(&key))}));
            }
            Change::SetContainerId { offset, container_id } => {
                let key = key(offset)?;
                ops.push(id_test(offset, &key));
                ops.push(json!({"op": "replace", "path": format!("{ALLOCATIONS}/{}/id", pointer_token(&key)), "value": container_id}));
            }
            Change::TakeOver { offset, holder, .. } => {
                let key = key(offset)?;
                ops.push(id_test(offset, &key));
                // `add` replaces a member or adds one whereabouts left out (`ifname`).
                for (field, value) in [("id", &holder.container_id), ("podref", &holder.pod_ref), ("ifname", &holder.ifname)] {
                    ops.push(json!({"op": "add", "path": format!("{ALLOCATIONS}/{}/{field}", pointer_token(&key)), "value": value}));
                }
            }
            Change::Keep { offset, container_id } => {
                let key = key(offset)?;
                ops.push(json!({"op": "test", "path": format!("{ALLOCATIONS}/{}/id", pointer_token(&key)), "value": container_id}));
            }
            Change::Reserve { .. } | Change::Unreserve { .. } => {}
        }
    }
    Ok(Value::Array(ops))
}

/// The key whereabouts writes for an offset in [2^63, 2^64): the offset as a
/// signed 64-bit number (`-3844666706890850303` for `0xcaa5000000000001`).
fn negative_key(offset: u128) -> Option<String> {
    (1 << 63..1 << 64).contains(&offset).then(|| (offset as u64 as i64).to_string())
}

/// Removes entries this process inserted, each only if it is still exactly what
/// was written: no `resourceVersion` test, so other writers' changes in the
/// meantime cannot make the rollback fail, and an entry someone else already
/// removed fails the test instead of being touched (422: nothing to undo).
pub fn rollback(inserted: &[&Allocation]) -> Value {
    let mut ops = Vec::with_capacity(inserted.len() * 2);
    for a in inserted {
        let path = format!("{ALLOCATIONS}/{}", a.offset);
        ops.push(json!({"op": "test", "path": path, "value": entry_value(a)}));
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

    fn alloc(offset: u128, id: &str) -> Allocation {
        Allocation { offset, container_id: id.into(), pod_ref: "ns/pod".into(), ifname: "eth0".into(), claim: None }
    }

    fn pool(keys: &[(u128, &str)]) -> PoolObject {
        PoolObject {
            resource_version: "41".into(),
            has_allocations: true,
            keys: keys.iter().map(|(o, k)| (*o, k.to_string())).collect::<BTreeMap<_, _>>(),
            entries: keys.iter().map(|(o, _)| alloc(*o, &format!("id-{o}"))).collect(),
            ..PoolObject::default()
        }
    }

    #[test]
    fn insert_is_guarded_like_whereabouts() {
        // Only the entry's own absence is tested: the resourceVersion is not.
        let patch =
            update(&pool(&[(1, "1")]), &[Change::Reserve { name: "192.0.2.2".into(), holder: alloc(2, "c") }, Change::Insert(alloc(2, "c"))], false).unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/spec/allocations/2", "value": null},
                {"op": "add", "path": "/spec/allocations/2", "value": {"id": "c", "podref": "ns/pod", "ifname": "eth0"}}
            ])
        );
    }

    #[test]
    fn a_kept_entry_is_only_tested() {
        let patch = update(&pool(&[(6, "6")]), &[Change::Keep { offset: 6, container_id: "id-6".into() }], false).unwrap();
        assert_eq!(patch, json!([{"op": "test", "path": "/spec/allocations/6/id", "value": "id-6"}]));
    }

    #[test]
    fn a_first_attempt_tests_the_version_read_before_anything_else() {
        let patch = update(&pool(&[]), &[Change::Insert(alloc(2, "c"))], true).unwrap();
        assert_eq!(patch[0], json!({"op": "test", "path": "/metadata/resourceVersion", "value": "41"}));
        assert_eq!(patch.as_array().unwrap().len(), 3);
    }

    #[test]
    fn a_missing_allocations_map_is_added_first_only_while_missing() {
        let mut bare = pool(&[]);
        bare.has_allocations = false;
        let patch = update(&bare, &[Change::Insert(alloc(3, "c"))], false).unwrap();
        assert_eq!(patch[0], json!({"op": "test", "path": "/spec/allocations", "value": null}));
        assert_eq!(patch[1], json!({"op": "add", "path": "/spec/allocations", "value": {}}));
        assert_eq!(patch.as_array().unwrap().len(), 4);
    }

    #[test]
    fn an_offset_whereabouts_writes_as_a_negative_key_is_tested_under_both_keys() {
        let offset = 0xcaa5_0000_0000_0001u128;
        let patch = update(&pool(&[]), &[Change::Insert(alloc(offset, "c"))], false).unwrap();
        assert_eq!(patch[0], json!({"op": "test", "path": "/spec/allocations/-3844666706890850303", "value": null}));
        assert_eq!(patch[1], json!({"op": "test", "path": "/spec/allocations/14602077366818701313", "value": null}));
        assert_eq!(patch.as_array().unwrap().len(), 3);
        assert_eq!(negative_key((1 << 63) - 1), None);
        assert_eq!(negative_key(1 << 63).as_deref(), Some("-9223372036854775808"));
        assert_eq!(negative_key(1 << 64), None);
    }

    #[test]
    fn remove_and_replace_test_the_id_read_under_the_stored_key() {
        let mut read = pool(&[(5, "05"), (6, "6"), (7, "7")]);
        read.ids.insert(5, json!("c5"));
        read.ids.insert(6, json!("c6"));
        // 7: an entry stored without an id.
        let patch = update(
            &read,
            &[
                Change::Remove { offset: 5 },
                Change::SetContainerId { offset: 6, container_id: "new".into() },
                Change::Remove { offset: 7 },
                Change::Unreserve { name: "x".into(), holder: alloc(5, "c") },
            ],
            false,
        )
        .unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/spec/allocations/05/id", "value": "c5"},
                {"op": "remove", "path": "/spec/allocations/05"},
                {"op": "test", "path": "/spec/allocations/6/id", "value": "c6"},
                {"op": "replace", "path": "/spec/allocations/6/id", "value": "new"},
                {"op": "test", "path": "/spec/allocations/7/id", "value": null},
                {"op": "remove", "path": "/spec/allocations/7"}
            ])
        );
    }

    #[test]
    fn a_take_over_tests_the_id_read_and_rewrites_the_holder() {
        let mut read = pool(&[(5, "5")]);
        read.ids.insert(5, json!("id-5"));
        let holder = Allocation { claim: Some(thereabouts_allocator::model::Claim::IpamClaim("ns/vm".into())), ..alloc(5, "new") };
        let patch = update(&read, &[Change::TakeOver { offset: 5, from: "id-5".into(), holder }], false).unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/spec/allocations/5/id", "value": "id-5"},
                {"op": "add", "path": "/spec/allocations/5/id", "value": "new"},
                {"op": "add", "path": "/spec/allocations/5/podref", "value": "ns/pod"},
                {"op": "add", "path": "/spec/allocations/5/ifname", "value": "eth0"}
            ])
        );
    }

    #[test]
    fn changes_that_contradict_the_pool_are_refused() {
        assert!(update(&pool(&[(2, "2")]), &[Change::Insert(alloc(2, "c"))], false).unwrap_err().contains("already allocated"));
        assert!(update(&pool(&[]), &[Change::Remove { offset: 9 }], false).unwrap_err().contains("offset 9"));
        assert!(update(&pool(&[]), &[Change::SetContainerId { offset: 9, container_id: "x".into() }], false).is_err());
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
