//! Benchmark of the etcd datastore against a real etcd (3.6, the harness's, on
//! loopback, plain HTTP): the release `thereabouts` binary as a CNI plugin, one
//! process per call, on one dual-stack config (`192.0.2.0/24` +
//! `2001:db8:90::/64`, documentation ranges). The same shape as `bench_k8s_burst`.
//!
//! ```sh
//! bash scripts/build-plugin.sh
//! THEREABOUTS_K8S_BINS=$(bash tests/k8s-bins/build.sh) \
//!   cargo run --release -p thereabouts-k8s-harness --bin bench_etcd_burst -- --pods 200 --rounds 3
//! ```
//!
//! Options: `--pods N` (200) concurrent calls per burst, `--rounds R` (3) bursts,
//! `--sequential S` (20) calls of the uncontended phase, `--timeout-ms T`
//! (120000) the plugin's budget per call (`THEREABOUTS_TIMEOUT_MS`).
//!
//! Phases, on the same config (its pool keys are created by one warm-up ADD
//! first, then emptied again):
//!
//! 1. uncontended: S ADDs one after another, then their S DELs;
//! 2. R rounds of: N ADDs started at once (one thread per process, released
//!    together), then their N DELs at once. Each phase checks the outcome: every
//!    call succeeded, one address per range and pod, no duplicate, the pool keys
//!    hold exactly those entries (and are empty, with no reservation key left,
//!    after the DELs).
//!
//! Per phase it prints wall time, throughput, p50/p90/p99/max latency (spawn to
//! exit of each process), and per call: the etcd requests etcd counted
//! (`grpc_server_handled_total` of its `/metrics` before and after the phase,
//! KV and Authenticate methods: every request that reached it, retries
//! included), the requests the plugins logged (`log_level: debug`, one log file
//! per process; a connect is logged as a request), the commit transactions sent
//! and the re-plans after a conflict (a commit whose guard failed), and the CPU
//! time of the plugin processes (`getrusage` of the reaped children) and of etcd
//! (`/proc/<pid>/stat`). A markdown table, then the requests per call by kind.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use thereabouts_e2e::{Invocation, Outcome, addr_of, thereabouts_bin};
use thereabouts_k8s_harness::addresses::pool_name;
use thereabouts_k8s_harness::bench::{Runner, process_cpu};
use thereabouts_k8s_harness::burst::Network;
use thereabouts_k8s_harness::etcd::{Etcd, GrpcCounts, etcd_conf};
use thereabouts_k8s_harness::report::{ms, per_call, percentile};

/// The datastore's default `etcd_prefix`.
const PREFIX: &str = "/thereabouts/";
const RANGES: [&str; 2] = ["192.0.2.0/24", "2001:db8:90::/64"];

struct Options {
    pods: usize,
    rounds: usize,
    sequential: usize,
    timeout: Duration,
}

fn parse_options() -> Result<Options> {
    let mut o = Options { pods: 200, rounds: 3, sequential: 20, timeout: Duration::from_secs(120) };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--help" || arg == "-h" {
            println!("bench_etcd_burst [--pods N (200)] [--rounds R (3)] [--sequential S (20)] [--timeout-ms T (120000)]");
            std::process::exit(0);
        }
        let (name, value) = match arg.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => (arg.clone(), args.next().with_context(|| format!("{arg} needs a value"))?),
        };
        let number: u64 = value.parse().with_context(|| format!("{name} {value}: not a number"))?;
        match name.as_str() {
            "--pods" => o.pods = number as usize,
            "--rounds" => o.rounds = number as usize,
            "--sequential" => o.sequential = number as usize,
            "--timeout-ms" => o.timeout = Duration::from_millis(number),
            _ => bail!("unknown option {name} (see --help)"),
        }
    }
    // 192.0.2.0/24 holds 253 pods; one address stays free so that a full pool
    // is never what is measured.
    if o.pods == 0 || o.pods.max(o.sequential) > 252 {
        bail!("--pods and --sequential must be between 1 and 252 (192.0.2.0/24)");
    }
    Ok(o)
}

type Phase = thereabouts_k8s_harness::bench::Phase<GrpcCounts>;

/// Commit transactions the plugins logged in a phase.
fn commits(p: &Phase) -> usize {
    p.logs.by_target.get("etcd commit txn").copied().unwrap_or(0)
}

struct Bench {
    etcd: Etcd,
    bin: std::path::PathBuf,
    net: Network,
    timeout: Duration,
}

impl Bench {
    fn pools(&self) -> Vec<(String, &'static str)> {
        RANGES.iter().map(|r| (pool_name(r), *r)).collect()
    }

    fn invocation(&self, command: &str, cid: &str, pod: &str) -> Invocation {
        self.net.invocation(command, cid, pod, self.timeout)
    }

    fn scrape(&self) -> Option<GrpcCounts> {
        match self.etcd.metrics() {
            Ok(text) => Some(GrpcCounts::parse(&text)),
            Err(e) => {
                eprintln!("bench: scraping etcd /metrics failed: {e:#}");
                None
            }
        }
    }

    fn etcd_cpu(&self) -> Duration {
        self.etcd.pid().map(process_cpu).unwrap_or_default()
    }

    /// Runs `pods` one after another (`concurrent` false) or all at once.
    fn phase(&self, name: &str, command: &str, pods: &[(String, String)], concurrent: bool) -> (Phase, Vec<Outcome>) {
        let invocations: Vec<Invocation> = pods.iter().map(|(cid, pod)| self.invocation(command, cid, pod)).collect();
        let runner = Runner { bin: &self.bin, net: &self.net, scrape: &|_| self.scrape(), server_cpu: &|| self.etcd_cpu() };
        runner.phase(name, command, &invocations, concurrent)
    }

    /// After ADDs: one address per range per successful pod, no duplicates, and
    /// the pool keys hold exactly `expected` entries.
    fn check_added(&self, outcomes: &[Outcome], expected: usize) -> Result<()> {
        let mut seen: Vec<BTreeSet<IpAddr>> = vec![BTreeSet::new(); RANGES.len()];
        for o in outcomes.iter().filter(|o| o.ok()) {
            let ips = o.ips();
            if ips.len() != RANGES.len() {
                bail!("{} addresses for one pod: {}", ips.len(), o.describe());
            }
            for (ip, set) in ips.iter().zip(seen.iter_mut()) {
                if !set.insert(addr_of(ip)) {
                    bail!("{ip} handed out twice");
                }
            }
        }
        for (pool, range) in self.pools() {
            let n = self.etcd.pool_entries(PREFIX, &pool, range)?.len();
            if n != expected {
                bail!("pool key {pool} holds {n} entries, expected {expected}");
            }
        }
        let reserved = self.etcd.reservations(PREFIX)?.len();
        if reserved != expected * RANGES.len() {
            bail!("{reserved} reservation keys, expected {}", expected * RANGES.len());
        }
        Ok(())
    }

    fn check_empty(&self) -> Result<()> {
        for (pool, range) in self.pools() {
            let n = self.etcd.pool_entries(PREFIX, &pool, range)?.len();
            if n != 0 {
                bail!("pool key {pool} still holds {n} entries");
            }
        }
        let left = self.etcd.reservations(PREFIX)?.len();
        if left != 0 {
            bail!("{left} reservation keys left");
        }
        Ok(())
    }
}

fn pods(tag: &str, n: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("cid-{tag}-{i:04}"), format!("{tag}-{i:04}"))).collect()
}

fn main() -> Result<()> {
    let options = parse_options()?;
    let etcd = Etcd::start_plain().context("starting etcd")?;
    let bench = Bench {
        net: Network::new(etcd_conf(etcd.access(), "etcd-bench", &RANGES), &RANGES, "etcd-bench"),
        etcd,
        bin: thereabouts_bin(),
        timeout: options.timeout,
    };

    // Warm-up: the pool keys exist from here on (a running cluster's state).
    for command in ["ADD", "DEL"] {
        let warm = bench.invocation(command, "cid-warm", "warm").run(&bench.bin);
        if !warm.ok() {
            bail!("warm-up {command} failed: {}", warm.describe());
        }
    }

    let mut table: Vec<Phase> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    if options.sequential > 0 {
        let sequential = pods("seq", options.sequential);
        let (p, outcomes) = bench.phase("uncontended ADD (sequential)", "ADD", &sequential, false);
        if let Err(e) = bench.check_added(&outcomes, sequential.len() - p.failed) {
            problems.push(format!("{}: {e:#}", p.name));
        }
        table.push(p);
        let (p, _) = bench.phase("uncontended DEL (sequential)", "DEL", &sequential, false);
        if let Err(e) = bench.check_empty() {
            problems.push(format!("{}: {e:#}", p.name));
        }
        table.push(p);
    }
    let mut rounds: Vec<Phase> = Vec::new();
    for round in 1..=options.rounds {
        let burst = pods(&format!("r{round}"), options.pods);
        let (p, outcomes) = bench.phase(&format!("burst ADD ({} concurrent), round {round}", options.pods), "ADD", &burst, true);
        if let Err(e) = bench.check_added(&outcomes, burst.len() - p.failed) {
            problems.push(format!("{}: {e:#}", p.name));
        }
        rounds.push(p);
        let (p, _) = bench.phase(&format!("burst DEL ({} concurrent), round {round}", options.pods), "DEL", &burst, true);
        if let Err(e) = bench.check_empty() {
            problems.push(format!("{}: {e:#}", p.name));
        }
        rounds.push(p);
    }
    if options.rounds > 1 {
        let (adds, dels): (Vec<Phase>, Vec<Phase>) = rounds.drain(..).partition(|p| p.name.starts_with("burst ADD"));
        table.push(Phase::merge(&format!("burst ADD ({} concurrent), {} rounds", options.pods, options.rounds), &adds.iter().collect::<Vec<_>>()));
        table.push(Phase::merge(&format!("burst DEL ({} concurrent), {} rounds", options.pods, options.rounds), &dels.iter().collect::<Vec<_>>()));
        // Each round too, after the summary.
        rounds = adds.into_iter().zip(dels).flat_map(|(a, d)| [a, d]).collect();
    } else {
        table.append(&mut rounds);
    }

    let version = bench.etcd.binary_dir_name();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "thereabouts etcd datastore, {version} ({cores} cores); ranges {}; one process per call; plugin budget {} ms",
        RANGES.join(" + "),
        options.timeout.as_millis()
    );
    println!();
    println!(
        "| phase | calls | wall | calls/s | p50 | p90 | p99 | max | etcd requests / call | commit txns / call | re-plans / call | CPU / call: plugin, etcd | failed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in table.iter().chain(&rounds) {
        let requests = match &p.requests {
            Some(r) => per_call(r.total(), p.calls),
            None => format!("{} (logs)", per_call(p.logs.requests as f64, p.calls)),
        };
        println!(
            "| {} | {} | {:.2} s | {:.0} | {} | {} | {} | {} | {requests} | {} | {} | {}, {} | {} |",
            p.name,
            p.calls,
            p.wall.as_secs_f64(),
            p.calls as f64 / p.wall.as_secs_f64(),
            ms(percentile(&p.latencies, 50.0)),
            ms(percentile(&p.latencies, 90.0)),
            ms(percentile(&p.latencies, 99.0)),
            ms(percentile(&p.latencies, 100.0)),
            per_call(commits(p) as f64, p.calls),
            per_call(p.logs.replans as f64, p.calls),
            ms(p.plugin_cpu / p.calls.max(1) as u32),
            ms(p.server_cpu / p.calls.max(1) as u32),
            p.failed,
        );
    }
    println!();
    println!("etcd requests per call by method and code (grpc_server_handled_total), and as the plugins logged them:");
    println!();
    for p in &table {
        let counted = match &p.requests {
            Some(r) => r.lines().iter().map(|(k, v)| format!("{k}: {}", per_call(*v, p.calls))).collect::<Vec<_>>().join(", "),
            None => "n/a".to_string(),
        };
        let logged = p.logs.by_target.iter().map(|(k, v)| format!("{k}: {}", per_call(*v as f64, p.calls))).collect::<Vec<_>>().join(", ");
        println!("- {}: etcd {counted}; plugin logs {} per call ({logged})", p.name, per_call(p.logs.requests as f64, p.calls));
    }
    if problems.is_empty() {
        println!();
        println!("checks: every phase left one address per range and pod, no duplicate, and empty pool keys and no reservation key after the DELs");
        Ok(())
    } else {
        for p in &problems {
            eprintln!("bench: CHECK FAILED: {p}");
        }
        bail!("{} check(s) failed", problems.len())
    }
}
