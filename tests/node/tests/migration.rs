//! N11: the migration the README describes, on a real node. whereabouts v0.9.4
//! (its binaries built from its Go module, in an image of its own Dockerfile's
//! layout) is installed from its own manifests and serves running pods; then
//! thereabouts' chart is installed with `installer.installAsWhereabouts`. The
//! running pods keep their addresses, new pods get the next free ones,
//! whereabouts' controllers are removed, the pods' DELs (now thereabouts')
//! free what whereabouts allocated, and `thereabouts pools --check` is clean.
//!
//! whereabouts' manifests are applied as they are but for what this node
//! needs, as an operator with non-default node directories does: the image
//! (a local one, never pulled), the node's CNI directories (mounted under
//! /host at the same path, so the files its installer writes name the right
//! host paths), the apiserver's loopback address (this node has no kube-proxy),
//! and host networking for its reconciler (a pod network has no route to the
//! apiserver here).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};
use thereabouts_e2e::workspace_root;
use thereabouts_k8s_harness::{NAMESPACE, apply_yaml, block_on, split_yaml};
use thereabouts_node_tests::{Installed, network_status};

const WHEREABOUTS_IMAGE: &str = "localhost/whereabouts:v0.9.4";
/// The commands whereabouts' scripts run (busybox applets).
const APPLETS: [&str; 16] = ["sh", "cat", "cp", "mkdir", "touch", "chmod", "sed", "md5sum", "awk", "base64", "tr", "date", "sleep", "printf", "echo", "ls"];
const NETWORK: &str = "default/mig";

#[test]
fn n11_whereabouts_replaced_in_place_under_running_pods() {
    let installed = Installed::bare().unwrap();
    let peer = PathBuf::from(std::env::var_os("THEREABOUTS_WHEREABOUTS_DIR").expect("THEREABOUTS_WHEREABOUTS_DIR (tests/node.sh sets it)"));
    import_whereabouts_image(&installed, &peer);
    install_whereabouts(&installed, &peer);
    let flat_file = installed.node.cni_conf_dir().join("whereabouts.d/whereabouts.conf");
    installed
        .wait("whereabouts' installer put its plugin and flat file on the node", Duration::from_secs(120), || {
            Ok(installed.node.cni_bin_dir().join("whereabouts").is_file() && flat_file.is_file())
        })
        .unwrap();
    // A network config as whereabouts users write it; it stays unchanged throughout.
    let ipam = json!({"type": "whereabouts", "configuration_path": flat_file, "ipRanges": [{"range": "192.0.2.0/27"}, {"range": "2001:db8:11::/64"}]});
    installed.nad_raw("mig", "m", ipam.clone()).unwrap();
    installed.deployment("mig", "mig", 4).unwrap();
    let before = addresses_by_pod(&installed, 4);
    let v4: Vec<&str> = before.values().map(|ips| ips[0].as_str()).collect();
    assert_eq!(sorted(v4), ["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"], "whereabouts' lowest free");

    // whereabouts' CRDs become the chart's (README, "Migrating"): same objects,
    // cheaper writes; without --force-conflicts helm stops at their field owner.
    installed.install(&["--set", "installer.installAsWhereabouts=true", "--force-conflicts"]).unwrap();
    let crd = block_on(async {
        let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(installed.client().await?);
        anyhow::Ok(serde_json::to_string(&crds.get("ippools.whereabouts.cni.cncf.io").await?)?)
    })
    .unwrap();
    assert!(crd.contains(r#""x-kubernetes-map-type":"atomic""#), "the chart's IPPool CRD is installed: {crd}");
    installed
        .wait("the installer replaced whereabouts' binary", Duration::from_secs(60), || {
            Ok(version(&installed.node.cni_bin_dir().join("whereabouts")).starts_with("thereabouts "))
        })
        .unwrap();
    installed.scale("mig", 8).unwrap();
    let after = addresses_by_pod(&installed, 8);
    for (pod, ips) in &before {
        assert_eq!(after.get(pod), Some(ips), "{pod} kept its addresses");
    }
    let new: Vec<&str> = after.iter().filter(|(pod, _)| !before.contains_key(*pod)).map(|(_, ips)| ips[0].as_str()).collect();
    assert_eq!(sorted(new), ["192.0.2.5", "192.0.2.6", "192.0.2.7", "192.0.2.8"], "the next free addresses");

    // whereabouts' controllers go (README step 4); its CRDs and pools stay.
    block_on(async {
        let client = installed.client().await?;
        let daemonsets: kube::Api<k8s_openapi::api::apps::v1::DaemonSet> = kube::Api::namespaced(client.clone(), NAMESPACE);
        daemonsets.delete("whereabouts", &Default::default()).await?;
        let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> = kube::Api::namespaced(client, NAMESPACE);
        deployments.delete("whereabouts-reconciler", &Default::default()).await?;
        anyhow::Ok(())
    })
    .unwrap();
    // Scaled down to 2: thereabouts' DELs free entries either plugin made.
    installed.scale("mig", 2).unwrap();
    installed.wait("6 pods are gone", Duration::from_secs(180), || Ok(installed.pods("mig-")?.len() == 2)).unwrap();
    installed
        .wait("the pools hold the 2 pods' entries", Duration::from_secs(90), || {
            Ok(installed.allocations("192.0.2.0-27")? == 2 && installed.allocations("2001-db8-11---64")? == 2)
        })
        .unwrap();
    let conf = installed.node.dir().join("mig.conf");
    std::fs::write(&conf, json!({"cniVersion": "1.1.0", "name": "mig", "type": "bridge", "ipam": ipam}).to_string()).unwrap();
    let check = Command::new(installed.node.cni_bin_dir().join("whereabouts")).args(["pools", "--check", "--config"]).arg(&conf).output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    assert!(check.status.success(), "thereabouts pools --check: {report}");
    installed.delete_deployment("mig").unwrap();
}

/// Running pods of the Deployment `mig` by name, with their addresses on the
/// network, once `count` of them run.
fn addresses_by_pod(installed: &Installed, count: usize) -> BTreeMap<String, Vec<String>> {
    installed.wait_addresses("mig-", NETWORK, count).unwrap();
    let pods = installed.pods("mig-").unwrap();
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let ips = network_status(p).into_iter().find(|(n, ..)| n == NETWORK)?.2;
            Some((p.metadata.name.clone()?, ips))
        })
        .collect()
}

fn sorted(mut v: Vec<&str>) -> Vec<&str> {
    v.sort_by_key(|ip| ip.parse::<std::net::IpAddr>().ok());
    v
}

fn version(binary: &Path) -> String {
    Command::new(binary).arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
}

/// whereabouts' image as its Dockerfile lays it out (binaries and scripts at
/// /), on busybox instead of alpine, imported into the node's containerd.
fn import_whereabouts_image(installed: &Installed, peer: &Path) {
    let layout = installed.node.dir().join("images/whereabouts");
    let mut specs: Vec<String> = ["whereabouts", "ip-control-loop", "ip-reconciler", "node-slice-controller"]
        .iter()
        .map(|b| format!("{b}={}", peer.join(b).display()))
        .chain(["install-cni.sh", "lib.sh", "token-watcher.sh"].iter().map(|s| format!("{s}={}", peer.join("script").join(s).display())))
        .collect();
    specs.push("bin/busybox=/bin/busybox".to_string());
    specs.extend(APPLETS.iter().map(|a| format!("bin/{a}@busybox")));
    specs.push("CMD:/install-cni.sh".to_string());
    let out = Command::new("python3")
        .arg(workspace_root().join("scripts/oci-image.py"))
        .arg("small")
        .arg(&layout)
        .arg(WHEREABOUTS_IMAGE)
        .args(&specs)
        .output()
        .unwrap();
    assert!(out.status.success(), "oci-image.py small: {}", String::from_utf8_lossy(&out.stderr));
    installed.node.import_oci_layout(&layout).unwrap();
}

/// whereabouts' CRDs, its DaemonSet (installer + ip-control-loop) and its
/// reconciler Deployment, from its own doc/crds, adapted as the module doc says.
fn install_whereabouts(installed: &Installed, peer: &Path) {
    let manifests = peer.join("manifests");
    let port = installed.cluster().server_url().rsplit(':').next().unwrap_or_default().to_string();
    let host_dir = |p: PathBuf| format!("/host{}", p.display());
    let mut documents = Vec::new();
    for file in [
        "whereabouts.cni.cncf.io_ippools.yaml",
        "whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml",
        "whereabouts.cni.cncf.io_nodeslicepools.yaml",
        "daemonset-install.yaml",
        "reconciler-deployment.yaml",
    ] {
        documents.extend(split_yaml(&std::fs::read_to_string(manifests.join(file)).unwrap()).unwrap());
    }
    for doc in &mut documents {
        let daemonset = doc["kind"] == "DaemonSet";
        if !daemonset && doc["kind"] != "Deployment" {
            continue;
        }
        let spec = &mut doc["spec"]["template"]["spec"];
        spec["hostNetwork"] = json!(true);
        // `defaultMode: 0744` is octal to kubectl (YAML 1.1); our YAML reader keeps it a string.
        for volume in spec["volumes"].as_array_mut().into_iter().flatten() {
            if let Some(mode) = volume["configMap"]["defaultMode"].as_str().and_then(|m| u32::from_str_radix(m, 8).ok()) {
                volume["configMap"]["defaultMode"] = json!(mode);
            }
        }
        let container = &mut spec["containers"][0];
        container["image"] = json!(WHEREABOUTS_IMAGE);
        container["imagePullPolicy"] = json!("Never");
        let env = container["env"].as_array_mut().unwrap();
        env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}));
        env.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": port}));
        if daemonset {
            let (bin, conf) = (installed.node.cni_bin_dir(), installed.node.cni_conf_dir());
            env.push(json!({"name": "CNI_BIN_DIR", "value": format!("{}/", host_dir(bin.clone()))}));
            env.push(json!({"name": "CNI_CONF_DIR", "value": host_dir(conf.clone())}));
            let container = &mut doc["spec"]["template"]["spec"]["containers"][0];
            container["volumeMounts"] =
                json!([{"name": "cnibin", "mountPath": host_dir(bin.clone())}, {"name": "cni-net-dir", "mountPath": host_dir(conf.clone())}]);
            doc["spec"]["template"]["spec"]["volumes"] = json!([
                {"name": "cnibin", "hostPath": {"path": bin}},
                {"name": "cni-net-dir", "hostPath": {"path": conf}},
            ]);
        }
    }
    block_on(async {
        let client = installed.client().await?;
        for doc in &documents {
            apply_yaml(&client, &Value::to_string(doc), NAMESPACE).await?;
        }
        anyhow::Ok(())
    })
    .unwrap();
}
