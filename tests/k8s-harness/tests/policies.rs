//! A policy extension on the Kubernetes datastore: sticky-ordinal (a
//! StatefulSet pod keeps its address) through the CNI protocol against the
//! real apiserver, the wire format of the pools unchanged.

use serde_json::json;
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir, built_policy, compile_policy, thereabouts_bin};
use thereabouts_k8s_harness::Cluster;
use thereabouts_k8s_harness::plugin::{Objects, kubernetes_conf};

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
