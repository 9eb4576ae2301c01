//! Bursts of plugin processes against a harness [`Cluster`](crate::Cluster) or
//! [`Etcd`](crate::etcd::Etcd), shared by `tests/burst.rs`, `tests/etcd_burst.rs`
//! and the `bench_k8s_burst` and `bench_etcd_burst` binaries: many `thereabouts`
//! CNI processes started at once (one thread each, released together by a
//! barrier), each run by [`Invocation::run`], and a burst through an outage.

use std::path::Path;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir};

use crate::addresses::pool_name;
use crate::log_stats::{LogStats, log_path, with_debug_log};
use crate::report::failure_summary;

/// The network config the calls of a burst share. Each call logs to a file of
/// its own (`log_level: debug`), for the request and re-plan counts a burst
/// prints ([`Network::log_stats`]).
pub struct Network {
    pub conf: Value,
    pub ranges: Vec<&'static str>,
    logs: TempDir,
}

impl Network {
    /// `conf` allocates from `ranges`, in this order; `tag` names the log directory.
    pub fn new(conf: Value, ranges: &[&'static str], tag: &str) -> Network {
        Network { conf, ranges: ranges.to_vec(), logs: TempDir::new(tag) }
    }

    fn log(&self, command: &str, cid: &str) -> std::path::PathBuf {
        log_path(self.logs.path(), &format!("{}-{cid}", command.to_lowercase()))
    }

    /// One call with the plugin's `budget`; the runner's watchdog is a minute more.
    pub fn invocation(&self, command: &str, cid: &str, pod: &str, budget: Duration) -> Invocation {
        let stdin = with_debug_log(self.conf.clone(), &self.log(command, cid)).to_string();
        Invocation::new(Call::pod(command, cid, pod), stdin).budget(budget).watchdog(budget + Duration::from_secs(60))
    }

    /// ADDs (or DELs) for `pods` = (container ID, pod name).
    pub fn calls(&self, command: &str, pods: &[(String, String)], budget: Duration) -> Vec<Invocation> {
        pods.iter().map(|(cid, pod)| self.invocation(command, cid, pod, budget)).collect()
    }

    /// The debug log of one call (empty when it wrote none), for a failure's message.
    pub fn log_text(&self, command: &str, cid: &str) -> String {
        std::fs::read_to_string(self.log(command, cid)).unwrap_or_default()
    }

    /// What the logs of these calls of `command` count, summed.
    pub fn log_stats(&self, command: &str, outcomes: &[Outcome]) -> LogStats {
        let mut total = LogStats::default();
        for o in outcomes {
            total.add(&LogStats::read(&self.log(command, &o.call.container_id)));
        }
        total
    }

    /// (pool name, range), in range order.
    pub fn pools(&self) -> Vec<(String, &'static str)> {
        self.ranges.iter().map(|r| (pool_name(r), *r)).collect()
    }
}

/// (container ID, pod name) of each call, for the DELs that follow ADDs.
pub fn pods_of(outcomes: &[&Outcome]) -> Vec<(String, String)> {
    outcomes.iter().map(|o| (o.call.container_id.clone(), o.call.pod_name().to_string())).collect()
}

/// Runs every invocation at once: one thread each, all released together, so
/// the processes start within the time it takes to fork them. `on_exit` (if
/// given) sees each outcome as soon as its call ends, for a test that acts
/// partway. Outcomes in the order of `invocations`.
pub fn run_concurrently(bin: &Path, invocations: &[Invocation], on_exit: Option<&(dyn Fn(&Outcome) + Sync)>) -> Vec<Outcome> {
    let barrier = Barrier::new(invocations.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = invocations
            .iter()
            .map(|inv| {
                let barrier = &barrier;
                std::thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn_scoped(scope, move || {
                        barrier.wait();
                        let outcome = inv.run(bin);
                        if let Some(f) = on_exit {
                            f(&outcome);
                        }
                        outcome
                    })
                    .expect("starting a runner thread")
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("runner thread panicked")).collect()
    })
}

/// `n` pods as `(container ID, pod name)`: `cid-<prefix>-000`, `<prefix>-000`, ...
pub fn pods(prefix: &str, n: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("cid-{prefix}-{i:03}"), format!("{prefix}-{i:03}"))).collect()
}

/// A burst during which the server was killed.
pub struct Outage {
    pub outcomes: Vec<Outcome>,
    pub wall: Duration,
    /// When the kill came after the start, and how many calls had succeeded by then.
    pub killed_after: Duration,
    pub succeeded_before_kill: usize,
    /// Calls that failed once the kill was under way: they were in flight.
    pub failed_after_kill: usize,
}

/// Runs `invocations` all at once and calls `kill` once `kill_after` of them
/// have succeeded, or `kill_at` after the start at the latest (many processes
/// starting at once on two cores take a second or two before the first answers).
pub fn run_through_outage(bin: &Path, invocations: &[Invocation], kill_after: usize, kill_at: Duration, kill: impl FnOnce() + Send) -> Outage {
    let succeeded = AtomicUsize::new(0);
    // Set just before the kill (a SIGKILL is immediate; the harness then waits
    // for the process to be gone).
    let killing = AtomicBool::new(false);
    let failed_after_kill = AtomicUsize::new(0);
    let count = |o: &Outcome| {
        if o.ok() {
            succeeded.fetch_add(1, Ordering::SeqCst);
        } else if killing.load(Ordering::SeqCst) {
            failed_after_kill.fetch_add(1, Ordering::SeqCst);
        }
    };
    let started = Instant::now();
    let (outcomes, (killed_after, succeeded_before_kill)) = std::thread::scope(|scope| {
        let killer = scope.spawn(|| {
            while succeeded.load(Ordering::SeqCst) < kill_after && started.elapsed() < kill_at {
                std::thread::sleep(Duration::from_millis(1));
            }
            let at = (started.elapsed(), succeeded.load(Ordering::SeqCst));
            killing.store(true, Ordering::SeqCst);
            kill();
            at
        });
        let outcomes = run_concurrently(bin, invocations, Some(&count));
        (outcomes, killer.join().expect("the killer thread"))
    });
    assert!(killing.load(Ordering::SeqCst));
    Outage { wall: started.elapsed(), outcomes, killed_after, succeeded_before_kill, failed_after_kill: failed_after_kill.load(Ordering::SeqCst) }
}

impl Outage {
    /// Prints what happened (`killed` names the kill, `summary` is the burst's
    /// line) and checks what an outage must leave: every failed call answered CNI
    /// code 11 (try again later), none answered later than `deadline + slack`,
    /// and the kill hit the burst partway (some calls succeeded, some failed
    /// after it). Returns the successful calls.
    pub fn check(&self, killed: &str, summary: String, deadline: Duration, slack: Duration) -> Vec<&Outcome> {
        let (ok, failed): (Vec<&Outcome>, Vec<&Outcome>) = self.outcomes.iter().partition(|o| o.ok());
        let slowest = self.outcomes.iter().map(|o| o.elapsed).max().unwrap_or_default();
        eprintln!(
            "{summary}\n{killed} {:.2?} after the start, with {} ADDs succeeded; in the end {} succeeded, {} failed ({} of them after the kill); slowest {slowest:.2?}",
            self.killed_after,
            self.succeeded_before_kill,
            ok.len(),
            failed.len(),
            self.failed_after_kill,
        );
        eprintln!("failed ADDs by message:");
        for (n, m) in failure_summary(&self.outcomes) {
            eprintln!("  {n} × {m}");
        }
        for o in &failed {
            let e = o.expect_cni_error("ADD during the outage");
            assert_eq!(e["code"], 11, "only 'try again later': {}", o.describe());
        }
        for o in &self.outcomes {
            assert!(o.elapsed <= deadline + slack, "answered after {:.2?} (deadline {deadline:?}): {}", o.elapsed, o.describe());
        }
        assert!(
            !ok.is_empty() && self.failed_after_kill > 0,
            "the outage must hit the burst partway: {} succeeded, {} failed after the kill",
            ok.len(),
            self.failed_after_kill,
        );
        ok
    }
}
