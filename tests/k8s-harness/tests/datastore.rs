//! The Kubernetes datastore against the real kube-apiserver: the release
//! `thereabouts` binary runs as a CNI plugin (a process per call, `CNI_*`
//! environment, config on stdin) with the least-privilege plugin identity of
//! `deploy/rbac.yaml`, and the tests look at what it answers and at the
//! `IPPool` and `OverlappingRangeIPReservation` objects as the admin sees them.
//! The exact request sequence of each path is pinned in-process, against a mock
//! apiserver (`host/src/datastore/kubernetes/tests.rs`).
//!
//! Most tests share one control plane ([`Cluster::shared`]); each uses its own
//! ranges (and namespace, where it changes RBAC), so their pools and
//! reservations never meet. The test that stops the apiserver has a private one.
//!
//! Binary: `$THEREABOUTS_BIN`, else `target/plugin/thereabouts` (tests/k8s.sh builds it with scripts/build-plugin.sh).

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir, addr_of, thereabouts_bin};
use thereabouts_k8s_harness::addresses::pool_name;
use thereabouts_k8s_harness::apiserver_metrics::{Metrics, RequestCounts};
use thereabouts_k8s_harness::burst::{pods, pods_of, run_concurrently};
use thereabouts_k8s_harness::held::{check_held, pool_entries, reservations_in, reserves_in};
use thereabouts_k8s_harness::plugin::{IPPOOLS, Objects, RESERVATIONS, kubeconfig_variant, kubernetes_conf};
use thereabouts_k8s_harness::whereabouts::{self, Peer};
use thereabouts_k8s_harness::{Cluster, NAMESPACE, block_on};

const GROUP: &str = "whereabouts.cni.cncf.io";

fn shared() -> Arc<Cluster> {
    Cluster::shared().expect("starting the shared control plane")
}

/// A network config on `cluster` with the plugin identity, as stdin.
fn conf(cluster: &Cluster, name: &str, ranges: &[&str]) -> String {
    kubernetes_conf(name, &cluster.plugin_kubeconfig(), None, ranges).to_string()
}

/// Runs the plugin like a runtime would, with extra environment.
fn run(call: Call, stdin: &str, env: &[(&str, &str)]) -> Outcome {
    env.iter().fold(Invocation::new(call, stdin), |i, (k, v)| i.env(k, v)).run(&thereabouts_bin())
}

fn add(conf: &str, cid: &str, pod: &str) -> Outcome {
    run(Call::pod("ADD", cid, pod), conf, &[])
}

fn del(conf: &str, cid: &str, pod: &str) -> Outcome {
    run(Call::pod("DEL", cid, pod), conf, &[])
}

/// `command` for each of `pods` = (container ID, pod name), all at once.
fn at_once(command: &str, conf: &str, pods: &[(String, String)]) -> Vec<Outcome> {
    let calls: Vec<Invocation> = pods.iter().map(|(cid, pod)| Invocation::new(Call::pod(command, cid, pod), conf)).collect();
    run_concurrently(&thereabouts_bin(), &calls, None)
}

fn entry(cid: &str, pod: &str) -> Value {
    json!({"id": cid, "podref": format!("default/{pod}"), "ifname": "eth0"})
}

fn reservation(cid: &str, pod: &str) -> Value {
    json!({"containerid": cid, "podref": format!("default/{pod}"), "ifname": "eth0"})
}

/// The `resourceVersion` of each IPPool of `ranges` and each reservation of an
/// address in them: unchanged across a call = the call wrote nothing there.
fn versions(objects: &Objects, ranges: &[&str]) -> BTreeMap<String, Value> {
    let pools: Vec<String> = ranges.iter().map(|r| pool_name(r)).collect();
    let version = |(name, o): (String, Value)| (name, o["metadata"]["resourceVersion"].clone());
    let mut out: BTreeMap<String, Value> = objects.list(IPPOOLS).unwrap().into_iter().filter(|(n, _)| pools.contains(n)).map(version).collect();
    assert_eq!(out.len(), pools.len(), "every pool of {ranges:?} exists");
    out.extend(objects.list(RESERVATIONS).unwrap().into_iter().filter(|(n, _)| reserves_in(n, ranges)).map(version));
    out
}

/// The addresses (without prefix) of the results, checked unique.
fn unique_addresses(outcomes: &[Outcome]) -> Vec<String> {
    let all: Vec<String> = outcomes.iter().flat_map(|o| o.ips()).map(|a| addr_of(&a).to_string()).collect();
    assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), all.len(), "an address was handed out twice: {all:?}");
    all
}

/// The apiserver's request counts now (they are counted as a handler returns,
/// a moment after the client has the answer).
fn request_counts(metrics: &Metrics) -> RequestCounts {
    std::thread::sleep(Duration::from_millis(200));
    metrics.requests().expect("reading the apiserver's /metrics")
}

/// The plugin's whole dual-stack ADD into pools that do not exist yet: both
/// pools are created holding the entry, exactly in whereabouts' wire format, and
/// each address has its reservation; the next pod gets the next addresses.
#[test]
fn the_first_add_creates_the_pools_and_reservations_in_whereabouts_format() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let cs = conf(&cluster, "k8s-first", &["198.51.100.128/28", "2001:db8:61::/64"]);
    assert_eq!(add(&cs, "cid-a", "pod-a").expect_ok("ADD pod-a").ips(), ["198.51.100.129/28", "2001:db8:61::1/64"]);
    for (name, range) in [("198.51.100.128-28", "198.51.100.128/28"), ("2001-db8-61---64", "2001:db8:61::/64")] {
        let pool = objects.get(IPPOOLS, name).unwrap().expect("pool created");
        assert_eq!(
            (&pool["apiVersion"], &pool["kind"], &pool["metadata"]["namespace"]),
            (&json!(format!("{GROUP}/v1alpha1")), &json!("IPPool"), &json!(NAMESPACE))
        );
        assert_eq!(pool["spec"], json!({"range": range, "allocations": {"1": entry("cid-a", "pod-a")}}));
    }
    let reservations = objects.reservations().unwrap();
    assert_eq!(reservations.get("198.51.100.129"), Some(&reservation("cid-a", "pod-a")));
    assert_eq!(reservations.get("2001-db8-61--1"), Some(&reservation("cid-a", "pod-a")));
    assert_eq!(add(&cs, "cid-b", "pod-b").expect_ok("ADD pod-b").ips(), ["198.51.100.130/28", "2001:db8:61::2/64"]);
    assert_eq!(objects.allocations("2001-db8-61---64").unwrap()["2"], entry("cid-b", "pod-b"));
}

/// A repeated ADD answers the same addresses and writes nothing; a new sandbox
/// of the pod (new container ID) keeps them too, its entry now naming the new
/// container.
#[test]
fn a_repeated_add_or_a_new_sandbox_keeps_the_pods_addresses() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let ranges = ["198.51.100.144/28", "2001:db8:62::/64"];
    let cs = conf(&cluster, "k8s-again", &ranges);
    let first = add(&cs, "cid-a", "pod-a").expect_ok("ADD pod-a").ips();
    let before = versions(&objects, &ranges);
    assert_eq!(add(&cs, "cid-a", "pod-a").expect_ok("repeated ADD").ips(), first);
    assert_eq!(versions(&objects, &ranges), before, "a repeated ADD writes nothing");
    assert_eq!(add(&cs, "cid-a2", "pod-a").expect_ok("ADD of a new sandbox").ips(), first);
    assert_eq!(objects.allocations("198.51.100.144-28").unwrap(), BTreeMap::from([("1".to_string(), entry("cid-a2", "pod-a"))]));
}

/// CHECK compares the prevResult with the stored entries, STATUS asks the
/// apiserver, and `thereabouts pools` reads the same datastore.
#[test]
fn check_status_and_the_pools_report_read_the_datastore() {
    let cluster = shared();
    let cs = conf(&cluster, "k8s-check", &["198.51.100.160/28", "2001:db8:63::/64"]);
    add(&cs, "cid-a", "pod-a").expect_ok("ADD pod-a");
    let mut check: Value = serde_json::from_str(&cs).unwrap();
    check["prevResult"] = json!({"cniVersion": "1.1.0", "ips": [{"address": "198.51.100.161/28"}, {"address": "2001:db8:63::1/64"}]});
    run(Call::pod("CHECK", "cid-a", "pod-a"), &check.to_string(), &[]).expect_ok("CHECK pod-a");
    check["prevResult"]["ips"][0]["address"] = json!("198.51.100.169/28");
    run(Call::pod("CHECK", "cid-a", "pod-a"), &check.to_string(), &[]).expect_cni_error("CHECK with a wrong address");
    run(Call::global("STATUS"), &cs, &[]).expect_ok("STATUS");

    let tmp = TempDir::new("k8s-pools");
    let conf_file = tmp.path().join("net.conf");
    std::fs::write(&conf_file, &cs).unwrap();
    let out = Command::new(thereabouts_bin()).args(["pools", "--config", conf_file.to_str().unwrap(), "--output", "json"]).output().unwrap();
    assert!(out.status.success(), "pools: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["datastore"].as_str().unwrap().contains("kubernetes datastore: namespace kube-system"), "{report}");
    assert_eq!((&report["ranges"][0]["allocated"], &report["ranges"][1]["pool_name"]), (&json!("1"), &json!("2001-db8-63---64")), "{report}");
}

/// A DEL frees exactly its attachment's entries and reservations, also those
/// made under the pod's earlier container ID; a DEL of an unknown container, or
/// a repeated one, succeeds and writes nothing.
#[test]
fn del_frees_its_own_entries_and_reservations_only() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let ranges = ["198.51.100.176/28", "2001:db8:64::/64"];
    let cs = conf(&cluster, "k8s-del", &ranges);
    add(&cs, "cid-a", "pod-a").expect_ok("ADD pod-a");
    add(&cs, "cid-a2", "pod-a").expect_ok("ADD pod-a in a new sandbox");
    add(&cs, "cid-b", "pod-b").expect_ok("ADD pod-b");
    let before = versions(&objects, &ranges);
    del(&cs, "cid-unknown", "pod-x").expect_ok("DEL of an unknown container");
    assert_eq!(versions(&objects, &ranges), before, "a DEL of an unknown container writes nothing");

    del(&cs, "cid-a2", "pod-a").expect_ok("DEL pod-a");
    for pool in ["198.51.100.176-28", "2001-db8-64---64"] {
        assert_eq!(objects.allocations(pool).unwrap().keys().collect::<Vec<_>>(), ["2"], "{pool}");
    }
    let left: Vec<String> = reservations_in(&objects, &ranges).unwrap().into_keys().collect();
    assert_eq!(left, ["198.51.100.178", "2001-db8-64--2"], "pod-b's reservations stay, pod-a's go");
    let before = versions(&objects, &ranges);
    del(&cs, "cid-a2", "pod-a").expect_ok("repeated DEL pod-a");
    assert_eq!(versions(&objects, &ranges), before, "a repeated DEL writes nothing");
}

/// GC cannot tell this node's garbage from other nodes' entries in a shared
/// store: it frees nothing.
#[test]
fn gc_frees_nothing_in_a_shared_store() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let ranges = ["198.51.100.192/28"];
    let cs = conf(&cluster, "k8s-gc", &ranges);
    add(&cs, "cid-a", "pod-a").expect_ok("ADD pod-a");
    let before = versions(&objects, &ranges);
    let mut gc: Value = serde_json::from_str(&cs).unwrap();
    gc["cni.dev/valid-attachments"] = json!([]);
    run(Call::global("GC"), &gc.to_string(), &[]).expect_ok("GC");
    assert_eq!(versions(&objects, &ranges), before);
}

/// An ADD that reserved its addresses and then failed without cleaning up (the
/// apiserver went away, the process was killed) leaves reservations no pool
/// entry leads to. The DEL of that attachment finds them by their label and
/// frees them; a reservation that carries the same label value (the label is a
/// hash) but names another container stays.
#[test]
fn del_frees_the_reservations_a_failed_add_left() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let ranges = ["198.51.100.208/28", "2001:db8:65::/64"];
    let cs = conf(&cluster, "k8s-ghost", &ranges);
    add(&cs, "cid-ghost", "pod-ghost").expect_ok("ADD pod-ghost");
    for pool in ["198.51.100.208-28", "2001-db8-65---64"] {
        let ops: Vec<Value> = objects.allocations(pool).unwrap().keys().map(|k| json!({"op": "remove", "path": format!("/spec/allocations/{k}")})).collect();
        objects.json_patch(IPPOOLS, pool, &json!(ops)).unwrap().expect("emptying the pool");
    }
    let ghost = objects.get(RESERVATIONS, "198.51.100.209").unwrap().expect("pod-ghost's reservation");
    let label = &ghost["metadata"]["labels"]["thereabouts.cni.dev/attachment"];
    assert!(label.is_string(), "{ghost}");
    let same_label = json!({"apiVersion": format!("{GROUP}/v1alpha1"), "kind": "OverlappingRangeIPReservation",
        "metadata": {"name": "198.51.100.222", "labels": {"thereabouts.cni.dev/attachment": label}}, "spec": reservation("cid-someone-else", "pod-else")});
    objects.create(RESERVATIONS, &same_label).unwrap();
    del(&cs, "cid-ghost", "pod-ghost").expect_ok("DEL pod-ghost");
    let left = reservations_in(&objects, &ranges).unwrap();
    assert_eq!(left, BTreeMap::from([("198.51.100.222".to_string(), reservation("cid-someone-else", "pod-else"))]));
}

/// An `IPPool` exactly as whereabouts v0.9.4 writes it (see [`whereabouts`]),
/// with a pre-v0.8.0 entry that has no `ifname`.
const GOLDEN_POOL: &str = r#"
apiVersion: whereabouts.cni.cncf.io/v1alpha1
kind: IPPool
metadata:
  name: 192.0.2.80-28
  namespace: kube-system
  labels:
    app.kubernetes.io/managed-by: golden-test
  annotations:
    example.com/note: "written the way whereabouts writes pools"
spec:
  range: 192.0.2.80/28
  allocations:
    "1":
      id: 1f7d3c0a9b8e4f2a6c5d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b
      podref: default/golden-a
      ifname: net1
    "2":
      id: 2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70819
      podref: default/golden-b
    "4":
      id: 4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b
      podref: other/golden-c
      ifname: eth0
"#;

/// The plugin in a pool whereabouts wrote: new entries at the lowest free
/// offsets in whereabouts' exact shape, everything else byte for byte as it
/// was; its DEL frees a whereabouts entry (by container ID and interface) and
/// its reservation, and leaves the entry without `ifname` alone.
#[test]
fn a_whereabouts_pool_keeps_its_bytes_and_gets_whereabouts_entries() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let peer = Peer::admin(&cluster).unwrap();
    objects.create_yaml(IPPOOLS, GOLDEN_POOL).expect("creating the golden IPPool");
    for (ip, pod, ifname) in [("192.0.2.81", "default/golden-a", "net1"), ("192.0.2.82", "default/golden-b", ""), ("192.0.2.84", "other/golden-c", "eth0")] {
        peer.reserve(ip.parse().unwrap(), pod, ifname).unwrap().expect("a whereabouts reservation");
    }
    let read = || -> Value { serde_json::from_str(&objects.raw(IPPOOLS, "192.0.2.80-28").unwrap().unwrap()).unwrap() };
    let entry_text = |pool: &Value, key: &str| serde_json::to_string(&pool["spec"]["allocations"][key]).unwrap();
    let before = read();

    let cs = conf(&cluster, "k8s-golden", &["192.0.2.80/28"]);
    assert_eq!(add(&cs, "cid-g1", "golden-new-1").expect_ok("ADD into the golden pool").ips(), ["192.0.2.83/28"]);
    assert_eq!(add(&cs, "cid-g2", "golden-new-2").expect_ok("second ADD").ips(), ["192.0.2.85/28"]);
    let after = read();
    for key in ["1", "2", "4"] {
        assert_eq!(entry_text(&after, key), entry_text(&before, key), "entry {key}");
    }
    for field in ["labels", "annotations", "uid"] {
        assert_eq!(after["metadata"][field], before["metadata"][field], "{field}");
    }
    assert_eq!(after["spec"]["range"], "192.0.2.80/28");
    assert_eq!(entry_text(&after, "3"), r#"{"id":"cid-g1","ifname":"eth0","podref":"default/golden-new-1"}"#);
    assert_eq!(after["spec"]["allocations"]["5"], entry("cid-g2", "golden-new-2"));
    assert_eq!(after["spec"]["allocations"].as_object().unwrap().len(), 5);
    let reservations = objects.reservations().unwrap();
    assert_eq!(reservations["192.0.2.83"], reservation("cid-g1", "golden-new-1"));
    assert_eq!(reservations["192.0.2.82"], json!({"podref": "default/golden-b"}), "whereabouts' own reservations are untouched");

    let mut call = Call::pod("DEL", "1f7d3c0a9b8e4f2a6c5d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b", "golden-a");
    call.ifname = "net1".into();
    run(call, &cs, &[]).expect_ok("DEL of a whereabouts entry");
    assert_eq!(objects.allocations("192.0.2.80-28").unwrap().keys().collect::<Vec<_>>(), ["2", "3", "4", "5"]);
    let reservations = objects.reservations().unwrap();
    assert!(!reservations.contains_key("192.0.2.81") && reservations.contains_key("192.0.2.82"));
    let last = read();
    for key in ["2", "4"] {
        assert_eq!(entry_text(&last, key), entry_text(&before, key), "entry {key}");
    }
}

/// Two overlapping ranges (a /24 and a /28 in it) never hand out one address
/// twice: each plans the lowest free address around the other's reservations,
/// each address is reserved by the pod that got it, and the /28 runs out once
/// its 14 addresses are held by pods of either range.
#[test]
fn overlapping_ranges_never_share_an_address() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let (wide, narrow) = (conf(&cluster, "k8s-ovl-wide", &["203.0.113.0/24"]), conf(&cluster, "k8s-ovl-narrow", &["203.0.113.0/28"]));
    let mut outcomes = Vec::new();
    for i in 0..6 {
        outcomes.push(add(&wide, &format!("cid-w{i}"), &format!("w{i}")));
        outcomes.push(add(&narrow, &format!("cid-n{i}"), &format!("n{i}")));
    }
    for i in 6.. {
        let n = add(&narrow, &format!("cid-n{i}"), &format!("n{i}"));
        if !n.ok() {
            let e = n.expect_cni_error("ADD from a full /28");
            assert!(e["msg"].as_str().unwrap().contains("Could not allocate IP in range"), "{e}");
            break;
        }
        outcomes.push(n);
        assert!(i < 20, "the /28 never ran out");
    }
    let all = unique_addresses(&outcomes);
    assert_eq!(all[..4], ["203.0.113.1", "203.0.113.2", "203.0.113.3", "203.0.113.4"], "lowest free, around each other's reservations");
    let in_narrow = all.iter().filter(|a| (1..=14).any(|x| **a == format!("203.0.113.{x}"))).count();
    assert_eq!(in_narrow, 14, "every address of the /28 handed out once: {all:?}");
    let reservations = objects.reservations().unwrap();
    for (o, address) in outcomes.iter().zip(&all) {
        assert_eq!(reservations[address.as_str()]["podref"], format!("default/{}", o.call.pod_name()), "{address}");
    }

    for o in &outcomes {
        del(if o.call.pod_name().starts_with('w') { &wide } else { &narrow }, &o.call.container_id, o.call.pod_name()).expect_ok("DEL");
    }
    assert!(objects.allocations("203.0.113.0-24").unwrap().is_empty() && objects.allocations("203.0.113.0-28").unwrap().is_empty());
    assert!(reservations_in(&objects, &["203.0.113.0/24"]).unwrap().is_empty());
}

/// Without `enable_overlapping_ranges` nothing is reserved, so two overlapping
/// ranges both hand out their first address.
#[test]
fn without_overlapping_ranges_nothing_is_reserved() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let off = |range: &str| {
        let mut c = kubernetes_conf("k8s-ovl-off", &cluster.plugin_kubeconfig(), None, &[range]);
        c["ipam"]["enable_overlapping_ranges"] = json!(false);
        c.to_string()
    };
    assert_eq!(add(&off("198.51.100.0/25"), "cid-ow", "ow").expect_ok("ADD from the /25").ips(), ["198.51.100.1/25"]);
    assert_eq!(add(&off("198.51.100.0/25"), "cid-ow2", "ow2").expect_ok("second ADD").ips(), ["198.51.100.2/25"]);
    assert_eq!(add(&off("198.51.100.0/28"), "cid-on", "on").expect_ok("ADD from the /28").ips(), ["198.51.100.1/28"]);
    assert!(reservations_in(&objects, &["198.51.100.0/25"]).unwrap().is_empty());
}

/// `network_name` scopes pools and reservations: the same range in two named
/// networks is allocated independently.
#[test]
fn network_name_scopes_pools_and_reservations() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let kc = cluster.plugin_kubeconfig();
    for network in ["blue", "red"] {
        let cs = kubernetes_conf(&format!("k8s-{network}"), &kc, Some(network), &["192.0.2.96/28"]).to_string();
        assert_eq!(add(&cs, &format!("cid-{network}"), network).expect_ok("ADD").ips(), ["192.0.2.97/28"]);
        assert_eq!(objects.allocations(&format!("{network}-192.0.2.96-28")).unwrap()["1"], entry(&format!("cid-{network}"), network));
        assert_eq!(objects.reservations().unwrap()[&format!("{network}-192.0.2.97")]["podref"], format!("default/{network}"));
    }
}

/// A pod's sandbox re-created: the new container adopts the entry (same pod
/// and interface), then the old container's DEL comes. The entry stays, and so
/// must the reservation that guards it from overlapping ranges.
#[test]
fn the_old_containers_del_keeps_the_reservation_its_pod_still_uses() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let (wide, narrow) = (conf(&cluster, "k8s-renew", &["192.0.2.240/28"]), conf(&cluster, "k8s-renew-narrow", &["192.0.2.240/29"]));
    assert_eq!(add(&wide, "cid-r1", "renewed").ips(), ["192.0.2.241/28"]);
    assert_eq!(add(&wide, "cid-r2", "renewed").ips(), ["192.0.2.241/28"]);
    del(&wide, "cid-r1", "renewed").expect_ok("DEL of the old container");
    assert_eq!(objects.allocations("192.0.2.240-28").unwrap()["1"], entry("cid-r2", "renewed"));
    assert_eq!(objects.reservations().unwrap()["192.0.2.241"]["podref"], "default/renewed");
    assert_eq!(add(&narrow, "cid-o", "other").ips(), ["192.0.2.242/29"], "an overlapping range plans around the address");
    del(&wide, "cid-r2", "renewed").expect_ok("DEL of the new container");
    del(&narrow, "cid-o", "other").expect_ok("DEL other");
    assert!(!objects.reservations().unwrap().contains_key("192.0.2.241"));
}

/// A multi-range ADD whose second pool write is refused (the plugin identity may
/// patch only the first pool here) fails with the apiserver's answer named, and
/// leaves nothing: the first range's entry and both reservations are rolled back.
#[test]
fn a_failing_later_range_rolls_back_the_earlier_ones() {
    let cluster = shared();
    let ns = "thab-rollback";
    let objects = Objects::admin_in(&cluster, ns).unwrap();
    objects.ensure_namespace(ns).unwrap();
    let peer = Peer::admin_in(&cluster, ns).unwrap();
    for range in ["192.0.2.112/28", "192.0.2.128/28"] {
        peer.create_pool(&pool_name(range), range, &[]).unwrap();
    }
    objects
        .apply(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: thab-rollback, namespace: {ns}}}\nrules:\n\
             - {{apiGroups: [{GROUP}], resources: [ippools], verbs: [get, list, create]}}\n\
             - {{apiGroups: [{GROUP}], resources: [ippools], verbs: [patch], resourceNames: [192.0.2.112-28]}}\n\
             - {{apiGroups: [{GROUP}], resources: [overlappingrangeipreservations], verbs: [get, create, delete]}}\n\
             ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: thab-rollback, namespace: {ns}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: thab-rollback}}\n\
             subjects: [{{kind: ServiceAccount, name: thereabouts, namespace: kube-system}}]\n"
        ))
        .unwrap();
    block_on(cluster.wait_plugin_allowed("delete", GROUP, "overlappingrangeipreservations", ns)).unwrap();
    let tmp = TempDir::new("k8s-rollback");
    let kubeconfig = tmp.path().join("rollback.kubeconfig");
    kubeconfig_variant(&cluster.plugin_kubeconfig(), &kubeconfig, |kc| kc["contexts"][0]["context"]["namespace"] = json!(ns)).unwrap();
    let cs = kubernetes_conf("k8s-rollback", &kubeconfig, None, &["192.0.2.112/28", "192.0.2.128/28"]).to_string();

    let e = add(&cs, "cid-r", "pod-r").expect_cni_error("ADD whose second range cannot be written");
    let msg = e["msg"].as_str().unwrap();
    assert_eq!(e["code"], 999, "{e}");
    assert!(msg.contains("denied patching IPPool thab-rollback/192.0.2.128-28") && msg.contains("cannot patch resource \"ippools\""), "{msg}");
    assert!(objects.allocations("192.0.2.112-28").unwrap().is_empty() && objects.allocations("192.0.2.128-28").unwrap().is_empty());
    assert!(objects.reservations().unwrap().is_empty());
}

/// A multi-range ADD whose later range is full fails before anything is written:
/// the first range's pool is not even created.
#[test]
fn a_full_later_range_fails_the_add_before_anything_is_written() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let small = conf(&cluster, "k8s-small", &["192.0.2.160/30"]);
    add(&small, "cid-s1", "s1").expect_ok("ADD s1");
    add(&small, "cid-s2", "s2").expect_ok("ADD s2");
    let e = add(&conf(&cluster, "k8s-both", &["192.0.2.144/28", "192.0.2.160/30"]), "cid-s3", "s3").expect_cni_error("ADD with the second range full");
    assert!(e["msg"].as_str().unwrap().contains("Could not allocate IP in range"), "{e}");
    assert_eq!(objects.get(IPPOOLS, "192.0.2.144-28").unwrap(), None, "the first range's pool was not even created");
    assert!(reservations_in(&objects, &["192.0.2.144/28"]).unwrap().is_empty());
}

/// Concurrent ADD processes on one dual-stack config, while another writer keeps
/// annotating the same pool object: the racing pods conflict on reservations
/// (all of them plan the lowest free address first, then spread out), every pod
/// gets one address per range, held once, in its entry and its reservation; the
/// other writer's field survives, and the DELs leave nothing behind. (That the
/// annotations never fail a pool patch follows from the patch's shape, pinned in
/// `host/src/datastore/kubernetes/tests.rs`, and the apiserver's guards,
/// checked in `per_entry_guards_are_atomic_on_the_apiserver`.)
#[test]
fn concurrent_adds_under_interference_hand_out_unique_addresses() {
    const PODS: usize = 12;
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let metrics = Metrics::admin(&cluster).unwrap();
    let ranges = ["192.0.2.32/27", "2001:db8:74::/64"];
    let cs = conf(&cluster, "k8s-burst", &ranges);
    let first = add(&cs, "cid-first", "first");
    first.expect_ok("first ADD (creates the pools)");

    let stop = AtomicBool::new(false);
    let (outcomes, writes, counted) = std::thread::scope(|scope| {
        let interferer = scope.spawn(|| {
            let mut writes = 0u32;
            while !stop.load(Ordering::Relaxed) {
                objects.annotate(IPPOOLS, "192.0.2.32-27", "example.com/touched", &writes.to_string()).unwrap();
                writes += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            writes
        });
        let before = request_counts(&metrics);
        let outcomes = at_once("ADD", &cs, &pods("burst", PODS));
        let counted = request_counts(&metrics).since(&before);
        stop.store(true, Ordering::Relaxed);
        (outcomes, interferer.join().unwrap(), counted)
    });
    let taken = counted.of("POST", RESERVATIONS, "409");
    eprintln!("{PODS} concurrent dual-stack ADDs, {writes} interfering writes: the apiserver answered {taken} reservation creates 409");
    // Counted by the shared apiserver: other tests' conflicts only add to it.
    assert!(taken > 0.0, "the ADDs should have raced for the same addresses");
    let holders: Vec<&Outcome> = outcomes.iter().chain([&first]).map(|o| o.expect_ok("concurrent ADD")).collect();
    let entries: Vec<_> = ranges.iter().map(|r| pool_entries(&objects, &pool_name(r), r).unwrap()).collect();
    let reserved = reservations_in(&objects, &ranges).unwrap();
    check_held(&ranges, &holders, &entries, &reserved);
    assert_eq!((entries[0].len(), entries[1].len(), reserved.len()), (PODS + 1, PODS + 1, 2 * (PODS + 1)));
    let annotations = &objects.get(IPPOOLS, "192.0.2.32-27").unwrap().unwrap()["metadata"]["annotations"];
    assert_eq!(annotations["example.com/touched"], (writes - 1).to_string(), "the other writer's field survives");

    for o in at_once("DEL", &cs, &pods_of(&holders)) {
        o.expect_ok("concurrent DEL");
    }
    assert!(objects.allocations("192.0.2.32-27").unwrap().is_empty() && objects.allocations("2001-db8-74---64").unwrap().is_empty());
    let left = reservations_in(&objects, &ranges).unwrap();
    assert!(left.is_empty(), "reservations left behind: {left:?}");
}

/// What the Kubernetes datastore's per-entry compare-and-swap relies on, checked
/// on the real apiserver with the exact patch shapes `host/src/datastore/kubernetes/patch.rs`
/// sends (its unit tests pin them): a `test` against `null` passes only while the
/// entry is absent, a failed `test` refuses the whole patch (422) and changes
/// nothing, a patch without a `resourceVersion` test applies to the object as
/// stored whatever was written since, and a whereabouts patch (which tests the
/// `resourceVersion` it read) is refused after any write of ours.
#[test]
fn per_entry_guards_are_atomic_on_the_apiserver() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let peer = Peer::admin(&cluster).unwrap();
    let pool = "192.0.2.176-28";
    let e = |cid: &str| entry(cid, cid);
    peer.create_pool(pool, "192.0.2.176/28", &[(1, e("cid-1"))]).unwrap();
    let (read, _) = peer.read(pool).unwrap();
    let patch = |ops: Value| objects.json_patch(IPPOOLS, pool, &ops).unwrap();
    let insert = |offset: u32, cid: &str| {
        let path = format!("/spec/allocations/{offset}");
        json!([{"op": "test", "path": path, "value": null}, {"op": "add", "path": path, "value": e(cid)}])
    };
    let remove = |offset: u32, id: &str| json!([{"op": "test", "path": format!("/spec/allocations/{offset}/id"), "value": id}, {"op": "remove", "path": format!("/spec/allocations/{offset}")}]);

    // whereabouts, on the version it read, takes offset 5 after our read.
    patch(whereabouts::insert_patch(&read, 5, &e("cid-wb"))).expect("whereabouts' patch on a fresh read");
    // Our insert planned on the old read for the same offset: refused, entry intact.
    assert_eq!(patch(insert(5, "cid-late")).err(), Some(422));
    assert_eq!(objects.allocations(pool).unwrap()["5"], e("cid-wb"));
    // An insert of another offset applies although the pool moved since our read.
    assert_eq!(patch(insert(6, "cid-6")).expect("an insert of a free offset on a stale read")["spec"]["allocations"]["6"], e("cid-6"));
    // whereabouts planning on its stale read is refused after our write, whatever
    // offset it wants: it reads again and never overwrites our entries.
    assert_eq!(patch(whereabouts::insert_patch(&read, 7, &e("cid-wb7"))).err(), Some(422));
    // A removal tests the id it read: someone else's entry at that offset stays.
    assert_eq!(patch(remove(5, "cid-late")).err(), Some(422));
    assert_eq!(patch(remove(9, "cid-9")).err(), Some(422), "an entry that is gone");
    patch(remove(6, "cid-6")).expect("removing our own entry");
    // One refused test refuses the whole patch: nothing of it is applied.
    let mixed = [insert(8, "cid-8").as_array().unwrap().clone(), insert(5, "cid-x").as_array().unwrap().clone()].concat();
    assert_eq!(patch(json!(mixed)).err(), Some(422));
    assert_eq!(objects.allocations(pool).unwrap().keys().collect::<Vec<_>>(), ["1", "5"]);
    objects.delete(IPPOOLS, pool).unwrap();
}

/// Without `enable_overlapping_ranges` no reservation keeps racing pods apart:
/// the per-entry guards of the pool patch are the only thing between them. Many
/// ADD processes (all planning the same lowest free offsets at first) and a
/// whereabouts peer (its own allocation loop, without reservations) fill one
/// dual-stack pool at the same time: every address is held by exactly the
/// container it was given to, none twice, and the DELs leave only the peer's.
#[test]
fn racing_writers_without_reservations_never_share_an_address() {
    const PODS: usize = 16;
    const WHEREABOUTS: usize = 8;
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let metrics = Metrics::admin(&cluster).unwrap();
    let peer = Peer::admin(&cluster).unwrap();
    let ranges = ["192.0.2.0/27", "2001:db8:79::/64"];
    let mut c = kubernetes_conf("k8s-race", &cluster.plugin_kubeconfig(), None, &ranges);
    c["ipam"]["enable_overlapping_ranges"] = json!(false);
    let cs = c.to_string();
    let first = add(&cs, "cid-first", "first");
    first.expect_ok("first ADD (creates the pools)");

    let before = request_counts(&metrics);
    let (outcomes, taken) = std::thread::scope(|scope| {
        let whereabouts = scope.spawn(|| {
            let allocate = |i| {
                let id = format!("cid-wb-{i}");
                let (offset, refused) = peer.allocate("192.0.2.0-27", ranges[0], &whereabouts::entry(&id, &format!("other/{id}"), "eth0"), false).unwrap();
                ((offset, id), refused)
            };
            (0..WHEREABOUTS).map(allocate).collect::<Vec<_>>()
        });
        (at_once("ADD", &cs, &pods("race", PODS)), whereabouts.join().unwrap())
    });
    let refused = request_counts(&metrics).since(&before).of("PATCH", IPPOOLS, "422");
    let peer_refused: usize = taken.iter().map(|(_, r)| r).sum();
    eprintln!(
        "{PODS} racing dual-stack ADDs without reservations + {WHEREABOUTS} whereabouts inserts: the apiserver refused {refused} pool patches, {peer_refused} of them the peer's"
    );
    // Counted by the shared apiserver: other tests' refusals only add to it.
    assert!(refused > peer_refused as f64, "the ADDs should have raced for the same offsets");

    let holders: Vec<&Outcome> = outcomes.iter().chain([&first]).map(|o| o.expect_ok("racing ADD")).collect();
    unique_addresses(&outcomes);
    let entries: Vec<_> = ranges.iter().map(|r| pool_entries(&objects, &pool_name(r), r).unwrap()).collect();
    for o in &holders {
        for (address, pool) in o.ips().iter().zip(&entries) {
            assert_eq!(pool[&addr_of(address)].id, o.call.container_id, "{address}");
        }
    }
    let v4 = objects.allocations("192.0.2.0-27").unwrap();
    for ((offset, cid), _) in &taken {
        assert_eq!(v4[&offset.to_string()]["id"], *cid, "whereabouts' entry at {offset}");
    }
    assert_eq!((v4.len(), entries[1].len()), (1 + PODS + WHEREABOUTS, 1 + PODS));

    for o in at_once("DEL", &cs, &pods_of(&holders)) {
        o.expect_ok("racing DEL");
    }
    let left: BTreeSet<String> = objects.allocations("192.0.2.0-27").unwrap().into_keys().collect();
    assert_eq!(left, taken.iter().map(|((o, _), _)| o.to_string()).collect(), "only whereabouts' entries remain");
    assert!(objects.allocations("2001-db8-79---64").unwrap().is_empty());
    objects.delete(IPPOOLS, "192.0.2.0-27").unwrap();
    objects.delete(IPPOOLS, "2001-db8-79---64").unwrap();
}

#[test]
fn bad_kubeconfigs_and_missing_rights_are_clear_errors_that_write_nothing() {
    let cluster = shared();
    let tmp = TempDir::new("k8s-badkc");
    let ranges = ["192.0.2.192/28"];
    let with = |kubeconfig: &std::path::Path| kubernetes_conf("k8s-bad", kubeconfig, None, &ranges).to_string();

    let missing = tmp.path().join("missing.kubeconfig");
    let e = add(&with(&missing), "cid-1", "p1").expect_cni_error("ADD with a missing kubeconfig");
    assert!(e["code"] == 7 && e["msg"].as_str().unwrap().contains(missing.to_str().unwrap()), "{e}");
    assert_eq!(del(&with(&missing), "cid-1", "p1").expect_cni_error("DEL with a missing kubeconfig")["code"], 7);

    let garbage = tmp.path().join("garbage.kubeconfig");
    std::fs::write(&garbage, "clusters: [oops").unwrap();
    assert_eq!(add(&with(&garbage), "cid-1", "p1").expect_cni_error("ADD with an unparsable kubeconfig")["code"], 7);

    // A token the apiserver does not know: 401, named.
    let wrong_token = tmp.path().join("wrong-token.kubeconfig");
    kubeconfig_variant(&cluster.plugin_kubeconfig(), &wrong_token, |kc| kc["users"][0]["user"]["token"] = json!("not-a-valid-token")).unwrap();
    let e = add(&with(&wrong_token), "cid-1", "p1").expect_cni_error("ADD with a wrong token");
    let msg = e["msg"].as_str().unwrap();
    assert!(e["code"] == 999 && msg.contains(&cluster.server_url()) && msg.contains("401"), "{e}");

    // The plugin identity in a namespace its Role does not cover: 403, naming it.
    let elsewhere = tmp.path().join("default-ns.kubeconfig");
    kubeconfig_variant(&cluster.plugin_kubeconfig(), &elsewhere, |kc| kc["contexts"][0]["context"]["namespace"] = json!("default")).unwrap();
    let e = add(&with(&elsewhere), "cid-1", "p1").expect_cni_error("ADD in a forbidden namespace");
    let msg = e["msg"].as_str().unwrap();
    assert_eq!(e["code"], 999, "{e}");
    assert!(msg.contains("forbidden") && msg.contains("cannot list resource \"ippools\"") && msg.contains("namespace \"default\""), "{msg}");
    assert_eq!(run(Call::global("STATUS"), &with(&elsewhere), &[]).expect_cni_error("STATUS in a forbidden namespace")["code"], 50);

    for ns in [NAMESPACE, "default"] {
        let objects = Objects::admin_in(&cluster, ns).unwrap();
        assert_eq!(objects.get(IPPOOLS, "192.0.2.192-28").unwrap(), None, "{ns}");
        assert!(reservations_in(&objects, &ranges).unwrap().is_empty(), "{ns}");
    }
}

#[test]
fn apiserver_down_is_try_again_later_within_the_deadline() {
    let cluster = Cluster::prepared().expect("starting a prepared control plane");
    let objects = Objects::admin(&cluster).unwrap();
    let cs = conf(&cluster, "k8s-down", &["192.0.2.208/28", "2001:db8:72::/64"]);
    add(&cs, "cid-1", "p1").expect_ok("ADD before the outage");

    cluster.stop_apiserver();
    let budget = [("THEREABOUTS_TIMEOUT_MS", "3000")];
    let down = run(Call::pod("ADD", "cid-2", "p2"), &cs, &budget);
    let e = down.expect_cni_error("ADD while the apiserver is down");
    let msg = e["msg"].as_str().unwrap();
    assert!(e["code"] == 11 && msg.contains(&cluster.server_url()) && msg.contains("unavailable"), "{}", down.describe());
    assert!(down.elapsed < Duration::from_secs(5), "answered after {:?}", down.elapsed);
    assert_eq!(run(Call::pod("DEL", "cid-1", "p1"), &cs, &budget).expect_cni_error("DEL while the apiserver is down")["code"], 11);
    assert_eq!(run(Call::global("STATUS"), &cs, &budget).expect_cni_error("STATUS while the apiserver is down")["code"], 50);

    cluster.start_apiserver().expect("restarting kube-apiserver");
    // Nothing of the failed calls remains; the next ADD continues where it was.
    assert_eq!(objects.allocations("192.0.2.208-28").unwrap().keys().collect::<Vec<_>>(), ["1"]);
    assert_eq!(add(&cs, "cid-2", "p2").ips(), ["192.0.2.210/28", "2001:db8:72::2/64"]);
    del(&cs, "cid-1", "p1").expect_ok("DEL after the outage");
    assert_eq!(objects.allocations("2001-db8-72---64").unwrap().keys().collect::<Vec<_>>(), ["2"]);
}

/// An apiserver that accepts connections and never answers: the call still
/// ends (code 11) within its budget.
#[test]
fn an_unresponsive_apiserver_is_bounded_by_the_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let _hold = std::thread::spawn(move || listener.incoming().collect::<Vec<_>>());
    let tmp = TempDir::new("k8s-silent");
    let kubeconfig = tmp.path().join("silent.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: silent\n  cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}\n\
             users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: c\n  context: {{cluster: silent, user: u}}\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let cs = kubernetes_conf("k8s-silent", &kubeconfig, None, &["192.0.2.224/28"]).to_string();
    let out = run(Call::pod("ADD", "cid-1", "p1"), &cs, &[("THEREABOUTS_TIMEOUT_MS", "1500")]);
    let e = out.expect_cni_error("ADD against a silent apiserver");
    assert!(e["code"] == 11 && e["msg"].as_str().unwrap().contains(&format!("https://127.0.0.1:{port}")), "{}", out.describe());
    assert!(out.elapsed < Duration::from_millis(4000), "answered after {:?}", out.elapsed);
}

/// A pool at the apiserver's object size limit (etcd's request limit, 1.5 MiB by
/// default): the next ADD fails with an error naming the limit and the remedy,
/// and leaves the pool and the reservations exactly as they were.
#[test]
fn a_pool_at_the_object_size_limit_fails_the_add_clearly_and_writes_nothing() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let range = "2001:db8:f1::/64";
    let pool = pool_name(range);
    // One huge entry, then 1 KiB ones, then the smallest entries whereabouts
    // accepts, each until the apiserver refuses: the pool is then full to within
    // a few dozen bytes, less than any entry the plugin writes.
    let filler = |offset: usize, size: usize| (offset.to_string(), json!({"id": "x", "podref": format!("f/{}", "p".repeat(size))}));
    let (key, value) = filler(1, 1_500_000);
    let spec = json!({"range": range, "allocations": {key: value}});
    objects.create(IPPOOLS, &json!({"apiVersion": format!("{GROUP}/v1alpha1"), "kind": "IPPool", "metadata": {"name": pool}, "spec": spec})).unwrap();
    let mut offset = 2;
    for size in [1024, 0] {
        loop {
            let (key, value) = filler(offset, size);
            match objects.json_patch(IPPOOLS, &pool, &json!([{"op": "add", "path": format!("/spec/allocations/{key}"), "value": value}])).unwrap() {
                Ok(_) => offset += 1,
                Err(_) => break,
            }
        }
    }
    let before = versions(&objects, &[range]);
    let e = add(&conf(&cluster, "k8s-too-large", &[range]), "cid-big", "big").expect_cni_error("ADD into a pool at the size limit");
    let msg = e["msg"].as_str().unwrap();
    assert!(msg.contains("cannot hold another entry") && msg.contains("max-request-bytes") && msg.contains("smaller ranges"), "{e}");
    assert_eq!(e["code"], 999, "retrying does not help: not code 11");
    assert_eq!(versions(&objects, &[range]), before, "nothing written");
    assert!(reservations_in(&objects, &[range]).unwrap().is_empty(), "no reservation left");
}
