//! A real Kubernetes control plane for thereabouts' tests: etcd and kube-apiserver
//! (built by `tests/k8s-bins/build.sh`, cached outside the clone) on free loopback
//! ports in a private temp dir, with
//!
//! * static token authentication: an **admin** (group `system:masters`) and the
//!   **plugin** identity, which authenticates as the ServiceAccount
//!   `kube-system/thereabouts` (user `system:serviceaccount:kube-system:thereabouts`,
//!   groups `system:serviceaccounts`, `system:serviceaccounts:kube-system`), so the
//!   RBAC bindings of `deploy/` apply to it exactly as in a cluster, and it can do
//!   nothing until they are applied;
//! * RBAC authorization, self-signed serving certificates (`--cert-dir`);
//! * admin and plugin kubeconfig files (flat, CA inline, context namespace
//!   `kube-system`), as the CNI plugin reads them.
//!
//! Everything is torn down when the [`Cluster`] is dropped — also when a test
//! panics (unwinding). Should the test process die without unwinding, the kernel
//! kills the control plane (parent-death signal) and the next [`Cluster::start`]
//! removes the orphaned temp dir.
//!
//! [`Cluster::prepared`] is a control plane as `deploy/` sets one up (CRDs, RBAC,
//! flow control), [`Cluster::shared`] one that the tests of a test binary share.
//! Beside it, for the tests that run the plugin on it (each module one job):
//! [`plugin`] (network configs, the admin's blocking view of the objects),
//! [`whereabouts`] (a whereabouts v0.9.4 peer writing the same objects),
//! [`held`] (what a datastore holds against the CNI results), [`addresses`]
//! (range math and whereabouts' names), [`burst`] (many calls at once, a burst
//! through an outage), [`report`] (failures grouped, summaries), [`etcd`] (etcd
//! alone), [`etcd_cluster`] (three members), [`toxiproxy`] (a faulty network),
//! the fault trials ([`faults`], [`fault_world`], [`fault_trial`], [`trial_rng`]),
//! and for the benchmarks [`bench`](mod@bench), [`apiserver_metrics`] and
//! [`log_stats`]. One CNI call is run by `thereabouts_e2e::Invocation::run`.
//! The blocking tests and benchmarks drive the async API with [`block_on`] and
//! poll for a state with [`wait_until`].
//!
//! ```no_run
//! # async fn t() -> anyhow::Result<()> {
//! let cluster = thereabouts_k8s_harness::Cluster::start()?;   // blocking, ~10-30 s
//! let admin = cluster.admin_client().await?;
//! cluster.install_crds().await?;                              // deploy/crds/*.yaml
//! cluster.install_rbac().await?;                              // deploy/rbac.yaml
//! # Ok(()) }
//! ```

pub mod addresses;
pub mod apiserver_metrics;
mod apply;
pub mod bench;
mod bins;
pub mod burst;
pub mod claims;
pub mod controller;
pub mod etcd;
pub mod etcd_cluster;
pub mod fault_trial;
pub mod fault_world;
pub mod faults;
pub mod held;
mod latency_proxy;
pub mod log_stats;
pub mod node;
pub mod peers;
pub mod plugin;
pub mod pod_fleet;
pub mod pods;
mod process;
pub mod profile_provider;
pub mod report;
pub mod toxiproxy;
pub mod trial_rng;
pub mod whereabouts;
pub mod whereabouts_controllers;

use std::future::Future;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine as _;

pub use apply::{apply_yaml, split_yaml};
pub use bins::{Binaries, binaries, build_script};
pub use latency_proxy::LatencyProxy;
pub use process::pid_alive;

use process::{Proc, Spawner};

/// The namespace of the kubeconfigs' contexts (whereabouts' default).
pub const NAMESPACE: &str = "kube-system";
/// The ServiceAccount the plugin identity authenticates as (`namespace`, `name`).
pub const PLUGIN_SERVICE_ACCOUNT: (&str, &str) = ("kube-system", "thereabouts");
/// The user name of the admin identity (group `system:masters`).
pub const ADMIN_USER: &str = "thereabouts-admin";
/// The field manager used for server-side apply by [`Cluster::apply_yaml`].
pub const FIELD_MANAGER: &str = "thereabouts-tests";

const START_ATTEMPTS: usize = 3;
const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Generous: kube-apiserver bootstraps RBAC and friends before /readyz is 200, and
/// the test machines have 2 busy cores.
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(180);
const TEMP_PREFIX: &str = "thereabouts-k8s-";

/// One etcd + kube-apiserver, private to the value; dropped = stopped and deleted.
pub struct Cluster {
    // Field order matters for Drop: processes first, then the spawner thread.
    apiserver: Mutex<Option<Proc>>,
    etcd: Mutex<Option<Proc>>,
    spawner: Spawner,
    bins: Binaries,
    dir: PathBuf,
    keep_dir: bool,
    apiserver_args: Vec<String>,
    apiserver_port: u16,
    etcd_url: String,
    admin_token: String,
    plugin_token: String,
}

impl Cluster {
    /// Starts etcd and kube-apiserver and waits until the apiserver is ready and
    /// its system namespaces exist. Blocking; may be called from inside an async
    /// test (the readiness checks run on a private runtime on another thread).
    ///
    /// `THEREABOUTS_K8S_KEEP=1` keeps the temp dir (logs, kubeconfigs) after drop.
    pub fn start() -> Result<Cluster> {
        Self::start_with(false)
    }

    /// [`Cluster::start`] for a real node (tests/node-harness): the ServiceAccount
    /// admission plugin on, as in any cluster, so the kubelet's pods get their
    /// token volumes; a kube-controller-manager must then run (it creates the
    /// namespaces' `default` ServiceAccounts).
    pub fn start_for_node() -> Result<Cluster> {
        Self::start_with(true)
    }

    fn start_with(service_accounts: bool) -> Result<Cluster> {
        sweep_orphans();
        let bins = binaries()?;
        let mut last = None;
        for attempt in 1..=START_ATTEMPTS {
            let t0 = Instant::now();
            match Self::try_start(&bins, service_accounts) {
                Ok(c) => {
                    eprintln!("k8s-harness: kube-apiserver {} ready in {:.1?} (dir {})", c.server_url(), t0.elapsed(), c.dir.display());
                    return Ok(c);
                }
                // Free ports are picked by binding :0 and closing; another process
                // may grab one before etcd/apiserver binds it. Try fresh ports;
                // any other failure is final.
                Err(e) if format!("{e:#}").contains("address already in use") => {
                    eprintln!("k8s-harness: start attempt {attempt}/{START_ATTEMPTS} lost a port race: {e:#}");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap())
    }

    /// A control plane set up as `deploy/` sets one up: the CRDs, the RBAC and
    /// the flow control, and the apiserver serving IPPool and reservation lists
    /// (the plugin reads pools as LISTs, which the apiserver answers 429 until its
    /// watch cache is ready). Blocking; not from inside an async test.
    pub fn prepared() -> Result<Cluster> {
        Self::prepared_with(true)
    }

    /// [`Cluster::prepared`], with `deploy/flowcontrol.yaml` only when `flowcontrol`
    /// (`bench_k8s_burst --without-flowcontrol` measures the apiserver without it).
    pub fn prepared_with(flowcontrol: bool) -> Result<Cluster> {
        let cluster = Cluster::start()?;
        block_on(async {
            cluster.install_crds().await.context("installing deploy/crds")?;
            cluster.install_rbac().await.context("installing deploy/rbac.yaml")?;
            if flowcontrol {
                cluster.install_flowcontrol().await.context("installing deploy/flowcontrol.yaml")?;
            }
            anyhow::Ok(())
        })?;
        let objects = plugin::Objects::admin(&cluster)?;
        let ready = Instant::now() + Duration::from_secs(30);
        while objects.list(plugin::IPPOOLS).is_err() || objects.list(plugin::RESERVATIONS).is_err() {
            if Instant::now() > ready {
                bail!("the apiserver never served IPPool and reservation lists");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(cluster)
    }

    /// The [`Cluster::prepared`] control plane the tests of one test binary
    /// share: started by the first test that asks, torn down when the last test
    /// holding it ends (a later test starts a new one), so nothing outlives the
    /// test process. Each test keeps to its own ranges (and namespace, where it
    /// changes RBAC), so their objects never meet.
    pub fn shared() -> Result<Arc<Cluster>> {
        static SHARED: Mutex<Weak<Cluster>> = Mutex::new(Weak::new());
        let mut slot = lock(&SHARED);
        if let Some(cluster) = slot.upgrade() {
            return Ok(cluster);
        }
        let cluster = Arc::new(Self::prepared()?);
        *slot = Arc::downgrade(&cluster);
        Ok(cluster)
    }

    fn try_start(bins: &Binaries, service_accounts: bool) -> Result<Cluster> {
        let dir = make_temp_dir()?;
        let keep_dir = std::env::var_os("THEREABOUTS_K8S_KEEP").is_some_and(|v| v != "0" && !v.is_empty());
        // From here on, `guard` removes the directory if we bail out.
        let guard = DirGuard { dir: dir.clone(), keep: keep_dir };
        if keep_dir {
            // Not swept by later runs either.
            std::fs::write(dir.join("KEEP"), b"THEREABOUTS_K8S_KEEP was set\n")?;
        }
        let spawner = Spawner::new()?;

        let [etcd_port, peer_port, apiserver_port] = free_ports::<3>()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = vec![
            "--name=thereabouts-test".to_string(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=thereabouts-test={peer_url}"),
            // Test data: durability is not wanted, speed is.
            "--unsafe-no-fsync".to_string(),
            "--log-level=warn".to_string(),
        ];
        let mut etcd = spawner.spawn("etcd", &bins.etcd, &etcd_args, &dir.join("etcd.log"))?;
        wait_etcd(&mut etcd, etcd_port)?;

        // Identities and keys.
        let admin_token = random_token()?;
        let plugin_token = random_token()?;
        let (sa_ns, sa_name) = PLUGIN_SERVICE_ACCOUNT;
        let tokens = format!(
            "{admin_token},{ADMIN_USER},thereabouts-admin-uid,\"system:masters\"\n\
             {plugin_token},system:serviceaccount:{sa_ns}:{sa_name},thereabouts-plugin-uid,\"system:serviceaccounts,system:serviceaccounts:{sa_ns}\"\n"
        );
        write_private(&dir.join("tokens.csv"), tokens.as_bytes())?;
        // Service-account token signing key (required flags, unused by the tests):
        // ECDSA P-256, PKCS#8 private key + SPKI public key. (The apiserver does not
        // accept a PKCS#8 private key for --service-account-key-file.)
        let sa_key = rcgen::KeyPair::generate().context("generating the service-account key")?;
        write_private(&dir.join("sa.key"), sa_key.serialize_pem().as_bytes())?;
        write_private(&dir.join("sa.pub"), sa_key.public_key_pem().as_bytes())?;

        std::fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY).context("writing the audit policy")?;
        let cert_dir = dir.join("certs");
        let mut apiserver_args = vec![
            // Who wrote the pools, reservations and Leases, and when (`Cluster::audit_writes`).
            format!("--audit-policy-file={}", dir.join("audit-policy.yaml").display()),
            format!("--audit-log-path={}", dir.join("audit.log").display()),
            "--audit-log-format=json".to_string(),
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_string(),
            "--advertise-address=127.0.0.1".to_string(),
            format!("--secure-port={apiserver_port}"),
            // No --tls-cert-file: the apiserver self-signs into --cert-dir
            // (apiserver.crt = serving certificate + the CA that signed it).
            format!("--cert-dir={}", cert_dir.display()),
            format!("--token-auth-file={}", dir.join("tokens.csv").display()),
            "--authorization-mode=RBAC".to_string(),
            "--service-cluster-ip-range=10.0.0.0/24".to_string(),
            "--allow-privileged=true".to_string(),
            format!("--service-account-issuer=https://127.0.0.1:{apiserver_port}/"),
            format!("--service-account-key-file={}", dir.join("sa.pub").display()),
            format!("--service-account-signing-key-file={}", dir.join("sa.key").display()),
            // `/debug/pprof` for the benches' profiles (`THEREABOUTS_APISERVER_PROFILING=1`).
            format!("--profiling={}", std::env::var_os(PROFILING_ENV).is_some()),
        ];
        if !service_accounts {
            // No controller-manager runs, so nothing would create default ServiceAccounts.
            apiserver_args.push("--disable-admission-plugins=ServiceAccount".to_string());
        }
        let apiserver = spawner.spawn("kube-apiserver", &bins.kube_apiserver, &apiserver_args, &dir.join("kube-apiserver.log"))?;

        let cluster = Cluster {
            apiserver: Mutex::new(Some(apiserver)),
            etcd: Mutex::new(Some(etcd)),
            spawner,
            bins: bins.clone(),
            dir,
            keep_dir,
            apiserver_args,
            apiserver_port,
            etcd_url,
            admin_token,
            plugin_token,
        };
        std::mem::forget(guard); // the Cluster's Drop owns the directory now
        cluster.wait_apiserver_ready(true)?;
        Ok(cluster)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.apiserver_port)
    }

    /// `http://127.0.0.1:<port>` of etcd (plain HTTP, no auth).
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The private temp dir (logs: `etcd.log`, `kube-apiserver.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn binaries(&self) -> &Binaries {
        &self.bins
    }

    /// PEM bundle the kubeconfigs trust (serving certificate and its CA).
    pub fn ca_pem(&self) -> Result<Vec<u8>> {
        let path = self.dir.join("certs/apiserver.crt");
        std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    pub fn plugin_token(&self) -> &str {
        &self.plugin_token
    }

    /// Flat kubeconfig for the admin identity (context namespace `kube-system`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// Flat kubeconfig for the plugin identity (context namespace `kube-system`).
    pub fn plugin_kubeconfig(&self) -> PathBuf {
        self.dir.join("plugin.kubeconfig")
    }

    /// Pids of the running control-plane processes (apiserver, etcd), for tests
    /// that check the teardown.
    pub fn pids(&self) -> Vec<u32> {
        let mut v = Vec::new();
        for p in [&self.apiserver, &self.etcd] {
            if let Some(p) = lock(p).as_ref() {
                v.push(p.pid());
            }
        }
        v
    }

    /// A client for the admin identity, built from the admin kubeconfig file.
    /// Call inside a tokio runtime.
    pub async fn admin_client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.admin_kubeconfig()).await
    }

    /// A client for the plugin identity, built from the plugin kubeconfig file.
    /// Call inside a tokio runtime.
    pub async fn plugin_client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.plugin_kubeconfig()).await
    }

    /// Server-side-applies every document of `yaml` (a `---`-separated stream of
    /// objects of any kind known to the apiserver) as admin; namespaced objects
    /// without a namespace go to `kube-system`. CRDs are waited for until
    /// Established. Returns the applied objects.
    pub async fn apply_yaml(&self, yaml: &str) -> Result<Vec<kube::api::DynamicObject>> {
        let client = self.admin_client().await?;
        apply_yaml(&client, yaml, NAMESPACE).await
    }

    /// [`Cluster::apply_yaml`] for a file, or every `*.yaml`/`*.yml`/`*.json` file
    /// of a directory (sorted by name).
    pub async fn apply_path(&self, path: &Path) -> Result<Vec<kube::api::DynamicObject>> {
        let mut files = Vec::new();
        if path.is_dir() {
            for e in std::fs::read_dir(path).with_context(|| format!("reading {}", path.display()))? {
                let p = e?.path();
                if p.extension().is_some_and(|x| x == "yaml" || x == "yml" || x == "json") {
                    files.push(p);
                }
            }
            files.sort();
        } else {
            files.push(path.to_path_buf());
        }
        let mut out = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
            out.extend(self.apply_yaml(&text).await.with_context(|| format!("applying {}", f.display()))?);
        }
        Ok(out)
    }

    /// Applies the project's CRDs (`deploy/crds/`) and waits until they are Established.
    pub async fn install_crds(&self) -> Result<()> {
        self.apply_path(&crds_dir()).await.map(|_| ())
    }

    /// Applies `deploy/rbac.yaml`: the ServiceAccounts and the least-privilege
    /// roles and bindings. The harness itself grants the plugin identity nothing,
    /// so after this call it has exactly the rights a cluster installed from
    /// `deploy/` gives it. Returns once the plugin identity is allowed to read
    /// IPPools in [`NAMESPACE`] (the authorizer's caches catch up in the background).
    pub async fn install_rbac(&self) -> Result<()> {
        self.apply_path(&deploy_dir().join("rbac.yaml")).await?;
        self.wait_plugin_allowed("get", "whereabouts.cni.cncf.io", "ippools", NAMESPACE).await
    }

    /// Applies `deploy/rbac-pod-labels.yaml`, the opt-in for policies that read
    /// a pod's labels or annotations: `get` on pods for the plugin identity.
    /// Returns once the plugin identity may get pods in `namespace`.
    pub async fn install_pod_labels_rbac(&self, namespace: &str) -> Result<()> {
        self.apply_path(&deploy_dir().join("rbac-pod-labels.yaml")).await?;
        self.wait_plugin_allowed("get", "", "pods", namespace).await
    }

    /// Applies `deploy/flowcontrol.yaml`: the plugin's IPPool writes queue in a
    /// priority level of their own (API Priority and Fairness) instead of
    /// thrashing inside the apiserver. Takes effect once the apiserver's
    /// flow-control controller has seen the objects: a moment after.
    pub async fn install_flowcontrol(&self) -> Result<()> {
        self.apply_path(&deploy_dir().join("flowcontrol.yaml")).await?;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        Ok(())
    }

    /// Waits until a SubjectAccessReview says the plugin identity may `verb` the
    /// `resource` of `group` in `namespace` (RBAC objects take effect a moment
    /// after they are written).
    pub async fn wait_plugin_allowed(&self, verb: &str, group: &str, resource: &str, namespace: &str) -> Result<()> {
        use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
        let (sa_ns, sa_name) = PLUGIN_SERVICE_ACCOUNT;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(format!("system:serviceaccount:{sa_ns}:{sa_name}")),
                groups: Some(vec!["system:serviceaccounts".to_string(), format!("system:serviceaccounts:{sa_ns}"), "system:authenticated".to_string()]),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_string()),
                    group: Some(group.to_string()),
                    resource: Some(resource.to_string()),
                    namespace: Some(namespace.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.admin_client().await?);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = api.create(&Default::default(), &review).await?;
            if answer.status.is_some_and(|s| s.allowed) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the plugin identity is still not allowed to {verb} {resource} in {namespace}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Kills kube-apiserver (SIGKILL, like a crash); etcd keeps running.
    pub fn stop_apiserver(&self) {
        if let Some(mut p) = lock(&self.apiserver).take() {
            p.kill();
        }
    }

    /// Starts kube-apiserver again (same port, certificates, tokens and data) and
    /// waits for readiness. No-op wait if it is already running.
    pub fn start_apiserver(&self) -> Result<()> {
        {
            let mut slot = lock(&self.apiserver);
            if slot.is_none() {
                let p = self.spawner.spawn("kube-apiserver", &self.bins.kube_apiserver, &self.apiserver_args, &self.dir.join("kube-apiserver.log"))?;
                *slot = Some(p);
            }
        }
        self.wait_apiserver_ready(false)
    }

    fn wait_apiserver_ready(&self, first_start: bool) -> Result<()> {
        let deadline = Instant::now() + APISERVER_READY_TIMEOUT;
        // The CA only exists once the apiserver has written its certificates.
        let crt = self.dir.join("certs/apiserver.crt");
        while !self_signed_pair_written(&std::fs::read(&crt).unwrap_or_default()) {
            self.check_running()?;
            if Instant::now() > deadline {
                bail!("kube-apiserver wrote no certificate within {APISERVER_READY_TIMEOUT:?}{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if first_start {
            self.write_kubeconfigs()?;
        }
        let kubeconfig = self.admin_kubeconfig();
        let result = block_on(async {
            // One client: connection errors (apiserver not listening yet) are retried.
            let client = client_from_kubeconfig(&kubeconfig).await?;
            let mut last;
            loop {
                self.check_running()?;
                match get_text(&client, "/readyz").await {
                    Ok(_) => break,
                    Err(e) => last = format!("{e:#}"),
                }
                if Instant::now() > deadline {
                    bail!("kube-apiserver not ready within {APISERVER_READY_TIMEOUT:?}: {last}");
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            // /readyz does not wait for the system namespaces; tests write to kube-system.
            for ns in ["default", NAMESPACE] {
                loop {
                    match get_text(&client, &format!("/api/v1/namespaces/{ns}")).await {
                        Ok(_) => break,
                        Err(e) if Instant::now() > deadline => {
                            bail!("namespace {ns} was not created within {APISERVER_READY_TIMEOUT:?}: {e:#}")
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
            }
            Ok(())
        });
        result.map_err(|e| anyhow!("{e:#}{}", self.logs()))
    }

    fn check_running(&self) -> Result<()> {
        for p in [&self.etcd, &self.apiserver] {
            if let Some(p) = lock(p).as_mut()
                && let Some(status) = p.exited()
            {
                bail!("{} exited ({status}); last log lines:\n{}", p.name, p.log_tail(40));
            }
        }
        Ok(())
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for name in ["etcd.log", "kube-apiserver.log"] {
            s.push_str(&format!("\n--- last lines of {} ---\n{}", name, process::log_tail(&self.dir.join(name), 25)));
        }
        s
    }

    fn write_kubeconfigs(&self) -> Result<()> {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem()?);
        let (sa_ns, sa_name) = PLUGIN_SERVICE_ACCOUNT;
        for (file, user, token) in
            [(self.admin_kubeconfig(), "thereabouts-admin", &self.admin_token), (self.plugin_kubeconfig(), "thereabouts-plugin", &self.plugin_token)]
        {
            let doc = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "thereabouts-test", "cluster": {
                    "server": self.server_url(),
                    "certificate-authority-data": ca,
                }}],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": user, "context": {
                    "cluster": "thereabouts-test",
                    "user": user,
                    "namespace": NAMESPACE,
                }}],
                "current-context": user,
                "preferences": {},
            });
            let mut text = format!("# kubeconfig of a thereabouts test cluster ({user}; plugin = ServiceAccount {sa_ns}/{sa_name})\n");
            text.push_str(&serde_yaml_ng::to_string(&doc)?);
            write_private(&file, text.as_bytes())?;
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut p) = lock(&self.apiserver).take() {
            p.kill();
        }
        if let Some(mut p) = lock(&self.etcd).take() {
            p.kill();
        }
        if self.keep_dir {
            eprintln!("k8s-harness: keeping {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `deploy/` of this repository (CRDs, RBAC, DaemonSet, installer).
/// Writes to the whereabouts kinds and to Leases, at the Metadata level (who,
/// what, when, the answer), once each, when answered; nothing else.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete"]
    resources:
      - group: "whereabouts.cni.cncf.io"
      - group: "coordination.k8s.io"
        resources: ["leases"]
  - level: None
"#;

/// One write the apiserver's audit log recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditedWrite {
    pub user_agent: String,
    pub verb: String,
    /// `resource/name`.
    pub object: String,
    /// When the apiserver received it and answered it, Unix microseconds.
    pub received_us: i64,
    pub answered_us: i64,
    pub code: u16,
}

impl Cluster {
    /// Every write the audit log holds so far, in the order answered.
    pub fn audit_writes(&self) -> Result<Vec<AuditedWrite>> {
        let text = std::fs::read_to_string(self.dir.join("audit.log")).unwrap_or_default();
        let micros = |v: &serde_json::Value| v.as_str().and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok()).map_or(0, |t| t.as_microsecond());
        Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|e| AuditedWrite {
                user_agent: e["userAgent"].as_str().unwrap_or_default().to_string(),
                verb: e["verb"].as_str().unwrap_or_default().to_string(),
                object: format!("{}/{}", e["objectRef"]["resource"].as_str().unwrap_or_default(), e["objectRef"]["name"].as_str().unwrap_or_default()),
                received_us: micros(&e["requestReceivedTimestamp"]),
                answered_us: micros(&e["stageTimestamp"]),
                code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            })
            .collect())
    }
}

pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// `deploy/crds/` of this repository, or `$THEREABOUTS_CRDS_DIR`.
pub fn crds_dir() -> PathBuf {
    std::env::var_os(CRDS_DIR_ENV).map(PathBuf::from).unwrap_or_else(|| deploy_dir().join("crds"))
}

/// Overrides [`crds_dir`] (benchmarks compare this project's CRDs with whereabouts' own).
pub const CRDS_DIR_ENV: &str = "THEREABOUTS_CRDS_DIR";

/// Set (to anything): the apiserver serves `/debug/pprof` (to `system:masters`).
pub const PROFILING_ENV: &str = "THEREABOUTS_APISERVER_PROFILING";

pub(crate) async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.with_context(|| format!("loading {}", path.display()))?;
    kube::Client::try_from(config).context("building a client")
}

pub(crate) async fn get_text(client: &kube::Client, path: &str) -> Result<String> {
    let req = http::Request::get(path).body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

/// Runs a future to completion on a private current-thread runtime on a scoped
/// thread, so blocking callers work both inside and outside a tokio runtime
/// (the sync tests and the benchmarks drive the async API with it). A panic
/// of the future is raised again in the caller, with its message.
pub fn block_on<F>(fut: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        match s.spawn(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("building a tokio runtime").block_on(fut)).join() {
            Ok(out) => out,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Polls `done` every `poll` until it answers true; panics naming `what`
/// when that takes longer than `limit`.
#[track_caller]
pub fn wait_until(what: &str, limit: Duration, poll: Duration, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < end, "timed out waiting until {what}");
        std::thread::sleep(poll);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn wait_etcd(etcd: &mut Proc, port: u16) -> Result<()> {
    let deadline = Instant::now() + ETCD_READY_TIMEOUT;
    let mut last;
    loop {
        if let Some(status) = etcd.exited() {
            bail!("etcd exited ({status}); last log lines:\n{}", etcd.log_tail(40));
        }
        match http_get_plain(port, "/health") {
            Ok(body) if body.contains("\"health\":\"true\"") => return Ok(()),
            Ok(body) => last = body,
            Err(e) => last = e.to_string(),
        }
        if Instant::now() > deadline {
            bail!("etcd not healthy within {ETCD_READY_TIMEOUT:?}: {last}\n{}", etcd.log_tail(40));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Minimal HTTP/1.0 GET over loopback (etcd's client URL is plain HTTP).
fn http_get_plain(port: u16, path: &str) -> std::io::Result<String> {
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    Ok(buf)
}

/// Whether the apiserver's self-signed `apiserver.crt` is complete: its serving
/// certificate and then its CA. The file exists, empty, between its creation and
/// the write; a kubeconfig made from it then trusts no CA, and every request
/// fails with "UnknownIssuer" until the start gives up (seen in a CI run).
fn self_signed_pair_written(crt: &[u8]) -> bool {
    String::from_utf8_lossy(crt).matches("-----END CERTIFICATE-----").count() >= 2
}

pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N]> {
    // Hold all listeners at once so the N ports are distinct.
    let listeners: Vec<TcpListener> = (0..N).map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0))).collect::<std::io::Result<_>>()?;
    let mut ports = [0u16; N];
    for (p, l) in ports.iter_mut().zip(&listeners) {
        *p = l.local_addr()?.port();
    }
    Ok(ports)
}

fn random_token() -> Result<String> {
    let mut b = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f =
        std::fs::File::options().write(true).create(true).truncate(true).mode(0o600).open(path).with_context(|| format!("writing {}", path.display()))?;
    f.write_all(data)?;
    Ok(())
}

fn make_temp_dir() -> Result<PathBuf> {
    let base = std::env::temp_dir();
    for _ in 0..16 {
        let suffix = random_token()?;
        let dir = base.join(format!("{TEMP_PREFIX}{}-{}", std::process::id(), &suffix[..8]));
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    bail!("could not create a temp dir under {}", base.display())
}

/// Removes temp dirs left by test processes that died without unwinding (their
/// control planes were already killed by the parent-death signal).
fn sweep_orphans() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TEMP_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !pid_alive(pid) && !e.path().join("KEEP").exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

struct DirGuard {
    dir: PathBuf,
    keep: bool,
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::self_signed_pair_written;

    #[test]
    fn a_certificate_file_counts_once_it_holds_the_certificate_and_its_ca() {
        let block = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        assert!(!self_signed_pair_written(b""), "created, not yet written");
        assert!(!self_signed_pair_written(block.as_bytes()), "the serving certificate without its CA");
        assert!(self_signed_pair_written(format!("{block}{block}").as_bytes()));
    }
}
