use serde_json::{Value, json};

use super::*;
use crate::error::code;

fn config(ipam: &str) -> NormalizedConfig {
    crate::normalize(&format!(r#"{{"cniVersion":"1.0.0","name":"net1","ipam":{{"type":"thereabouts",{ipam}}}}}"#), None, "").unwrap()
}

fn list(items: Value) -> String {
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

fn ippool(name: &str, range: &str, allocations: Value) -> Value {
    json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
           "metadata": {"name": name, "namespace": "kube-system"}, "spec": {"range": range, "allocations": allocations}})
}

fn orip(name: &str, podref: &str) -> Value {
    json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "OverlappingRangeIPReservation",
           "metadata": {"name": name, "namespace": "kube-system"}, "spec": {"podref": podref, "ifname": "net1"}})
}

fn taken(state: &ClusterState, pool: &str) -> (Vec<u128>, Vec<u128>) {
    let p = state.pools.iter().find(|p| p.name == pool).unwrap();
    (p.snapshot.entries().collect(), p.snapshot.reserved.clone())
}

#[test]
fn a_dump_gives_the_configs_pools_with_claim_owned_entries_reservations_and_claims() {
    let c = config(r#""range":"192.0.2.0/24","network_name":"blue""#);
    let objects = list(json!([
        ippool("blue-192.0.2.0-24", "192.0.2.0/24", json!({
            "1": {"id": "c1", "podref": "ns/a", "ifname": "net1"},
            "3": {"id": "c3", "podref": "ns/virt-launcher-vm1", "ifname": "net1", "ipamclaimref": "ns/vm1.blue"}})),
        ippool("192.0.2.0-24", "192.0.2.0/24", json!({"9": {"id": "x", "podref": "ns/other"}})),
        orip("blue-192.0.2.1", "ns/a"),
        orip("blue-192.0.2.2", "ns/racer"),
        orip("192.0.2.4", "ns/unscoped"),
        {"apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim", "metadata": {"name": "vm1.blue", "namespace": "ns"},
         "spec": {"network": "blue", "interface": "net1"}, "status": {"ips": ["192.0.2.3/24"], "ownerPod": {"name": "virt-launcher-vm1"}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}},
    ]));
    let state = cluster_pools(&c, &objects).unwrap();
    assert_eq!(taken(&state, "blue-192.0.2.0-24"), (vec![1, 3], vec![2]), "the racer's reservation is taken; a's is its entry's");
    assert_eq!(state.entries.len(), 2);
    assert_eq!((state.entries[1].ip.as_str(), state.entries[1].pool_object.as_str()), ("192.0.2.3", "blue-192.0.2.0-24"));
    assert_eq!(state.entries[1].allocation.claim, Some(Claim::IpamClaim("ns/vm1.blue".into())));
    assert_eq!(
        state.reserved,
        [ReservedAddress { range_index: 0, ip: "192.0.2.2".into(), name: "blue-192.0.2.2".into(), pod_ref: "ns/racer".into(), claim: None }]
    );
    assert_eq!(
        state.ipam_claims,
        [IpamClaimFound {
            name: "ns/vm1.blue".into(),
            network: "blue".into(),
            interface: "net1".into(),
            ips: vec!["192.0.2.3/24".into()],
            owner_pod: "virt-launcher-vm1".into()
        }]
    );
    let ignored: Vec<(&str, &str)> = state.ignored.iter().map(|i| (i.kind.as_str(), i.name.as_str())).collect();
    assert_eq!(ignored, [("IPPool", "192.0.2.0-24"), ("ConfigMap", "cm"), ("OverlappingRangeIPReservation", "192.0.2.4")]);
    // What the next pods get: around the entries and the racer's reservation.
    let table = crate::preview(&c, &state.pools, 3);
    assert_eq!(table.addresses, "192.0.2.4/24\n192.0.2.5/24\n192.0.2.6/24");
}

#[test]
fn one_object_is_read_as_a_list_of_one_and_wide_or_negative_keys_keep_their_offsets() {
    let c = config(r#""range":"2001:db8::/64""#);
    let pool = ippool("2001-db8---64", "2001:db8::/64", json!({"-1": {"id": "old", "podref": "ns/old"}, "2": {"id": "c", "podref": "ns/p"}}));
    let state = cluster_pools(&c, &pool.to_string()).unwrap();
    assert!(state.ignored.is_empty());
    assert_eq!(taken(&state, "2001-db8---64").0, [2, u128::from(u64::MAX)]);
    assert_eq!(state.entries[1].ip, "2001:db8::ffff:ffff:ffff:ffff");
    // An IPv6 reservation's name: `:` as `-`.
    let reserved = list(json!([pool, orip("2001-db8--5", "ns/x"), orip("2001-db8--2", "ns/p")]));
    assert_eq!(taken(&cluster_pools(&c, &reserved).unwrap(), "2001-db8---64").1, [5]);
}

#[test]
fn a_sliced_range_reads_every_nodes_pool_through_its_node_slice_pool() {
    let c = config(r#""range":"192.0.2.0/24","node_slice_size":"/28","network_name":"blue""#);
    let slices = json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "NodeSlicePool", "metadata": {"name": "blue"},
        "spec": {"range": "192.0.2.0/24", "sliceSize": "/28"},
        "status": {"allocations": [{"nodeName": "node-a", "sliceRange": "192.0.2.0/28"}, {"nodeName": "", "sliceRange": "192.0.2.16/28"},
                                   {"nodeName": "node-b", "sliceRange": "192.0.2.32/28"}]}});
    let objects = list(json!([
        slices,
        ippool("blue-node-a-192.0.2.0-28", "192.0.2.0/28", json!({"1": {"id": "a", "podref": "ns/a"}})),
        ippool("blue-node-b-192.0.2.32-28", "192.0.2.32/28", json!({"1": {"id": "b", "podref": "ns/b"}, "2": {"id": "c", "podref": "ns/c"}})),
    ]));
    let state = cluster_pools(&c, &objects).unwrap();
    assert_eq!(taken(&state, "blue-192.0.2.0-24").0, [1, 33, 34]);
    assert_eq!(state.entries.iter().map(|e| e.ip.as_str()).collect::<Vec<_>>(), ["192.0.2.1", "192.0.2.33", "192.0.2.34"]);
    assert!(state.ignored.is_empty(), "{:?}", state.ignored);
}

#[test]
fn without_overlapping_ranges_reservations_are_not_read() {
    let c = config(r#""range":"192.0.2.0/24","enable_overlapping_ranges":false"#);
    let state = cluster_pools(&c, &list(json!([orip("192.0.2.1", "ns/a")]))).unwrap();
    assert!(state.pools[0].snapshot.reserved.is_empty());
    assert_eq!(state.ignored.len(), 1);
}

#[test]
fn bad_input_is_an_error_naming_what_is_wrong() {
    let c = config(r#""range":"192.0.2.0/24""#);
    let bad_pool = list(json!([ippool("192.0.2.0-24", "192.0.2.0/24", json!([1, 2]))]));
    for (objects, field, says) in [
        ("not json", "objects", "not JSON"),
        ("[1, 2]", "objects", "a List with items"),
        (r#"{"items": 3}"#, "objects.items", "not a list"),
        (r#"{"metadata": {}}"#, "objects", "a List with items"),
        (bad_pool.as_str(), "objects.items[0].spec.allocations", "IPPool 192.0.2.0-24: spec.allocations is not an object"),
    ] {
        let e = cluster_pools(&c, objects).unwrap_err();
        assert_eq!((e.code, e.field.as_str()), (code::DECODE.number(), field), "{objects}");
        assert!(e.message.contains(says), "{objects}: {}", e.message);
    }
    // A foreign pool's broken allocations do not matter; an empty list is an empty cluster.
    let foreign = list(json!([ippool("other-192.0.2.0-24", "192.0.2.0/24", json!("x")), 7]));
    assert_eq!(cluster_pools(&c, &foreign).unwrap().ignored.len(), 2);
    assert!(cluster_pools(&c, r#"{"kind": "List", "items": []}"#).unwrap().entries.is_empty());
}
