//! Epochs or fuel: what each costs a policy call, and how close to its
//! wall-clock deadline each stops a runaway guest, side by side in one
//! process with the same components (target/policies/, built by
//! `bash scripts/build-policies.sh -q`) compiled for three engines:
//! - `epochs`: `policy_engine_config()`, what the plugin runs, with the
//!   plugin's own watchdog (host/src/policy/watchdog.rs) ticking the epoch;
//! - `fuel`: `policy_fuel_engine_config()`, a budget per call;
//! - `none`: the same with neither, the uninstrumented floor.
//!
//! Measured, the engines interleaved round by round (rotating which goes
//! first):
//! 1. real hooks (sticky-ordinal, keep-addresses) as the plugin calls them: a
//!    fresh store with the plugin's limits, instantiate, one call;
//! 2. compute: two CPU-bound calls of real policy code (keep-addresses
//!    checking 1024 candidates against a 1024-entry deny list;
//!    sticky-ordinal parsing 2000 pods' explicit addresses), wall time per
//!    call, so work per millisecond under each mechanism;
//! 3. the runaway loop of hostile-fixtures (`{"hook": "pick-address",
//!    "do": "loop"}`), 10 ms deadline: epochs stopped by the watchdog, fuel
//!    by a budget calibrated to 10 ms of that loop on this machine. How far
//!    past (or short of) 10 ms each call returns.
//!
//! `cargo bench -p thereabouts-policy-compiler --bench interruption -- --rounds 300`
//! (a `harness = false` bench, so that scripts/build-plugin.sh, which builds
//! this package's binaries, builds nothing more).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use thereabouts_policy_compiler::bindings::exports::thereabouts::ipam::policy::{AttachmentInput, Choice, Pick};
use thereabouts_policy_compiler::bindings::exports::thereabouts::ipam::types::{
    DatastoreSettings, IpFamily, NormalizedConfig, NormalizedRange, Offset, RangesAllocation,
};
use thereabouts_policy_compiler::bindings::{PolicyExtension, PolicyExtensionPre};
use thereabouts_policy_compiler::{policy_engine_config, policy_fuel_engine_config};
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder, Trap};

/// The plugin's watchdog itself, so that arming it is part of an epoch call
/// as in the plugin. (Its unit tests are compiled here too, without a
/// harness to run them: hence the allow.)
#[allow(dead_code)]
#[path = "../../src/policy/watchdog.rs"]
mod watchdog;
use watchdog::Watchdog;

/// The plugin's default `timeout_ms`.
const DEADLINE: Duration = Duration::from_millis(10);
const BUILD_TARGET: &str = env!("THEREABOUTS_BUILD_TARGET");

#[derive(Clone, Copy, PartialEq)]
enum Mechanism {
    None,
    Epochs,
    Fuel,
}

const MECHANISMS: [Mechanism; 3] = [Mechanism::None, Mechanism::Epochs, Mechanism::Fuel];

impl Mechanism {
    fn name(self) -> &'static str {
        match self {
            Mechanism::None => "none",
            Mechanism::Epochs => "epochs",
            Mechanism::Fuel => "fuel",
        }
    }

    fn config(self) -> wasmtime::Config {
        match self {
            Mechanism::Epochs => policy_engine_config(),
            Mechanism::Fuel => policy_fuel_engine_config(),
            Mechanism::None => {
                let mut config = policy_engine_config();
                config.epoch_interruption(false);
                config.consume_fuel(false);
                config
            }
        }
    }
}

/// One engine with every policy compiled for it.
struct Side {
    mechanism: Mechanism,
    engine: Engine,
    watchdog: Option<Watchdog>,
    policies: Vec<(&'static str, PolicyExtensionPre<StoreLimits>)>,
}

/// What a call may spend.
#[derive(Clone, Copy)]
struct Budget {
    /// Epochs: the watchdog's deadline.
    time: Duration,
    /// Fuel: the store's fuel.
    fuel: u64,
    memory_mib: usize,
}

struct Outcome<R> {
    answer: wasmtime::Result<R>,
    elapsed: Duration,
    /// Fuel burnt (fuel engine only).
    fuel: u64,
}

impl Side {
    fn new(mechanism: Mechanism) -> Result<Side> {
        let mut config = mechanism.config();
        // As the compiler: artifacts for the build triple's baseline CPU.
        config.target(BUILD_TARGET)?;
        let engine = Engine::new(&config)?;
        let watchdog = (mechanism == Mechanism::Epochs).then(|| Watchdog::start(&engine)).transpose()?;
        let mut policies = Vec::new();
        for name in ["sticky-ordinal", "keep-addresses", "hostile-fixtures"] {
            let path = policies_dir().join(format!("{name}.wasm"));
            let bytes = std::fs::read(&path).with_context(|| format!("reading {} (build it: bash scripts/build-policies.sh -q)", path.display()))?;
            let cwasm = engine.precompile_component(&bytes)?;
            // SAFETY: what this engine produced a moment ago.
            let component = unsafe { Component::deserialize(&engine, &cwasm) }?;
            let pre = Linker::new(&engine).instantiate_pre(&component)?;
            policies.push((name, PolicyExtensionPre::new(pre)?));
        }
        Ok(Side { mechanism, engine, watchdog, policies })
    }

    fn policy(&self, name: &str) -> &PolicyExtensionPre<StoreLimits> {
        &self.policies.iter().find(|(n, _)| *n == name).expect("a compiled policy").1
    }

    /// One call as the plugin makes it: a fresh store with its limits and
    /// this mechanism's bound, instantiate, `f`.
    fn call<R>(&self, policy: &str, budget: Budget, f: impl FnOnce(&mut Store<StoreLimits>, &PolicyExtension) -> wasmtime::Result<R>) -> Outcome<R> {
        let started = Instant::now();
        let limits = StoreLimitsBuilder::new()
            .memory_size(budget.memory_mib << 20)
            .trap_on_grow_failure(true)
            .instances(16)
            .tables(16)
            .memories(2)
            .table_elements(100_000)
            .build();
        let mut store = Store::new(&self.engine, limits);
        store.limiter(|l| l);
        match self.mechanism {
            Mechanism::Epochs => store.set_epoch_deadline(1),
            Mechanism::Fuel => store.set_fuel(budget.fuel).expect("a fuel engine"),
            Mechanism::None => {}
        }
        let armed = self.watchdog.as_ref().map(|w| w.arm(budget.time).expect("arming the deadline"));
        let answer = self.policy(policy).instantiate(&mut store).and_then(|instance| f(&mut store, &instance));
        let expired = armed.as_ref().is_some_and(|a| a.expired());
        drop(armed);
        let elapsed = started.elapsed();
        let fuel = if self.mechanism == Mechanism::Fuel { budget.fuel - store.get_fuel().unwrap_or(0) } else { 0 };
        // A tick must only ever stop the runaway calls.
        assert!(!expired || answer.is_err(), "{}: the deadline passed during a call that returned", self.mechanism.name());
        Outcome { answer, elapsed, fuel }
    }
}

fn policies_dir() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), PathBuf::from).join("policies")
}

fn offset(low: u64) -> Offset {
    Offset { high: 0, low }
}

#[allow(clippy::too_many_arguments)]
fn range(cidr: &str, prefix_len: u8, family: IpFamily, first: &str, last: &str, last_offset: u64, usable: &str, pool_name: &str) -> NormalizedRange {
    NormalizedRange {
        cidr: cidr.into(),
        prefix_len,
        family,
        first: first.into(),
        last: last.into(),
        first_offset: offset(1),
        last_offset: offset(last_offset),
        excludes: Vec::new(),
        exclude_cidrs: Vec::new(),
        usable: usable.into(),
        gateway: None,
        pool_name: pool_name.into(),
        requested: None,
        node_slicing: None,
    }
}

/// A dual-stack attachment of StatefulSet pod `web-3`, as the plugin hands it
/// to a policy (policies and datastore credentials left out).
fn input(settings: &str) -> AttachmentInput {
    let ranges = vec![
        range("192.0.2.0/24", 24, IpFamily::Ipv4, "192.0.2.1", "192.0.2.254", 254, "254", "192.0.2.0-24"),
        range("2001:db8::/64", 64, IpFamily::Ipv6, "2001:db8::1", "2001:db8::ffff:ffff:ffff:fffe", u64::MAX - 1, "18446744073709551614", "2001-db8---64"),
    ];
    let config = NormalizedConfig {
        name: "bench".into(),
        cni_version: "1.0.0".into(),
        network_name: String::new(),
        enable_overlapping_ranges: true,
        ranges,
        ip_ranges_allocation: RangesAllocation::All,
        preferred_ip_annotation: false,
        allow_persistent_ips: false,
        ipam_claim_reference: None,
        policies: Vec::new(),
        addresses: Vec::new(),
        routes_json: Some(r#"[{"dst":"0.0.0.0/0"}]"#.into()),
        dns_json: None,
        pod_ref: "default/web-3".into(),
        datastore: DatastoreSettings {
            kind: Some("file".into()),
            data_dir: Some("/var/lib/thereabouts".into()),
            kubeconfig: None,
            etcd_hosts: Vec::new(),
            etcd_username: None,
            etcd_password: None,
            etcd_key_file: None,
            etcd_cert_file: None,
            etcd_ca_cert_file: None,
            etcd_prefix: None,
        },
        log_file: None,
        log_level: None,
        configuration_path: None,
    };
    AttachmentInput {
        pod_namespace: "default".into(),
        pod_name: "web-3".into(),
        container_id: "bench".into(),
        ifname: "net1".into(),
        cni_args: vec![("K8S_POD_NAMESPACE".into(), "default".into()), ("K8S_POD_NAME".into(), "web-3".into())],
        config,
        pod: None,
        settings: settings.into(),
    }
}

fn v4_candidates(count: u32) -> Vec<String> {
    (1..=count).map(|n| format!("192.0.{}.{}", 2 + n / 256, n % 256)).collect()
}

/// One real hook call: which policy, which hook, with what.
struct Hook {
    label: String,
    policy: &'static str,
    settings: String,
    which: Which,
    input: AttachmentInput,
    candidates: Vec<String>,
    memory_mib: usize,
}

#[derive(Clone, Copy)]
enum Which {
    Validate,
    Select,
    Pick,
}

impl Hook {
    fn new(label: &str, policy: &'static str, settings: String, which: Which, candidates: Vec<String>, memory_mib: usize) -> Hook {
        Hook { label: label.into(), policy, input: input(&settings), settings, which, candidates, memory_mib }
    }

    /// Runs it; `Err` unless it answered (a trap, a veto, an error).
    fn run(&self, side: &Side, budget: Budget) -> Outcome<()> {
        let budget = Budget { memory_mib: self.memory_mib, ..budget };
        side.call(self.policy, budget, |store, p| {
            let p = p.thereabouts_ipam_policy();
            let answered = match self.which {
                Which::Validate => p.call_validate_settings(&mut *store, &self.settings)?.is_ok(),
                Which::Select => p.call_select_ranges(&mut *store, &self.input)?.is_ok(),
                Which::Pick => !matches!(black_box(p.call_pick_address(&mut *store, &self.input, 0, &self.candidates)?), Pick { choice: Choice::Veto(_), .. }),
            };
            if answered { Ok(()) } else { Err(wasmtime::Error::msg(format!("{} did not answer", self.label))) }
        })
    }
}

fn real_hooks() -> Vec<Hook> {
    let sticky = r#"{"base": 10, "statefulsets": ["web", "db"], "addresses": {"db-0": ["192.0.2.50", "2001:db8::50"]}}"#.to_string();
    let keep = r#"{"deny": ["192.0.2.10", "192.0.2.16/30", "2001:db8::5"], "only_even": true}"#.to_string();
    // The plugin offers 32 candidates (host/src/policy/decide.rs), 4 MiB by default.
    let mut hooks = Vec::new();
    for (name, policy, settings) in [("sticky-ordinal", "sticky-ordinal", sticky), ("keep-addresses", "keep-addresses", keep)] {
        hooks.push(Hook::new(&format!("{name} validate-settings"), policy, settings.clone(), Which::Validate, Vec::new(), 4));
        hooks.push(Hook::new(&format!("{name} select-ranges"), policy, settings.clone(), Which::Select, Vec::new(), 4));
        hooks.push(Hook::new(&format!("{name} pick-address"), policy, settings, Which::Pick, v4_candidates(32), 4));
    }
    hooks
}

/// CPU-bound calls of real policy code (both far beyond what a config would ask).
fn compute_hooks() -> Vec<Hook> {
    // keep-addresses: every candidate against every deny entry (loops).
    let deny: Vec<String> = (0..1024u32).map(|n| format!("\"198.51.{}.{}/32\"", n / 256, n % 256)).collect();
    let keep = format!(r#"{{"deny": [{}], "only_even": false}}"#, deny.join(","));
    // sticky-ordinal: serde_json and IP parsing of 2000 pods' addresses (calls).
    let pods: Vec<String> = (0..2000u32).map(|n| format!(r#""db-{n}": ["192.0.{}.{}", "2001:db8::{n:x}"]"#, 2 + n / 256, n % 256)).collect();
    let sticky = format!(r#"{{"base": 10, "addresses": {{{}}}}}"#, pods.join(","));
    vec![
        Hook::new("keep-addresses pick, 1024 candidates x 1024 denied", "keep-addresses", keep, Which::Pick, v4_candidates(1024), 64),
        Hook::new("sticky-ordinal validate, 2000 pods' addresses", "sticky-ordinal", sticky, Which::Validate, Vec::new(), 64),
    ]
}

/// The runaway loop: `Ok` is the trap the mechanism should raise.
fn runaway(side: &Side, budget: Budget) -> Outcome<()> {
    let settings = r#"{"hook": "pick-address", "do": "loop"}"#;
    let input = input(settings);
    let candidates = v4_candidates(32);
    let mut outcome = side.call("hostile-fixtures", Budget { memory_mib: 4, ..budget }, |store, p| {
        p.thereabouts_ipam_policy().call_pick_address(&mut *store, &input, 0, &candidates).map(|_| ())
    });
    let expected = if side.mechanism == Mechanism::Fuel { Trap::OutOfFuel } else { Trap::Interrupt };
    outcome.answer = match outcome.answer {
        Ok(()) => Err(wasmtime::Error::msg("the loop returned")),
        Err(e) if e.downcast_ref::<Trap>() == Some(&expected) => Ok(()),
        Err(e) => Err(e),
    };
    outcome
}

struct Samples(Vec<f64>);

impl Samples {
    fn sorted(mut v: Vec<f64>) -> Samples {
        v.sort_by(f64::total_cmp);
        Samples(v)
    }

    fn at(&self, q: f64) -> f64 {
        self.0[((self.0.len() as f64 - 1.0) * q).round() as usize]
    }

    fn p50(&self) -> f64 {
        self.at(0.5)
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn arg(args: &[String], name: &str, default: usize) -> Result<usize> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args.get(i + 1).with_context(|| format!("a number after {name}"))?.parse().with_context(|| format!("{name} takes a number")),
    }
}

/// Rotates which side goes first, round by round.
fn order(round: usize) -> impl Iterator<Item = usize> {
    (0..3).map(move |i| (i + round) % 3)
}

fn main() -> Result<()> {
    // `cargo bench` adds `--bench`.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let rounds = arg(&args, "--rounds", 300)?;
    let compute_rounds = arg(&args, "--compute-rounds", 40)?;
    let runaway_rounds = arg(&args, "--runaway-rounds", 60)?;
    let sides: Vec<Side> = MECHANISMS.into_iter().map(Side::new).collect::<Result<_>>()?;
    let (epochs, fuel) = (&sides[1], &sides[2]);
    println!("wasmtime 48, target {BUILD_TARGET}, {} CPUs; load average at start: {}", std::thread::available_parallelism().map_or(0, |n| n.get()), loadavg());

    // Fuel per millisecond of the runaway loop, to give fuel the plugin's
    // 10 ms deadline (median of 30 calls of 20 M fuel).
    let probe = 20_000_000;
    let mut rates = Vec::new();
    for _ in 0..30 {
        let o = runaway(fuel, Budget { time: DEADLINE, fuel: probe, memory_mib: 4 });
        o.answer.map_err(anyhow::Error::from).context("fuel calibration")?;
        rates.push(o.fuel as f64 / o.elapsed.as_secs_f64());
    }
    let rate = Samples::sorted(rates).p50();
    let fuel_10ms = (rate * DEADLINE.as_secs_f64()) as u64;
    println!("fuel calibration: the loop burns {:.0} M fuel/s; 10 ms = {fuel_10ms} fuel", rate / 1e6);
    let normal = Budget { time: DEADLINE, fuel: fuel_10ms, memory_mib: 4 };
    let generous = Budget { time: Duration::from_secs(10), fuel: u64::MAX / 2, memory_mib: 64 };

    // 1. Real hooks, fresh store each.
    let hooks = real_hooks();
    let mut times = vec![vec![Vec::with_capacity(rounds); hooks.len()]; 3];
    for side in &sides {
        for hook in &hooks {
            hook.run(side, normal).answer.map_err(anyhow::Error::from).with_context(|| format!("{} under {}", hook.label, side.mechanism.name()))?;
        }
    }
    for round in 0..rounds {
        for s in order(round) {
            for (h, hook) in hooks.iter().enumerate() {
                let o = hook.run(&sides[s], normal);
                if let Err(e) = o.answer {
                    bail!("{} under {}: {e:#}", hook.label, sides[s].mechanism.name());
                }
                times[s][h].push(us(o.elapsed));
            }
        }
    }
    println!("\n1. Real hooks, fresh store + instantiate + call, {rounds} rounds: p50 / p90 in µs (p50 against none)");
    println!("{:<34} {:>17} {:>26} {:>26}", "hook", "none", "epochs", "fuel");
    let mut total = [0.0f64; 3];
    for (h, hook) in hooks.iter().enumerate() {
        let s: Vec<Samples> = (0..3).map(|i| Samples::sorted(times[i][h].clone())).collect();
        for i in 0..3 {
            total[i] += s[i].p50();
        }
        let vs = |i: usize| format!("{:.1} / {:.1} ({:+.1}%)", s[i].p50(), s[i].at(0.9), 100.0 * (s[i].p50() / s[0].p50() - 1.0));
        println!("{:<34} {:>17} {:>26} {:>26}", hook.label, format!("{:.1} / {:.1}", s[0].p50(), s[0].at(0.9)), vs(1), vs(2));
    }
    let pct = |i: usize| 100.0 * (total[i] / total[0] - 1.0);
    println!(
        "{:<34} {:>17.1} {:>26} {:>26}",
        "sum of p50s",
        total[0],
        format!("{:.1} ({:+.1}%)", total[1], pct(1)),
        format!("{:.1} ({:+.1}%)", total[2], pct(2))
    );

    // 2. Compute.
    let heavy = compute_hooks();
    let mut times = vec![vec![Vec::with_capacity(compute_rounds); heavy.len()]; 3];
    let mut burnt = vec![0u64; heavy.len()];
    for (h, hook) in heavy.iter().enumerate() {
        for side in &sides {
            let o = hook.run(side, generous);
            o.answer.map_err(anyhow::Error::from).with_context(|| format!("{} under {}", hook.label, side.mechanism.name()))?;
            if side.mechanism == Mechanism::Fuel {
                burnt[h] = o.fuel;
            }
        }
    }
    for round in 0..compute_rounds {
        for s in order(round) {
            for (h, hook) in heavy.iter().enumerate() {
                let o = hook.run(&sides[s], generous);
                o.answer?;
                times[s][h].push(us(o.elapsed));
            }
        }
    }
    println!("\n2. Compute, {compute_rounds} rounds: p50 ms per call (time against none, work per ms against none);");
    println!("   fuel one call burns, and how long the loop-calibrated 10 ms of fuel lasts in this code");
    println!("{:<52} {:>8} {:>22} {:>22} {:>12} {:>14}", "call", "none", "epochs", "fuel", "fuel burnt", "10 ms of fuel");
    for (h, hook) in heavy.iter().enumerate() {
        let p: Vec<f64> = (0..3).map(|i| Samples::sorted(times[i][h].clone()).p50() / 1e3).collect();
        let vs = |i: usize| format!("{:.2} ({:+.0}%, {:.0}%)", p[i], 100.0 * (p[i] / p[0] - 1.0), 100.0 * p[0] / p[i]);
        // What the loop-calibrated 10 ms budget lasts in this code.
        let lasts = fuel_10ms as f64 / burnt[h] as f64 * p[2];
        println!("{:<52} {:>8.2} {:>22} {:>22} {:>12} {:>11.1} ms", hook.label, p[0], vs(1), vs(2), format!("{:.1} M", burnt[h] as f64 / 1e6), lasts);
    }

    // 3. Runaway loop, 10 ms deadline. The thread's CPU time is read around
    // each call: the rest of the wall time it waited for a CPU (the machine
    // is shared).
    let mut late = [Vec::with_capacity(runaway_rounds), Vec::with_capacity(runaway_rounds)];
    let mut on_cpu = [Vec::with_capacity(runaway_rounds), Vec::with_capacity(runaway_rounds)];
    let mut waiting = [Vec::with_capacity(runaway_rounds), Vec::with_capacity(runaway_rounds)];
    for round in 0..runaway_rounds {
        let pair = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in pair {
            let side = [epochs, fuel][i];
            let before = thread_cpu_time();
            let o = runaway(side, normal);
            let cpu = thread_cpu_time() - before;
            o.answer.map_err(anyhow::Error::from).with_context(|| format!("the loop under {}", side.mechanism.name()))?;
            late[i].push((o.elapsed.as_secs_f64() - DEADLINE.as_secs_f64()) * 1e3);
            on_cpu[i].push(cpu.as_secs_f64() * 1e3);
            waiting[i].push(o.elapsed.saturating_sub(cpu).as_secs_f64() * 1e3);
        }
    }
    println!("\n3. Runaway loop, deadline 10 ms, {runaway_rounds} calls each: returned at 10 ms + (ms); the thread's CPU time");
    println!("   during the call, and the rest of it (off CPU), in ms");
    println!("{:<36} {:>8} {:>8} {:>8} {:>8} {:>8} {:>18} {:>14}", "", "min", "p50", "p90", "max", "max-min", "on CPU p50 (range)", "off CPU p50/max");
    for (i, label) in ["epochs (watchdog tick at 10 ms)", "fuel (budget calibrated to 10 ms)"].into_iter().enumerate() {
        let s = Samples::sorted(late[i].clone());
        let (min, max) = (s.0[0], s.0[s.0.len() - 1]);
        let cpu = Samples::sorted(on_cpu[i].clone());
        let wait = Samples::sorted(waiting[i].clone());
        let cpu = format!("{:.2} ({:.2}-{:.2})", cpu.p50(), cpu.0[0], cpu.0[cpu.0.len() - 1]);
        let wait = format!("{:.2} / {:.1}", wait.p50(), wait.0[wait.0.len() - 1]);
        println!("{label:<36} {min:>+8.2} {:>+8.2} {:>+8.2} {max:>+8.2} {:>8.2} {cpu:>18} {wait:>14}", s.p50(), s.at(0.9), max - min);
    }
    println!("\nload average at end: {}", loadavg());
    Ok(())
}

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`; declared here rather
/// than through the libc crate, which this package does not depend on).
fn thread_cpu_time() -> Duration {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; Linux on 64-bit targets, where both
    // fields of `struct timespec` are 64 bits.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}
