//! The real whereabouts (built from its Go module by tests/k8s-bins/build-peers.sh)
//! against the real kube-apiserver, installed from its own manifests and running as
//! its own ServiceAccount, its CNI binary run as a container runtime runs it; and the
//! latency proxy that puts a cluster's network between a plugin and the apiserver.
//!
//! The tests share one control plane (each on a network of its own).

use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Outcome, TempDir};
use thereabouts_k8s_harness::log_stats::with_debug_log;
use thereabouts_k8s_harness::peers::{self, WhereaboutsInstall};
use thereabouts_k8s_harness::plugin::{IPPOOLS, Objects, RESERVATIONS};
use thereabouts_k8s_harness::{Cluster, LatencyProxy, block_on};

const RANGES: [&str; 2] = ["192.0.2.0/28", "2001:db8::/124"];

/// The control plane the tests share, with whereabouts' CRDs and RBAC installed.
fn shared() -> Arc<(Cluster, WhereaboutsInstall)> {
    static SHARED: Mutex<Weak<(Cluster, WhereaboutsInstall)>> = Mutex::new(Weak::new());
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(shared) = slot.upgrade() {
        return shared;
    }
    let wb = peers::whereabouts().expect("building whereabouts (tests/k8s-bins/build-peers.sh)");
    let cluster = Cluster::start().expect("starting etcd + kube-apiserver");
    let install = block_on(wb.install(&cluster)).expect("installing whereabouts' CRDs and RBAC");
    let shared = Arc::new((cluster, install));
    *slot = Arc::downgrade(&shared);
    shared
}

/// A dual-stack network config for whereabouts, logging at debug level into `dir`.
fn whereabouts_conf(dir: &Path, kubeconfig: &Path, network_name: &str) -> String {
    let conf = peers::whereabouts_conf(dir, kubeconfig, network_name, &RANGES).unwrap();
    with_debug_log(conf, &dir.join("whereabouts.log")).to_string()
}

fn run(command: &str, pod: &str, conf: &str) -> Outcome {
    let wb = peers::whereabouts().unwrap();
    let outcome = Call::pod(command, &format!("ctr-{pod}"), pod).run(&wb.plugin, conf);
    outcome.expect_ok(&format!("whereabouts {command} {pod}"));
    outcome
}

/// `{ name: spec }` of the objects of one kind whose name starts with `prefix`.
fn specs(objects: &Objects, plural: &str, prefix: &str) -> Vec<(String, Value)> {
    objects.list(plural).unwrap().into_iter().filter(|(n, _)| n.starts_with(prefix)).map(|(n, o)| (n, o["spec"].clone())).collect()
}

#[test]
fn whereabouts_allocates_dual_stack_for_two_pods_and_del_frees_them() {
    let shared = shared();
    let (cluster, install) = &*shared;
    let dir = TempDir::new("peers-wb");
    let conf = whereabouts_conf(dir.path(), &install.kubeconfig, "plain");

    assert_eq!(run("ADD", "pod-a", &conf).ips(), ["192.0.2.1/28", "2001:db8::1/124"]);
    assert_eq!(run("ADD", "pod-b", &conf).ips(), ["192.0.2.2/28", "2001:db8::2/124"]);

    let objects = Objects::admin(cluster).unwrap();
    let entry = |pod: &str| json!({"id": format!("ctr-{pod}"), "podref": format!("default/{pod}"), "ifname": "eth0"});
    let allocations = json!({"1": entry("pod-a"), "2": entry("pod-b")});
    assert_eq!(
        specs(&objects, IPPOOLS, "plain-"),
        [
            ("plain-192.0.2.0-28".to_string(), json!({"range": "192.0.2.0/28", "allocations": allocations})),
            ("plain-2001-db8---124".to_string(), json!({"range": "2001:db8::/124", "allocations": allocations})),
        ]
    );
    let reservation = |pod: &str| json!({"podref": format!("default/{pod}"), "ifname": "eth0"});
    assert_eq!(
        specs(&objects, RESERVATIONS, "plain-"),
        [
            ("plain-192.0.2.1".to_string(), reservation("pod-a")),
            ("plain-192.0.2.2".to_string(), reservation("pod-b")),
            ("plain-2001-db8--1".to_string(), reservation("pod-a")),
            ("plain-2001-db8--2".to_string(), reservation("pod-b")),
        ]
    );

    run("DEL", "pod-a", &conf);
    run("DEL", "pod-b", &conf);
    for (name, spec) in specs(&objects, IPPOOLS, "plain-") {
        assert_eq!(spec["allocations"], json!({}), "{name} after the DELs");
    }
    assert_eq!(specs(&objects, RESERVATIONS, "plain-"), []);
}

#[test]
fn whereabouts_kubeconfig_authenticates_as_its_service_account() {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let shared = shared();
    let (_, install) = &*shared;
    let user = block_on(async {
        let client = client(&install.kubeconfig).await;
        let review = kube::Api::<SelfSubjectReview>::all(client).create(&Default::default(), &Default::default()).await.expect("SelfSubjectReview");
        review.status.and_then(|s| s.user_info).and_then(|u| u.username)
    });
    let (namespace, name) = peers::WHEREABOUTS_SERVICE_ACCOUNT;
    assert_eq!(user, Some(format!("system:serviceaccount:{namespace}:{name}")));
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(kube::config::Kubeconfig::read_from(kubeconfig).unwrap(), &Default::default()).await.unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The fastest of `n` GETs of `/version` through `kubeconfig` (one connection,
/// kept alive, so each GET after the first is one round trip).
fn fastest_get(kubeconfig: &Path, n: usize) -> Duration {
    block_on(async {
        let client = client(kubeconfig).await;
        let mut fastest = Duration::MAX;
        for _ in 0..n {
            let t = Instant::now();
            client.apiserver_version().await.expect("GET /version");
            fastest = fastest.min(t.elapsed());
        }
        fastest
    })
}

#[test]
fn latency_proxy_delays_each_round_trip_and_whereabouts_works_through_it() {
    let shared = shared();
    let (cluster, install) = &*shared;
    let dir = TempDir::new("peers-latency");
    let proxy = LatencyProxy::start(cluster).expect("starting toxiproxy");
    let proxied = dir.path().join("whereabouts-proxied.kubeconfig");
    proxy.kubeconfig(&install.kubeconfig, &proxied).unwrap();

    // Each direction waits at least the toxic's latency, whatever the machine's load.
    let direct = fastest_get(&install.kubeconfig, 20);
    let through = fastest_get(&proxied, 20);
    assert!(through >= 2 * LatencyProxy::DEFAULT_LATENCY, "a GET through the proxy took {through:?}, direct {direct:?}");

    // The same dual-stack ADD, on a network of its own, through the proxy.
    let conf = whereabouts_conf(dir.path(), &proxied, "latency");
    assert_eq!(run("ADD", "pod-c", &conf).ips(), ["192.0.2.1/28", "2001:db8::1/124"]);
    run("DEL", "pod-c", &conf);
    let objects = Objects::admin(cluster).unwrap();
    assert_eq!(specs(&objects, RESERVATIONS, "latency-"), []);

    // The latency is configurable while connections are open.
    let slower = Duration::from_millis(5);
    proxy.set_latency(slower).unwrap();
    let through_slower = fastest_get(&proxied, 10);
    assert!(through_slower >= 2 * slower, "a GET through the proxy at {slower:?} each way took {through_slower:?}");
    eprintln!("GET /version, fastest: {direct:?} direct, {through:?} through the proxy at 1 ms, {through_slower:?} at 5 ms each way");
}
