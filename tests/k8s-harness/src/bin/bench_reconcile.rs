//! The cluster controller's reconciler at the issue's size: 10 000 live pods
//! over 100 Ready nodes, 50 IPPools holding 50 000 entries (5 per pod, each in
//! another pool), on one real kube-apiserver. It prints what a full pass
//! costs, and how fast deleted pods get their addresses back:
//!
//! * full pass: `thereabouts controller --once` as a child, 3 runs (and the
//!   median): wall time, the apiserver requests it sent (the apiserver's own
//!   counters, every group, before and after), the bytes the apiserver sent in
//!   answers, and the child's peak RSS (`VmHWM`). Every pod is live, so
//!   a pass must free nothing: the bench fails if the entries changed;
//! * delete-to-free: the controller as a long-running leader, 100 pods
//!   deleted at once; from each delete's answer to the moment a watch on the
//!   IPPools (in this process) shows none of the pod's entries left: p50, p99,
//!   max (and to the first entry gone), the apiserver requests of the phase
//!   with their mean time inside the apiserver, and the controller's peak RSS
//!   (`VmHWM`) over the whole phase. The bench fails unless exactly the
//!   deleted pods' entries went.
//!
//! It ends with the issue's targets beside the figures: RSS ≤ 64 MiB, a full
//! pass ≤ 5 s, delete-to-free p99 ≤ 2 s (figures, not assertions).
//!
//! `--slices`: the entries live in node-slice pools instead, as the plugin
//! leaves them with `node_slice_size` (docs/datastores.md "Node slices"): one
//! IPPool per node and network, named `bench-<node>-<slice>`, its range the
//! node's /112 slice of the network's /96; a pod's entries are in its node's
//! pools, one per network (`--allocations / --pods` networks; `--pools` is
//! not used). There is no NAD, so the slice pass has nothing to lay out.
//!
//! `--whereabouts` (without `--slices`; needs `THEREABOUTS_WHEREABOUTS_DIR`):
//! the deleted pods are the first pods of 4 nodes (25 each for 100), and after
//! thereabouts' delete-to-free, whereabouts v0.9.4's own pod controller
//! (`ip-control-loop`, one per node of the deleted pods, as its DaemonSet
//! would run; no `ip-reconciler`) frees as many other pods of the same nodes,
//! deleted at once, under a NAD naming every pool's range, followed by the
//! same IPPool watch.
//!
//! The pools and pods are written directly (not through the plugin: too slow
//! at this size), in the shapes the plugin and multus leave: pools named
//! after their ranges (IPv6 /112s under the documentation prefix
//! 2001:db8::/32), entries `{"id", "podref", "ifname": "net1"}`, pods
//! `Running` through the status subresource with a network-status annotation
//! listing their addresses on `net1`.
//!
//! ```sh
//! bash scripts/build-plugin.sh
//! THEREABOUTS_K8S_BINS=$(bash tests/k8s-bins/build.sh) \
//!   cargo run --release -p thereabouts-k8s-harness --bin bench_reconcile -- --pods 10000 --pools 50 --allocations 50000 --nodes 100 --deleted 100 --runs 3
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::{Value, json};
use thereabouts_e2e::{TempDir, thereabouts_bin};
use thereabouts_k8s_harness::addresses::pool_name;
use thereabouts_k8s_harness::apiserver_metrics::Metrics;
use thereabouts_k8s_harness::controller::{self, Controller, Settings};
use thereabouts_k8s_harness::plugin::{IPPOOLS, Objects};
use thereabouts_k8s_harness::pod_fleet;
use thereabouts_k8s_harness::pods;
use thereabouts_k8s_harness::whereabouts_controllers::WhereaboutsControllers;
use thereabouts_k8s_harness::{Cluster, NAMESPACE};

/// Requests in flight while setting up.
const WIDTH: usize = 32;
const INTERFACE: &str = "net1";
/// The issue's targets.
const TARGET_RSS_MIB: f64 = 64.0;
const TARGET_PASS_MS: f64 = 5000.0;
const TARGET_P99_MS: f64 = 2000.0;

struct Options {
    pods: usize,
    pools: usize,
    allocations: usize,
    nodes: usize,
    deleted: usize,
    runs: usize,
    slices: bool,
    whereabouts: bool,
}

fn parse_options() -> Result<Options> {
    let mut o = Options { pods: 10_000, pools: 50, allocations: 50_000, nodes: 100, deleted: 100, runs: 3, slices: false, whereabouts: false };
    let mut args = std::env::args().skip(1);
    while let Some(name) = args.next() {
        match name.as_str() {
            "--slices" => {
                o.slices = true;
                continue;
            }
            "--whereabouts" => {
                o.whereabouts = true;
                continue;
            }
            _ => {}
        }
        let value: usize = args.next().with_context(|| format!("{name} needs a value"))?.parse().with_context(|| format!("{name}: a number"))?;
        match name.as_str() {
            "--pods" => o.pods = value,
            "--pools" => o.pools = value,
            "--allocations" => o.allocations = value,
            "--nodes" => o.nodes = value,
            "--deleted" => o.deleted = value,
            "--runs" => o.runs = value,
            _ => bail!("unknown option {name}: --pods N --pools N --allocations N --nodes N --deleted N --runs N [--slices] [--whereabouts]"),
        }
    }
    if o.pods == 0 || o.nodes == 0 || o.runs == 0 || o.pools == 0 || o.pools > 0x1_0000 {
        bail!("--pods, --nodes, --runs and --pools must be positive (and --pools at most 65536)");
    }
    if o.slices {
        o.pools = o.allocations / o.pods * o.nodes;
        if !o.allocations.is_multiple_of(o.pods) || o.allocations / o.pods > 0x1_0000 || o.nodes > 0x1_0000 || o.pods / o.nodes + 1 >= 0x1_0000 {
            bail!("--slices: --allocations a multiple of --pods (one network each), a node's pods within its /112");
        }
    } else if !o.allocations.is_multiple_of(o.pods) || o.allocations / o.pods > o.pools {
        bail!("--allocations must be a multiple of --pods, at most --pools entries per pod (each in another pool)");
    }
    if o.allocations / o.pools + 1 >= 0x1_0000 || o.deleted > o.pods {
        bail!("a pool's entries must fit in its /112, and --deleted be at most --pods");
    }
    if o.whereabouts && (o.slices || 2 * o.deleted > o.pods.div_ceil(o.nodes) * VERSUS_NODES.min(o.nodes)) {
        bail!("--whereabouts: without --slices, and twice --deleted within the pods of {VERSUS_NODES} nodes");
    }
    Ok(o)
}

/// How many nodes' pods `--whereabouts` deletes (one `ip-control-loop` each).
const VERSUS_NODES: usize = 4;
/// How long whereabouts' deletes are followed; what is left then is counted.
const WHEREABOUTS_LIMIT: Duration = Duration::from_secs(300);

/// Where every entry lies. Without slices, entry e (pod e / per_pod) is in
/// pool e mod pools, at offset e / pools + 1, so a pod's entries are in
/// distinct pools and the pools fill evenly. With slices, pod p's entry of
/// network k is in the pool of (k, its node p mod nodes), at offset
/// p / nodes + 1.
struct Layout {
    pods: usize,
    pools: usize,
    per_pod: usize,
    nodes: usize,
    slices: bool,
}

impl Layout {
    fn new(o: &Options) -> Layout {
        Layout { pods: o.pods, pools: o.pools, per_pod: o.allocations / o.pods, nodes: o.nodes, slices: o.slices }
    }

    fn network(&self, pool: usize) -> Ipv6Addr {
        match self.slices {
            // Network k's /96, node n's /112 slice of it.
            true => Ipv6Addr::new(0x2001, 0xdb8, (pool / self.nodes) as u16, 0, 0, 0, (pool % self.nodes) as u16, 0),
            false => Ipv6Addr::new(0x2001, 0xdb8, pool as u16, 0, 0, 0, 0, 0),
        }
    }

    fn range(&self, pool: usize) -> String {
        format!("{}/112", self.network(pool))
    }

    /// The IPPool's name: the range's, or `bench-<node>-<slice>` for a node's slice.
    fn name(&self, pool: usize) -> String {
        match self.slices {
            true => format!("bench-{}-{}", node_name(pool % self.nodes), pool_name(&self.range(pool))),
            false => pool_name(&self.range(pool)),
        }
    }

    /// (pool, offset) of each entry of `pod`.
    fn entries_of(&self, pod: usize) -> impl Iterator<Item = (usize, usize)> + use<> {
        let (pools, first, nodes, slices) = (self.pools, pod * self.per_pod, self.nodes, self.slices);
        (0..self.per_pod).map(move |k| match slices {
            true => (k * nodes + pod % nodes, pod / nodes + 1),
            false => ((first + k) % pools, (first + k) / pools + 1),
        })
    }

    fn address(&self, pool: usize, offset: usize) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.network(pool)) + offset as u128)
    }

    fn addresses_of(&self, pod: usize) -> Vec<String> {
        self.entries_of(pod).map(|(pool, offset)| self.address(pool, offset).to_string()).collect()
    }

    /// The IPPool objects, as the plugin writes them.
    fn pool_objects(&self) -> Vec<Value> {
        let mut allocations: Vec<serde_json::Map<String, Value>> = vec![serde_json::Map::new(); self.pools];
        for pod in 0..self.pods {
            for (pool, offset) in self.entries_of(pod) {
                let entry = json!({"id": container_id(pod), "podref": format!("default/{}", pod_name(pod)), "ifname": INTERFACE});
                allocations[pool].insert(offset.to_string(), entry);
            }
        }
        allocations
            .into_iter()
            .enumerate()
            .map(|(i, allocations)| {
                json!({
                    "apiVersion": thereabouts_k8s_harness::plugin::GROUP_VERSION, "kind": "IPPool",
                    "metadata": {"name": self.name(i), "namespace": NAMESPACE},
                    "spec": {"range": self.range(i), "allocations": allocations},
                })
            })
            .collect()
    }
}

fn pod_name(pod: usize) -> String {
    format!("pod-{pod:05}")
}

fn container_id(pod: usize) -> String {
    format!("cid-{}", pod_name(pod))
}

fn node_name(node: usize) -> String {
    format!("node-{node:03}")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The value at `pct` of sorted `values` (nearest rank).
fn percentile(values: &[f64], pct: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let rank = ((pct / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    percentile(&v, 50.0)
}

// ---- setup ----

async fn create_pods(client: &kube::Client, layout: &Layout, nodes: usize) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    pod_fleet::in_parallel(0..layout.pods, WIDTH, |pod| {
        pod_fleet::create_running(api.clone(), pod_name(pod), node_name(pod % nodes), Some(("default/bench", INTERFACE, layout.addresses_of(pod))))
    })
    .await?;
    Ok(())
}

fn create_pools(objects: &Objects, layout: &Layout) -> Result<()> {
    for pool in layout.pool_objects() {
        objects.create(IPPOOLS, &pool).with_context(|| format!("creating IPPool {}", pool["metadata"]["name"]))?;
    }
    Ok(())
}

/// Entries of every IPPool of the namespace.
fn count_entries(objects: &Objects) -> Result<usize> {
    Ok(objects.list(IPPOOLS)?.values().map(|p| p["spec"]["allocations"].as_object().map_or(0, |a| a.len())).sum())
}

// ---- apiserver counters ----

/// What the apiserver's `/metrics` counted, every group: requests by
/// `VERB resource[/subresource] code`, the time they spent inside the
/// apiserver by `VERB resource[/subresource]`, and bytes of answers (LIST and GET).
#[derive(Default)]
struct Served {
    requests: BTreeMap<String, f64>,
    seconds: BTreeMap<String, f64>,
    bytes: f64,
}

/// Resources of the apiserver's own upkeep (its identity Lease every 10 s,
/// the `kubernetes` Service's endpoints), which `--once` never touches.
const UPKEEP: [&str; 3] = [" leases", " endpoints", " endpointslices"];

fn minus(now: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    now.iter().map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0))).filter(|(_, v)| *v > 0.0).collect()
}

impl Served {
    fn scrape(metrics: &Metrics) -> Result<Served> {
        let text = metrics.text()?;
        let mut served = Served::default();
        for line in text.lines() {
            let Some((name, labels, value)) = sample(line) else { continue };
            // Non-resource requests (this bench's scrapes of /metrics) have no resource.
            let Some(resource) = labels.get("resource").filter(|r| !r.is_empty()) else { continue };
            let label = |k: &str| labels.get(k).map_or("", String::as_str);
            let what = match label("subresource") {
                "" => format!("{} {resource}", label("verb")),
                sub => format!("{} {resource}/{sub}", label("verb")),
            };
            match name {
                "apiserver_request_total" => *served.requests.entry(format!("{what} {}", label("code"))).or_insert(0.0) += value,
                "apiserver_request_duration_seconds_sum" => *served.seconds.entry(what).or_insert(0.0) += value,
                "apiserver_response_sizes_sum" => served.bytes += value,
                _ => {}
            }
        }
        Ok(served)
    }

    fn since(&self, before: &Served) -> Served {
        Served { requests: minus(&self.requests, &before.requests), seconds: minus(&self.seconds, &before.seconds), bytes: self.bytes - before.bytes }
    }

    /// Requests, leaving out the apiserver's own upkeep.
    fn total_without_upkeep(&self) -> f64 {
        let upkeep = |k: &str| UPKEEP.iter().any(|u| k.contains(&format!("{u} ")));
        self.requests.iter().filter(|(k, _)| !upkeep(k)).map(|(_, v)| v).sum()
    }

    fn breakdown(&self) -> String {
        self.requests.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
    }

    /// `VERB resource: n, mean t ms inside the apiserver`, for each kind of request.
    fn timed_breakdown(&self) -> String {
        let mut lines = Vec::new();
        for (what, seconds) in &self.seconds {
            let n: f64 = self.requests.iter().filter(|(k, _)| k.rsplit_once(' ').is_some_and(|(w, _)| w == what)).map(|(_, v)| v).sum();
            if n > 0.0 {
                lines.push(format!("{what} {n} (mean {:.1} ms)", seconds * 1000.0 / n));
            }
        }
        lines.join(", ")
    }
}

/// `name{labels} value` of a Prometheus text line.
fn sample(line: &str) -> Option<(&str, HashMap<String, String>, f64)> {
    let (name, rest) = line.split_once('{')?;
    let (labels, value) = rest.rsplit_once("} ")?;
    let labels =
        labels.split("\",").filter_map(|part| part.split_once("=\"").map(|(k, v)| (k.trim().to_string(), v.trim_end_matches('"').to_string()))).collect();
    Some((name, labels, value.trim().parse().ok()?))
}

// ---- phase 1: full passes ----

struct PassRun {
    wall: Duration,
    served: Served,
    peak_rss_kib: u64,
    errors: Vec<String>,
}

/// The `[error]` lines of a controller's log.
fn error_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log).unwrap_or_default().lines().filter(|l| l.contains("[error]")).map(str::to_string).collect()
}

/// Runs `thereabouts controller --once` to its end; answers its wall time and
/// peak RSS (KiB). The peak is its `VmHWM`, read every 2 ms until it exits:
/// `wait4`'s `ru_maxrss` would not do, as a child's counts the high-water
/// mark of the process that spawned it (this one, tens of MiB) from its exec.
fn run_once(kubeconfig: &Path, log: &Path) -> Result<(Duration, u64)> {
    let log_file = std::fs::File::create(log)?;
    let started = Instant::now();
    let mut child = Command::new(thereabouts_bin())
        .args(["controller", "--once", "--namespace", NAMESPACE, "--metrics-address", "", "--kubeconfig"])
        .arg(kubeconfig)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
        .context("starting thereabouts controller --once")?;
    let mut peak = 0;
    let status = loop {
        // Gone (a zombie has no VmHWM) once it exited: the last reading stands.
        if let Ok(kib) = peak_rss_kib(child.id()) {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let wall = started.elapsed();
    if !status.success() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        bail!("thereabouts controller --once failed ({status}):\n{text}");
    }
    Ok((wall, peak))
}

fn full_passes(o: &Options, objects: &Objects, metrics: &Metrics, kubeconfig: &Path, work: &Path) -> Result<Vec<PassRun>> {
    let mut runs = Vec::new();
    for run in 0..o.runs {
        let entries = count_entries(objects)?;
        let before = Served::scrape(metrics)?;
        let log = work.join(format!("once-{run}.log"));
        let (wall, peak_rss_kib) = run_once(kubeconfig, &log)?;
        // The apiserver counts a request once its answer is written.
        std::thread::sleep(Duration::from_millis(200));
        let served = Served::scrape(metrics)?.since(&before);
        let left = count_entries(objects)?;
        if left != entries {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            bail!("BUG: full pass {run} freed {} live entries ({entries} before, {left} after); its log:\n{text}", entries as i64 - left as i64);
        }
        eprintln!("full pass {run}: {:.0} ms, peak RSS {:.1} MiB, requests: {}", ms(wall), mib(peak_rss_kib), served.breakdown());
        runs.push(PassRun { wall, served, peak_rss_kib, errors: error_lines(&log) });
    }
    Ok(runs)
}

// ---- phase 2: delete-to-free ----

struct Freed {
    /// Delete answered → the pod's last entry gone, per pod (ms, may be
    /// negative: the watch can show the free before the delete's answer arrives).
    delete_to_free_ms: Vec<f64>,
    /// Delete answered → the pod's first entry gone, per pod (ms).
    delete_to_first_free_ms: Vec<f64>,
    /// First delete sent → last entry freed.
    all_freed: Duration,
    controller_peak_rss_kib: u64,
    /// What the apiserver served from the first delete until the last pass ended.
    served: Served,
    pod_delete_passes: f64,
    /// The time those passes took, summed (the controller's own histogram).
    pod_delete_seconds: f64,
    /// Its first full pass, as a leader (the controller's own histogram).
    leader_full_pass_seconds: f64,
    entries_left: usize,
    entries_before: usize,
    errors: Vec<String>,
}

/// `VmHWM` of a process, in KiB.
fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).context("no VmHWM")?;
    line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().context("VmHWM")
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let end = Instant::now() + limit;
    while !done() {
        if Instant::now() > end {
            bail!("after {limit:?}: {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Waits until `sample` of the controller's metrics stayed the same for `quiet`.
fn wait_until_settled(ctl: &Controller, sample: &str, quiet: Duration, limit: Duration) -> Result<()> {
    let (end, mut last, mut since) = (Instant::now() + limit, ctl.metric(sample)?, Instant::now());
    while since.elapsed() < quiet {
        if Instant::now() > end {
            bail!("after {limit:?}, {sample} still changes");
        }
        std::thread::sleep(Duration::from_millis(100));
        let now = ctl.metric(sample)?;
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn delete_to_free(
    o: &Options,
    layout: &Layout,
    deleted: &BTreeSet<String>,
    cluster: &Cluster,
    metrics: &Metrics,
    rt: &tokio::runtime::Runtime,
    kubeconfig: &Path,
    work: &Path,
) -> Result<Freed> {
    // The binary's resync (30 s), not the tests' 1 s: a node-slice pass every
    // second would share the controller's one task with the delete passes.
    let settings = Settings { reconcile_interval_seconds: 3600, lease_seconds: 15, resync_seconds: 30, ..Settings::default() };
    let log = work.join("controller.log");
    let mut ctl = Controller::run(&thereabouts_bin(), kubeconfig, &settings, &log)?;
    let full_ok = "thereabouts_reconcile_passes_total{kind=\"full\",outcome=\"ok\"}";
    let pod_delete_ok = "thereabouts_reconcile_passes_total{kind=\"pod_delete\",outcome=\"ok\"}";
    wait_for("the controller never led and finished a full pass", Duration::from_secs(120), || {
        ctl.metric("thereabouts_leader").unwrap_or(0.0) == 1.0 && ctl.metric(full_ok).unwrap_or(0.0) >= 1.0
    })
    .with_context(|| format!("controller log {}", log.display()))?;
    let objects = Objects::admin(cluster)?;
    let entries_before = count_entries(&objects)?;
    let pod_delete_seconds = "thereabouts_reconcile_duration_seconds_sum{kind=\"pod_delete\"}";
    let (passes_before, seconds_before) = (ctl.metric(pod_delete_ok)?, ctl.metric(pod_delete_seconds)?);
    let client = rt.block_on(cluster.admin_client())?;
    let served_before = Served::scrape(metrics)?;
    let limit = Duration::from_secs(120);
    let followed = rt.block_on(pod_fleet::delete_and_follow(&client, deleted, limit))?;
    if followed.timed_out {
        bail!(
            "after {limit:?}, {} of {} deleted pods still hold entries; controller log {}",
            deleted.len() - followed.last_entry_freed.len(),
            deleted.len(),
            log.display()
        );
    }
    let last_freed = followed.last_entry_freed.values().max().copied().unwrap_or(followed.started);
    // The last pass ends after its last write (its Events come after).
    wait_until_settled(&ctl, pod_delete_seconds, Duration::from_secs(2), Duration::from_secs(60))?;
    let freed = Freed {
        delete_to_free_ms: followed.since_answer(&followed.last_entry_freed),
        delete_to_first_free_ms: followed.since_answer(&followed.first_entry_freed),
        all_freed: last_freed - followed.started,
        controller_peak_rss_kib: peak_rss_kib(ctl.pid())?,
        served: Served::scrape(metrics)?.since(&served_before),
        pod_delete_passes: ctl.metric(pod_delete_ok)? - passes_before,
        pod_delete_seconds: ctl.metric(pod_delete_seconds)? - seconds_before,
        leader_full_pass_seconds: ctl.metric("thereabouts_reconcile_duration_seconds_sum{kind=\"full\"}")?,
        entries_left: count_entries(&objects)?,
        entries_before,
        errors: error_lines(&log),
    };
    ctl.kill();
    let expected = entries_before - o.deleted * layout.per_pod;
    if freed.entries_left != expected {
        bail!("BUG: after deleting {} pods, {} entries left, expected {expected}; controller log {}", o.deleted, freed.entries_left, log.display());
    }
    Ok(freed)
}

/// The pods deleted at once: spread over the pods, and shifted by one more
/// each, so that their entries lie in every pool (pod p's are in pools
/// p·k .. p·k+k-1 mod pools); with `--whereabouts`, the first pods of
/// [`VERSUS_NODES`] nodes (`round` 0) or the next as many (`round` 1).
fn deleted_pods(o: &Options, round: usize) -> BTreeSet<String> {
    if o.whereabouts {
        let per_node = o.deleted.div_ceil(VERSUS_NODES);
        return (0..o.deleted).map(|i| format!("default/{}", pod_name(i % VERSUS_NODES + (round * per_node + i / VERSUS_NODES) * o.nodes))).collect();
    }
    let step = (o.pods / o.deleted.max(1)).max(1);
    (0..o.deleted).map(|i| format!("default/{}", pod_name(i * step + i % step))).collect()
}

// ---- phase 3: whereabouts' own pod controller ----

struct TheirFreed {
    delete_to_free_ms: Vec<f64>,
    freed: usize,
    deleted: usize,
    timed_out: bool,
    all_freed: Duration,
    served: Served,
    /// The largest of the control loops' `VmHWM`, and their sum.
    peak_rss_kib: (u64, u64),
    entries_left: usize,
    expected_left: usize,
    processes: usize,
}

/// whereabouts v0.9.4's `ip-control-loop`, one per node of `deleted`, frees
/// `deleted` (deleted at once) under a NAD `default/bench` naming every
/// pool's range, the way a whereabouts user's would.
fn whereabouts_delete_to_free(
    layout: &Layout,
    cluster: &Cluster,
    metrics: &Metrics,
    rt: &tokio::runtime::Runtime,
    deleted: &BTreeSet<String>,
    work: &Path,
) -> Result<TheirFreed> {
    let whereabouts = thereabouts_k8s_harness::peers::whereabouts().context("whereabouts v0.9.4 (THEREABOUTS_WHEREABOUTS_DIR)")?;
    let install = rt.block_on(whereabouts.install(cluster))?;
    let ranges: Vec<Value> = (0..layout.pools).map(|p| json!({"range": layout.range(p)})).collect();
    let nad = json!({"cniVersion": "0.3.1", "name": "bench", "type": "macvlan", "master": "eth0", "ipam": {"type": "whereabouts", "ipRanges": ranges}});
    rt.block_on(controller::create_nad(cluster, "bench", &nad))?;
    let nodes: Vec<String> = (0..VERSUS_NODES).map(node_name).collect();
    let dir = work.join("whereabouts");
    std::fs::create_dir_all(&dir)?;
    let theirs = WhereaboutsControllers::start_control_loops(&whereabouts, &install, cluster, &nodes, &dir)?;
    // Their informers list every IPPool, NAD and their node's pods first.
    std::thread::sleep(Duration::from_secs(15));
    let objects = Objects::admin(cluster)?;
    let entries_before = count_entries(&objects)?;
    let client = rt.block_on(cluster.admin_client())?;
    let served_before = Served::scrape(metrics)?;
    let followed = rt.block_on(pod_fleet::delete_and_follow(&client, deleted, WHEREABOUTS_LIMIT))?;
    let last_freed = followed.last_entry_freed.values().max().copied().unwrap_or(followed.started);
    std::thread::sleep(Duration::from_secs(2));
    let rss: Vec<u64> = theirs.pids().into_iter().filter_map(|pid| peak_rss_kib(pid).ok()).collect();
    let out = TheirFreed {
        delete_to_free_ms: followed.since_answer(&followed.last_entry_freed),
        freed: followed.last_entry_freed.len(),
        deleted: deleted.len(),
        timed_out: followed.timed_out,
        all_freed: last_freed - followed.started,
        served: Served::scrape(metrics)?.since(&served_before),
        peak_rss_kib: (rss.iter().copied().max().unwrap_or(0), rss.iter().sum()),
        entries_left: count_entries(&objects)?,
        expected_left: entries_before - deleted.len() * layout.per_pod,
        processes: rss.len(),
    };
    drop(theirs);
    Ok(out)
}

// ---- report ----

fn report(o: &Options, setup: Duration, runs: &[PassRun], freed: &Freed, theirs: Option<&TheirFreed>) {
    let walls: Vec<f64> = runs.iter().map(|r| ms(r.wall)).collect();
    let requests: Vec<f64> = runs.iter().map(|r| r.served.total_without_upkeep()).collect();
    let rss: Vec<f64> = runs.iter().map(|r| mib(r.peak_rss_kib)).collect();
    let bytes: Vec<f64> = runs.iter().map(|r| r.served.bytes / (1024.0 * 1024.0)).collect();
    let list = |v: &[f64], unit: &str| v.iter().map(|x| format!("{x:.1}{unit}")).collect::<Vec<_>>().join(", ");
    let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };
    let d = &freed.delete_to_free_ms;
    let (p50, p99, max) = (percentile(d, 50.0), percentile(d, 99.0), percentile(d, 100.0));
    println!();
    println!(
        "{} pods over {} Ready nodes, {} IPPools (IPv6 /112{}) holding {} entries ({} per pod), all pods live; setup {:.1} s; 2 cores; load average {}",
        o.pods,
        o.nodes,
        o.pools,
        if o.slices { ", node slices" } else { "" },
        o.allocations,
        o.allocations / o.pods,
        setup.as_secs_f64(),
        load_average()
    );
    println!();
    println!(
        "full pass (`controller --once`, median of {}): wall {:.0} ms (runs: {}), requests {:.0} (runs: {}), peak RSS {:.1} MiB (runs: {}), answers {:.1} MiB (runs: {})",
        runs.len(),
        median(&walls),
        list(&walls, " ms"),
        median(&requests),
        list(&requests, ""),
        median(&rss),
        list(&rss, " MiB"),
        median(&bytes),
        list(&bytes, " MiB"),
    );
    println!("  requests of the first run: {}", runs[0].served.breakdown());
    println!("  freed: nothing (entries unchanged in every run)");
    println!(
        "delete-to-free ({} pods at once): p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms; all freed {:.0} ms after the first delete, in {} pod-delete pass(es); controller peak RSS {:.1} MiB",
        d.len(),
        ms(freed.all_freed),
        freed.pod_delete_passes,
        mib(freed.controller_peak_rss_kib)
    );
    println!("  apiserver requests, deletes to the last pass's end (this bench's own: DELETE pods, the IPPool watch): {}", freed.served.timed_breakdown());
    let f = &freed.delete_to_first_free_ms;
    println!(
        "  to the first of a pod's entries freed: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        percentile(f, 50.0),
        percentile(f, 99.0),
        percentile(f, 100.0)
    );
    println!(
        "  the controller's own timing: pod-delete passes {:.0} ms in all, its first full pass as leader {:.0} ms",
        freed.pod_delete_seconds * 1000.0,
        freed.leader_full_pass_seconds * 1000.0
    );
    println!("  entries: {} before the deletes, {} after (exactly the deleted pods' own)", freed.entries_before, freed.entries_left);
    if let Some(t) = theirs {
        let d = &t.delete_to_free_ms;
        println!(
            "whereabouts v0.9.4 ip-control-loop ({} processes, one per node; {} other pods of the same nodes at once): {} of {} freed{}; p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; all freed {:.0} ms after the first delete; peak RSS {:.1} MiB (largest), {:.1} MiB (sum)",
            t.processes,
            t.deleted,
            t.freed,
            t.deleted,
            if t.timed_out { " (timed out)" } else { "" },
            percentile(d, 50.0),
            percentile(d, 99.0),
            percentile(d, 100.0),
            ms(t.all_freed),
            mib(t.peak_rss_kib.0),
            mib(t.peak_rss_kib.1)
        );
        println!("  apiserver requests, deletes to the last free: {}", t.served.timed_breakdown());
        println!("  entries left {} (expected {})", t.entries_left, t.expected_left);
    }
    let errors: Vec<&String> = runs.iter().flat_map(|r| &r.errors).chain(&freed.errors).collect();
    println!("  controller logs: {} [error] line(s)", errors.len());
    for line in errors.iter().take(5) {
        println!("    {line}");
    }
    println!();
    println!("| target | measured | |");
    println!("|---|---:|---|");
    let peak = median(&rss).max(mib(freed.controller_peak_rss_kib));
    println!("| RSS ≤ {TARGET_RSS_MIB:.0} MiB | {peak:.1} MiB | {} |", verdict(peak <= TARGET_RSS_MIB));
    println!("| full pass ≤ {:.0} s | {:.0} ms | {} |", TARGET_PASS_MS / 1000.0, median(&walls), verdict(median(&walls) <= TARGET_PASS_MS));
    println!("| delete-to-free p99 ≤ {:.0} s | {p99:.0} ms | {} |", TARGET_P99_MS / 1000.0, verdict(p99 <= TARGET_P99_MS));
}

/// `/proc/loadavg`'s three averages (the machine is shared: each figure with its load).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

fn main() -> Result<()> {
    let o = parse_options()?;
    let layout = Layout::new(&o);
    let work = TempDir::new("reconcile");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let setup_started = Instant::now();
    let cluster = Cluster::prepared().context("starting the control plane")?;
    let kubeconfig: PathBuf = rt.block_on(controller::install(&cluster))?;
    for node in 0..o.nodes {
        rt.block_on(pods::node(&cluster, &node_name(node), true))?;
    }
    let objects = Objects::admin(&cluster)?;
    create_pools(&objects, &layout)?;
    eprintln!("setup: {} nodes and {} pools in {:.1?}", o.nodes, o.pools, setup_started.elapsed());
    let client = rt.block_on(cluster.admin_client())?;
    let pods_started = Instant::now();
    rt.block_on(create_pods(&client, &layout, o.nodes))?;
    eprintln!("setup: {} pods in {:.1?}", o.pods, pods_started.elapsed());
    let setup = setup_started.elapsed();
    // A CRD's lists are answered 429 until the apiserver's watch cache of it
    // is ready: the passes should not time that.
    wait_for("the apiserver never served NetworkAttachmentDefinition lists", Duration::from_secs(60), || {
        objects.list_at("k8s.cni.cncf.io/v1", "network-attachment-definitions").is_ok()
    })?;
    let metrics = Metrics::admin(&cluster)?;
    let runs = full_passes(&o, &objects, &metrics, &kubeconfig, work.path())?;
    eprintln!("load average after the full passes: {}", load_average());
    let freed = delete_to_free(&o, &layout, &deleted_pods(&o, 0), &cluster, &metrics, &rt, &kubeconfig, work.path())?;
    eprintln!("load average after thereabouts' deletes: {}", load_average());
    let theirs = match o.whereabouts {
        true => Some(whereabouts_delete_to_free(&layout, &cluster, &metrics, &rt, &deleted_pods(&o, 1), work.path())?),
        false => None,
    };
    report(&o, setup, &runs, &freed, theirs.as_ref());
    Ok(())
}
