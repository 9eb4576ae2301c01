//! The whereabouts custom resources on the wire (group `whereabouts.cni.cncf.io`,
//! version `v1alpha1`), handled as JSON so an object read and patched keeps every
//! field this build does not know:
//!
//! - `IPPool` `<pool name>`: `spec.range` (the range's CIDR) and `spec.allocations`,
//!   a map from the decimal offset of an address (from the network address) to
//!   `{"id": <container ID>, "podref": "<namespace>/<pod>", "ifname": <interface>}`;
//! - `OverlappingRangeIPReservation` `<reservation name>`: one per reserved address,
//!   `spec` `{"podref", "ifname", "containerid"}` (`containerid` is optional in
//!   whereabouts v0.8.0+ CRDs and required by older ones, so it is always written).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use thereabouts_allocator::model::Allocation;
use thereabouts_allocator::objects;

use crate::datastore::pool_document::{claim_fields, entry_value};

pub const GROUP: &str = "whereabouts.cni.cncf.io";
pub const VERSION: &str = "v1alpha1";
pub const IPPOOLS: &str = "ippools";
pub const RESERVATIONS: &str = "overlappingrangeipreservations";
pub const NODE_SLICE_POOLS: &str = "nodeslicepools";

fn api_version() -> String {
    format!("{GROUP}/{VERSION}")
}

/// `/apis/<group>/<version>/namespaces/<ns>/<plural>`.
pub fn collection_path(namespace: &str, plural: &str) -> String {
    format!("/apis/{GROUP}/{VERSION}/namespaces/{}/{plural}", escape(namespace))
}

/// `/apis/<group>/<version>/namespaces/<ns>/<plural>/<name>`.
pub fn object_path(namespace: &str, plural: &str, name: &str) -> String {
    format!("{}/{}", collection_path(namespace, plural), escape(name))
}

/// The collection filtered to one object by name: a LIST answers with the
/// collection's current resourceVersion (the revision the read saw), which a GET
/// of the object does not tell.
pub fn named_list_path(namespace: &str, plural: &str, name: &str) -> String {
    format!("{}?fieldSelector={}", collection_path(namespace, plural), escape(&format!("metadata.name={name}")))
}

/// The object named `name` in the answer to [`named_list_path`] (an empty list
/// when there is none; the field selector makes any other item a server's bug,
/// so only the name is trusted).
pub fn named_item<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.get("items")?.as_array()?.iter().find(|o| o.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
}

/// Percent-encodes everything but unreserved URL characters. Valid object names
/// never need it; an invalid one (a `network_name` with `/`, say) must still
/// reach the apiserver as one path segment and be rejected there by name.
pub fn escape(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A new `IPPool` holding `entries` (each as whereabouts writes it: the pool
/// document's entry, in its Go struct's field order).
pub fn new_pool(name: &str, namespace: &str, cidr: &str, entries: &[&Allocation]) -> Value {
    let allocations: Map<String, Value> = entries.iter().map(|a| (a.offset.to_string(), entry_value(a))).collect();
    json!({
        "apiVersion": api_version(),
        "kind": "IPPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"range": cidr, "allocations": allocations},
    })
}

/// A new `OverlappingRangeIPReservation` for `holder`'s address.
/// The label thereabouts puts on every reservation it creates: a hash of the
/// attachment (container ID and interface) that reserved it. A DEL finds with it,
/// in one LIST, the reservations an ADD of the same attachment made and could
/// not clean up (the apiserver went away mid-ADD, the process was killed): the
/// pools hold no entry for those, so nothing else leads to them. Whereabouts
/// ignores labels; its own reservations carry none and are found by name.
pub const ATTACHMENT_LABEL: &str = "thereabouts.cni.dev/attachment";

/// The [`ATTACHMENT_LABEL`] value: FNV-1a (64-bit) of container ID, a NUL and the
/// interface, as 16 hex digits. A container ID is 64 characters, over a label
/// value's 63; a collision only makes the LIST return a reservation the DEL
/// then checks by its fields and leaves alone.
pub fn attachment_label(container_id: &str, ifname: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in container_id.bytes().chain([0]).chain(ifname.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The collection path listing the reservations labelled for one attachment.
pub fn attachment_reservations_path(namespace: &str, container_id: &str, ifname: &str) -> String {
    reservations_selected(namespace, &format!("{ATTACHMENT_LABEL}={}", attachment_label(container_id, ifname)))
}

/// The collection path listing the reservations labelled for any of
/// `labels` ([`attachment_label`] values), with one set-based selector.
pub fn labelled_reservations_path(namespace: &str, labels: &[String]) -> String {
    reservations_selected(namespace, &format!("{ATTACHMENT_LABEL} in ({})", labels.join(",")))
}

/// The collection path listing the reservations that label `selector` selects.
fn reservations_selected(namespace: &str, selector: &str) -> String {
    format!("{}?labelSelector={}", collection_path(namespace, RESERVATIONS), escape(selector))
}

pub fn new_reservation(name: &str, namespace: &str, holder: &Allocation) -> Value {
    json!({
        "apiVersion": api_version(),
        "kind": "OverlappingRangeIPReservation",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {ATTACHMENT_LABEL: attachment_label(&holder.container_id, &holder.ifname)},
        },
        "spec": reservation_spec(holder),
    })
}

/// An `OverlappingRangeIPReservation`'s spec for `holder`, with its claim
/// (the fields of `pool_document::claim_fields`) when one owns it.
fn reservation_spec(holder: &Allocation) -> Value {
    let mut spec = json!({"containerid": holder.container_id, "podref": holder.pod_ref, "ifname": holder.ifname});
    let (ipamclaimref, resourceclaimref) = claim_fields(holder.claim.as_ref());
    for (field, value) in [("ipamclaimref", ipamclaimref), ("resourceclaimref", resourceclaimref)] {
        if !value.is_empty() {
            spec[field] = json!(value);
        }
    }
    spec
}

/// What a pool object holds, as far as allocation is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolObject {
    pub resource_version: String,
    pub range: Option<String>,
    /// One per parsable key, in document order.
    pub entries: Vec<Allocation>,
    /// The key text each offset is stored under (whereabouts writes `%d`; a key
    /// such as `05` must still be removed under its own name).
    pub keys: BTreeMap<u128, String>,
    /// The `id` member of each entry exactly as stored (`null` when missing): what
    /// a removal or container-ID update tests before it touches the entry.
    pub ids: BTreeMap<u128, Value>,
    /// Whether `spec.allocations` is a map (it may be missing or null).
    pub has_allocations: bool,
    /// Keys that are no offset at all; ignored, as whereabouts ignores them.
    pub unparsable: Vec<String>,
}

/// An allocation key: a decimal offset (the engine's decoder, shared with
/// `thereabouts preview --from-objects` and the playground).
pub use thereabouts_allocator::objects::parse_key;

/// Reads an `IPPool` object (a GET's or PATCH's answer): the engine's decoding
/// of its entries ([`objects::pool_entries`]), with what a patch needs beside
/// them (the resourceVersion, each entry's key and stored `id`).
pub fn parse_pool(object: &Value) -> Result<PoolObject, String> {
    let resource_version =
        object.pointer("/metadata/resourceVersion").and_then(Value::as_str).filter(|v| !v.is_empty()).ok_or("it has no metadata.resourceVersion")?.to_string();
    let decoded = objects::pool_entries(object).map_err(|e| e.to_string())?;
    let mut pool = PoolObject {
        resource_version,
        range: decoded.range.map(str::to_string),
        has_allocations: decoded.has_allocations,
        unparsable: decoded.unparsable,
        ..PoolObject::default()
    };
    for keyed in decoded.entries {
        let offset = keyed.entry.offset;
        pool.keys.insert(offset, keyed.key.to_string());
        pool.ids.insert(offset, keyed.stored.get("id").cloned().unwrap_or(Value::Null));
        pool.entries.push(keyed.entry);
    }
    Ok(pool)
}

/// The owner of a reservation, as read (the engine's one decoder of
/// whereabouts' objects, with the ownership rules beside it).
pub use objects::Reservation as ReservationObject;

pub fn parse_reservation(object: &Value) -> ReservationObject {
    objects::reservation(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(offset: u128, id: &str, pod: &str, ifname: &str) -> Allocation {
        Allocation { offset, container_id: id.into(), pod_ref: pod.into(), ifname: ifname.into(), claim: None }
    }

    #[test]
    fn reservations_carry_their_attachment_as_a_label_the_del_can_select() {
        let holder = alloc(1, &"c".repeat(64), "default/pod", "eth0");
        let orip = new_reservation("192.0.2.1", "kube-system", &holder);
        let label = orip["metadata"]["labels"][ATTACHMENT_LABEL].as_str().unwrap();
        // A valid label value: at most 63 characters, alphanumeric.
        assert_eq!(label.len(), 16);
        assert!(label.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(label, attachment_label(&holder.container_id, "eth0"));
        assert_ne!(label, attachment_label(&holder.container_id, "net1"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(attachment_label("ab", "c"), attachment_label("a", "bc"));
        assert_eq!(
            attachment_reservations_path("ns", "x", "eth0"),
            format!(
                "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/ns/overlappingrangeipreservations?labelSelector=thereabouts.cni.dev%2Fattachment%3D{}",
                attachment_label("x", "eth0")
            )
        );
        let parsed = parse_reservation(&orip);
        assert_eq!(parsed.name, "192.0.2.1");
        assert!(parsed.is_made_by(&holder.container_id, "eth0"));
        assert!(!parsed.is_made_by(&holder.container_id, "net1"));
        assert!(!parsed.is_made_by("other", "eth0"));
    }

    #[test]
    fn paths_follow_the_api_layout() {
        assert_eq!(object_path("kube-system", IPPOOLS, "192.0.2.0-24"), "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/ippools/192.0.2.0-24");
        assert_eq!(collection_path("ns", RESERVATIONS), "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/ns/overlappingrangeipreservations");
        assert_eq!(object_path("ns", IPPOOLS, "a/b c"), "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/ns/ippools/a%2Fb%20c");
        assert_eq!(
            named_list_path("ns", IPPOOLS, "192.0.2.0-24"),
            "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/ns/ippools?fieldSelector=metadata.name%3D192.0.2.0-24"
        );
    }

    #[test]
    fn a_list_by_name_yields_only_the_object_of_that_name() {
        let list = serde_json::json!({"items": [{"metadata": {"name": "other"}}, {"metadata": {"name": "a"}, "spec": {}}]});
        assert_eq!(named_item(&list, "a"), Some(&list["items"][1]));
        assert_eq!(named_item(&list, "b"), None);
        assert_eq!(named_item(&serde_json::json!({"kind": "Status"}), "a"), None);
    }

    #[test]
    fn keys_are_decimal_offsets_with_whereabouts_negative_keys() {
        assert_eq!(parse_key("0"), Some(0));
        assert_eq!(parse_key("17"), Some(17));
        assert_eq!(parse_key("05"), Some(5));
        assert_eq!(parse_key("18446744073709551616"), Some(1u128 << 64));
        // Issue #83's key in pool caa5---64: 0xcaa5000000000001 as int64.
        assert_eq!(parse_key("-3844666706890850303"), Some(0xcaa5_0000_0000_0001));
        for bad in ["", "x", "+1", "1.5", " 1", "-0", "--1"] {
            assert_eq!(parse_key(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn pools_parse_as_whereabouts_writes_them() {
        let object = json!({
            "apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
            "metadata": {"name": "192.0.2.0-24", "resourceVersion": "42"},
            "spec": {"range": "192.0.2.0/24", "allocations": {
                "1": {"id": "c1", "podref": "default/a", "ifname": "eth0"},
                "05": {"id": "c5", "podref": "default/b"},
                "bogus": {"id": "x", "podref": "y"}
            }}
        });
        let pool = parse_pool(&object).unwrap();
        assert_eq!(pool.resource_version, "42");
        assert_eq!(pool.range.as_deref(), Some("192.0.2.0/24"));
        assert!(pool.has_allocations);
        assert_eq!(pool.entries, vec![alloc(1, "c1", "default/a", "eth0"), alloc(5, "c5", "default/b", "")]);
        assert_eq!(pool.keys.get(&5).map(String::as_str), Some("05"));
        assert_eq!(pool.ids.get(&5), Some(&json!("c5")));
        assert_eq!(pool.unparsable, vec!["bogus".to_string()]);

        let bare = parse_pool(&json!({"metadata": {"resourceVersion": "1"}, "spec": {"range": "192.0.2.0/24", "allocations": null}})).unwrap();
        assert!(!bare.has_allocations && bare.entries.is_empty());
        assert!(parse_pool(&json!({"metadata": {}, "spec": {}})).is_err());
        assert!(parse_pool(&json!({"metadata": {"resourceVersion": "1"}, "spec": {"allocations": []}})).is_err());
    }

    #[test]
    fn new_objects_have_the_whereabouts_shape() {
        let a = alloc(7, "cid", "ns/pod", "net1");
        assert_eq!(
            new_pool("blue-192.0.2.0-24", "kube-system", "192.0.2.0/24", &[&a]),
            json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
                   "metadata": {"name": "blue-192.0.2.0-24", "namespace": "kube-system"},
                   "spec": {"range": "192.0.2.0/24", "allocations": {"7": {"id": "cid", "podref": "ns/pod", "ifname": "net1"}}}})
        );
        assert_eq!(
            new_reservation("192.0.2.7", "kube-system", &a),
            json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "OverlappingRangeIPReservation",
                   "metadata": {"name": "192.0.2.7", "namespace": "kube-system",
                                "labels": {ATTACHMENT_LABEL: attachment_label("cid", "net1")}},
                   "spec": {"containerid": "cid", "podref": "ns/pod", "ifname": "net1"}})
        );
    }

    #[test]
    fn reservation_ownership() {
        let holder = alloc(7, "cid", "ns/pod", "net1");
        let r = |pod: &str, ifname: &str, cid: &str| ReservationObject {
            uid: "u".into(),
            podref: pod.into(),
            ifname: ifname.into(),
            containerid: cid.into(),
            ..Default::default()
        };
        assert!(r("ns/pod", "net1", "other").is_held_by(&holder), "same pod and interface; the container may change");
        assert!(r("ns/pod", "", "").is_held_by(&holder), "pre-v0.8.0 reservation without ifname");
        assert!(!r("ns/pod", "net2", "cid").is_held_by(&holder));
        assert!(!r("ns/other", "net1", "cid").is_held_by(&holder));
        // A fresh ADD takes over its own container's or whereabouts' reservation
        // only, not one another container of the pod made (its DEL frees it).
        assert!(r("ns/pod", "net1", "cid").is_adoptable_by(&holder) && r("ns/pod", "net1", "").is_adoptable_by(&holder));
        assert!(!r("ns/pod", "net1", "other").is_adoptable_by(&holder));
        let bare = alloc(7, "cid", "", "eth0");
        assert!(r("", "eth0", "cid").is_held_by(&bare) && !r("", "eth0", "x").is_held_by(&bare));
        let object = json!({"metadata": {"uid": "abc", "resourceVersion": "17"}, "spec": {"podref": "ns/pod", "ifname": "net1"}});
        assert_eq!(parse_reservation(&object), ReservationObject { resource_version: "17".into(), uid: "abc".into(), ..r("ns/pod", "net1", "") });
    }
}
