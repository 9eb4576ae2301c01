//! Objects as the apiserver may return them, hand-edited or corrupt: IPPools,
//! OverlappingRangeIPReservations, NodeSlicePools and their slice objects,
//! IPAMClaims, and a whole `kubectl get ... -o json` list as `preview
//! --from-objects` and the playground read it. Whatever the JSON holds, the
//! readers decode or refuse it; an entry they accept is an address of its
//! range, and a node's slice lies inside the range it divides.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use thereabouts::datastore::kubernetes::crd;
use thereabouts::datastore::kubernetes::slices::{SliceObject, SliceTable};
use thereabouts_allocator::model::{Allocation, NormalizedConfig};
use thereabouts_allocator::{cluster_pools, normalize, objects, planner, slices};

fn config(ipam: &str) -> NormalizedConfig {
    let stdin = format!(r#"{{"cniVersion":"1.0.0","name":"fuzz","type":"bridge","ipam":{ipam}}}"#);
    normalize(&stdin, None, "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod").expect("the target's config is valid")
}

/// Two ranges that overlap a third's network, as `preview --from-objects` reads.
fn plain() -> &'static NormalizedConfig {
    static CONFIG: OnceLock<NormalizedConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        config(r#"{"type":"thereabouts","datastore":"kubernetes","kubernetes":{"kubeconfig":"/k"},"ipRanges":[{"range":"192.0.2.0/24","exclude":["192.0.2.0/29"]},{"range":"2001:db8::/120"},{"range":"192.0.2.64/26"}],"allowPersistentIPs":true}"#)
    })
}

/// A range divided among nodes.
fn sliced() -> &'static NormalizedConfig {
    static CONFIG: OnceLock<NormalizedConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        config(r#"{"type":"thereabouts","datastore":"kubernetes","kubernetes":{"kubeconfig":"/k"},"network_name":"blue","node_slice_size":"/28","ipRanges":[{"range":"198.51.100.0/24","range_start":"198.51.100.5"}]}"#)
    })
}

fn holder() -> Allocation {
    Allocation { offset: 9, container_id: "c1".into(), pod_ref: "ns/pod".into(), ifname: "net1".into(), claim: None }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(state) = cluster_pools(plain(), text) {
        for entry in &state.entries {
            let range = &plain().ranges[entry.range_index as usize];
            assert_eq!(planner::address_at(range, entry.allocation.offset).map(|ip| ip.to_string()), Some(entry.ip.clone()));
        }
    }
    let Ok(object) = serde_json::from_str::<Value>(text) else { return };
    if let Ok(pool) = crd::parse_pool(&object) {
        assert_eq!(pool.keys.len(), pool.entries.len(), "one key per entry");
        assert!(pool.entries.iter().all(|e| pool.keys.contains_key(&e.offset)));
    }
    let reservation = crd::parse_reservation(&object);
    let _ = (reservation.is_held_by(&holder()), reservation.is_adoptable_by(&holder()), reservation.is_made_by("c1", "net1"));
    let _ = objects::ipam_claim_status(&object);
    let _ = SliceObject::from_object(&object);
    if let Ok(table) = SliceTable::from_object(&object) {
        let range = &sliced().ranges[0];
        for (node, slice) in &table.allocations {
            if let Ok(part) = slices::in_slice(range, &sliced().network_name, node, slice) {
                assert!(range.network_contains(part.family, part.network + part.first_offset), "{slice} starts outside {}", range.cidr);
                assert!(range.network_contains(part.family, part.network + part.last_offset), "{slice} ends outside {}", range.cidr);
                assert!(part.network + part.first_offset >= range.network + range.first_offset, "{slice} starts before range_start");
            }
        }
    }
});
