//! Property tests: the planner against a brute-force model on random ranges,
//! excludes and pool states; and normalize on random and mutated configs
//! ("a structured error or a valid result, never a panic").

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::json;
use thereabouts_allocator::{
    Allocation, Attachment, NormalizedConfig, PlanFailure, PlanOutcome, PoolSnapshot, PoolState, Request, Reservations, normalize, plan, plan_all,
};

/// A random small range config: family, prefix, optional start/end, excludes.
fn range_config() -> impl Strategy<Value = serde_json::Value> {
    // A block of one of the three IPv4 documentation networks.
    let v4 = (24u8..=30, 0usize..3, 0u32..256).prop_map(|(prefix, network, block)| {
        let first = ["192.0.2", "198.51.100", "203.0.113"][network];
        (format!("{first}.{}/{prefix}", (block << (32 - prefix)) & 0xff), 4u8, prefix)
    });
    let v6 = (118u8..=126, 0u16..0xffff).prop_map(|(prefix, group)| (format!("2001:db8:{group:x}::/{prefix}"), 6u8, prefix));
    (
        prop_oneof![v4, v6],
        proptest::collection::vec((0u32..300, 26u8..=32), 0..4),
        proptest::option::of(0u32..300),
        proptest::option::of(0u32..300),
        proptest::option::of(0u32..8),
    )
        .prop_map(|((cidr, family, prefix), excl, start, end, gateway)| {
            let base: std::net::IpAddr = cidr.split('/').next().unwrap().parse().unwrap();
            let at = |off: u32| -> String {
                match base {
                    std::net::IpAddr::V4(v4) => std::net::Ipv4Addr::from(u32::from(v4) + off).to_string(),
                    std::net::IpAddr::V6(v6) => std::net::Ipv6Addr::from(u128::from(v6) + off as u128).to_string(),
                }
            };
            let excludes: Vec<String> = excl
                .into_iter()
                .map(|(off, p)| {
                    let p = if family == 4 { p } else { p + 96 };
                    format!("{}/{p}", at(off))
                })
                .collect();
            let _ = prefix;
            let mut entry = json!({"range": cidr, "exclude": excludes});
            if let Some(s) = start {
                entry["range_start"] = json!(at(s));
            }
            if let Some(e) = end {
                entry["range_end"] = json!(at(e));
            }
            if let Some(g) = gateway {
                entry["gateway"] = json!(at(g));
            }
            entry
        })
}

/// The brute-force rule for what may never be handed out: inside an exclude
/// block of the entry (read from the entry as written), or the gateway.
fn forbidden(entry: &serde_json::Value, r: &thereabouts_allocator::NormalizedRange) -> impl Fn(u128) -> bool + use<> {
    let cidr = |text: &str| -> (std::net::IpAddr, u32) {
        let (ip, prefix) = text.split_once('/').unwrap();
        (ip.parse().unwrap(), prefix.parse().unwrap())
    };
    let value = |ip: std::net::IpAddr| match ip {
        std::net::IpAddr::V4(v4) => u32::from(v4) as u128,
        std::net::IpAddr::V6(v6) => u128::from(v6),
    };
    let bits = if r.family.number() == 4 { 32 } else { 128 };
    let blocks: Vec<(u128, u128)> = entry["exclude"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let (ip, prefix) = cidr(e.as_str().unwrap());
            let host = if bits - prefix == 128 { u128::MAX } else { (1u128 << (bits - prefix)) - 1 };
            let lo = value(ip) & !host;
            (lo, lo | host)
        })
        .collect();
    let gateway = entry["gateway"].as_str().map(|g| value(g.parse().unwrap()));
    let network = r.network;
    move |offset: u128| {
        let a = network + offset;
        gateway == Some(a) || blocks.iter().any(|&(lo, hi)| a >= lo && a <= hi)
    }
}

fn normalize_entry(entry: &serde_json::Value) -> Option<NormalizedConfig> {
    let text = json!({"cniVersion": "1.0.0", "name": "p", "ipam": {"type": "thereabouts", "ipRanges": [entry]}}).to_string();
    normalize(&text, None, "").ok()
}

fn req(i: usize) -> Request {
    Request {
        container_id: format!("c{i}"),
        pod_ref: format!("ns/pod{i}"),
        ifname: "eth0".into(),
        requested_ip: None,
        contention: 0,
        guidance: None,
        preferred: Vec::new(),
        claim: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn chosen_address_is_the_lowest_free_one(entry in range_config(), taken in proptest::collection::vec(0u128..400, 0..200)) {
        let config = normalize_entry(&entry);
        // Counted by proptest: a generator that mostly makes rejected configs fails the test.
        prop_assume!(config.is_some(), "a range the engine rejects");
        let config = config.expect("assumed");
        let r = &config.ranges[0];
        let excluded = forbidden(&entry, r);
        prop_assert_eq!(r.usable, (r.first_offset..=r.last_offset).filter(|o| !excluded(*o)).count() as u128);
        let taken_set: BTreeSet<u128> = taken.iter().copied().collect();
        let expected = (r.first_offset..=r.last_offset).find(|o| !excluded(*o) && !taken_set.contains(o));
        let pool = PoolSnapshot::with_taken(taken.iter().copied());
        match (plan(r, &pool, &req(0)), expected) {
            (Ok(PlanOutcome::Fresh { assignment }), Some(want)) => {
                prop_assert_eq!(assignment.offset, want);
                prop_assert!(assignment.offset >= r.first_offset && assignment.offset <= r.last_offset);
                prop_assert!(!excluded(assignment.offset));
                prop_assert!(!taken_set.contains(&assignment.offset));
            }
            (Err(PlanFailure::Exhausted { .. }), None) => {}
            (got, want) => prop_assert!(false, "got {:?}, brute force says {:?}", got, want),
        }
    }

    #[test]
    fn under_contention_the_choice_is_a_free_address_among_the_lowest(
        entry in range_config(),
        taken in proptest::collection::vec(0u128..400, 0..200),
        reserved in proptest::collection::vec(0u128..400, 0..20),
        contention in 0u32..12,
        pod in 0usize..1000,
    ) {
        let config = normalize_entry(&entry);
        // Counted by proptest: a generator that mostly makes rejected configs fails the test.
        prop_assume!(config.is_some(), "a range the engine rejects");
        let config = config.expect("assumed");
        let r = &config.ranges[0];
        let excluded = forbidden(&entry, r);
        let occupied: BTreeSet<u128> = taken.iter().chain(&reserved).copied().collect();
        // Brute force: the free addresses of the range, lowest first.
        let free: Vec<u128> = (r.first_offset..=r.last_offset).filter(|o| !excluded(*o) && !occupied.contains(o)).collect();
        // 8^c candidates after c conflicts, at most 1024.
        let window = 1usize << (3 * contention).min(10);
        let pool = PoolSnapshot { reserved: reserved.clone(), ..PoolSnapshot::with_taken(taken.iter().copied()) };
        let request = Request { contention, ..req(pod) };
        match plan(r, &pool, &request) {
            Ok(PlanOutcome::Fresh { assignment }) => {
                let o = assignment.offset;
                prop_assert!(o >= r.first_offset && o <= r.last_offset, "{} outside [{}, {}]", o, r.first_offset, r.last_offset);
                prop_assert!(!excluded(o), "{} is excluded", o);
                prop_assert!(!occupied.contains(&o), "{} is taken or reserved", o);
                let position = free.iter().position(|&f| f == o);
                prop_assert!(position.is_some_and(|p| p < window), "{} is not among the first {} free addresses {:?}", o, window, &free[..window.min(free.len())]);
                if contention == 0 {
                    prop_assert_eq!(o, free[0], "contention 0 is the lowest free address");
                }
                // Deterministic: the same request on the same pool, the same answer.
                prop_assert_eq!(plan(r, &pool, &request), Ok(PlanOutcome::Fresh { assignment }));
            }
            Err(PlanFailure::Exhausted { .. }) => prop_assert!(free.is_empty(), "exhausted with {} free", free.len()),
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn successive_allocations_never_duplicate_and_adds_are_idempotent(entry in range_config(), pods in 1usize..120, churn in proptest::collection::vec(0usize..120, 0..40)) {
        let config = normalize_entry(&entry);
        // Counted by proptest: a generator that mostly makes rejected configs fails the test.
        prop_assume!(config.is_some(), "a range the engine rejects");
        let config = config.expect("assumed");
        let r = &config.ranges[0];
        let mut entries: Vec<Allocation> = Vec::new();
        let add = |entries: &mut Vec<Allocation>, i: usize| -> Option<u128> {
            let request = req(i);
            let held: Vec<Allocation> = entries.iter().filter(|e| e.pod_ref == request.pod_ref).cloned().collect();
            let pool = PoolSnapshot { held, ..PoolSnapshot::with_taken(entries.iter().map(|e| e.offset)) };
            match plan(r, &pool, &request) {
                Ok(PlanOutcome::Fresh { assignment }) => {
                    entries.push(Allocation { offset: assignment.offset, container_id: request.container_id, pod_ref: request.pod_ref, ifname: request.ifname, claim: None });
                    Some(assignment.offset)
                }
                Ok(PlanOutcome::Reuse { assignment, .. }) => Some(assignment.offset),
                _ => None,
            }
        };
        for i in 0..pods {
            let first = add(&mut entries, i);
            let again = add(&mut entries, i);
            prop_assert_eq!(first, again, "second ADD for the same pod ref + ifname must return the same address");
        }
        for &victim in &churn {
            let who = Attachment { container_id: format!("c{victim}"), ifname: "eth0".into(), claim: None };
            let gone: Vec<u32> = thereabouts_allocator::release(r, &config.network_name, &entries, &[who]).into_iter().map(|g| g.index).collect();
            for i in gone.into_iter().rev() { entries.remove(i as usize); }
            add(&mut entries, victim + 1000);
        }
        let offsets: BTreeSet<u128> = entries.iter().map(|e| e.offset).collect();
        prop_assert_eq!(offsets.len(), entries.len(), "duplicate address handed out");
        let excluded = forbidden(&entry, r);
        for o in offsets {
            prop_assert!(o >= r.first_offset && o <= r.last_offset);
            prop_assert!(!excluded(o));
        }
    }

    #[test]
    fn multi_range_plans_are_disjoint(a in range_config(), b in range_config()) {
        let text = json!({"cniVersion": "1.0.0", "name": "p", "ipam": {"type": "thereabouts", "ipRanges": [a.clone(), a, b]}}).to_string();
        let config = normalize(&text, None, "");
        prop_assume!(config.is_ok(), "ranges the engine rejects together");
        let config = config.expect("assumed");
        if let Ok(out) = plan_all(&config, &[], Reservations::AsRead, &req(1)) {
            let ips: BTreeSet<String> = out.iter().map(|o| o.assignment().ip.clone()).collect();
            prop_assert_eq!(ips.len(), out.len());
        }
    }

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,300}", flat in proptest::option::of(".{0,80}"), args in "[A-Za-z0-9_=;,./:]{0,60}") {
        check_error_shape(normalize(&text, flat.as_deref(), &args));
        let _ = thereabouts_allocator::flat_file_paths(&text);
    }

    #[test]
    fn mutated_configs_never_panic(seed in mutated_config(), args in "[A-Za-z0-9_=;,./:]{0,40}") {
        check_error_shape(normalize(&seed, Some(&seed), &args));
    }
}

fn check_error_shape(result: Result<NormalizedConfig, thereabouts_allocator::ConfigError>) {
    match result {
        Ok(config) => assert!(!config.ranges.is_empty() || !config.addresses.is_empty()),
        Err(e) => {
            assert!([1, 4, 6, 7].contains(&e.code), "unexpected code {}", e.code);
            assert!(!e.message.is_empty());
        }
    }
}

const SEEDS: [&str; 3] = [
    r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"whereabouts","range":"192.0.2.0/24","range_start":"192.0.2.10","exclude":["192.0.2.12/30"],"gateway":"192.0.2.1"}}"#,
    r#"{"cniVersion":"0.3.1","name":"n","ipam":{"type":"thereabouts","ipRanges":[{"range":"192.0.2.0/24"},{"range":"2001:db8::/64","exclude":["2001:db8::1"]}],"routes":[{"dst":"0.0.0.0/0"}]}}"#,
    r#"{"cniVersion":"1.1.0","name":"l","plugins":[{"type":"bridge","ipam":{"type":"whereabouts","range":"198.51.100.5-198.51.100.25/24","network_name":"a","addresses":[{"address":"203.0.113.9/24"}]}}]}"#,
];

/// A seed config with bytes replaced, inserted or removed at random positions.
fn mutated_config() -> impl Strategy<Value = String> {
    (0usize..SEEDS.len(), proptest::collection::vec((any::<u16>(), any::<u8>(), 0u8..3), 1..6)).prop_map(|(i, edits)| {
        let mut bytes = SEEDS[i].as_bytes().to_vec();
        for (pos, byte, kind) in edits {
            let p = pos as usize % (bytes.len() + 1);
            match kind {
                0 if p < bytes.len() => bytes[p] = byte,
                1 => bytes.insert(p, byte),
                _ if p < bytes.len() => {
                    bytes.remove(p);
                }
                _ => {}
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Successive ADDs as the host performs them: plan_all over the current pools,
/// then commit; overlapping ranges see each other's addresses as reservations
/// (what `enable_overlapping_ranges` does through reservation objects: here the
/// pools are the whole truth, so the engine derives them).
fn successive_adds(config: &NormalizedConfig, pods: usize) -> Vec<Option<Vec<String>>> {
    let mut pools: Vec<PoolState> = Vec::new();
    let mut out = Vec::new();
    for i in 0..pods {
        match plan_all(config, &pools, Reservations::FromPools, &req(i)) {
            Ok(outcomes) => {
                for (r, o) in config.ranges.iter().zip(&outcomes) {
                    let offset = o.assignment().offset;
                    match pools.iter_mut().find(|p| p.name == r.pool_name) {
                        Some(pool) => pool.snapshot = PoolSnapshot::with_taken(pool.snapshot.entries().chain([offset])),
                        None => pools.push(PoolState { name: r.pool_name.clone(), snapshot: PoolSnapshot::with_taken([offset]) }),
                    }
                }
                out.push(Some(outcomes.iter().map(|o| o.assignment().ip.clone()).collect()));
            }
            Err(_) => out.push(None),
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn preview_equals_successive_adds(a in range_config(), b in range_config(), shape in 0u8..4, pods in 1usize..60) {
        let entries = match shape {
            0 => vec![a.clone()],
            1 => vec![a.clone(), b.clone()],
            2 => vec![a.clone(), a.clone()],
            _ => vec![a.clone(), b.clone(), a.clone()],
        };
        let text = json!({"cniVersion": "1.0.0", "name": "p", "ipam": {"type": "thereabouts", "ipRanges": entries}}).to_string();
        let config = normalize(&text, None, "");
        prop_assume!(config.is_ok(), "ranges the engine rejects together");
        let config = config.expect("assumed");
        let table = thereabouts_allocator::preview(&config, &[], pods as u32);
        let served = table.addresses.lines().filter(|_| table.served > 0).map(|line| Some(line.split(' ').map(|a| a.split('/').next().unwrap_or_default().to_string()).collect()));
        let previewed: Vec<Option<Vec<String>>> = served.chain(std::iter::repeat(None)).take(pods).collect();
        prop_assert_eq!(previewed, successive_adds(&config, pods));
    }
}
