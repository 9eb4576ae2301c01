//! Locating the kube-apiserver and etcd binaries.
//!
//! `THEREABOUTS_K8S_BINS=<dir>` (holding `kube-apiserver` and `etcd`) wins;
//! otherwise `tests/k8s-bins/build.sh` is run: it prints the cache directory at
//! once when the binaries are cached, and builds them first when they are not
//! (many minutes on a cold machine). The answer is memoized per test process.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

#[derive(Clone, Debug)]
pub struct Binaries {
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
}

impl Binaries {
    fn in_dir(dir: &Path) -> Result<Self> {
        let b = Binaries { kube_apiserver: dir.join("kube-apiserver"), etcd: dir.join("etcd") };
        for p in [&b.kube_apiserver, &b.etcd] {
            if !p.is_file() {
                bail!("{} is missing", p.display());
            }
        }
        Ok(b)
    }
}

/// The build script, relative to this crate.
pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../k8s-bins/build.sh")
}

/// Finds (or builds) the binaries. Errors name the cause and the remedy.
pub fn binaries() -> Result<Binaries> {
    static FOUND: OnceLock<std::result::Result<Binaries, String>> = OnceLock::new();
    FOUND.get_or_init(|| find().map_err(|e| format!("{e:#}"))).clone().map_err(anyhow::Error::msg)
}

fn find() -> Result<Binaries> {
    if let Some(dir) = std::env::var_os("THEREABOUTS_K8S_BINS") {
        return Binaries::in_dir(Path::new(&dir)).context("THEREABOUTS_K8S_BINS");
    }
    let script = build_script();
    // stderr is inherited: a cold build shows its progress in the test output.
    let out =
        Command::new("bash").arg(&script).stdin(Stdio::null()).stderr(Stdio::inherit()).output().with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({}); the Kubernetes tests need Go >= 1.26 and the Go module proxy to build kube-apiserver and etcd", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout.lines().last().unwrap_or("").trim();
    if dir.is_empty() {
        bail!("{} printed no directory", script.display());
    }
    Binaries::in_dir(Path::new(dir)).with_context(|| format!("output of {}", script.display()))
}
