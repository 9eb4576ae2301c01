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
/// node → slices held, from the slice objects of layout `layout` among the
/// NodeSlicePools `pools` (name → object).
pub fn object_holders(pools: &BTreeMap<String, Value>, layout: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pool in pools.values().filter(|p| p.pointer("/metadata/labels/thereabouts.io~1slice-of").and_then(Value::as_str) == Some(layout)) {
        for (node, slices) in holders_of(pool) {
            out.entry(node).or_default().extend(slices);
        }
    }
    out
}

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
        // A layout object, and who holds its slices: its list, or its slice objects.
        let layouts: Vec<(&String, &Value)> = listed.iter().filter(|(_, p)| p.pointer("/metadata/labels/thereabouts.io~1slice-of").is_none()).collect();
        let held = |name: &str, p: &Value| match p.pointer("/metadata/annotations/thereabouts.io~1slice-objects") {
            Some(_) => object_holders(&listed, name).len(),
            None => holders_of(p).len(),
        };
        if layouts.len() >= pools.max(1) && layouts.iter().all(|(name, p)| held(name, p) == nodes) {
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
    crate::pod_fleet::create_node(Api::all(cluster.admin_client().await?), name.to_string()).await
}

pub async fn remove_node(cluster: &Cluster, name: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(cluster.admin_client().await?);
    nodes.delete(name, &DeleteParams::default()).await.with_context(|| format!("deleting node {name}"))?;
    Ok(())
}

/// `thereabouts controller` as a child process, killed when dropped.
pub struct Controller {
    child: Child,
    /// Where its `/metrics`, `/healthz` and `/readyz` answer (loopback).
    pub metrics_port: u16,
}

/// How a test runs the controller: short lease, resync and cool-down, so
/// that its passes come within seconds.
#[derive(Debug, Clone)]
pub struct Settings {
    pub cool_down_seconds: u64,
    pub resync_seconds: u64,
    pub reconcile_interval_seconds: u64,
    pub completed_grace_seconds: u64,
    /// `--unbacked-grace-seconds`: short here, the tests' own deletes come
    /// with their entries'.
    pub unbacked_grace_seconds: u64,
    /// `--unreserved-grace-seconds`: how long a ResourceClaim may be seen unreserved.
    pub unreserved_grace_seconds: u64,
    pub lease_seconds: u64,
    pub identity: String,
    /// Network configs of etcd datastores it reconciles too (`--etcd-config`).
    pub etcd_configs: Vec<PathBuf>,
    /// `--slice-objects`.
    pub slice_objects: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            cool_down_seconds: 2,
            resync_seconds: 1,
            reconcile_interval_seconds: 300,
            completed_grace_seconds: 60,
            unbacked_grace_seconds: 2,
            unreserved_grace_seconds: 120,
            lease_seconds: 2,
            identity: "test".into(),
            etcd_configs: Vec::new(),
            slice_objects: false,
        }
    }
}

impl Controller {
    pub fn start(binary: &Path, kubeconfig: &Path, cool_down_seconds: u64, log: &Path) -> Result<Controller> {
        Self::start_with(binary, kubeconfig, cool_down_seconds, 1, log)
    }

    pub fn start_with(binary: &Path, kubeconfig: &Path, cool_down_seconds: u64, resync_seconds: u64, log: &Path) -> Result<Controller> {
        Self::run(binary, kubeconfig, &Settings { cool_down_seconds, resync_seconds, ..Settings::default() }, log)
    }

    pub fn run(binary: &Path, kubeconfig: &Path, settings: &Settings, log: &Path) -> Result<Controller> {
        let log = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut command = Command::new(binary);
        command.arg("controller");
        for config in &settings.etcd_configs {
            command.arg("--etcd-config").arg(config);
        }
        if settings.slice_objects {
            command.arg("--slice-objects");
        }
        let child = command
            .args(["--namespace", NAMESPACE, "--lease-seconds"])
            .arg(settings.lease_seconds.to_string())
            .arg("--resync-seconds")
            .arg(settings.resync_seconds.to_string())
            .arg("--cool-down-seconds")
            .arg(settings.cool_down_seconds.to_string())
            .arg("--reconcile-interval-seconds")
            .arg(settings.reconcile_interval_seconds.to_string())
            .arg("--completed-grace-seconds")
            .arg(settings.completed_grace_seconds.to_string())
            .arg("--unbacked-grace-seconds")
            .arg(settings.unbacked_grace_seconds.to_string())
            .arg("--unreserved-grace-seconds")
            .arg(settings.unreserved_grace_seconds.to_string())
            .arg("--metrics-address")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .arg("--identity")
            .arg(&settings.identity)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} controller", binary.display()))?;
        Ok(Controller { child, metrics_port })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its whole `/metrics` page, as Prometheus would scrape it.
    pub fn scrape(&self) -> Result<String> {
        http_get(self.metrics_port, "/metrics")
    }

    /// One sample of its `/metrics` (`name{labels}` as written), 0 when absent.
    pub fn metric(&self, sample: &str) -> Result<f64> {
        let text = self.scrape()?;
        Ok(text.lines().find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0.0))
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

/// The body of `GET path` on loopback `port` (HTTP/1.1, `Connection: close`).
pub fn http_get(port: u16, path: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
}
