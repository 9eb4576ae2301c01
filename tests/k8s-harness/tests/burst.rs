//! The Kubernetes datastore under load and faults, against the real kube-apiserver:
//! the release `thereabouts` binary runs as a CNI plugin, one process per call,
//! many at once (as if from many nodes: distinct container IDs and pods), with the
//! least-privilege plugin identity of `deploy/rbac.yaml`.
//!
//! * a burst of 200 concurrent dual-stack ADDs, then 200 concurrent DELs;
//! * the apiserver killed in the middle of a burst of ADDs with a short deadline;
//! * ADDs and DELs while a whereabouts v0.9.4 peer keeps changing the same pool.
//!
//! Each call gets a generous deadline where the test checks correctness, not
//! speed (the `bench_k8s_burst` binary measures speed). Each test has a private
//! control plane and runs alone, whatever `--test-threads`: a burst of processes
//! takes the machine's cores, and the tests' outcomes (deadlines, a whole burst
//! finishing within its budget) must not depend on each other.
//!
//! Binary: `$THEREABOUTS_BIN`, else `target/plugin/thereabouts` (tests/k8s.sh builds it with scripts/build-plugin.sh).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use thereabouts_e2e::{Outcome, add_offset, range_network, thereabouts_bin};
use thereabouts_k8s_harness::Cluster;
use thereabouts_k8s_harness::addresses::reservation_name;
use thereabouts_k8s_harness::burst::{Network, pods, pods_of, run_concurrently, run_through_outage};
use thereabouts_k8s_harness::held::{check_held, check_history, pool_entries, reservations_in};
use thereabouts_k8s_harness::plugin::{Objects, kubernetes_conf};
use thereabouts_k8s_harness::report::{expect_all_ok, summary};
use thereabouts_k8s_harness::whereabouts::Churn;

/// The plugin's budget where the tests check correctness, not speed.
const GENEROUS: Duration = Duration::from_secs(120);

/// Held by each test for its whole run: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn network(cluster: &Cluster, name: &str, ranges: &[&'static str]) -> Network {
    Network::new(kubernetes_conf(name, &cluster.plugin_kubeconfig(), None, ranges), ranges, name)
}

/// [`check_history`] of `outcomes` against the IPPools as the admin reads them now.
fn check_calls(net: &Network, objects: &Objects, outcomes: &[&Outcome]) {
    let entries: Vec<_> = net.pools().iter().map(|(pool, range)| pool_entries(objects, pool, range).unwrap()).collect();
    check_history(outcomes, &entries);
}

/// [`check_held`] against the IPPools and reservations as the admin reads them.
fn check_results(net: &Network, objects: &Objects, outcomes: &[&Outcome]) -> Vec<BTreeMap<IpAddr, String>> {
    let entries: Vec<_> = net.pools().iter().map(|(pool, range)| pool_entries(objects, pool, range).unwrap()).collect();
    let reservations = reservations_in(objects, &net.ranges).unwrap();
    check_held(&net.ranges, outcomes, &entries, &reservations)
}

/// ≥ 200 concurrent dual-stack ADD processes on one config, then all their DELs
/// at once: every call succeeds, every pod has exactly one address per range and
/// no address is held twice — in the CNI results and in the IPPools as the admin
/// reads them — with one reservation per address; the DELs leave the pools empty
/// and no reservation behind.
#[test]
fn burst_of_200_concurrent_dual_stack_adds_then_dels() {
    const PODS: usize = 200;
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The CRDs and RBAC only: a burst must not depend on deploy/flowcontrol.yaml.
    let cluster = Cluster::prepared_with(false).expect("starting a control plane with the CRDs and RBAC");
    let objects = Objects::admin(&cluster).unwrap();
    let bin = thereabouts_bin();
    let net = network(&cluster, "k8s-burst200", &["192.0.2.0/24", "2001:db8:80::/64"]);
    let pods = pods("burst", PODS);

    let started = Instant::now();
    let adds = run_concurrently(&bin, &net.calls("ADD", &pods, GENEROUS), None);
    let wall = started.elapsed();
    eprintln!("{}", summary("burst ADD", &adds, wall, &net.log_stats("ADD", &adds), "API"));
    expect_all_ok(&adds, "concurrent ADD");
    let all: Vec<&Outcome> = adds.iter().collect();
    let held = check_results(&net, &objects, &all);
    check_calls(&net, &objects, &all);
    // Nothing else in the pools, and nothing but these reservations.
    for ((pool, range), seen) in net.pools().iter().zip(&held) {
        let entries = pool_entries(&objects, pool, range).unwrap();
        assert_eq!(entries.len(), PODS, "IPPool {pool} holds {PODS} entries");
        assert_eq!(entries.keys().collect::<BTreeSet<_>>(), seen.keys().collect(), "{pool}");
    }
    assert_eq!(reservations_in(&objects, &net.ranges).unwrap().len(), 2 * PODS, "one reservation per address");

    let started = Instant::now();
    let dels = run_concurrently(&bin, &net.calls("DEL", &pods, GENEROUS), None);
    let wall = started.elapsed();
    eprintln!("{}", summary("burst DEL", &dels, wall, &net.log_stats("DEL", &dels), "API"));
    expect_all_ok(&dels, "concurrent DEL");
    check_calls(&net, &objects, &adds.iter().chain(&dels).collect::<Vec<_>>());
    for (pool, _) in net.pools() {
        let left = objects.allocations(&pool).unwrap();
        assert!(left.is_empty(), "IPPool {pool} still holds {} entries: {left:?}", left.len());
    }
    let left = reservations_in(&objects, &net.ranges).unwrap();
    assert!(left.is_empty(), "{} reservations left: {left:?}", left.len());
    // The calls that took turns deleted their tickets.
    let tickets = objects.list_at("coordination.k8s.io/v1", "leases").unwrap();
    let tickets: Vec<&String> = tickets.iter().filter(|(_, l)| l.pointer("/metadata/labels/thereabouts.io~1turn").is_some()).map(|(n, _)| n).collect();
    assert!(tickets.is_empty(), "turn tickets left: {tickets:?}");
}

/// A turn ticket left by a plugin that was killed while it held its turn (a
/// Lease nobody renews, ahead of every new ticket) costs the contended ADDs
/// that queue behind it a wait, nothing else: its waiters delete it once the
/// queue showed no sign of life for a while, every ADD and DEL succeeds, and no
/// ticket is left.
#[test]
fn a_turn_ticket_left_by_a_killed_plugin_fails_nothing() {
    const PODS: usize = 30;
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::prepared_with(false).expect("starting a control plane with the CRDs and RBAC");
    let objects = Objects::admin(&cluster).unwrap();
    let bin = thereabouts_bin();
    let net = network(&cluster, "k8s-stale-turn", &["192.0.2.0/24", "2001:db8:81::/64"]);
    let pools: Vec<String> = net.pools().into_iter().map(|(p, _)| p).collect();
    let dead = json!({
        "metadata": {"name": "thereabouts-turn-dead", "labels": {"thereabouts.io/turn": "pools"}, "annotations": {"thereabouts.io/pools": pools.join(",")}},
        "spec": {"holderIdentity": "a plugin killed in its turn", "leaseDurationSeconds": 2}
    });
    objects.create_at("coordination.k8s.io/v1", "leases", &dead).unwrap();
    let tickets = || -> Vec<String> {
        let leases = objects.list_at("coordination.k8s.io/v1", "leases").unwrap();
        leases.into_iter().filter(|(_, l)| l.pointer("/metadata/labels/thereabouts.io~1turn").is_some()).map(|(n, _)| n).collect()
    };

    let pods = pods("stale-turn", PODS);
    let adds = run_concurrently(&bin, &net.calls("ADD", &pods, GENEROUS), None);
    expect_all_ok(&adds, "concurrent ADD behind a dead ticket");
    check_results(&net, &objects, &adds.iter().collect::<Vec<_>>());
    let dels = run_concurrently(&bin, &net.calls("DEL", &pods, GENEROUS), None);
    expect_all_ok(&dels, "concurrent DEL");
    assert_eq!(tickets(), Vec::<String>::new(), "the dead ticket, or a new one, was left");
}

/// The apiserver is killed (SIGKILL) while 100 ADDs with a 5 s deadline run,
/// once some have succeeded. Every ADD succeeds or answers CNI code 11 (try
/// again later), and none takes longer than its deadline plus a little (process
/// start on a busy machine). After the restart: every successful pod's
/// addresses are in the pools, unique and reserved; every other entry or
/// reservation belongs to a failed pod (a write whose answer was lost, or a
/// cleanup the outage cut off) and the DEL the runtime sends for each failed pod
/// succeeds and removes it, entries and reservations; then everything can be
/// released.
#[test]
fn apiserver_killed_during_a_burst_leaves_no_partial_allocation() {
    const PODS: usize = 100;
    const DEADLINE: Duration = Duration::from_secs(5);
    // Process start and teardown on two busy cores, and the plugin's bounded
    // cleanup of a failed commit (which fails fast: connections are refused).
    const SLACK: Duration = Duration::from_secs(2);
    // Kill once this many ADDs have succeeded, or at KILL_AT at the latest:
    // the others are in flight (100 processes starting at once on two cores
    // take a second or two before the first answers).
    const KILL_AFTER: usize = 10;
    const KILL_AT: Duration = Duration::from_secs(4);
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::prepared().expect("starting a prepared control plane");
    let objects = Objects::admin(&cluster).unwrap();
    let bin = thereabouts_bin();
    let net = network(&cluster, "k8s-fault", &["198.51.100.0/24", "2001:db8:81::/64"]);
    // The pools exist before the burst, as in a running cluster.
    let warm = net.invocation("ADD", "cid-warm", "warm", GENEROUS).run(&bin);
    warm.expect_ok("ADD before the burst");

    let pods = pods("fault", PODS);
    let outage = run_through_outage(&bin, &net.calls("ADD", &pods, DEADLINE), KILL_AFTER, KILL_AT, || cluster.stop_apiserver());
    let adds = &outage.outcomes;
    let line = summary("ADD during the outage", adds, outage.wall, &net.log_stats("ADD", adds), "API");
    let ok = outage.check("apiserver killed", line, DEADLINE, SLACK);
    let failed: Vec<&Outcome> = adds.iter().filter(|o| !o.ok()).collect();

    cluster.start_apiserver().expect("restarting kube-apiserver");
    // The successful pods: addresses present, unique, reserved.
    let mut holders: Vec<&Outcome> = ok.clone();
    holders.push(&warm);
    check_results(&net, &objects, &holders);
    // Anything else belongs to a failed pod (a commit whose answer was lost).
    let succeeded: BTreeSet<&str> = holders.iter().map(|o| o.call.container_id.as_str()).collect();
    let failed_cids: BTreeSet<&str> = failed.iter().map(|o| o.call.container_id.as_str()).collect();
    let failed_pods: BTreeSet<String> = failed.iter().map(|o| format!("default/{}", o.call.pod_name())).collect();
    let mut in_doubt = 0;
    for (pool, range) in net.pools() {
        for e in pool_entries(&objects, &pool, range).unwrap().values() {
            if !succeeded.contains(e.id.as_str()) {
                assert!(failed_cids.contains(e.id.as_str()), "IPPool {pool}: entry of nobody's ADD: {e:?}");
                in_doubt += 1;
            }
        }
    }
    let orphaned: Vec<String> = reservations_in(&objects, &net.ranges)
        .unwrap()
        .into_iter()
        .filter(|(_, spec)| failed_pods.contains(spec["podref"].as_str().unwrap_or_default()))
        .map(|(name, _)| name)
        .collect();
    eprintln!("after the restart: {in_doubt} pool entries and {} reservations of failed ADDs (written, answer lost or cleanup cut off)", orphaned.len());

    // The runtime's DEL for each failed ADD removes whatever it left.
    let dels = run_concurrently(&bin, &net.calls("DEL", &pods_of(&failed), GENEROUS), None);
    expect_all_ok(&dels, "DEL of a failed ADD");
    check_calls(&net, &objects, &std::iter::once(&warm).chain(adds).chain(&dels).collect::<Vec<_>>());
    for (pool, range) in net.pools() {
        let entries = pool_entries(&objects, &pool, range).unwrap();
        let stale: Vec<_> = entries.values().filter(|e| failed_cids.contains(e.id.as_str())).collect();
        assert!(stale.is_empty(), "IPPool {pool}: entries of failed ADDs after their DEL: {stale:?}");
        assert_eq!(entries.len(), holders.len(), "IPPool {pool}: exactly the successful pods' entries");
    }
    let stale: Vec<(String, Value)> = reservations_in(&objects, &net.ranges)
        .unwrap()
        .into_iter()
        .filter(|(_, spec)| failed_pods.contains(spec["podref"].as_str().unwrap_or_default()))
        .collect();
    assert!(stale.is_empty(), "reservations of failed ADDs after their DEL: {stale:?}");
    check_results(&net, &objects, &holders);

    // And the cluster carries on: the successful pods are released too.
    let dels = run_concurrently(&bin, &net.calls("DEL", &pods_of(&holders), GENEROUS), None);
    expect_all_ok(&dels, "DEL after the outage");
    for (pool, _) in net.pools() {
        assert!(objects.allocations(&pool).unwrap().is_empty(), "{pool}");
    }
    let left = reservations_in(&objects, &net.ranges).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Concurrent ADDs, then concurrent DELs, while a whereabouts peer ([`Churn`])
/// keeps adding and removing its own entries in the same IPv4 pool (and holds three
/// for good): no address is handed out twice, the plugin never touches the
/// other writer's entries or reservations (nor the other writer the plugin's),
/// and the DELs leave exactly the other writer's entries.
#[test]
fn allocations_while_a_whereabouts_client_writes_the_same_pool() {
    const PODS: usize = 40;
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::prepared().expect("starting a prepared control plane");
    let objects = Objects::admin(&cluster).unwrap();
    let bin = thereabouts_bin();
    let net = network(&cluster, "k8s-mixed", &["203.0.113.0/24", "2001:db8:82::/64"]);
    let (v4_pool, v4_range) = net.pools()[0].clone();
    let pods = pods("mixed", PODS);

    let writer = Churn::start(&cluster, &v4_pool, v4_range).expect("starting the whereabouts peer");
    let stop = AtomicBool::new(false);
    let (adds, dels, walls, writer) = std::thread::scope(|scope| {
        let background = scope.spawn(|| writer.run(&stop));
        // Stops the writer also when an assertion below fails (the scope waits for it).
        let _stop = StopOnDrop(&stop);
        let started = Instant::now();
        let adds = run_concurrently(&bin, &net.calls("ADD", &pods, GENEROUS), None);
        let add_wall = started.elapsed();
        // While the other writer goes on: the plugin's entries as the results say.
        expect_all_ok(&adds, "ADD beside a whereabouts writer");
        let all: Vec<&Outcome> = adds.iter().collect();
        let held = check_results(&net, &objects, &all);
        check_calls(&net, &objects, &all);
        let foreign: BTreeSet<IpAddr> = Churn::STICKY.iter().map(|o| add_offset(range_network(v4_range).0, *o)).collect();
        assert!(held[0].keys().all(|a| !foreign.contains(a)), "the plugin handed out a held address");
        let started = Instant::now();
        let dels = run_concurrently(&bin, &net.calls("DEL", &pods, GENEROUS), None);
        let del_wall = started.elapsed();
        stop.store(true, Ordering::SeqCst);
        (adds, dels, (add_wall, del_wall), background.join().unwrap())
    });
    let stats = &writer.stats;
    eprintln!(
        "{}\n{}\nwhereabouts writer: {} adds, {} removes, {} conflicts retried, {} reservations found taken",
        summary("ADD beside whereabouts", &adds, walls.0, &net.log_stats("ADD", &adds), "API"),
        summary("DEL beside whereabouts", &dels, walls.1, &net.log_stats("DEL", &dels), "API"),
        stats.adds,
        stats.removes,
        stats.conflicts,
        stats.reservations_lost
    );
    expect_all_ok(&dels, "DEL beside a whereabouts writer");
    check_calls(&net, &objects, &adds.iter().chain(&dels).collect::<Vec<_>>());
    assert!(stats.violations.is_empty(), "the other writer's entries changed: {:?}", stats.violations);
    assert!(stats.adds >= 2 && stats.adds + stats.removes + stats.conflicts >= 10, "the other writer kept writing: {stats:?}");

    // Exactly the other writer's entries remain, as it wrote them.
    let entries = pool_entries(&objects, &v4_pool, v4_range).unwrap();
    let remaining: BTreeMap<String, String> = entries.values().map(|e| (e.key.clone(), e.id.clone())).collect();
    let expected: BTreeMap<String, String> = writer.held().into_iter().map(|(o, id)| (o.to_string(), id)).collect();
    assert_eq!(remaining, expected, "IPPool {v4_pool} after the DELs");
    assert!(objects.allocations(&net.pools()[1].0).unwrap().is_empty());
    // Reservations: the other writer's (those it created), none of the plugin's pods.
    let reservations = reservations_in(&objects, &net.ranges).unwrap();
    let plugin_left: Vec<_> = reservations.iter().filter(|(_, spec)| spec["podref"].as_str().unwrap_or_default().starts_with("default/")).collect();
    // With the logs of the calls of their containers: a leak seen once in CI, never here.
    let logs: String = plugin_left
        .iter()
        .filter_map(|(_, spec)| spec["containerid"].as_str())
        .map(|cid| format!("--- ADD {cid}\n{}--- DEL {cid}\n{}", net.log_text("ADD", cid), net.log_text("DEL", cid)))
        .collect();
    assert!(plugin_left.is_empty(), "the plugin's reservations left: {plugin_left:?}\n{logs}");
    for (offset, id) in &writer.sticky {
        let name = reservation_name(writer.address(*offset));
        assert_eq!(reservations.get(&name).map(|s| s["podref"].clone()), Some(json!(format!("other/{id}"))), "{name}");
    }
    for (offset, id, uid) in &writer.churned {
        if uid.is_some() {
            let name = reservation_name(writer.address(*offset));
            assert_eq!(reservations.get(&name).map(|s| s["podref"].clone()), Some(json!(format!("other/{id}"))), "{name}");
        }
    }
}
