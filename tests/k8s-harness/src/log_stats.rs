//! What a plugin's debug log (`log_level: debug`) says about one call: its
//! Kubernetes API or etcd requests and its re-plans after conflicts. These are
//! benchmark figures, printed by the burst tests and tabled by the `bench_*`
//! binaries; no test asserts on them (the log format is no test API: the exact
//! request sequences are pinned in-process, `host/src/datastore/kubernetes/tests.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// Sets `log_file` and `log_level: debug` (every request is logged).
pub fn with_debug_log(mut conf: Value, log: &Path) -> Value {
    conf["ipam"]["log_file"] = json!(log.to_str().expect("utf-8 path"));
    conf["ipam"]["log_level"] = json!("debug");
    conf
}

/// What one plugin call's debug log says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Requests sent (`kubernetes API request #n` and `etcd request #n` lines).
    pub requests: usize,
    /// Requests per target: the IPPool's name, `reservations <family>` for a
    /// named reservation, or the collection (`POST ... /ippools`).
    pub by_target: BTreeMap<String, usize>,
    /// Re-plans after a conflict (`changed concurrently; planning again`).
    pub replans: usize,
}

impl LogStats {
    pub fn read(log: &Path) -> LogStats {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let mut stats = LogStats { replans: text.matches("changed concurrently").count(), ..LogStats::default() };
        for action in etcd_requests(&text) {
            stats.requests += 1;
            *stats.by_target.entry(etcd_target(&action).to_string()).or_insert(0) += 1;
        }
        for request in api_requests(log) {
            stats.requests += 1;
            let path = request.split_whitespace().nth(1).unwrap_or_default().split('?').next().unwrap_or_default();
            let mut parts = path.rsplit('/');
            let last = parts.next().unwrap_or_default();
            let target = match last {
                "ippools" | "overlappingrangeipreservations" => format!("{last} (collection)"),
                name if path.contains("/overlappingrangeipreservations/") => {
                    let family = if name.contains('.') { "IPv4" } else { "IPv6" };
                    format!("reservation {family}")
                }
                name => name.to_string(),
            };
            *stats.by_target.entry(target).or_insert(0) += 1;
        }
        stats
    }

    pub fn add(&mut self, other: &LogStats) {
        self.requests += other.requests;
        self.replans += other.replans;
        for (k, v) in &other.by_target {
            *self.by_target.entry(k.clone()).or_insert(0) += v;
        }
    }
}

/// The etcd requests a plugin's debug log holds (`etcd request #n: <action> ->
/// <outcome>`), as their actions, in order.
fn etcd_requests(log_text: &str) -> Vec<String> {
    log_text
        .lines()
        .filter_map(|l| l.split_once("etcd request #").map(|(_, rest)| rest))
        .map(|rest| {
            let rest = rest.split_once(": ").map_or(rest, |(_, r)| r);
            rest.rsplit_once(" -> ").map_or(rest, |(a, _)| a).to_string()
        })
        .collect()
}

/// What an etcd request of the plugin was for, from its logged action.
fn etcd_target(action: &str) -> &'static str {
    if action.starts_with("connecting") {
        "etcd connect"
    } else if action.starts_with("reading pool keys") {
        "etcd GET pool keys (txn)"
    } else if action.starts_with("reading pool key") {
        "etcd GET pool key"
    } else if action.starts_with("committing") {
        "etcd commit txn"
    } else if action.contains("reservation key") {
        "etcd GET reservation keys (txn)"
    } else {
        "etcd other"
    }
}

/// A per-call log file path under `dir` (one file per process keeps the counts
/// apart).
pub fn log_path(dir: &Path, tag: &str) -> PathBuf {
    dir.join(format!("{tag}.log"))
}

/// The API requests logged in `log` (`"GET /apis/... -> ok"`), in order.
fn api_requests(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once("kubernetes API request #").map(|(_, rest)| rest))
        .map(|rest| {
            let rest = rest.split_once(": ").map_or(rest, |(_, r)| r);
            // Drop the timing: "... -> ok in 3 ms".
            rest.rsplit_once(" in ").map_or(rest, |(r, _)| r).to_string()
        })
        .collect()
}
