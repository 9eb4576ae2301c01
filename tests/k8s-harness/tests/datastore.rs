//! The Kubernetes datastore against the real kube-apiserver: the release
//! `thereabouts` binary runs as a CNI plugin (a process per call, `CNI_*`
//! environment, config on stdin) with the least-privilege plugin identity of
//! `deploy/rbac.yaml`, and the tests look at the `IPPool` and
//! `OverlappingRangeIPReservation` objects as the admin sees them.
//!
//! Most tests share one control plane (see [`shared`]); each uses its own ranges
//! (and namespace, where it changes RBAC), so their pools and reservations never
//! meet. The test that stops the apiserver has a private one.
//!
//! Binary: `$THEREABOUTS_BIN`, else `target/plugin/thereabouts` (tests/k8s.sh builds it with scripts/build-plugin.sh).

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Outcome, TempDir, thereabouts_bin};
use thereabouts_k8s_harness::burst::contains;
use thereabouts_k8s_harness::plugin::{IPPOOLS, Objects, RESERVATIONS, api_requests, kubeconfig_variant, kubernetes_conf, with_debug_log};
use thereabouts_k8s_harness::{Cluster, NAMESPACE};

const GROUP: &str = "whereabouts.cni.cncf.io";

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

/// A cluster with the CRDs and the RBAC of `deploy/`.
fn prepared_cluster() -> Cluster {
    let cluster = Cluster::start().expect("starting etcd + kube-apiserver");
    block_on(async {
        cluster.install_crds().await.expect("installing deploy/crds");
        cluster.install_rbac().await.expect("installing deploy/rbac.yaml");
    });
    // The plugin reads pools as LISTs, which the apiserver serves from its watch
    // cache and answers 429 until that cache is ready: wait for it, so the exact
    // request sequences below do not depend on how fast the apiserver warms up.
    let objects = Objects::admin(&cluster).unwrap();
    let ready = Instant::now() + Duration::from_secs(30);
    while objects.list(IPPOOLS).is_err() || objects.list(RESERVATIONS).is_err() {
        assert!(Instant::now() < ready, "the apiserver never served IPPool lists");
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster
}

/// The control plane the tests share: started by the first test that needs it,
/// torn down when the last test holding it ends (a later test starts a new one),
/// so nothing outlives the test process.
fn shared() -> Arc<Cluster> {
    static SHARED: Mutex<Weak<Cluster>> = Mutex::new(Weak::new());
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(cluster) = slot.upgrade() {
        return cluster;
    }
    let cluster = Arc::new(prepared_cluster());
    *slot = Arc::downgrade(&cluster);
    cluster
}

/// Runs the plugin like a runtime would (see `Call`), with extra environment.
fn run(call: &Call, stdin: &str, env: &[(&str, &str)]) -> Outcome {
    let bin = thereabouts_bin();
    let started = Instant::now();
    let mut command = Command::new(&bin);
    command
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", &call.command)
        .env("CNI_CONTAINERID", &call.container_id)
        .env("CNI_NETNS", &call.netns)
        .env("CNI_IFNAME", &call.ifname)
        .env("CNI_ARGS", &call.cni_args)
        .env("CNI_PATH", &call.cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().expect("spawning thereabouts");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    Outcome {
        call: call.clone(),
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: started.elapsed(),
        timed_out: false,
    }
}

fn add(conf: &str, cid: &str, pod: &str) -> Outcome {
    run(&Call::pod("ADD", cid, pod), conf, &[])
}

fn del(conf: &str, cid: &str, pod: &str) -> Outcome {
    run(&Call::pod("DEL", cid, pod), conf, &[])
}

fn entry(cid: &str, pod: &str, ifname: &str) -> Value {
    json!({"id": cid, "podref": format!("default/{pod}"), "ifname": ifname})
}

fn reservation(cid: &str, pod: &str, ifname: &str) -> Value {
    json!({"containerid": cid, "podref": format!("default/{pod}"), "ifname": ifname})
}

fn resource_version(objects: &Objects, pool: &str) -> String {
    objects.get(IPPOOLS, pool).unwrap().expect("pool exists")["metadata"]["resourceVersion"].as_str().unwrap().to_string()
}

fn truncate(path: &Path) {
    std::fs::write(path, b"").unwrap();
}

/// "GET /apis/.../ippools/x -> ok" → ("GET", "ippools", "ok"), dropping names.
fn shape(requests: &[String]) -> Vec<String> {
    requests
        .iter()
        .map(|r| {
            let (call, answer) = r.split_once(" -> ").unwrap();
            let (method, path) = call.split_once(' ').unwrap();
            let kind = if path.contains("/ippools") {
                "ippools"
            } else if path.contains("/overlappingrangeipreservations") {
                "reservations"
            } else {
                path
            };
            // A read by label is a LIST (a pool read by name is one too, but
            // it stands for one object: shown as GET).
            let method = if method == "GET" && path.contains("labelSelector=") { "LIST" } else { method };
            format!("{method} {kind} -> {answer}")
        })
        .collect()
}

#[test]
fn dual_stack_add_del_check_status_with_the_plugin_identity() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("k8s-dual");
    let log = tmp.path().join("plugin.log");
    let conf = with_debug_log(kubernetes_conf("k8s-dual", &cluster.plugin_kubeconfig(), None, &["192.0.2.64/28", "2001:db8:61::/64"]), &log);
    let cs = conf.to_string();
    let (v4, v6) = ("192.0.2.64-28", "2001-db8-61---64");

    // First ADD: the pools do not exist yet and are created with the entry.
    let a = add(&cs, "cid-a", "pod-a");
    a.expect_ok("ADD pod-a");
    assert_eq!(a.ips(), ["192.0.2.65/28", "2001:db8:61::1/64"], "{}", a.describe());
    let first = api_requests(&log);
    eprintln!("API requests, ADD into absent pools:\n  {}", first.join("\n  "));
    assert_eq!(
        shape(&first),
        [
            // A pool is read as a LIST by name: an absent one is an empty list.
            "GET ippools -> ok",
            "GET ippools -> ok",
            "POST reservations -> ok",
            "POST reservations -> ok",
            "POST ippools -> ok",
            "POST ippools -> ok"
        ]
    );
    for (name, range) in [(v4, "192.0.2.64/28"), (v6, "2001:db8:61::/64")] {
        let pool = objects.get(IPPOOLS, name).unwrap().expect("pool created");
        assert_eq!(pool["apiVersion"], "whereabouts.cni.cncf.io/v1alpha1");
        assert_eq!(pool["kind"], "IPPool");
        assert_eq!(pool["metadata"]["namespace"], NAMESPACE);
        assert_eq!(pool["spec"], json!({"range": range, "allocations": {"1": entry("cid-a", "pod-a", "eth0")}}));
    }
    let reservations = objects.reservations().unwrap();
    assert_eq!(reservations.get("192.0.2.65"), Some(&reservation("cid-a", "pod-a", "eth0")));
    assert_eq!(reservations.get("2001-db8-61--1"), Some(&reservation("cid-a", "pod-a", "eth0")));

    // Second pod: the pools exist; the uncontended cost is GET + reservation + PATCH per range.
    truncate(&log);
    let b = add(&cs, "cid-b", "pod-b");
    b.expect_ok("ADD pod-b");
    assert_eq!(b.ips(), ["192.0.2.66/28", "2001:db8:61::2/64"]);
    let second = api_requests(&log);
    eprintln!("API requests, uncontended dual-stack ADD:\n  {}", second.join("\n  "));
    assert_eq!(
        shape(&second),
        ["GET ippools -> ok", "GET ippools -> ok", "POST reservations -> ok", "POST reservations -> ok", "PATCH ippools -> ok", "PATCH ippools -> ok"]
    );

    // Idempotent ADD: same addresses, reads only, nothing written.
    let rv = (resource_version(&objects, v4), resource_version(&objects, v6));
    truncate(&log);
    let again = add(&cs, "cid-a", "pod-a");
    again.expect_ok("repeated ADD pod-a");
    assert_eq!(again.ips(), a.ips());
    assert_eq!(shape(&api_requests(&log)), ["GET ippools -> ok", "GET ippools -> ok"]);
    assert_eq!((resource_version(&objects, v4), resource_version(&objects, v6)), rv);

    // The pod's sandbox re-created (new container ID): same addresses, ID updated.
    let renewed = add(&cs, "cid-a2", "pod-a");
    renewed.expect_ok("ADD pod-a with a new container");
    assert_eq!(renewed.ips(), a.ips());
    assert_eq!(objects.allocations(v4).unwrap()["1"], entry("cid-a2", "pod-a", "eth0"));

    // CHECK and STATUS.
    let mut check = conf.clone();
    check["prevResult"] = json!({"cniVersion": "1.1.0", "ips": [{"address": "192.0.2.66/28"}, {"address": "2001:db8:61::2/64"}]});
    run(&Call::pod("CHECK", "cid-b", "pod-b"), &check.to_string(), &[]).expect_ok("CHECK pod-b");
    check["prevResult"]["ips"][0]["address"] = json!("192.0.2.73/28");
    run(&Call::pod("CHECK", "cid-b", "pod-b"), &check.to_string(), &[]).expect_cni_error("CHECK with a wrong address");
    run(&Call::global("STATUS"), &cs, &[]).expect_ok("STATUS");

    // `thereabouts pools` goes through the same datastore.
    let conf_file = tmp.path().join("net.conf");
    std::fs::write(&conf_file, &cs).unwrap();
    let out = Command::new(thereabouts_bin()).args(["pools", "--config", conf_file.to_str().unwrap(), "--output", "json"]).output().unwrap();
    assert!(out.status.success(), "pools: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["datastore"].as_str().unwrap().contains("kubernetes datastore: namespace kube-system"), "{report}");
    assert_eq!(report["ranges"][0]["allocated"], "2");
    assert_eq!(report["ranges"][1]["pool_name"], v6);

    // DEL of a container we never saw: success, nothing written.
    truncate(&log);
    del(&cs, "cid-unknown", "pod-x").expect_ok("DEL of an unknown container");
    assert_eq!(shape(&api_requests(&log)), ["LIST reservations -> ok", "GET ippools -> ok", "GET ippools -> ok"]);

    // DEL pod-a: its entries and reservations go, pod-b's stay.
    truncate(&log);
    let d = del(&cs, "cid-a2", "pod-a");
    d.expect_ok("DEL pod-a");
    assert_eq!(
        shape(&api_requests(&log)),
        [
            // Reservations labelled with this attachment: none (pod-a's were
            // made under its first container ID, cid-a), so each is read
            // before it is deleted, as a whereabouts-made one would be.
            "LIST reservations -> ok",
            "GET ippools -> ok",
            "GET ippools -> ok",
            "PATCH ippools -> ok",
            "PATCH ippools -> ok",
            "GET reservations -> ok",
            "DELETE reservations -> ok",
            "GET reservations -> ok",
            "DELETE reservations -> ok"
        ]
    );
    for pool in [v4, v6] {
        let allocations = objects.allocations(pool).unwrap();
        assert_eq!(allocations.keys().collect::<Vec<_>>(), ["2"], "{pool}: {allocations:?}");
    }
    let reservations = objects.reservations().unwrap();
    assert!(!reservations.contains_key("192.0.2.65") && !reservations.contains_key("2001-db8-61--1"), "{reservations:?}");
    assert!(reservations.contains_key("192.0.2.66") && reservations.contains_key("2001-db8-61--2"));
    del(&cs, "cid-a2", "pod-a").expect_ok("repeated DEL pod-a");

    // GC cannot tell this node's garbage from other nodes' entries in a shared
    // store: it removes nothing.
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    run(&Call::global("GC"), &gc.to_string(), &[]).expect_ok("GC");
    assert_eq!(objects.allocations(v4).unwrap().len(), 1);

    del(&cs, "cid-b", "pod-b").expect_ok("DEL pod-b");
    assert!(objects.allocations(v4).unwrap().is_empty() && objects.allocations(v6).unwrap().is_empty());

    // An ADD that reserved its addresses and then failed without cleaning up
    // (the apiserver went away, the process was killed) leaves reservations no
    // pool entry leads to. The DEL of the same attachment finds them by their
    // label and frees them; a reservation that only carries the same label
    // value (the label is a hash) but names another container stays.
    add(&cs, "cid-ghost", "pod-ghost").expect_ok("ADD pod-ghost");
    for pool in [v4, v6] {
        let keys: Vec<String> = objects.allocations(pool).unwrap().into_keys().collect();
        let ops: Vec<Value> = keys.iter().map(|k| json!({"op": "remove", "path": format!("/spec/allocations/{k}")})).collect();
        objects.json_patch(IPPOOLS, pool, &json!(ops)).unwrap().expect("emptying the pool");
    }
    let ghost = objects.get(RESERVATIONS, "192.0.2.65").unwrap().expect("pod-ghost's reservation");
    assert_eq!(ghost["spec"]["containerid"], "cid-ghost");
    let label = ghost["metadata"]["labels"]["thereabouts.cni.dev/attachment"].clone();
    assert!(label.is_string(), "{ghost}");
    objects
        .create(
            RESERVATIONS,
            &json!({
                "apiVersion": format!("{GROUP}/v1alpha1"),
                "kind": "OverlappingRangeIPReservation",
                "metadata": {"name": "192.0.2.78", "labels": {"thereabouts.cni.dev/attachment": label}},
                "spec": reservation("cid-someone-else", "pod-else", "eth0"),
            }),
        )
        .unwrap();
    truncate(&log);
    del(&cs, "cid-ghost", "pod-ghost").expect_ok("DEL pod-ghost");
    assert_eq!(
        shape(&api_requests(&log)),
        ["LIST reservations -> ok", "GET ippools -> ok", "GET ippools -> ok", "DELETE reservations -> ok", "DELETE reservations -> ok"]
    );
    let reservations = objects.reservations().unwrap();
    assert!(!reservations.contains_key("192.0.2.65") && !reservations.contains_key("2001-db8-61--1"), "{reservations:?}");
    assert_eq!(reservations["192.0.2.78"]["containerid"], "cid-someone-else");
    objects.delete(RESERVATIONS, "192.0.2.78").unwrap();

    let left: Vec<String> = objects
        .reservations()
        .unwrap()
        .into_keys()
        .filter(|n| n.parse().is_ok_and(|ip| contains("192.0.2.64/28", ip)) || n.starts_with("2001-db8-61-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// An `IPPool` exactly as whereabouts v0.9.4 writes it (`pkg/storage/kubernetes/ipam.go`,
/// types in `pkg/api/whereabouts.cni.cncf.io/v1alpha1/`):
/// created as `{range, allocations: {}}`, entries keyed by the decimal offset
/// from the network address, `{id, podref, ifname}` (no `ifname` before v0.8.0),
/// and the ORIPs it creates beside them (`{podref, ifname}`, no `containerid`).
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

const GOLDEN_RESERVATIONS: [(&str, &str, &str); 3] =
    [("192.0.2.81", "default/golden-a", "net1"), ("192.0.2.82", "default/golden-b", ""), ("192.0.2.84", "other/golden-c", "eth0")];

#[test]
fn golden_whereabouts_pool_keeps_its_bytes_and_gets_whereabouts_entries() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    objects.create_yaml(IPPOOLS, GOLDEN_POOL).expect("creating the golden IPPool");
    for (name, pod, ifname) in GOLDEN_RESERVATIONS {
        let mut spec = json!({"podref": pod});
        if !ifname.is_empty() {
            spec["ifname"] = json!(ifname);
        }
        objects
            .create(
                RESERVATIONS,
                &json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "OverlappingRangeIPReservation", "metadata": {"name": name}, "spec": spec}),
            )
            .unwrap();
    }
    let before: Value = serde_json::from_str(&objects.raw(IPPOOLS, "192.0.2.80-28").unwrap().unwrap()).unwrap();
    let entry_text = |pool: &Value, key: &str| serde_json::to_string(&pool["spec"]["allocations"][key]).unwrap();

    let conf = kubernetes_conf("k8s-golden", &cluster.plugin_kubeconfig(), None, &["192.0.2.80/28"]).to_string();
    // Lowest free around the existing entries: .3, then .5.
    let first = add(&conf, "cid-g1", "golden-new-1");
    first.expect_ok("ADD into the golden pool");
    assert_eq!(first.ips(), ["192.0.2.83/28"]);
    let second = add(&conf, "cid-g2", "golden-new-2");
    second.expect_ok("second ADD into the golden pool");
    assert_eq!(second.ips(), ["192.0.2.85/28"]);

    let after: Value = serde_json::from_str(&objects.raw(IPPOOLS, "192.0.2.80-28").unwrap().unwrap()).unwrap();
    // Everything that was there is unchanged, byte for byte.
    for key in ["1", "2", "4"] {
        assert_eq!(entry_text(&after, key), entry_text(&before, key), "entry {key}");
    }
    assert_eq!(after["metadata"]["labels"], before["metadata"]["labels"]);
    assert_eq!(after["metadata"]["annotations"], before["metadata"]["annotations"]);
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    assert_eq!(after["spec"]["range"], "192.0.2.80/28");
    // The new entries have exactly whereabouts' shape.
    assert_eq!(entry_text(&after, "3"), r#"{"id":"cid-g1","ifname":"eth0","podref":"default/golden-new-1"}"#);
    assert_eq!(after["spec"]["allocations"]["5"], entry("cid-g2", "golden-new-2", "eth0"));
    assert_eq!(after["spec"]["allocations"].as_object().unwrap().len(), 5);
    let reservations = objects.reservations().unwrap();
    assert_eq!(reservations["192.0.2.83"], reservation("cid-g1", "golden-new-1", "eth0"));
    assert_eq!(reservations["192.0.2.82"], json!({"podref": "default/golden-b"}), "whereabouts' own reservations are untouched");

    // Our DEL frees a whereabouts entry (by container ID + ifname) and its
    // reservation, and leaves the pre-v0.8.0 entry without ifname alone.
    let mut call = Call::pod("DEL", "1f7d3c0a9b8e4f2a6c5d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b", "golden-a");
    call.ifname = "net1".into();
    run(&call, &conf, &[]).expect_ok("DEL of a whereabouts entry");
    let allocations = objects.allocations("192.0.2.80-28").unwrap();
    assert_eq!(allocations.keys().collect::<Vec<_>>(), ["2", "3", "4", "5"]);
    let reservations = objects.reservations().unwrap();
    assert!(!reservations.contains_key("192.0.2.81") && reservations.contains_key("192.0.2.82"));
    let final_pool: Value = serde_json::from_str(&objects.raw(IPPOOLS, "192.0.2.80-28").unwrap().unwrap()).unwrap();
    for key in ["2", "4"] {
        assert_eq!(entry_text(&final_pool, key), entry_text(&before, key), "entry {key}");
    }
}

fn addresses(outcomes: &[Outcome]) -> Vec<String> {
    outcomes.iter().flat_map(|o| o.ips()).map(|a| a.split('/').next().unwrap().to_string()).collect()
}

#[test]
fn overlapping_ranges_never_share_an_address() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let kc = cluster.plugin_kubeconfig();
    let wide = kubernetes_conf("k8s-ovl-wide", &kc, None, &["203.0.113.0/24"]).to_string();
    let narrow = kubernetes_conf("k8s-ovl-narrow", &kc, None, &["203.0.113.0/28"]).to_string();
    let mut outcomes = Vec::new();
    for i in 0..6 {
        let w = add(&wide, &format!("cid-w{i}"), &format!("w{i}"));
        w.expect_ok("ADD from the /24");
        let n = add(&narrow, &format!("cid-n{i}"), &format!("n{i}"));
        n.expect_ok("ADD from the /28");
        outcomes.push(w);
        outcomes.push(n);
    }
    let all = addresses(&outcomes);
    let mut unique = all.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), all.len(), "an address was handed out twice: {all:?}");
    assert_eq!(all[..4], ["203.0.113.1", "203.0.113.2", "203.0.113.3", "203.0.113.4"], "lowest free, around each other's reservations");
    // One reservation per address, held by the pod that got it.
    let reservations = objects.reservations().unwrap();
    for (o, address) in outcomes.iter().zip(&all) {
        let holder = o.call.cni_args.rsplit('=').next().unwrap();
        assert_eq!(reservations[address.as_str()]["podref"], format!("default/{holder}"), "{address}");
    }
    // The /28 runs out once the /24 and itself hold its 14 addresses.
    let mut narrow_pods = 6;
    loop {
        let n = add(&narrow, &format!("cid-n{narrow_pods}"), &format!("n{narrow_pods}"));
        if !n.ok() {
            let e = n.expect_cni_error("ADD from a full /28");
            assert!(e["msg"].as_str().unwrap().contains("Could not allocate IP in range"), "{e}");
            break;
        }
        outcomes.push(n);
        narrow_pods += 1;
        assert!(narrow_pods < 20, "the /28 never ran out");
    }
    let all = addresses(&outcomes);
    let in_narrow = all.iter().filter(|a| a.strip_prefix("203.0.113.").and_then(|x| x.parse::<u8>().ok()).is_some_and(|x| (1..=14).contains(&x))).count();
    assert_eq!(in_narrow, 14, "every address of the /28 handed out once: {all:?}");
    let mut unique = all.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), all.len(), "an address was handed out twice: {all:?}");

    // Everything released: no entries, no reservations of these ranges.
    for o in &outcomes {
        let conf = if o.call.cni_args.contains("=w") { &wide } else { &narrow };
        let pod = o.call.cni_args.rsplit('=').next().unwrap();
        del(conf, &o.call.container_id, pod).expect_ok("DEL");
    }
    assert!(objects.allocations("203.0.113.0-24").unwrap().is_empty() && objects.allocations("203.0.113.0-28").unwrap().is_empty());
    assert!(objects.reservations().unwrap().keys().all(|n| !n.starts_with("203.0.113.")));

    // Without enable_overlapping_ranges nothing is reserved: both ranges hand out .1.
    let mut off_wide = kubernetes_conf("k8s-ovl-off", &kc, None, &["198.51.100.0/24"]);
    off_wide["ipam"]["enable_overlapping_ranges"] = json!(false);
    let mut off_narrow = kubernetes_conf("k8s-ovl-off", &kc, None, &["198.51.100.0/28"]);
    off_narrow["ipam"]["enable_overlapping_ranges"] = json!(false);
    let tmp = TempDir::new("k8s-ovl");
    let log = tmp.path().join("plugin.log");
    let off_wide = with_debug_log(off_wide, &log).to_string();
    assert_eq!(add(&off_wide, "cid-ow", "ow").ips(), ["198.51.100.1/24"]);
    assert_eq!(shape(&api_requests(&log)), ["GET ippools -> ok", "POST ippools -> ok"]);
    truncate(&log);
    assert_eq!(add(&off_wide, "cid-ow2", "ow2").ips(), ["198.51.100.2/24"]);
    assert_eq!(shape(&api_requests(&log)), ["GET ippools -> ok", "PATCH ippools -> ok"], "uncontended ADD without reservations: two requests");
    assert_eq!(add(&off_narrow.to_string(), "cid-on", "on").ips(), ["198.51.100.1/28"]);
    assert!(objects.reservations().unwrap().keys().all(|n| !n.starts_with("198.51.100.")));

    // network_name scopes pools and reservations: the same range twice.
    let blue = kubernetes_conf("k8s-blue", &kc, Some("blue"), &["192.0.2.96/28"]).to_string();
    let red = kubernetes_conf("k8s-red", &kc, Some("red"), &["192.0.2.96/28"]).to_string();
    assert_eq!(add(&blue, "cid-blue", "blue").ips(), ["192.0.2.97/28"]);
    assert_eq!(add(&red, "cid-red", "red").ips(), ["192.0.2.97/28"]);
    assert_eq!(objects.allocations("blue-192.0.2.96-28").unwrap()["1"], entry("cid-blue", "blue", "eth0"));
    assert_eq!(objects.allocations("red-192.0.2.96-28").unwrap()["1"], entry("cid-red", "red", "eth0"));
    let reservations = objects.reservations().unwrap();
    assert_eq!(reservations["blue-192.0.2.97"]["podref"], "default/blue");
    assert_eq!(reservations["red-192.0.2.97"]["podref"], "default/red");
}

/// A pod's sandbox re-created: the new container adopts the entry (same pod
/// and interface), then the old container's DEL comes. The entry stays, and so
/// must the reservation that guards it from overlapping ranges.
#[test]
fn the_old_containers_del_keeps_the_reservation_its_pod_still_uses() {
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let kc = cluster.plugin_kubeconfig();
    let wide = kubernetes_conf("k8s-renew", &kc, None, &["192.0.2.240/28"]).to_string();
    let narrow = kubernetes_conf("k8s-renew-narrow", &kc, None, &["192.0.2.240/29"]).to_string();
    assert_eq!(add(&wide, "cid-r1", "renewed").ips(), ["192.0.2.241/28"]);
    assert_eq!(add(&wide, "cid-r2", "renewed").ips(), ["192.0.2.241/28"]);
    del(&wide, "cid-r1", "renewed").expect_ok("DEL of the old container");
    assert_eq!(objects.allocations("192.0.2.240-28").unwrap()["1"], entry("cid-r2", "renewed", "eth0"));
    assert_eq!(objects.reservations().unwrap()["192.0.2.241"]["podref"], "default/renewed");
    assert_eq!(add(&narrow, "cid-o", "other").ips(), ["192.0.2.242/29"], "an overlapping range plans around the address");
    del(&wide, "cid-r2", "renewed").expect_ok("DEL of the new container");
    del(&narrow, "cid-o", "other").expect_ok("DEL other");
    assert!(!objects.reservations().unwrap().contains_key("192.0.2.241"));
}

#[test]
fn a_failing_later_range_rolls_back_the_earlier_ones() {
    let cluster = shared();
    let ns = "thab-rollback";
    let objects = Objects::admin_in(&cluster, ns).unwrap();
    objects.ensure_namespace(ns).unwrap();
    for (name, range) in [("192.0.2.112-28", "192.0.2.112/28"), ("192.0.2.128-28", "192.0.2.128/28")] {
        objects
            .create(IPPOOLS, &json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool", "metadata": {"name": name}, "spec": {"range": range, "allocations": {}}}))
            .unwrap();
    }
    // The plugin identity may read both pools but patch only the first, so the
    // second range's write fails after the first one's succeeded.
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
    let log = tmp.path().join("plugin.log");
    let conf = with_debug_log(kubernetes_conf("k8s-rollback", &kubeconfig, None, &["192.0.2.112/28", "192.0.2.128/28"]), &log).to_string();

    let failed = add(&conf, "cid-r", "pod-r");
    let e = failed.expect_cni_error("ADD whose second range cannot be written");
    let msg = e["msg"].as_str().unwrap();
    assert_eq!(e["code"], 999, "{e}");
    assert!(msg.contains("denied patching IPPool thab-rollback/192.0.2.128-28") && msg.contains("cannot patch resource \"ippools\""), "{msg}");
    let requests = shape(&api_requests(&log));
    eprintln!("API requests, rolled-back ADD:\n  {}", requests.join("\n  "));
    assert_eq!(
        requests,
        [
            "GET ippools -> ok",
            "GET ippools -> ok",
            "POST reservations -> ok",
            "POST reservations -> ok",
            "PATCH ippools -> ok",
            "PATCH ippools -> 403 Forbidden",
            "PATCH ippools -> ok",
            "DELETE reservations -> ok",
            "DELETE reservations -> ok"
        ]
    );
    // Nothing of the failed ADD remains.
    assert!(objects.allocations("192.0.2.112-28").unwrap().is_empty());
    assert!(objects.allocations("192.0.2.128-28").unwrap().is_empty());
    assert!(objects.reservations().unwrap().is_empty());

    // A range that is full fails the ADD before anything is written.
    let kc = cluster.plugin_kubeconfig();
    let small = kubernetes_conf("k8s-small", &kc, None, &["192.0.2.160/30"]).to_string();
    add(&small, "cid-s1", "s1").expect_ok("ADD s1");
    add(&small, "cid-s2", "s2").expect_ok("ADD s2");
    let both = kubernetes_conf("k8s-both", &kc, None, &["192.0.2.144/28", "192.0.2.160/30"]).to_string();
    let e = add(&both, "cid-s3", "s3").expect_cni_error("ADD with the second range full");
    assert!(e["msg"].as_str().unwrap().contains("Could not allocate IP in range"), "{e}");
    let kube_system = Objects::admin(&cluster).unwrap();
    assert_eq!(kube_system.get(IPPOOLS, "192.0.2.144-28").unwrap(), None, "the first range's pool was not even created");
    assert!(!kube_system.reservations().unwrap().contains_key("192.0.2.145"));
}

/// Concurrent ADD processes on one dual-stack config, while another writer keeps
/// changing the same pool object: the racing pods conflict on reservations (all
/// of them plan the lowest free address first, then spread out), no address is
/// handed out twice, the other writer's changes never fail a pool patch (they
/// touch no entry a patch tests), and the DELs leave nothing behind.
#[test]
fn concurrent_adds_under_interference_hand_out_unique_addresses() {
    const PODS: usize = 12;
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("k8s-burst");
    let log = tmp.path().join("plugin.log");
    let conf = with_debug_log(kubernetes_conf("k8s-burst", &cluster.plugin_kubeconfig(), None, &["192.0.2.32/27", "2001:db8:74::/64"]), &log).to_string();
    add(&conf, "cid-first", "first").expect_ok("first ADD (creates the pools)");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let interferer = {
        let stop = stop.clone();
        let objects = Objects::admin(&cluster).unwrap();
        std::thread::spawn(move || {
            let mut writes = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                objects.annotate(IPPOOLS, "192.0.2.32-27", "example.com/touched", &writes.to_string()).unwrap();
                writes += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            writes
        })
    };
    let started = Instant::now();
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..PODS)
            .map(|i| {
                let conf = &conf;
                scope.spawn(move || add(conf, &format!("cid-{i}"), &format!("burst-{i}")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = interferer.join().unwrap();
    for o in &outcomes {
        o.expect_ok("concurrent ADD");
    }
    let all = addresses(&outcomes);
    let mut unique = all.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 2 * PODS, "an address was handed out twice: {all:?}");
    let conflicts = std::fs::read_to_string(&log).unwrap().matches("changed concurrently; planning again").count();
    let slowest = outcomes.iter().map(|o| o.elapsed).max().unwrap();
    eprintln!("{PODS} concurrent dual-stack ADDs in {:?} (slowest {slowest:?}), {writes} interfering writes: {conflicts} conflicts retried", started.elapsed());
    assert!(conflicts > 0, "the test should provoke conflicts");
    // Per-entry guards: the annotation writes move the resourceVersion, which no
    // patch tests, and the reservations keep the racing pods off each other's
    // offsets, so no pool patch is refused.
    let refused: Vec<String> = api_requests(&log).into_iter().filter(|r| r.starts_with("PATCH") && r.contains("/ippools/") && r.contains("-> 422")).collect();
    assert!(refused.is_empty(), "pool patches refused: {refused:?}");
    assert_eq!(objects.allocations("192.0.2.32-27").unwrap().len(), PODS + 1);
    assert_eq!(objects.allocations("2001-db8-74---64").unwrap().len(), PODS + 1);
    assert_eq!(
        objects.reservations().unwrap().keys().filter(|n| { n.parse().is_ok_and(|ip| contains("192.0.2.32/27", ip)) || n.starts_with("2001-db8-74-") }).count(),
        2 * (PODS + 1)
    );
    assert_eq!(
        objects.get(IPPOOLS, "192.0.2.32-27").unwrap().unwrap()["metadata"]["annotations"]["example.com/touched"],
        (writes - 1).to_string(),
        "the other writer's field survives"
    );

    std::thread::scope(|scope| {
        for i in 0..PODS {
            let conf = &conf;
            scope.spawn(move || {
                del(conf, &format!("cid-{i}"), &format!("burst-{i}")).expect_ok("concurrent DEL");
            });
        }
    });
    del(&conf, "cid-first", "first").expect_ok("DEL first");
    assert!(objects.allocations("192.0.2.32-27").unwrap().is_empty() && objects.allocations("2001-db8-74---64").unwrap().is_empty());
    let left: Vec<(String, Value)> = objects
        .reservations()
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n.parse().is_ok_and(|ip| contains("192.0.2.32/27", ip)) || n.starts_with("2001-db8-74-"))
        .collect();
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
    let pool = "192.0.2.176-28";
    objects
        .create(
            IPPOOLS,
            &json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool", "metadata": {"name": pool},
            "spec": {"range": "192.0.2.176/28", "allocations": {"1": entry("cid-1", "p1", "eth0")}}}),
        )
        .unwrap();
    let read = resource_version(&objects, pool);
    let insert = |offset: u32, cid: &str| {
        json!([
            {"op": "test", "path": format!("/spec/allocations/{offset}"), "value": null},
            {"op": "add", "path": format!("/spec/allocations/{offset}"), "value": entry(cid, cid, "eth0")}
        ])
    };
    let whereabouts_insert = |version: &str, offset: u32, cid: &str| {
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": version},
            {"op": "test", "path": format!("/spec/allocations/{offset}"), "value": null},
            {"op": "add", "path": format!("/spec/allocations/{offset}"), "value": entry(cid, cid, "eth0")}
        ])
    };

    // Someone (whereabouts, on the version it read) takes offset 5 after our read.
    objects.json_patch(IPPOOLS, pool, &whereabouts_insert(&read, 5, "cid-wb")).unwrap().expect("whereabouts' patch on a fresh read");
    // Our insert planned on the old read for the same offset: refused, entry intact.
    assert_eq!(objects.json_patch(IPPOOLS, pool, &insert(5, "cid-late")).unwrap().err(), Some(422));
    assert_eq!(objects.allocations(pool).unwrap()["5"], entry("cid-wb", "cid-wb", "eth0"));
    // An insert of another offset applies although the pool moved since our read.
    let after = objects.json_patch(IPPOOLS, pool, &insert(6, "cid-6")).unwrap().expect("an insert of a free offset on a stale read");
    assert_eq!(after["spec"]["allocations"]["6"], entry("cid-6", "cid-6", "eth0"));
    assert_ne!(resource_version(&objects, pool), read);
    // whereabouts planning on its stale read is refused after our write, whatever
    // offset it wants: it reads again and never overwrites our entries.
    assert_eq!(objects.json_patch(IPPOOLS, pool, &whereabouts_insert(&read, 7, "cid-wb7")).unwrap().err(), Some(422));
    assert!(!objects.allocations(pool).unwrap().contains_key("7"));

    // A removal tests the id it read: someone else's entry at that offset stays.
    let remove = |offset: u32, id: &str| {
        json!([
            {"op": "test", "path": format!("/spec/allocations/{offset}/id"), "value": id},
            {"op": "remove", "path": format!("/spec/allocations/{offset}")}
        ])
    };
    assert_eq!(objects.json_patch(IPPOOLS, pool, &remove(5, "cid-late")).unwrap().err(), Some(422));
    assert_eq!(objects.json_patch(IPPOOLS, pool, &remove(9, "cid-9")).unwrap().err(), Some(422), "an entry that is gone");
    objects.json_patch(IPPOOLS, pool, &remove(6, "cid-6")).unwrap().expect("removing our own entry");
    // One refused test refuses the whole patch: nothing of it is applied.
    let mixed = json!([
        {"op": "test", "path": "/spec/allocations/8", "value": null},
        {"op": "add", "path": "/spec/allocations/8", "value": entry("cid-8", "cid-8", "eth0")},
        {"op": "test", "path": "/spec/allocations/5", "value": null},
        {"op": "add", "path": "/spec/allocations/5", "value": entry("cid-x", "cid-x", "eth0")}
    ]);
    assert_eq!(objects.json_patch(IPPOOLS, pool, &mixed).unwrap().err(), Some(422));
    let allocations = objects.allocations(pool).unwrap();
    assert_eq!(allocations.keys().collect::<Vec<_>>(), ["1", "5"], "{allocations:?}");
    objects.delete(IPPOOLS, pool).unwrap();
}

/// Without `enable_overlapping_ranges` no reservation keeps racing pods apart:
/// the per-entry guards of the pool patch are the only thing between them. Many
/// ADD processes (all planning the same lowest free offsets at first) and a
/// whereabouts-style writer (resourceVersion-tested patches, lowest free first,
/// retried on 422) fill one dual-stack pool at the same time: every address is
/// held by exactly the container it was given to, none twice.
#[test]
fn racing_writers_without_reservations_never_share_an_address() {
    const PODS: usize = 16;
    const WHEREABOUTS: usize = 8;
    let cluster = shared();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("k8s-race");
    let log = tmp.path().join("plugin.log");
    let mut conf = kubernetes_conf("k8s-race", &cluster.plugin_kubeconfig(), None, &["192.0.2.0/27", "2001:db8:79::/64"]);
    conf["ipam"]["enable_overlapping_ranges"] = json!(false);
    let conf = with_debug_log(conf, &log).to_string();
    let (v4, v6) = ("192.0.2.0-27", "2001-db8-79---64");
    add(&conf, "cid-first", "first").expect_ok("first ADD (creates the pools)");

    // whereabouts' allocation loop on the IPv4 pool: read, lowest free, patch
    // with the resourceVersion read, again on 422.
    let whereabouts = {
        let objects = Objects::admin(&cluster).unwrap();
        std::thread::spawn(move || {
            let mut taken = Vec::new();
            let mut refused = 0;
            while taken.len() < WHEREABOUTS {
                let pool = objects.get(IPPOOLS, v4).unwrap().unwrap();
                let version = pool["metadata"]["resourceVersion"].as_str().unwrap().to_string();
                let used: Vec<u32> = pool["spec"]["allocations"].as_object().map(|m| m.keys().filter_map(|k| k.parse().ok()).collect()).unwrap_or_default();
                let offset = (1..255).find(|o| !used.contains(o)).unwrap();
                let cid = format!("cid-wb-{}", taken.len());
                let ops = json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                    {"op": "test", "path": format!("/spec/allocations/{offset}"), "value": null},
                    {"op": "add", "path": format!("/spec/allocations/{offset}"), "value": {"id": cid, "podref": format!("other/{cid}"), "ifname": "eth0"}}
                ]);
                match objects.json_patch(IPPOOLS, v4, &ops).unwrap() {
                    Ok(_) => taken.push((offset, cid)),
                    Err(422) => refused += 1,
                    Err(code) => panic!("whereabouts-style patch: {code}"),
                }
            }
            (taken, refused)
        })
    };
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..PODS)
            .map(|i| {
                let conf = &conf;
                scope.spawn(move || add(conf, &format!("cid-{i}"), &format!("race-{i}")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (whereabouts_taken, whereabouts_refused) = whereabouts.join().unwrap();
    for o in &outcomes {
        o.expect_ok("racing ADD");
    }
    let log_text = std::fs::read_to_string(&log).unwrap();
    let refused = api_requests(&log).iter().filter(|r| r.starts_with("PATCH") && r.contains("-> 422")).count();
    eprintln!(
        "{PODS} racing dual-stack ADDs without reservations + {WHEREABOUTS} whereabouts-style inserts: {refused} plugin patches refused by an entry guard, {} conflicts retried; whereabouts refused {whereabouts_refused} times",
        log_text.matches("changed concurrently; planning again").count()
    );
    assert!(refused > 0, "the ADDs should have raced for the same offsets");

    // Every address handed out is stored once, under the container it was given to.
    let pools = [objects.allocations(v4).unwrap(), objects.allocations(v6).unwrap()];
    for o in &outcomes {
        for (i, address) in o.ips().iter().enumerate() {
            let ip: std::net::IpAddr = address.split('/').next().unwrap().parse().unwrap();
            let offset = match ip {
                std::net::IpAddr::V4(a) => u128::from(u32::from(a) & 0xff),
                std::net::IpAddr::V6(a) => u128::from(a) & 0xffff_ffff_ffff_ffff,
            };
            assert_eq!(pools[i][&offset.to_string()]["id"], o.call.container_id, "{address} of {}: {:?}", o.call.container_id, pools[i]);
        }
    }
    for (offset, cid) in &whereabouts_taken {
        assert_eq!(pools[0][&offset.to_string()]["id"], *cid, "whereabouts' entry at {offset}");
    }
    assert_eq!(pools[0].len(), 1 + PODS + WHEREABOUTS, "{:?}", pools[0]);
    assert_eq!(pools[1].len(), 1 + PODS, "{:?}", pools[1]);
    let all = addresses(&outcomes);
    let mut unique = all.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), all.len(), "an address was handed out twice: {all:?}");

    std::thread::scope(|scope| {
        for i in 0..PODS {
            let conf = &conf;
            scope.spawn(move || {
                del(conf, &format!("cid-{i}"), &format!("race-{i}")).expect_ok("racing DEL");
            });
        }
    });
    del(&conf, "cid-first", "first").expect_ok("DEL first");
    let left = objects.allocations(v4).unwrap();
    assert_eq!(left.len(), WHEREABOUTS, "only whereabouts' entries remain: {left:?}");
    assert!(objects.allocations(v6).unwrap().is_empty());
    objects.delete(IPPOOLS, v4).unwrap();
    objects.delete(IPPOOLS, v6).unwrap();
}

#[test]
fn bad_kubeconfigs_and_missing_rights_are_clear_errors_that_write_nothing() {
    let cluster = shared();
    let tmp = TempDir::new("k8s-badkc");
    let ranges = ["192.0.2.192/28"];

    let missing = tmp.path().join("missing.kubeconfig");
    let conf = kubernetes_conf("k8s-bad", &missing, None, &ranges).to_string();
    let e = add(&conf, "cid-1", "p1").expect_cni_error("ADD with a missing kubeconfig");
    assert_eq!(e["code"], 7, "{e}");
    assert!(e["msg"].as_str().unwrap().contains(missing.to_str().unwrap()), "{e}");
    assert_eq!(del(&conf, "cid-1", "p1").expect_cni_error("DEL with a missing kubeconfig")["code"], 7);

    let garbage = tmp.path().join("garbage.kubeconfig");
    std::fs::write(&garbage, "clusters: [oops").unwrap();
    let e = add(&kubernetes_conf("k8s-bad", &garbage, None, &ranges).to_string(), "cid-1", "p1").expect_cni_error("ADD with an unparsable kubeconfig");
    assert_eq!(e["code"], 7, "{e}");

    // A token the apiserver does not know: 401, named.
    let wrong_token = tmp.path().join("wrong-token.kubeconfig");
    kubeconfig_variant(&cluster.plugin_kubeconfig(), &wrong_token, |kc| kc["users"][0]["user"]["token"] = json!("not-a-valid-token")).unwrap();
    let conf = kubernetes_conf("k8s-bad", &wrong_token, None, &ranges).to_string();
    let e = add(&conf, "cid-1", "p1").expect_cni_error("ADD with a wrong token");
    let msg = e["msg"].as_str().unwrap();
    assert_eq!(e["code"], 999, "{e}");
    assert!(msg.contains(&cluster.server_url()) && msg.contains("401"), "{msg}");

    // The plugin identity in a namespace its Role does not cover: 403, naming it.
    let elsewhere = tmp.path().join("default-ns.kubeconfig");
    kubeconfig_variant(&cluster.plugin_kubeconfig(), &elsewhere, |kc| kc["contexts"][0]["context"]["namespace"] = json!("default")).unwrap();
    let conf = kubernetes_conf("k8s-bad", &elsewhere, None, &ranges).to_string();
    let e = add(&conf, "cid-1", "p1").expect_cni_error("ADD in a forbidden namespace");
    let msg = e["msg"].as_str().unwrap();
    assert_eq!(e["code"], 999, "{e}");
    assert!(msg.contains("forbidden") && msg.contains("cannot list resource \"ippools\"") && msg.contains("namespace \"default\""), "{msg}");
    let e = run(&Call::global("STATUS"), &conf, &[]).expect_cni_error("STATUS in a forbidden namespace");
    assert_eq!(e["code"], 50, "{e}");

    // Nothing was written anywhere.
    for ns in [NAMESPACE, "default"] {
        let objects = Objects::admin_in(&cluster, ns).unwrap();
        assert_eq!(objects.get(IPPOOLS, "192.0.2.192-28").unwrap(), None, "{ns}");
        assert!(!objects.reservations().unwrap().contains_key("192.0.2.193"), "{ns}");
    }
}

#[test]
fn apiserver_down_is_try_again_later_within_the_deadline() {
    let cluster = prepared_cluster();
    let objects = Objects::admin(&cluster).unwrap();
    let conf = kubernetes_conf("k8s-down", &cluster.plugin_kubeconfig(), None, &["192.0.2.208/28", "2001:db8:72::/64"]).to_string();
    add(&conf, "cid-1", "p1").expect_ok("ADD before the outage");

    cluster.stop_apiserver();
    let budget = [("THEREABOUTS_TIMEOUT_MS", "3000")];
    let down = run(&Call::pod("ADD", "cid-2", "p2"), &conf, &budget);
    let e = down.expect_cni_error("ADD while the apiserver is down");
    assert_eq!(e["code"], 11, "{}", down.describe());
    let msg = e["msg"].as_str().unwrap();
    assert!(msg.contains(&cluster.server_url()) && msg.contains("unavailable"), "{msg}");
    assert!(down.elapsed < Duration::from_secs(5), "answered after {:?}", down.elapsed);
    let e = run(&Call::pod("DEL", "cid-1", "p1"), &conf, &budget).expect_cni_error("DEL while the apiserver is down");
    assert_eq!(e["code"], 11, "{e}");
    let e = run(&Call::global("STATUS"), &conf, &budget).expect_cni_error("STATUS while the apiserver is down");
    assert_eq!(e["code"], 50, "{e}");

    cluster.start_apiserver().expect("restarting kube-apiserver");
    // Nothing of the failed calls remains; the next ADD continues where it was.
    assert_eq!(objects.allocations("192.0.2.208-28").unwrap().keys().collect::<Vec<_>>(), ["1"]);
    assert_eq!(add(&conf, "cid-2", "p2").ips(), ["192.0.2.210/28", "2001:db8:72::2/64"]);
    del(&conf, "cid-1", "p1").expect_ok("DEL after the outage");
    assert_eq!(objects.allocations("2001-db8-72---64").unwrap().keys().collect::<Vec<_>>(), ["2"]);
}

/// An apiserver that accepts connections and never answers: the call still
/// ends (code 11) within its budget.
#[test]
fn an_unresponsive_apiserver_is_bounded_by_the_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let _hold = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
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
    let conf = kubernetes_conf("k8s-silent", &kubeconfig, None, &["192.0.2.224/28"]).to_string();
    let out = run(&Call::pod("ADD", "cid-1", "p1"), &conf, &[("THEREABOUTS_TIMEOUT_MS", "1500")]);
    let e = out.expect_cni_error("ADD against a silent apiserver");
    assert_eq!(e["code"], 11, "{}", out.describe());
    assert!(e["msg"].as_str().unwrap().contains(&format!("https://127.0.0.1:{port}")), "{e}");
    assert!(out.elapsed < Duration::from_millis(4000), "answered after {:?}", out.elapsed);
}
