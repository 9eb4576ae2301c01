//! Benchmark of the Kubernetes datastore against a real kube-apiserver + etcd
//! (the harness's, on loopback): the release `thereabouts` binary as a CNI plugin,
//! one process per call, with the least-privilege plugin identity of
//! `deploy/rbac.yaml`, on one dual-stack config (an IPv4 range sized for the
//! `192.0.2.0/24` + `2001:db8:90::/64`, documentation ranges).
//!
//! ```sh
//! bash scripts/build-plugin.sh
//! THEREABOUTS_K8S_BINS=$(bash tests/k8s-bins/build.sh) \
//!   cargo run --release -p thereabouts-k8s-harness --bin bench_k8s_burst -- --pods 200 --rounds 3
//! ```
//!
//! Options: `--pods N` (200) concurrent calls per burst, `--rounds R` (3) bursts,
//! `--sequential S` (20) calls of the uncontended phase, `--timeout-ms T`
//! (120000) the plugin's budget per call (`THEREABOUTS_TIMEOUT_MS`);
//! `--dump-metrics DIR` writes the apiserver's whole `/metrics` text before and
//! after every phase (`DIR/<n>-<before|after>-<phase>.prom`), for digging into
//! the apiserver's side (etcd operations, flow control, request durations).
//! `THEREABOUTS_CRDS_DIR=<dir>` installs the CRDs of `<dir>` instead of
//! `deploy/crds/` (e.g. whereabouts' own, from `tests/k8s-bins/build-peers.sh`).
//!
//! Phases, each on the same config (its pools are created by one warm-up ADD
//! first, then emptied again; after the first burst of ADDs, `--sequential`
//! more ADDs and DELs one at a time show what a write costs in a full pool):
//!
//! 1. uncontended: S ADDs one after another, then their S DELs;
//! 2. R rounds of: N ADDs started at once (one thread per process, released
//!    together), then their N DELs at once. Each round checks the outcome: every
//!    call succeeded, one address per range and pod, no duplicate, the pools
//!    hold exactly those entries (and are empty after the DELs).
//!
//! Per phase it prints wall time, throughput, p50/p90/p99/max latency (spawn to
//! exit of each process), and per call: API requests as the apiserver counted
//! them (`apiserver_request_total` of group `whereabouts.cni.cncf.io` from
//! `GET /metrics` before and after the phase: every request that reached it,
//! retries included), the same per range (total / number of ranges), the
//! requests answered 409/422 (conflicts), the re-plans the plugins logged
//! (`log_level: debug`, one log file per process), the etcd writes behind the
//! requests (`etcd_request_duration_seconds_count`: a PATCH the apiserver
//! re-applies because the object changed under it costs one etcd update per
//! attempt), and the CPU time of the
//! plugin processes (`getrusage` of the reaped children) and of kube-apiserver +
//! etcd (`/proc/<pid>/stat`). A markdown table at the end, then the requests per
//! call by verb, resource and answer code.
//!
//! Everything shares the machine: on 2 cores a burst of 200 processes competes
//! with the apiserver and etcd for CPU (in a cluster the plugins run on the
//! nodes, the apiserver elsewhere), so the CPU columns tell where the time goes.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use thereabouts_e2e::{Invocation, Outcome, addr_of, thereabouts_bin};
use thereabouts_k8s_harness::Cluster;
use thereabouts_k8s_harness::apiserver_metrics::{Metrics, RequestCounts};
use thereabouts_k8s_harness::bench::{Runner, process_cpu};
use thereabouts_k8s_harness::burst::Network;
use thereabouts_k8s_harness::held::{pool_entries, reservations_in};
use thereabouts_k8s_harness::plugin::{Objects, kubernetes_conf};
use thereabouts_k8s_harness::report::{ms, per_call, percentile};

struct Options {
    pods: usize,
    rounds: usize,
    sequential: usize,
    timeout: Duration,
    dump_metrics: Option<std::path::PathBuf>,
    /// Apply `deploy/flowcontrol.yaml` (the default; `--without-flowcontrol`
    /// measures the apiserver without it).
    flowcontrol: bool,
    /// Apply the chart's ValidatingAdmissionPolicies (`deploy/admission.yaml`)
    /// first (`--admission-policies`): the plugin is exempt, and must pay nothing.
    admission_policies: bool,
}

fn parse_options() -> Result<Options> {
    let mut o =
        Options { pods: 200, rounds: 3, sequential: 20, timeout: Duration::from_secs(120), dump_metrics: None, flowcontrol: true, admission_policies: false };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        if name == "--help" || name == "-h" {
            println!(
                "bench_k8s_burst [--pods N (200)] [--rounds R (3)] [--sequential S (20)] [--timeout-ms T (120000)] [--dump-metrics DIR] [--without-flowcontrol] [--admission-policies]"
            );
            std::process::exit(0);
        }
        if name == "--without-flowcontrol" {
            o.flowcontrol = false;
            continue;
        }
        if name == "--admission-policies" {
            o.admission_policies = true;
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => args.next().with_context(|| format!("{name} needs a value"))?,
        };
        if name == "--dump-metrics" {
            std::fs::create_dir_all(&value).with_context(|| format!("creating {value}"))?;
            o.dump_metrics = Some(value.into());
            continue;
        }
        let number: u64 = value.parse().with_context(|| format!("{name} {value}: not a number"))?;
        match name.as_str() {
            "--pods" => o.pods = number as usize,
            "--rounds" => o.rounds = number as usize,
            "--sequential" => o.sequential = number as usize,
            "--timeout-ms" => o.timeout = Duration::from_millis(number),
            _ => bail!("unknown option {name} (see --help)"),
        }
    }
    if o.pods == 0 {
        bail!("--pods must be at least 1");
    }
    Ok(o)
}

/// The IPv4 range: the documentation network 192.0.2.0/24, which holds 253
/// pods (its .255 is the broadcast address, and one address stays free so
/// that a full pool is never what is measured).
fn ipv4_range(n: usize) -> Result<&'static str> {
    if n > 253 {
        bail!("{n} pods do not fit in 192.0.2.0/24 (at most 252 with the warm-up pod)");
    }
    Ok("192.0.2.0/24")
}

struct Bench {
    cluster: Cluster,
    objects: Objects,
    metrics: Option<Metrics>,
    bin: std::path::PathBuf,
    net: Network,
    timeout: Duration,
    dump_metrics: Option<std::path::PathBuf>,
    dumps: std::cell::Cell<usize>,
}

type Phase = thereabouts_k8s_harness::bench::Phase<RequestCounts>;

impl Bench {
    fn invocation(&self, command: &str, cid: &str, pod: &str) -> Invocation {
        self.net.invocation(command, cid, pod, self.timeout)
    }

    /// The request counts now; with `--dump-metrics`, also the whole `/metrics`
    /// text as `<n>-<label>.prom`.
    fn scrape(&self, label: &str) -> Option<RequestCounts> {
        let m = self.metrics.as_ref()?;
        // The apiserver counts a request when its handler returns, a moment after
        // the client has the answer.
        std::thread::sleep(Duration::from_millis(200));
        let text = match m.text() {
            Ok(t) => t,
            Err(e) => {
                eprintln!("bench: scraping /metrics failed: {e:#}");
                return None;
            }
        };
        if let Some(dir) = &self.dump_metrics {
            let n = self.dumps.get() + 1;
            self.dumps.set(n);
            let file: String = label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
            let path = dir.join(format!("{n:02}-{file}.prom"));
            if let Err(e) = std::fs::write(&path, &text) {
                eprintln!("bench: writing {}: {e}", path.display());
            }
        }
        Some(RequestCounts::parse(&text))
    }

    /// Runs `pods` one after another (`concurrent` false) or all at once.
    fn phase(&self, name: &str, command: &str, pods: &[(String, String)], concurrent: bool) -> (Phase, Vec<Outcome>) {
        let invocations: Vec<Invocation> = pods.iter().map(|(cid, pod)| self.invocation(command, cid, pod)).collect();
        let server_cpu = || self.cluster.pids().into_iter().map(process_cpu).sum::<Duration>();
        let runner = Runner { bin: &self.bin, net: &self.net, scrape: &|label| self.scrape(label), server_cpu: &server_cpu };
        runner.phase(name, command, &invocations, concurrent)
    }

    /// After ADDs: one address per range per successful pod, no duplicates, and
    /// the pools hold exactly the entries of `expected` pods.
    fn check_added(&self, outcomes: &[Outcome], expected: usize) -> Result<()> {
        let mut seen: Vec<BTreeSet<IpAddr>> = vec![BTreeSet::new(); self.net.ranges.len()];
        for o in outcomes.iter().filter(|o| o.ok()) {
            let ips = o.ips();
            if ips.len() != self.net.ranges.len() {
                bail!("{} addresses for one pod: {}", ips.len(), o.describe());
            }
            for (ip, set) in ips.iter().zip(seen.iter_mut()) {
                if !set.insert(addr_of(ip)) {
                    bail!("{ip} handed out twice");
                }
            }
        }
        for (pool, range) in self.net.pools() {
            let n = pool_entries(&self.objects, &pool, range)?.len();
            if n != expected {
                bail!("IPPool {pool} holds {n} entries, expected {expected}");
            }
        }
        Ok(())
    }

    fn check_empty(&self) -> Result<()> {
        for (pool, _) in self.net.pools() {
            let n = self.objects.allocations(&pool)?.len();
            if n != 0 {
                bail!("IPPool {pool} still holds {n} entries");
            }
        }
        let left = reservations_in(&self.objects, &self.net.ranges)?.len();
        if left != 0 {
            bail!("{left} reservations left");
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    let options = parse_options()?;
    let bin = thereabouts_bin();
    let t0 = Instant::now();
    let cluster = Cluster::prepared_with(options.flowcontrol).context("starting etcd + kube-apiserver")?;
    eprintln!("bench: deploy/flowcontrol.yaml {}", if options.flowcontrol { "applied" } else { "NOT applied (--without-flowcontrol)" });
    if options.admission_policies {
        thereabouts_k8s_harness::block_on(cluster.apply_path(&thereabouts_k8s_harness::deploy_dir().join("admission.yaml")))
            .context("applying deploy/admission.yaml")?;
    }
    eprintln!("bench: deploy/admission.yaml {}", if options.admission_policies { "applied (--admission-policies)" } else { "not applied" });
    eprintln!("bench: CRDs from {} (${})", thereabouts_k8s_harness::crds_dir().display(), thereabouts_k8s_harness::CRDS_DIR_ENV);
    eprintln!("bench: control plane ready in {:.1?}", t0.elapsed());
    let metrics = match Metrics::admin(&cluster).and_then(|m| m.requests().map(|_| m)) {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("bench: no apiserver metrics ({e:#}); counting from the plugin logs only");
            None
        }
    };
    let ranges = [ipv4_range(options.pods.max(options.sequential) + 1)?, "2001:db8:90::/64"];
    let bench = Bench {
        objects: Objects::admin(&cluster)?,
        metrics,
        bin,
        net: Network::new(kubernetes_conf("k8s-bench", &cluster.plugin_kubeconfig(), None, &ranges), &ranges, "k8s-bench"),
        timeout: options.timeout,
        dump_metrics: options.dump_metrics.clone(),
        dumps: std::cell::Cell::new(0),
        cluster,
    };

    // Warm-up: the pools exist from here on (a running cluster's state).
    let warm = bench.invocation("ADD", "cid-warm", "warm").run(&bench.bin);
    if !warm.ok() {
        bail!("warm-up ADD failed: {}", warm.describe());
    }
    let warm_del = bench.invocation("DEL", "cid-warm", "warm").run(&bench.bin);
    if !warm_del.ok() {
        bail!("warm-up DEL failed: {}", warm_del.describe());
    }

    let mut phases: Vec<Phase> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    let sequential: Vec<(String, String)> = (0..options.sequential).map(|i| (format!("cid-seq-{i:03}"), format!("seq-{i:03}"))).collect();
    if !sequential.is_empty() {
        let (p, outcomes) = bench.phase("uncontended ADD (sequential)", "ADD", &sequential, false);
        if let Err(e) = bench.check_added(&outcomes, sequential.len() - p.failed) {
            problems.push(format!("{}: {e:#}", p.name));
        }
        phases.push(p);
        let (p, _) = bench.phase("uncontended DEL (sequential)", "DEL", &sequential, false);
        if let Err(e) = bench.check_empty() {
            problems.push(format!("{}: {e:#}", p.name));
        }
        phases.push(p);
    }

    let mut burst_adds = Vec::new();
    let mut burst_dels = Vec::new();
    for round in 1..=options.rounds {
        let pods: Vec<(String, String)> = (0..options.pods).map(|i| (format!("cid-r{round}-{i:04}"), format!("burst-r{round}-{i:04}"))).collect();
        let (p, outcomes) = bench.phase(&format!("burst ADD ({} concurrent), round {round}", options.pods), "ADD", &pods, true);
        if let Err(e) = bench.check_added(&outcomes, pods.len() - p.failed) {
            problems.push(format!("{}: {e:#}", p.name));
        }
        burst_adds.push(p);
        if round == 1 && !sequential.is_empty() {
            // What one ADD and one DEL cost once the pools are full of entries:
            // the apiserver decodes, validates and re-encodes the whole object
            // for every write, so a write's price grows with the pool.
            let extra: Vec<(String, String)> = (0..options.sequential).map(|i| (format!("cid-full-{i:03}"), format!("full-{i:03}"))).collect();
            let held = options.pods;
            let (p, _) = bench.phase(&format!("uncontended ADD (sequential), pools at {held} entries"), "ADD", &extra, false);
            phases.push(p);
            let (p, _) = bench.phase(&format!("uncontended DEL (sequential), pools at {held} entries"), "DEL", &extra, false);
            phases.push(p);
        }
        let (p, _) = bench.phase(&format!("burst DEL ({} concurrent), round {round}", options.pods), "DEL", &pods, true);
        if let Err(e) = bench.check_empty() {
            problems.push(format!("{}: {e:#}", p.name));
        }
        burst_dels.push(p);
    }
    let mut table: Vec<Phase> = Vec::new();
    table.append(&mut phases);
    if options.rounds > 1 {
        table.push(Phase::merge(&format!("burst ADD ({} concurrent), {} rounds", options.pods, options.rounds), &burst_adds.iter().collect::<Vec<_>>()));
        table.push(Phase::merge(&format!("burst DEL ({} concurrent), {} rounds", options.pods, options.rounds), &burst_dels.iter().collect::<Vec<_>>()));
    }
    let mut rounds: Vec<Phase> = burst_adds.into_iter().zip(burst_dels).flat_map(|(a, d)| [a, d]).collect();
    // One round: its rows are the summary (and get the breakdowns below).
    if options.rounds == 1 {
        table.append(&mut rounds);
    }

    let version = bench.cluster.binaries().kube_apiserver.parent().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let n_ranges = bench.net.ranges.len();
    println!();
    println!(
        "thereabouts Kubernetes datastore, {} ({cores} cores); ranges {}; one process per call; plugin budget {} ms",
        version,
        bench.net.ranges.join(" + "),
        options.timeout.as_millis()
    );
    println!();
    println!(
        "| phase | calls | wall | calls/s | p50 | p90 | p99 | max | API requests / call | per range | 409/422 answers / call | re-plans / call | etcd writes / call | CPU / call: plugin, apiserver+etcd | failed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in table.iter().chain(&rounds) {
        let (requests, per_range, conflicts, etcd) = match &p.requests {
            Some(r) => (
                per_call(r.total(), p.calls),
                per_call(r.total() / n_ranges as f64, p.calls),
                per_call(r.conflicts(), p.calls),
                per_call(r.etcd_writes(), p.calls),
            ),
            None => (
                format!("{} (logs)", per_call(p.logs.requests as f64, p.calls)),
                per_call(p.logs.requests as f64 / n_ranges as f64, p.calls),
                "n/a".to_string(),
                "n/a".to_string(),
            ),
        };
        println!(
            "| {} | {} | {:.2} s | {:.0} | {} | {} | {} | {} | {requests} | {per_range} | {conflicts} | {} | {etcd} | {}, {} | {} |",
            p.name,
            p.calls,
            p.wall.as_secs_f64(),
            p.calls as f64 / p.wall.as_secs_f64(),
            ms(percentile(&p.latencies, 50.0)),
            ms(percentile(&p.latencies, 90.0)),
            ms(percentile(&p.latencies, 99.0)),
            ms(percentile(&p.latencies, 100.0)),
            per_call(p.logs.replans as f64, p.calls),
            ms(p.plugin_cpu / p.calls.max(1) as u32),
            ms(p.server_cpu / p.calls.max(1) as u32),
            p.failed,
        );
    }
    println!();
    println!("API requests per call by verb, resource and answer (apiserver_request_total), and as the plugins logged them:");
    println!();
    for p in &table {
        let counted = match &p.requests {
            Some(r) => r.lines().iter().map(|(k, v)| format!("{k}: {}", per_call(*v, p.calls))).collect::<Vec<_>>().join(", "),
            None => "n/a".to_string(),
        };
        let logged = p.logs.by_target.iter().map(|(k, v)| format!("{k}: {}", per_call(*v as f64, p.calls))).collect::<Vec<_>>().join(", ");
        println!("- {}: apiserver {counted}; plugin logs {} per call ({logged})", p.name, per_call(p.logs.requests as f64, p.calls));
    }
    println!();
    println!(
        "Inside the apiserver, per call: etcd operations (etcd_request_duration_seconds_count; a PATCH re-applied after the object changed under it costs one etcd update per attempt) and the mean time of a request (apiserver_request_duration_seconds):"
    );
    println!();
    for p in &table {
        let Some(r) = &p.requests else { continue };
        let etcd = r.etcd_lines().iter().map(|(k, v)| format!("{k}: {}", per_call(*v, p.calls))).collect::<Vec<_>>().join(", ");
        let durations = r.mean_durations().iter().map(|(k, d)| format!("{k}: {}", ms(*d))).collect::<Vec<_>>().join(", ");
        println!("- {}: etcd {etcd}; mean {durations}", p.name);
    }
    if problems.is_empty() {
        println!();
        println!("checks: every phase left one address per range and pod, no duplicate, and empty pools after the DELs");
        Ok(())
    } else {
        for p in &problems {
            eprintln!("bench: CHECK FAILED: {p}");
        }
        bail!("{} check(s) failed", problems.len())
    }
}
