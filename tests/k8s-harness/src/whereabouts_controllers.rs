//! whereabouts v0.9.4's own controllers, `ip-control-loop` (its pod-delete
//! cleanup, a DaemonSet pod per node) and `ip-reconciler` (its cron reconciler
//! Deployment), running beside thereabouts during a migration.
//!
//! Both read fixed paths of a pod: the in-cluster ServiceAccount files
//! (`/var/run/secrets/kubernetes.io/serviceaccount/`), the flat file
//! (`/etc/cni/net.d/whereabouts.d/whereabouts.conf`, under `/host` for the
//! control loop) and the reconciler's schedule (`/cron-schedule/config`). Each
//! runs in a chroot under the test's directory holding exactly those files, so
//! nothing of the machine's own `/etc/cni` or `/var/run` is read or written.
//! The binaries are static Go executables: they need nothing else there.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::Cluster;
use crate::peers::{WHEREABOUTS_SERVICE_ACCOUNT, Whereabouts, WhereaboutsInstall};

/// The reconciler's schedule: every minute (5-field cron, UTC), its shortest.
pub const EVERY_MINUTE: &str = "* * * * *";

/// The two controllers; both are killed on drop.
pub struct WhereaboutsControllers {
    children: Vec<Child>,
    /// Where each writes its stderr: `ip-control-loop.log`, `ip-reconciler.log`.
    pub logs: PathBuf,
}

impl WhereaboutsControllers {
    /// Starts both for node `node`, with the ServiceAccount of `install`,
    /// chrooted under `dir`.
    pub fn start(whereabouts: &Whereabouts, install: &WhereaboutsInstall, cluster: &Cluster, node: &str, dir: &Path) -> Result<Self> {
        Self::spawn(whereabouts, install, cluster, &[("ip-control-loop", node), ("ip-reconciler", node)], dir)
    }

    /// Starts `ip-control-loop` alone, one for each of `nodes` (the pods of
    /// its DaemonSet on those nodes: each handles the deletes of its node's
    /// pods), logging to `ip-control-loop-<node>.log`; no `ip-reconciler`.
    pub fn start_control_loops(whereabouts: &Whereabouts, install: &WhereaboutsInstall, cluster: &Cluster, nodes: &[String], dir: &Path) -> Result<Self> {
        let runs: Vec<(&str, &str)> = nodes.iter().map(|n| ("ip-control-loop", n.as_str())).collect();
        Self::spawn(whereabouts, install, cluster, &runs, dir)
    }

    fn spawn(whereabouts: &Whereabouts, install: &WhereaboutsInstall, cluster: &Cluster, runs: &[(&str, &str)], dir: &Path) -> Result<Self> {
        let root = dir.join("whereabouts-root");
        lay_out(&root, whereabouts, install, cluster)?;
        let port = cluster.server_url().rsplit(':').next().context("the apiserver URL has a port")?.to_string();
        let mut children = Vec::new();
        let several = runs.iter().filter(|(name, _)| *name == "ip-control-loop").count() > 1;
        for &(name, node) in runs {
            let file = if several { format!("{name}-{node}.log") } else { format!("{name}.log") };
            let log = std::fs::File::create(dir.join(file))?;
            let child = Command::new("chroot")
                .arg(&root)
                .arg(format!("/{name}"))
                .args(["-log-level", "debug"])
                .env_clear()
                // For finding chroot itself; the binaries inside need no PATH.
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
                .env("KUBERNETES_SERVICE_PORT", &port)
                .env("NODENAME", node)
                .env("WHEREABOUTS_NAMESPACE", WHEREABOUTS_SERVICE_ACCOUNT.0)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .process_group(0)
                .spawn()
                .with_context(|| format!("starting whereabouts' {name} in a chroot"))?;
            children.push(child);
        }
        Ok(WhereaboutsControllers { children, logs: dir.to_path_buf() })
    }

    /// How many runs `ip-reconciler` has finished without error so far. It says
    /// so on stderr (its own message, the only sign of a run it gives).
    pub fn reconciler_runs(&self) -> usize {
        std::fs::read_to_string(self.logs.join("ip-reconciler.log")).map(|t| t.matches("reconciler run succeeded").count()).unwrap_or(0)
    }

    /// The process IDs, in start order (each `chroot` execs its binary).
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Whether both still run.
    pub fn running(&mut self) -> bool {
        self.children.iter_mut().all(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for WhereaboutsControllers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The files a whereabouts pod would see, and the two binaries.
fn lay_out(root: &Path, whereabouts: &Whereabouts, install: &WhereaboutsInstall, cluster: &Cluster) -> Result<()> {
    let account = root.join("var/run/secrets/kubernetes.io/serviceaccount");
    std::fs::create_dir_all(&account)?;
    std::fs::write(account.join("token"), token_of(&install.kubeconfig)?)?;
    std::fs::write(account.join("ca.crt"), cluster.ca_pem()?)?;
    std::fs::write(account.join("namespace"), WHEREABOUTS_SERVICE_ACCOUNT.0)?;
    // The flat file of whereabouts' installer: the datastore and its kubeconfig
    // (which neither controller reads: both talk to the apiserver in-cluster).
    let flat = json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}}).to_string();
    for base in ["etc/cni/net.d/whereabouts.d", "host/etc/cni/net.d/whereabouts.d"] {
        std::fs::create_dir_all(root.join(base))?;
        std::fs::write(root.join(base).join("whereabouts.conf"), &flat)?;
    }
    std::fs::create_dir_all(root.join("cron-schedule"))?;
    std::fs::write(root.join("cron-schedule/config"), EVERY_MINUTE)?;
    std::fs::create_dir_all(root.join("tmp"))?;
    for (name, bin) in [("ip-control-loop", &whereabouts.ip_control_loop), ("ip-reconciler", &whereabouts.ip_reconciler)] {
        std::fs::copy(bin, root.join(name)).with_context(|| format!("copying {}", bin.display()))?;
    }
    Ok(())
}

/// The bearer token of a kubeconfig written by [`Whereabouts::install`].
fn token_of(kubeconfig: &Path) -> Result<String> {
    let text = std::fs::read_to_string(kubeconfig).with_context(|| format!("reading {}", kubeconfig.display()))?;
    let doc: Value = serde_yaml_ng::from_str(&text)?;
    doc.pointer("/users/0/user/token").and_then(Value::as_str).map(str::to_string).context("the kubeconfig has no token")
}
