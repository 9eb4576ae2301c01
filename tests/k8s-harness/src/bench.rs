//! One measured phase of the burst benchmarks (`bench_k8s_burst`,
//! `bench_etcd_burst`): a batch of plugin calls, run one after another or all at
//! once, with the server's own request counters, the plugins' logs, and the CPU
//! time of the plugins and of the server.

use std::path::Path;
use std::time::{Duration, Instant};

use thereabouts_e2e::{Invocation, Outcome};

use crate::apiserver_metrics::RequestCounts;
use crate::burst::{Network, run_concurrently};
use crate::etcd::GrpcCounts;
use crate::log_stats::LogStats;
use crate::report::{failure_summary, percentile};

/// A server's request counters, scraped before and after a phase.
pub trait Counts: Clone + Default {
    fn add(&mut self, other: &Self);
    fn since(&self, before: &Self) -> Self;
}

impl Counts for RequestCounts {
    fn add(&mut self, other: &Self) {
        RequestCounts::add(self, other)
    }
    fn since(&self, before: &Self) -> Self {
        RequestCounts::since(self, before)
    }
}

impl Counts for GrpcCounts {
    fn add(&mut self, other: &Self) {
        GrpcCounts::add(self, other)
    }
    fn since(&self, before: &Self) -> Self {
        GrpcCounts::since(self, before)
    }
}

/// One phase's figures.
pub struct Phase<C> {
    pub name: String,
    pub calls: usize,
    pub failed: usize,
    pub wall: Duration,
    pub latencies: Vec<Duration>,
    /// The server's own count (None when its metrics could not be read).
    pub requests: Option<C>,
    pub logs: LogStats,
    /// CPU time of the plugin processes, and of the server's, during the phase.
    pub plugin_cpu: Duration,
    pub server_cpu: Duration,
}

/// How a bench runs a phase: its plugin binary, the network whose calls keep
/// their debug logs, and how it reads the server's counters and CPU time.
pub struct Runner<'a, C> {
    pub bin: &'a Path,
    pub net: &'a Network,
    /// The counters now; the argument labels the moment (`"before <phase>"`).
    pub scrape: &'a dyn Fn(&str) -> Option<C>,
    pub server_cpu: &'a dyn Fn() -> Duration,
}

impl<C: Counts> Runner<'_, C> {
    /// Runs `invocations` of `command` one after another (`concurrent` false) or
    /// all at once, and reports the phase on stderr.
    pub fn phase(&self, name: &str, command: &str, invocations: &[Invocation], concurrent: bool) -> (Phase<C>, Vec<Outcome>) {
        let before = (self.scrape)(&format!("before {name}"));
        let (plugin_cpu0, server_cpu0) = (children_cpu(), (self.server_cpu)());
        let started = Instant::now();
        let outcomes = if concurrent { run_concurrently(self.bin, invocations, None) } else { invocations.iter().map(|i| i.run(self.bin)).collect() };
        let wall = started.elapsed();
        let (plugin_cpu, server_cpu) = (children_cpu() - plugin_cpu0, (self.server_cpu)() - server_cpu0);
        let requests = match (before, (self.scrape)(&format!("after {name}"))) {
            (Some(b), Some(a)) => Some(a.since(&b)),
            _ => None,
        };
        let logs = self.net.log_stats(command, &outcomes);
        let groups = failure_summary(&outcomes);
        for (n, m) in &groups {
            eprintln!("bench: {name}: {n} failed with: {m}");
        }
        let phase = Phase {
            name: name.to_string(),
            calls: outcomes.len(),
            failed: groups.iter().map(|(n, _)| n).sum(),
            wall,
            latencies: outcomes.iter().map(|o| o.elapsed).collect(),
            requests,
            logs,
            plugin_cpu,
            server_cpu,
        };
        eprintln!(
            "bench: {name}: {} calls in {wall:.2?}, p50 {:.1?}, p99 {:.1?}, {} failed",
            phase.calls,
            percentile(&phase.latencies, 50.0),
            percentile(&phase.latencies, 99.0),
            phase.failed
        );
        (phase, outcomes)
    }
}

impl<C: Counts> Phase<C> {
    /// Several phases (rounds of the same burst) as one.
    pub fn merge(name: &str, phases: &[&Phase<C>]) -> Phase<C> {
        let mut requests = Some(C::default());
        let mut logs = LogStats::default();
        for p in phases {
            match (&mut requests, &p.requests) {
                (Some(total), Some(r)) => total.add(r),
                _ => requests = None,
            }
            logs.add(&p.logs);
        }
        Phase {
            name: name.to_string(),
            calls: phases.iter().map(|p| p.calls).sum(),
            failed: phases.iter().map(|p| p.failed).sum(),
            wall: phases.iter().map(|p| p.wall).sum(),
            latencies: phases.iter().flat_map(|p| p.latencies.clone()).collect(),
            requests,
            logs,
            plugin_cpu: phases.iter().map(|p| p.plugin_cpu).sum(),
            server_cpu: phases.iter().map(|p| p.server_cpu).sum(),
        }
    }
}

/// CPU time (user + system) of this process's children that have been reaped:
/// the plugin processes a phase ran, when read before and after it.
pub fn children_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// CPU time (user + system) a running process has used so far (`/proc/<pid>/stat`).
pub fn process_cpu(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the command (which may hold spaces) : state is field 3,
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let total = ticks(11) + ticks(12);
    Duration::from_micros(total * 1_000_000 / hz)
}
