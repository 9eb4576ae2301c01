//! `ipRangesAllocation`, policies' guidance and `candidates`: what `plan_all`
//! serves and what a policy is offered.

use super::*;
use crate::model::Guidance;

fn config_with(allocation: &str, ranges: serde_json::Value) -> NormalizedConfig {
    let text = serde_json::json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "thereabouts", "ipRangesAllocation": allocation, "ipRanges": ranges}})
        .to_string();
    crate::normalize(&text, None, "").expect("a valid config")
}

fn all(ranges: serde_json::Value) -> NormalizedConfig {
    config_with("all", ranges)
}

fn first_available(ranges: serde_json::Value) -> NormalizedConfig {
    config_with("first_available", ranges)
}

fn req(pod: &str) -> Request {
    Request {
        container_id: format!("c-{pod}"),
        pod_ref: format!("default/{pod}"),
        ifname: "eth0".into(),
        requested_ip: None,
        contention: 0,
        guidance: None,
        preferred: Vec::new(),
        claim: None,
    }
}

fn guided(pod: &str, ranges: Option<Vec<u32>>, picks: Vec<RangePick>) -> Request {
    Request { guidance: Some(Guidance { ranges, picks }), ..req(pod) }
}

fn prefer(range_index: u32, addresses: &[&str]) -> RangePick {
    RangePick { range_index, prefer: addresses.iter().map(|a| a.to_string()).collect(), ..Default::default() }
}

fn refuse(range_index: u32, addresses: &[&str]) -> RangePick {
    RangePick { range_index, refuse: addresses.iter().map(|a| a.to_string()).collect(), ..Default::default() }
}

fn veto(range_index: u32, reason: &str) -> RangePick {
    RangePick { range_index, veto: Some(reason.into()), ..Default::default() }
}

fn pool(name: &str, offsets: &[u128]) -> PoolState {
    PoolState { name: name.into(), snapshot: PoolSnapshot::with_taken(offsets.iter().copied()) }
}

/// A pool in which `pod` holds `offset` (besides the `taken` ones).
fn holding(name: &str, pod: &str, offset: u128, taken: &[u128]) -> PoolState {
    let held = Allocation { offset, container_id: "old".into(), pod_ref: format!("default/{pod}"), ifname: "eth0".into(), claim: None };
    let mut state = pool(name, taken);
    state.snapshot.taken.push(offset as u64);
    state.snapshot.held = vec![held];
    state
}

/// (range index, address) of every outcome.
fn served(out: Result<Vec<PlanOutcome>, PlanFailure>) -> Vec<(u32, String)> {
    out.unwrap_or_else(|f| panic!("expected a plan, got {f:?}")).iter().map(|o| (o.assignment().range_index, o.assignment().ip.clone())).collect()
}

fn rejected(out: Result<Vec<PlanOutcome>, PlanFailure>) -> String {
    match out {
        Err(PlanFailure::Rejected { message }) => message,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// The message of a bad pick, checked to name range `index`.
fn bad_pick(out: Result<Vec<PlanOutcome>, PlanFailure>, index: u32) -> String {
    match out {
        Err(PlanFailure::BadPick { range_index, message }) if range_index == index => message,
        other => panic!("expected a bad pick in range {index}, got {other:?}"),
    }
}

fn two_v4() -> serde_json::Value {
    serde_json::json!([{"range": "192.0.2.0/30"}, {"range": "198.51.100.0/24"}])
}

#[test]
fn all_names_every_range_in_its_outcome() {
    let out = plan_all(&all(two_v4()), &[], Reservations::AsRead, &req("a"));
    assert_eq!(served(out), [(0, "192.0.2.1".into()), (1, "198.51.100.1".into())]);
}

#[test]
fn first_available_serves_only_the_first_range_with_room() {
    let c = first_available(two_v4());
    assert_eq!(served(plan_all(&c, &[], Reservations::AsRead, &req("a"))), [(0, "192.0.2.1".into())]);
    // 192.0.2.0/30 is full: the next range serves.
    let full = [pool("192.0.2.0-30", &[1, 2])];
    assert_eq!(served(plan_all(&c, &full, Reservations::AsRead, &req("a"))), [(1, "198.51.100.1".into())]);
}

#[test]
fn first_available_fails_with_the_last_ranges_failure() {
    let c = first_available(serde_json::json!([{"range": "192.0.2.0/30"}, {"range": "198.51.100.0/30"}]));
    let full = [pool("192.0.2.0-30", &[1, 2]), pool("198.51.100.0-30", &[1, 2])];
    assert_eq!(plan_all(&c, &full, Reservations::AsRead, &req("a")), Err(PlanFailure::Exhausted { message: exhausted_message(&c.ranges[1]) }));
    // The last range tried was vetoed: its reason is the answer.
    let out = plan_all(&c, &full[..1], Reservations::AsRead, &guided("a", None, vec![veto(1, "no room for tenants in rack 7")]));
    assert_eq!(rejected(out), "range 198.51.100.0/30 vetoed by a policy: no room for tenants in rack 7");
}

#[test]
fn first_available_keeps_the_address_a_pod_holds_in_a_later_range() {
    // The first range has room again, but the pod already holds 198.51.100.9: a repeated ADD keeps it.
    let c = first_available(two_v4());
    let pools = [holding("198.51.100.0-24", "a", 9, &[])];
    let out = plan_all(&c, &pools, Reservations::AsRead, &req("a")).unwrap();
    assert!(matches!(&out[..], [PlanOutcome::Reuse { held_index: 0, assignment }] if assignment.range_index == 1 && assignment.ip == "198.51.100.9"));
}

#[test]
fn first_available_skips_a_vetoed_range() {
    let c = first_available(two_v4());
    let out = plan_all(&c, &[], Reservations::AsRead, &guided("a", None, vec![veto(0, "rack 7 only")]));
    assert_eq!(served(out), [(1, "198.51.100.1".into())]);
}

#[test]
fn guidance_chooses_and_orders_the_ranges() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24"}, {"range": "198.51.100.0/24"}, {"range": "203.0.113.0/24"}]));
    let out = plan_all(&c, &[], Reservations::AsRead, &guided("a", Some(vec![2, 0]), vec![]));
    assert_eq!(served(out), [(2, "203.0.113.1".into()), (0, "192.0.2.1".into())]);
    // With first-available, the guidance's order decides which range is first.
    let c = config_with("first_available", serde_json::json!([{"range": "192.0.2.0/24"}, {"range": "198.51.100.0/24"}]));
    assert_eq!(served(plan_all(&c, &[], Reservations::AsRead, &guided("a", Some(vec![1, 0]), vec![]))), [(1, "198.51.100.1".into())]);
}

#[test]
fn a_veto_with_all_rejects_the_request_with_the_reason_verbatim() {
    let out = plan_all(&all(two_v4()), &[], Reservations::AsRead, &guided("a", None, vec![veto(1, "tenant \"x\" may not use 198.51.100.0/24")]));
    assert_eq!(rejected(out), "range 198.51.100.0/24 vetoed by a policy: tenant \"x\" may not use 198.51.100.0/24");
}

#[test]
fn guidance_out_of_bounds_or_repeated_is_rejected() {
    let c = all(two_v4());
    let plan = |r: Request| rejected(plan_all(&c, &[], Reservations::AsRead, &r));
    assert!(plan(guided("a", Some(vec![0, 2]), vec![])).contains("selects range 2, but the config has 2 range(s)"));
    assert!(plan(guided("a", Some(vec![1, 1]), vec![])).contains("selects range 1 more than once"));
    assert!(plan(guided("a", None, vec![prefer(7, &["192.0.2.1"])])).contains("has a pick for range 7"));
    assert!(plan(guided("a", None, vec![refuse(0, &[]), refuse(0, &[])])).contains("more than one pick for range 0"));
}

#[test]
fn prefer_takes_the_first_free_preferred_address() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24"}]));
    let pools = [pool("192.0.2.0-24", &[50])];
    let out = plan_all(&c, &pools, Reservations::AsRead, &guided("a", None, vec![prefer(0, &["192.0.2.50", "192.0.2.60", "192.0.2.70"])]));
    assert_eq!(served(out), [(0, "192.0.2.60".into())]);
    let reserved = [PoolState { name: "192.0.2.0-24".into(), snapshot: PoolSnapshot { reserved: vec![60], ..Default::default() } }];
    let out = plan_all(&c, &reserved, Reservations::AsRead, &guided("a", None, vec![prefer(0, &["192.0.2.60", "192.0.2.70"])]));
    assert_eq!(served(out), [(0, "192.0.2.70".into())], "a reserved address is taken");
}

#[test]
fn prefer_with_every_address_taken_is_rejected_naming_them() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24"}]));
    let pools = [pool("192.0.2.0-24", &[5, 6])];
    let out = plan_all(&c, &pools, Reservations::AsRead, &guided("a", None, vec![prefer(0, &["192.0.2.5", "192.0.2.6"])]));
    assert_eq!(bad_pick(out, 0), "policy preference in range 192.0.2.0/24: every preferred address is taken: 192.0.2.5, 192.0.2.6");
}

#[test]
fn prefer_never_repeats_an_address_an_earlier_range_gave_the_request() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24"}, {"range": "192.0.2.0/24"}]));
    let out = plan_all(&c, &[], Reservations::AsRead, &guided("a", None, vec![prefer(1, &["192.0.2.1", "192.0.2.9"])]));
    assert_eq!(served(out), [(0, "192.0.2.1".into()), (1, "192.0.2.9".into())]);
}

#[test]
fn every_kind_of_bad_preference_is_rejected_naming_the_address() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24", "gateway": "192.0.2.1", "exclude": ["192.0.2.64/26"]}]));
    for (address, why) in [
        ("192.0.2.300", "192.0.2.300 is not an address"),
        ("198.51.100.7", "198.51.100.7 is outside range 192.0.2.0/24"),
        ("192.0.2.255", "192.0.2.255 is outside range 192.0.2.0/24"),
        ("192.0.2.70", "192.0.2.70 is excluded in 192.0.2.0/24"),
        ("192.0.2.1", "192.0.2.1 is the gateway of 192.0.2.0/24"),
        ("2001:db8::5", "2001:db8::5 is IPv6 in an IPv4 range"),
    ] {
        // Even behind a good, free address: the whole answer is checked.
        let out = plan_all(&c, &[], Reservations::AsRead, &guided("a", None, vec![prefer(0, &["192.0.2.10", address])]));
        let message = bad_pick(out, 0);
        assert!(message.starts_with(&format!("policy preference in range 192.0.2.0/24: {why}")), "{address}: {message}");
    }
}

#[test]
fn refused_addresses_are_skipped_as_if_excluded() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24"}]));
    // Entries that are not addresses of the range are harmless and ignored.
    let pick = refuse(0, &["192.0.2.1", "192.0.2.2", "not an address", "198.51.100.3", "2001:db8::4"]);
    assert_eq!(served(plan_all(&c, &[pool("192.0.2.0-24", &[3])], Reservations::AsRead, &guided("a", None, vec![pick]))), [(0, "192.0.2.4".into())]);
}

#[test]
fn contention_spreads_over_free_addresses_but_never_refused_ones() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/28"}]));
    let refused: Vec<String> = (1..=10).map(|i| format!("192.0.2.{i}")).collect();
    let names: Vec<&str> = refused.iter().map(String::as_str).collect();
    for pod in 0..64 {
        let request = Request { contention: 2, ..guided(&format!("p{pod}"), None, vec![refuse(0, &names)]) };
        let ip = served(plan_all(&c, &[], Reservations::AsRead, &request))[0].1.clone();
        assert!(["192.0.2.11", "192.0.2.12", "192.0.2.13", "192.0.2.14"].contains(&ip.as_str()), "{ip}");
    }
}

#[test]
fn a_requested_address_that_a_policy_refused_is_rejected() {
    let text = serde_json::json!({"cniVersion": "1.0.0", "name": "n", "runtimeConfig": {"ips": ["192.0.2.7"]},
        "ipam": {"type": "thereabouts", "ipRanges": [{"range": "192.0.2.0/24"}]}})
    .to_string();
    let c = crate::normalize(&text, None, "").unwrap();
    let message = rejected(plan_all(&c, &[], Reservations::AsRead, &guided("a", None, vec![refuse(0, &["192.0.2.7"])])));
    assert_eq!(message, "requested address 192.0.2.7: refused by a policy in 192.0.2.0/24");
}

#[test]
fn reuse_beats_every_pick() {
    let c = all(two_v4());
    let pools = [holding("192.0.2.0-30", "a", 2, &[]), holding("198.51.100.0-24", "a", 9, &[])];
    let picks = vec![veto(0, "no"), prefer(1, &["198.51.100.20"])];
    let out = plan_all(&c, &pools, Reservations::AsRead, &guided("a", None, picks)).unwrap();
    assert!(out.iter().all(|o| matches!(o, PlanOutcome::Reuse { .. })), "{out:?}");
    assert_eq!(out.iter().map(|o| o.assignment().ip.as_str()).collect::<Vec<_>>(), ["192.0.2.2", "198.51.100.9"]);
}

#[test]
fn without_guidance_plans_are_unchanged_by_the_new_fields() {
    // `guidance: None` and `all` are today's plan; an empty guidance is the same too.
    let c = all(serde_json::json!([{"range": "192.0.2.0/24"}, {"range": "192.0.2.0/24"}, {"range": "2001:db8::/64"}]));
    let pools = [pool("192.0.2.0-24", &[1, 3])];
    let plain = plan_all(&c, &pools, Reservations::AsRead, &req("a"));
    assert_eq!(served(plain.clone()), [(0, "192.0.2.2".into()), (1, "192.0.2.4".into()), (2, "2001:db8::1".into())]);
    assert_eq!(plan_all(&c, &pools, Reservations::AsRead, &guided("a", None, vec![])), plain);
}

fn free_of(out: &[RangeCandidates]) -> Vec<(u32, Vec<&str>, Option<&str>)> {
    out.iter().map(|c| (c.range_index, c.free.iter().map(String::as_str).collect(), c.held.as_deref())).collect()
}

#[test]
fn candidates_are_the_lowest_free_addresses_up_to_the_limit() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24", "gateway": "192.0.2.1", "exclude": ["192.0.2.4/31"]}, {"range": "198.51.100.0/24"}]));
    let mut taken = pool("192.0.2.0-24", &[2]);
    taken.snapshot.reserved = vec![7];
    let out = candidates(&c, &[taken], Reservations::AsRead, &req("a"), &[1, 0], 4).unwrap();
    // Gateway (.1), taken (.2), excluded (.4, .5) and reserved (.7) are never offered.
    assert_eq!(
        free_of(&out),
        [(1, vec!["198.51.100.1", "198.51.100.2", "198.51.100.3", "198.51.100.4"], None), (0, vec!["192.0.2.3", "192.0.2.6", "192.0.2.8", "192.0.2.9"], None)]
    );
    assert!(candidates(&c, &[], Reservations::AsRead, &req("a"), &[0], 0).unwrap()[0].free.is_empty());
}

#[test]
fn candidates_of_a_nearly_full_range_are_fewer_than_asked() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/29"}]));
    let out = candidates(&c, &[pool("192.0.2.0-29", &[1, 2, 3, 5])], Reservations::AsRead, &req("a"), &[0], 10).unwrap();
    assert_eq!(free_of(&out), [(0, vec!["192.0.2.4", "192.0.2.6"], None)]);
}

#[test]
fn candidates_name_the_address_the_pod_holds() {
    let c = all(two_v4());
    let out = candidates(&c, &[holding("198.51.100.0-24", "a", 9, &[])], Reservations::AsRead, &req("a"), &[0, 1], 2).unwrap();
    assert_eq!(free_of(&out), [(0, vec!["192.0.2.1", "192.0.2.2"], None), (1, vec![], Some("198.51.100.9"))]);
}

#[test]
fn candidates_leave_out_what_the_request_refuses() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24"}]));
    let request = guided("a", None, vec![refuse(0, &["192.0.2.1", "192.0.2.3", "nonsense"])]);
    let out = candidates(&c, &[], Reservations::AsRead, &request, &[0], 3).unwrap();
    assert_eq!(free_of(&out), [(0, vec!["192.0.2.2", "192.0.2.4", "192.0.2.5"], None)]);
}

#[test]
fn candidates_from_pools_skip_what_overlapping_pools_hold() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24"}, {"range": "192.0.2.0/28"}]));
    let pools = [pool("192.0.2.0-24", &[1]), pool("192.0.2.0-28", &[2])];
    let out = candidates(&c, &pools, Reservations::FromPools, &req("a"), &[1], 2).unwrap();
    assert_eq!(free_of(&out), [(1, vec!["192.0.2.3", "192.0.2.4"], None)]);
}

#[test]
fn candidates_with_an_index_out_of_bounds_is_a_config_error() {
    let e = candidates(&all(two_v4()), &[], Reservations::AsRead, &req("a"), &[0, 2], 1).unwrap_err();
    assert_eq!((e.code, e.field.as_str()), (7, "ranges"));
    assert!(e.message.contains("ranges[1] is 2, but the config has 2 range(s)"), "{}", e.message);
}

#[test]
fn candidates_cost_does_not_grow_with_the_range() {
    // A /32 of IPv6 (2^96 addresses) with 50 000 entries: the bitmap covers the
    // entries plus the limit, never the range (a walk would not finish).
    let c = all(serde_json::json!([{"range": "2001:db8::/32"}]));
    let taken: Vec<u128> = (1..=50_000).collect();
    let started = std::time::Instant::now();
    let out = candidates(&c, &[pool("2001-db8---32", &taken)], Reservations::AsRead, &req("a"), &[0], 3).unwrap();
    assert_eq!(free_of(&out), [(0, vec!["2001:db8::c351", "2001:db8::c352", "2001:db8::c353"], None)]);
    // A limit far beyond what is sensible is capped, not allocated.
    let out = candidates(&c, &[], Reservations::AsRead, &req("a"), &[0], u32::MAX).unwrap();
    assert_eq!(out[0].free.len(), MAX_CANDIDATES as usize);
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn preview_with_first_available_fills_each_range_in_turn() {
    let c = first_available(serde_json::json!([{"range": "192.0.2.0/30"}, {"range": "198.51.100.0/30"}]));
    let table = preview(&c, &[], 5);
    // One address per pod; `-` (offset 0) for the range a pod gets nothing from.
    assert_eq!(table.addresses, "192.0.2.1/30 -\n192.0.2.2/30 -\n- 198.51.100.1/30\n- 198.51.100.2/30");
    assert_eq!(table.offsets, [1, 0, 2, 0, 0, 1, 0, 2]);
    let failure = table.failure.expect("pod 5 finds no room anywhere");
    assert_eq!((table.served, failure.range_index), (4, 1));
    assert_eq!(failure.exhausted, exhausted_message(&c.ranges[1]));
    // The same as successive ADDs.
    let mut pools = vec![pool("192.0.2.0-30", &[]), pool("198.51.100.0-30", &[])];
    for (pod, line) in table.addresses.lines().enumerate() {
        let out = plan_all(&c, &pools, Reservations::AsRead, &req(&format!("p{pod}"))).unwrap();
        let a = out[0].assignment();
        assert_eq!(line.split(' ').nth(a.range_index as usize), Some(a.address.as_str()));
        pools[a.range_index as usize].snapshot.taken.push(a.offset as u64);
    }
}

fn preferring(pod: &str, addresses: &[&str]) -> Request {
    Request { preferred: addresses.iter().map(|a| a.to_string()).collect(), ..req(pod) }
}

#[test]
fn a_preferred_address_is_served_in_the_range_of_its_family_when_free() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24"}, {"range": "2001:db8::/64"}]));
    let out = plan_all(&c, &[pool("192.0.2.0-24", &[1])], Reservations::AsRead, &preferring("a", &["192.0.2.9"]));
    assert_eq!(served(out), [(0, "192.0.2.9".into()), (1, "2001:db8::1".into())], "the other family plans as configured");
    let out = plan_all(&c, &[], Reservations::AsRead, &preferring("a", &["192.0.2.9", "2001:db8::9"]));
    assert_eq!(served(out), [(0, "192.0.2.9".into()), (1, "2001:db8::9".into())]);
}

#[test]
fn a_preferred_address_that_cannot_be_had_yields_to_the_configured_choice() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24", "exclude": ["192.0.2.16/30"], "gateway": "192.0.2.254"}]));
    for (preferred, why) in
        [("192.0.2.5", "taken"), ("192.0.2.17", "excluded"), ("192.0.2.254", "the gateway"), ("198.51.100.1", "outside"), ("x", "not an address")]
    {
        let out = plan_all(&c, &[pool("192.0.2.0-24", &[5])], Reservations::AsRead, &preferring("a", &[preferred]));
        assert_eq!(served(out), [(0, "192.0.2.1".into())], "{preferred} is {why}");
    }
}

#[test]
fn the_pods_own_address_and_a_policys_pick_come_before_its_preference() {
    let c = all(serde_json::json!([{"range": "192.0.2.0/24"}]));
    let out = plan_all(&c, &[holding("192.0.2.0-24", "a", 7, &[])], Reservations::AsRead, &preferring("a", &["192.0.2.9"]));
    assert_eq!(out.unwrap()[0].assignment().ip, "192.0.2.7");
    let both = Request { guidance: Some(Guidance { ranges: None, picks: vec![prefer(0, &["192.0.2.3"])] }), ..preferring("a", &["192.0.2.9"]) };
    assert_eq!(served(plan_all(&c, &[], Reservations::AsRead, &both)), [(0, "192.0.2.3".into())]);
}
