//! The real-node catalogue (tests/README.md, "Real node"): each case an ID,
//! run on one node of real parts with thereabouts installed by its chart.

use std::collections::BTreeSet;
use std::time::Duration;

use thereabouts_node_tests::{Installed, ObjectAction, STICKY_ORDINAL, ip_ranges, network_status, pod_spec};

/// The node shared by this file's cases, with the call recorder beside the
/// plugin (networks made with `nad_recorded` have their calls checked).
fn installed() -> std::sync::Arc<Installed> {
    let installed = Installed::shared();
    installed.install_recorder(std::path::Path::new(env!("CARGO_BIN_EXE_cni_recorder"))).expect("the recorder on the node");
    installed
}

/// The history checker over a recorded network's calls, against its pools now.
fn check_history(installed: &Installed, network: &str, ranges: &[&str]) {
    let calls = installed.check_history(network, ranges).unwrap();
    assert!(calls > 0, "no call of {network} was recorded");
    eprintln!("{network}: the history of {calls} recorded calls checked");
}

/// N01: the chart's installer DaemonSet put the plugin into the node's CNI bin
/// dir, with a flat file naming the Kubernetes datastore, and the controller
/// Deployment's pod holds the Lease (checked by `Installed::start`); the plugin
/// there is the image's.
#[test]
fn n01_the_chart_installs_the_plugin_on_the_node() {
    let installed = Installed::shared();
    let flat: serde_json::Value = serde_json::from_slice(&std::fs::read(installed.flat_file()).unwrap()).unwrap();
    assert_eq!(flat["datastore"], "kubernetes");
    let version = std::process::Command::new(installed.node.cni_bin_dir().join("thereabouts")).arg("--version").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&version.stdout).trim(), format!("thereabouts {}", thereabouts_node_tests::workspace_version()));
}

/// N02: pods with a NAD annotation get one address per range (dual-stack);
/// Multus' network-status lists them; `ip addr` in the pod shows them; a second
/// pod pings the first over the secondary interface, IPv4 and IPv6.
#[test]
fn n02_dual_stack_addresses_reach_the_pod_and_carry_traffic() {
    let installed = Installed::shared();
    installed.nad("n02", "a", &["192.0.2.0/28", "2001:db8:2::/64"]).unwrap();
    installed.create_pod("n02-a", "n02", "ip -o addr show dev net1; sleep 3600").unwrap();
    let a = installed.wait_running("n02-a").unwrap();
    let status = network_status(&a);
    let secondary = status.iter().find(|(name, ..)| name == "default/n02").unwrap_or_else(|| panic!("no n02 in {status:?}"));
    assert_eq!(secondary.1, "net1");
    let ips = &secondary.2;
    assert_eq!(ips.len(), 2, "{ips:?}");
    assert!(ips[0].starts_with("192.0.2.") && ips[1].starts_with("2001:db8:2::"), "{ips:?}");
    installed.wait("n02-a printed its addresses", std::time::Duration::from_secs(30), || Ok(installed.pod_log(&a).is_ok_and(|l| l.contains(&ips[1])))).unwrap();
    let log = installed.pod_log(&a).unwrap();
    for ip in ips {
        assert!(log.contains(&format!("{ip}/")), "ip addr in the pod shows {ip}: {log}");
    }
    // The second pod pings the first; a few tries while IPv6 duplicate address detection runs.
    let script = format!(
        "for i in 1 2 3 4 5 6 7 8 9 10; do ping -c 1 -W 1 {v4} >/dev/null && ping -c 1 -W 1 {v6} >/dev/null && exit 0; sleep 1; done; exit 1",
        v4 = ips[0],
        v6 = ips[1]
    );
    installed.create_pod("n02-b", "n02", &script).unwrap();
    let b = installed.wait_phase("n02-b", &["Succeeded", "Failed"]).unwrap();
    assert_eq!(b.status.and_then(|s| s.phase).as_deref(), Some("Succeeded"), "n02-b could not ping n02-a at {ips:?}");
    let b_ips: BTreeSet<String> = network_status(&installed.get_pod("n02-b").unwrap().unwrap()).into_iter().flat_map(|(_, _, ips)| ips).collect();
    assert!(ips.iter().all(|ip| !b_ips.contains(ip)), "two pods hold one address: {ips:?} {b_ips:?}");
    installed.delete_pod("n02-a").unwrap();
    installed.delete_pod("n02-b").unwrap();
}

/// N03 (Spiderpool P00002): a Deployment scaled 0 → 40 → 0 → 40: no address
/// held twice, every address back in the pools after the scale-down, and the
/// second 40 get the same lowest addresses again.
#[test]
fn n03_a_deployment_scaled_up_down_and_up_again() {
    let installed = installed();
    let ranges = ["192.0.2.64/26", "2001:db8:3::/64"];
    installed.nad_recorded("n03", "b", ip_ranges(&ranges)).unwrap();
    installed.deployment("n03", "n03", 0).unwrap();
    let mut rounds = Vec::new();
    for round in 0..2 {
        installed.scale("n03", 40).unwrap();
        let addresses = installed.wait_addresses("n03-", "default/n03", 40).unwrap();
        let distinct: BTreeSet<&String> = addresses.iter().flatten().collect();
        assert_eq!(distinct.len(), 80, "round {round}: an address held twice: {addresses:?}");
        installed.scale("n03", 0).unwrap();
        installed.wait("the 40 pods are gone", std::time::Duration::from_secs(180), || Ok(installed.pods("n03-")?.is_empty())).unwrap();
        installed
            .wait("every address is back in the pools", std::time::Duration::from_secs(60), || {
                Ok(installed.allocations("192.0.2.64-26")? == 0 && installed.allocations("2001-db8-3---64")? == 0)
            })
            .unwrap();
        check_history(&installed, "n03", &ranges);
        rounds.push(distinct.into_iter().cloned().collect::<BTreeSet<String>>());
    }
    assert_eq!(rounds[0], rounds[1], "the second scale-up got other addresses");
    installed.delete_deployment("n03").unwrap();
}

/// N04: a pod force-deleted while its node's kubelet is stopped: the controller
/// keeps its address while the pod exists (full passes every 5 s), frees it once
/// the pod is gone; the restarted kubelet stops the orphaned sandbox, and that
/// DEL of an address already freed succeeds.
#[test]
fn n04_a_pod_force_deleted_while_the_kubelet_is_down_is_freed_once_gone() {
    let installed = Installed::shared();
    installed.nad("n04", "c", &["192.0.2.128/28"]).unwrap();
    installed.create_pod("n04", "n04", "sleep 3600").unwrap();
    installed.wait_running("n04").unwrap();
    assert_eq!(installed.allocations("192.0.2.128-28").unwrap(), 1);
    installed.node.kill_kubelet();
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(installed.allocations("192.0.2.128-28").unwrap(), 1, "freed while the pod still existed");
    installed.delete_pod("n04").unwrap();
    installed.wait("the controller freed the gone pod's address", Duration::from_secs(60), || Ok(installed.allocations("192.0.2.128-28")? == 0)).unwrap();
    installed.node.start_kubelet().unwrap();
    installed.node.wait_ready().unwrap();
    installed.node.wait_pod_stopped(thereabouts_node_tests::PODS, "n04", Duration::from_secs(120)).unwrap();
    assert_eq!(installed.allocations("192.0.2.128-28").unwrap(), 0);
}

/// N05: the kubelet, then containerd, killed and restarted while 20 pods are
/// being created: every pod runs with its own addresses, the pools hold
/// exactly the 20 pods' entries (nothing leaked by the interrupted calls), and
/// all of them come back after the scale-down.
#[test]
fn n05_kubelet_and_containerd_restarted_while_pods_start() {
    let installed = installed();
    let ranges = ["192.0.2.160/27", "2001:db8:5::/64"];
    installed.nad_recorded("n05", "d", ip_ranges(&ranges)).unwrap();
    installed.deployment("n05", "n05", 0).unwrap();
    installed.scale("n05", 20).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    installed.node.kill_kubelet();
    installed.node.start_kubelet().unwrap();
    std::thread::sleep(Duration::from_secs(4));
    installed.node.kill_containerd();
    installed.node.start_containerd().unwrap();
    let addresses = installed.wait_addresses("n05-", "default/n05", 20).unwrap();
    let distinct: BTreeSet<&String> = addresses.iter().flatten().collect();
    assert_eq!(distinct.len(), 40, "an address held twice: {addresses:?}");
    installed
        .wait("the pools hold exactly the running pods' entries", Duration::from_secs(90), || {
            Ok(installed.allocations("192.0.2.160-27")? == 20 && installed.allocations("2001-db8-5---64")? == 20)
        })
        .unwrap();
    installed.scale("n05", 0).unwrap();
    installed.wait("the pods are gone", Duration::from_secs(180), || Ok(installed.pods("n05-")?.is_empty())).unwrap();
    installed
        .wait("every address is back", Duration::from_secs(90), || {
            Ok(installed.allocations("192.0.2.160-27")? == 0 && installed.allocations("2001-db8-5---64")? == 0)
        })
        .unwrap();
    check_history(&installed, "n05", &ranges);
    installed.delete_deployment("n05").unwrap();
}

/// N09: thereabouts as the IPAM of the node's own network (no Multus): a pod's
/// IP comes from it; containerd's STATUS reaches it through the bridge, so a
/// datastore it cannot reach turns the Node's Ready false with the plugin's
/// message, and true again when the datastore is back.
#[test]
fn n09_the_cluster_network_status_follows_the_datastore() {
    let installed = Installed::shared();
    let node = &installed.node;
    // A kubeconfig of this network's own: the installer's, then one whose server is gone.
    let kubeconfig = node.dir().join("n09.kubeconfig");
    let good = std::fs::read_to_string(node.cni_conf_dir().join("thereabouts.d/thereabouts.kubeconfig")).unwrap();
    std::fs::write(&kubeconfig, &good).unwrap();
    let conflist = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": "n09",
        "plugins": [{
            "type": "bridge", "bridge": node.bridge("e"), "isGateway": false, "ipMasq": false,
            "ipam": {"type": "thereabouts", "configuration_path": installed.flat_file(), "kubernetes": {"kubeconfig": kubeconfig}, "range": "192.0.2.192/28"},
        }],
    });
    node.set_network(Some(&conflist)).unwrap();
    installed.create_pod("n09", "", "sleep 3600").unwrap();
    let pod = installed.wait_running("n09").unwrap();
    assert_eq!(pod.status.and_then(|s| s.pod_ip).as_deref(), Some("192.0.2.193"));

    let server = good.lines().find(|l| l.contains("server:")).unwrap().to_string();
    std::fs::write(&kubeconfig, good.replace(&server, "      server: \"https://127.0.0.1:9\"")).unwrap();
    let mut message = String::new();
    installed
        .wait("the Node is NotReady for the network", Duration::from_secs(90), || {
            let ready = node.ready_condition()?;
            message = ready.1;
            Ok(!ready.0)
        })
        .unwrap();
    assert!(message.contains("NetworkPluginNotReady") && message.contains("127.0.0.1:9"), "{message}");
    std::fs::write(&kubeconfig, &good).unwrap();
    installed.wait("the Node is Ready again", Duration::from_secs(90), || Ok(node.ready_condition()?.0)).unwrap();
    installed.delete_pod("n09").unwrap();
    node.wait_pod_stopped(thereabouts_node_tests::PODS, "n09", Duration::from_secs(60)).unwrap();
    assert_eq!(installed.allocations("192.0.2.192-28").unwrap(), 0);
    node.set_network(None).unwrap();
}

/// N10: CNI GC from libcni (`cnitool gc`; no runtime sends GC) to a network whose
/// plugin is thereabouts itself: cnitool's GC names no valid attachment, so
/// both attachments cnitool added are freed.
#[test]
fn n10_gc_from_libcni_frees_what_it_does_not_name() {
    let installed = Installed::shared();
    let node = &installed.node;
    let netconf = node.dir().join("n10-netconf");
    std::fs::create_dir_all(&netconf).unwrap();
    let conflist = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": "n10",
        "plugins": [{"type": "thereabouts", "ipam": {"type": "thereabouts", "configuration_path": installed.flat_file(), "range": "192.0.2.208/28"}}],
    });
    std::fs::write(netconf.join("n10.conflist"), conflist.to_string()).unwrap();
    let cnitool = |verb: &str, ifname: &str| {
        let out = std::process::Command::new(&node.binaries().cnitool)
            .args([verb, "n10", "/proc/self/ns/net"])
            .env("NETCONFPATH", &netconf)
            .env("CNI_PATH", node.cni_bin_dir())
            .env("CNI_IFNAME", ifname)
            .env("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=n10")
            .output()
            .unwrap();
        assert!(out.status.success(), "cnitool {verb}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    };
    cnitool("add", "eth0");
    cnitool("add", "net1");
    assert_eq!(installed.allocations("192.0.2.208-28").unwrap(), 2);
    cnitool("gc", "eth0");
    assert_eq!(installed.allocations("192.0.2.208-28").unwrap(), 0);
}

/// N08: node slices keyed by the real Node's name: the controller gives the
/// Node `thab-node` a slice of the NAD's range, and the pod's address comes from
/// that slice; the plugin knows its node from the installer's `nodename` file
/// (the host's own name is another).
#[test]
fn n08_node_slices_follow_the_real_node_name() {
    let installed = Installed::shared();
    assert_eq!(std::fs::read_to_string(installed.node.cni_conf_dir().join("thereabouts.d/nodename")).unwrap().trim(), installed.node.name());
    installed.nad_with("n08", "f", serde_json::json!({"range": "203.0.113.0/24", "node_slice_size": "/28"})).unwrap();
    let mut slice = None;
    installed
        .wait("the controller gave the node a slice", Duration::from_secs(60), || {
            let pool = installed.pool_object("NodeSlicePool", "n08")?;
            slice = pool.and_then(|p| {
                p["status"]["allocations"]
                    .as_array()?
                    .iter()
                    .find(|a| a["nodeName"] == installed.node.name())
                    .and_then(|a| a["sliceRange"].as_str().map(str::to_string))
            });
            Ok(slice.is_some())
        })
        .unwrap();
    let slice = slice.unwrap();
    installed.create_pod("n08", "n08", "sleep 3600").unwrap();
    let pod = installed.wait_running("n08").unwrap();
    let ips: Vec<String> = network_status(&pod).into_iter().find(|(n, ..)| n == "default/n08").map(|(_, _, ips)| ips).unwrap();
    let (net, len) = slice.split_once('/').unwrap();
    let base: std::net::Ipv4Addr = net.parse().unwrap();
    let ip: std::net::Ipv4Addr = ips[0].parse().unwrap();
    let size = 1u32 << (32 - len.parse::<u32>().unwrap());
    assert!((u32::from(base)..u32::from(base) + size).contains(&u32::from(ip)), "{ip} is outside the node's slice {slice}");
    installed.delete_pod("n08").unwrap();
}

/// N06: without Multus the kubelet sends each pod's DEL three times: on stop
/// (netns and prevResult), then on its garbage collection's stop and remove
/// (empty CNI_NETNS, no prevResult). Every one must succeed, or the sandbox is
/// never removed: the sandbox is gone from containerd and the pool empty.
#[test]
fn n06_the_repeated_dels_of_a_pod_all_succeed() {
    let installed = Installed::shared();
    let node = &installed.node;
    let conflist = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": "n06",
        "plugins": [{
            "type": "bridge", "bridge": node.bridge("g"), "isGateway": false, "ipMasq": false,
            "ipam": {"type": "thereabouts", "configuration_path": installed.flat_file(), "range": "192.0.2.224/28"},
        }],
    });
    node.set_network(Some(&conflist)).unwrap();
    installed.create_pod("n06", "", "sleep 3600").unwrap();
    installed.wait_running("n06").unwrap();
    assert_eq!(installed.allocations("192.0.2.224-28").unwrap(), 1);
    let sandbox = node.pod_sandboxes(thereabouts_node_tests::PODS, "n06").unwrap();
    assert_eq!(sandbox.len(), 1);
    installed.delete_pod("n06").unwrap();
    // The kubelet's container garbage collection runs every minute.
    installed.wait("the sandbox is removed", Duration::from_secs(180), || Ok(node.pod_sandboxes(thereabouts_node_tests::PODS, "n06")?.is_empty())).unwrap();
    assert_eq!(installed.allocations("192.0.2.224-28").unwrap(), 0);
    node.set_network(None).unwrap();
}

/// N07: a StatefulSet whose network runs the sticky-ordinal policy the chart
/// shipped in its policies ConfigMap (compiled on the node by the installer
/// pod): `n07-K` gets first + 10 + K in each range where the built-in choice
/// would give the lowest free, and a deleted pod comes back, as a new pod, with
/// the same addresses.
#[test]
fn n07_a_statefulset_pod_comes_back_with_its_addresses() {
    let installed = installed();
    let policy = serde_json::json!({"name": "sticky", "path": installed.policy_path(STICKY_ORDINAL), "settings": {"base": 10, "statefulsets": ["n07"]}});
    let ranges = ["192.0.2.32/27", "2001:db8:7::/64"];
    let mut ipam = ip_ranges(&ranges);
    ipam["policies"] = serde_json::json!([policy]);
    installed.nad_recorded("n07", "h", ipam).unwrap();
    installed.statefulset("n07", "n07", 3).unwrap();
    installed.wait_addresses("n07-", "default/n07", 3).unwrap();
    let by_pod = |name: &str| {
        let pod = installed.get_pod(name).unwrap().unwrap();
        let ips = network_status(&pod).into_iter().find(|(n, ..)| n == "default/n07").map(|(_, _, ips)| ips).unwrap_or_default();
        (pod.metadata.uid.unwrap_or_default(), ips)
    };
    for k in 0..3u8 {
        let expected = vec![format!("192.0.2.{}", 33 + 10 + k), format!("2001:db8:7::{:x}", 1 + 10 + k)];
        assert_eq!(by_pod(&format!("n07-{k}")).1, expected, "n07-{k}: first + base + ordinal");
    }
    let (uid, ips) = by_pod("n07-1");
    installed.delete_pod("n07-1").unwrap();
    installed
        .wait("n07-1 is back as a new pod", Duration::from_secs(180), || {
            let pod = installed.get_pod("n07-1")?;
            Ok(pod.is_some_and(|p| p.metadata.uid.as_deref() != Some(uid.as_str()) && p.status.and_then(|s| s.phase).as_deref() == Some("Running")))
        })
        .unwrap();
    assert_eq!(by_pod("n07-1").1, ips, "the re-created pod's addresses");
    // The old pod's entry freed by its DEL, the new pod's made: three again.
    installed.wait("the pool holds the three pods' entries", Duration::from_secs(60), || Ok(installed.allocations("192.0.2.32-27")? == 3)).unwrap();
    installed.delete_statefulset("n07").unwrap();
    installed.wait("every address is back", Duration::from_secs(90), || Ok(installed.allocations("192.0.2.32-27")? == 0)).unwrap();
    check_history(&installed, "n07", &ranges);
}

/// N12: a VM-like workload (KubeVirt's launcher pods, docs/claims.md): a pod
/// whose network-selection element names an IPAMClaim, on a network with
/// `allowPersistentIPs`, through the real Multus (which passes nothing of the
/// claim on: the plugin reads the pod). Deleted and re-created as a new pod, it
/// gets the same addresses; the old pod's DEL and the controller's passes keep
/// them; the claim's status shows them and its owner; deleting the claim (the
/// VM deleted) frees them.
#[test]
fn n12_a_vms_launcher_pod_recreated_keeps_its_addresses() {
    let installed = Installed::shared();
    let ipam = serde_json::json!({"type": "thereabouts", "configuration_path": installed.flat_file(), "ipRanges": [{"range": "192.0.2.176/28"}, {"range": "2001:db8:12::/64"}]});
    let mut config = installed.bridge_config("n12", "l", ipam);
    // Where KubeVirt's ipam-extensions reads it (the top), and where libcni hands it to the plugin (its entry).
    config["allowPersistentIPs"] = serde_json::json!(true);
    config["plugins"][0]["allowPersistentIPs"] = serde_json::json!(true);
    installed.nad_config("n12", config).unwrap();
    let claim = |action| installed.object("k8s.cni.cncf.io", "v1alpha1", "IPAMClaim", action).unwrap();
    claim(ObjectAction::Create(serde_json::json!({"apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim",
        "metadata": {"name": "vm12.n12", "namespace": "default"}, "spec": {"network": "n12", "interface": ""}})));
    // The launcher pod as ipam-extensions mutates it.
    let launcher = |name: &str| {
        let networks = serde_json::json!([{"name": "n12", "namespace": "default", "ipam-claim-reference": "vm12.n12"}]).to_string();
        installed.create_pod_value(pod_spec(name, &networks, "sleep 3600")).unwrap();
        let pod = installed.wait_running(name).unwrap();
        network_status(&pod).into_iter().find(|(n, ..)| n == "default/n12").map(|(_, _, ips)| ips).unwrap_or_default()
    };
    let first = launcher("n12-launcher-a");
    assert!(first.len() == 2 && first[0].starts_with("192.0.2.1") && first[1].starts_with("2001:db8:12::"), "{first:?}");
    let status = claim(ObjectAction::Get("vm12.n12")).unwrap()["status"].clone();
    let bare: Vec<String> = status["ips"].as_array().into_iter().flatten().filter_map(|ip| ip.as_str()?.split('/').next().map(str::to_string)).collect();
    assert_eq!((bare, &status["ownerPod"]["name"]), (first.clone(), &serde_json::json!("n12-launcher-a")));

    // The VM restarts: its launcher pod is deleted (its DEL runs) and a new one made.
    installed.delete_pod("n12-launcher-a").unwrap();
    installed.wait("n12-launcher-a is gone", Duration::from_secs(120), || Ok(installed.get_pod("n12-launcher-a")?.is_none())).unwrap();
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(installed.allocations("192.0.2.176-28").unwrap(), 1, "the DEL and two controller passes keep the claim's address");
    assert_eq!(launcher("n12-launcher-b"), first, "the new launcher pod's addresses");
    assert_eq!(claim(ObjectAction::Get("vm12.n12")).unwrap()["status"]["ownerPod"]["name"], "n12-launcher-b");

    // The VM is deleted: its pod, then its claim; the controller frees the addresses.
    installed.delete_pod("n12-launcher-b").unwrap();
    installed.wait("n12-launcher-b is gone", Duration::from_secs(120), || Ok(installed.get_pod("n12-launcher-b")?.is_none())).unwrap();
    claim(ObjectAction::Delete("vm12.n12"));
    installed.wait("the deleted claim's addresses are freed", Duration::from_secs(60), || Ok(installed.allocations("192.0.2.176-28")? == 0)).unwrap();
}
