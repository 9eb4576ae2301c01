//! A real one-node cluster for the real-node tests (tests/node): beside the
//! harness's etcd and kube-apiserver ([`Cluster::start_for_node`]), the
//! kube-controller-manager and kube-scheduler of the same Kubernetes version,
//! containerd 2.x with Debian's runc, and a kubelet registered as a Node; CNI
//! plugins built from their modules and the Multus thin plugin as the node's
//! network, with a plain bridge as the cluster network (binaries of
//! `tests/k8s-bins/build.sh` and `build-node.sh`).
//!
//! Host hygiene: everything lives in a scratch directory (containerd's root and
//! state, the kubelet's root, the CNI bin and conf dirs, the logs); bridges carry
//! a name of the node's own; no address is put on the host, no masquerading, no
//! sysctl. Dropped = the pods deleted through the API and torn down by the
//! kubelet (CNI DEL), then every process ended by its PID, the containers'
//! shims and tasks killed, mounts, network namespaces, cgroups and bridges
//! removed, the directory deleted; also when a test panics.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node as NodeObject, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use crate::process::{Proc, Spawner};
use crate::{Cluster, block_on, free_ports, lock};

/// The CIDR of the cluster network (bridge + host-local), a documentation range
/// of its own: the networks under test use 192.0.2.0/24 and 2001:db8::/32.
pub const CLUSTER_NETWORK: &str = "198.51.100.0/24";
/// The images the node has (imported, never pulled: `imagePullPolicy: Never`).
pub const PAUSE_IMAGE: &str = "localhost/pause:test";
/// busybox-static with the applets the test pods run (sh, ip, ping, sleep, cat).
pub const SHELL_IMAGE: &str = "localhost/shell:test";
const SHELL_APPLETS: [&str; 8] = ["sh", "ip", "ping", "sleep", "cat", "ls", "hostname", "true"];
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The node's binaries: kubelet, controller manager and scheduler from
/// build.sh's directory, the rest from build-node.sh's.
#[derive(Clone, Debug)]
pub struct NodeBinaries {
    pub kubelet: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    /// containerd, containerd-shim-runc-v2, ctr.
    pub containerd_dir: PathBuf,
    /// bridge, loopback, macvlan, host-local, multus.
    pub cni_dir: PathBuf,
    pub cnitool: PathBuf,
    pub pause: PathBuf,
    /// Multus' own manifest (its NetworkAttachmentDefinition CRD).
    pub multus_manifest: PathBuf,
}

/// `$THEREABOUTS_NODE_BINS` (build-node.sh's directory) or build-node.sh run now,
/// and the Kubernetes binaries beside kube-apiserver.
pub fn node_binaries(cluster: &Cluster) -> Result<NodeBinaries> {
    let node_dir = match std::env::var_os("THEREABOUTS_NODE_BINS") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../k8s-bins/build-node.sh");
            let out = Command::new("bash").arg(&script).stdin(Stdio::null()).stderr(Stdio::inherit()).output()?;
            if !out.status.success() {
                bail!("{} failed ({})", script.display(), out.status);
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().trim())
        }
    };
    let k8s = cluster.binaries().kube_apiserver.parent().context("kube-apiserver's directory")?.to_path_buf();
    let bins = NodeBinaries {
        kubelet: k8s.join("kubelet"),
        kube_controller_manager: k8s.join("kube-controller-manager"),
        kube_scheduler: k8s.join("kube-scheduler"),
        containerd_dir: node_dir.join("bin"),
        cni_dir: node_dir.join("cni"),
        cnitool: node_dir.join("cnitool"),
        pause: node_dir.join("pause"),
        multus_manifest: node_dir.join("multus-daemonset.yml"),
    };
    for p in [&bins.kubelet, &bins.kube_controller_manager, &bins.kube_scheduler, &bins.containerd_dir.join("containerd"), &bins.cnitool, &bins.pause] {
        if !p.is_file() {
            bail!("{} is missing (tests/k8s-bins/build.sh and build-node.sh build it)", p.display());
        }
    }
    Ok(bins)
}

/// What this host must offer to run a node, each missing feature named.
pub fn host_check() -> Result<()> {
    let mut missing = Vec::new();
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root (containerd, runc and the kubelet need it)".to_string());
    }
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !filesystems.lines().any(|l| l.trim_end().ends_with("overlay")) {
        missing.push("the overlay file system (containerd's overlayfs snapshotter)".to_string());
    }
    for controller in ["cpu", "memory", "pids", "cpuset"] {
        let v1 = Path::new("/sys/fs/cgroup").join(controller);
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
        if !v1.is_dir() && !v2.split_whitespace().any(|c| c == controller) {
            missing.push(format!("the {controller} cgroup controller"));
        }
    }
    if Command::new("runc").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        missing.push("runc (Debian's runc package)".to_string());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        missing.push("ip (iproute2)".to_string());
    }
    if missing.is_empty() { Ok(()) } else { bail!("this machine cannot run a node: no {}", missing.join(", no ")) }
}

pub struct Node {
    // Field order matters for Drop's last step: processes before the spawner.
    kubelet: Mutex<Option<Proc>>,
    containerd: Mutex<Option<Proc>>,
    scheduler: Mutex<Option<Proc>>,
    controller_manager: Mutex<Option<Proc>>,
    spawner: Spawner,
    cluster: Arc<Cluster>,
    bins: NodeBinaries,
    dir: PathBuf,
    name: String,
    cgroup_root: String,
    bridges: Mutex<Vec<String>>,
    kubelet_args: Vec<String>,
    containerd_args: Vec<String>,
}

impl Node {
    /// Starts the controller manager, the scheduler, containerd (the pause and
    /// shell images imported) and the kubelet, and waits until the Node is Ready.
    /// The node's primary network is Multus (thin plugin) delegating to a bridge
    /// with host-local on [`CLUSTER_NETWORK`].
    pub fn start(cluster: Arc<Cluster>) -> Result<Node> {
        host_check()?;
        let bins = node_binaries(&cluster)?;
        let tag = format!("{}", std::process::id() % 100_000);
        let dir = cluster.dir().join("node");
        for sub in
            ["cni-bin", "cni-conf", "policy-cache", "containerd", "kubelet/root", "kubelet/podlogs", "kubelet/volume-plugins", "ipam", "multus", "images"]
        {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let node = Node {
            kubelet: Mutex::new(None),
            containerd: Mutex::new(None),
            scheduler: Mutex::new(None),
            controller_manager: Mutex::new(None),
            spawner: Spawner::new()?,
            name: "thab-node".to_string(),
            cgroup_root: format!("thab-{tag}"),
            bridges: Mutex::new(vec![format!("thab{tag}c")]),
            kubelet_args: Vec::new(),
            containerd_args: vec!["--config".to_string(), dir.join("containerd/config.toml").display().to_string()],
            cluster,
            bins,
            dir,
        };
        let node = node.with_kubelet_args()?;
        node.write_cni()?;
        node.write_containerd_config()?;
        node.start_control_plane_controllers()?;
        node.start_containerd()?;
        node.import_test_images()?;
        node.make_cgroup_root()?;
        node.start_kubelet()?;
        node.wait_ready()?;
        Ok(node)
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// The Node object's name (the kubelet's --hostname-override).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn binaries(&self) -> &NodeBinaries {
        &self.bins
    }

    /// The node's CNI bin dir (what /opt/cni/bin is on a real node).
    pub fn cni_bin_dir(&self) -> PathBuf {
        self.dir.join("cni-bin")
    }

    /// The node's CNI conf dir (what /etc/cni/net.d is on a real node).
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni-conf")
    }

    /// A bridge name of this node's own for a test network (`suffix`: one
    /// letter), removed with the node.
    /// The node's policy cache (the plugin's THEREABOUTS_POLICY_CACHE).
    pub fn policy_cache_dir(&self) -> PathBuf {
        self.dir.join("policy-cache")
    }

    pub fn bridge(&self, suffix: &str) -> String {
        let name = format!("{}{suffix}", self.cluster_bridge().trim_end_matches('c'));
        let mut bridges = lock(&self.bridges);
        if !bridges.contains(&name) {
            bridges.push(name.clone());
        }
        name
    }

    fn cluster_bridge(&self) -> String {
        lock(&self.bridges)[0].clone()
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }

    fn with_kubelet_args(mut self) -> Result<Node> {
        let [port, healthz] = free_ports::<2>()?;
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\n\
             kind: KubeletConfiguration\n\
             containerRuntimeEndpoint: unix://{socket}\n\
             imageServiceEndpoint: unix://{socket}\n\
             podLogsDir: {dir}/kubelet/podlogs\n\
             volumePluginDir: {dir}/kubelet/volume-plugins\n\
             cgroupDriver: cgroupfs\n\
             cgroupRoot: /{cgroup}\n\
             failCgroupV1: false\n\
             failSwapOn: false\n\
             address: 127.0.0.1\n\
             port: {port}\n\
             readOnlyPort: 0\n\
             healthzBindAddress: 127.0.0.1\n\
             healthzPort: {healthz}\n\
             authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}\n\
             authorization: {{mode: AlwaysAllow}}\n\
             protectKernelDefaults: false\n\
             resolvConf: \"\"\n\
             oomScoreAdj: 0\n\
             evictionHard: {{}}\n\
             imageGCHighThresholdPercent: 100\n\
             imageGCLowThresholdPercent: 99\n\
             enforceNodeAllocatable: []\n\
             localStorageCapacityIsolation: false\n\
             makeIPTablesUtilChains: false\n\
             syncFrequency: 5s\n\
             nodeStatusUpdateFrequency: 2s\n\
             serializeImagePulls: false\n\
             maxPods: 250\n",
            socket = self.socket().display(),
            dir = self.dir.display(),
            cgroup = self.cgroup_root,
        );
        std::fs::write(self.dir.join("kubelet/config.yaml"), config)?;
        self.kubelet_args = vec![
            format!("--config={}", self.dir.join("kubelet/config.yaml").display()),
            format!("--kubeconfig={}", self.cluster.admin_kubeconfig().display()),
            format!("--root-dir={}", self.dir.join("kubelet/root").display()),
            format!("--hostname-override={}", self.name),
            "--node-ip=127.0.0.1".to_string(),
            "-v=2".to_string(),
        ];
        Ok(self)
    }

    /// The CNI plugins into the bin dir, and the primary network: Multus,
    /// delegating to the cluster network and reading NADs from the apiserver.
    fn write_cni(&self) -> Result<()> {
        for entry in std::fs::read_dir(&self.bins.cni_dir)? {
            let entry = entry?;
            std::fs::copy(entry.path(), self.cni_bin_dir().join(entry.file_name()))?;
        }
        let cluster_network = serde_json::json!({
            "cniVersion": "1.1.0",
            "name": "cluster",
            "plugins": [{
                "type": "bridge", "bridge": self.cluster_bridge(), "isGateway": false, "ipMasq": false,
                "ipam": {"type": "host-local", "dataDir": self.dir.join("ipam"), "ranges": [[{"subnet": CLUSTER_NETWORK}]]},
            }],
        });
        let multus = serde_json::json!({
            "cniVersion": "1.1.0",
            "name": "multus-cni-network",
            "plugins": [{
                "type": "multus",
                "kubeconfig": self.cluster.admin_kubeconfig(),
                "binDir": self.cni_bin_dir(),
                "cniDir": self.dir.join("multus"),
                "logFile": self.dir.join("multus.log"),
                "logLevel": "verbose",
                "delegates": [cluster_network],
            }],
        });
        std::fs::write(self.cni_conf_dir().join("00-multus.conflist"), serde_json::to_vec_pretty(&multus)?)?;
        Ok(())
    }

    /// Makes `conflist` the node's network (containerd watches the conf dir and
    /// loads the first file), or with `None` the Multus network of the start.
    pub fn set_network(&self, conflist: Option<&serde_json::Value>) -> Result<()> {
        let custom = self.cni_conf_dir().join("00-aaa-test.conflist");
        match conflist {
            Some(c) => std::fs::write(&custom, serde_json::to_vec_pretty(c)?)?,
            None => {
                let _ = std::fs::remove_file(&custom);
            }
        }
        Ok(())
    }

    fn write_containerd_config(&self) -> Result<()> {
        let d = self.dir.join("containerd");
        let config = format!(
            "version = 3\n\
             root = \"{d}/root\"\n\
             state = \"{d}/state\"\n\
             [grpc]\n  address = \"{d}/containerd.sock\"\n\
             [ttrpc]\n  address = \"{d}/containerd.sock.ttrpc\"\n\
             [plugins.\"io.containerd.cri.v1.images\"]\n  snapshotter = \"overlayfs\"\n\
             [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n  sandbox = \"{PAUSE_IMAGE}\"\n\
             [plugins.\"io.containerd.cri.v1.runtime\"]\n  disable_apparmor = true\n  restrict_oom_score_adj = true\n\
             [plugins.\"io.containerd.cri.v1.runtime\".containerd]\n  default_runtime_name = \"runc\"\n\
             [plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\
             [plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options]\n  SystemdCgroup = false\n\
             [plugins.\"io.containerd.cri.v1.runtime\".cni]\n  bin_dirs = [\"{bin}\"]\n  conf_dir = \"{conf}\"\n  max_conf_num = 1\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n",
            d = d.display(),
            bin = self.cni_bin_dir().display(),
            conf = self.cni_conf_dir().display(),
        );
        std::fs::write(d.join("config.toml"), config)?;
        Ok(())
    }

    fn start_control_plane_controllers(&self) -> Result<()> {
        let kubeconfig = self.cluster.admin_kubeconfig().display().to_string();
        let kcm = vec![
            format!("--kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".to_string(),
            "--secure-port=0".to_string(),
            "--leader-elect=false".to_string(),
            format!("--root-ca-file={}", self.cluster.dir().join("certs/apiserver.crt").display()),
            // Legacy token Secrets need the signing key; bound tokens do not.
            "--controllers=*,-serviceaccount-token".to_string(),
            "--use-service-account-credentials=false".to_string(),
            // A deleted pod's object goes at once when its node is gone (the force-delete case).
            "--terminated-pod-gc-threshold=100".to_string(),
        ];
        let kcm = self.spawner.spawn("kube-controller-manager", &self.bins.kube_controller_manager, &kcm, &self.dir.join("kube-controller-manager.log"))?;
        *lock(&self.controller_manager) = Some(kcm);
        let scheduler = vec![
            format!("--kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".to_string(),
            "--secure-port=0".to_string(),
            "--leader-elect=false".to_string(),
        ];
        let scheduler = self.spawner.spawn("kube-scheduler", &self.bins.kube_scheduler, &scheduler, &self.dir.join("kube-scheduler.log"))?;
        *lock(&self.scheduler) = Some(scheduler);
        Ok(())
    }

    /// PATH with containerd's directory first: it finds its own runc shim there.
    fn path_env(&self) -> Vec<(&'static str, OsString)> {
        let mut path = OsString::from(&self.bins.containerd_dir);
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        // libcni passes the runtime's environment to every plugin (and Multus to
        // its delegates): the plugin finds the node's policy cache here, not in
        // the machine's /var/lib.
        vec![("PATH", path), ("THEREABOUTS_POLICY_CACHE", self.policy_cache_dir().into_os_string())]
    }

    /// Starts containerd (again) and waits until it answers.
    pub fn start_containerd(&self) -> Result<()> {
        let proc = self.spawner.spawn_env(
            "containerd",
            &self.bins.containerd_dir.join("containerd"),
            &self.containerd_args,
            &self.path_env(),
            &self.dir.join("containerd.log"),
        )?;
        *lock(&self.containerd) = Some(proc);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.ctr(&["version"]).is_ok_and(|o| o.status.success()) {
            if Instant::now() > deadline {
                bail!("containerd did not answer in 30 s:\n{}", crate::process::log_tail(&self.dir.join("containerd.log"), 30));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Kills containerd (SIGKILL; its shims and the containers keep running).
    pub fn kill_containerd(&self) {
        if let Some(mut p) = lock(&self.containerd).take() {
            p.kill();
        }
    }

    /// Starts the kubelet (again).
    pub fn start_kubelet(&self) -> Result<()> {
        let proc = self.spawner.spawn_env("kubelet", &self.bins.kubelet, &self.kubelet_args, &self.path_env(), &self.dir.join("kubelet.log"))?;
        *lock(&self.kubelet) = Some(proc);
        Ok(())
    }

    /// Kills the kubelet (SIGKILL; the pods keep running).
    pub fn kill_kubelet(&self) {
        if let Some(mut p) = lock(&self.kubelet).take() {
            p.kill();
        }
    }

    /// `ctr` of the node's containerd, in the kubelet's namespace.
    pub fn ctr(&self, args: &[&str]) -> Result<Output> {
        Command::new(self.bins.containerd_dir.join("ctr"))
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running ctr")
    }

    /// Imports the OCI image layout `layout` (its index names the image).
    pub fn import_oci_layout(&self, layout: &Path) -> Result<()> {
        let tar = self.dir.join("images").join(format!("{}.tar", layout.file_name().and_then(|n| n.to_str()).unwrap_or("image")));
        let packed = Command::new("tar").arg("-C").arg(layout).arg("-cf").arg(&tar).arg(".").output()?;
        if !packed.status.success() {
            bail!("tar of {}: {}", layout.display(), String::from_utf8_lossy(&packed.stderr));
        }
        let imported = self.ctr(&["images", "import", tar.to_str().context("image path")?])?;
        if !imported.status.success() {
            bail!("ctr images import {}: {}", layout.display(), String::from_utf8_lossy(&imported.stderr));
        }
        Ok(())
    }

    fn import_test_images(&self) -> Result<()> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/oci-image.py");
        let images = self.dir.join("images");
        let pause = images.join("pause");
        let mut specs = vec![format!("pause={}", self.bins.pause.display()), "CMD:/pause".to_string()];
        run_ok(Command::new("python3").arg(&script).arg("small").arg(&pause).arg(PAUSE_IMAGE).args(&specs), "oci-image.py small (pause)")?;
        let shell = images.join("shell");
        specs = vec!["bin/busybox=/bin/busybox".to_string(), "CMD:/bin/sh".to_string()];
        specs.extend(SHELL_APPLETS.iter().map(|a| format!("bin/{a}@busybox")));
        run_ok(Command::new("python3").arg(&script).arg("small").arg(&shell).arg(SHELL_IMAGE).args(&specs), "oci-image.py small (shell)")?;
        self.import_oci_layout(&pause)?;
        self.import_oci_layout(&shell)
    }

    /// The kubelet's cgroup root, in every v1 hierarchy (it refuses to start
    /// when one lacks it), with cpuset's CPUs and memory nodes filled in.
    fn make_cgroup_root(&self) -> Result<()> {
        for h in cgroup_hierarchies() {
            let dir = h.join(&self.cgroup_root);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            if h.ends_with("cpuset") {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    std::fs::write(dir.join(f), std::fs::read(h.join(f))?)?;
                }
            }
        }
        Ok(())
    }

    /// Waits until the Node object says Ready.
    pub fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ready = block_on(async {
                let nodes: Api<NodeObject> = Api::all(self.cluster.admin_client().await?);
                anyhow::Ok(nodes.get_opt(&self.name).await?.is_some_and(|n| node_condition(&n, "Ready") == Some(true)))
            })?;
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the Node never became Ready:\n{}", crate::process::log_tail(&self.dir.join("kubelet.log"), 40));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The Node's Ready condition: whether it is true, and its message.
    pub fn ready_condition(&self) -> Result<(bool, String)> {
        block_on(async {
            let nodes: Api<NodeObject> = Api::all(self.cluster.admin_client().await?);
            let node = nodes.get(&self.name).await?;
            let ready = node.status.and_then(|s| s.conditions).unwrap_or_default().into_iter().find(|c| c.type_ == "Ready");
            anyhow::Ok(ready.map(|c| (c.status == "True", c.message.unwrap_or_default())).unwrap_or((false, String::new())))
        })
    }

    /// Deletes every workload (so nothing makes new pods) and pod of the
    /// cluster (grace 0), and waits until the kubelet has torn their sandboxes
    /// down, so that their CNI DELs ran. kube-system's last: the plugin's
    /// kubeconfig holds the installer pod's token, which ends with that pod.
    pub fn delete_all_pods(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let namespaces = block_on(async {
            let client = self.cluster.admin_client().await?;
            anyhow::Ok(Api::<Namespace>::all(client).list(&ListParams::default()).await?.items.into_iter().filter_map(|n| n.metadata.name).collect::<Vec<_>>())
        })?;
        let (system, others): (Vec<String>, Vec<String>) = namespaces.into_iter().partition(|n| n == crate::NAMESPACE);
        self.delete_pods_in(&others)?;
        self.wait_stopped("labels.\"io.kubernetes.pod.namespace\"!=kube-system", deadline)?;
        self.delete_pods_in(&system)?;
        self.wait_stopped("", deadline)
    }

    fn delete_pods_in(&self, namespaces: &[String]) -> Result<()> {
        block_on(async {
            let client = self.cluster.admin_client().await?;
            let all = ListParams::default();
            let gone = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
            for ns in namespaces {
                let _ = Api::<DaemonSet>::namespaced(client.clone(), ns).delete_collection(&gone, &all).await;
                let _ = Api::<Deployment>::namespaced(client.clone(), ns).delete_collection(&gone, &all).await;
                let _ = Api::<StatefulSet>::namespaced(client.clone(), ns).delete_collection(&gone, &all).await;
                let _ = Api::<ReplicaSet>::namespaced(client.clone(), ns).delete_collection(&gone, &all).await;
                let _ = Api::<Pod>::namespaced(client.clone(), ns).delete_collection(&gone, &all).await;
            }
            anyhow::Ok(())
        })
    }

    /// The ids of the sandboxes containerd holds for the pod `namespace/name`
    /// (running or stopped: the kubelet removes stopped ones in its garbage collection).
    pub fn pod_sandboxes(&self, namespace: &str, name: &str) -> Result<Vec<String>> {
        self.sandboxes_where(&format!("labels.\"io.kubernetes.pod.namespace\"=={namespace},labels.\"io.kubernetes.pod.name\"=={name}"))
    }

    /// Waits until no sandbox of the namespace runs (every pod's CNI DEL ran).
    pub fn wait_namespace_stopped(&self, namespace: &str, timeout: Duration) -> Result<()> {
        self.wait_stopped(&format!("labels.\"io.kubernetes.pod.namespace\"=={namespace}"), Instant::now() + timeout)
    }

    /// Waits until no sandbox of the pod `namespace/name` runs (its CNI DEL ran).
    pub fn wait_pod_stopped(&self, namespace: &str, name: &str, timeout: Duration) -> Result<()> {
        let filter = format!("labels.\"io.kubernetes.pod.namespace\"=={namespace},labels.\"io.kubernetes.pod.name\"=={name}");
        self.wait_stopped(&filter, Instant::now() + timeout)
    }

    /// Waits until no sandbox matching `filter` runs: the kubelet has stopped it,
    /// and with it ran the CNI DEL (it removes stopped sandboxes only in its
    /// next garbage collection, a minute later).
    fn wait_stopped(&self, filter: &str, deadline: Instant) -> Result<()> {
        loop {
            let running = self.running_tasks()?;
            let left: Vec<String> = self.sandboxes_where(filter)?.into_iter().filter(|id| running.contains(id)).collect();
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("sandboxes still running after deleting their pods: {left:?}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The ids of containerd's running tasks.
    fn running_tasks(&self) -> Result<Vec<String>> {
        let out = self.ctr(&["tasks", "list"])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .filter(|l| l.split_whitespace().nth(2) == Some("RUNNING"))
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect())
    }

    /// The ids of containerd's pod sandboxes.
    pub fn sandboxes(&self) -> Result<Vec<String>> {
        self.sandboxes_where("")
    }

    /// The sandboxes matching a `ctr` container filter too (`""`: all).
    fn sandboxes_where(&self, filter: &str) -> Result<Vec<String>> {
        let mut filter_all = "labels.\"io.cri-containerd.kind\"==sandbox".to_string();
        if !filter.is_empty() {
            filter_all = format!("{filter_all},{filter}");
        }
        let out = self.ctr(&["containers", "list", "--quiet", &filter_all])?;
        Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).filter(|l| !l.is_empty()).collect())
    }

    /// The network namespace paths of containerd's sandboxes.
    fn sandbox_netns(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for id in self.sandboxes().unwrap_or_default() {
            let Ok(info) = self.ctr(&["containers", "info", &id]) else { continue };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&info.stdout) else { continue };
            for ns in v["Spec"]["linux"]["namespaces"].as_array().into_iter().flatten() {
                if ns["type"] == "network"
                    && let Some(p) = ns["path"].as_str()
                {
                    out.push(PathBuf::from(p));
                }
            }
        }
        out
    }

    /// Everything a test may have left, in an order that needs no running
    /// kubelet: tasks killed, processes ended, mounts, netns, cgroups, bridges.
    fn teardown(&mut self) {
        let _ = self.delete_all_pods(Duration::from_secs(60));
        let netns = self.sandbox_netns();
        self.kill_kubelet();
        for id in self.ctr(&["tasks", "list", "--quiet"]).map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default().lines() {
            let _ = self.ctr(&["tasks", "kill", "--signal", "SIGKILL", "--all", id]);
        }
        std::thread::sleep(Duration::from_millis(300));
        for id in self.ctr(&["tasks", "list", "--quiet"]).map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default().lines() {
            let _ = self.ctr(&["tasks", "delete", "--force", id]);
        }
        self.kill_containerd();
        kill_processes_naming(&self.socket().display().to_string());
        for p in [&self.scheduler, &self.controller_manager] {
            if let Some(mut p) = lock(p).take() {
                p.kill();
            }
        }
        for ns in netns {
            let _ = Command::new("umount").arg(&ns).output();
            let _ = std::fs::remove_file(&ns);
        }
        unmount_below(&self.dir);
        for h in cgroup_hierarchies() {
            remove_cgroup_tree(&h.join(&self.cgroup_root));
        }
        for bridge in lock(&self.bridges).iter() {
            let _ = Command::new("ip").args(["link", "del", bridge]).output();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The status of the node condition `kind`, if reported.
pub fn node_condition(node: &NodeObject, kind: &str) -> Option<bool> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == kind).map(|c| c.status == "True")
}

fn run_ok(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| what.to_string())?;
    if !out.status.success() {
        bail!("{what}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The cgroup v1 hierarchies the kubelet wants its root in.
fn cgroup_hierarchies() -> Vec<PathBuf> {
    ["cpu", "cpuacct", "cpuset", "memory", "pids", "systemd", "devices", "freezer", "blkio", "hugetlb"]
        .iter()
        .map(|c| Path::new("/sys/fs/cgroup").join(c))
        .filter(|p| p.is_dir())
        .collect()
}

/// Removes a cgroup and its children, deepest first (a cgroup dir is removed
/// with rmdir once its processes are gone).
fn remove_cgroup_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// SIGKILLs every process whose command line contains `needle` (the shims of
/// this node's containerd name its socket).
fn kill_processes_naming(needle: &str) {
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).replace('\0', " ").contains(needle) {
            // SAFETY: plain syscall.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// Unmounts every mount point below `dir`, deepest first (the kubelet bind-mounts
/// its root dir onto itself; containerd mounts the containers' root file systems).
fn unmount_below(dir: &Path) {
    let prefix = dir.display().to_string();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<String> = info.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| p.starts_with(&prefix)).map(str::to_string).collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").arg("-l").arg(&p).output();
    }
}
