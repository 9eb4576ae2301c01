//! The reconciler racing the plugin, on both shared datastores: bursts of
//! ADDs for pods created while the controller runs full passes back to back
//! (whereabouts#207 freed such fresh allocations), with pods deleted without
//! a DEL among them. Nothing live may be freed, no address handed out twice,
//! and every gone pod's addresses come back.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use thereabouts_e2e::{Call, Invocation, TempDir, thereabouts_bin};
use thereabouts_k8s_harness::controller::{self, Controller, Settings};
use thereabouts_k8s_harness::etcd::{Etcd, etcd_conf};
use thereabouts_k8s_harness::plugin::{Objects, kubernetes_conf};
use thereabouts_k8s_harness::{Cluster, block_on, pods, wait_until};

const V4: &str = "192.0.2.0/24";
const V6: &str = "2001:db8::/64";
const LIVE: usize = 200;
const GONE: usize = 20;

fn add(conf: &Value, pod: &str) -> Vec<IpAddr> {
    let mut call = Call::pod("ADD", &format!("cid-{pod}"), pod);
    call.ifname = "net1".into();
    let outcome = Invocation::new(call, conf.to_string()).run(&thereabouts_bin());
    outcome.expect_ok("ADD");
    outcome.ips().iter().map(|a| a.split('/').next().unwrap().parse().unwrap()).collect()
}

/// Creates each pod and runs its ADD at once, 20 at a time, while the
/// controller passes; the `gone` ones are deleted right after their ADD,
/// with no DEL. Answers what each live pod got.
fn burst(cluster: &Arc<Cluster>, conf: &Value) -> BTreeMap<String, Vec<IpAddr>> {
    let names: Vec<String> = (0..LIVE + GONE).map(|i| if i % 11 == 10 { format!("gone-{i}") } else { format!("live-{i}") }).collect();
    let chunks: Vec<Vec<String>> = names.chunks(names.len().div_ceil(20)).map(<[String]>::to_vec).collect();
    let handles: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            let (cluster, conf) = (cluster.clone(), conf.clone());
            std::thread::spawn(move || {
                let mut got = Vec::new();
                for pod in chunk {
                    block_on(pods::create(&cluster, &pod, "node-1")).unwrap();
                    let ips = add(&conf, &pod);
                    if pod.starts_with("gone") {
                        block_on(pods::delete(&cluster, &pod)).unwrap();
                    } else {
                        got.push((pod, ips));
                    }
                }
                got
            })
        })
        .collect();
    handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
}

/// The controller passing back to back (`--reconcile-interval-seconds 0`).
fn start(cluster: &Cluster, tmp: &TempDir, etcd_configs: Vec<std::path::PathBuf>) -> Controller {
    let kubeconfig = block_on(controller::install(cluster)).unwrap();
    block_on(pods::node(cluster, "node-1", true)).unwrap();
    let settings = Settings { reconcile_interval_seconds: 0, etcd_configs, ..Settings::default() };
    let c = Controller::run(&thereabouts_bin(), &kubeconfig, &settings, &tmp.path().join("controller.log")).unwrap();
    wait_until("the controller passes", Duration::from_secs(30), Duration::from_millis(200), || {
        c.metric(r#"thereabouts_reconcile_passes_total{kind="full",outcome="ok"}"#).unwrap_or(0.0) >= 2.0
    });
    c
}

/// Checks what `held` (podref → addresses held) says against what each live pod got.
fn check(got: &BTreeMap<String, Vec<IpAddr>>, held: &BTreeMap<String, BTreeSet<IpAddr>>, passes: f64) {
    assert_eq!(got.len(), LIVE);
    let mut seen = BTreeSet::new();
    for (pod, ips) in got {
        assert_eq!(ips.len(), 2, "{pod}: {ips:?}");
        assert!(ips.iter().all(|ip| seen.insert(*ip)), "an address handed out twice: {pod} {ips:?}");
        let podref = format!("default/{pod}");
        assert_eq!(held.get(&podref), Some(&ips.iter().copied().collect()), "{pod}'s live entries were freed or changed");
    }
    assert!(held.keys().all(|p| !p.contains("gone")), "a gone pod kept entries: {:?}", held.keys().filter(|p| p.contains("gone")).collect::<Vec<_>>());
    eprintln!("{LIVE} live pods kept their addresses, {GONE} gone pods freed, over {passes} full passes");
}

fn held_in(entries: impl IntoIterator<Item = (IpAddr, String)>) -> BTreeMap<String, BTreeSet<IpAddr>> {
    let mut held: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    for (address, podref) in entries {
        held.entry(podref).or_default().insert(address);
    }
    held
}

#[test]
fn adds_for_new_pods_during_back_to_back_passes_lose_nothing_on_kubernetes() {
    let cluster = Arc::new(Cluster::prepared().unwrap());
    let tmp = TempDir::new("races-k8s");
    let objects = Objects::admin(&cluster).unwrap();
    let c = start(&cluster, &tmp, Vec::new());
    let conf = kubernetes_conf("blue", &cluster.plugin_kubeconfig(), Some("blue"), &[V4, V6]);
    let got = burst(&cluster, &conf);
    let held = || {
        let mut entries = Vec::new();
        for (pool, range) in [("blue-192.0.2.0-24", V4), ("blue-2001-db8---64", V6)] {
            entries.extend(thereabouts_k8s_harness::held::pool_entries(&objects, pool, range).unwrap().into_values().map(|e| (e.address, e.podref)));
        }
        held_in(entries)
    };
    // A pass frees the entries first and the reservations after them.
    wait_until("the gone pods' entries and reservations are freed", Duration::from_secs(20), Duration::from_millis(200), || {
        held().keys().all(|p| !p.contains("gone")) && objects.reservations().unwrap().len() == 2 * LIVE
    });
    let passes = c.metric(r#"thereabouts_reconcile_passes_total{kind="full",outcome="ok"}"#).unwrap();
    check(&got, &held(), passes);
    let reservations = objects.reservations().unwrap();
    assert!(reservations.values().all(|spec| !spec["podref"].as_str().unwrap_or_default().contains("gone")), "a gone pod kept a reservation");
}

#[test]
fn adds_for_new_pods_during_back_to_back_passes_lose_nothing_on_etcd() {
    let cluster = Arc::new(Cluster::prepared().unwrap());
    let tmp = TempDir::new("races-etcd");
    let etcd = Etcd::start_plain().unwrap();
    let conf = etcd_conf(etcd.access(), "blue", &[V4, V6]);
    let conf_path = tmp.path().join("etcd.conf");
    std::fs::write(&conf_path, conf.to_string()).unwrap();
    let c = start(&cluster, &tmp, vec![conf_path]);
    let got = burst(&cluster, &conf);
    let held = || {
        let mut entries = Vec::new();
        for (pool, range) in [("192.0.2.0-24", V4), ("2001-db8---64", V6)] {
            entries.extend(etcd.pool_entries("/thereabouts/", pool, range).unwrap().into_values().map(|e| (e.address, e.podref)));
        }
        held_in(entries)
    };
    // A pass frees the entries first and the reservations after them.
    wait_until("the gone pods' entries and reservations are freed", Duration::from_secs(20), Duration::from_millis(200), || {
        held().keys().all(|p| !p.contains("gone")) && etcd.reservations("/thereabouts/").unwrap().len() == 2 * LIVE
    });
    let passes = c.metric(r#"thereabouts_reconcile_passes_total{kind="full",outcome="ok"}"#).unwrap();
    check(&got, &held(), passes);
    assert!(c.metric(r#"thereabouts_addresses_freed_total{reason="pod_gone"}"#).unwrap() >= (2 * GONE) as f64);
}
