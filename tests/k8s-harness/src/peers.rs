//! The real peers of the side-by-side comparison (issue 12), built by
//! `tests/k8s-bins/build-peers.sh` from their Go modules and cached by version:
//!
//! * [`whereabouts`]: whereabouts' CNI plugin, its controllers and its own
//!   manifests (`doc/crds/` of the same module), with [`Whereabouts::install`]
//!   putting its CRDs and RBAC into a [`Cluster`] and writing a kubeconfig for its
//!   ServiceAccount;
//! * [`toxiproxy_server`]: the TCP proxy behind [`crate::LatencyProxy`].
//!
//! `THEREABOUTS_WHEREABOUTS_DIR` / `THEREABOUTS_TOXIPROXY_DIR` (a directory laid out
//! as build-peers.sh writes it) win; otherwise build-peers.sh runs once per test
//! process and peer: it prints the cached directory at once, or builds it first
//! (minutes on a cold machine).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use serde_json::{Value, json};

use crate::plugin::{GROUP_VERSION, IPPOOLS, kubeconfig_variant};
use crate::{Cluster, NAMESPACE, client_from_kubeconfig, get_text};

/// The ServiceAccount of whereabouts' `daemonset-install.yaml` (`namespace`, `name`),
/// which its ClusterRoleBinding grants the ClusterRole `whereabouts-cni`.
pub const WHEREABOUTS_SERVICE_ACCOUNT: (&str, &str) = ("kube-system", "whereabouts");

/// The manifest of whereabouts' release that holds its ServiceAccount, ClusterRole
/// and ClusterRoleBinding (besides a ConfigMap and the DaemonSet).
const RBAC_MANIFEST: &str = "daemonset-install.yaml";
/// The kinds [`Whereabouts::install`] takes from [`RBAC_MANIFEST`]; the DaemonSet
/// and its ConfigMap are for a real node, where a kubelet would run them.
const RBAC_KINDS: [&str; 3] = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"];
/// Lifetime asked for the ServiceAccount token: longer than any test or benchmark.
const TOKEN_SECONDS: i64 = 24 * 3600;
/// How long RBAC may take to reach the authorizer's caches.
const RBAC_TIMEOUT: Duration = Duration::from_secs(30);

/// The cached build of one whereabouts version.
#[derive(Clone, Debug)]
pub struct Whereabouts {
    /// The CNI plugin (`cmd/`).
    pub plugin: PathBuf,
    /// The pod controller (`cmd/controlloop`).
    pub ip_control_loop: PathBuf,
    /// The cron reconciler (`cmd/reconciler`).
    pub ip_reconciler: PathBuf,
    /// The node-slice controller (`cmd/nodeslicecontroller`).
    pub node_slice_controller: PathBuf,
    /// `doc/crds/` of the module: its CRDs, RBAC and Deployments.
    pub manifests: PathBuf,
}

/// What [`Whereabouts::install`] set up.
#[derive(Clone, Debug)]
pub struct WhereaboutsInstall {
    /// Flat kubeconfig of [`WHEREABOUTS_SERVICE_ACCOUNT`] (a bound token of the
    /// ServiceAccount, context namespace `kube-system`), as its installer writes one.
    pub kubeconfig: PathBuf,
}

impl Whereabouts {
    fn in_dir(dir: &Path) -> Result<Self> {
        let w = Whereabouts {
            plugin: dir.join("whereabouts"),
            ip_control_loop: dir.join("ip-control-loop"),
            ip_reconciler: dir.join("ip-reconciler"),
            node_slice_controller: dir.join("node-slice-controller"),
            manifests: dir.join("manifests"),
        };
        for p in [&w.plugin, &w.ip_control_loop, &w.ip_reconciler, &w.node_slice_controller] {
            if !p.is_file() {
                bail!("{} is missing", p.display());
            }
        }
        if !w.manifests.join(RBAC_MANIFEST).is_file() {
            bail!("{} is missing", w.manifests.join(RBAC_MANIFEST).display());
        }
        Ok(w)
    }

    /// whereabouts' own CRD manifests (`whereabouts.cni.cncf.io_*.yaml`), sorted.
    pub fn crd_files(&self) -> Result<Vec<PathBuf>> {
        let mut files = Vec::new();
        for e in std::fs::read_dir(&self.manifests).with_context(|| format!("reading {}", self.manifests.display()))? {
            let p = e?.path();
            if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("whereabouts.cni.cncf.io_") && n.ends_with(".yaml")) {
                files.push(p);
            }
        }
        files.sort();
        if files.is_empty() {
            bail!("no whereabouts.cni.cncf.io_*.yaml in {}", self.manifests.display());
        }
        Ok(files)
    }

    /// Installs whereabouts' own CRDs (replacing whatever defined the same kinds) and
    /// the ServiceAccount, ClusterRole and ClusterRoleBinding of its release manifest;
    /// mints a token for the ServiceAccount (TokenRequest, as a kubelet would) and
    /// writes its kubeconfig into the cluster's directory. Returns once that identity
    /// may list IPPools in [`NAMESPACE`].
    pub async fn install(&self, cluster: &Cluster) -> Result<WhereaboutsInstall> {
        for f in self.crd_files()? {
            cluster.apply_path(&f).await?;
        }
        let rbac_path = self.manifests.join(RBAC_MANIFEST);
        let text = std::fs::read_to_string(&rbac_path).with_context(|| format!("reading {}", rbac_path.display()))?;
        let docs: Vec<Value> = crate::split_yaml(&text)?.into_iter().filter(|d| d["kind"].as_str().is_some_and(|k| RBAC_KINDS.contains(&k))).collect();
        if docs.len() != RBAC_KINDS.len() {
            bail!("{} holds {} of the {} objects {RBAC_KINDS:?}", rbac_path.display(), docs.len(), RBAC_KINDS.len());
        }
        let stream = docs.iter().map(serde_yaml_ng::to_string).collect::<Result<Vec<_>, _>>()?.join("---\n");
        cluster.apply_yaml(&stream).await.with_context(|| format!("applying the RBAC of {}", rbac_path.display()))?;

        let (sa_ns, sa_name) = WHEREABOUTS_SERVICE_ACCOUNT;
        let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(cluster.admin_client().await?, sa_ns);
        let request = TokenRequest { spec: Some(TokenRequestSpec { expiration_seconds: Some(TOKEN_SECONDS), ..Default::default() }), ..Default::default() };
        let minted = accounts.create_token_request(sa_name, &Default::default(), &request).await.context("TokenRequest for the whereabouts ServiceAccount")?;
        let token = minted.status.and_then(|s| s.token).filter(|t| !t.is_empty()).context("TokenRequest answered without a token")?;

        let kubeconfig = cluster.dir().join("whereabouts.kubeconfig");
        kubeconfig_variant(&cluster.plugin_kubeconfig(), &kubeconfig, |doc| {
            doc["users"] = json!([{"name": "whereabouts", "user": {"token": token}}]);
            doc["contexts"][0]["name"] = json!("whereabouts");
            doc["contexts"][0]["context"]["user"] = json!("whereabouts");
            doc["current-context"] = json!("whereabouts");
        })?;
        wait_allowed(&kubeconfig).await?;
        Ok(WhereaboutsInstall { kubeconfig })
    }
}

/// A network config for whereabouts on the Kubernetes datastore, allocating one
/// address from each of `ranges` with overlapping-range reservations on (its
/// default). whereabouts refuses to run without a flat file, so an empty one
/// (but for the datastore) is written into `dir` and named by
/// `configuration_path`; everything else is inline.
pub fn whereabouts_conf(dir: &Path, kubeconfig: &Path, network_name: &str, ranges: &[&str]) -> Result<Value> {
    let flat = dir.join("whereabouts.conf");
    std::fs::write(&flat, json!({"datastore": "kubernetes"}).to_string()).with_context(|| format!("writing {}", flat.display()))?;
    Ok(json!({
        "cniVersion": "1.0.0",
        "name": "peers",
        "type": "thab-peers",
        "ipam": {
            "type": "whereabouts",
            "configuration_path": flat,
            "kubernetes": {"kubeconfig": kubeconfig},
            "network_name": network_name,
            "ipRanges": ranges.iter().map(|r| json!({"range": r})).collect::<Vec<_>>(),
            "enable_overlapping_ranges": true,
        },
    }))
}

/// Polls an IPPool list as the kubeconfig's identity until RBAC lets it through.
async fn wait_allowed(kubeconfig: &Path) -> Result<()> {
    let client = client_from_kubeconfig(kubeconfig).await?;
    let path = format!("/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}/{IPPOOLS}");
    let deadline = Instant::now() + RBAC_TIMEOUT;
    loop {
        match get_text(&client, &path).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e).context(format!("{} still cannot list IPPools", kubeconfig.display())),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Finds (or builds) whereabouts. Errors name the cause and the remedy.
pub fn whereabouts() -> Result<Whereabouts> {
    static FOUND: OnceLock<std::result::Result<Whereabouts, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| Whereabouts::in_dir(&peer_dir("whereabouts", "THEREABOUTS_WHEREABOUTS_DIR")?).map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Finds (or builds) `toxiproxy-server`.
pub fn toxiproxy_server() -> Result<PathBuf> {
    static FOUND: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let bin = peer_dir("toxiproxy", "THEREABOUTS_TOXIPROXY_DIR")?.join("toxiproxy-server");
            if bin.is_file() { Ok(bin) } else { Err(format!("{} is missing", bin.display())) }
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The build script of the peers, relative to this crate.
pub fn peers_build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../k8s-bins/build-peers.sh")
}

/// `$<env>` when set, else the directory `build-peers.sh <name>` prints.
fn peer_dir(name: &str, env: &str) -> std::result::Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(env) {
        return Ok(PathBuf::from(dir));
    }
    let script = peers_build_script();
    // stderr is inherited: a cold build shows its progress in the test output.
    let out = Command::new("bash")
        .arg(&script)
        .arg(name)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} {name} failed ({}); building it needs Go >= 1.26 and the Go module proxy", script.display(), out.status));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().last().map(str::trim) {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => Err(format!("{} {name} printed no directory", script.display())),
    }
}
