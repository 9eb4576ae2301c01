//! A real etcd on its own (for the etcd datastore's tests): the binary of
//! `tests/k8s-bins/build.sh`, on free loopback ports in a private temp dir,
//! either plain (HTTP, no auth) or secured: TLS with a CA, serving and client
//! certificates generated here (client certificates required), and etcd
//! authentication on, with `root` and a plugin user whose role may only read and
//! write keys under [`PLUGIN_PREFIX`].
//!
//! Dropped = killed (process group) and its directory removed; a test process
//! that dies without unwinding takes etcd with it (parent-death signal), and the
//! next start sweeps the directory (same temp prefix as [`crate::Cluster`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use etcd_client::{Certificate, Client, ConnectOptions, GetOptions, Identity, Permission, TlsOptions};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use crate::held::{PoolEntry, entries_by_address};
use crate::process::{Proc, Spawner};
use crate::{DirGuard, binaries, block_on, free_ports, http_get_plain, lock, make_temp_dir, random_token, sweep_orphans, write_private};

/// The prefix the plugin user of a secured etcd may use (the datastore's default).
pub const PLUGIN_PREFIX: &str = "/thereabouts/";
/// The plugin user of a secured etcd.
pub const PLUGIN_USER: &str = "thereabouts";
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A network config `name` whose `ipam` uses the etcd datastore at `access`
/// (user, password and certificate files when it has them) for `ranges`.
pub fn etcd_conf(access: &Access, name: &str, ranges: &[&str]) -> serde_json::Value {
    use serde_json::json;
    let mut ipam = json!({
        "type": "thereabouts",
        "datastore": "etcd",
        "etcd_host": access.endpoint,
        "ipRanges": ranges.iter().map(|r| json!({"range": r})).collect::<Vec<_>>(),
    });
    if let Some((user, password)) = &access.user {
        ipam["etcd_username"] = json!(user);
        ipam["etcd_password"] = json!(password);
    }
    if let Some((ca, cert, key)) = &access.tls {
        ipam["etcd_ca_cert_file"] = json!(ca);
        ipam["etcd_cert_file"] = json!(cert);
        ipam["etcd_key_file"] = json!(key);
    }
    json!({"cniVersion": "1.1.0", "name": name, "type": "thab-etcd", "ipam": ipam})
}

/// How to reach and log in to the etcd, as the plugin's config says it.
#[derive(Debug, Clone)]
pub struct Access {
    /// `http://127.0.0.1:<port>` or `https://...`.
    pub endpoint: String,
    /// (user, password) of the plugin user, when auth is on.
    pub user: Option<(String, String)>,
    /// (CA, client certificate, client key) files, when TLS is on.
    pub tls: Option<(PathBuf, PathBuf, PathBuf)>,
}

pub struct Etcd {
    // Field order matters for Drop: the process first, then the spawner thread.
    process: Mutex<Option<Proc>>,
    spawner: Spawner,
    /// The command line, to start etcd again on the same data ([`Etcd::restart`]).
    bin: PathBuf,
    args: Vec<String>,
    /// Plain HTTP `/health` and `/metrics`, whatever the client side speaks.
    metrics_port: u16,
    dir: PathBuf,
    access: Access,
    root_password: Option<String>,
}

impl Etcd {
    /// Plain etcd: HTTP, no auth.
    pub fn start_plain() -> Result<Etcd> {
        Self::start(false)
    }

    /// TLS (client certificates required) and authentication (root + plugin user).
    pub fn start_secured() -> Result<Etcd> {
        Self::start(true)
    }

    fn start(secured: bool) -> Result<Etcd> {
        sweep_orphans();
        let bins = binaries()?;
        let dir = make_temp_dir()?;
        let guard = DirGuard { dir: dir.clone(), keep: false };
        let spawner = Spawner::new()?;
        let [client_port, peer_port, metrics_port] = free_ports::<3>()?;
        let scheme = if secured { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut args = vec![
            "--name=thereabouts-etcd-test".to_string(),
            format!("--data-dir={}", dir.join("data").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=thereabouts-etcd-test={peer_url}"),
            // Plain HTTP /health for readiness, whatever the client side speaks.
            format!("--listen-metrics-urls=http://127.0.0.1:{metrics_port}"),
            "--unsafe-no-fsync".to_string(),
            "--log-level=warn".to_string(),
        ];
        let tls = if secured {
            let files = write_certificates(&dir)?;
            args.extend([
                format!("--cert-file={}", files.server_cert.display()),
                format!("--key-file={}", files.server_key.display()),
                format!("--trusted-ca-file={}", files.ca.display()),
                "--client-cert-auth=true".to_string(),
            ]);
            Some(files)
        } else {
            None
        };
        let mut process = spawner.spawn("etcd", &bins.etcd, &args, &dir.join("etcd.log"))?;
        wait_healthy(&mut process, metrics_port)?;
        let mut etcd = Etcd {
            process: Mutex::new(Some(process)),
            spawner,
            bin: bins.etcd.clone(),
            args,
            metrics_port,
            dir: dir.clone(),
            access: Access { endpoint: client_url, user: None, tls: tls.as_ref().map(|f| (f.ca.clone(), f.client_cert.clone(), f.client_key.clone())) },
            root_password: None,
        };
        std::mem::forget(guard); // Etcd's Drop owns the directory now
        if secured {
            let root_password = random_token()?;
            let plugin_password = random_token()?;
            etcd.enable_auth(&root_password, &plugin_password)?;
            etcd.root_password = Some(root_password);
            etcd.access.user = Some((PLUGIN_USER.to_string(), plugin_password));
        }
        eprintln!("etcd-harness: {} ready (dir {})", etcd.access.endpoint, etcd.dir.display());
        Ok(etcd)
    }

    /// Root and the plugin user (role: read and write under [`PLUGIN_PREFIX`]), then auth on.
    fn enable_auth(&self, root_password: &str, plugin_password: &str) -> Result<()> {
        block_on(async {
            let mut c = self.connect(None).await?;
            c.user_add("root", root_password, None).await.context("adding user root")?;
            c.role_add("root").await.context("adding role root")?;
            c.user_grant_role("root", "root").await.context("granting root")?;
            c.role_add(PLUGIN_USER).await.context("adding the plugin role")?;
            c.role_grant_permission(PLUGIN_USER, Permission::read_write(PLUGIN_PREFIX).with_prefix()).await.context("granting the plugin role its prefix")?;
            c.user_add(PLUGIN_USER, plugin_password, None).await.context("adding the plugin user")?;
            c.user_grant_role(PLUGIN_USER, PLUGIN_USER).await.context("granting the plugin user its role")?;
            c.auth_enable().await.context("enabling auth")?;
            Ok(())
        })
    }

    /// A client as `user` (None: no auth), with the client certificate when TLS is on.
    async fn connect(&self, user: Option<(&str, &str)>) -> Result<Client> {
        let mut options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(5)).with_timeout(Duration::from_secs(10));
        if let Some((ca, cert, key)) = &self.access.tls {
            let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
            options =
                options.with_tls(TlsOptions::new().ca_certificate(Certificate::from_pem(read(ca)?)).identity(Identity::from_pem(read(cert)?, read(key)?)));
        }
        if let Some((name, password)) = user {
            options = options.with_user(name, password);
        }
        Client::connect([self.access.endpoint.as_str()], Some(options)).await.context("connecting to etcd")
    }

    /// A client with every right (root when auth is on).
    async fn admin(&self) -> Result<Client> {
        self.connect(self.root_password.as_deref().map(|p| ("root", p))).await
    }

    pub fn access(&self) -> &Access {
        &self.access
    }

    pub fn endpoint(&self) -> &str {
        &self.access.endpoint
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The name of the directory the etcd binary is in (the versions built by
    /// tests/k8s-bins, e.g. `k8s-v1.36.3_etcd-v3.6.16`), for reports.
    pub fn binary_dir_name(&self) -> String {
        self.bin.parent().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        lock(&self.process).as_ref().map(Proc::pid)
    }

    /// Kills etcd (SIGKILL, like a crash) and waits until it is gone; the data
    /// directory stays. Idempotent.
    pub fn kill(&self) {
        if let Some(mut p) = lock(&self.process).take() {
            p.kill();
        }
    }

    /// Starts etcd again on the same data, ports, certificates and users, and
    /// waits until it is healthy. No-op (but the wait) if it is running.
    pub fn restart(&self) -> Result<()> {
        let mut slot = lock(&self.process);
        if slot.is_none() {
            *slot = Some(self.spawner.spawn("etcd", &self.bin, &self.args, &self.dir.join("etcd.log"))?);
        }
        let process = slot.as_mut().context("etcd process")?;
        wait_healthy(process, self.metrics_port)
    }

    /// The Prometheus text of etcd's `/metrics` (gRPC requests handled, MVCC operations).
    pub fn metrics(&self) -> Result<String> {
        let response = http_get_plain(self.metrics_port, "/metrics").context("GET /metrics of etcd")?;
        match response.split_once("\r\n\r\n") {
            Some((head, body)) if head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
            _ => bail!("etcd /metrics: {}", response.lines().next().unwrap_or_default()),
        }
    }

    /// Every key under `prefix` with its value (as text), in key order, read as admin.
    pub fn dump(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        block_on(async {
            let mut c = self.admin().await?;
            let response = c.get(prefix, Some(GetOptions::new().with_prefix())).await.context("reading keys")?;
            Ok(response.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), String::from_utf8_lossy(kv.value()).into_owned())).collect())
        })
    }

    /// One key's value and mod_revision, read as admin.
    pub fn get(&self, key: &str) -> Result<Option<(String, i64)>> {
        block_on(async {
            let mut c = self.admin().await?;
            let response = c.get(key, None).await.context("reading a key")?;
            Ok(response.kvs().first().map(|kv| (String::from_utf8_lossy(kv.value()).into_owned(), kv.mod_revision())))
        })
    }

    /// Writes a key as admin (test set-up: a reservation someone else holds, junk).
    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        block_on(async {
            let mut c = self.admin().await?;
            c.put(key, value, None).await.context("writing a key")?;
            Ok(())
        })
    }

    /// Deletes every key under `prefix` as admin.
    pub fn clear(&self, prefix: &str) -> Result<()> {
        block_on(async {
            let mut c = self.admin().await?;
            c.delete(prefix, Some(etcd_client::DeleteOptions::new().with_prefix())).await.context("deleting keys")?;
            Ok(())
        })
    }
}

/// What the tests read back from the keys the plugin writes under a prefix.
impl Etcd {
    /// The entries of pool key `<prefix>pools/<pool>` (of `range`) by address;
    /// empty when the key is absent.
    pub fn pool_entries(&self, prefix: &str, pool: &str, range: &str) -> Result<BTreeMap<IpAddr, PoolEntry>> {
        let key = format!("{prefix}pools/{pool}");
        match self.get(&key)? {
            Some((text, _)) => pool_key_entries(&key, &text, pool, range),
            None => Ok(BTreeMap::new()),
        }
    }

    /// The reservation keys `<prefix>reservations/<name>`: their values by name.
    pub fn reservations(&self, prefix: &str) -> Result<BTreeMap<String, serde_json::Value>> {
        let under = format!("{prefix}reservations/");
        reservation_keys(&under, self.dump(&under)?)
    }
}

/// The entries of the pool key `key` (of `pool`, `range`) whose value is
/// `text`, by address: what the plugin wrote there.
pub(crate) fn pool_key_entries(key: &str, text: &str, pool: &str, range: &str) -> Result<BTreeMap<IpAddr, PoolEntry>> {
    let value: serde_json::Value = serde_json::from_str(text).with_context(|| format!("{key} is no JSON: {text}"))?;
    let allocations = value["allocations"].as_object().with_context(|| format!("{key} has no allocations: {text}"))?;
    entries_by_address(pool, range, allocations.clone().into_iter().collect())
}

/// The reservation keys among `keys` (all under `under`): their values by name.
pub(crate) fn reservation_keys(under: &str, keys: Vec<(String, String)>) -> Result<BTreeMap<String, serde_json::Value>> {
    keys.into_iter()
        .map(|(key, text)| {
            let value = serde_json::from_str(&text).with_context(|| format!("{key} is no JSON: {text}"))?;
            Ok((key[under.len()..].to_string(), value))
        })
        .collect()
}

/// The gRPC requests etcd handled (`grpc_server_handled_total` of its
/// `/metrics`), by method and answer code: every request that reached it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GrpcCounts(pub BTreeMap<(String, String), f64>);

impl GrpcCounts {
    pub fn parse(metrics: &str) -> GrpcCounts {
        let mut counts = BTreeMap::new();
        for line in metrics.lines() {
            let Some(rest) = line.strip_prefix("grpc_server_handled_total{") else { continue };
            let Some((labels, value)) = rest.rsplit_once("} ") else { continue };
            let Ok(value) = value.trim().parse::<f64>() else { continue };
            let label = |name: &str| {
                labels.split(',').find_map(|kv| kv.strip_prefix(&format!("{name}=\""))).map(|v| v.trim_end_matches('"').to_string()).unwrap_or_default()
            };
            *counts.entry((label("grpc_method"), label("grpc_code"))).or_insert(0.0) += value;
        }
        GrpcCounts(counts)
    }

    /// The counts of `self` minus those of `before` (an earlier scrape).
    pub fn since(&self, before: &GrpcCounts) -> GrpcCounts {
        GrpcCounts(self.0.iter().map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0.0))).filter(|(_, v)| *v > 0.0).collect())
    }

    pub fn add(&mut self, other: &GrpcCounts) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_insert(0.0) += v;
        }
    }

    /// Requests that carry data: KV (Range, Txn, Put, ...) and Authenticate,
    /// not the health checks and watches of etcd's own clients.
    pub fn total(&self) -> f64 {
        self.0.iter().filter(|((method, _), _)| is_data_method(method)).map(|(_, v)| v).fold(0.0, |a, b| a + b)
    }

    /// `Method code` → count, data requests only.
    pub fn lines(&self) -> Vec<(String, f64)> {
        self.0.iter().filter(|((method, _), _)| is_data_method(method)).map(|((method, code), v)| (format!("{method} {code}"), *v)).collect()
    }
}

fn is_data_method(method: &str) -> bool {
    matches!(method, "Range" | "Txn" | "Put" | "DeleteRange" | "Compact" | "Authenticate")
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut p) = lock(&self.process).take() {
            p.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct CertFiles {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

/// A CA, a serving certificate for 127.0.0.1 and a client certificate, as PEM files.
fn write_certificates(dir: &Path) -> Result<CertFiles> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "thereabouts etcd test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca = Issuer::new(ca_params, ca_key);

    let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| -> Result<(String, String)> {
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        Ok((params.signed_by(&key, &ca)?.pem(), key.serialize_pem()))
    };
    let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()], "thereabouts-etcd", ExtendedKeyUsagePurpose::ServerAuth)?;
    // Not a user name: etcd would take a client certificate's CN as the user
    // when a request carries no token.
    let (client_cert, client_key) = leaf(Vec::new(), "thereabouts-etcd-client", ExtendedKeyUsagePurpose::ClientAuth)?;
    let files = CertFiles {
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server-key.pem"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client-key.pem"),
    };
    write_private(&files.ca, ca_cert.pem().as_bytes())?;
    write_private(&files.server_cert, server_cert.as_bytes())?;
    write_private(&files.server_key, server_key.as_bytes())?;
    write_private(&files.client_cert, client_cert.as_bytes())?;
    write_private(&files.client_key, client_key.as_bytes())?;
    Ok(files)
}

pub(crate) fn wait_healthy(etcd: &mut Proc, metrics_port: u16) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = etcd.exited() {
            bail!("etcd exited ({status}); last log lines:\n{}", etcd.log_tail(40));
        }
        let last = match http_get_plain(metrics_port, "/health") {
            Ok(body) if body.contains("\"health\":\"true\"") => return Ok(()),
            Ok(body) => body,
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            bail!("etcd not healthy within {READY_TIMEOUT:?}: {last}\n{}", etcd.log_tail(40));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
