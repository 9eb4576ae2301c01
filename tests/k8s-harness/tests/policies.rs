//! Policy extensions on the Kubernetes datastore, through the CNI protocol
//! against the real apiserver, the wire format of the pools unchanged:
//!
//! * sticky-ordinal: a StatefulSet pod keeps its address across DEL and
//!   re-create;
//! * namespace-ranges with a label rule: the plugin reads each Pod (one GET,
//!   its own identity, `deploy/rbac-pod-labels.yaml` applied), so a pod of
//!   namespace team-a gets ranges 1 and 2, a pod labelled `tier=db` range 3
//!   only (in any namespace), others the default; a relabelled pod is placed
//!   by its new label, a pod that does not exist gets an error;
//! * the opt-in RBAC: with `deploy/rbac.yaml` alone such an ADD fails with a
//!   CNI error naming the pod and the refusal, and writes nothing (pools and
//!   reservations unchanged); after `deploy/rbac-pod-labels.yaml` the same ADD
//!   succeeds.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir, built_policy, compile_policy, thereabouts_bin};
use thereabouts_k8s_harness::plugin::{IPPOOLS, Objects, RESERVATIONS, kubernetes_conf};
use thereabouts_k8s_harness::{Cluster, block_on, pods};

#[test]
fn a_statefulset_pod_keeps_its_address_across_del_and_re_create_on_kubernetes() {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("policy-k8s");
    let cache = tmp.sub("cache");
    compile_policy(&built_policy("sticky-ordinal"), &cache);
    let mut conf = kubernetes_conf("blue", &cluster.plugin_kubeconfig(), None, &["192.0.2.0/24", "2001:db8::/64"]);
    conf["ipam"]["policies"] = json!([{"name": "sticky", "path": built_policy("sticky-ordinal"), "settings": {"base": 10}}]);
    let run = |command: &str, pod: &str, cid: &str| -> Outcome {
        let mut call = Call::pod(command, cid, pod);
        call.ifname = "net1".into();
        Invocation::new(call, conf.to_string()).env("THEREABOUTS_POLICY_CACHE", cache.to_str().unwrap()).run(&thereabouts_bin())
    };
    let add = |pod: &str, cid: &str| {
        let out = run("ADD", pod, cid);
        out.expect_ok(&format!("ADD {pod}"));
        out.ips()
    };
    let sticky = ["192.0.2.13/24", "2001:db8::d/64"];
    assert_eq!(add("filler", "c0"), ["192.0.2.1/24", "2001:db8::1/64"], "no ordinal: the built-in choice");
    assert_eq!(add("web-2", "c1"), sticky, "first + base + ordinal");
    run("DEL", "web-2", "c1").expect_ok("DEL web-2");
    assert!(objects.allocations("192.0.2.0-24").unwrap().values().all(|e| e["podref"] != "default/web-2"), "DEL freed it");
    assert_eq!(add("web-2", "c2"), sticky, "re-created after its DEL");
    assert_eq!(add("web-2", "c3"), sticky, "re-created without a DEL: it keeps its entry");
    let entries = objects.allocations("192.0.2.0-24").unwrap();
    assert_eq!(entries.get("13").map(|e| (e["id"].clone(), e["podref"].clone())), Some((json!("c3"), json!("default/web-2"))), "{entries:?}");
}

/// The ranges of the label tests, indexes 0 to 3.
const RANGES: [&str; 4] = ["192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/64"];
const POOLS: [&str; 4] = ["192.0.2.0-24", "198.51.100.0-24", "203.0.113.0-24", "2001-db8---64"];

/// namespace-ranges: team-a gets ranges 1 and 2 (indexes 0, 1), `tier=db`
/// range 3 (index 2) wherever it is, every other pod the IPv6 range. The
/// label rule makes the policy declare `pod-labels`.
fn tiers_conf(cluster: &Cluster) -> Value {
    let mut conf = kubernetes_conf("tiers", &cluster.plugin_kubeconfig(), None, &RANGES);
    conf["ipam"]["policies"] = json!([{
        "name": "tiers",
        "path": built_policy("namespace-ranges"),
        "settings": {"namespaces": {"team-a": [0, 1]}, "labels": [{"key": "tier", "value": "db", "ranges": [2]}], "default": [3]},
    }]);
    conf
}

/// One CNI call of the pod `namespace/pod` (interface net1), the way a
/// runtime under Kubernetes sends it, with the policy cache `cache`.
fn call(conf: &Value, cache: &Path, command: &str, namespace: &str, pod: &str, cid: &str) -> Outcome {
    let mut call = Call::pod(command, cid, pod);
    call.ifname = "net1".into();
    call.cni_args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod}");
    Invocation::new(call, conf.to_string()).env("THEREABOUTS_POLICY_CACHE", cache.to_str().unwrap()).run(&thereabouts_bin())
}

fn add(conf: &Value, cache: &Path, namespace: &str, pod: &str, cid: &str) -> Vec<String> {
    let out = call(conf, cache, "ADD", namespace, pod, cid);
    out.expect_ok(&format!("ADD {namespace}/{pod}"));
    out.ips()
}

/// `podref` of every entry of the pool, by offset.
fn podrefs(objects: &Objects, pool: &str) -> BTreeMap<String, String> {
    objects.allocations(pool).unwrap().into_iter().map(|(k, e)| (k, e["podref"].as_str().unwrap_or_default().to_string())).collect()
}

#[test]
fn a_label_policy_places_pods_by_the_labels_the_plugin_reads_from_the_apiserver() {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("policy-labels");
    let cache = tmp.sub("cache");
    compile_policy(&built_policy("namespace-ranges"), &cache);
    block_on(async {
        pods::namespace(&cluster, "team-a").await?;
        pods::namespace(&cluster, "team-b").await?;
        for ns in ["team-a", "team-b"] {
            cluster.install_pod_labels_rbac(ns).await?;
        }
        pods::create_labelled(&cluster, "team-a", "web-1", &[("tier", "web")]).await?;
        pods::create_labelled(&cluster, "team-a", "db-1", &[("tier", "db"), ("app", "pg")]).await?;
        pods::create_labelled(&cluster, "team-a", "cache-1", &[]).await?;
        pods::create_labelled(&cluster, "team-b", "db-2", &[("tier", "db")]).await?;
        pods::create_labelled(&cluster, "team-b", "app-1", &[("tier", "web")]).await?;
        anyhow::Ok(())
    })
    .unwrap();
    let conf = tiers_conf(&cluster);

    assert_eq!(add(&conf, &cache, "team-a", "web-1", "c1"), ["192.0.2.1/24", "198.51.100.1/24"], "team-a: ranges 1 and 2");
    assert_eq!(add(&conf, &cache, "team-a", "db-1", "c2"), ["203.0.113.1/24"], "tier=db: range 3 only, the label before the namespace");
    assert_eq!(add(&conf, &cache, "team-b", "db-2", "c3"), ["203.0.113.2/24"], "tier=db in another namespace: range 3");
    assert_eq!(add(&conf, &cache, "team-b", "app-1", "c4"), ["2001:db8::1/64"], "neither: the default");
    // Read at each ADD: a pod relabelled tier=db is placed by its new label.
    assert_eq!(add(&conf, &cache, "team-a", "cache-1", "c5"), ["192.0.2.2/24", "198.51.100.2/24"], "unlabelled in team-a");
    call(&conf, &cache, "DEL", "team-a", "cache-1", "c5").expect_ok("DEL team-a/cache-1");
    block_on(pods::label(&cluster, "team-a", "cache-1", &[("tier", "db")])).unwrap();
    assert_eq!(add(&conf, &cache, "team-a", "cache-1", "c6"), ["203.0.113.3/24"], "relabelled tier=db");

    // The pools as any whereabouts-compatible reader sees them.
    assert_eq!(podrefs(&objects, POOLS[0]), BTreeMap::from([("1".to_string(), "team-a/web-1".to_string())]));
    assert_eq!(podrefs(&objects, POOLS[1]), BTreeMap::from([("1".to_string(), "team-a/web-1".to_string())]));
    assert_eq!(
        podrefs(&objects, POOLS[2]),
        BTreeMap::from([("1".into(), "team-a/db-1".into()), ("2".into(), "team-b/db-2".into()), ("3".into(), "team-a/cache-1".into())])
    );
    assert_eq!(podrefs(&objects, POOLS[3]), BTreeMap::from([("1".to_string(), "team-b/app-1".to_string())]));

    // No Pod object: no labels to go by, so no address (never a silent empty set).
    let ghost = call(&conf, &cache, "ADD", "team-a", "ghost", "c7");
    let err = ghost.expect_cni_error("ADD of a pod that does not exist");
    let msg = err["msg"].as_str().unwrap();
    assert!(msg.contains("cannot read pod team-a/ghost for its policies") && msg.contains("404"), "{}", ghost.describe());
    assert!(objects.allocations(POOLS[0]).unwrap().values().chain(objects.allocations(POOLS[1]).unwrap().values()).all(|e| e["id"] != "c7"));
}

/// Every IPPool and reservation as served, resourceVersions included.
fn snapshot(objects: &Objects) -> (BTreeMap<String, Value>, BTreeMap<String, Value>) {
    (objects.list(IPPOOLS).unwrap(), objects.list(RESERVATIONS).unwrap())
}

#[test]
fn a_label_policy_needs_the_opt_in_rbac_and_without_it_fails_cleanly_writing_nothing() {
    // deploy/rbac.yaml alone: the plugin identity may not read pods.
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("policy-rbac");
    let cache = tmp.sub("cache");
    compile_policy(&built_policy("namespace-ranges"), &cache);
    block_on(async {
        pods::namespace(&cluster, "team-a").await?;
        pods::create_labelled(&cluster, "team-a", "db-1", &[("tier", "db")]).await
    })
    .unwrap();
    let conf = tiers_conf(&cluster);
    // Pools with an entry each, written without the policy: something to keep.
    let mut plain = conf.clone();
    plain["ipam"].as_object_mut().unwrap().remove("policies");
    assert_eq!(add(&plain, &cache, "team-a", "seed", "c0"), ["192.0.2.1/24", "198.51.100.1/24", "203.0.113.1/24", "2001:db8::1/64"]);
    let before = snapshot(&objects);
    assert_eq!(before.0.len(), 4);

    let refused = call(&conf, &cache, "ADD", "team-a", "db-1", "c1");
    let err = refused.expect_cni_error("ADD with a label policy, without rbac-pod-labels.yaml");
    let msg = err["msg"].as_str().unwrap();
    for needle in [
        "cannot read pod team-a/db-1 for its policies",
        "403",
        "cannot get resource \"pods\"",
        "system:serviceaccount:kube-system:thereabouts",
        "namespace \"team-a\"",
        "deploy/rbac-pod-labels.yaml",
    ] {
        assert!(msg.contains(needle), "{needle:?} not in the error: {}", refused.describe());
    }
    assert_eq!(err["code"], 999, "{}", refused.describe());
    assert_eq!(snapshot(&objects), before, "the refused ADD wrote nothing");

    block_on(cluster.install_pod_labels_rbac("team-a")).unwrap();
    assert_eq!(add(&conf, &cache, "team-a", "db-1", "c1"), ["203.0.113.2/24"], "the same ADD, after rbac-pod-labels.yaml");
    assert_eq!(podrefs(&objects, POOLS[2]).get("2").map(String::as_str), Some("team-a/db-1"));
}
