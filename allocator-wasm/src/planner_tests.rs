//! whereabouts v0.9.4's allocation rules (`pkg/allocate/allocate.go`,
//! `pkg/iphelpers/iphelpers.go`) as tests.

use super::*;
use crate::model::Claim;
use crate::range::{RangeSpec, normalize_range};

fn range(text: &str) -> NormalizedRange {
    range_with(text, &[])
}

fn range_with(text: &str, exclude: &[&str]) -> NormalizedRange {
    let spec = RangeSpec { path: "ipam".into(), range: text.into(), exclude: exclude.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    normalize_range(&spec, None, "").unwrap()
}

fn req(pod: &str, ifname: &str) -> Request {
    Request {
        container_id: format!("c-{pod}-{ifname}"),
        pod_ref: format!("default/{pod}"),
        ifname: ifname.into(),
        requested_ip: None,
        contention: 0,
        guidance: None,
        preferred: Vec::new(),
        claim: None,
    }
}

fn taken(offsets: &[u128]) -> PoolSnapshot {
    PoolSnapshot::with_taken(offsets.iter().copied())
}

fn fresh_ip(outcome: Result<PlanOutcome, PlanFailure>) -> String {
    match outcome {
        Ok(PlanOutcome::Fresh { assignment }) => assignment.address,
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
    let Ok(PlanOutcome::Fresh { assignment }) = plan(&r, &taken(&[]), &req("a", "eth0")) else { panic!() };
    assert_eq!((assignment.ip.as_str(), assignment.offset), ("192.168.1.1", 1));
}

#[test]
fn excluded_blocks_are_skipped() {
    let r = range_with("192.0.2.0/24", &["192.0.2.0/28", "192.0.2.17"]);
    assert_eq!(fresh_ip(plan(&r, &taken(&[]), &req("a", "eth0"))), "192.0.2.16/24");
    assert_eq!(fresh_ip(plan(&r, &taken(&[16]), &req("a", "eth0"))), "192.0.2.18/24");
    // Huge exclude inside a huge range (2001:db8::/30 minus 2001:db8::/32), as whereabouts'
    // `IterateForAssignment` skips it in `pkg/allocate/allocate.go`.
    let r = range_with("2001:db8::/30", &["2001:db8::/32"]);
    assert_eq!(fresh_ip(plan(&r, &taken(&[]), &req("a", "eth0"))), "2001:db9::/30");
}

#[test]
fn exhaustion_uses_the_whereabouts_message() {
    let r = range_with("192.0.2.0/29", &["192.0.2.1", "192.0.2.2/31"]);
    let out = plan(&r, &taken(&[4, 5, 6]), &req("a", "eth0"));
    assert_eq!(
        out,
        Err(PlanFailure::Exhausted {
            message: "Could not allocate IP in range: ip: 192.0.2.1 / - 192.0.2.6 / range: 192.0.2.0/29 / excludeRanges: [192.0.2.1 192.0.2.2/31]".into()
        })
    );
}

#[test]
fn reserved_offsets_count_as_taken() {
    let r = range("192.0.2.0/24");
    let pool = PoolSnapshot { reserved: vec![2], ..taken(&[1]) };
    assert_eq!(fresh_ip(plan(&r, &pool, &req("a", "eth0"))), "192.0.2.3/24");
}

fn contended(pod: &str, contention: u32) -> Request {
    Request { contention, ..req(pod, "eth0") }
}

fn fresh_offset(outcome: Result<PlanOutcome, PlanFailure>) -> u128 {
    match outcome {
        Ok(PlanOutcome::Fresh { assignment }) => assignment.offset,
        other => panic!("expected a fresh address, got {other:?}"),
    }
}

#[test]
fn the_spread_window_grows_eightfold_per_conflict_up_to_1024() {
    let windows: Vec<usize> = [0, 1, 2, 3, 4, 5, 1000, u32::MAX].iter().map(|&c| spread_window(c)).collect();
    assert_eq!(windows, [1, 8, 64, 512, 1024, 1024, 1024, 1024]);
}

#[test]
fn without_contention_the_lowest_free_address_whatever_the_pod() {
    let r = range("192.0.2.0/24");
    for pod in 0..50 {
        assert_eq!(fresh_offset(plan(&r, &taken(&[1, 2, 4]), &contended(&format!("p{pod}"), 0))), 3);
    }
}

#[test]
fn under_contention_a_pod_takes_one_of_the_first_8_pow_c_free_addresses() {
    // Free, in order: 3, 6, 7, 9, 10, 11, ... (4, 5 excluded; 8 reserved).
    let r = range_with("192.0.2.0/24", &["192.0.2.4/31"]);
    let pool = PoolSnapshot { reserved: vec![8], ..taken(&[1, 2]) };
    let free: Vec<u128> = (1..=254).filter(|o| ![1, 2, 4, 5, 8].contains(o)).collect();
    for c in 1..=10u32 {
        let window = &free[..spread_window(c).min(free.len())];
        let mut seen = std::collections::BTreeSet::new();
        for pod in 0..1000 {
            let offset = fresh_offset(plan(&r, &pool, &contended(&format!("p{pod}"), c)));
            assert!(window.contains(&offset), "contention {c}: {offset} is not among the first {} free", window.len());
            seen.insert(offset);
        }
        // 1000 pods over the window: a uniform hash uses every candidate of a small
        // window and ~98% of 249 (1 - e^-4), the whole free part of the /24.
        let floor = if window.len() <= 32 { window.len() } else { window.len() * 9 / 10 };
        assert!(seen.len() >= floor, "contention {c}: 1000 pods used only {} of {} candidates", seen.len(), window.len());
    }
}

#[test]
fn the_contended_choice_is_deterministic_and_changes_with_the_contention() {
    let r = range("10.0.0.0/16");
    let pool = taken(&[1, 3]);
    let pick = |pod: &str, c: u32| fresh_offset(plan(&r, &pool, &contended(pod, c)));
    assert_eq!(pick("a", 5), pick("a", 5));
    // Over eight conflicts a pod does not keep landing on the same candidate.
    let picks: std::collections::BTreeSet<u128> = (1..=8).map(|c| pick("a", c)).collect();
    assert!(picks.len() > 1, "{picks:?}");
    // The interface is part of the hash: two interfaces of one container part too.
    let (eth0, net1) = (0..32).map(|i| format!("ctr-{i}")).fold((Vec::new(), Vec::new()), |(mut a, mut b), pod| {
        a.push(fresh_offset(plan(&r, &pool, &Request { contention: 8, ..req(&pod, "eth0") })));
        b.push(fresh_offset(plan(&r, &pool, &Request { contention: 8, ..req(&pod, "net1") })));
        (a, b)
    });
    assert_ne!(eth0, net1);
}

#[test]
fn contention_spreads_hundreds_of_racing_pods() {
    // 200 pods that all lost a race: at contention 1 they spread over 8
    // addresses (8 can win the next round), at 3 over the first 512 free
    // (a uniform pick gives ~165 distinct ones), instead of all 200 planning
    // the lowest free one as they do at contention 0.
    let r = range("10.0.0.0/16");
    let distinct =
        |c: u32| (0..200).map(|pod| fresh_offset(plan(&r, &taken(&[]), &contended(&format!("pod-{pod}"), c)))).collect::<std::collections::BTreeSet<_>>().len();
    assert_eq!(distinct(0), 1);
    assert_eq!(distinct(1), 8);
    assert!(distinct(3) > 150, "{}", distinct(3));
}

#[test]
fn contention_never_leaves_the_range_or_finds_more_than_is_free() {
    // Fewer free addresses than the window: one of those, never anything else.
    let r = range_with("192.0.2.0/29", &["192.0.2.3"]);
    for pod in 0..64 {
        let offset = fresh_offset(plan(&r, &taken(&[1, 2, 5]), &contended(&format!("p{pod}"), 8)));
        assert!([4, 6].contains(&offset), "{offset}");
        assert_eq!(fresh_offset(plan(&r, &taken(&[1, 2, 4, 5]), &contended(&format!("p{pod}"), 3))), 6);
    }
    assert_eq!(
        plan(&r, &taken(&[1, 2, 4, 5, 6]), &contended("p", 4)),
        Err(PlanFailure::Exhausted { message: exhausted_message(&r) }),
        "a full range is exhausted under contention too"
    );
    // A reused address and a requested one do not move under contention.
    let held = vec![Allocation { offset: 5, container_id: "old".into(), pod_ref: "default/p".into(), ifname: "eth0".into(), claim: None }];
    let pool = PoolSnapshot { held, ..taken(&[5]) };
    assert!(matches!(plan(&r, &pool, &contended("p", 6)), Ok(PlanOutcome::Reuse { held_index: 0, .. })));
    let requested = Request { requested_ip: Some("192.0.2.6".into()), ..contended("q", 6) };
    assert_eq!(fresh_offset(plan(&r, &taken(&[]), &requested)), 6);
}

#[test]
fn plan_all_under_contention_stays_disjoint_across_shared_pools() {
    let c = config(&["192.0.2.0/24", "192.0.2.0/24", "192.0.2.0/28"]);
    for pod in 0..100 {
        let out = plan_all(&c, &[], Reservations::AsRead, &contended(&format!("p{pod}"), 3)).unwrap();
        let ips: std::collections::BTreeSet<String> = out.iter().map(|o| o.assignment().ip.clone()).collect();
        assert_eq!(ips.len(), 3, "{ips:?}");
    }
}

#[test]
fn same_pod_and_interface_reuses_its_address() {
    let r = range("192.0.2.0/24");
    let held = vec![
        Allocation { offset: 7, container_id: "old".into(), pod_ref: "default/a".into(), ifname: "net1".into(), claim: None },
        Allocation { offset: 9, container_id: "old".into(), pod_ref: "default/a".into(), ifname: "net2".into(), claim: None },
    ];
    let pool = PoolSnapshot { held, ..taken(&[7, 9]) };
    match plan(&r, &pool, &req("a", "net2")) {
        Ok(PlanOutcome::Reuse { assignment, held_index }) => assert_eq!((assignment.address.as_str(), held_index), ("192.0.2.9/24", 1)),
        other => panic!("{other:?}"),
    }
    // Same pod, other interface: a new address.
    assert_eq!(fresh_ip(plan(&r, &pool, &req("a", "net3"))), "192.0.2.1/24");
}

#[test]
fn a_claim_keeps_its_address_across_pods_and_no_other_pod_takes_it() {
    let r = range("192.0.2.0/24");
    let vm = Claim::IpamClaim("default/vm.blue".into());
    let held = vec![Allocation { offset: 7, container_id: "old".into(), pod_ref: "default/launcher-1".into(), ifname: "net1".into(), claim: Some(vm.clone()) }];
    let pool = PoolSnapshot { held, ..taken(&[7]) };
    let launcher_2 = Request { claim: Some(vm), ..req("launcher-2", "net1") };
    assert!(matches!(plan(&r, &pool, &launcher_2), Ok(PlanOutcome::Reuse { held_index: 0, .. })));
    // The first launcher again, without the claim: the address is not its own.
    assert_eq!(fresh_ip(plan(&r, &pool, &req("launcher-1", "net1"))), "192.0.2.1/24");
    // Through plan_all, which makes a request per range: the claim goes with it.
    let c = config(&["192.0.2.0/24"]);
    let out = plan_all(&c, &[PoolState { name: "192.0.2.0-24".into(), snapshot: pool }], Reservations::AsRead, &launcher_2).unwrap();
    assert!(matches!(out[..], [PlanOutcome::Reuse { held_index: 0, .. }]), "{out:?}");
}

#[test]
fn a_del_never_releases_a_claims_entry() {
    let c = crate::normalize(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","range":"192.0.2.0/24"}}"#, None, "").unwrap();
    let claim = Some(Claim::IpamClaim("ns/vm.n".into()));
    let entries = vec![Allocation { offset: 1, container_id: "a".into(), pod_ref: "ns/p".into(), ifname: "eth0".into(), claim }];
    let who = Attachment { container_id: "a".into(), ifname: "eth0".into(), claim: None };
    assert!(release(&c.ranges[0], &c.network_name, &entries, &[who]).is_empty());
}

#[test]
fn a_devices_release_ends_its_own_entry_only() {
    let c = crate::normalize(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","range":"192.0.2.0/24"}}"#, None, "").unwrap();
    let device = |uid: &str| Some(Claim::ResourceClaim(uid.into()));
    let entry = |offset, ifname: &str, claim| Allocation { offset, container_id: "uid-1".into(), pod_ref: String::new(), ifname: ifname.into(), claim };
    let entries = vec![entry(1, "eth1", device("uid-1")), entry(2, "eth2", device("uid-1")), entry(3, "eth1", Some(Claim::IpamClaim("ns/vm".into())))];
    let who = |ifname: &str, claim| Attachment { container_id: "uid-1".into(), ifname: ifname.into(), claim };
    let indices = |a| release(&c.ranges[0], &c.network_name, &entries, &[a]).into_iter().map(|r| r.index).collect::<Vec<_>>();
    assert_eq!(indices(who("eth1", device("uid-1"))), [0], "its device, not the claim's other one, nor an IPAMClaim's");
    assert!(indices(who("eth1", None)).is_empty(), "a pod's DEL with the same container ID frees nothing of the claim");
    assert!(indices(who("eth1", device("uid-2"))).is_empty(), "another claim's release frees nothing");
    // A GC that found the IPAMClaim gone speaks for it, among other attachments.
    let gone = Some(Claim::IpamClaim("ns/vm".into()));
    let freed = release(&c.ranges[0], &c.network_name, &entries, &[who("eth1", gone), who("x", None)]);
    assert_eq!(freed.into_iter().map(|r| r.index).collect::<Vec<_>>(), [2]);
}

#[test]
fn without_pod_ref_container_id_and_ifname_identify_the_attachment() {
    let r = range("192.0.2.0/24");
    let held = vec![Allocation { offset: 4, container_id: "ctr".into(), pod_ref: String::new(), ifname: "eth0".into(), claim: None }];
    let pool = PoolSnapshot { held, ..taken(&[4]) };
    let request = Request {
        container_id: "ctr".into(),
        pod_ref: String::new(),
        ifname: "eth0".into(),
        requested_ip: None,
        contention: 0,
        guidance: None,
        preferred: Vec::new(),
        claim: None,
    };
    assert!(matches!(plan(&r, &pool, &request), Ok(PlanOutcome::Reuse { .. })));
}

#[test]
fn release_matches_container_id_and_ifname_and_names_the_reservations() {
    let c =
        crate::normalize(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","network_name":"blue","range":"192.0.2.0/24"}}"#, None, "").unwrap();
    let entries = vec![
        Allocation { offset: 1, container_id: "a".into(), pod_ref: "ns/p".into(), ifname: "eth0".into(), claim: None },
        Allocation { offset: 2, container_id: "a".into(), pod_ref: "ns/p".into(), ifname: "net1".into(), claim: None },
        Allocation { offset: 3, container_id: "b".into(), pod_ref: "ns/q".into(), ifname: "eth0".into(), claim: None },
        Allocation { offset: 300, container_id: "b".into(), pod_ref: "ns/q".into(), ifname: "eth0".into(), claim: None },
    ];
    let who = |container_id: &str, ifname: &str| Attachment { container_id: container_id.into(), ifname: ifname.into(), claim: None };
    let indices = |attachments: &[Attachment]| release(&c.ranges[0], &c.network_name, &entries, attachments).into_iter().map(|r| r.index).collect::<Vec<_>>();
    assert_eq!(indices(&[who("a", "eth0")]), [0]);
    assert_eq!(indices(&[who("a", "net1")]), [1]);
    assert_eq!(indices(&[who("a", "net1"), who("b", "eth0")]), [1, 2, 3]);
    assert!(indices(&[who("zzz", "eth0")]).is_empty());
    let released = release(&c.ranges[0], &c.network_name, &entries, &[who("b", "eth0")]);
    // Offset 300 is not an address of the /24 (stale data): it goes, with no reservation.
    assert_eq!(released.iter().map(|r| r.reservation.as_deref()).collect::<Vec<_>>(), [Some("blue-192.0.2.3"), None]);
}

#[test]
fn any_ipv6_range_size_works_with_exact_offsets() {
    // whereabouts only reads offsets < 2^63: start far into a /32 exercises > 64 bits.
    let spec = RangeSpec { path: "ipam".into(), range: "2001:db8::/32".into(), range_start: "2001:db8:1::1".parse().ok(), ..Default::default() };
    let r = normalize_range(&spec, None, "").unwrap();
    let Ok(PlanOutcome::Fresh { assignment }) = plan(&r, &taken(&[]), &req("a", "eth0")) else { panic!() };
    assert_eq!(assignment.ip, "2001:db8:1::1");
    assert_eq!(assignment.offset, (1u128 << 80) + 1);
    let Ok(PlanOutcome::Fresh { assignment }) = plan(&r, &taken(&[(1u128 << 80) + 1]), &req("a", "eth0")) else { panic!() };
    assert_eq!(assignment.ip, "2001:db8:1::2");
}

#[test]
fn requested_address_is_honoured_or_rejected_with_a_reason() {
    let r = range_with("192.0.2.0/24", &["192.0.2.50"]);
    let mut request = req("a", "eth0");
    request.requested_ip = Some("192.0.2.77".into());
    assert_eq!(fresh_ip(plan(&r, &taken(&[1]), &request)), "192.0.2.77/24");
    for (ip, why) in
        [("192.0.2.77", "already allocated"), ("192.0.2.50", "excluded"), ("198.51.100.1", "outside range"), ("192.0.2.255", "outside the allocatable span")]
    {
        request.requested_ip = Some(ip.into());
        match plan(&r, &taken(&[77]), &request) {
            Err(PlanFailure::Rejected { message }) => assert!(message.contains(why), "{ip}: {message}"),
            other => panic!("{ip}: {other:?}"),
        }
    }
}

fn range_with_gateway(text: &str, gateway: &str) -> NormalizedRange {
    let spec = RangeSpec { path: "ipam".into(), range: text.into(), gateway: gateway.parse().ok(), ..Default::default() };
    normalize_range(&spec, None, "").unwrap()
}

#[test]
fn the_gateway_is_never_handed_out() {
    let r = range_with_gateway("192.0.2.0/29", "192.0.2.1");
    assert_eq!(fresh_ip(plan(&r, &taken(&[]), &req("a", "eth0"))), "192.0.2.2/29");
    assert_eq!(fresh_ip(plan(&r, &taken(&[2, 3, 4, 5]), &req("a", "eth0"))), "192.0.2.6/29");
    assert!(matches!(plan(&r, &taken(&[2, 3, 4, 5, 6]), &req("a", "eth0")), Err(PlanFailure::Exhausted { .. })));
    let mut request = req("a", "eth0");
    request.requested_ip = Some("192.0.2.1".into());
    match plan(&r, &taken(&[]), &request) {
        Err(PlanFailure::Rejected { message }) => assert!(message.contains("gateway of 192.0.2.0/29"), "{message}"),
        other => panic!("{other:?}"),
    }
    // A pod that already holds the gateway's address (an entry from before) keeps it.
    let held = PoolSnapshot {
        held: vec![Allocation { offset: 1, container_id: "old".into(), pod_ref: "default/a".into(), ifname: "eth0".into(), claim: None }],
        ..taken(&[1])
    };
    assert!(matches!(plan(&r, &held, &req("a", "eth0")), Ok(PlanOutcome::Reuse { .. })));
}

#[test]
fn preview_skips_the_gateway() {
    let text =
        serde_json::json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "thereabouts", "gateway": "192.0.2.1", "range": "192.0.2.0/29"}}).to_string();
    let c = crate::normalize(&text, None, "").unwrap();
    let table = preview(&c, &[], 6);
    assert_eq!(table.addresses.lines().collect::<Vec<_>>(), ["192.0.2.2/29", "192.0.2.3/29", "192.0.2.4/29", "192.0.2.5/29", "192.0.2.6/29"]);
    assert_eq!((table.served, table.failure.map(|f| f.range_index)), (5, Some(0)));
}

fn config(ranges: &[&str]) -> NormalizedConfig {
    let ipam: Vec<_> = ranges.iter().map(|r| serde_json::json!({"range": r})).collect();
    let text = serde_json::json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "thereabouts", "ipRanges": ipam}}).to_string();
    crate::normalize(&text, None, "").unwrap()
}

#[test]
fn plan_all_gives_one_address_per_range_in_order() {
    let c = config(&["192.0.2.0/24", "2001:db8::/64"]);
    let out = plan_all(&c, &[state("192.0.2.0-24", &[1])], Reservations::AsRead, &req("a", "eth0")).unwrap();
    let addrs: Vec<_> = out.iter().map(|o| (o.assignment().address.as_str(), o.assignment().reservation.as_str())).collect();
    assert_eq!(addrs, [("192.0.2.2/24", "192.0.2.2"), ("2001:db8::1/64", "2001-db8--1")]);
}

#[test]
fn plan_all_fails_whole_when_one_range_is_exhausted() {
    let c = config(&["192.0.2.0/24", "198.51.100.0/30"]);
    let out = plan_all(&c, &[state("198.51.100.0-30", &[1, 2])], Reservations::AsRead, &req("a", "eth0"));
    assert!(matches!(out, Err(PlanFailure::Exhausted { .. })));
}

#[test]
fn plan_all_never_hands_one_address_out_twice_in_a_config() {
    // The same range twice (N addresses from one pool) and a range inside another.
    let c = config(&["192.0.2.0/24", "192.0.2.0/24", "192.0.2.0/28"]);
    let out = plan_all(&c, &[], Reservations::AsRead, &req("a", "eth0")).unwrap();
    let addrs: Vec<_> = out.iter().map(|o| o.assignment().ip.clone()).collect();
    assert_eq!(addrs, ["192.0.2.1", "192.0.2.2", "192.0.2.3"]);
}

fn state(name: &str, offsets: &[u128]) -> PoolState {
    PoolState { name: name.into(), snapshot: taken(offsets) }
}

#[test]
fn plan_all_reuses_from_the_pool_of_the_range_and_reserves_as_read() {
    let c = config(&["192.0.2.0/24", "198.51.100.0/24"]);
    let held = Allocation { offset: 9, container_id: "old".into(), pod_ref: "default/a".into(), ifname: "eth0".into(), claim: None };
    let mine = PoolState { name: "198.51.100.0-24".into(), snapshot: PoolSnapshot { held: vec![held], ..taken(&[9]) } };
    let reserved = PoolState { name: "192.0.2.0-24".into(), snapshot: PoolSnapshot { reserved: vec![1], ..taken(&[]) } };
    let out = plan_all(&c, &[mine, reserved], Reservations::AsRead, &req("a", "eth0")).unwrap();
    assert_eq!(fresh_ip(Ok(out[0].clone())), "192.0.2.2/24");
    assert!(matches!(&out[1], PlanOutcome::Reuse { held_index: 0, assignment } if assignment.ip == "198.51.100.9"));
}

#[test]
fn an_address_the_pod_keeps_in_a_later_range_is_not_handed_out_again_before_it() {
    // Found by the policy_answer fuzz target: the pod holds 192.0.2.1 in the
    // /29's pool (a range added before it since), and the /24, planned first,
    // gave the same address again.
    let c = config(&["192.0.2.0/24", "192.0.2.0/29"]);
    let held = Allocation { offset: 1, container_id: "old".into(), pod_ref: "default/a".into(), ifname: "eth0".into(), claim: None };
    let pools = [PoolState { name: "192.0.2.0-29".into(), snapshot: PoolSnapshot { held: vec![held], ..taken(&[1]) } }];
    let out = plan_all(&c, &pools, Reservations::AsRead, &req("a", "eth0")).unwrap();
    assert_eq!(fresh_ip(Ok(out[0].clone())), "192.0.2.2/24");
    assert!(matches!(&out[1], PlanOutcome::Reuse { assignment, .. } if assignment.ip == "192.0.2.1"));
}

#[test]
fn plan_all_from_pools_reserves_what_overlapping_pools_hold() {
    // A /28 inside a /24, two pools: with the pools as the whole truth, an address
    // the /24's pool holds is taken in the /28 too (and the reverse).
    let c = config(&["192.0.2.0/24", "192.0.2.0/28"]);
    let pools = [state("192.0.2.0-24", &[1, 2]), state("192.0.2.0-28", &[3])];
    let ips = |reservations| plan_all(&c, &pools, reservations, &req("a", "eth0")).unwrap().iter().map(|o| o.assignment().ip.clone()).collect::<Vec<_>>();
    assert_eq!(ips(Reservations::FromPools), ["192.0.2.4", "192.0.2.5"]);
    assert_eq!(ips(Reservations::AsRead), ["192.0.2.3", "192.0.2.1"]);
    // Off, as whereabouts without enable_overlapping_ranges: nothing is derived.
    let mut off = c.clone();
    off.enable_overlapping_ranges = false;
    let out = plan_all(&off, &pools, Reservations::FromPools, &req("a", "eth0")).unwrap();
    assert_eq!(out.iter().map(|o| o.assignment().ip.as_str()).collect::<Vec<_>>(), ["192.0.2.3", "192.0.2.1"]);
}

#[test]
fn preview_lists_successive_pods_and_marks_exhaustion() {
    let c = config(&["192.0.2.0/30", "2001:db8::/64"]);
    let table = preview(&c, &[], 4);
    assert_eq!(table.served, 2);
    assert_eq!(table.addresses, "192.0.2.1/30 2001:db8::1/64\n192.0.2.2/30 2001:db8::2/64");
    assert_eq!(table.offsets, [1, 1, 2, 2]);
    let failure = table.failure.expect("pod 3 fails");
    assert_eq!(failure.range_index, 0, "the range that ran out");
    assert_eq!(failure.exhausted, exhausted_message(&c.ranges[0]));
    assert_eq!(failure.rejected, "not allocated: the ADD fails because range 192.0.2.0/30 has no free address");
    assert_eq!(preview(&c, &[], 2).failure, None);
    // From a given pool state: holes first.
    let table = preview(&c, &[state("192.0.2.0-30", &[2]), state("2001-db8---64", &[1, 3])], 2);
    assert_eq!((table.served, table.addresses.as_str()), (1, "192.0.2.1/30 2001:db8::2/64"));
    assert_eq!(table.failure.expect("192.0.2.0/30 is full after pod 1").range_index, 0);
    // The range that runs out is not the first one (found by the playground's parity test).
    let c = config(&["2001:db8::/64", "192.0.2.0/30"]);
    let failure = preview(&c, &[], 3).failure.expect("pod 3 fails");
    assert_eq!(failure.range_index, 1);
    assert!(failure.exhausted.contains("192.0.2.0/30"), "{}", failure.exhausted);
}

#[test]
fn preview_of_a_shared_pool_matches_successive_adds() {
    // Found by the playground: two entries of one range must interleave like ADDs.
    let c = config(&["192.0.2.0/24", "192.0.2.0/24"]);
    assert_eq!(preview(&c, &[], 3).addresses, "192.0.2.1/24 192.0.2.2/24\n192.0.2.3/24 192.0.2.4/24\n192.0.2.5/24 192.0.2.6/24");
}
