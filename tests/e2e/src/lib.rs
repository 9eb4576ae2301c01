//! Helpers shared by the end-to-end tests and the host-local benchmark.
//!
//! Everything here drives the *release* `thereabouts` binary exactly as a container
//! runtime would: `CNI_*` environment variables, the network config on stdin, the result
//! (or a CNI error object) on stdout. Nothing links against the plugin's crates, so the
//! tests see only the standard CNI interface and the on-disk file datastore.

pub mod history;
mod process;

pub use process::{CALL_TIMEOUT, Call, Invocation, Outcome, k8s_args};

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// Path of the shipped `thereabouts` binary (the static build of
/// scripts/build-plugin.sh): `$THEREABOUTS_BIN`, else
/// `$CARGO_TARGET_DIR/plugin/thereabouts`, else `<workspace>/target/plugin/thereabouts`.
/// Panics with a clear message when it is missing or does not answer `CNI_COMMAND=VERSION`.
pub fn thereabouts_bin() -> PathBuf {
    let path = if let Some(p) = std::env::var_os("THEREABOUTS_BIN") {
        PathBuf::from(p)
    } else if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        PathBuf::from(t).join("plugin/thereabouts")
    } else {
        workspace_root().join("target/plugin/thereabouts")
    };
    assert!(path.is_file(), "plugin binary {} not found: run `bash scripts/build-plugin.sh` first (or set THEREABOUTS_BIN)", path.display());
    let out = Command::new(&path).env_clear().env("CNI_COMMAND", "VERSION").stdin(Stdio::null()).output().expect("exec thereabouts VERSION");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(
        out.status.success() && v.get("supportedVersions").is_some(),
        "{} does not answer CNI_COMMAND=VERSION with supportedVersions (exit {:?}, stdout {:?}, stderr {:?})",
        path.display(),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// `target/policies/<name>.wasm`, the example policies, built by
/// scripts/build-policies.sh once per process.
pub fn built_policy(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let out = Command::new("bash").arg(workspace_root().join("scripts/build-policies.sh")).arg("-q").output().expect("running scripts/build-policies.sh");
        assert!(out.status.success(), "building the policies: {}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    });
    dir.join(format!("{name}.wasm"))
}

/// Precompiles `policy` into the root-owned `cache` with the shipped
/// plugin's `thereabouts policy compile` (the compiler beside it).
pub fn compile_policy(policy: &Path, cache: &Path) {
    let ran = Command::new(thereabouts_bin())
        .args(["policy", "compile"])
        .arg(policy)
        .arg("--cache")
        .arg(cache)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("thereabouts policy compile");
    assert!(ran.status.success(), "compiling {}: {}{}", policy.display(), String::from_utf8_lossy(&ran.stdout), String::from_utf8_lossy(&ran.stderr));
}

/// A scratch directory removed on drop (kept when `THAB_E2E_KEEP` is set, for debugging).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        Self::new_in(&std::env::temp_dir(), tag)
    }
    /// Like `new`, under `base` (e.g. a tmpfs, to take the disk out of a measurement).
    pub fn new_in(base: &Path, tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = base.join(format!("thab-e2e-{tag}-{}-{}-{:08x}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), fastrand::u32(..)));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    /// A sub-directory (created).
    pub fn sub(&self, name: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::create_dir_all(&p).expect("create sub dir");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("THAB_E2E_KEEP").is_some() {
            eprintln!("keeping {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A network config whose IPAM section is thereabouts on the file datastore.
/// `legacy_range` becomes the top-level `range` (allocated first), `ip_ranges` the `ipRanges` list.
pub fn thereabouts_conf(cni_version: &str, name: &str, data_dir: &Path, legacy_range: Option<&str>, ip_ranges: &[&str]) -> Value {
    let mut ipam = json!({
        "type": "thereabouts",
        "datastore": "file",
        "data_dir": data_dir.to_str().expect("utf-8 path"),
    });
    if let Some(r) = legacy_range {
        ipam["range"] = json!(r);
    }
    if !ip_ranges.is_empty() {
        ipam["ipRanges"] = Value::Array(ip_ranges.iter().map(|r| json!({ "range": r })).collect());
    }
    json!({ "cniVersion": cni_version, "name": name, "type": "thab-e2e", "ipam": ipam })
}

/// `ips[].address` (with prefix) of a CNI 0.3+ result.
pub fn result_ips(v: &Value) -> Vec<String> {
    v.get("ips").and_then(Value::as_array).map(|a| a.iter().map(|ip| ip["address"].as_str().expect("ips[].address").to_string()).collect()).unwrap_or_default()
}

/// `192.0.2.5/24` -> 192.0.2.5
pub fn addr_of(cidr: &str) -> IpAddr {
    cidr.split('/').next().unwrap().parse().unwrap_or_else(|e| panic!("bad address {cidr:?}: {e}"))
}

/// Network address and prefix length of a pool's `range` (`A/len` or `A-B/len`).
pub fn range_network(range: &str) -> (IpAddr, u8) {
    let (ip, len) = range.rsplit_once('/').unwrap_or_else(|| panic!("range without prefix: {range:?}"));
    let ip = ip.split('-').next().unwrap();
    let ip: IpAddr = ip.parse().unwrap_or_else(|e| panic!("bad range {range:?}: {e}"));
    let len: u8 = len.parse().unwrap_or_else(|e| panic!("bad prefix in {range:?}: {e}"));
    match ip {
        IpAddr::V4(a) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len as u32) };
            (IpAddr::V4((u32::from(a) & mask).into()), len)
        }
        IpAddr::V6(a) => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - len as u32) };
            (IpAddr::V6((u128::from(a) & mask).into()), len)
        }
    }
}

/// `network + offset` (whereabouts' IPPool keys are decimal offsets from the range's network address).
pub fn add_offset(net: IpAddr, offset: u128) -> IpAddr {
    match net {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a).wrapping_add(offset as u32)).into()),
        IpAddr::V6(a) => IpAddr::V6((u128::from(a).wrapping_add(offset)).into()),
    }
}

/// An allocation entry as found in a pool file.
#[derive(Clone, Debug)]
pub struct Alloc {
    pub key: String,
    pub addr: IpAddr,
    pub id: String,
    pub podref: String,
    pub ifname: String,
}

/// One `<data_dir>/<pool>.pool` file (its newest intact slot).
#[derive(Debug)]
pub struct Pool {
    pub file: PathBuf,
    pub range: String,
    pub allocs: Vec<Alloc>,
}

/// Object entries in document order, duplicates kept (serde_json's Map would merge them).
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of allocations")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Entries, A::Error> {
                let mut v = Vec::new();
                while let Some((k, val)) = m.next_entry::<String, Value>()? {
                    v.push((k, val));
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct RawPool {
    range: String,
    #[serde(default)]
    allocations: Option<Entries>,
}

/// The newest intact version in a pool file, read independently of the plugin's
/// own reader: two equal slots, each `TPOOL1 <version:20> <length:12> <crc32:8 hex>\n`
/// then the JSON payload; the CRC covers the version (8 bytes little-endian) and
/// the payload. `None` when neither slot is intact, i.e. a torn file.
pub fn newest_slot(bytes: &[u8]) -> Option<(u64, Vec<u8>)> {
    if bytes.len() < 8192 || !bytes.len().is_multiple_of(8192) {
        return None;
    }
    let slot = bytes.len() / 2;
    let mut best: Option<(u64, Vec<u8>)> = None;
    for half in [&bytes[..slot], &bytes[slot..]] {
        let Some(head) = half.get(..50).and_then(|h| std::str::from_utf8(h).ok()) else { continue };
        let fields: Vec<&str> = head.trim_end_matches('\n').split(' ').collect();
        let [magic, version, length, crc] = fields.as_slice() else { continue };
        let (Ok(version), Ok(length), Ok(crc)) = (version.parse::<u64>(), length.parse::<usize>(), u32::from_str_radix(crc, 16)) else { continue };
        if *magic != "TPOOL1" || 50 + length > slot {
            continue;
        }
        let payload = &half[50..50 + length];
        let mut h = crc32fast::Hasher::new();
        h.update(&version.to_le_bytes());
        h.update(payload);
        if h.finalize() == crc && best.as_ref().is_none_or(|(v, _)| version > *v) {
            best = Some((version, payload.to_vec()));
        }
    }
    best
}

/// Parses one pool file strictly: an intact slot holding valid JSON, a `range`, an
/// `allocations` object whose keys are unique decimal offsets and whose values carry
/// string `id`, `podref`, `ifname`.
pub fn parse_pool(file: &Path) -> Result<Pool, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("{}: unreadable: {e}", file.display()))?;
    let (_, payload) = newest_slot(&bytes).ok_or_else(|| format!("{}: torn: no intact slot ({} bytes)", file.display(), bytes.len()))?;
    let text = String::from_utf8_lossy(&payload).into_owned();
    let raw: RawPool = serde_json::from_str(&text).map_err(|e| format!("{}: not a pool file ({e}); content: {:?}", file.display(), truncate(&text, 400)))?;
    let (net, _) = range_network(&raw.range);
    let mut seen = std::collections::HashSet::new();
    let mut allocs = Vec::new();
    for (k, v) in raw.allocations.map(|e| e.0).unwrap_or_default() {
        if !seen.insert(k.clone()) {
            return Err(format!("{}: duplicate allocation key {k}", file.display()));
        }
        let off: u128 = k.parse().map_err(|_| format!("{}: allocation key {k:?} is not a decimal offset", file.display()))?;
        let s = |f: &str| -> Result<String, String> {
            v.get(f).and_then(Value::as_str).map(str::to_string).ok_or_else(|| format!("{}: allocation {k} lacks string field {f:?}: {v}", file.display()))
        };
        allocs.push(Alloc { key: k.clone(), addr: add_offset(net, off), id: s("id")?, podref: s("podref")?, ifname: s("ifname")? });
    }
    Ok(Pool { file: file.to_path_buf(), range: raw.range, allocs })
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Everything in a data dir: the parsed pool files (`*.pool`, recursively) and every other
/// file (locks, temp files) by path. Errors name the first file that does not parse.
pub fn read_store(dir: &Path) -> Result<(Vec<Pool>, Vec<PathBuf>), String> {
    let mut pools = Vec::new();
    let mut others = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", d.display())),
        };
        for ent in rd {
            let ent = ent.map_err(|e| e.to_string())?;
            let p = ent.path();
            let ft = ent.file_type().map_err(|e| e.to_string())?;
            if ft.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "pool") {
                pools.push(parse_pool(&p)?);
            } else {
                others.push(p);
            }
        }
    }
    pools.sort_by(|a, b| a.file.cmp(&b.file));
    Ok((pools, others))
}

/// Store-wide consistency: no address held twice (within or across pool files), and no
/// attachment (id, ifname) holding two addresses of one pool. Returns address -> entry.
pub fn check_unique(pools: &[Pool]) -> Result<BTreeMap<IpAddr, Alloc>, String> {
    let mut by_addr: BTreeMap<IpAddr, Alloc> = BTreeMap::new();
    for p in pools {
        let mut per_owner: HashMap<(&str, &str), &Alloc> = HashMap::new();
        for a in &p.allocs {
            if let Some(prev) = per_owner.insert((&a.id, &a.ifname), a) {
                return Err(format!("{}: attachment {}/{} holds two addresses: {} and {}", p.file.display(), a.id, a.ifname, prev.addr, a.addr));
            }
            if let Some(prev) = by_addr.insert(a.addr, a.clone()) {
                return Err(format!("DUPLICATE address {} held by {}/{} and {}/{} (in {})", a.addr, prev.id, prev.ifname, a.id, a.ifname, p.file.display()));
            }
        }
    }
    Ok(by_addr)
}

/// Total allocation entries in a store.
pub fn count_allocs(pools: &[Pool]) -> usize {
    pools.iter().map(|p| p.allocs.len()).sum()
}

/// Median and p-th percentile of durations (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
