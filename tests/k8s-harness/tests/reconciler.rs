//! The reconciler of `thereabouts controller` against the real kube-apiserver:
//! real Pod objects on simulated nodes (status written as a kubelet would,
//! network-status as multus would), addresses from the release plugin through
//! the CNI protocol, and the controller with its identity from `deploy/`. The
//! decisions are pinned in-process (`host/src/controller/verdict.rs`); these
//! tests show the outcomes, including every "never free" race.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use thereabouts_e2e::{Call, Invocation, TempDir, thereabouts_bin};
use thereabouts_k8s_harness::LatencyProxy;
use thereabouts_k8s_harness::controller::{self, Controller, Settings};
use thereabouts_k8s_harness::plugin::{IPPOOLS, Objects, RESERVATIONS, kubernetes_conf};
use thereabouts_k8s_harness::pods;
use thereabouts_k8s_harness::{Cluster, block_on, wait_until};

const V4: &str = "192.0.2.0/24";
const V6: &str = "2001:db8::/64";
const POOLS: [&str; 2] = ["blue-192.0.2.0-24", "blue-2001-db8---64"];

/// A cluster with the controller's identity installed and a Ready node-1.
struct Setup {
    cluster: Cluster,
    objects: Objects,
    kubeconfig: std::path::PathBuf,
    conf: Value,
    tmp: TempDir,
}

fn setup(tag: &str) -> Setup {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    block_on(pods::node(&cluster, "node-1", true)).unwrap();
    let conf = kubernetes_conf("blue", &cluster.plugin_kubeconfig(), Some("blue"), &[V4, V6]);
    Setup { cluster, objects, kubeconfig, conf, tmp: TempDir::new(tag) }
}

impl Setup {
    fn controller(&self, settings: Settings) -> Controller {
        let c =
            Controller::run(&thereabouts_bin(), &self.kubeconfig, &settings, &self.tmp.path().join(format!("controller-{}.log", settings.identity))).unwrap();
        wait_until("the controller leads", Duration::from_secs(20), Duration::from_millis(100), || c.metric("thereabouts_leader").unwrap_or(0.0) == 1.0);
        c
    }

    /// The plugin's ADD on net1 for pod `default/<pod>` (container `cid`).
    fn add(&self, pod: &str, cid: &str) -> Vec<IpAddr> {
        let outcome = self.invocation("ADD", pod, cid).run(&thereabouts_bin());
        outcome.expect_ok("ADD");
        outcome.ips().iter().map(|a| a.split('/').next().unwrap().parse().unwrap()).collect()
    }

    fn invocation(&self, command: &str, pod: &str, cid: &str) -> Invocation {
        let mut call = Call::pod(command, cid, pod);
        call.ifname = "net1".into();
        Invocation::new(call, self.conf.to_string())
    }

    /// A pod on node-1 that ran its ADD, is Running and reported by multus.
    fn running_pod(&self, pod: &str) -> Vec<IpAddr> {
        block_on(pods::create(&self.cluster, pod, "node-1")).unwrap();
        let ips = self.add(pod, &format!("cid-{pod}"));
        block_on(pods::set_phase(&self.cluster, pod, "Running", "")).unwrap();
        block_on(pods::set_network_status(&self.cluster, pod, "blue", "net1", &ips)).unwrap();
        ips
    }

    /// Container IDs holding entries of `pod`, over both pools.
    fn entries_of(&self, pod: &str) -> Vec<String> {
        let podref = format!("default/{pod}");
        let mut out = Vec::new();
        for pool in POOLS {
            for entry in self.objects.allocations(pool).unwrap().values() {
                if entry["podref"] == podref.as_str() {
                    out.push(entry["id"].as_str().unwrap_or_default().to_string());
                }
            }
        }
        out
    }

    fn reservations_of(&self, pod: &str) -> usize {
        let podref = format!("default/{pod}");
        self.objects.list(RESERVATIONS).unwrap().values().filter(|r| r["spec"]["podref"] == podref.as_str()).count()
    }

    /// Waits for `n` more full passes than now.
    fn full_passes(&self, c: &Controller, n: f64) {
        let sample = r#"thereabouts_reconcile_passes_total{kind="full",outcome="ok"}"#;
        let start = c.metric(sample).unwrap();
        wait_until("full passes", Duration::from_secs(30), Duration::from_millis(100), || c.metric(sample).unwrap_or(0.0) >= start + n);
    }
}

fn fast_passes() -> Settings {
    Settings { reconcile_interval_seconds: 1, ..Settings::default() }
}

#[test]
fn a_pod_deleted_without_a_del_is_freed_within_seconds_with_an_event_and_a_metric() {
    let s = setup("reconcile-delete");
    s.running_pod("gone");
    s.running_pod("stays");
    let c = s.controller(Settings::default());
    assert_eq!((s.entries_of("gone").len(), s.reservations_of("gone")), (2, 2));

    block_on(pods::delete(&s.cluster, "gone")).unwrap();
    let deleted = Instant::now();
    wait_until("the gone pod's entries and reservations are freed", Duration::from_secs(10), Duration::from_millis(100), || {
        s.entries_of("gone").is_empty() && s.reservations_of("gone") == 0
    });
    eprintln!("delete to free: {} ms", deleted.elapsed().as_millis());
    assert_eq!((s.entries_of("stays").len(), s.reservations_of("stays")), (2, 2), "a live pod keeps its addresses");
    assert_eq!(c.metric(r#"thereabouts_addresses_freed_total{reason="pod_gone"}"#).unwrap(), 2.0);
    // With the controller's own rights (it may list pools, not get them).
    assert_eq!(c.metric(r#"thereabouts_reconcile_passes_total{kind="pod_delete",outcome="failed"}"#).unwrap(), 0.0);
    let events = block_on(pods::events_of(&s.cluster, "gone", "IPAddressGarbageCollected")).unwrap();
    assert_eq!(events.len(), 2, "one Event per address: {events:?}");
    assert!(events.iter().any(|e| e["message"].as_str().unwrap().contains("192.0.2.")), "{events:?}");
}

#[test]
fn pods_deleted_while_the_controller_was_stopped_are_freed_by_its_first_pass() {
    let s = setup("reconcile-start");
    for pod in ["p1", "p2", "p3"] {
        s.running_pod(pod);
    }
    block_on(pods::delete(&s.cluster, "p1")).unwrap();
    block_on(pods::delete(&s.cluster, "p2")).unwrap();
    let _c = s.controller(Settings::default());
    wait_until("p1 and p2 are freed", Duration::from_secs(10), Duration::from_millis(100), || {
        s.entries_of("p1").is_empty() && s.entries_of("p2").is_empty() && s.reservations_of("p1") + s.reservations_of("p2") == 0
    });
    assert_eq!(s.entries_of("p3").len(), 2);
}

#[test]
fn a_pending_pod_without_network_status_keeps_its_addresses() {
    let s = setup("reconcile-pending");
    block_on(pods::create(&s.cluster, "starting", "node-1")).unwrap();
    s.add("starting", "cid-starting");
    block_on(pods::set_phase(&s.cluster, "starting", "Pending", "")).unwrap();
    let c = s.controller(fast_passes());
    s.full_passes(&c, 3.0);
    assert_eq!((s.entries_of("starting").len(), s.reservations_of("starting")), (2, 2));
}

#[test]
fn a_completed_pod_is_freed_after_its_grace_and_not_before() {
    let s = setup("reconcile-completed");
    s.running_pod("job");
    s.running_pod("recent");
    block_on(pods::set_phase(&s.cluster, "job", "Succeeded", &pods::time_ago(30))).unwrap();
    block_on(pods::set_phase(&s.cluster, "recent", "Succeeded", &pods::time_ago(0))).unwrap();
    let c = s.controller(Settings { completed_grace_seconds: 3600, ..fast_passes() });
    s.full_passes(&c, 2.0);
    assert_eq!(s.entries_of("job").len(), 2, "within its grace (an hour) it keeps its addresses");
    drop(c);
    let c = s.controller(Settings { completed_grace_seconds: 25, ..fast_passes() });
    wait_until("the completed pod is freed", Duration::from_secs(10), Duration::from_millis(100), || s.entries_of("job").is_empty());
    assert_eq!(s.entries_of("recent").len(), 2);
    assert_eq!(c.metric(r#"thereabouts_addresses_freed_total{reason="pod_completed"}"#).unwrap(), 2.0);
}

#[test]
fn a_pod_on_a_node_that_stopped_reporting_keeps_its_addresses() {
    let s = setup("reconcile-unreachable");
    block_on(pods::node(&s.cluster, "node-2", true)).unwrap();
    for (pod, node) in [("lost", "node-2"), ("control", "node-1")] {
        block_on(pods::create(&s.cluster, pod, node)).unwrap();
        s.add(pod, &format!("cid-{pod}"));
        // Failed long ago: on a Ready node, that is a completed pod.
        block_on(pods::set_phase(&s.cluster, pod, "Failed", "2026-01-01T00:00:00Z")).unwrap();
    }
    block_on(pods::node(&s.cluster, "node-2", false)).unwrap();
    let c = s.controller(fast_passes());
    wait_until("the control pod on the Ready node is freed", Duration::from_secs(10), Duration::from_millis(100), || s.entries_of("control").is_empty());
    s.full_passes(&c, 2.0);
    assert_eq!((s.entries_of("lost").len(), s.reservations_of("lost")), (2, 2), "node-2 is NotReady: its pod may still run");
}

#[test]
fn a_statefulset_pod_re_created_under_its_name_keeps_its_address() {
    let s = setup("reconcile-statefulset");
    s.running_pod("db-0");
    // A slow controller (400 ms a request): its pass for the delete reads
    // the pools and the pod after the new pod's ADD, the race of whereabouts PR #624.
    let proxy = LatencyProxy::with_latency(&s.cluster, Duration::from_millis(400)).unwrap();
    let slow = s.tmp.path().join("slow.kubeconfig");
    proxy.kubeconfig(&s.kubeconfig, &slow).unwrap();
    // Its Lease lasts long enough for a renewal and a check at that latency.
    let settings = Settings { lease_seconds: 8, ..Settings::default() };
    let c = Controller::run(&thereabouts_bin(), &slow, &settings, &s.tmp.path().join("controller.log")).unwrap();
    wait_until("the slow controller has run its first pass", Duration::from_secs(30), Duration::from_millis(100), || {
        c.metric(r#"thereabouts_reconcile_passes_total{kind="full",outcome="ok"}"#).unwrap_or(0.0) >= 1.0
    });
    // Deleted and re-created at once, as the StatefulSet controller does; the
    // new pod's ADD takes the entry over (same pod and interface).
    block_on(pods::delete(&s.cluster, "db-0")).unwrap();
    block_on(pods::create(&s.cluster, "db-0", "node-1")).unwrap();
    let ips = s.add("db-0", "cid-db-0-new");
    let sample = r#"thereabouts_reconcile_passes_total{kind="pod_delete",outcome="ok"}"#;
    wait_until("the delete's pass ran", Duration::from_secs(20), Duration::from_millis(100), || c.metric(sample).unwrap_or(0.0) >= 1.0);
    assert_eq!(s.entries_of("db-0"), ["cid-db-0-new", "cid-db-0-new"], "the re-created pod's entries stay");
    assert_eq!(s.reservations_of("db-0"), 2);
    assert_eq!(ips.len(), 2);
}

#[test]
fn an_entry_with_an_empty_podref_is_reported_and_never_freed() {
    let s = setup("reconcile-no-podref");
    s.running_pod("live");
    let ops = serde_json::json!([{"op": "add", "path": "/spec/allocations/200", "value": {"id": "old-client", "podref": ""}}]);
    s.objects.json_patch(IPPOOLS, POOLS[0], &ops).unwrap().unwrap();
    let c = s.controller(fast_passes());
    s.full_passes(&c, 2.0);
    assert!(s.objects.allocations(POOLS[0]).unwrap().contains_key("200"));
    assert_eq!(c.metric(&format!(r#"thereabouts_pool_entries_without_podref{{datastore="kubernetes",pool="{}"}}"#, POOLS[0])).unwrap(), 1.0);
}

#[test]
fn an_entry_of_a_sandbox_its_running_pod_replaced_is_freed_and_the_current_one_kept() {
    let s = setup("reconcile-sandbox");
    s.running_pod("web");
    // What an ADD of an earlier sandbox of the pod left behind, on the same interface.
    let old = serde_json::json!({"id": "cid-web-old", "podref": "default/web", "ifname": "net1"});
    s.objects.json_patch(IPPOOLS, POOLS[0], &serde_json::json!([{"op": "add", "path": "/spec/allocations/100", "value": old}])).unwrap().unwrap();
    let c = s.controller(fast_passes());
    wait_until("the old sandbox's entry is freed", Duration::from_secs(10), Duration::from_millis(100), || {
        !s.objects.allocations(POOLS[0]).unwrap().contains_key("100")
    });
    assert_eq!(s.entries_of("web"), ["cid-web", "cid-web"], "the running sandbox keeps both its addresses");
    assert_eq!(c.metric(r#"thereabouts_addresses_freed_total{reason="sandbox_replaced"}"#).unwrap(), 1.0);
}
