//! Concurrency: many plugin processes allocating from the same dual-stack pools at once
//! must never hand out an address twice, neither in their results nor in the pool files,
//! and concurrent DELs must leave the pools empty.
//!
//! Figures are printed (run with `--nocapture` to see them). Knobs:
//! `THAB_E2E_WORKERS` (default 16 concurrent processes), `THAB_E2E_PER_WORKER` (default 100 ADDs each).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};
use thereabouts_e2e::*;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `per` calls in each of `workers` threads (one plugin process per thread at a time).
fn fan_out<F>(workers: usize, per: usize, f: F) -> Vec<Outcome>
where
    F: Fn(usize, usize) -> Outcome + Sync,
{
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..workers)
            .map(|w| {
                let f = &f;
                s.spawn(move || (0..per).map(|i| f(w, i)).collect::<Vec<_>>())
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().expect("worker panicked")).collect()
    })
}

fn latency_summary(outs: &[Outcome]) -> String {
    let mut d: Vec<Duration> = outs.iter().map(|o| o.elapsed).collect();
    d.sort();
    format!("median {:?}, p90 {:?}, max {:?}", percentile(&d, 50.0), percentile(&d, 90.0), d.last().copied().unwrap_or_default())
}

#[test]
fn concurrent_dual_stack_adds_and_dels_never_duplicate() {
    let bin = thereabouts_bin();
    let workers = knob("THAB_E2E_WORKERS", 16);
    let per = knob("THAB_E2E_PER_WORKER", 100);
    let n = workers * per;
    let tmp = TempDir::new("conc");
    let data = tmp.sub("data");
    // 16 x 100 live IPv4 addresses do not fit a documentation /24, so the IPv4 pool is
    // carved from 198.18.0.0/15 (RFC 2544 benchmarking space); these addresses only ever
    // live in pool files, never on an interface.
    let v4 = "198.18.0.0/21";
    let v6 = "2001:db8:c0::/64";
    let conf = thereabouts_conf("1.1.0", "thab-conc", &data, None, &[v4, v6]).to_string();

    let t0 = Instant::now();
    let adds = fan_out(workers, per, |w, i| Call::pod("ADD", &format!("conc-w{w}-i{i}"), &format!("pod-w{w}-i{i}")).run(&bin, &conf));
    let add_wall = t0.elapsed();
    assert_all_succeeded(&adds, "concurrent ADDs");

    // Results: two addresses each (v4 from the first range, v6 from the second), all distinct.
    let (net4, _) = range_network(v4);
    let (net6, _) = range_network(v6);
    let mut owner: HashMap<IpAddr, String> = HashMap::new();
    let mut dups = Vec::new();
    let mut expect: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for o in &adds {
        let ips = o.ips();
        assert_eq!(ips.len(), 2, "expected one v4 and one v6 address: {}", o.describe());
        let a4 = addr_of(&ips[0]);
        let a6 = addr_of(&ips[1]);
        assert!(matches!(a4, IpAddr::V4(_)) && range_network(&format!("{a4}/21")).0 == net4, "first address not in {v4}: {}", o.describe());
        assert!(matches!(a6, IpAddr::V6(_)) && range_network(&format!("{a6}/64")).0 == net6, "second address not in {v6}: {}", o.describe());
        assert!(ips[0].ends_with("/21") && ips[1].ends_with("/64"), "prefix length must be the range's: {ips:?}");
        for a in [a4, a6] {
            if let Some(prev) = owner.insert(a, o.call.container_id.clone()) {
                dups.push(format!("{a}: {prev} and {}", o.call.container_id));
            }
        }
        expect.insert(o.call.container_id.clone(), vec![a4, a6]);
    }
    assert!(dups.is_empty(), "{} duplicate addresses in ADD results, e.g. {:?}", dups.len(), &dups[..dups.len().min(10)]);

    // Pool files: parse, unique, and exactly the results (owner and address agree).
    let (pools, others) = read_store(&data).unwrap_or_else(|e| panic!("{e}"));
    let by_addr = check_unique(&pools).unwrap_or_else(|e| panic!("pool files after concurrent ADDs: {e}"));
    assert_eq!(by_addr.len(), 2 * n, "pool files hold {} allocations, expected {}", by_addr.len(), 2 * n);
    for (a, who) in &owner {
        let e = by_addr.get(a).unwrap_or_else(|| panic!("address {a} returned to {who} is not in any pool file"));
        assert_eq!(&e.id, who, "pool file says {a} belongs to {}, the ADD result gave it to {who}", e.id);
        assert_eq!(e.ifname, "eth0");
        assert!(e.podref.starts_with("default/pod-"), "podref {:?} for {who}", e.podref);
    }
    let pods: HashSet<&str> = by_addr.values().map(|a| a.podref.as_str()).collect();
    assert_eq!(pods.len(), n, "each pod must appear in the pools");

    // A repeated ADD for a live attachment must not allocate anything new.
    let again = Call::pod("ADD", "conc-w0-i0", "pod-w0-i0").run(&bin, &conf);
    again.expect_ok("repeated ADD of a live attachment");
    let ips: Vec<IpAddr> = again.ips().iter().map(|s| addr_of(s)).collect();
    assert_eq!(ips, expect["conc-w0-i0"], "repeated ADD (whereabouts: idempotent on podRef+ifname) returned other addresses");
    let (pools, _) = read_store(&data).unwrap();
    assert_eq!(count_allocs(&pools), 2 * n, "a repeated ADD changed the number of allocations");

    // Concurrent DELs free everything.
    let t1 = Instant::now();
    let dels = fan_out(workers, per, |w, i| Call::pod("DEL", &format!("conc-w{w}-i{i}"), &format!("pod-w{w}-i{i}")).run(&bin, &conf));
    let del_wall = t1.elapsed();
    assert_all_succeeded(&dels, "concurrent DELs");
    let (pools, others_after) = read_store(&data).unwrap_or_else(|e| panic!("{e}"));
    let left: Vec<String> = pools.iter().flat_map(|p| p.allocs.iter().map(|a| format!("{} {}", a.addr, a.id))).collect();
    assert!(left.is_empty(), "{} allocations left after all DELs: {:?}", left.len(), &left[..left.len().min(10)]);

    // DEL is idempotent (spec: MUST succeed when the state is already gone).
    Call::pod("DEL", "conc-w0-i0", "pod-w0-i0").run(&bin, &conf).expect_ok("repeated DEL");

    println!(
        "concurrency: {workers} concurrent processes x {per} dual-stack ADDs = {n} ADDs ({} addresses), 0 duplicates in results and pool files; \
         ADD wall {add_wall:?} ({:.0}/s; per call {}); {n} concurrent DELs wall {del_wall:?} (per call {}); 0 allocations left; \
         non-pool files in data dir: {} after ADDs, {} after DELs",
        2 * n,
        n as f64 / add_wall.as_secs_f64(),
        latency_summary(&adds),
        latency_summary(&dels),
        others.len(),
        others_after.len()
    );
}

/// Lowest free first under any concurrency: 16 ADDs at once on pools that do
/// not exist yet (in a data dir that does not exist, then in an empty one) get
/// exactly the addresses 16 calls one at a time would, in both ranges.
#[test]
fn concurrent_adds_on_a_new_pool_are_lowest_free() {
    let bin = thereabouts_bin();
    let tmp = TempDir::new("newpool");
    let want4: Vec<String> = (1..=16).map(|i| format!("192.0.2.{i}/27")).collect();
    let want6: Vec<String> = (1..=16).map(|i| format!("2001:db8:a::{i:x}/64")).collect();
    for round in 0..6 {
        let data = tmp.path().join(format!("data-{round}"));
        if round % 2 == 1 {
            std::fs::create_dir_all(&data).unwrap();
        }
        let conf = thereabouts_conf("1.1.0", "thab-newpool", &data, None, &["192.0.2.0/27", "2001:db8:a::/64"]).to_string();
        let adds = fan_out(16, 1, |w, _| Call::pod("ADD", &format!("np{round}-{w}"), &format!("np{round}-{w}")).run(&bin, &conf));
        assert_all_succeeded(&adds, "concurrent ADDs on a new pool");
        let mut got4: Vec<String> = adds.iter().map(|o| o.ips()[0].clone()).collect();
        let mut got6: Vec<String> = adds.iter().map(|o| o.ips()[1].clone()).collect();
        let by_addr = |a: &String| addr_of(a);
        got4.sort_by_key(by_addr);
        got6.sort_by_key(by_addr);
        assert_eq!((got4, got6), (want4.clone(), want6.clone()), "round {round} (data dir existed: {})", round % 2 == 1);
    }
}

/// Contention at exhaustion: more concurrent ADDs than IPv4 addresses. Every address goes
/// out exactly once, the losers get a CNI error object, and DEL of every attempted attachment
/// (what a runtime does after a failed ADD) leaves nothing behind.
#[test]
fn concurrent_adds_past_exhaustion_hand_out_each_address_once() {
    let bin = thereabouts_bin();
    let tmp = TempDir::new("exh");
    let data = tmp.sub("data");
    // The v6 range comes first, so a loser has already touched one pool when v4 runs out.
    let v6 = "2001:db8:e0::/64";
    let v4 = "192.0.2.0/28"; // .1 .. .14 usable
    let conf = thereabouts_conf("1.1.0", "thab-exh", &data, None, &[v6, v4]).to_string();
    let workers = 16;
    let per = 2;
    let outs = fan_out(workers, per, |w, i| Call::pod("ADD", &format!("exh-w{w}-i{i}"), &format!("exh-w{w}-i{i}")).run(&bin, &conf));
    let ok: Vec<&Outcome> = outs.iter().filter(|o| o.ok()).collect();
    for o in outs.iter().filter(|o| !o.ok()) {
        o.expect_cni_error("ADD past exhaustion");
    }
    let mut v4s = BTreeMap::new();
    for o in &ok {
        let ips = o.ips();
        assert_eq!(ips.len(), 2, "{}", o.describe());
        let a = addr_of(&ips[1]);
        if let Some(prev) = v4s.insert(a, o.call.container_id.clone()) {
            panic!("{a} handed to {prev} and {}", o.call.container_id);
        }
    }
    assert_eq!(ok.len(), 14, "a /28 has 14 usable addresses (.1-.14); {} ADDs succeeded: {:?}", ok.len(), v4s);
    let (pools, _) = read_store(&data).unwrap_or_else(|e| panic!("{e}"));
    check_unique(&pools).unwrap_or_else(|e| panic!("{e}"));
    let v4_pool: usize = pools.iter().filter(|p| p.range.contains('.')).map(|p| p.allocs.len()).sum();
    let v6_pool: usize = pools.iter().filter(|p| p.range.contains(':')).map(|p| p.allocs.len()).sum();
    assert_eq!(v4_pool, 14, "v4 pool entries");
    let leaked_v6 = v6_pool - 14;
    for o in &outs {
        Call::pod("DEL", &o.call.container_id, &o.call.container_id).run(&bin, &conf).expect_ok("DEL after exhaustion");
    }
    let (pools, _) = read_store(&data).unwrap();
    assert_eq!(count_allocs(&pools), 0, "allocations left after DEL of every attempted attachment");
    println!(
        "exhaustion: {} concurrent ADDs on a /28 (+v6): 14 succeeded with distinct v4 addresses, {} failed with a CNI error; \
         v6 addresses held by failed ADDs before their DEL: {leaked_v6}; all freed by DEL",
        outs.len(),
        outs.len() - ok.len()
    );
}

/// Fails with the count and the first few failures when any call failed.
fn assert_all_succeeded(outcomes: &[Outcome], what: &str) {
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.ok()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} {what} failed; first ones:\n{}",
        failed.len(),
        outcomes.len(),
        failed.iter().take(5).map(|o| o.describe()).collect::<Vec<_>>().join("\n---\n")
    );
}
