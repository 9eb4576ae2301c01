//! A rolling migration: whereabouts v0.9.4's own `ip-control-loop` and
//! `ip-reconciler` (built from its Go module) still run beside `thereabouts
//! controller`, on the same IPPools and reservations, while the plugin (the
//! thereabouts binary under a NAD that still says `whereabouts`) allocates.
//! Pods come and go without DELs; both sides race to free the gone ones.
//! The cluster must stay consistent: every live pod keeps its addresses and
//! reservations, every gone pod's are freed, no address is held twice.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, TempDir, thereabouts_bin};
use thereabouts_k8s_harness::controller::{self, Controller, Settings};
use thereabouts_k8s_harness::plugin::{Objects, RESERVATIONS};
use thereabouts_k8s_harness::whereabouts_controllers::WhereaboutsControllers;
use thereabouts_k8s_harness::{Cluster, block_on, peers, pods, wait_until};

const V4: &str = "192.0.2.0/24";
const V6: &str = "2001:db8::/64";
// No `network_name`: whereabouts v0.9.4's reconciler turns every `-` of a
// reservation's name back into `:` and so deletes the reservations of live
// pods on named networks at every run (its bug, docs/controller.md).
const POOLS: [&str; 2] = ["192.0.2.0-24", "2001-db8---64"];

/// The NAD's config, as a whereabouts user wrote it: `ipam.type` is still
/// `whereabouts`, which the thereabouts binary serves as a drop-in.
fn nad_conf(kubeconfig: &std::path::Path) -> Value {
    json!({"cniVersion": "1.0.0", "name": "blue", "type": "macvlan", "ipam": {
        "type": "whereabouts", "datastore": "kubernetes",
        "kubernetes": {"kubeconfig": kubeconfig},
        "ipRanges": [{"range": V4}, {"range": V6}],
    }})
}

/// whereabouts' reconciler frees the entries of a pod that is not Pending and
/// whose network-status lacks them, as it is between an ADD and multus'
/// annotation; it runs at the start of each minute. Waits until the next
/// boundary is at least `margin` away, so a short burst does not straddle it.
fn away_from_the_minute(margin: u64) {
    loop {
        let second = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() % 60;
        if (5..60 - margin).contains(&second) {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

struct Migration {
    cluster: Cluster,
    objects: Objects,
    conf: String,
}

impl Migration {
    /// A pod on node-1 that ran its ADD, is Running and reported by multus.
    fn running_pod(&self, pod: &str) -> Vec<IpAddr> {
        block_on(pods::create(&self.cluster, pod, "node-1")).unwrap();
        let mut call = Call::pod("ADD", &format!("cid-{pod}"), pod);
        call.ifname = "net1".into();
        let outcome = Invocation::new(call, self.conf.clone()).run(&thereabouts_bin());
        outcome.expect_ok("ADD");
        let ips: Vec<IpAddr> = outcome.ips().iter().map(|a| a.split('/').next().unwrap().parse().unwrap()).collect();
        block_on(pods::set_phase(&self.cluster, pod, "Running", "")).unwrap();
        block_on(pods::set_network_status(&self.cluster, pod, "blue", "net1", &ips)).unwrap();
        ips
    }

    /// podref → addresses its pool entries hold, over both pools.
    fn held(&self) -> BTreeMap<String, BTreeSet<IpAddr>> {
        let mut held: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
        for (pool, range) in POOLS.iter().zip([V4, V6]) {
            for (address, entry) in thereabouts_k8s_harness::held::pool_entries(&self.objects, pool, range).unwrap() {
                held.entry(entry.podref).or_default().insert(address);
            }
        }
        held
    }

    /// podref of each reservation, by name.
    fn reservations(&self) -> BTreeMap<String, String> {
        self.objects.list(RESERVATIONS).unwrap().into_iter().map(|(name, r)| (name, r["spec"]["podref"].as_str().unwrap_or_default().to_string())).collect()
    }
}

#[test]
fn whereabouts_own_controllers_beside_thereabouts_controller_keep_the_pools_consistent() {
    let cluster = Cluster::prepared().unwrap();
    let tmp = TempDir::new("interop");
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    let whereabouts = peers::whereabouts().expect("building whereabouts (tests/k8s-bins/build-peers.sh)");
    let install = block_on(whereabouts.install(&cluster)).unwrap();
    block_on(pods::node(&cluster, "node-1", true)).unwrap();
    let nad = nad_conf(&cluster.plugin_kubeconfig());
    block_on(controller::create_nad(&cluster, "blue", &nad)).unwrap();
    let m = Migration { objects: Objects::admin(&cluster).unwrap(), conf: nad.to_string(), cluster };

    let mut theirs = WhereaboutsControllers::start(&whereabouts, &install, &m.cluster, "node-1", tmp.path()).unwrap();
    // The unbacked grace as deployed: it is what keeps whereabouts' unguarded
    // reservation deletes from hitting a new holder's reservation.
    let settings = Settings { reconcile_interval_seconds: 5, unbacked_grace_seconds: 90, ..Settings::default() };
    let ours = Controller::run(&thereabouts_bin(), &kubeconfig, &settings, &tmp.path().join("controller.log")).unwrap();
    wait_until("thereabouts' controller leads", Duration::from_secs(20), Duration::from_millis(200), || {
        ours.metric("thereabouts_leader").unwrap_or(0.0) == 1.0
    });

    away_from_the_minute(25);
    let mut live: BTreeMap<String, Vec<IpAddr>> = (0..16).map(|i| format!("old-{i}")).map(|p| (p.clone(), m.running_pod(&p))).collect();
    // Half go without a DEL while new pods arrive and take addresses.
    away_from_the_minute(25);
    for i in 0..8 {
        let gone = format!("old-{}", 2 * i);
        block_on(pods::delete(&m.cluster, &gone)).unwrap();
        live.remove(&gone);
        let new = format!("new-{i}");
        live.insert(new.clone(), m.running_pod(&new));
    }
    wait_until("the gone pods' entries and reservations are freed", Duration::from_secs(30), Duration::from_millis(200), || {
        let held = m.held();
        let reservations = m.reservations();
        (0..8).all(|i| !held.contains_key(&format!("default/old-{}", 2 * i)) && !reservations.values().any(|p| p == &format!("default/old-{}", 2 * i)))
    });
    // whereabouts' reconciler must have passed over this state too.
    let runs = theirs.reconciler_runs();
    wait_until("whereabouts' reconciler ran over the final state", Duration::from_secs(75), Duration::from_millis(200), || theirs.reconciler_runs() > runs);
    assert!(theirs.running(), "whereabouts' controllers stopped; logs in {}", tmp.path().display());

    let held = m.held();
    let reservations = m.reservations();
    let mut seen = BTreeSet::new();
    for (pod, ips) in &live {
        let podref = format!("default/{pod}");
        assert!(ips.iter().all(|ip| seen.insert(*ip)), "an address handed out twice: {pod} {ips:?}");
        assert_eq!(held.get(&podref), Some(&ips.iter().copied().collect()), "{pod} lost or changed its entries");
        assert_eq!(reservations.values().filter(|p| **p == podref).count(), 2, "{pod}'s reservations");
    }
    assert_eq!(held.len(), live.len(), "entries of pods that are gone: {:?}", held.keys().collect::<Vec<_>>());
    assert_eq!(reservations.len(), 2 * live.len(), "reservations of pods that are gone: {reservations:?}");
    let conf_file = tmp.path().join("blue.conf");
    std::fs::write(&conf_file, &m.conf).unwrap();
    let check = Command::new(thereabouts_bin()).args(["pools", "--check", "--config"]).arg(&conf_file).env_remove("CNI_COMMAND").output().unwrap();
    assert_eq!(check.status.code(), Some(0), "pools --check: {}", String::from_utf8_lossy(&check.stdout));
}
