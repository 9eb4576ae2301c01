//! The real-node tests' setting: a one-node cluster from real parts
//! ([`thereabouts_k8s_harness::node::Node`]) with thereabouts installed as an
//! operator installs it: its image imported into containerd, its chart
//! installed with `helm install`, the installer DaemonSet's pod putting the
//! plugin into the node's CNI directory. Then pods, NetworkAttachmentDefinitions
//! and what the node shows of them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use thereabouts_e2e::history::{Attachment, Event, History, Op, attachment_of_entry};
use thereabouts_e2e::workspace_root;
use thereabouts_k8s_harness::addresses;
use thereabouts_k8s_harness::held::entries_by_address;
use thereabouts_k8s_harness::node::{Node, SHELL_IMAGE};
use thereabouts_k8s_harness::{Cluster, NAMESPACE, apply_yaml, block_on, split_yaml};

/// The image the chart names (scripts/build-image.sh's), imported, never pulled.
pub const IMAGE_REPOSITORY: &str = "ghcr.io/thereabouts/thereabouts";
/// The policy the chart installs (values policies.wasm): the example sticky-ordinal.
pub const STICKY_ORDINAL: &str = "sticky-ordinal.wasm";
/// The IPAM type of a network whose calls are recorded (`src/bin/cni_recorder.rs`).
pub const RECORDER: &str = "thereabouts-recorded";
/// The namespace of the test pods.
pub const PODS: &str = "default";

/// A node with thereabouts installed by its chart.
pub struct Installed {
    pub node: Node,
}

impl Installed {
    /// The node of this test binary, shared by its tests (started by the first,
    /// torn down after the last).
    pub fn shared() -> Arc<Installed> {
        static SHARED: Mutex<Weak<Installed>> = Mutex::new(Weak::new());
        let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(installed) = slot.upgrade() {
            return installed;
        }
        let installed = Arc::new(Installed::start().expect("starting a node with thereabouts installed"));
        *slot = Arc::downgrade(&installed);
        installed
    }

    pub fn start() -> Result<Installed> {
        let installed = Installed::bare()?;
        installed.install(&[])?;
        Ok(installed)
    }

    /// A node (with Multus' NAD CRD) on which nothing of thereabouts is installed
    /// yet: [`Installed::install`] installs it.
    pub fn bare() -> Result<Installed> {
        let t0 = Instant::now();
        let cluster = Arc::new(Cluster::start_for_node()?);
        let node = Node::start(cluster.clone())?;
        eprintln!("node-tests: node {} Ready in {:.1?}", node.name(), t0.elapsed());
        let installed = Installed { node };
        installed.install_nad_crd()?;
        Ok(installed)
    }

    /// Imports the image and installs the chart (with the helm arguments `extra`
    /// after the node's own), then waits until the node and controller are set up.
    pub fn install(&self, extra: &[&str]) -> Result<()> {
        let t0 = Instant::now();
        self.node.import_oci_layout(&image_layout())?;
        self.helm_install(extra)?;
        self.wait_installed()?;
        eprintln!("node-tests: thereabouts installed by its chart in {:.1?}", t0.elapsed());
        Ok(())
    }

    pub fn cluster(&self) -> &Cluster {
        self.node.cluster()
    }

    pub async fn client(&self) -> Result<kube::Client> {
        self.cluster().admin_client().await
    }

    /// Multus' NetworkAttachmentDefinition CRD, from Multus' own manifest.
    fn install_nad_crd(&self) -> Result<()> {
        let manifest = std::fs::read_to_string(&self.node.binaries().multus_manifest)?;
        let crd =
            split_yaml(&manifest)?.into_iter().find(|d| d["kind"] == "CustomResourceDefinition").context("no CustomResourceDefinition in Multus' manifest")?;
        block_on(async { apply_yaml(&self.client().await?, &serde_json::to_string(&crd)?, NAMESPACE).await })?;
        Ok(())
    }

    /// `helm install` of charts/thereabouts, with the node's directories, the
    /// apiserver's loopback address (no kube-proxy here), the imported image and
    /// the example sticky-ordinal policy in the chart's policies ConfigMap.
    fn helm_install(&self, extra: &[&str]) -> Result<()> {
        let port = self.cluster().server_url().rsplit(':').next().unwrap_or_default().to_string();
        let sets = [
            format!("image.repository={IMAGE_REPOSITORY}"),
            format!("image.tag={}", workspace_version()),
            "image.pullPolicy=Never".to_string(),
            format!("node.cniBinDir={}", self.node.cni_bin_dir().display()),
            format!("node.cniConfDir={}", self.node.cni_conf_dir().display()),
            format!("node.policyCacheDir={}", self.node.policy_cache_dir().display()),
            "apiServer.host=127.0.0.1".to_string(),
            format!("apiServer.port={port}"),
            "controller.hostNetwork=true".to_string(),
            "controller.replicas=1".to_string(),
            "installer.resyncSeconds=5".to_string(),
            // Full passes every few seconds: a case that must not lose a live
            // pod's address sees many of them.
            "controller.reconcileIntervalSeconds=5".to_string(),
            // IPAMClaims (N12): the plugin reads the pod's networks and patches the claim's status.
            "persistentIPsRbac.enabled=true".to_string(),
        ];
        let mut args = vec!["install".to_string(), "thereabouts".to_string(), workspace_root().join("charts/thereabouts").display().to_string()];
        args.extend(["--namespace".to_string(), NAMESPACE.to_string(), "--kubeconfig".to_string(), self.cluster().admin_kubeconfig().display().to_string()]);
        for set in sets {
            args.extend(["--set".to_string(), set]);
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        use base64::Engine as _;
        let policy = std::fs::read(thereabouts_e2e::built_policy("sticky-ordinal"))?;
        let values = self.node.dir().join("policy-values.json");
        let wasm = json!({STICKY_ORDINAL: base64::engine::general_purpose::STANDARD.encode(policy)});
        std::fs::write(&values, json!({"policies": {"wasm": wasm}}).to_string())?;
        args.extend(["--values".to_string(), values.display().to_string()]);
        let out = Command::new(helm()).args(&args).output().context("running helm")?;
        if !out.status.success() {
            bail!("helm install: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// The plugin and its flat file on the node, written by the installer's pod;
    /// the controller leading; `default`'s ServiceAccount made.
    fn wait_installed(&self) -> Result<()> {
        let flat_file = self.flat_file();
        let policy = self.policy_path(STICKY_ORDINAL);
        self.wait("the installer's pod put the plugin, its flat file and the chart's policy on the node", Duration::from_secs(180), || {
            Ok(self.node.cni_bin_dir().join("thereabouts").is_file() && flat_file.is_file() && policy.is_file())
        })?;
        self.wait("the controller holds its Lease", Duration::from_secs(120), || {
            block_on(async {
                let leases: Api<Lease> = Api::namespaced(self.client().await?, NAMESPACE);
                Ok(leases.get_opt("thereabouts-controller").await?.and_then(|l| l.spec?.holder_identity).is_some())
            })
        })?;
        self.wait("the default ServiceAccount exists", Duration::from_secs(60), || {
            block_on(async { Ok(Api::<ServiceAccount>::namespaced(self.client().await?, PODS).get_opt("default").await?.is_some()) })
        })
    }

    /// Where the installer put the chart's policy `name` (a network's policy `path`).
    pub fn policy_path(&self, name: &str) -> PathBuf {
        self.node.cni_conf_dir().join("thereabouts.d/policies").join(name)
    }

    /// The flat file the installer wrote on the node.
    pub fn flat_file(&self) -> PathBuf {
        self.node.cni_conf_dir().join("thereabouts.d/thereabouts.conf")
    }

    /// Polls `done` every 500 ms until it is true or `limit` has passed; the
    /// error names `what` and the end of the kubelet's log.
    pub fn wait(&self, what: &str, limit: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
        let end = Instant::now() + limit;
        let mut last = None;
        loop {
            match done() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last = Some(format!("{e:#}")),
            }
            if Instant::now() > end {
                let log = std::fs::read_to_string(self.node.dir().join("kubelet.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                bail!("timed out waiting until {what} (last error: {last:?}); kubelet log:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// A NetworkAttachmentDefinition `name` in [`PODS`] of a bridge (a name of
    /// the node's own, no address on the host) with thereabouts over `ranges`.
    pub fn nad(&self, name: &str, bridge_suffix: &str, ranges: &[&str]) -> Result<()> {
        self.nad_with(name, bridge_suffix, ip_ranges(ranges))
    }

    /// [`Installed::nad`] with the `ipam` keys `ipam` (beside type and the flat file).
    pub fn nad_with(&self, name: &str, bridge_suffix: &str, mut ipam: Value) -> Result<()> {
        ipam["type"] = json!("thereabouts");
        ipam["configuration_path"] = json!(self.flat_file());
        self.nad_raw(name, bridge_suffix, ipam)
    }

    /// [`Installed::nad`] whose calls the recorder (`src/bin/cni_recorder.rs`,
    /// put on the node by [`Installed::install_recorder`]) records for
    /// [`Installed::check_history`].
    pub fn nad_recorded(&self, name: &str, bridge_suffix: &str, mut ipam: Value) -> Result<()> {
        ipam["type"] = json!(RECORDER);
        ipam["configuration_path"] = json!(self.flat_file());
        self.nad_raw(name, bridge_suffix, ipam)
    }

    /// Puts the recorder (`recorder`: the test's `CARGO_BIN_EXE_cni_recorder`)
    /// into the node's CNI bin dir beside the plugin, once.
    pub fn install_recorder(&self, recorder: &Path) -> Result<()> {
        let target = self.node.cni_bin_dir().join(RECORDER);
        if !target.is_file() {
            let staged = target.with_extension("new");
            std::fs::copy(recorder, &staged).with_context(|| format!("copying {}", recorder.display()))?;
            std::fs::rename(&staged, &target)?;
        }
        Ok(())
    }

    /// The records of network `name`'s calls so far, as the recorder wrote them.
    fn records(&self, name: &str) -> Result<Vec<Value>> {
        let text = std::fs::read_to_string(self.history_path()).unwrap_or_default();
        let mut records = Vec::new();
        for line in text.lines() {
            let record: Value = serde_json::from_str(line).with_context(|| format!("{}: {line}", self.history_path().display()))?;
            if record["network"] == name {
                records.push(record);
            }
        }
        Ok(records)
    }

    fn history_path(&self) -> PathBuf {
        self.node.cni_bin_dir().join(RECORDER).with_extension("history.jsonl")
    }

    /// The containers of network `name` with a recorded ADD and no recorded DEL.
    fn adds_without_del(&self, name: &str) -> Result<BTreeSet<String>> {
        let records = self.records(name)?;
        let of = |command: &str| -> BTreeSet<String> {
            records.iter().filter(|r| r["command"] == command).filter_map(|r| r["container_id"].as_str().map(str::to_string)).collect()
        };
        Ok(of("ADD").difference(&of("DEL")).cloned().collect())
    }

    /// Every ADD and DEL the runtime sent for network `name` through the
    /// recorder, as the history checker reads calls.
    pub fn recorded_history(&self, name: &str) -> Result<History> {
        let records = self.records(name)?;
        // Wall-clock times of the records, as instants of this process.
        let (now, wall) = (Instant::now(), std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos());
        let at = |ns: &Value| -> Result<Instant> {
            let ns: u128 = ns.as_str().context("a time")?.parse()?;
            now.checked_sub(Duration::from_nanos(u64::try_from(wall.saturating_sub(ns))?)).context("a time before this process' clock")
        };
        let mut events = Vec::new();
        for record in &records {
            let op = match record["command"].as_str() {
                Some("ADD") => Op::Add,
                Some("DEL") => Op::Del,
                _ => continue,
            };
            let ok = record["code"] == 0;
            let args = record["args"].as_str().unwrap_or_default();
            let arg = |key: &str| args.split(';').find_map(|kv| kv.strip_prefix(key)).unwrap_or_default().to_string();
            let attachment = Attachment {
                holder: format!("{}/{}", arg("K8S_POD_NAMESPACE="), arg("K8S_POD_NAME=")),
                ifname: record["ifname"].as_str().unwrap_or_default().into(),
            };
            let mut addresses = Vec::new();
            if op == Op::Add && ok {
                let result: Value = serde_json::from_str(record["stdout"].as_str().unwrap_or_default())?;
                for ip in result["ips"].as_array().into_iter().flatten() {
                    let cidr = ip["address"].as_str().context("a result's address")?;
                    addresses.push(cidr.split('/').next().unwrap_or_default().parse()?);
                }
            }
            events.push(Event { op, attachment, start: at(&record["start_ns"])?, end: at(&record["end_ns"])?, ok, addresses });
        }
        Ok(History { events })
    }

    /// The history checker over the recorded calls of network `name` (of
    /// `ranges`) against its IPPools now: no address certainly held by two
    /// pods at once, and the pools hold what the calls leave. Returns how many
    /// calls it checked.
    ///
    /// It first waits for the runtime's DEL of every container the recorder
    /// saw an ADD of: pools can be empty before those DELs are recorded (a
    /// pod force-deleted is gone from the API at once, and the controller frees
    /// its addresses while the kubelet still stops its sandbox; a DEL that
    /// removed the entries of its group's queued DELs has written the pool
    /// before they return).
    pub fn check_history(&self, name: &str, ranges: &[&str]) -> Result<usize> {
        let waited = self.wait("the runtime's DEL of every recorded ADD", Duration::from_secs(120), || Ok(self.adds_without_del(name)?.is_empty()));
        let history = self.recorded_history(name)?;
        let mut held = BTreeMap::new();
        for range in ranges {
            let pool = addresses::pool_name(range);
            let allocations =
                self.pool_object("IPPool", &pool)?.and_then(|p| serde_json::from_value(p["spec"]["allocations"].clone()).ok()).unwrap_or_default();
            for (address, e) in entries_by_address(&pool, range, allocations)? {
                held.insert(address, attachment_of_entry(&e.podref, &e.id, &e.ifname));
            }
        }
        let found = history.check(&held);
        if !found.is_empty() {
            let waited = waited.err().map(|e| format!(" ({e:#}; containers still without a DEL: {:?})", self.adds_without_del(name).unwrap_or_default()));
            bail!("network {name}: the history of {} calls against its pools{}: {found:#?}", history.events.len(), waited.unwrap_or_default());
        }
        Ok(history.events.len())
    }

    /// A NAD of a bridge with `ipam` as it is (any IPAM plugin on the node).
    pub fn nad_raw(&self, name: &str, bridge_suffix: &str, ipam: Value) -> Result<()> {
        self.nad_config(name, self.bridge_config(name, bridge_suffix, ipam))
    }

    /// The conflist of [`Installed::nad_raw`]: one bridge plugin with `ipam`.
    pub fn bridge_config(&self, name: &str, bridge_suffix: &str, ipam: Value) -> Value {
        json!({
            "cniVersion": "1.1.0",
            "name": name,
            "plugins": [{"type": "bridge", "bridge": self.node.bridge(bridge_suffix), "isGateway": false, "ipMasq": false, "ipam": ipam}],
        })
    }

    /// A NAD `name` in [`PODS`] whose config is `config`.
    pub fn nad_config(&self, name: &str, config: Value) -> Result<()> {
        let nad = json!({
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": PODS},
            "spec": {"config": config.to_string()},
        });
        block_on(async { apply_yaml(&self.client().await?, &nad.to_string(), PODS).await })?;
        Ok(())
    }

    /// The object `kind` (of thereabouts' group) `name` in kube-system, as JSON.
    pub fn pool_object(&self, kind: &str, name: &str) -> Result<Option<Value>> {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("whereabouts.cni.cncf.io", "v1alpha1", kind));
        let found =
            block_on(async { Ok::<_, anyhow::Error>(Api::<DynamicObject>::namespaced_with(self.client().await?, NAMESPACE, &resource).get_opt(name).await?) })?;
        Ok(found.map(|o| serde_json::to_value(o).unwrap_or_default()))
    }

    /// Creates a pod on the node running `script` in the shell image, attached
    /// to the NADs `networks` (comma-separated, the Multus annotation).
    pub fn create_pod(&self, name: &str, networks: &str, script: &str) -> Result<()> {
        self.create_pod_value(pod_spec(name, networks, script))
    }

    /// Creates the pod `pod` (a [`pod_spec`], perhaps changed).
    pub fn create_pod_value(&self, pod: Value) -> Result<()> {
        let pod: Pod = serde_json::from_value(pod)?;
        block_on(async { anyhow::Ok(Api::<Pod>::namespaced(self.client().await?, PODS).create(&PostParams::default(), &pod).await?) })?;
        Ok(())
    }

    pub fn get_pod(&self, name: &str) -> Result<Option<Pod>> {
        block_on(async { Ok(Api::<Pod>::namespaced(self.client().await?, PODS).get_opt(name).await?) })
    }

    /// Waits until the pod is Running (its sandbox up, so its ADDs done).
    pub fn wait_running(&self, name: &str) -> Result<Pod> {
        self.wait_phase(name, &["Running"])
    }

    /// Waits until the pod's phase is one of `phases`; returns the pod.
    pub fn wait_phase(&self, name: &str, phases: &[&str]) -> Result<Pod> {
        let mut found = None;
        self.wait(&format!("pod {name} is {phases:?}"), Duration::from_secs(120), || {
            found = self.get_pod(name)?.filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|ph| phases.contains(&ph)));
            Ok(found.is_some())
        })?;
        found.context("pod")
    }

    pub fn delete_pod(&self, name: &str) -> Result<()> {
        block_on(async {
            let _ =
                Api::<Pod>::namespaced(self.client().await?, PODS).delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
            anyhow::Ok(())
        })
    }

    /// Pods of [`PODS`] whose name starts with `prefix`.
    pub fn pods(&self, prefix: &str) -> Result<Vec<Pod>> {
        let all = block_on(async { Ok::<_, anyhow::Error>(Api::<Pod>::namespaced(self.client().await?, PODS).list(&ListParams::default()).await?.items) })?;
        Ok(all.into_iter().filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with(prefix))).collect())
    }

    /// What the pod's container wrote (the kubelet's log file, CRI format:
    /// time, stream, tag, then the line).
    pub fn pod_log(&self, pod: &Pod) -> Result<String> {
        let uid = pod.metadata.uid.as_deref().context("uid")?;
        let name = pod.metadata.name.as_deref().context("name")?;
        let file = self.node.dir().join("kubelet/podlogs").join(format!("{PODS}_{name}_{uid}")).join("main/0.log");
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        Ok(text.lines().filter_map(|l| l.splitn(4, ' ').nth(3)).collect::<Vec<_>>().join("\n"))
    }
}

impl Installed {
    /// A Deployment `name` of the shell image (sleeping), attached to `networks`.
    pub fn deployment(&self, name: &str, networks: &str, replicas: i32) -> Result<()> {
        self.workload("Deployment", name, networks, json!({"replicas": replicas}))
    }

    /// A StatefulSet `name` of the shell image (sleeping), attached to
    /// `networks`; its pods start in parallel.
    pub fn statefulset(&self, name: &str, networks: &str, replicas: i32) -> Result<()> {
        self.workload("StatefulSet", name, networks, json!({"replicas": replicas, "serviceName": name, "podManagementPolicy": "Parallel"}))
    }

    /// An apps/v1 `kind` of sleeping shell pods labelled `app: name`, with `spec` besides.
    fn workload(&self, kind: &str, name: &str, networks: &str, mut spec: Value) -> Result<()> {
        let mut template = pod_spec(name, networks, "sleep 3600");
        template["spec"]["restartPolicy"] = json!("Always");
        template["metadata"]["labels"] = json!({"app": name});
        spec["selector"] = json!({"matchLabels": {"app": name}});
        spec["template"] = json!({"metadata": template["metadata"], "spec": template["spec"]});
        let object = json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": PODS}, "spec": spec});
        block_on(async { apply_yaml(&self.client().await?, &object.to_string(), PODS).await })?;
        Ok(())
    }

    pub fn delete_statefulset(&self, name: &str) -> Result<()> {
        block_on(async {
            let _ = Api::<StatefulSet>::namespaced(self.client().await?, PODS).delete(name, &DeleteParams::default()).await;
            anyhow::Ok(())
        })?;
        for pod in self.pods(&format!("{name}-"))? {
            self.delete_pod(pod.metadata.name.as_deref().unwrap_or_default())?;
        }
        self.wait("the StatefulSet's pods are gone", Duration::from_secs(180), || Ok(self.pods(&format!("{name}-"))?.is_empty()))
    }

    pub fn scale(&self, deployment: &str, replicas: i32) -> Result<()> {
        block_on(async {
            let api: Api<Deployment> = Api::namespaced(self.client().await?, PODS);
            api.patch(deployment, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": replicas}}))).await?;
            anyhow::Ok(())
        })
    }

    pub fn delete_deployment(&self, name: &str) -> Result<()> {
        block_on(async {
            let _ = Api::<Deployment>::namespaced(self.client().await?, PODS).delete(name, &DeleteParams::default()).await;
            anyhow::Ok(())
        })?;
        self.wait("the Deployment's pods are gone", Duration::from_secs(180), || Ok(self.pods(&format!("{name}-"))?.is_empty()))
    }

    /// Waits until `count` pods named `prefix…` run with addresses on `network`
    /// (`namespace/name` in network-status); returns each pod's addresses.
    pub fn wait_addresses(&self, prefix: &str, network: &str, count: usize) -> Result<Vec<Vec<String>>> {
        let mut found = Vec::new();
        self.wait(&format!("{count} pods {prefix}* run with addresses on {network}"), Duration::from_secs(300), || {
            found = self
                .pods(prefix)?
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none() && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| network_status(p).into_iter().find(|(n, ..)| n == network).map(|(_, _, ips)| ips))
                .collect();
            Ok(found.len() == count)
        })?;
        Ok(found)
    }

    /// Creates, gets or deletes an object of any kind in [`PODS`] (an IPAMClaim).
    pub fn object(&self, group: &str, version: &str, kind: &str, action: ObjectAction) -> Result<Option<Value>> {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        block_on(async {
            let api = Api::<DynamicObject>::namespaced_with(self.client().await?, PODS, &resource);
            Ok(match action {
                ObjectAction::Create(object) => Some(serde_json::to_value(api.create(&PostParams::default(), &serde_json::from_value(object)?).await?)?),
                ObjectAction::Get(name) => api.get_opt(name).await?.map(|o| serde_json::to_value(o).unwrap_or_default()),
                ObjectAction::Delete(name) => {
                    let _ = api.delete(name, &DeleteParams::default()).await?;
                    None
                }
            })
        })
    }

    /// How many allocations the IPPool `name` (in kube-system) holds.
    pub fn allocations(&self, name: &str) -> Result<usize> {
        let pool = self.pool_object("IPPool", name)?;
        Ok(pool.and_then(|p| p["spec"]["allocations"].as_object().map(|a| a.len())).unwrap_or(0))
    }
}

/// What [`Installed::object`] does.
pub enum ObjectAction<'a> {
    Create(Value),
    Get(&'a str),
    Delete(&'a str),
}

impl Drop for Installed {
    fn drop(&mut self) {
        // Pods first, while the plugin and the apiserver are there for their DELs.
        let _ = self.node.delete_all_pods(Duration::from_secs(90));
    }
}

/// The `ipam` keys of `ranges`, one `ipRanges` entry each.
pub fn ip_ranges(ranges: &[&str]) -> Value {
    json!({"ipRanges": ranges.iter().map(|r| json!({"range": r})).collect::<Vec<_>>()})
}

/// A pod of the shell image, attached to `networks`, running `script`.
pub fn pod_spec(name: &str, networks: &str, script: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": PODS, "annotations": if networks.is_empty() { json!({}) } else { json!({"k8s.v1.cni.cncf.io/networks": networks}) }},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": SHELL_IMAGE, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", script]}],
        },
    })
}

/// The `k8s.v1.cni.cncf.io/network-status` annotation Multus wrote: each
/// network's name, interface and addresses.
pub fn network_status(pod: &Pod) -> Vec<(String, String, Vec<String>)> {
    let Some(text) = pod.metadata.annotations.as_ref().and_then(|a| a.get("k8s.v1.cni.cncf.io/network-status")) else { return Vec::new() };
    let Ok(Value::Array(entries)) = serde_json::from_str::<Value>(text) else { return Vec::new() };
    entries
        .iter()
        .map(|e| {
            let ips = e["ips"].as_array().into_iter().flatten().filter_map(|ip| ip.as_str().map(str::to_string)).collect();
            (e["name"].as_str().unwrap_or_default().to_string(), e["interface"].as_str().unwrap_or_default().to_string(), ips)
        })
        .collect()
}

/// `target/image/oci` (tests/node.sh builds it), or `$THEREABOUTS_IMAGE_LAYOUT`.
pub fn image_layout() -> PathBuf {
    std::env::var_os("THEREABOUTS_IMAGE_LAYOUT").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target/image/oci"))
}

pub fn helm() -> PathBuf {
    PathBuf::from(std::env::var_os("THEREABOUTS_HELM").expect("THEREABOUTS_HELM: the helm binary (tests/node.sh sets it)"))
}

pub fn workspace_version() -> String {
    let cargo = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap_or_default();
    cargo.lines().find_map(|l| l.strip_prefix("version = \"")).and_then(|v| v.strip_suffix('"')).unwrap_or_default().to_string()
}
