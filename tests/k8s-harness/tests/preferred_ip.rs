//! The pod annotation `whereabouts.cni.cncf.io/preferred-ip` (whereabouts PR
//! #681) with `preferred_ip_annotation: true`, through the CNI protocol against
//! the real apiserver: the plugin reads the pod (its own identity,
//! `deploy/rbac-pod-labels.yaml` applied) and each range takes the preferred
//! address of its family when it is free, else its configured choice.

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, Outcome, thereabouts_bin};
use thereabouts_k8s_harness::plugin::kubernetes_conf;
use thereabouts_k8s_harness::{Cluster, block_on, pods};

const PREFERRED: &str = "whereabouts.cni.cncf.io/preferred-ip";

fn add(conf: &Value, namespace: &str, pod: &str) -> Outcome {
    let mut call = Call::pod("ADD", &format!("c-{pod}"), pod);
    call.ifname = "net1".into();
    call.cni_args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod}");
    Invocation::new(call, conf.to_string()).run(&thereabouts_bin())
}

fn ips(conf: &Value, namespace: &str, pod: &str) -> Vec<String> {
    let out = add(conf, namespace, pod);
    out.expect_ok(&format!("ADD {namespace}/{pod}"));
    out.ips()
}

#[test]
fn a_pod_gets_its_preferred_address_when_it_is_free_and_the_configured_choice_when_not() {
    let cluster = Cluster::prepared().unwrap();
    block_on(async {
        pods::namespace(&cluster, "team-a").await?;
        cluster.install_pod_labels_rbac("team-a").await?;
        for (pod, preferred) in [("db-1", "192.0.2.50"), ("db-2", "192.0.2.50,2001:db8::50"), ("db-3", "192.0.2.60"), ("web", "198.51.100.7")] {
            pods::create_labelled(&cluster, "team-a", pod, &[]).await?;
            pods::annotate(&cluster, "team-a", pod, &[(PREFERRED, preferred)]).await?;
        }
        anyhow::Ok(())
    })
    .unwrap();
    let plain = kubernetes_conf("pref", &cluster.plugin_kubeconfig(), None, &["192.0.2.0/24", "2001:db8::/64"]);
    let mut conf = plain.clone();
    conf["ipam"]["preferred_ip_annotation"] = json!(true);

    assert_eq!(ips(&conf, "team-a", "db-1"), ["192.0.2.50/24", "2001:db8::1/64"], "its IPv4 preference; no IPv6 one");
    assert_eq!(ips(&conf, "team-a", "db-2"), ["192.0.2.1/24", "2001:db8::50/64"], "192.0.2.50 is db-1's: the lowest free there");
    assert_eq!(ips(&conf, "team-a", "web"), ["192.0.2.2/24", "2001:db8::2/64"], "a preference outside every range is no error");
    assert_eq!(ips(&conf, "team-a", "db-1"), ["192.0.2.50/24", "2001:db8::1/64"], "a repeated ADD keeps what it has");
    // Without the key no pod is read: the annotation changes nothing.
    assert_eq!(ips(&plain, "team-a", "db-3"), ["192.0.2.3/24", "2001:db8::3/64"]);
    // A pod the plugin cannot read (there is none): the configured choice, not a failure.
    assert_eq!(ips(&conf, "team-a", "ghost"), ["192.0.2.4/24", "2001:db8::4/64"]);
}
