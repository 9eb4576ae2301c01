//! Persistent IPs for VMs (IPAMClaim, `allowPersistentIPs`), through the CNI
//! protocol against the real apiserver, with the pods' network-selection
//! annotations as KubeVirt's ipam-extensions writes them and the plugin's own
//! identity (`deploy/rbac-persistent-ips.yaml` applied): a VM's launcher pods
//! come and go, a live migration runs two at once, and the addresses stay the
//! claim's until the claim is deleted and the controller frees them.

use std::time::Duration;

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir, thereabouts_bin};
use thereabouts_k8s_harness::claims::{self, CLAIMS};
use thereabouts_k8s_harness::controller::{self, Controller, Settings};
use thereabouts_k8s_harness::etcd::{Etcd, etcd_conf};
use thereabouts_k8s_harness::plugin::{Objects, kubernetes_conf};
use thereabouts_k8s_harness::{Cluster, block_on, peers, pods, wait_until};

const NS: &str = "vms";
const POOL: &str = "192.0.2.0-24";

fn call(command: &str, conf: &Value, pod: &str, container: &str) -> Outcome {
    let mut call = Call::pod(command, container, pod);
    call.ifname = "net1".into();
    call.cni_args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={pod}");
    Invocation::new(call, conf.to_string()).run(&thereabouts_bin())
}

fn add(conf: &Value, pod: &str, container: &str) -> Vec<String> {
    let out = call("ADD", conf, pod, container);
    out.expect_ok(&format!("ADD {pod}"));
    out.ips()
}

fn claim(objects: &Objects, name: &str) -> Value {
    objects.list_at(CLAIMS, "ipamclaims").unwrap().remove(name).unwrap_or_default()
}

async fn launcher(cluster: &Cluster, pod: &str, vm: &str) -> anyhow::Result<()> {
    claims::launcher(cluster, NS, pod, vm).await
}

#[test]
fn a_vm_keeps_its_addresses_across_launcher_pods_until_its_claim_is_deleted() {
    let cluster = Cluster::prepared().unwrap();
    let controller_kubeconfig = block_on(async {
        claims::prepare(&cluster, NS).await?;
        for pod in ["launcher-a-1", "launcher-a-2", "launcher-a-3"] {
            launcher(&cluster, pod, "vm-a").await?;
        }
        pods::create_labelled(&cluster, NS, "plain", &[]).await?;
        controller::install(&cluster).await
    })
    .unwrap();
    let objects = Objects::admin_in(&cluster, NS).unwrap();
    claims::create(&objects, "vm-a.blue").unwrap();
    let mut conf = kubernetes_conf("blue", &cluster.plugin_kubeconfig(), None, &["192.0.2.0/24", "2001:db8::/64"]);
    conf["allowPersistentIPs"] = json!(true);
    let pools = Objects::admin(&cluster).unwrap();

    let first = add(&conf, "launcher-a-1", "c1");
    assert_eq!(first, ["192.0.2.1/24", "2001:db8::1/64"]);
    let status = &claim(&objects, "vm-a.blue")["status"];
    assert_eq!((&status["ips"], &status["ownerPod"]["name"]), (&json!(first), &json!("launcher-a-1")));
    assert_eq!(status["conditions"][0]["status"], "True");
    assert_eq!(pools.allocations(POOL).unwrap()["1"]["ipamclaimref"], "vms/vm-a.blue", "stored as whereabouts PR #742 stores it");
    assert_eq!(add(&conf, "plain", "c-plain"), ["192.0.2.2/24", "2001:db8::2/64"], "a pod without a claim never gets the claim's");

    // Live migration: the target starts while the source still runs.
    assert_eq!(add(&conf, "launcher-a-2", "c2"), first);
    assert_eq!(claim(&objects, "vm-a.blue")["status"]["ownerPod"]["name"], "launcher-a-2");
    call("DEL", &conf, "launcher-a-1", "c1").expect_ok("the source's DEL");
    // The VM stops: its launcher's DEL keeps the claim's addresses.
    call("DEL", &conf, "launcher-a-2", "c2").expect_ok("the target's DEL");
    assert_eq!(pools.allocations(POOL).unwrap()["1"]["podref"], "vms/launcher-a-2");
    assert_eq!(add(&conf, "launcher-a-3", "c3"), first, "restarted, on a new pod");

    // A claim of another namespace is refused, and nothing is written.
    let mut foreign = conf.clone();
    foreign["args"] = json!({"cni": {"ipam-claim-reference": "default/vm-b.blue"}});
    let before = pools.allocations(POOL).unwrap();
    let refused = call("ADD", &foreign, "plain", "c-foreign").expect_cni_error("a claim of another namespace");
    assert_eq!((refused["code"].as_u64(), refused["details"].as_str()), (Some(7), Some("field: ipam-claim-reference")));
    assert_eq!(pools.allocations(POOL).unwrap(), before);

    // The claim is deleted: the controller (which watches claims) frees its addresses.
    let work = TempDir::new("ipam-claims");
    let _controller = Controller::run(&thereabouts_bin(), &controller_kubeconfig, &Settings::default(), &work.path().join("controller.log")).unwrap();
    objects.delete_at(CLAIMS, "ipamclaims", "vm-a.blue").unwrap();
    wait_until("the deleted claim's address is freed", Duration::from_secs(30), Duration::from_millis(200), || {
        !pools.allocations(POOL).unwrap().contains_key("1")
    });
    assert!(pools.allocations(POOL).unwrap().contains_key("2"), "the plain pod's address stays");
}

/// The same claim rules on the file and etcd datastores: the pools are theirs,
/// the claims are the cluster's (the config's `kubernetes.kubeconfig`).
#[test]
fn the_file_and_etcd_datastores_keep_a_claims_addresses_the_same_way() {
    let cluster = Cluster::prepared().unwrap();
    block_on(async {
        claims::prepare(&cluster, NS).await?;
        for store in ["file", "etcd"] {
            for n in 1..=3 {
                launcher(&cluster, &format!("launcher-{store}-{n}"), &format!("vm-{store}")).await?;
            }
            for plain in ["", "-2", "-3"] {
                pods::create_labelled(&cluster, NS, &format!("plain-{store}{plain}"), &[]).await?;
            }
        }
        anyhow::Ok(())
    })
    .unwrap();
    let objects = Objects::admin_in(&cluster, NS).unwrap();
    let etcd = Etcd::start_plain().unwrap();
    let data = TempDir::new("claims-file");
    let file_conf = json!({"cniVersion": "1.1.0", "name": "blue", "type": "thab", "ipam": {
        "type": "thereabouts", "datastore": "file", "data_dir": data.path(), "ipRanges": [{"range": "192.0.2.0/24"}]}});
    for (store, mut conf) in [("file", file_conf), ("etcd", etcd_conf(etcd.access(), "blue", &["192.0.2.0/24"]))] {
        conf["allowPersistentIPs"] = json!(true);
        conf["ipam"]["kubernetes"] = json!({"kubeconfig": cluster.plugin_kubeconfig()});
        claims::create(&objects, &format!("vm-{store}.blue")).unwrap();
        let launcher = |n: u32| format!("launcher-{store}-{n}");

        let first = add(&conf, &launcher(1), "c1");
        assert_eq!(first, ["192.0.2.1/24"], "{store}");
        assert_eq!(add(&conf, &launcher(2), "c2"), first, "{store}: live migration's target");
        call("DEL", &conf, &launcher(1), "c1").expect_ok("the source's DEL");
        call("DEL", &conf, &launcher(2), "c2").expect_ok("the target's DEL");
        assert_eq!(add(&conf, &format!("plain-{store}"), "c-plain"), ["192.0.2.2/24"], "{store}: the claim's address is still taken");
        assert_eq!(add(&conf, &launcher(3), "c3"), first, "{store}: restarted");
        assert_eq!(claim(&objects, &format!("vm-{store}.blue"))["status"]["ownerPod"]["name"], json!(launcher(3)));
        if store == "file" {
            // No controller serves the file datastore: its GC frees a deleted claim's addresses, and only then.
            let mut gc = conf.clone();
            gc["cni.dev/valid-attachments"] = json!([{"containerID": "c-plain", "ifname": "net1"}]);
            Call::global("GC").run(&thereabouts_bin(), &gc.to_string()).expect_ok("GC while the claim exists");
            assert_eq!(add(&conf, "plain-file-2", "c-plain-2"), ["192.0.2.3/24"], "file: the claim's address kept by GC");
            objects.delete_at(CLAIMS, "ipamclaims", "vm-file.blue").unwrap();
            gc["cni.dev/valid-attachments"] = json!([{"containerID": "c-plain", "ifname": "net1"}, {"containerID": "c-plain-2", "ifname": "net1"}]);
            Call::global("GC").run(&thereabouts_bin(), &gc.to_string()).expect_ok("GC after the claim's deletion");
            assert_eq!(add(&conf, "plain-file-3", "c-plain-3"), first, "file: the deleted claim's address freed by GC");
        }
    }
}

/// A mixed fleet on one pool (the migration window): whereabouts v0.9.4 reads
/// a claim's entry as taken and never hands its address out.
#[test]
fn whereabouts_never_hands_out_a_claims_address() {
    let wb = peers::whereabouts().expect("building whereabouts (tests/k8s-bins/build-peers.sh)");
    let cluster = Cluster::prepared().unwrap();
    let install = block_on(async {
        let install = wb.install(&cluster).await?;
        // thereabouts' CRDs over whereabouts': they declare the claim fields.
        cluster.install_crds().await?;
        claims::prepare(&cluster, NS).await?;
        launcher(&cluster, "launcher-a-1", "vm-a").await?;
        anyhow::Ok(install)
    })
    .unwrap();
    let objects = Objects::admin_in(&cluster, NS).unwrap();
    claims::create(&objects, "vm-a.blue").unwrap();
    let mut conf = kubernetes_conf("blue", &cluster.plugin_kubeconfig(), Some("mixed"), &["192.0.2.0/28"]);
    conf["allowPersistentIPs"] = json!(true);
    assert_eq!(add(&conf, "launcher-a-1", "c1"), ["192.0.2.1/28"]);

    let dir = TempDir::new("claims-wb");
    let wb_conf = peers::whereabouts_conf(dir.path(), &install.kubeconfig, "mixed", &["192.0.2.0/28"]).unwrap().to_string();
    let outcome = Call::pod("ADD", "ctr-wb", "wb-pod").run(&wb.plugin, &wb_conf);
    outcome.expect_ok("whereabouts ADD");
    assert_eq!(outcome.ips(), ["192.0.2.2/28"]);
    let pools = Objects::admin(&cluster).unwrap();
    assert_eq!(pools.allocations("mixed-192.0.2.0-28").unwrap()["1"]["ipamclaimref"], "vms/vm-a.blue", "after whereabouts wrote the pool");
}

/// With node slices: a VM moved to another node keeps its address, which
/// stays in the first node's slice.
#[test]
fn with_node_slices_a_vm_on_another_node_keeps_its_address() {
    let cluster = Cluster::prepared().unwrap();
    let kubeconfig = block_on(async {
        claims::prepare(&cluster, NS).await?;
        for n in 1..=3 {
            launcher(&cluster, &format!("launcher-a-{n}"), "vm-a").await?;
        }
        let kubeconfig = controller::install(&cluster).await?;
        for node in ["node-a", "node-b"] {
            controller::add_node(&cluster, node).await?;
        }
        anyhow::Ok(kubeconfig)
    })
    .unwrap();
    let objects = Objects::admin_in(&cluster, NS).unwrap();
    claims::create(&objects, "vm-a.blue").unwrap();
    let mut conf = kubernetes_conf("blue", &cluster.plugin_kubeconfig(), Some("blue"), &["192.0.2.0/24"]);
    conf["allowPersistentIPs"] = json!(true);
    conf["ipam"]["node_slice_size"] = json!("/28");
    block_on(controller::create_nad(&cluster, "blue", &conf)).unwrap();
    let work = TempDir::new("claims-slices");
    let _controller = Controller::start(&thereabouts_bin(), &kubeconfig, 2, &work.path().join("controller.log")).unwrap();
    let admin = Objects::admin(&cluster).unwrap();
    wait_until("both nodes hold a slice", Duration::from_secs(30), Duration::from_millis(200), || {
        controller::holders_of(&admin.get(controller::NODE_SLICE_POOLS, "blue").unwrap().unwrap_or(Value::Null)).len() == 2
    });
    let on = |command: &str, node: &str, pod: &str, container: &str| {
        let mut call = Call::pod(command, container, pod);
        call.ifname = "net1".into();
        call.cni_args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={pod}");
        Invocation::new(call, conf.to_string()).env("NODENAME", node).run(&thereabouts_bin())
    };

    let first = on("ADD", "node-a", "launcher-a-1", "c1");
    first.expect_ok("ADD on node-a");
    let target = on("ADD", "node-b", "launcher-a-2", "c2");
    target.expect_ok("ADD on node-b, the migration's target");
    assert_eq!(target.ips(), first.ips());
    on("DEL", "node-a", "launcher-a-1", "c1").expect_ok("the source's DEL");
    on("DEL", "node-b", "launcher-a-2", "c2").expect_ok("the target's DEL");
    let restarted = on("ADD", "node-b", "launcher-a-3", "c3");
    restarted.expect_ok("ADD on node-b after a stop");
    assert_eq!(restarted.ips(), first.ips());
}
