//! The chart's ValidatingAdmissionPolicies (deploy/admission.yaml, rendered from
//! charts/thereabouts) on the real kube-apiserver: a malformed IPPool,
//! reservation or NodeSlicePool written by hand is refused with a message that
//! names the field; a good one is accepted; the plugin's own writes are exempt.

use std::time::Duration;

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, thereabouts_bin};
use thereabouts_k8s_harness::plugin::kubernetes_conf;
use thereabouts_k8s_harness::{Cluster, NAMESPACE, block_on, deploy_dir, wait_until};

/// Creates `object` as the admin: `Ok` or the apiserver's refusal message.
fn create(cluster: &Cluster, object: Value) -> Result<(), String> {
    let yaml = serde_yaml_ng::to_string(&object).unwrap();
    block_on(async {
        let client = cluster.admin_client().await.unwrap();
        let kind = object["kind"].as_str().unwrap();
        let plural = match kind {
            "IPPool" => "ippools",
            "OverlappingRangeIPReservation" => "overlappingrangeipreservations",
            _ => "nodeslicepools",
        };
        let resource = kube::api::ApiResource {
            group: "whereabouts.cni.cncf.io".into(),
            version: "v1alpha1".into(),
            api_version: "whereabouts.cni.cncf.io/v1alpha1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(client, NAMESPACE, &resource);
        let object: kube::api::DynamicObject = serde_yaml_ng::from_str(&yaml).unwrap();
        api.create(&kube::api::PostParams::default(), &object).await.map(|_| ()).map_err(|e| e.to_string())
    })
}

fn pool(name: &str, range: &str, allocations: Value) -> Value {
    json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool", "metadata": {"name": name, "namespace": NAMESPACE},
           "spec": {"range": range, "allocations": allocations}})
}

fn reservation(name: &str, podref: &str) -> Value {
    json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "OverlappingRangeIPReservation", "metadata": {"name": name, "namespace": NAMESPACE},
           "spec": {"containerid": "c1", "podref": podref, "ifname": "eth0"}})
}

fn slices(name: &str, range: &str, size: &str) -> Value {
    json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "NodeSlicePool", "metadata": {"name": name, "namespace": NAMESPACE},
           "spec": {"range": range, "sliceSize": size}})
}

fn entry() -> Value {
    json!({"id": "c1", "podref": "default/p", "ifname": "eth0"})
}

/// Refused, with a message holding `field`.
fn refused(cluster: &Cluster, object: Value, field: &str) {
    match create(cluster, object.clone()) {
        Ok(()) => panic!("accepted: {object}"),
        Err(message) => assert!(message.contains(field), "{field}: {message}"),
    }
}

#[test]
fn malformed_pool_objects_are_refused_naming_the_field_and_good_ones_accepted() {
    let cluster = Cluster::prepared().expect("a control plane");
    block_on(cluster.apply_path(&deploy_dir().join("admission.yaml"))).expect("applying deploy/admission.yaml");
    // Each policy takes effect once the apiserver has compiled it, each on its
    // own (a warm run reached the reservations while their policy was not in
    // force yet). A probe the policy let through stays: each try has its own name.
    let probes = std::cell::Cell::new(0);
    let in_force = |what: &str, object: &dyn Fn(String) -> Value, field: &str| {
        wait_until(what, Duration::from_secs(30), Duration::from_millis(200), || {
            probes.set(probes.get() + 1);
            create(&cluster, object(format!("probe-{}", probes.get()))).is_err_and(|m| m.contains(field))
        })
    };
    in_force("the IPPool policy refuses a bad range", &|name| pool(&name, "not-a-cidr", json!({})), "spec.range");
    in_force("the reservation policy refuses a name that is no address", &|name| reservation(&name, "default/p"), "metadata.name");
    in_force("the NodeSlicePool policy refuses a bad slice size", &|name| slices(&name, "192.0.2.0/24", "/20"), "spec.sliceSize");

    refused(&cluster, pool("bad-key", "192.0.2.0/24", json!({"abc": entry()})), "spec.allocations[abc]");
    refused(&cluster, pool("outside", "192.0.2.0/24", json!({"256": entry()})), "spec.allocations[256]: not a decimal offset inside 192.0.2.0/24");
    refused(&cluster, pool("leading-zero", "192.0.2.0/24", json!({"01": entry()})), "spec.allocations[01]");
    refused(&cluster, pool("v6-outside", "2001:db8::/120", json!({"256": entry()})), "spec.allocations[256]");
    create(&cluster, pool("192.0.2.0-24", "192.0.2.0/24", json!({"1": entry(), "255": entry()}))).expect("a good IPv4 pool");
    let top = (u128::MAX).to_string();
    create(&cluster, pool("2001-db8---0", "2001:db8::/0", json!({top: entry()}))).expect("2^128 - 1 fits a /0");
    create(&cluster, pool("2001-db8---64", "2001:db8::/64", json!({"18446744073709551615": entry(), "-5": entry()})))
        .expect("a /64 with whereabouts' old negative key");

    refused(&cluster, reservation("not-an-address", "default/p"), "metadata.name");
    refused(&cluster, reservation("192.0.2.300", "default/p"), "metadata.name");
    refused(&cluster, reservation("192.0.2.7", "no-slash"), "spec.podref");
    for good in ["192.0.2.7", "blue-192.0.2.7", "2001-db8--7", "my-net-2001-db8-480-603d-304-403--0", "blue---1"] {
        create(&cluster, reservation(good, "default/p")).unwrap_or_else(|e| panic!("{good}: {e}"));
    }

    refused(&cluster, slices("bad-range", "192.0.2.0/33", "/28"), "spec.range");
    refused(&cluster, slices("bad-size", "192.0.2.0/24", "/20"), "spec.sliceSize");
    create(&cluster, slices("good", "192.0.2.0/24", "/28")).expect("a good NodeSlicePool");

    // The plugin's own writes are exempt, and go through.
    let conf = kubernetes_conf("vap", &cluster.plugin_kubeconfig(), None, &["198.51.100.0/28"]).to_string();
    Invocation::new(Call::pod("ADD", "cid-vap", "vap"), conf).run(&thereabouts_bin()).expect_ok("the plugin's ADD");
}
