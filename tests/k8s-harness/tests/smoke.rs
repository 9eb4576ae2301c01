//! Smoke tests of the harness against the real kube-apiserver + etcd: the
//! whereabouts CRDs install, an IPPool round-trips, and the two optimistic
//! concurrency failures the datastore relies on come back as the apiserver's
//! real status codes (422 for a failed JSON-patch `test`, 409 for a stale PUT).
//! Also: the plugin identity authenticates but is forbidden without RBAC, and
//! nothing is left behind after drop — even when the test panics.

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::json;
use thereabouts_k8s_harness::{Cluster, NAMESPACE, pid_alive};

fn ippools() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("whereabouts.cni.cncf.io", "v1alpha1", "IPPool"), "ippools")
}

fn api_status(err: kube::Error) -> Box<kube::core::Status> {
    match err {
        kube::Error::Api(s) => s,
        other => panic!("expected an API status error, got {other:?}"),
    }
}

fn assert_gone(pids: &[u32], dir: &std::path::Path) {
    // Killed process groups are reaped synchronously by Drop; allow a moment anyway.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| pid_alive(*p)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in pids {
        assert!(!pid_alive(*p), "process {p} survived the teardown");
    }
    let keep = std::env::var_os("THEREABOUTS_K8S_KEEP").is_some_and(|v| v != "0" && !v.is_empty());
    assert!(keep || !dir.exists(), "{} survived the teardown", dir.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crds_ippool_and_conflict_status_codes() {
    let cluster = Cluster::start().expect("starting etcd + kube-apiserver");
    let pids = cluster.pids();
    assert_eq!(pids.len(), 2);
    let dir = cluster.dir().to_path_buf();

    // Kubeconfigs are flat files with the namespace in the context.
    for kc in [cluster.admin_kubeconfig(), cluster.plugin_kubeconfig()] {
        let text = std::fs::read_to_string(&kc).unwrap();
        assert!(text.contains("namespace: kube-system"), "{}:\n{text}", kc.display());
        assert!(text.contains("certificate-authority-data:"), "{}:\n{text}", kc.display());
    }

    cluster.install_crds().await.expect("installing deploy/crds");
    let admin = cluster.admin_client().await.unwrap();
    let pools: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NAMESPACE, &ippools());

    // Create an IPPool the way whereabouts names and shapes it.
    let mut pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": "192.0.2.0-24"},
        "spec": {
            "range": "192.0.2.0/24",
            "allocations": {"1": {"id": "c0ffee", "podref": "default/pod-a", "ifname": "net1"}}
        }
    }))
    .unwrap();
    pool = pools.create(&PostParams::default(), &pool).await.expect("creating the IPPool");
    let rv1 = pool.metadata.resource_version.clone().expect("resourceVersion after create");
    assert_eq!(pool.data["spec"]["allocations"]["1"]["podref"], "default/pod-a");

    // The schema is enforced (podref is required): the CRD is really installed.
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "203.0.113.0-24"},
        "spec": {"range": "203.0.113.0/24", "allocations": {"1": {"id": "x"}}}
    }))
    .unwrap();
    let s = api_status(pools.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!(s.code, 422, "schema violation: {s:?}");

    // A successful PUT with the current resourceVersion moves it to rv2.
    pool.data["spec"]["allocations"]["2"] = json!({"id": "beef", "podref": "default/pod-b"});
    let updated = pools.replace("192.0.2.0-24", &PostParams::default(), &pool).await.expect("PUT with current rv");
    let rv2 = updated.metadata.resource_version.clone().unwrap();
    assert_ne!(rv1, rv2);

    // PUT with the stale rv1 -> 409 Conflict.
    let mut stale = pool.clone();
    stale.metadata.resource_version = Some(rv1.clone());
    stale.data["spec"]["allocations"]["3"] = json!({"id": "dead", "podref": "default/pod-c"});
    let s = api_status(pools.replace("192.0.2.0-24", &PostParams::default(), &stale).await.unwrap_err());
    assert_eq!(s.code, 409, "stale PUT: {s:?}");
    assert_eq!(s.reason, "Conflict");

    // JSON patch whose `test` on the resourceVersion fails -> 422 Invalid
    // (what whereabouts' Update sends and retries on).
    let patch = |rv: &str, offset: &str| -> json_patch::Patch {
        serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "test", "path": format!("/spec/allocations/{offset}"), "value": null},
            {"op": "add", "path": format!("/spec/allocations/{offset}"),
             "value": {"id": "feed", "podref": "default/pod-d", "ifname": "eth0"}}
        ]))
        .unwrap()
    };
    let s = api_status(pools.patch("192.0.2.0-24", &PatchParams::default(), &Patch::Json::<()>(patch(&rv1, "4"))).await.unwrap_err());
    assert_eq!(s.code, 422, "failed JSON-patch test: {s:?}");
    assert_eq!(s.reason, "Invalid");

    // Neither failed write changed anything.
    let now = pools.get("192.0.2.0-24").await.unwrap();
    assert_eq!(now.metadata.resource_version.as_deref(), Some(rv2.as_str()));
    let allocs = now.data["spec"]["allocations"].as_object().unwrap();
    assert_eq!(allocs.keys().collect::<Vec<_>>(), ["1", "2"]);

    // The same patch with the current rv succeeds (positive control).
    let patched = pools.patch("192.0.2.0-24", &PatchParams::default(), &Patch::Json::<()>(patch(&rv2, "4"))).await.expect("JSON patch with current rv");
    assert_eq!(patched.data["spec"]["allocations"]["4"]["ifname"], "eth0");

    // The plugin identity authenticates (not 401) but may do nothing before the
    // RBAC manifests bind it (403).
    let plugin = cluster.plugin_client().await.unwrap();
    let plugin_pools: Api<DynamicObject> = Api::namespaced_with(plugin, NAMESPACE, &ippools());
    let s = api_status(plugin_pools.get("192.0.2.0-24").await.unwrap_err());
    assert_eq!(s.code, 403, "plugin identity without RBAC: {s:?}");
    assert!(s.message.contains("system:serviceaccount:kube-system:thereabouts"), "{}", s.message);

    // The ORIP CRD is served too.
    cluster
        .apply_yaml(
            "apiVersion: whereabouts.cni.cncf.io/v1alpha1\nkind: OverlappingRangeIPReservation\n\
             metadata: {name: 192.0.2.1}\nspec: {podref: default/pod-a, ifname: net1, containerid: c0ffee}\n",
        )
        .await
        .expect("applying an ORIP");

    drop(cluster);
    assert_gone(&pids, &dir);
}

#[test]
fn teardown_when_a_test_panics() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::thread::spawn(move || {
        let cluster = Cluster::start().expect("starting etcd + kube-apiserver");
        tx.send((cluster.pids(), cluster.dir().to_path_buf())).unwrap();
        panic!("deliberate panic with a running cluster");
    })
    .join();
    assert!(result.is_err(), "the thread should have panicked");
    let (pids, dir) = rx.recv().unwrap();
    assert_eq!(pids.len(), 2);
    assert_gone(&pids, &dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_keeps_data() {
    let cluster = Cluster::start().expect("starting etcd + kube-apiserver");
    cluster.install_crds().await.unwrap();
    cluster
        .apply_yaml(
            "apiVersion: whereabouts.cni.cncf.io/v1alpha1\nkind: IPPool\nmetadata: {name: 198.51.100.0-24}\n\
             spec: {range: 198.51.100.0/24, allocations: {}}\n",
        )
        .await
        .unwrap();
    let old = cluster.pids()[0];
    cluster.stop_apiserver();
    assert!(!pid_alive(old));
    assert_eq!(cluster.pids().len(), 1, "only etcd runs");
    cluster.start_apiserver().expect("restarting kube-apiserver");
    let admin = cluster.admin_client().await.unwrap();
    let pools: Api<DynamicObject> = Api::namespaced_with(admin, NAMESPACE, &ippools());
    let pool = pools.get("198.51.100.0-24").await.expect("pool survives an apiserver restart");
    assert_eq!(pool.data["spec"]["range"], "198.51.100.0/24");
}
