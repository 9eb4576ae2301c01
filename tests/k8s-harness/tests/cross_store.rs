//! The same scenario on the three datastores (file, Kubernetes, etcd), held to
//! one answer: where the README promises an option means the same everywhere.

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, TempDir, thereabouts_bin, thereabouts_conf};
use thereabouts_k8s_harness::Cluster;
use thereabouts_k8s_harness::etcd::{self, Etcd};
use thereabouts_k8s_harness::plugin::kubernetes_conf;

/// The addresses an ADD of `pod` on `conf` got.
fn add(conf: &Value, pod: &str) -> Vec<String> {
    let out = Invocation::new(Call::pod("ADD", &format!("cid-{pod}"), pod), conf.to_string()).run(&thereabouts_bin());
    out.expect_ok(&format!("ADD {pod}"));
    out.ips()
}

/// Network A (a /24, `enable_overlapping_ranges: false`) allocates, then
/// network B (a /28 inside it, overlapping on) does: A wrote no reservation
/// (whereabouts' behaviour), so B gets the same first address on every store.
fn overlap_off_then_on(with_range: impl Fn(&str, &str) -> Value) -> [Vec<String>; 3] {
    let mut a = with_range("xs-a", "192.0.2.0/24");
    a["ipam"]["enable_overlapping_ranges"] = json!(false);
    let b = with_range("xs-b", "192.0.2.0/28");
    [add(&a, "a1"), add(&b, "b1"), add(&b, "b2")]
}

#[test]
fn an_address_taken_without_overlapping_ranges_reserves_nothing_on_any_store() {
    let want = [vec!["192.0.2.1/24".to_string()], vec!["192.0.2.1/28".to_string()], vec!["192.0.2.2/28".to_string()]];

    let tmp = TempDir::new("cross-store");
    let data = tmp.path().join("data");
    let file = overlap_off_then_on(|name, range| thereabouts_conf("1.1.0", name, &data, None, &[range]));
    assert_eq!(file, want, "file datastore");

    let cluster = Cluster::shared().expect("starting the shared control plane");
    let kubeconfig = cluster.plugin_kubeconfig();
    // A range of its own on the shared apiserver: 192.0.2.0/24 is this test's there.
    let kubernetes = overlap_off_then_on(|name, range| kubernetes_conf(name, &kubeconfig, Some("xstore"), &[range]));
    assert_eq!(kubernetes, want, "Kubernetes datastore");

    let etcd = Etcd::start_plain().expect("starting etcd");
    let on_etcd = overlap_off_then_on(|name, range| etcd::etcd_conf(etcd.access(), name, &[range]));
    assert_eq!(on_etcd, want, "etcd datastore");
}
