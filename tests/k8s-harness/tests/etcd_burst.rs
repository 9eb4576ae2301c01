//! The etcd datastore under load and faults, against a real etcd (3.6, from
//! tests/k8s-bins): the release `thereabouts` binary runs as a CNI plugin, one
//! process per call, many at once (as if from many nodes: distinct container
//! IDs and pods), all writing the same pool keys.
//!
//! * a burst of 200 concurrent dual-stack ADDs, then 200 concurrent DELs;
//! * etcd killed (SIGKILL) in the middle of a burst of ADDs with a short deadline.
//!
//! Each call gets a generous deadline where the test checks correctness, not
//! speed (the `bench_etcd_burst` binary measures speed). Each test has its own
//! etcd and runs alone, whatever `--test-threads`: a burst of processes takes
//! the machine's cores, and deadlines must not depend on the other test.
//!
//! Binary: `$THEREABOUTS_BIN`, else `target/plugin/thereabouts` (tests/k8s.sh builds it with scripts/build-plugin.sh).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use thereabouts_e2e::{Outcome, thereabouts_bin};
use thereabouts_k8s_harness::addresses::reservation_name;
use thereabouts_k8s_harness::burst::{Network, pods, pods_of, run_concurrently, run_through_outage};
use thereabouts_k8s_harness::etcd::{Etcd, etcd_conf};
use thereabouts_k8s_harness::held::{PoolEntry, check_held, check_history};
use thereabouts_k8s_harness::report::{expect_all_ok, summary};

/// The datastore's default `etcd_prefix`.
const PREFIX: &str = "/thereabouts/";
/// The plugin's budget where the tests check correctness, not speed.
const GENEROUS: Duration = Duration::from_secs(120);

/// Held by each test for its whole run: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A burst's network on `etcd`, and what its keys hold as etcd's admin reads them.
struct EtcdNetwork<'a> {
    etcd: &'a Etcd,
    net: Network,
}

impl<'a> EtcdNetwork<'a> {
    fn new(etcd: &'a Etcd, name: &str, ranges: &[&'static str]) -> EtcdNetwork<'a> {
        EtcdNetwork { etcd, net: Network::new(etcd_conf(etcd.access(), name, ranges), ranges, name) }
    }

    /// The entries of each range's pool key, in range order.
    fn entries(&self) -> Vec<BTreeMap<IpAddr, PoolEntry>> {
        self.net.pools().iter().map(|(pool, range)| self.etcd.pool_entries(PREFIX, pool, range).unwrap()).collect()
    }

    /// Every reservation key under the prefix (these tests use no other ranges).
    fn reservations(&self) -> BTreeMap<String, Value> {
        self.etcd.reservations(PREFIX).unwrap()
    }

    /// [`check_held`] against the pool and reservation keys.
    fn check(&self, outcomes: &[&Outcome]) -> Vec<BTreeMap<IpAddr, String>> {
        check_held(&self.net.ranges, outcomes, &self.entries(), &self.reservations())
    }

    /// The pool keys exist and are empty, and no reservation key is left.
    fn check_empty(&self) {
        for ((pool, _), entries) in self.net.pools().iter().zip(self.entries()) {
            assert!(entries.is_empty(), "pool {pool} still holds {} entries: {entries:?}", entries.len());
            assert!(self.etcd.get(&format!("{PREFIX}pools/{pool}")).unwrap().is_some(), "pool key {pool} is gone");
        }
        let left = self.reservations();
        assert!(left.is_empty(), "{} reservation keys left: {left:?}", left.len());
    }
}

/// ≥ 200 concurrent dual-stack ADD processes on one config, then all their DELs
/// at once: every call succeeds, every pod has exactly one address per range and
/// no address is held twice — in the CNI results and in the pool keys as etcd's
/// admin reads them — with one reservation key per address; the DELs leave the
/// pool keys empty and no reservation key behind.
#[test]
fn burst_of_200_concurrent_dual_stack_adds_then_dels() {
    const PODS: usize = 200;
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let etcd = Etcd::start_plain().expect("starting etcd");
    let bin = thereabouts_bin();
    let en = EtcdNetwork::new(&etcd, "etcd-burst200", &["192.0.2.0/24", "2001:db8:90::/64"]);
    let (net, pods) = (&en.net, pods("burst", PODS));

    let started = Instant::now();
    let adds = run_concurrently(&bin, &net.calls("ADD", &pods, GENEROUS), None);
    let wall = started.elapsed();
    eprintln!("{}", summary("burst ADD", &adds, wall, &net.log_stats("ADD", &adds), "etcd"));
    expect_all_ok(&adds, "concurrent ADD");
    let all: Vec<&Outcome> = adds.iter().collect();
    let held = en.check(&all);
    check_history(&all, &en.entries());
    // Nothing else in the pools, and nothing but these reservations.
    for (((pool, _), entries), seen) in net.pools().iter().zip(en.entries()).zip(&held) {
        assert_eq!(entries.len(), PODS, "pool {pool} holds {PODS} entries");
        assert_eq!(entries.keys().collect::<BTreeSet<_>>(), seen.keys().collect(), "{pool}");
    }
    let reservations = en.reservations();
    let expected: BTreeSet<String> = held.iter().flat_map(|m| m.keys().map(|a| reservation_name(*a))).collect();
    assert_eq!(reservations.keys().cloned().collect::<BTreeSet<_>>(), expected, "one reservation key per address, no other");

    let started = Instant::now();
    let dels = run_concurrently(&bin, &net.calls("DEL", &pods, GENEROUS), None);
    let wall = started.elapsed();
    eprintln!("{}", summary("burst DEL", &dels, wall, &net.log_stats("DEL", &dels), "etcd"));
    expect_all_ok(&dels, "concurrent DEL");
    check_history(&adds.iter().chain(&dels).collect::<Vec<_>>(), &en.entries());
    en.check_empty();
}

/// etcd is killed (SIGKILL) while 100 ADDs with a 5 s deadline run, once some
/// have succeeded. Every ADD succeeds or answers CNI code 11 (try again later),
/// and none takes longer than its deadline plus a little (process start on a
/// busy machine). After etcd restarts on the same data: every successful pod's
/// addresses are in the pools, unique and reserved; a failed pod holds either
/// nothing or all it asked for (a multi-range ADD is one transaction; its answer
/// may have been lost), never one range without the other or an entry without
/// its reservation; the DEL the runtime sends for each failed pod succeeds and
/// leaves no entry and no reservation key of it; then everything can be released.
#[test]
fn etcd_killed_during_a_burst_leaves_no_partial_allocation() {
    const PODS: usize = 100;
    const DEADLINE: Duration = Duration::from_secs(5);
    // Process start and teardown on two busy cores.
    const SLACK: Duration = Duration::from_secs(2);
    // Kill once this many ADDs have succeeded, or at KILL_AT at the latest.
    const KILL_AFTER: usize = 10;
    const KILL_AT: Duration = Duration::from_secs(4);
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let etcd = Etcd::start_plain().expect("starting etcd");
    let bin = thereabouts_bin();
    let en = EtcdNetwork::new(&etcd, "etcd-fault", &["198.51.100.0/24", "2001:db8:91::/64"]);
    // The pools exist before the burst, as in a running cluster.
    let net = &en.net;
    let warm = net.invocation("ADD", "cid-warm", "warm", GENEROUS).run(&bin);
    warm.expect_ok("ADD before the burst");

    let pods = pods("fault", PODS);
    let outage = run_through_outage(&bin, &net.calls("ADD", &pods, DEADLINE), KILL_AFTER, KILL_AT, || etcd.kill());
    let adds = &outage.outcomes;
    let line = summary("ADD during the outage", adds, outage.wall, &net.log_stats("ADD", adds), "etcd");
    let ok = outage.check("etcd killed", line, DEADLINE, SLACK);
    let failed: Vec<&Outcome> = adds.iter().filter(|o| !o.ok()).collect();

    etcd.restart().expect("restarting etcd on the same data");
    let mut holders: Vec<&Outcome> = ok.clone();
    holders.push(&warm);
    en.check(&holders);
    // A failed pod holds all of its ADD (a transaction whose answer was lost)
    // or nothing: never one range without the other, never an entry without
    // its reservation key or a reservation key without its entry.
    let succeeded: BTreeSet<&str> = holders.iter().map(|o| o.call.container_id.as_str()).collect();
    let failed_cids: BTreeSet<&str> = failed.iter().map(|o| o.call.container_id.as_str()).collect();
    let failed_pods: BTreeSet<String> = failed.iter().map(|o| format!("default/{}", o.call.pod_name())).collect();
    let entries = en.entries();
    let reservations = en.reservations();
    let mut whole = 0;
    for cid in &failed_cids {
        let held: Vec<&PoolEntry> = entries.iter().flat_map(|m| m.values()).filter(|e| e.id == *cid).collect();
        let reserved: BTreeSet<String> = reservations.iter().filter(|(_, v)| v["containerid"] == *cid).map(|(n, _)| n.clone()).collect();
        let addresses: BTreeSet<String> = held.iter().map(|e| reservation_name(e.address)).collect();
        assert!(held.is_empty() || held.len() == net.ranges.len(), "{cid} holds {} of {} ranges: {held:?}", held.len(), net.ranges.len());
        assert_eq!(reserved, addresses, "{cid}: reservation keys and pool entries differ");
        whole += usize::from(!held.is_empty());
    }
    for (pool, m) in net.pools().iter().zip(&entries) {
        for e in m.values() {
            assert!(succeeded.contains(e.id.as_str()) || failed_cids.contains(e.id.as_str()), "pool {}: entry of nobody's ADD: {e:?}", pool.0);
        }
    }
    eprintln!("after the restart: {whole} failed ADDs had landed whole (answer lost), the others left nothing");

    // The runtime's DEL for each failed ADD removes whatever it left.
    let dels = run_concurrently(&bin, &net.calls("DEL", &pods_of(&failed), GENEROUS), None);
    expect_all_ok(&dels, "DEL of a failed ADD");
    check_history(&std::iter::once(&warm).chain(adds).chain(&dels).collect::<Vec<_>>(), &en.entries());
    for ((pool, _), m) in net.pools().iter().zip(en.entries()) {
        let stale: Vec<_> = m.values().filter(|e| failed_cids.contains(e.id.as_str())).collect();
        assert!(stale.is_empty(), "pool {pool}: entries of failed ADDs after their DEL: {stale:?}");
        assert_eq!(m.len(), holders.len(), "pool {pool}: exactly the successful pods' entries");
    }
    let stale: Vec<(String, Value)> = en.reservations().into_iter().filter(|(_, v)| failed_pods.contains(v["podref"].as_str().unwrap_or_default())).collect();
    assert!(stale.is_empty(), "reservation keys of failed ADDs after their DEL: {stale:?}");
    en.check(&holders);

    // And the datastore carries on: the successful pods are released too.
    let dels = run_concurrently(&bin, &net.calls("DEL", &pods_of(&holders), GENEROUS), None);
    expect_all_ok(&dels, "DEL after the outage");
    en.check_empty();
}
