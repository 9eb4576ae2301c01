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
//! ```sh
//! bash scripts/build-plugin.sh
//! THEREABOUTS_K8S_BINS=$(bash tests/k8s-bins/build.sh) \
//!   cargo run --release -p thereabouts-k8s-harness --bin bench_k8s_scale -- --pods 20000 --nodes 100 --batch 500 --svg docs/scale.svg
//! ```

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, TempDir, addr_of, thereabouts_bin};
use thereabouts_k8s_harness::apiserver_metrics::{Metrics, RequestCounts};
use thereabouts_k8s_harness::bench::{Phase, Runner, process_cpu};
use thereabouts_k8s_harness::burst::Network;
use thereabouts_k8s_harness::controller::{self, Controller};
use thereabouts_k8s_harness::plugin::{IPPOOLS, Objects, kubernetes_conf};
use thereabouts_k8s_harness::{Cluster, block_on};

const RANGES: [&str; 2] = ["198.18.0.0/15", "2001:db8:b0::/64"];
/// The bound this bench holds every object to (the NodeSlicePool of 4 096
/// slices is the largest by design).
const OBJECT_BOUND: usize = 512 * 1024;

struct Options {
    pods: usize,
    nodes: usize,
    batch: usize,
    svg: Option<PathBuf>,
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
        pods: 20_000,
        nodes: 100,
        batch: 500,
        svg: None,
        fills: vec![Fill::Spread, Fill::NodeByNode],
        bounds: vec![0],
        slice_sizes: ["/24".into(), "/72".into()],
    };
    let mut args = std::env::args().skip(1);
    while let Some(name) = args.next() {
        let value = args.next().with_context(|| format!("{name} needs a value"))?;
        match name.as_str() {
            "--pods" => o.pods = value.parse()?,
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
            _ => bail!("unknown option {name}: --pods N --nodes N --batch N --fill spread,node --max-entries 0,32 --slice-sizes /24,/72 --svg FILE"),
        }
    }
    if o.nodes == 0 || o.batch == 0 || (o.slice_sizes[0] == "/24" && o.pods / o.nodes > 250) {
        bail!("--nodes and --batch must be positive, and a node's pods fit in one /24 slice (at most 250 per node)");
    }
    Ok(o)
}

/// One batch's figures, per ADD.
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
    nodes: usize,
    per_node: usize,
    points: Vec<Point>,
    failed: usize,
    addresses: usize,
    pool_bytes: usize,
    slice_pool_bytes: usize,
    control: ControllerFigures,
    /// etcd's database file at the end.
    etcd_db_bytes: u64,
}

/// What the controller cost over a run: its peak RSS (the kernel's `VmHWM`)
/// and its full reconcile passes (count, mean seconds), from its `/metrics`.
struct ControllerFigures {
    peak_rss_kib: u64,
    full_passes: f64,
    full_pass_seconds: f64,
}

impl ControllerFigures {
    fn of(controller: &Controller) -> Self {
        let status = std::fs::read_to_string(format!("/proc/{}/status", controller.pid())).unwrap_or_default();
        let peak_rss_kib = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0);
        let page = controller.scrape().unwrap_or_default();
        let metric = |name: &str| page.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0);
        let full_passes = metric("thereabouts_reconcile_duration_seconds_count{kind=\"full\"}");
        let sum = metric("thereabouts_reconcile_duration_seconds_sum{kind=\"full\"}");
        ControllerFigures { peak_rss_kib, full_passes, full_pass_seconds: if full_passes > 0.0 { sum / full_passes } else { 0.0 } }
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

fn run(o: &Options, fill: Fill, bound: u32) -> Result<Run> {
    let cluster = Cluster::prepared_with(false).context("starting the control plane")?;
    let work = TempDir::new("scale");
    let mut conf = kubernetes_conf("scale", &cluster.plugin_kubeconfig(), None, &RANGES);
    conf["ipam"]["node_slice_size"] = json!(o.slice_sizes[0]);
    conf["ipam"]["ipRanges"][1]["node_slice_size"] = json!(o.slice_sizes[1]);
    if bound > 0 {
        conf["ipam"]["node_slice_max_entries"] = json!(bound);
    }
    let kubeconfig = block_on(controller::install(&cluster))?;
    let controller = Controller::start_with(&thereabouts_bin(), &kubeconfig, 150, 30, &work.path().join("controller.log"))?;
    let node = |i: usize| format!("node-{i:03}");
    for i in 0..o.nodes {
        block_on(controller::add_node(&cluster, &node(i)))?;
    }
    block_on(controller::create_nad(&cluster, "scale", &conf))?;
    let objects = Objects::admin(&cluster)?;
    controller::wait_for_layout(&objects, 2, o.nodes, Duration::from_secs(120))?;

    let net = Network::new(conf.clone(), &RANGES, "scale");
    let metrics = Metrics::admin(&cluster)?;
    let scrape = |_: &str| {
        std::thread::sleep(Duration::from_millis(200));
        metrics.requests().ok()
    };
    let server_cpu = || cluster.pids().into_iter().map(process_cpu).sum::<Duration>();
    let bin = thereabouts_bin();
    let runner = Runner { bin: &bin, net: &net, scrape: &scrape, server_cpu: &server_cpu };
    let per_node = o.pods.div_ceil(o.nodes);
    let node_of = |i: usize| match fill {
        Fill::Spread => i % o.nodes,
        Fill::NodeByNode => i / per_node,
    };
    let invocation = |i: usize| {
        Invocation::new(Call::pod("ADD", &format!("cid-{i:05}"), &format!("pod-{i:05}")), conf.to_string())
            .env("NODENAME", &node(node_of(i)))
            .watchdog(Duration::from_secs(180))
    };
    let mut points = Vec::new();
    let mut seen = BTreeSet::new();
    let mut failed = 0;
    for start in (0..o.pods).step_by(o.batch) {
        let calls: Vec<Invocation> = (start..(start + o.batch).min(o.pods)).map(invocation).collect();
        let (phase, outcomes) = runner.phase(&format!("{}: pods {start}..{}", fill.name(), start + calls.len()), "ADD", &calls, true);
        failed += phase.failed;
        for ip in outcomes.iter().filter(|o| o.ok()).flat_map(|o| o.ips()) {
            if !seen.insert(addr_of(&ip)) {
                bail!("{ip} handed out twice");
            }
        }
        points.push(point(start, &phase));
    }
    let (pool_bytes, slice_pool_bytes) = largest(&objects)?;
    let control = ControllerFigures::of(&controller);
    let etcd_db_bytes = std::fs::metadata(cluster.dir().join("etcd/member/snap/db")).map_or(0, |m| m.len());
    Ok(Run { fill, bound, nodes: o.nodes, per_node, points, failed, addresses: seen.len(), pool_bytes, slice_pool_bytes, control, etcd_db_bytes })
}

fn main() -> Result<()> {
    let o = parse_options()?;
    let runs = o.bounds.iter().flat_map(|b| o.fills.iter().map(move |f| (*f, *b))).map(|(f, b)| run(&o, f, b)).collect::<Result<Vec<_>>>()?;
    println!();
    println!(
        "{} pods over {} nodes in batches of {}, ranges {} in {} + {} slices, reservations on; 2 cores",
        o.pods,
        o.nodes,
        o.batch,
        RANGES.join(" + "),
        o.slice_sizes[0],
        o.slice_sizes[1]
    );
    for r in &runs {
        println!();
        println!("**{}**", r.name());
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
        println!("- ADDs failed: {}; addresses handed out: {} (none twice)", r.failed, r.addresses);
        println!("- largest IPPool: {} bytes; largest NodeSlicePool: {} bytes; bound {OBJECT_BOUND} bytes", r.pool_bytes, r.slice_pool_bytes);
        println!(
            "- controller: peak RSS {:.1} MiB; {} full reconcile passes, {:.2} s each on average; etcd database {:.1} MiB at the end",
            r.control.peak_rss_kib as f64 / 1024.0,
            r.control.full_passes,
            r.control.full_pass_seconds,
            r.etcd_db_bytes as f64 / 1048576.0
        );
    }
    if let Some(path) = &o.svg {
        std::fs::write(path, svg(&runs, o.pods)).with_context(|| format!("writing {}", path.display()))?;
        println!("- plot: {}", path.display());
    }
    let bad = runs.iter().filter(|r| r.failed > 0 || r.pool_bytes.max(r.slice_pool_bytes) > OBJECT_BOUND).count();
    if bad > 0 {
        bail!("{bad} run(s) failed ADDs, or held an object over {OBJECT_BOUND} bytes");
    }
    Ok(())
}

/// A line plot of the plugin + apiserver + etcd CPU per ADD against the pods
/// already allocated, one line per fill, as plain SVG.
fn svg(runs: &[Run], pods: usize) -> String {
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
        let _ = write!(out, r#"<text x="{}" y="{}" text-anchor="middle">{tick}</text>"#, x(tick), h - bottom + 16.0);
    }
    let _ = write!(out, r#"<text x="{}" y="{}" text-anchor="middle">pods allocated before the batch</text>"#, (w + left) / 2.0, h - 6.0);
    for (k, (run, colour)) in runs.iter().zip(["#c0392b", "#2874a6", "#239b56", "#7d3c98", "#b9770e", "#17202a"]).enumerate() {
        let path: Vec<String> = run.points.iter().map(|p| format!("{:.1},{:.1}", x(p.pods_before), y(total(p)))).collect();
        let _ = write!(out, r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#, path.join(" "));
        let _ = write!(out, r#"<text x="{}" y="{}" fill="{colour}">{}</text>"#, left + 12.0, top + 14.0 * (k as f64 + 1.0), run.name());
    }
    out.push_str("</svg>\n");
    out
}
