//! Node slices at scale: 20 000 pods over 100 simulated nodes on one real
//! kube-apiserver, added in batches, a dual-stack config of a /15 and a /64
//! (198.18.0.0/15, the benchmarking network of RFC 2544, in /24 slices, and
//! 2001:db8:b0::/64 in /72 slices), reservations on. Per batch it prints the
//! cost per ADD (wall, plugin CPU, apiserver+etcd CPU, API requests), so
//! "flat in the pod count" can be read off, and the largest object the
//! apiserver holds; `--svg FILE` plots the cost per ADD against the pods
//! already allocated. `--max-entries 0,32` runs each fill once per bound on a
//! node pool's entries (`node_slice_max_entries`; 0: none), so the cost per ADD
//! against the node's own pods can be read off with and without it.
//! `--slice-sizes /28,/80` slices the ranges finer: past 4 096 slices a range
//! keeps each held slice in a NodeSlicePool of its own (5 000 nodes and more).
//!
//! Every pod is a Pod object, created `Running` on its node before its ADD, so
//! the controller (running throughout, as the cluster's leader) sees what a
//! cluster holds. After the fill, `--churn 10` replaces 10 % of the pods in
//! batches (DEL, Pod deleted; a new Pod on the same node, ADD), and
//! `--deleted 100` then deletes that many Pods at once without a DEL and
//! follows the IPPools until the controller has freed them (delete-to-free).
//! `--pods 10000,30000,60000` runs each size on a fresh control plane;
//! `THEREABOUTS_SCALE_LOGS=DIR` keeps each size's controller log there;
//! `--svg-sizes FILE` plots the controller's peak RSS and pass time, etcd's
//! database and delete-to-free against the cluster's pods, with the least-
//! squares line `a + b·pods` of each carried to 150 000 pods.
//!
//! ```sh
//! bash scripts/build-plugin.sh
//! THEREABOUTS_K8S_BINS=$(bash tests/k8s-bins/build.sh) \
//!   cargo run --release -p thereabouts-k8s-harness --bin bench_k8s_scale -- --pods 20000 --nodes 100 --batch 500 --svg docs/scale.svg
//! ```

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir, addr_of, thereabouts_bin};
use thereabouts_k8s_harness::apiserver_metrics::{Metrics, RequestCounts};
use thereabouts_k8s_harness::bench::{Phase, Runner, process_cpu};
use thereabouts_k8s_harness::burst::Network;
use thereabouts_k8s_harness::controller::{self, Controller};
use thereabouts_k8s_harness::plugin::{IPPOOLS, Objects, kubernetes_conf};
use thereabouts_k8s_harness::pod_fleet;
use thereabouts_k8s_harness::{Cluster, block_on};

const RANGES: [&str; 2] = ["198.18.0.0/15", "2001:db8:b0::/64"];
/// The bound this bench holds every object to (the NodeSlicePool of 4 096
/// slices is the largest by design).
const OBJECT_BOUND: usize = 512 * 1024;
/// Pod creates and deletes in flight.
const WIDTH: usize = 32;
/// The cluster size the issue asks about, where the size plot's lines end.
const TARGET_PODS: f64 = 150_000.0;
/// How long the deleted pods' entries may take to be freed before the bench gives up on them.
const FREE_LIMIT: Duration = Duration::from_secs(120);

struct Options {
    /// Cluster sizes, each run on a fresh control plane.
    sizes: Vec<usize>,
    nodes: usize,
    batch: usize,
    svg: Option<PathBuf>,
    svg_sizes: Option<PathBuf>,
    /// Percent of the pods replaced after the fill.
    churn: usize,
    /// Pods deleted at once, without a DEL, at the end.
    deleted: usize,
    fills: Vec<Fill>,
    /// `node_slice_max_entries` of each run (0: none).
    bounds: Vec<u32>,
    /// `node_slice_size` of the IPv4 and the IPv6 range.
    slice_sizes: [String; 2],
}

/// Which node pod i runs on.
#[derive(Clone, Copy, PartialEq)]
enum Fill {
    /// Node i mod N: every node's pools grow with the cluster.
    Spread,
    /// The first pods/N pods on the first node, and so on: nodes fill one after
    /// another, so what a batch meets does not depend on the pods before it.
    NodeByNode,
}

impl Fill {
    fn name(self) -> &'static str {
        match self {
            Fill::Spread => "spread (pod i on node i mod N)",
            Fill::NodeByNode => "node by node",
        }
    }
}

fn parse_options() -> Result<Options> {
    let mut o = Options {
        sizes: vec![20_000],
        nodes: 100,
        batch: 500,
        svg: None,
        svg_sizes: None,
        churn: 10,
        deleted: 100,
        fills: vec![Fill::Spread, Fill::NodeByNode],
        bounds: vec![0],
        slice_sizes: ["/24".into(), "/72".into()],
    };
    let mut args = std::env::args().skip(1);
    while let Some(name) = args.next() {
        let value = args.next().with_context(|| format!("{name} needs a value"))?;
        match name.as_str() {
            "--pods" => o.sizes = value.split(',').map(|n| n.parse().with_context(|| format!("--pods {n}: a number"))).collect::<Result<_>>()?,
            "--churn" => o.churn = value.parse()?,
            "--deleted" => o.deleted = value.parse()?,
            "--svg-sizes" => o.svg_sizes = Some(PathBuf::from(value)),
            "--nodes" => o.nodes = value.parse()?,
            "--batch" => o.batch = value.parse()?,
            "--svg" => o.svg = Some(PathBuf::from(value)),
            "--slice-sizes" => match value.split_once(',') {
                Some((v4, v6)) => o.slice_sizes = [v4.to_string(), v6.to_string()],
                None => bail!("--slice-sizes /V4,/V6"),
            },
            "--max-entries" => o.bounds = value.split(',').map(|b| b.parse().with_context(|| format!("--max-entries {b}: a number"))).collect::<Result<_>>()?,
            "--fill" => {
                o.fills = value
                    .split(',')
                    .map(|f| match f {
                        "spread" => Ok(Fill::Spread),
                        "node" => Ok(Fill::NodeByNode),
                        other => Err(anyhow::anyhow!("--fill {other}: spread or node")),
                    })
                    .collect::<Result<_>>()?
            }
            _ => bail!(
                "unknown option {name}: --pods N[,N..] --nodes N --batch N --fill spread,node --max-entries 0,32 --slice-sizes /24,/72 --churn PCT --deleted N --svg FILE --svg-sizes FILE"
            ),
        }
    }
    let most = o.sizes.iter().copied().max().unwrap_or(0);
    if o.nodes == 0 || o.batch == 0 || most == 0 || (o.slice_sizes[0] == "/24" && most / o.nodes > 250) {
        bail!("--pods, --nodes and --batch must be positive, and a node's pods fit in one /24 slice (at most 250 per node)");
    }
    if o.churn > 100 || o.deleted > most * (100 - o.churn) / 100 {
        bail!("--churn is a percent, and --deleted at most the pods left after it");
    }
    Ok(o)
}

/// One batch's figures, per call.
#[derive(Clone, Copy)]
struct Point {
    pods_before: usize,
    wall_ms: f64,
    plugin_ms: f64,
    server_ms: f64,
    requests: f64,
    p99_ms: f64,
}

fn point(pods_before: usize, phase: &Phase<RequestCounts>) -> Point {
    let per = |d: Duration| d.as_secs_f64() * 1000.0 / phase.calls.max(1) as f64;
    let mut l = phase.latencies.clone();
    l.sort();
    Point {
        pods_before,
        wall_ms: per(phase.wall),
        plugin_ms: per(phase.plugin_cpu),
        server_ms: per(phase.server_cpu),
        requests: phase.requests.as_ref().map_or(f64::NAN, |r| r.total() / phase.calls.max(1) as f64),
        p99_ms: thereabouts_k8s_harness::report::percentile(&l, 99.0).as_secs_f64() * 1000.0,
    }
}

/// The largest object of each kind the plugin and the controller write, in bytes of JSON.
fn largest(objects: &Objects) -> Result<(usize, usize)> {
    let size = |m: std::collections::BTreeMap<String, Value>| m.values().map(|v| v.to_string().len()).max().unwrap_or(0);
    Ok((size(objects.list(IPPOOLS)?), size(objects.list("nodeslicepools")?)))
}

/// One fill's batches on a fresh control plane.
struct Run {
    fill: Fill,
    /// `node_slice_max_entries` (0: none).
    bound: u32,
    /// The cluster's pods after the fill.
    pods: usize,
    nodes: usize,
    per_node: usize,
    points: Vec<Point>,
    failed: usize,
    /// The churn's DEL and ADD batches, and their failures.
    churn_dels: Vec<Point>,
    churn_adds: Vec<Point>,
    churn_failed: usize,
    /// Addresses handed out over the run, churn included (none while held by another pod).
    addresses: usize,
    pool_bytes: usize,
    slice_pool_bytes: usize,
    control: ControllerFigures,
    /// etcd's database file at the end.
    etcd_db_bytes: u64,
    freed: DeleteToFree,
}

/// Pods deleted at once without a DEL, and how long the controller took to
/// free their entries after each delete's answer.
#[derive(Default)]
struct DeleteToFree {
    deleted: usize,
    /// Pods still holding an entry after [`FREE_LIMIT`].
    not_freed: usize,
    p50_ms: f64,
    p99_ms: f64,
}

/// Who holds each address the plugin handed out, so that an address handed out
/// while another pod holds it stops the bench.
#[derive(Default)]
struct Holders {
    by_address: HashMap<IpAddr, usize>,
    by_pod: HashMap<usize, Vec<IpAddr>>,
    handed_out: usize,
}

impl Holders {
    fn added(&mut self, pod: usize, outcome: &Outcome) -> Result<()> {
        for ip in outcome.ips() {
            let address = addr_of(&ip);
            if let Some(other) = self.by_address.insert(address, pod) {
                bail!("{address} handed out to pod {pod} while pod {other} holds it");
            }
            self.by_pod.entry(pod).or_default().push(address);
            self.handed_out += 1;
        }
        Ok(())
    }

    fn deleted(&mut self, pod: usize) {
        for address in self.by_pod.remove(&pod).unwrap_or_default() {
            self.by_address.remove(&address);
        }
    }
}

fn pod_name(i: usize) -> String {
    format!("pod-{i:06}")
}

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

/// Creates the pods `(index, node)` as Running Pod objects, before their ADDs.
fn create_pods(rt: &tokio::runtime::Runtime, api: &Api<Pod>, pods: &[(usize, usize)]) -> Result<()> {
    let work = |(i, node): (usize, usize)| pod_fleet::create_running(api.clone(), pod_name(i), node_name(node), None);
    rt.block_on(pod_fleet::in_parallel(pods.iter().copied(), WIDTH, work))?;
    Ok(())
}

/// Deletes the pods' Pod objects, after their DELs.
fn delete_pods(rt: &tokio::runtime::Runtime, api: &Api<Pod>, pods: &[usize]) -> Result<()> {
    rt.block_on(pod_fleet::in_parallel(pods.iter().copied(), WIDTH, |i| pod_fleet::delete_now(api.clone(), pod_name(i))))?;
    Ok(())
}

/// What the controller cost over a run: its peak RSS (the kernel's `VmHWM`)
/// and its full reconcile passes (count, mean seconds), from its `/metrics`.
struct ControllerFigures {
    peak_rss_kib: u64,
    full_passes: f64,
    full_pass_seconds: f64,
    /// Node-slice (layout) passes and pod-delete passes: count, mean seconds.
    slice_passes: (f64, f64),
    delete_passes: (f64, f64),
}

impl ControllerFigures {
    fn of(controller: &Controller) -> Self {
        let status = std::fs::read_to_string(format!("/proc/{}/status", controller.pid())).unwrap_or_default();
        let peak_rss_kib = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0);
        let page = controller.scrape().unwrap_or_default();
        let metric = |name: &str| page.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0);
        let passes = |kind: &str| {
            let count = metric(&format!("thereabouts_reconcile_duration_seconds_count{{kind=\"{kind}\"}}"));
            let sum = metric(&format!("thereabouts_reconcile_duration_seconds_sum{{kind=\"{kind}\"}}"));
            (count, if count > 0.0 { sum / count } else { 0.0 })
        };
        let (full_passes, full_pass_seconds) = passes("full");
        ControllerFigures { peak_rss_kib, full_passes, full_pass_seconds, slice_passes: passes("node_slices"), delete_passes: passes("pod_delete") }
    }
}

impl Run {
    fn name(&self) -> String {
        match self.bound {
            0 => self.fill.name().to_string(),
            b => format!("{}, node pools of at most {b} entries", self.fill.name()),
        }
    }

    /// Pods on a node of the batch starting at `pods_before`, before it.
    fn node_pods(&self, pods_before: usize) -> usize {
        match self.fill {
            Fill::Spread => pods_before / self.nodes.max(1),
            Fill::NodeByNode => pods_before % self.per_node.max(1),
        }
    }
}

fn run(o: &Options, pods: usize, fill: Fill, bound: u32) -> Result<Run> {
    let cluster = Cluster::prepared_with(false).context("starting the control plane")?;
    let work = TempDir::new("scale");
    let mut conf = kubernetes_conf("scale", &cluster.plugin_kubeconfig(), None, &RANGES);
    conf["ipam"]["node_slice_size"] = json!(o.slice_sizes[0]);
    conf["ipam"]["ipRanges"][1]["node_slice_size"] = json!(o.slice_sizes[1]);
    if bound > 0 {
        conf["ipam"]["node_slice_max_entries"] = json!(bound);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let kubeconfig = block_on(controller::install(&cluster))?;
    let controller = Controller::start_with(&thereabouts_bin(), &kubeconfig, 150, 30, &work.path().join("controller.log"))?;
    let client = rt.block_on(cluster.admin_client())?;
    let nodes_api: Api<Node> = Api::all(client.clone());
    rt.block_on(pod_fleet::in_parallel(0..o.nodes, WIDTH, |i| pod_fleet::create_node(nodes_api.clone(), node_name(i))))?;
    block_on(controller::create_nad(&cluster, "scale", &conf))?;
    let objects = Objects::admin(&cluster)?;
    controller::wait_for_layout(&objects, 2, o.nodes, Duration::from_secs(300))?;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), "default");

    let net = Network::new(conf.clone(), &RANGES, "scale");
    let metrics = Metrics::admin(&cluster)?;
    let scrape = |_: &str| {
        std::thread::sleep(Duration::from_millis(200));
        metrics.requests().ok()
    };
    let server_cpu = || cluster.pids().into_iter().map(process_cpu).sum::<Duration>();
    let bin = thereabouts_bin();
    let runner = Runner { bin: &bin, net: &net, scrape: &scrape, server_cpu: &server_cpu };
    let per_node = pods.div_ceil(o.nodes);
    // Pod i's node: the fill's for the first pods, its predecessor's for a replacement.
    let mut node_of: Vec<usize> = (0..pods)
        .map(|i| match fill {
            Fill::Spread => i % o.nodes,
            Fill::NodeByNode => i / per_node,
        })
        .collect();
    let call = |command: &str, i: usize, node: usize| {
        Invocation::new(Call::pod(command, &format!("cid-{i:06}"), &pod_name(i)), conf.to_string())
            .env("NODENAME", &node_name(node))
            .watchdog(Duration::from_secs(180))
    };
    let mut holders = Holders::default();
    let mut points = Vec::new();
    let mut failed = 0;
    for start in (0..pods).step_by(o.batch) {
        let batch: Vec<usize> = (start..(start + o.batch).min(pods)).collect();
        create_pods(&rt, &pods_api, &batch.iter().map(|&i| (i, node_of[i])).collect::<Vec<_>>())?;
        let calls: Vec<Invocation> = batch.iter().map(|&i| call("ADD", i, node_of[i])).collect();
        let (phase, outcomes) = runner.phase(&format!("{pods} pods, {}: pods {start}..{}", fill.name(), start + calls.len()), "ADD", &calls, true);
        failed += phase.failed;
        for (&i, outcome) in batch.iter().zip(&outcomes).filter(|(_, o)| o.ok()) {
            holders.added(i, outcome)?;
        }
        points.push(point(start, &phase));
    }

    // The churn: every k-th pod (k = 100 / churn) replaced, a batch at a time.
    let (mut churn_dels, mut churn_adds, mut churn_failed) = (Vec::new(), Vec::new(), 0);
    let replaced: Vec<usize> = match 100usize.checked_div(o.churn) {
        Some(step) => (0..pods).step_by(step).collect(),
        None => Vec::new(),
    };
    for (round, victims) in replaced.chunks(o.batch).enumerate() {
        let dels: Vec<Invocation> = victims.iter().map(|&i| call("DEL", i, node_of[i])).collect();
        let (phase, outcomes) = runner.phase(&format!("{pods} pods, churn {round}: DEL"), "DEL", &dels, true);
        churn_failed += phase.failed;
        for (&i, _) in victims.iter().zip(&outcomes).filter(|(_, o)| o.ok()) {
            holders.deleted(i);
        }
        churn_dels.push(point(pods, &phase));
        delete_pods(&rt, &pods_api, victims)?;
        let first = node_of.len();
        let newcomers: Vec<(usize, usize)> = victims.iter().enumerate().map(|(k, &v)| (first + k, node_of[v])).collect();
        node_of.extend(newcomers.iter().map(|&(_, node)| node));
        create_pods(&rt, &pods_api, &newcomers)?;
        let adds: Vec<Invocation> = newcomers.iter().map(|&(i, node)| call("ADD", i, node)).collect();
        let (phase, outcomes) = runner.phase(&format!("{pods} pods, churn {round}: ADD"), "ADD", &adds, true);
        churn_failed += phase.failed;
        for (&(i, _), outcome) in newcomers.iter().zip(&outcomes).filter(|(_, o)| o.ok()) {
            holders.added(i, outcome)?;
        }
        churn_adds.push(point(pods, &phase));
    }

    let (pool_bytes, slice_pool_bytes) = largest(&objects)?;
    let freed = delete_to_free(o, &rt, &client, &holders)?;
    let control = ControllerFigures::of(&controller);
    let etcd_db_bytes = std::fs::metadata(cluster.dir().join("etcd/member/snap/db")).map_or(0, |m| m.len());
    // Why each controller pass ran, for a look afterwards.
    if let Some(dir) = std::env::var_os("THEREABOUTS_SCALE_LOGS") {
        let kept = PathBuf::from(dir).join(format!("controller-{pods}.log"));
        std::fs::copy(work.path().join("controller.log"), &kept).with_context(|| format!("keeping the controller's log as {}", kept.display()))?;
    }
    Ok(Run {
        fill,
        bound,
        pods,
        nodes: o.nodes,
        per_node,
        points,
        failed,
        churn_dels,
        churn_adds,
        churn_failed,
        addresses: holders.handed_out,
        pool_bytes,
        slice_pool_bytes,
        control,
        etcd_db_bytes,
        freed,
    })
}

/// Deletes `o.deleted` live pods, spread over the pods, at once and without a
/// DEL, and measures how long the controller takes to free their entries.
fn delete_to_free(o: &Options, rt: &tokio::runtime::Runtime, client: &kube::Client, holders: &Holders) -> Result<DeleteToFree> {
    if o.deleted == 0 {
        return Ok(DeleteToFree::default());
    }
    let mut live: Vec<usize> = holders.by_pod.keys().copied().collect();
    live.sort_unstable();
    let step = (live.len() / o.deleted).max(1);
    let deleted: BTreeSet<String> = live.iter().step_by(step).take(o.deleted).map(|&i| format!("default/{}", pod_name(i))).collect();
    let followed = rt.block_on(pod_fleet::delete_and_follow(client, &deleted, FREE_LIMIT))?;
    let freed = followed.since_answer(&followed.last_entry_freed);
    let at = |pct: f64| freed.get(((freed.len() as f64 * pct / 100.0).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN);
    Ok(DeleteToFree { deleted: deleted.len(), not_freed: deleted.len() - freed.len(), p50_ms: at(50.0), p99_ms: at(99.0) })
}

fn main() -> Result<()> {
    let o = parse_options()?;
    let mut runs = Vec::new();
    for &pods in &o.sizes {
        for &bound in &o.bounds {
            for &fill in &o.fills {
                runs.push(run(&o, pods, fill, bound)?);
            }
        }
    }
    println!();
    println!(
        "{} pods over {} nodes in batches of {}, {} % churned, ranges {} in {} + {} slices, reservations on; 2 cores",
        o.sizes.iter().map(usize::to_string).collect::<Vec<_>>().join(" / "),
        o.nodes,
        o.batch,
        o.churn,
        RANGES.join(" + "),
        o.slice_sizes[0],
        o.slice_sizes[1]
    );
    for r in &runs {
        print_run(r);
    }
    if runs.len() > 1 {
        print_sizes(&runs);
    }
    let most = o.sizes.iter().copied().max().unwrap_or(0);
    if let Some(path) = &o.svg {
        std::fs::write(path, svg(&runs, most, o.nodes)).with_context(|| format!("writing {}", path.display()))?;
        println!("- plot: {}", path.display());
    }
    if let Some(path) = &o.svg_sizes {
        std::fs::write(path, svg_sizes(&runs)).with_context(|| format!("writing {}", path.display()))?;
        println!("- plot: {}", path.display());
    }
    let bad = runs.iter().filter(|r| r.failed + r.churn_failed + r.freed.not_freed > 0 || r.pool_bytes.max(r.slice_pool_bytes) > OBJECT_BOUND).count();
    if bad > 0 {
        bail!("{bad} run(s) failed calls, left deleted pods' entries, or held an object over {OBJECT_BOUND} bytes");
    }
    Ok(())
}

fn print_run(r: &Run) {
    println!();
    println!("**{} pods, {}**", r.pods, r.name());
    println!();
    println!(
        "| pods before the batch | a node's pods before it | wall per ADD | ADD p99 | plugin CPU per ADD | apiserver+etcd CPU per ADD | API requests per ADD |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for p in &r.points {
        println!(
            "| {} | {} | {:.1} ms | {:.0} ms | {:.1} ms | {:.1} ms | {:.1} |",
            p.pods_before,
            r.node_pods(p.pods_before),
            p.wall_ms,
            p.p99_ms,
            p.plugin_ms,
            p.server_ms,
            p.requests
        );
    }
    println!();
    println!("- ADDs failed: {}; churn: {} batches, {} calls failed", r.failed, r.churn_dels.len(), r.churn_failed);
    for (what, points) in [("DEL", &r.churn_dels), ("ADD", &r.churn_adds)] {
        if let Some(m) = mean(points) {
            println!(
                "- churn {what}s, mean over batches: wall {:.1} ms, p99 {:.0} ms, plugin CPU {:.1} ms, apiserver+etcd CPU {:.1} ms, {:.1} API requests per call",
                m.wall_ms, m.p99_ms, m.plugin_ms, m.server_ms, m.requests
            );
        }
    }
    println!("- addresses handed out: {} (none while another pod held it)", r.addresses);
    println!("- largest IPPool: {} bytes; largest NodeSlicePool: {} bytes; bound {OBJECT_BOUND} bytes", r.pool_bytes, r.slice_pool_bytes);
    println!(
        "- controller: peak RSS {:.1} MiB; {} full reconcile passes, {:.2} s each on average; etcd database {:.1} MiB at the end",
        r.control.peak_rss_kib as f64 / 1024.0,
        r.control.full_passes,
        r.control.full_pass_seconds,
        r.etcd_db_bytes as f64 / 1048576.0
    );
    println!(
        "- delete-to-free: {} pods deleted at once without a DEL: p50 {:.0} ms, p99 {:.0} ms; {} not freed within {FREE_LIMIT:?}",
        r.freed.deleted, r.freed.p50_ms, r.freed.p99_ms, r.freed.not_freed
    );
    println!(
        "- controller passes over the run: {} node-slice passes, {:.2} s each on average; {} pod-delete passes, {:.2} s each",
        r.control.slice_passes.0, r.control.slice_passes.1, r.control.delete_passes.0, r.control.delete_passes.1
    );
}

/// The mean of the batches' figures.
fn mean(points: &[Point]) -> Option<Point> {
    let n = points.len() as f64;
    let avg = |f: fn(&Point) -> f64| points.iter().map(f).sum::<f64>() / n;
    (!points.is_empty()).then(|| Point {
        pods_before: 0,
        wall_ms: avg(|p| p.wall_ms),
        plugin_ms: avg(|p| p.plugin_ms),
        server_ms: avg(|p| p.server_ms),
        requests: avg(|p| p.requests),
        p99_ms: avg(|p| p.p99_ms),
    })
}

/// Least squares `y = a + b·x`.
fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    (points.len() >= 2 && sxx > 0.0).then(|| (my - sxy / sxx * mx, sxy / sxx))
}

/// What each size plot and the extrapolation show, per run: (title, unit, value).
fn size_figures(r: &Run) -> [(&'static str, &'static str, f64); 5] {
    let all_adds: Vec<Point> = r.points.iter().chain(&r.churn_adds).copied().collect();
    let cpu = mean(&all_adds).map_or(f64::NAN, |m| m.plugin_ms + m.server_ms);
    [
        ("plugin + apiserver + etcd CPU per ADD", "ms", cpu),
        ("controller peak RSS", "MiB", r.control.peak_rss_kib as f64 / 1024.0),
        ("controller full pass", "s", r.control.full_pass_seconds),
        ("etcd database at the end", "MiB", r.etcd_db_bytes as f64 / 1048576.0),
        ("delete-to-free p99", "ms", r.freed.p99_ms),
    ]
}

/// The sizes side by side, and each figure's line carried to 150 000 pods.
fn print_sizes(runs: &[Run]) {
    println!();
    println!("**by cluster size**");
    println!();
    println!(
        "| pods | pods a node | failed calls | CPU per ADD | largest IPPool / NodeSlicePool | controller peak RSS | full pass | etcd database | delete-to-free p50 / p99 |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let f = size_figures(r);
        println!(
            "| {} | {} | {} | {:.1} ms | {} / {} B | {:.1} MiB | {:.2} s | {:.1} MiB | {:.0} / {:.0} ms |",
            r.pods,
            r.pods / r.nodes.max(1),
            r.failed + r.churn_failed + r.freed.not_freed,
            f[0].2,
            r.pool_bytes,
            r.slice_pool_bytes,
            f[1].2,
            f[2].2,
            f[3].2,
            r.freed.p50_ms,
            r.freed.p99_ms
        );
    }
    println!();
    for k in 0..5 {
        let points: Vec<(f64, f64)> = runs.iter().map(|r| (r.pods as f64, size_figures(r)[k].2)).filter(|(_, y)| y.is_finite()).collect();
        if let Some((a, b)) = fit(&points) {
            let (title, unit, _) = size_figures(&runs[0])[k];
            println!("- {title}: {a:.3} + {:.4}·pods/1000 {unit}, {:.1} {unit} at 150 000 pods", b * 1000.0, a + b * TARGET_PODS);
        }
    }
}

/// Five small plots side by side: each size figure against the cluster's
/// pods, the measured points and the fitted line carried to 150 000 pods.
fn svg_sizes(runs: &[Run]) -> String {
    let (pw, ph, left, bottom, top) = (300.0, 220.0, 50.0, 40.0, 36.0);
    let (w, h) = (pw * 3.0, ph * 2.0);
    let mut out = String::new();
    let _ = write!(out, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#);
    let _ = write!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    for k in 0..5 {
        let (ox, oy) = (pw * (k % 3) as f64, ph * (k / 3) as f64);
        let points: Vec<(f64, f64)> = runs.iter().map(|r| (r.pods as f64, size_figures(r)[k].2)).filter(|(_, y)| y.is_finite()).collect();
        let line = fit(&points);
        let (title, unit, _) = size_figures(&runs[0])[k];
        let at_target = line.map_or(0.0, |(a, b)| a + b * TARGET_PODS);
        let y_max = points.iter().map(|p| p.1).fold(at_target, f64::max).max(1e-9) * 1.15;
        let x = |v: f64| ox + left + v / TARGET_PODS * (pw - left - 16.0);
        let y = |v: f64| oy + ph - bottom - v / y_max * (ph - bottom - top);
        let _ = write!(out, r#"<text x="{}" y="{}">{title} ({unit})</text>"#, ox + left, oy + 18.0);
        let _ = write!(out, r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, x(0.0), y(0.0), x(TARGET_PODS), y(0.0));
        let _ = write!(out, r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, x(0.0), y(0.0), x(0.0), y(y_max));
        for i in 0..=3 {
            let v = y_max * i as f64 / 3.0;
            let _ = write!(out, r#"<text x="{}" y="{}" text-anchor="end">{v:.0}</text>"#, x(0.0) - 4.0, y(v) + 4.0);
            let pods = TARGET_PODS * i as f64 / 3.0;
            let _ = write!(out, r#"<text x="{}" y="{}" text-anchor="middle">{}k</text>"#, x(pods), y(0.0) + 14.0, pods / 1000.0);
        }
        let _ = write!(out, r#"<text x="{}" y="{}" text-anchor="middle">pods in the cluster</text>"#, x(TARGET_PODS / 2.0), y(0.0) + 28.0);
        if let Some((a, b)) = line {
            let _ = write!(
                out,
                r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#7f8c8d" stroke-dasharray="4 3"/>"##,
                x(0.0),
                y(a.max(0.0)),
                x(TARGET_PODS),
                y(at_target)
            );
            let _ = write!(
                out,
                r##"<text x="{}" y="{}" text-anchor="end" fill="#7f8c8d">{:.1} at 150k</text>"##,
                x(TARGET_PODS),
                y(at_target) - 6.0,
                a + b * TARGET_PODS
            );
        }
        for (px, py) in &points {
            let _ = write!(out, r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="#c0392b"/>"##, x(*px), y(*py));
        }
    }
    out.push_str("</svg>\n");
    out
}

/// A line plot of the plugin + apiserver + etcd CPU per ADD against the pods
/// already allocated, one line per fill, as plain SVG.
fn svg(runs: &[Run], pods: usize, nodes: usize) -> String {
    let (w, h, left, bottom, top, right) = (720.0, 360.0, 60.0, 40.0, 30.0, 20.0);
    let total = |p: &Point| p.plugin_ms + p.server_ms;
    let y_max = runs.iter().flat_map(|r| r.points.iter().map(total)).fold(1.0f64, f64::max) * 1.2;
    let x = |pods_before: usize| left + (pods_before as f64 / pods.max(1) as f64) * (w - left - right);
    let y = |v: f64| h - bottom - v / y_max * (h - bottom - top);
    let mut out = String::new();
    let _ = write!(out, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#);
    let _ = write!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(out, r#"<text x="{left}" y="18">plugin + apiserver + etcd CPU per ADD (ms), {pods} pods added in batches over the nodes' slices</text>"#);
    let _ = write!(out, r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, h - bottom, w - right, h - bottom);
    let _ = write!(out, r#"<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>"#, h - bottom);
    for i in 0..=4 {
        let v = y_max * i as f64 / 4.0;
        let _ = write!(out, r#"<text x="{}" y="{}" text-anchor="end">{v:.0}</text>"#, left - 6.0, y(v) + 4.0);
        let tick = pods * i / 4;
        let _ = write!(out, r#"<text x="{}" y="{}" text-anchor="middle">{tick} ({} a node)</text>"#, x(tick), h - bottom + 16.0, tick / nodes.max(1));
    }
    let _ = write!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">pods allocated before the batch (a node's pods, spread fill)</text>"#,
        (w + left) / 2.0,
        h - 6.0
    );
    for (k, (run, colour)) in runs.iter().zip(["#c0392b", "#2874a6", "#239b56", "#7d3c98", "#b9770e", "#17202a"]).enumerate() {
        let path: Vec<String> = run.points.iter().map(|p| format!("{:.1},{:.1}", x(p.pods_before), y(total(p)))).collect();
        let _ = write!(out, r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#, path.join(" "));
        let _ = write!(out, r#"<text x="{}" y="{}" fill="{colour}">{} pods, {}</text>"#, left + 12.0, top + 14.0 * (k as f64 + 1.0), run.pods, run.name());
    }
    out.push_str("</svg>\n");
    out
}
