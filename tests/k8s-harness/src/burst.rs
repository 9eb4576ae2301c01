//! Bursts of plugin processes against a harness [`Cluster`](crate::Cluster) or
//! [`Etcd`](crate::etcd::Etcd), shared by `tests/burst.rs`, `tests/etcd_burst.rs`
//! and the `bench_k8s_burst` and `bench_etcd_burst` binaries:
//!
//! * [`run_concurrently`]: many `thereabouts` CNI processes started at once (one
//!   thread each, released together by a barrier), each bounded by a watchdog;
//!   the elapsed time of a call runs from just before its spawn to its exit;
//! * [`pool_entries`] / [`reservation_name`]: the allocations of a pool as
//!   addresses, and whereabouts' ORIP name of an address, to compare CNI results
//!   with what the apiserver holds;
//! * [`RequestCounts`]: the apiserver's own count of requests to the whereabouts
//!   resources (`apiserver_request_total` from `GET /metrics`, as admin), by verb,
//!   resource and answer code — every request that reached it, retries included;
//! * [`LogStats`]: what a plugin's debug log (`log_level: debug`) says about one
//!   call: Kubernetes API or etcd requests per target, and re-plans after conflicts.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use thereabouts_e2e::{Call, Outcome, add_offset, range_network};

use crate::plugin::{GROUP_VERSION, Objects, api_requests};

/// One plugin run: the CNI environment, the config on stdin, extra environment
/// (`THEREABOUTS_TIMEOUT_MS`, ...).
#[derive(Clone, Debug)]
pub struct Invocation {
    pub call: Call,
    pub stdin: String,
    pub env: Vec<(String, String)>,
}

impl Invocation {
    pub fn new(call: Call, stdin: impl Into<String>) -> Self {
        Invocation { call, stdin: stdin.into(), env: Vec::new() }
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// `THEREABOUTS_TIMEOUT_MS`: the plugin's budget for the call.
    pub fn budget(self, budget: Duration) -> Self {
        let ms = budget.as_millis().to_string();
        self.env("THEREABOUTS_TIMEOUT_MS", &ms)
    }
}

/// Runs one invocation to completion; killed (and reported `timed_out`) after
/// `watchdog`. Output beyond a pipe's buffer (64 KiB) would stall the plugin
/// until the watchdog fires; CNI results and errors are far smaller.
pub fn run_one(bin: &Path, invocation: &Invocation, watchdog: Duration) -> Outcome {
    let call = &invocation.call;
    let mut command = Command::new(bin);
    command
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", &call.command)
        .env("CNI_CONTAINERID", &call.container_id)
        .env("CNI_NETNS", &call.netns)
        .env("CNI_IFNAME", &call.ifname)
        .env("CNI_ARGS", &call.cni_args)
        .env("CNI_PATH", &call.cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in &invocation.env {
        command.env(k, v);
    }
    let started = Instant::now();
    let mut child = command.spawn().unwrap_or_else(|e| panic!("spawning {}: {e}", bin.display()));
    {
        // Far below the pipe buffer: never blocks. EPIPE (the plugin exited
        // without reading) is the plugin's business, its answer tells.
        let mut stdin = child.stdin.take().expect("stdin");
        let _ = stdin.write_all(invocation.stdin.as_bytes());
    }
    let timed_out = !wait_exit(child.id(), watchdog.saturating_sub(started.elapsed()));
    if timed_out {
        let _ = child.kill(); // not reaped yet: the pid is still this child's
    }
    let out = child.wait_with_output().expect("waiting for the plugin");
    Outcome {
        call: call.clone(),
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: started.elapsed(),
        timed_out,
    }
}

/// Waits until the (unreaped) child `pid` exits, at most `limit`; true if it did.
/// A pidfd: no polling loop, and the exit is seen at once (latencies are measured).
fn wait_exit(pid: u32, limit: Duration) -> bool {
    // SAFETY: plain syscalls on a pid we own (a child not yet reaped) and the fd
    // they return, closed below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as libc::c_int;
    if fd < 0 {
        // No pidfd (old kernel): fall back to polling.
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            // WNOWAIT: look without reaping (wait_with_output reaps).
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let r = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
            if r == 0 && unsafe { info.si_pid() } != 0 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        return false;
    }
    let deadline = Instant::now() + limit;
    let exited = loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ms = remaining.as_millis().min(i32::MAX as u128) as libc::c_int;
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r > 0 {
            break true;
        }
        if r == 0 {
            break false;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break false;
        }
    };
    unsafe { libc::close(fd) };
    exited
}

/// Runs every invocation at once: one thread each, all released together, so
/// the processes start within the time it takes to fork them. `on_exit` (if
/// given) sees each outcome as soon as its call ends, for a test that acts
/// partway. Outcomes in the order of `invocations`.
pub fn run_concurrently(bin: &Path, invocations: &[Invocation], watchdog: Duration, on_exit: Option<&(dyn Fn(&Outcome) + Sync)>) -> Vec<Outcome> {
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
                        let outcome = run_one(bin, inv, watchdog);
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

/// A failure's message with numbers and names blurred (`#`), to group failures.
pub fn blurred_message(outcome: &Outcome) -> String {
    let error = serde_json::from_str::<Value>(&outcome.stdout).ok().and_then(|v| {
        let msg = v.get("msg")?.as_str()?;
        let blurred: Vec<&str> = msg.split(' ').map(|w| if w.chars().any(|c| c.is_ascii_digit()) { "#" } else { w }).collect();
        Some(format!("[code {}] {}", v.get("code")?, blurred.join(" ")))
    });
    match error {
        Some(e) => e,
        None if outcome.timed_out => "killed by the watchdog".to_string(),
        None => format!("no CNI error on stdout (exit {:?})", outcome.status.code()),
    }
}

/// The failed calls grouped by [`blurred_message`], most frequent first.
pub fn failure_summary(outcomes: &[Outcome]) -> Vec<(usize, String)> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| !o.ok()) {
        *counts.entry(blurred_message(o)).or_insert(0) += 1;
    }
    let mut v: Vec<(usize, String)> = counts.into_iter().map(|(m, n)| (n, m)).collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    v
}

/// `n` pods as `(container ID, pod name)`: `cid-<prefix>-000`, `<prefix>-000`, ...
pub fn pods(prefix: &str, n: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("cid-{prefix}-{i:03}"), format!("{prefix}-{i:03}"))).collect()
}

/// One line about a burst: calls, rate, latency percentiles, and what the
/// plugins' logs count per call (`requests_of`: "API", "etcd").
pub fn summary(what: &str, outcomes: &[Outcome], wall: Duration, stats: &LogStats, requests_of: &str) -> String {
    let times: Vec<Duration> = outcomes.iter().map(|o| o.elapsed).collect();
    format!(
        "{what}: {} calls in {wall:.2?} ({:.0}/s); p50 {:.0?} p99 {:.0?} max {:.0?}; {:.1} {requests_of} requests and {:.2} re-plans per call (plugin logs)",
        outcomes.len(),
        outcomes.len() as f64 / wall.as_secs_f64(),
        percentile(&times, 50.0),
        percentile(&times, 99.0),
        percentile(&times, 100.0),
        stats.requests as f64 / outcomes.len() as f64,
        stats.replans as f64 / outcomes.len() as f64,
    )
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
pub fn run_through_outage(
    bin: &Path,
    invocations: &[Invocation],
    watchdog: Duration,
    kill_after: usize,
    kill_at: Duration,
    kill: impl FnOnce() + Send,
) -> Outage {
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
        let outcomes = run_concurrently(bin, invocations, watchdog, Some(&count));
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

/// Panics with the failures grouped by message and the first few in full
/// (everything needed to reproduce them).
pub fn expect_all_ok(outcomes: &[Outcome], what: &str) {
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.ok()).collect();
    if !failed.is_empty() {
        let groups: Vec<String> = failure_summary(outcomes).into_iter().map(|(n, m)| format!("  {n} × {m}")).collect();
        let shown: Vec<String> = failed.iter().take(3).map(|o| o.describe()).collect();
        panic!("{what}: {} of {} calls failed:\n{}\nfirst ones:\n{}", failed.len(), outcomes.len(), groups.join("\n"), shown.join("\n---\n"));
    }
}

/// The pod name of a call made with [`Call::pod`] (`K8S_POD_NAME`).
pub fn pod_name(call: &Call) -> &str {
    call.cni_args.split(';').find_map(|kv| kv.strip_prefix("K8S_POD_NAME=")).unwrap_or("")
}

/// The address part of `ip/prefix`.
pub fn address(cidr: &str) -> IpAddr {
    thereabouts_e2e::addr_of(cidr)
}

/// Whether `ip` lies inside `range` (`net/len`).
pub fn contains(range: &str, ip: IpAddr) -> bool {
    let (net, len) = range_network(range);
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len as u32) };
            u32::from(a) & mask == u32::from(n)
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - len as u32) };
            u128::from(a) & mask == u128::from(n)
        }
        _ => false,
    }
}

/// whereabouts' ORIP name of an address (`network_name` unset): the address's
/// text with `:` replaced by `-` (`2001:db8:80::5` → `2001-db8-80--5`).
pub fn reservation_name(ip: IpAddr) -> String {
    ip.to_string().replace(':', "-")
}

/// One entry of an IPPool, with its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolEntry {
    pub key: String,
    pub address: IpAddr,
    pub id: String,
    pub podref: String,
    pub ifname: String,
}

/// `spec.allocations` of the pool `name` (of `range`) by address. Panics on a
/// key that is not a decimal offset.
pub fn pool_entries(objects: &Objects, name: &str, range: &str) -> Result<BTreeMap<IpAddr, PoolEntry>> {
    entries_by_address(name, range, objects.allocations(name)?)
}

/// Allocations in the IPPool spec shape (decimal offset → `{id, podref,
/// ifname}`) of the pool `name` (of `range`), by address: what an IPPool and
/// an etcd pool key both hold.
pub fn entries_by_address(name: &str, range: &str, allocations: BTreeMap<String, Value>) -> Result<BTreeMap<IpAddr, PoolEntry>> {
    let (net, _) = range_network(range);
    let mut out = BTreeMap::new();
    for (key, v) in allocations {
        let offset: u128 = key.parse().with_context(|| format!("pool {name}: allocation key {key:?} is no offset"))?;
        let address = add_offset(net, offset);
        let text = |f: &str| v[f].as_str().unwrap_or_default().to_string();
        out.insert(address, PoolEntry { key, address, id: text("id"), podref: text("podref"), ifname: text("ifname") });
    }
    Ok(out)
}

/// The reservations (ORIP `spec`s by name) whose address lies in one of `ranges`.
pub fn reservations_in(objects: &Objects, ranges: &[&str]) -> Result<BTreeMap<String, Value>> {
    Ok(objects
        .reservations()?
        .into_iter()
        .filter(|(name, _)| name.replace('-', ":").parse::<IpAddr>().is_ok_and(|ip| ranges.iter().any(|r| contains(r, ip))))
        .collect())
}

/// Checks that every successful ADD of `outcomes` got exactly one address per
/// range (of `ranges`), that no address went to two of them, that each
/// address's entry in its pool (`entries`, one map per range, as the datastore
/// holds them) names the call's container, pod and interface, and that each
/// address has one reservation (by [`reservation_name`]) held by that pod.
/// Panics with the first violation. Returns the addresses per range.
pub fn check_held(
    ranges: &[&str],
    outcomes: &[&Outcome],
    entries: &[BTreeMap<IpAddr, PoolEntry>],
    reservations: &BTreeMap<String, Value>,
) -> Vec<BTreeMap<IpAddr, String>> {
    assert_eq!(entries.len(), ranges.len(), "one pool per range");
    let mut by_range: Vec<BTreeMap<IpAddr, String>> = vec![BTreeMap::new(); ranges.len()];
    for o in outcomes {
        let ips = o.ips();
        assert_eq!(ips.len(), ranges.len(), "one address per range: {}", o.describe());
        for ((ip, range), seen) in ips.iter().zip(ranges).zip(by_range.iter_mut()) {
            let a = address(ip);
            assert!(contains(range, a), "{ip} is not in {range}: {}", o.describe());
            if let Some(other) = seen.insert(a, o.call.container_id.clone()) {
                panic!("{a} was handed out twice: to {other} and to {}", o.call.container_id);
            }
        }
    }
    for ((range, pool), seen) in ranges.iter().zip(entries).zip(&by_range) {
        for (a, cid) in seen {
            let o = outcomes.iter().find(|o| &o.call.container_id == cid).expect("an outcome per address");
            let podref = format!("default/{}", pod_name(&o.call));
            let e = pool.get(a).unwrap_or_else(|| panic!("{a} of {cid} is not in the pool of {range}"));
            assert_eq!((e.id.as_str(), e.podref.as_str(), e.ifname.as_str()), (cid.as_str(), podref.as_str(), "eth0"), "pool of {range}, entry {}", e.key);
            let held = reservations.get(&reservation_name(*a)).unwrap_or_else(|| panic!("no reservation for {a} of {cid}"));
            assert_eq!(held["podref"], podref, "reservation of {a}");
        }
    }
    by_range
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

/// Nearest-rank percentile of durations (`p` in 0..=100); zero when empty.
pub fn percentile(durations: &[Duration], p: f64) -> Duration {
    let mut sorted = durations.to_vec();
    sorted.sort();
    thereabouts_e2e::percentile(&sorted, p)
}

/// A latency for a table: whole milliseconds from 100 ms, else one decimal.
pub fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 100.0 { format!("{ms:.0} ms") } else { format!("{ms:.1} ms") }
}

/// `value` per call, two decimals.
pub fn per_call(value: f64, calls: usize) -> String {
    format!("{:.2}", value / calls.max(1) as f64)
}

/// What the apiserver counted for the whereabouts resources (group
/// `whereabouts.cni.cncf.io`) in its `/metrics`, summed over the other labels:
///
/// * `requests`: `apiserver_request_total` by (verb, resource, code): every
///   request that reached it;
/// * `etcd`: `etcd_request_duration_seconds_count` by (operation, resource): the
///   storage operations behind them — a PATCH the apiserver had to re-apply
///   because the object changed under it (`GuaranteedUpdate`) costs one etcd
///   `update` per attempt;
/// * `seconds`: `apiserver_request_duration_seconds_sum` by (verb, resource):
///   the time requests spent inside the apiserver.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestCounts {
    pub requests: BTreeMap<(String, String, String), f64>,
    pub etcd: BTreeMap<(String, String), f64>,
    pub seconds: BTreeMap<(String, String), f64>,
}

/// The samples of metric `name` whose `group` label is the whereabouts group.
fn group_samples<'a>(metrics: &'a str, name: &'a str) -> impl Iterator<Item = (HashMap<String, String>, f64)> + 'a {
    let group = GROUP_VERSION.split('/').next().unwrap();
    metrics.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = rest.rsplit_once("} ")?;
        let labels = parse_labels(labels);
        if labels.get("group").map(String::as_str) != Some(group) {
            return None;
        }
        Some((labels, value.trim().parse::<f64>().ok()?))
    })
}

fn minus<K: Ord + Clone>(now: &BTreeMap<K, f64>, before: &BTreeMap<K, f64>) -> BTreeMap<K, f64> {
    now.iter().map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0))).filter(|(_, v)| *v > 0.0).collect()
}

fn plus<K: Ord + Clone>(total: &mut BTreeMap<K, f64>, more: &BTreeMap<K, f64>) {
    for (k, v) in more {
        *total.entry(k.clone()).or_insert(0.0) += v;
    }
}

/// A sum from +0.0: an empty f64 sum is -0.0, printed "-0.00".
fn sum<'a>(values: impl Iterator<Item = &'a f64>) -> f64 {
    values.fold(0.0, |a, b| a + b)
}

impl RequestCounts {
    /// Parses the Prometheus text of `/metrics`.
    pub fn parse(metrics: &str) -> RequestCounts {
        let mut counts = RequestCounts::default();
        let key = |labels: &HashMap<String, String>, k: &str| labels.get(k).cloned().unwrap_or_default();
        for (l, v) in group_samples(metrics, "apiserver_request_total") {
            *counts.requests.entry((key(&l, "verb"), key(&l, "resource"), key(&l, "code"))).or_insert(0.0) += v;
        }
        for (l, v) in group_samples(metrics, "etcd_request_duration_seconds_count") {
            *counts.etcd.entry((key(&l, "operation"), key(&l, "resource"))).or_insert(0.0) += v;
        }
        for (l, v) in group_samples(metrics, "apiserver_request_duration_seconds_sum") {
            *counts.seconds.entry((key(&l, "verb"), key(&l, "resource"))).or_insert(0.0) += v;
        }
        counts
    }

    /// The counts of `self` minus those of `before` (an earlier scrape).
    pub fn since(&self, before: &RequestCounts) -> RequestCounts {
        RequestCounts {
            requests: minus(&self.requests, &before.requests),
            etcd: minus(&self.etcd, &before.etcd),
            seconds: minus(&self.seconds, &before.seconds),
        }
    }

    /// Adds `other`'s counts (another phase).
    pub fn add(&mut self, other: &RequestCounts) {
        plus(&mut self.requests, &other.requests);
        plus(&mut self.etcd, &other.etcd);
        plus(&mut self.seconds, &other.seconds);
    }

    pub fn total(&self) -> f64 {
        sum(self.requests.values())
    }

    /// Requests answered 409 (AlreadyExists, Conflict) or 422 (a failed JSON-patch test).
    pub fn conflicts(&self) -> f64 {
        sum(self.requests.iter().filter(|((_, _, code), _)| code == "409" || code == "422").map(|(_, v)| v))
    }

    /// etcd writes (create, update, delete, including the apiserver's own retries).
    pub fn etcd_writes(&self) -> f64 {
        sum(self.etcd.iter().filter(|((op, _), _)| matches!(op.as_str(), "create" | "update" | "delete")).map(|(_, v)| v))
    }

    /// `VERB resource code` → count, for a breakdown.
    pub fn lines(&self) -> Vec<(String, f64)> {
        self.requests.iter().map(|((verb, resource, code), v)| (format!("{verb} {resource} {code}"), *v)).collect()
    }

    /// `operation resource` → count of etcd operations.
    pub fn etcd_lines(&self) -> Vec<(String, f64)> {
        self.etcd.iter().map(|((op, resource), v)| (format!("{op} {resource}"), *v)).collect()
    }

    /// `VERB resource` → mean time inside the apiserver.
    pub fn mean_durations(&self) -> Vec<(String, Duration)> {
        self.seconds
            .iter()
            .filter_map(|((verb, resource), secs)| {
                let n = sum(self.requests.iter().filter(|((v, r, _), _)| v == verb && r == resource).map(|(_, n)| n));
                (n > 0.0).then(|| (format!("{verb} {resource}"), Duration::from_secs_f64(secs / n)))
            })
            .collect()
    }
}

fn parse_labels(text: &str) -> HashMap<String, String> {
    // name="value",name="value" (values here hold no quotes or commas).
    let mut out = HashMap::new();
    for part in text.split("\",") {
        if let Some((k, v)) = part.split_once("=\"") {
            out.insert(k.trim().to_string(), v.trim_end_matches('"').to_string());
        }
    }
    out
}

/// Scrapes `/metrics` as admin (blocking: a private current-thread runtime).
pub struct Metrics {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
}

impl Metrics {
    pub fn admin(cluster: &crate::Cluster) -> Result<Metrics> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let client = runtime.block_on(cluster.admin_client())?;
        Ok(Metrics { runtime, client })
    }

    /// The Prometheus text of `/metrics`.
    pub fn text(&self) -> Result<String> {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        self.runtime.block_on(self.client.request_text(request)).context("GET /metrics")
    }

    pub fn requests(&self) -> Result<RequestCounts> {
        let text = self.text()?;
        let counts = RequestCounts::parse(&text);
        if !text.contains("apiserver_request_total") {
            bail!("/metrics has no apiserver_request_total");
        }
        Ok(counts)
    }
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
pub fn etcd_requests(log_text: &str) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counts_parse_and_subtract() {
        let before = RequestCounts::parse(
            "# HELP apiserver_request_total x\n\
             apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"whereabouts.cni.cncf.io\",resource=\"ippools\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1alpha1\"} 3\n\
             apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1\"} 99\n",
        );
        let after = RequestCounts::parse(
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"whereabouts.cni.cncf.io\",resource=\"ippools\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1alpha1\"} 5\n\
             apiserver_request_total{code=\"422\",component=\"apiserver\",dry_run=\"\",group=\"whereabouts.cni.cncf.io\",resource=\"ippools\",scope=\"resource\",subresource=\"\",verb=\"PATCH\",version=\"v1alpha1\"} 1\n\
             apiserver_request_duration_seconds_sum{component=\"apiserver\",dry_run=\"\",group=\"whereabouts.cni.cncf.io\",resource=\"ippools\",scope=\"resource\",subresource=\"\",verb=\"PATCH\",version=\"v1alpha1\"} 0.5\n\
             etcd_request_duration_seconds_count{group=\"whereabouts.cni.cncf.io\",operation=\"update\",resource=\"ippools\"} 4\n\
             etcd_request_duration_seconds_count{group=\"whereabouts.cni.cncf.io\",operation=\"get\",resource=\"ippools\"} 2\n",
        );
        let d = after.since(&before);
        assert_eq!(d.total(), 3.0);
        assert_eq!(d.conflicts(), 1.0);
        assert_eq!(d.etcd_writes(), 4.0);
        assert_eq!(d.mean_durations(), [("PATCH ippools".to_string(), Duration::from_millis(500))]);
        assert_eq!(d.lines(), [("GET ippools 200".to_string(), 2.0), ("PATCH ippools 422".to_string(), 1.0)]);
    }

    #[test]
    fn failures_group_by_blurred_message() {
        use std::os::unix::process::ExitStatusExt;
        let outcome = |stdout: &str| Outcome {
            call: Call::pod("ADD", "c", "p"),
            status: std::process::ExitStatus::from_raw(256),
            stdout: stdout.to_string(),
            stderr: String::new(),
            elapsed: Duration::ZERO,
            timed_out: false,
        };
        let a = outcome(
            r#"{"code": 11, "msg": "Kubernetes API server https://127.0.0.1:3456 unavailable while reading IPPool kube-system/192.0.2.0-24: no answer within 10000 ms"}"#,
        );
        let b = outcome(
            r#"{"code": 11, "msg": "Kubernetes API server https://127.0.0.1:3456 unavailable while reading IPPool kube-system/2001-db8---64: no answer within 9000 ms"}"#,
        );
        assert_eq!(blurred_message(&a), "[code 11] Kubernetes API server # unavailable while reading IPPool # no answer within # ms");
        assert_eq!(
            failure_summary(&[a, b, outcome("")]),
            [
                (2, "[code 11] Kubernetes API server # unavailable while reading IPPool # no answer within # ms".to_string()),
                (1, "no CNI error on stdout (exit Some(1))".to_string())
            ]
        );
    }

    #[test]
    fn reservation_names_and_ranges() {
        let v6: IpAddr = "2001:db8:80::5".parse().unwrap();
        assert_eq!(reservation_name(v6), "2001-db8-80--5");
        assert_eq!(reservation_name("192.0.2.7".parse().unwrap()), "192.0.2.7");
        assert!(contains("2001:db8:80::/64", v6) && !contains("2001:db8:81::/64", v6));
        assert!(contains("192.0.2.0/25", "192.0.2.127".parse().unwrap()));
        assert!(!contains("192.0.2.0/25", "192.0.2.128".parse().unwrap()));
    }
}
