//! The migration window as a history: whereabouts v0.9.4 (built from its Go
//! module, installed from its own manifests, as its own ServiceAccount) and
//! thereabouts run as CNI plugins at once on the same pools, with the same
//! network config, half the pods each, interleaved; then all their DELs at
//! once, each pod's DEL by the other plugin (a node that changed plugin between
//! a pod's ADD and its DEL). The history of every call, whichever plugin made
//! it, is checked against an allocator's model (`thereabouts_e2e::history`): no
//! address certainly held by two pods at once, and the pools hold exactly what
//! the history leaves.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use thereabouts_e2e::history::{Attachment, History, Violation, attachment_of, attachment_of_entry};
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir, thereabouts_bin};
use thereabouts_k8s_harness::addresses::pool_name;
use thereabouts_k8s_harness::burst::pods;
use thereabouts_k8s_harness::held::{PoolEntry, check_history, entries_by_address};
use thereabouts_k8s_harness::plugin::Objects;
use thereabouts_k8s_harness::{Cluster, block_on, peers};

const RANGES: [&str; 2] = ["198.51.100.0/24", "2001:db8:83::/64"];
const NETWORK: &str = "mixed";
const BUDGET: Duration = Duration::from_secs(120);

/// Every call at once, each with its own plugin binary.
fn run_all(calls: &[(std::path::PathBuf, Invocation)]) -> Vec<Outcome> {
    let barrier = std::sync::Barrier::new(calls.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = calls
            .iter()
            .map(|(bin, inv)| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    inv.run(bin)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("runner thread")).collect()
    })
}

#[test]
fn whereabouts_and_thereabouts_allocating_from_the_same_pools_at_once() {
    const PODS: usize = 40;
    let wb = peers::whereabouts().expect("building whereabouts (tests/k8s-bins/build-peers.sh)");
    let cluster = Cluster::start().expect("starting etcd + kube-apiserver");
    let install = block_on(wb.install(&cluster)).expect("installing whereabouts' CRDs and RBAC");
    let dir = TempDir::new("mixed-fleet");
    let conf = peers::whereabouts_conf(dir.path(), &install.kubeconfig, NETWORK, &RANGES).unwrap().to_string();
    let objects = Objects::admin(&cluster).unwrap();
    let plugins = [wb.plugin.clone(), thereabouts_bin()];
    let pods = pods(NETWORK, PODS);
    let calls = |command: &str, shift: usize| -> Vec<(std::path::PathBuf, Invocation)> {
        let call = |(i, (cid, pod)): (usize, &(String, String))| {
            let invocation = Invocation::new(Call::pod(command, cid, pod), conf.clone()).budget(BUDGET).watchdog(BUDGET + Duration::from_secs(60));
            (plugins[(i + shift) % 2].clone(), invocation)
        };
        pods.iter().enumerate().map(call).collect()
    };
    let pools = || -> Vec<_> {
        RANGES
            .iter()
            .map(|range| entries_by_address("pool", range, objects.allocations(&format!("{NETWORK}-{}", pool_name(range))).unwrap()).unwrap())
            .collect()
    };

    let adds = run_all(&calls("ADD", 0));
    // thereabouts' ADDs all succeed; whereabouts' may fail where thereabouts
    // reserved an address first (it does not retry an ORIP that exists: 999).
    let thereabouts_pods: Vec<&String> = pods.iter().skip(1).step_by(2).map(|(cid, _)| cid).collect();
    let by_thereabouts = |o: &&Outcome| thereabouts_pods.contains(&&o.call.container_id);
    let failed: Vec<String> = adds.iter().filter(|o| !o.ok() && by_thereabouts(o)).map(Outcome::describe).collect();
    assert!(failed.is_empty(), "{} thereabouts ADDs failed: {failed:#?}", failed.len());
    let whereabouts_failed: Vec<Attachment> = adds.iter().filter(|o| !o.ok()).map(attachment_of).collect();
    eprintln!("whereabouts ADDs that failed beside thereabouts: {}", whereabouts_failed.len());
    let history = History::of(&adds.iter().collect::<Vec<_>>());
    assert_eq!(history.held_twice(), [], "an address held by two pods at once");
    // A failed whereabouts ADD may leave the ranges it wrote before the one that
    // failed, until the runtime's DEL (it does not roll back); nothing else may differ.
    let found = history.against(&held(&pools()));
    let unexplained: Vec<&Violation> = found.iter().filter(|v| !matches!(v, Violation::Leaked { by, .. } if whereabouts_failed.contains(by))).collect();
    assert!(unexplained.is_empty(), "the pools against the history: {unexplained:#?}");

    // Every pod's DEL, by the other plugin.
    let dels = run_all(&calls("DEL", 1));
    let failed: Vec<String> = dels.iter().filter(|o| !o.ok()).map(Outcome::describe).collect();
    assert!(failed.is_empty(), "{} DELs failed: {failed:#?}", failed.len());
    check_history(&adds.iter().chain(&dels).collect::<Vec<_>>(), &pools());
    assert!(pools().iter().all(|p| p.is_empty()), "entries left: {:?}", pools());
}

/// Who holds each address of the pools.
fn held(pools: &[BTreeMap<IpAddr, PoolEntry>]) -> BTreeMap<IpAddr, Attachment> {
    pools.iter().flatten().map(|(a, e)| (*a, attachment_of_entry(&e.podref, &e.id, &e.ifname))).collect()
}
