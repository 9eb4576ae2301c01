//! whereabouts v0.9.4 and thereabouts side by side on the Kubernetes datastore:
//! the same burst of concurrent ADDs then DELs, the same dual-stack config
//! (192.0.2.0/24 + 2001:db8:90::/64, overlapping-range reservations on), the
//! same machine, one run. Each plugin gets a fresh kube-apiserver + etcd with
//! its own project's CRDs and RBAC only (no `deploy/flowcontrol.yaml`), and runs
//! as its own ServiceAccount: whereabouts from its release manifests (built by
//! `tests/k8s-bins/build-peers.sh`), thereabouts from `deploy/`.
//!
//! ```sh
//! bash scripts/build-plugin.sh
//! THEREABOUTS_K8S_BINS=$(bash tests/k8s-bins/build.sh) \
//!   cargo run --release -p thereabouts-k8s-harness --bin bench_k8s_versus -- --pods 200
//! ```
//!
//! Options: `--pods N` (200) concurrent calls per burst; `--ranges A,B` the
//! config's ranges (`192.0.2.0/24,2001:db8:90::/64`; a burst of more than 252
//! needs IPv6 ranges only, say `2001:db8:90::/64,2001:db8:91::/64`, since every
//! IPv4 documentation network is a /24); `--latency-ms L` (1)
//! the one-way delay of the second scenario, through toxiproxy (each way; `0`
//! runs the loopback scenario only); `--timeout-ms T` (120000) thereabouts'
//! budget per call (whereabouts has its own).
//!
//! `--nodes N` (0) turns node slices on for both plugins: N simulated nodes
//! (Node objects), a NetworkAttachmentDefinition of the config with
//! `node_slice_size` (`--slice-sizes /24,/76`: the first for the top-level key,
//! whereabouts' only one; each further one for its `ipRanges` entry, which only
//! thereabouts reads), each plugin's own controller (whereabouts'
//! node-slice-controller, `thereabouts controller`), and pod i on node i mod N
//! (`NODENAME`). whereabouts slices only its first range, IPv4 only: give it
//! `--ranges` with one IPv4 range for a comparison it can serve.
//!
//! Scenarios: the apiserver on loopback, then behind the latency proxy (a
//! cluster's network: every round trip costs 2 L). Per plugin and scenario it
//! prints the ADDs and DELs that succeeded, addresses handed out twice, wall
//! time and p50 / p99 / max latency, per call the API requests (the apiserver's
//! `apiserver_request_total` for the pool kinds and Leases), the CPU of the
//! plugin processes and of kube-apiserver + etcd, what the pools and
//! reservations still hold after the DELs, and the ratios. Failures are
//! reported as they happen, not retried.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir, addr_of, thereabouts_bin};
use thereabouts_k8s_harness::apiserver_metrics::{Metrics, RequestCounts};
use thereabouts_k8s_harness::bench::{Phase, Runner, process_cpu};
use thereabouts_k8s_harness::burst::Network;
use thereabouts_k8s_harness::controller::{self, Controller};
use thereabouts_k8s_harness::held::reservations_in;
use thereabouts_k8s_harness::plugin::{IPPOOLS, Objects, kubernetes_conf};
use thereabouts_k8s_harness::report::{ms, percentile};
use thereabouts_k8s_harness::{Cluster, LatencyProxy, block_on, peers};

const RANGES: [&str; 2] = ["192.0.2.0/24", "2001:db8:90::/64"];

struct Options {
    pods: usize,
    ranges: Vec<&'static str>,
    latency: Duration,
    timeout: Duration,
    /// Simulated nodes with node slices; 0 = no node slices.
    nodes: usize,
    slice_sizes: Vec<String>,
}

fn parse_options() -> Result<Options> {
    let mut o = Options {
        pods: 200,
        ranges: RANGES.to_vec(),
        latency: Duration::from_millis(1),
        timeout: Duration::from_secs(120),
        nodes: 0,
        slice_sizes: vec!["/24".into(), "/76".into()],
    };
    let mut args = std::env::args().skip(1);
    while let Some(name) = args.next() {
        if name == "--help" || name == "-h" {
            println!("bench_k8s_versus [--pods N (200)] [--ranges A,B] [--latency-ms L (1)] [--timeout-ms T (120000)] [--nodes N (0)] [--slice-sizes /24,/76]");
            std::process::exit(0);
        }
        let value = args.next().with_context(|| format!("{name} needs a value"))?;
        if name == "--slice-sizes" {
            o.slice_sizes = value.split(',').map(|s| s.trim().to_string()).collect();
            continue;
        }
        if name == "--ranges" {
            // The harness's network keeps `&'static str`s; a bench runs once.
            o.ranges = value.split(',').map(|r| &*Box::leak(r.trim().to_string().into_boxed_str())).collect();
            continue;
        }
        let number: u64 = value.parse().with_context(|| format!("{name} {value}: not a number"))?;
        match name.as_str() {
            "--pods" => o.pods = number as usize,
            "--latency-ms" => o.latency = Duration::from_millis(number),
            "--timeout-ms" => o.timeout = Duration::from_millis(number),
            "--nodes" => o.nodes = number as usize,
            _ => bail!("unknown option {name} (see --help)"),
        }
    }
    // Room for every pod and the warm-up pod in each range (network and
    // broadcast addresses excluded for IPv4).
    for range in &o.ranges {
        let (ip, prefix) = range.split_once('/').with_context(|| format!("range {range}: not a CIDR"))?;
        let bits: u32 = if ip.contains(':') { 128 } else { 32 };
        let prefix: u32 = prefix.parse().with_context(|| format!("range {range}: bad prefix"))?;
        let room = 1u128.checked_shl(bits.saturating_sub(prefix)).unwrap_or(u128::MAX).saturating_sub(3);
        if o.pods == 0 || o.pods as u128 > room {
            bail!("--pods {} does not fit in {range} ({room} pods at most with the warm-up pod)", o.pods);
        }
    }
    Ok(o)
}

#[derive(Clone, Copy, PartialEq)]
enum Plugin {
    Whereabouts,
    Thereabouts,
}

impl Plugin {
    fn name(self) -> &'static str {
        match self {
            Plugin::Whereabouts => "whereabouts v0.9.4",
            Plugin::Thereabouts => "thereabouts",
        }
    }
}

/// One plugin in one scenario.
struct Row {
    scenario: String,
    plugin: Plugin,
    adds: Phase<RequestCounts>,
    dels: Phase<RequestCounts>,
    duplicates: usize,
    left_entries: usize,
    left_reservations: usize,
}

/// Addresses handed out to more than one of the pods that succeeded.
fn duplicates(outcomes: &[Outcome]) -> usize {
    let mut seen = BTreeSet::<IpAddr>::new();
    let mut twice = 0;
    for ip in outcomes.iter().filter(|o| o.ok()).flat_map(|o| o.ips()) {
        if !seen.insert(addr_of(&ip)) {
            eprintln!("bench: {ip} handed out twice");
            twice += 1;
        }
    }
    twice
}

fn run(plugin: Plugin, latency: Option<Duration>, options: &Options) -> Result<Row> {
    let scenario = match latency {
        Some(l) => format!("{} ms latency each way", l.as_millis()),
        None => "loopback".to_string(),
    };
    eprintln!("bench: {} on {scenario}: starting a fresh control plane", plugin.name());
    let cluster = Cluster::start().context("starting etcd + kube-apiserver")?;
    let work = TempDir::new("versus");
    let (bin, identity): (PathBuf, PathBuf) = match plugin {
        Plugin::Thereabouts => {
            block_on(async {
                cluster.install_crds().await.context("installing deploy/crds")?;
                cluster.install_rbac().await.context("installing deploy/rbac.yaml")
            })?;
            (thereabouts_bin(), cluster.plugin_kubeconfig())
        }
        Plugin::Whereabouts => {
            let wb = peers::whereabouts()?;
            let install = block_on(wb.install(&cluster))?;
            (wb.plugin, install.kubeconfig)
        }
    };
    let proxy = latency.map(|l| LatencyProxy::with_latency(&cluster, l)).transpose()?;
    let kubeconfig = match &proxy {
        Some(p) => {
            let proxied = work.path().join("proxied.kubeconfig");
            p.kubeconfig(&identity, &proxied)?;
            proxied
        }
        None => identity,
    };
    let conf = match plugin {
        Plugin::Thereabouts => kubernetes_conf("versus", &kubeconfig, None, &options.ranges),
        Plugin::Whereabouts => peers::whereabouts_conf(work.path(), &kubeconfig, "", &options.ranges)?,
    };
    let conf = if options.nodes > 0 { sliced(conf, options) } else { conf };
    let _controller = if options.nodes > 0 { Some(lay_out_slices(plugin, &cluster, &conf, options, &work)?) } else { None };
    let net = Network::new(conf.clone(), &options.ranges, "versus");
    let objects = Objects::admin(&cluster)?;
    let metrics = Metrics::admin(&cluster)?;
    let scrape = |_: &str| {
        // The apiserver counts a request when its handler returns.
        std::thread::sleep(Duration::from_millis(200));
        metrics.requests().map_err(|e| eprintln!("bench: scraping /metrics: {e:#}")).ok()
    };
    let server_cpu = || cluster.pids().into_iter().map(process_cpu).sum::<Duration>();
    let runner = Runner { bin: &bin, net: &net, scrape: &scrape, server_cpu: &server_cpu };
    // Pod i runs on node i mod N (with node slices).
    let invocation = |command: &str, cid: &str, pod: &str, i: usize| {
        let call = Invocation::new(Call::pod(command, cid, pod), conf.to_string()).budget(options.timeout).watchdog(options.timeout + Duration::from_secs(60));
        if options.nodes > 0 { call.env("NODENAME", &node_name(i % options.nodes)) } else { call }
    };

    // Warm-up: the pools exist from here on (a running cluster's state), one
    // per node with node slices.
    for i in 0..options.nodes.max(1) {
        for command in ["ADD", "DEL"] {
            let warm = invocation(command, &format!("cid-warm-{i}"), &format!("warm-{i}"), i).run(&bin);
            if !warm.ok() {
                bail!("{} warm-up {command} failed: {}", plugin.name(), warm.describe());
            }
        }
    }
    let pods: Vec<(String, String)> = (0..options.pods).map(|i| (format!("cid-{i:04}"), format!("pod-{i:04}"))).collect();
    let calls = |command: &str| pods.iter().enumerate().map(|(i, (cid, pod))| invocation(command, cid, pod, i)).collect::<Vec<_>>();
    let label = format!("{} on {scenario}", plugin.name());
    let (adds, added) = runner.phase(&format!("{label}: {} concurrent ADDs", pods.len()), "ADD", &calls("ADD"), true);
    let duplicates = duplicates(&added);
    let (dels, _) = runner.phase(&format!("{label}: {} concurrent DELs", pods.len()), "DEL", &calls("DEL"), true);
    for (phase, what) in [(&adds, "ADDs"), (&dels, "DELs")] {
        let errors: Vec<String> = phase
            .requests
            .iter()
            .flat_map(|r| r.lines())
            .filter(|(line, _)| line.rsplit(' ').next().is_some_and(|c| c.starts_with('5')))
            .map(|(l, n)| format!("{l} ×{n}"))
            .collect();
        if !errors.is_empty() {
            eprintln!("bench: {label}: 5xx answers in the {what}: {}", errors.join(", "));
        }
    }
    // Every pool of the namespace: the whole-range pools, or the nodes' slice pools.
    let left_entries = objects.list(IPPOOLS)?.values().map(|p| p["spec"]["allocations"].as_object().map_or(0, |a| a.len())).sum();
    let left_reservations = reservations_in(&objects, &options.ranges)?.len();
    drop(proxy);
    Ok(Row { scenario, plugin, adds, dels, duplicates, left_entries, left_reservations })
}

fn node_name(i: usize) -> String {
    format!("node-{i:03}")
}

/// The config with node slices: the first size top-level, each further one on
/// its `ipRanges` entry.
fn sliced(mut conf: Value, options: &Options) -> Value {
    conf["ipam"]["node_slice_size"] = json!(options.slice_sizes[0]);
    for (i, size) in options.slice_sizes.iter().enumerate().skip(1) {
        if let Some(entry) = conf["ipam"]["ipRanges"].get_mut(i) {
            entry["node_slice_size"] = json!(size);
        }
    }
    conf
}

/// A plugin's node-slice controller, killed when dropped.
enum SliceController {
    Thereabouts(Controller),
    Whereabouts(std::process::Child),
}

impl Drop for SliceController {
    fn drop(&mut self) {
        match self {
            SliceController::Thereabouts(controller) => controller.kill(),
            SliceController::Whereabouts(child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Nodes, the NAD, the plugin's controller; returns once every node holds a
/// slice of every NodeSlicePool.
fn lay_out_slices(plugin: Plugin, cluster: &Cluster, conf: &Value, options: &Options, work: &TempDir) -> Result<SliceController> {
    let log = work.path().join("controller.log");
    let control = match plugin {
        Plugin::Thereabouts => {
            let kubeconfig = block_on(controller::install(cluster))?;
            SliceController::Thereabouts(Controller::start_with(&thereabouts_bin(), &kubeconfig, 150, 30, &log)?)
        }
        Plugin::Whereabouts => {
            block_on(controller::install_nad_crd(cluster))?;
            let output = std::fs::File::create(&log)?;
            let child = std::process::Command::new(&peers::whereabouts()?.node_slice_controller)
                .arg("--kubeconfig")
                .arg(cluster.admin_kubeconfig())
                .env("WHEREABOUTS_NAMESPACE", thereabouts_k8s_harness::NAMESPACE)
                .stdout(output.try_clone()?)
                .stderr(output)
                .spawn()
                .context("starting whereabouts' node-slice-controller")?;
            SliceController::Whereabouts(child)
        }
    };
    for i in 0..options.nodes {
        block_on(controller::add_node(cluster, &node_name(i)))?;
    }
    block_on(controller::create_nad(cluster, "versus", conf))?;
    controller::wait_for_layout(&Objects::admin(cluster)?, 1, options.nodes, Duration::from_secs(120))
        .with_context(|| format!("{} (controller log {})", plugin.name(), log.display()))?;
    eprintln!("bench: NodeSlicePools laid out for {} nodes", options.nodes);
    Ok(control)
}

fn per(value: Duration, calls: usize) -> String {
    ms(value / calls.max(1) as u32)
}

fn requests(phase: &Phase<RequestCounts>) -> String {
    phase.requests.as_ref().map_or("?".into(), |r| format!("{:.1}", r.total() / phase.calls.max(1) as f64))
}

/// The apiserver's refusals (409/422) and server errors (5xx) in a phase, as counts.
fn answers(phase: &Phase<RequestCounts>) -> String {
    phase.requests.as_ref().map_or("?".into(), |r| format!("{:.0} / {:.0}", r.conflicts(), r.server_errors()))
}

fn latencies(phase: &Phase<RequestCounts>) -> String {
    let l = &phase.latencies;
    format!("{} / {} / {}", ms(percentile(l, 50.0)), ms(percentile(l, 99.0)), ms(l.iter().max().copied().unwrap_or_default()))
}

fn main() -> Result<()> {
    let options = parse_options()?;
    let mut scenarios = vec![None];
    if !options.latency.is_zero() {
        scenarios.push(Some(options.latency));
    }
    let mut rows = Vec::new();
    for latency in &scenarios {
        for plugin in [Plugin::Whereabouts, Plugin::Thereabouts] {
            rows.push(run(plugin, *latency, &options)?);
        }
    }

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "{} concurrent ADDs then {} concurrent DELs, ranges {} with reservations, CRDs + RBAC only{}; {cores} cores",
        options.pods,
        options.pods,
        options.ranges.join(" + "),
        if options.nodes > 0 { format!(", over {} nodes with node slices {}", options.nodes, options.slice_sizes.join(" + ")) } else { String::new() }
    );
    println!();
    println!(
        "| scenario | plugin | ADDs ok | DELs ok | duplicates | ADD wall | ADD p50 / p99 / max | DEL wall | DEL p50 / p99 / max | API requests per ADD / DEL | plugin CPU per ADD / DEL | apiserver+etcd CPU per ADD / DEL | 409+422 / 5xx answers in ADDs, DELs | left: entries / reservations |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} / {} | {} / {} | {} | {:.2} s | {} | {:.2} s | {} | {} / {} | {} / {} | {} / {} | {}, {} | {} / {} |",
            r.scenario,
            r.plugin.name(),
            r.adds.calls - r.adds.failed,
            r.adds.calls,
            r.dels.calls - r.dels.failed,
            r.dels.calls,
            r.duplicates,
            r.adds.wall.as_secs_f64(),
            latencies(&r.adds),
            r.dels.wall.as_secs_f64(),
            latencies(&r.dels),
            requests(&r.adds),
            requests(&r.dels),
            per(r.adds.plugin_cpu, r.adds.calls),
            per(r.dels.plugin_cpu, r.dels.calls),
            per(r.adds.server_cpu, r.adds.calls),
            per(r.dels.server_cpu, r.dels.calls),
            answers(&r.adds),
            answers(&r.dels),
            r.left_entries,
            r.left_reservations,
        );
    }
    println!();
    for pair in rows.chunks(2) {
        let [w, t] = pair else { continue };
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
        println!(
            "- {}: thereabouts' ADD throughput {:.1}x whereabouts', DEL {:.1}x; apiserver+etcd CPU per ADD {:.2}x whereabouts', per DEL {:.2}x; plugin+apiserver+etcd CPU per ADD {} against {}",
            w.scenario,
            ratio(w.adds.wall, t.adds.wall),
            ratio(w.dels.wall, t.dels.wall),
            ratio(t.adds.server_cpu, w.adds.server_cpu),
            ratio(t.dels.server_cpu, w.dels.server_cpu),
            per(t.adds.server_cpu + t.adds.plugin_cpu, t.adds.calls),
            per(w.adds.server_cpu + w.adds.plugin_cpu, w.adds.calls),
        );
    }
    let bad: Vec<&Row> = rows
        .iter()
        .filter(|r| r.plugin == Plugin::Thereabouts && (r.adds.failed + r.dels.failed + r.duplicates + r.left_entries + r.left_reservations) > 0)
        .collect();
    if !bad.is_empty() {
        bail!("thereabouts failed calls, handed out duplicates or left allocations behind in {} scenario(s)", bad.len());
    }
    Ok(())
}
