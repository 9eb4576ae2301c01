//! whereabouts.md §2 (allocation) as tests.

use super::*;
use crate::range::{RangeSpec, normalize_range};

fn range(text: &str) -> NormalizedRange {
    range_with(text, &[])
}

fn range_with(text: &str, exclude: &[&str]) -> NormalizedRange {
    let spec = RangeSpec { path: "ipam".into(), range: text.into(), exclude: exclude.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    normalize_range(&spec, None, "").unwrap()
}

fn req(pod: &str, ifname: &str) -> Request {
    Request { container_id: format!("c-{pod}-{ifname}"), pod_ref: format!("default/{pod}"), ifname: ifname.into(), requested_ip: None }
}

fn taken(offsets: &[u128]) -> PoolSnapshot {
    PoolSnapshot::with_taken(offsets.iter().copied())
}

fn fresh_ip(outcome: PlanOutcome) -> String {
    match outcome {
        PlanOutcome::Fresh { assignment } => assignment.address,
        other => panic!("expected a fresh address, got {other:?}"),
    }
}

#[test]
fn lowest_free_first_and_holes_refilled() {
    let r = range("192.0.2.0/24");
    assert_eq!(fresh_ip(plan(&r, &taken(&[]), &req("a", "eth0"))), "192.0.2.1/24");
    assert_eq!(fresh_ip(plan(&r, &taken(&[1, 2, 3]), &req("a", "eth0"))), "192.0.2.4/24");
    assert_eq!(fresh_ip(plan(&r, &taken(&[1, 3, 2, 5]), &req("a", "eth0"))), "192.0.2.4/24");
    assert_eq!(fresh_ip(plan(&r, &taken(&[2, 3]), &req("a", "eth0"))), "192.0.2.1/24", "hole at the start refilled");
}

#[test]
fn storage_offset_is_the_distance_from_the_network_address() {
    let r = range("192.168.1.0/24");
    let PlanOutcome::Fresh { assignment } = plan(&r, &taken(&[]), &req("a", "eth0")) else { panic!() };
    assert_eq!((assignment.ip.as_str(), assignment.offset), ("192.168.1.1", 1));
}

#[test]
fn excluded_blocks_are_skipped() {
    let r = range_with("192.0.2.0/24", &["192.0.2.0/28", "192.0.2.17"]);
    assert_eq!(fresh_ip(plan(&r, &taken(&[]), &req("a", "eth0"))), "192.0.2.16/24");
    assert_eq!(fresh_ip(plan(&r, &taken(&[16]), &req("a", "eth0"))), "192.0.2.18/24");
    // Huge exclude inside a huge range: whereabouts.md §2.2 (2001:db8::/30 minus 2001:db8::/32).
    let r = range_with("2001:db8::/30", &["2001:db8::/32"]);
    assert_eq!(fresh_ip(plan(&r, &taken(&[]), &req("a", "eth0"))), "2001:db9::/30");
}

#[test]
fn exhaustion_uses_the_whereabouts_message() {
    let r = range_with("192.0.2.0/29", &["192.0.2.1", "192.0.2.2/31"]);
    let out = plan(&r, &taken(&[4, 5, 6]), &req("a", "eth0"));
    assert_eq!(
        out,
        PlanOutcome::Exhausted {
            message: "Could not allocate IP in range: ip: 192.0.2.1 / - 192.0.2.6 / range: 192.0.2.0/29 / excludeRanges: [192.0.2.1 192.0.2.2/31]".into()
        }
    );
}

#[test]
fn reserved_offsets_count_as_taken() {
    let r = range("192.0.2.0/24");
    let pool = PoolSnapshot { reserved: vec![2], ..taken(&[1]) };
    assert_eq!(fresh_ip(plan(&r, &pool, &req("a", "eth0"))), "192.0.2.3/24");
}

#[test]
fn same_pod_and_interface_reuses_its_address() {
    let r = range("192.0.2.0/24");
    let held = vec![
        Allocation { offset: 7, container_id: "old".into(), pod_ref: "default/a".into(), ifname: "net1".into() },
        Allocation { offset: 9, container_id: "old".into(), pod_ref: "default/a".into(), ifname: "net2".into() },
    ];
    let pool = PoolSnapshot { held, ..taken(&[7, 9]) };
    match plan(&r, &pool, &req("a", "net2")) {
        PlanOutcome::Reuse { assignment, held_index } => assert_eq!((assignment.address.as_str(), held_index), ("192.0.2.9/24", 1)),
        other => panic!("{other:?}"),
    }
    // Same pod, other interface: a new address.
    assert_eq!(fresh_ip(plan(&r, &pool, &req("a", "net3"))), "192.0.2.1/24");
}

#[test]
fn without_pod_ref_container_id_and_ifname_identify_the_attachment() {
    let r = range("192.0.2.0/24");
    let held = vec![Allocation { offset: 4, container_id: "ctr".into(), pod_ref: String::new(), ifname: "eth0".into() }];
    let pool = PoolSnapshot { held, ..taken(&[4]) };
    let request = Request { container_id: "ctr".into(), pod_ref: String::new(), ifname: "eth0".into(), requested_ip: None };
    assert!(matches!(plan(&r, &pool, &request), PlanOutcome::Reuse { .. }));
}

#[test]
fn release_matches_container_id_and_ifname() {
    let entries = vec![
        Allocation { offset: 1, container_id: "a".into(), pod_ref: "ns/p".into(), ifname: "eth0".into() },
        Allocation { offset: 2, container_id: "a".into(), pod_ref: "ns/p".into(), ifname: "net1".into() },
        Allocation { offset: 3, container_id: "b".into(), pod_ref: "ns/q".into(), ifname: "eth0".into() },
    ];
    assert_eq!(release(&entries, "a", "eth0"), [0]);
    assert_eq!(release(&entries, "a", "net1"), [1]);
    assert!(release(&entries, "zzz", "eth0").is_empty());
}

#[test]
fn any_ipv6_range_size_works_with_exact_offsets() {
    // whereabouts only reads offsets < 2^63: start far into a /32 exercises > 64 bits.
    let spec = RangeSpec { path: "ipam".into(), range: "2001:db8::/32".into(), range_start: "2001:db8:1::1".parse().ok(), ..Default::default() };
    let r = normalize_range(&spec, None, "").unwrap();
    let PlanOutcome::Fresh { assignment } = plan(&r, &taken(&[]), &req("a", "eth0")) else { panic!() };
    assert_eq!(assignment.ip, "2001:db8:1::1");
    assert_eq!(assignment.offset, (1u128 << 80) + 1);
    let PlanOutcome::Fresh { assignment } = plan(&r, &taken(&[(1u128 << 80) + 1]), &req("a", "eth0")) else { panic!() };
    assert_eq!(assignment.ip, "2001:db8:1::2");
}

#[test]
fn requested_address_is_honoured_or_rejected_with_a_reason() {
    let r = range_with("192.0.2.0/24", &["192.0.2.50"]);
    let mut request = req("a", "eth0");
    request.requested_ip = Some("192.0.2.77".into());
    assert_eq!(fresh_ip(plan(&r, &taken(&[1]), &request)), "192.0.2.77/24");
    for (ip, why) in [("192.0.2.77", "already allocated"), ("192.0.2.50", "excluded"), ("198.51.100.1", "outside range"), ("192.0.2.255", "outside the allocatable span")] {
        request.requested_ip = Some(ip.into());
        match plan(&r, &taken(&[77]), &request) {
            PlanOutcome::Rejected { message } => assert!(message.contains(why), "{ip}: {message}"),
            other => panic!("{ip}: {other:?}"),
        }
    }
}

fn config(ranges: &[&str]) -> NormalizedConfig {
    let ipam: Vec<_> = ranges.iter().map(|r| serde_json::json!({"range": r})).collect();
    let text = serde_json::json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "thereabouts", "ipRanges": ipam}}).to_string();
    crate::normalize(&text, None, "").unwrap()
}

#[test]
fn plan_all_gives_one_address_per_range_in_order() {
    let c = config(&["192.0.2.0/24", "2001:db8::/64"]);
    let out = plan_all(&c, &[taken(&[1]), taken(&[])], &req("a", "eth0")).unwrap();
    let addrs: Vec<_> = out.iter().map(|o| o.assignment().unwrap().address.clone()).collect();
    assert_eq!(addrs, ["192.0.2.2/24", "2001:db8::1/64"]);
}

#[test]
fn plan_all_fails_whole_when_one_range_is_exhausted() {
    let c = config(&["192.0.2.0/24", "198.51.100.0/30"]);
    let out = plan_all(&c, &[taken(&[]), taken(&[1, 2])], &req("a", "eth0"));
    assert!(matches!(out, Err(PlanOutcome::Exhausted { .. })));
}

#[test]
fn plan_all_never_hands_one_address_out_twice_in_a_config() {
    // The same range twice (N addresses from one pool) and a range inside another.
    let c = config(&["192.0.2.0/24", "192.0.2.0/24", "192.0.2.0/28"]);
    let out = plan_all(&c, &[taken(&[]), taken(&[]), taken(&[])], &req("a", "eth0")).unwrap();
    let addrs: Vec<_> = out.iter().map(|o| o.assignment().unwrap().ip.clone()).collect();
    assert_eq!(addrs, ["192.0.2.1", "192.0.2.2", "192.0.2.3"]);
}

#[test]
fn preview_lists_successive_pods_and_marks_exhaustion() {
    let c = config(&["192.0.2.0/30", "2001:db8::/64"]);
    let pods = preview(&c, &[], 3);
    let show = |o: &PlanOutcome| o.assignment().map(|a| a.address.clone()).unwrap_or_else(|| "exhausted".into());
    let table: Vec<Vec<String>> = pods.iter().map(|p| p.iter().map(show).collect()).collect();
    assert_eq!(table, [["192.0.2.1/30", "2001:db8::1/64"], ["192.0.2.2/30", "2001:db8::2/64"], ["exhausted", "exhausted"]]);
    assert!(matches!(pods[2][0], PlanOutcome::Exhausted { .. }), "the range that ran out");
    assert!(matches!(pods[2][1], PlanOutcome::Rejected { .. }), "the ADD fails as a whole: nothing from the other range");
    // From a given pool state: holes first.
    let pods = preview(&c, &[taken(&[2]), taken(&[1, 3])], 2);
    assert_eq!(show(&pods[0][0]), "192.0.2.1/30");
    assert_eq!(show(&pods[0][1]), "2001:db8::2/64");
    assert!(matches!(pods[1][0], PlanOutcome::Exhausted { .. }), "192.0.2.0/30 is full after pod 1");
    assert!(matches!(pods[1][1], PlanOutcome::Rejected { .. }));
}

#[test]
fn preview_of_a_shared_pool_matches_successive_adds() {
    // Found by the playground: two entries of one range must interleave like ADDs.
    let c = config(&["192.0.2.0/24", "192.0.2.0/24"]);
    let pods = preview(&c, &[], 3);
    let ips: Vec<Vec<String>> = pods.iter().map(|p| p.iter().map(|o| o.assignment().unwrap().ip.clone()).collect()).collect();
    assert_eq!(ips, [["192.0.2.1", "192.0.2.2"], ["192.0.2.3", "192.0.2.4"], ["192.0.2.5", "192.0.2.6"]]);
}

#[test]
fn preview_table_is_preview_in_bulk() {
    let c = config(&["192.0.2.0/30", "2001:db8::/64"]);
    let table = preview_table(&c, &[], 4);
    assert_eq!(table.served, 2);
    assert_eq!(table.addresses, "192.0.2.1/30 2001:db8::1/64\n192.0.2.2/30 2001:db8::2/64");
    assert_eq!(table.offsets, [1, 1, 2, 2]);
    let failure = table.failure.expect("pod 3 fails");
    assert_eq!(failure.range_index, 0);
    assert!(failure.exhausted.starts_with("Could not allocate IP in range"));
    let full = preview(&c, &[], 4);
    assert_eq!(full[2][0], PlanOutcome::Exhausted { message: failure.exhausted.clone() });
    assert_eq!(full[2][1], PlanOutcome::Rejected { message: failure.rejected.clone() });
    assert_eq!(preview_table(&c, &[], 2).failure, None);
    // The range that runs out is not the first one (found by the playground's parity test).
    let c = config(&["2001:db8::/64", "192.0.2.0/30"]);
    let failure = preview_table(&c, &[], 3).failure.expect("pod 3 fails");
    assert_eq!(failure.range_index, 1);
    assert!(failure.exhausted.contains("192.0.2.0/30"), "{}", failure.exhausted);
    assert!(failure.rejected.starts_with("not allocated"), "{}", failure.rejected);
}
