//! The `thereabouts controller` on a harness [`Cluster`], for the node-slice
//! tests: the NetworkAttachmentDefinition CRD (multus' kind, which a cluster
//! has from multus; here a minimal definition of it), simulated nodes (Node
//! objects with no kubelet behind them), the controller's own identity from
//! `deploy/controller.yaml`, and the controller as a child process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::plugin::{Objects, kubeconfig_variant};
use crate::{Cluster, NAMESPACE, deploy_dir};

/// The NetworkAttachmentDefinition kind as multus defines it (its config a string).
const NAD_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: network-attachment-definitions.k8s.cni.cncf.io
spec:
  group: k8s.cni.cncf.io
  scope: Namespaced
  names:
    plural: network-attachment-definitions
    singular: network-attachment-definition
    kind: NetworkAttachmentDefinition
    shortNames: [net-attach-def]
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                config:
                  type: string
"#;

/// Installs the NAD CRD and `deploy/controller.yaml` (its RBAC, and a Deployment
/// no kube-controller-manager runs here), and writes a kubeconfig with a token of
/// the controller's ServiceAccount.
pub async fn install(cluster: &Cluster) -> Result<PathBuf> {
    install_nad_crd(cluster).await?;
    cluster.apply_path(&deploy_dir().join("controller.yaml")).await.context("applying deploy/controller.yaml")?;
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.admin_client().await?, NAMESPACE);
    let request = TokenRequest { spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }), ..Default::default() };
    let minted = accounts.create_token_request("thereabouts-controller", &PostParams::default(), &request).await.context("TokenRequest for the controller")?;
    let token = minted.status.and_then(|s| s.token).filter(|t| !t.is_empty()).context("TokenRequest answered without a token")?;
    let kubeconfig = cluster.dir().join("controller.kubeconfig");
    kubeconfig_variant(&cluster.plugin_kubeconfig(), &kubeconfig, |doc| {
        doc["users"] = json!([{"name": "controller", "user": {"token": token}}]);
        doc["contexts"][0]["context"]["user"] = json!("controller");
    })?;
    Ok(kubeconfig)
}

/// The NetworkAttachmentDefinition CRD, as multus would install it.
pub async fn install_nad_crd(cluster: &Cluster) -> Result<()> {
    cluster.apply_yaml(NAD_CRD).await.context("installing the NetworkAttachmentDefinition CRD").map(|_| ())
}

/// A NAD named `name` in `default` whose config is `config`.
pub async fn create_nad(cluster: &Cluster, name: &str, config: &Value) -> Result<()> {
    let object = json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": "default"}, "spec": {"config": config.to_string()},
    });
    cluster.apply_yaml(&serde_yaml_ng::to_string(&object)?).await.map(|_| ())
}

pub const NODE_SLICE_POOLS: &str = "nodeslicepools";

/// node → the slices it holds, in the pool's order, of a `NodeSlicePool` object.
pub fn holders_of(pool: &Value) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in pool.pointer("/status/allocations").and_then(Value::as_array).into_iter().flatten() {
        let node = a["nodeName"].as_str().unwrap_or_default();
        if !node.is_empty() {
            out.entry(node.to_string()).or_default().push(a["sliceRange"].as_str().unwrap_or_default().to_string());
        }
    }
    out
}

/// Waits until at least `pools` NodeSlicePools exist and each gives a slice to
/// `nodes` nodes.
pub fn wait_for_layout(objects: &Objects, pools: usize, nodes: usize, limit: Duration) -> Result<()> {
    let end = Instant::now() + limit;
    loop {
        let listed = objects.list(NODE_SLICE_POOLS)?;
        if listed.len() >= pools.max(1) && listed.values().all(|p| holders_of(p).len() == nodes) {
            return Ok(());
        }
        if Instant::now() > end {
            bail!("after {limit:?}, not every one of {pools} NodeSlicePool(s) gave a slice to {nodes} nodes: {listed:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A Node object with no kubelet behind it.
pub async fn add_node(cluster: &Cluster, name: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(cluster.admin_client().await?);
    let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))?;
    nodes.create(&PostParams::default(), &node).await.with_context(|| format!("creating node {name}"))?;
    Ok(())
}

pub async fn remove_node(cluster: &Cluster, name: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(cluster.admin_client().await?);
    nodes.delete(name, &DeleteParams::default()).await.with_context(|| format!("deleting node {name}"))?;
    Ok(())
}

/// `thereabouts controller` as a child process, killed when dropped.
pub struct Controller {
    child: Child,
}

impl Controller {
    /// Short lease, resync and `cool_down_seconds`, so tests see its passes within seconds.
    pub fn start(binary: &Path, kubeconfig: &Path, cool_down_seconds: u64, log: &Path) -> Result<Controller> {
        Self::start_with(binary, kubeconfig, cool_down_seconds, 1, log)
    }

    pub fn start_with(binary: &Path, kubeconfig: &Path, cool_down_seconds: u64, resync_seconds: u64, log: &Path) -> Result<Controller> {
        let log = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(binary)
            .args(["controller", "--namespace", NAMESPACE, "--lease-seconds", "2"])
            .arg("--resync-seconds")
            .arg(resync_seconds.to_string())
            .arg("--cool-down-seconds")
            .arg(cool_down_seconds.to_string())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} controller", binary.display()))?;
        Ok(Controller { child })
    }

    /// SIGKILL: no release of the Lease, nothing finished.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
}
