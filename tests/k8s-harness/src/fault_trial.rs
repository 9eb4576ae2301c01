//! Fault trials, as a runtime would live through them: one trial is a burst
//! of concurrent CNI calls (ADDs of new pods, DELs of the previous trial's
//! pods; the release `thereabouts` binary, one process per call) with one
//! fault ([`crate::faults::Plan`]) injected at a random moment and healed,
//! then what a runtime and the controller do afterwards (the DEL of every
//! failed ADD, a failed DEL retried until it succeeds, one controller pass),
//! then the checks:
//!
//! - the history checker ([`thereabouts_e2e::history`]) over the calls of this
//!   trial and the previous one against what the datastore holds: no address
//!   certainly held twice, none lost, none leaked;
//! - no entry or reservation without a live holder (a pod of this trial whose
//!   ADD succeeded, holding that address);
//! - `thereabouts pools --check` finds nothing.
//!
//! Leaks are counted when the fault is healed (entries and reservations of
//! failed calls), then after the runtime's DELs and after the controller pass:
//! found, freed by the DELs, freed by the controller, left (a finding).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use thereabouts_e2e::history::{History, Violation, attachment_of_entry};
use thereabouts_e2e::{Invocation, Outcome, addr_of, thereabouts_bin};

use crate::burst::{Network, pods, run_concurrently};
use crate::fault_world::World;
use crate::faults::{FAILPOINT_ENV, Fault, Plan};
use crate::report::blurred_message;
use crate::trial_rng::TrialRng;

/// The plugin's budget in a burst: short, so that a call cut off by a fault
/// answers (code 11) while the trial runs.
const BURST_BUDGET: Duration = Duration::from_secs(8);
/// The budget of the runtime's DELs after the fault is healed.
const HEAL_BUDGET: Duration = Duration::from_secs(30);
/// A runtime retries a failed DEL until it succeeds; a trial gives up (a
/// finding) after this many attempts, a second apart.
const DEL_ATTEMPTS: usize = 5;
/// The pods of one trial: between these many ADDs.
const NEW_PODS: (usize, usize) = (5, 10);

/// What one trial did and found.
#[derive(Debug, Default, Clone)]
pub struct TrialReport {
    pub trial: usize,
    pub seed: u64,
    pub fault: Option<Fault>,
    /// The plan as drawn, and what it hit (an etcd member).
    pub plan: String,
    /// Every plugin call: the burst and the runtime's DELs after it.
    pub calls: usize,
    /// Calls of the burst running when the fault came (or SIGKILLed).
    pub hit: usize,
    pub adds: usize,
    pub adds_failed: usize,
    /// Failed calls of the burst by answer: `code 11`, `killed`, ...
    pub answers: BTreeMap<String, usize>,
    /// Failed calls of the burst and the runtime's DELs by message (numbers blurred).
    pub messages: BTreeMap<String, usize>,
    pub duplicates: Vec<String>,
    pub leaks_found: usize,
    pub freed_by_dels: usize,
    pub freed_by_controller: usize,
    /// Entries and reservations without a live holder after the controller pass.
    pub leaks_left: Vec<String>,
    /// Addresses the history leaves held that the datastore lost.
    pub lost: Vec<String>,
    pub check_findings: Vec<String>,
    /// Calls that hung past their watchdog, answered no CNI error, or a DEL
    /// that never succeeded.
    pub other: Vec<String>,
}

impl TrialReport {
    /// Everything that must not happen, one line each.
    pub fn findings(&self) -> Vec<String> {
        let tagged = |what: &str, list: &[String]| list.iter().map(|l| format!("{what}: {l}")).collect::<Vec<_>>();
        [
            tagged("held twice", &self.duplicates),
            tagged("leak left", &self.leaks_left),
            tagged("lost", &self.lost),
            tagged("pools --check", &self.check_findings),
            tagged("other", &self.other),
        ]
        .concat()
    }

    pub fn line(&self) -> String {
        let answers: Vec<String> = self.answers.iter().map(|(a, n)| format!("{n}× {a}")).collect();
        format!(
            "trial {} (seed {}): {}; {} calls, {} hit, {}/{} ADDs failed [{}]; leaks {} found, {} freed by DELs, {} by the controller; {} findings",
            self.trial,
            self.seed,
            self.plan,
            self.calls,
            self.hit,
            self.adds_failed,
            self.adds,
            answers.join(", "),
            self.leaks_found,
            self.freed_by_dels,
            self.freed_by_controller,
            self.findings().len()
        )
    }
}

/// Trials in sequence on one world; each trial's pods are DELed by the next.
pub struct Trials<'w> {
    world: &'w World,
    bin: PathBuf,
    rng: TrialRng,
    /// Pod names start with it: trials of one run never reuse a name.
    tag: String,
    next: usize,
    /// The previous trial's pods (container ID, pod name), and its calls
    /// about them (the history their DELs continue).
    prev_pods: Vec<(String, String)>,
    prev_calls: Vec<Outcome>,
}

impl<'w> Trials<'w> {
    /// Trials drawn from `seed`; `tag` (lowercase letters, digits, `-`) names their pods.
    pub fn new(world: &'w World, seed: u64, tag: &str) -> Trials<'w> {
        Trials { world, bin: thereabouts_bin(), rng: TrialRng::new(seed), tag: tag.to_string(), next: 0, prev_pods: Vec::new(), prev_calls: Vec::new() }
    }

    /// One trial of `fault`. An error is the harness failing (a server that
    /// would not start again), not a finding.
    pub fn run(&mut self, fault: Fault) -> Result<TrialReport> {
        let seed = self.rng.fork();
        let trial = self.next;
        self.next += 1;
        let mut rng = TrialRng::new(seed);
        let mut report = TrialReport { trial, seed, fault: Some(fault), ..TrialReport::default() };
        let world = self.world;

        let new_pods = pods(&format!("{}-{trial:04}", self.tag), rng.between(NEW_PODS.0, NEW_PODS.1));
        let names = |p: &[(String, String)]| p.iter().map(|(_, name)| name.clone()).collect::<Vec<_>>();
        world.create_pods(&names(&new_pods))?;
        world.delete_pods(&names(&self.prev_pods))?;
        let mut calls: Vec<(&str, &(String, String))> = new_pods.iter().map(|p| ("ADD", p)).chain(self.prev_pods.iter().map(|p| ("DEL", p))).collect();
        shuffle(&mut calls, &mut rng);
        let members = world.servers.etcd.as_ref().map_or(0, |_| crate::etcd_cluster::MEMBERS);
        let plan = Plan::draw(fault, calls.len(), members, &mut rng);
        let net = Network::new(world.conf(Some(&plan)), &world.ranges, &format!("fault-trial-{trial}"));
        let invocations: Vec<Invocation> = calls
            .iter()
            .zip(plan.kills.iter().zip(&plan.armed))
            .map(|((command, (cid, pod)), (kill, armed))| {
                let mut call = net.invocation(command, cid, pod, BURST_BUDGET);
                if let (true, Some(point)) = (*armed, plan.failpoint) {
                    call = call.env(FAILPOINT_ENV, point);
                }
                // SIGKILL by the runner's watchdog, that long after the spawn.
                match kill {
                    Some(after) => call.watchdog(*after),
                    None => call,
                }
            })
            .collect();

        // The burst, with the fault beside it.
        let (burst, injected) = std::thread::scope(|scope| {
            let injector = scope.spawn(|| {
                let started = Instant::now();
                world.servers.inject_and_heal(&plan).map(|hit| (hit, started + plan.at))
            });
            let burst = run_concurrently(&self.bin, &invocations, None);
            (burst, injector.join())
        });
        let (hit, injected_at) = injected.map_err(|_| anyhow::anyhow!("the fault injector panicked"))??;
        report.plan = if hit.is_empty() { plan.to_string() } else { format!("{plan}, hit {hit}") };
        report.hit = match fault {
            Fault::PluginKill => burst.iter().filter(|o| o.timed_out).count(),
            Fault::Failpoint => burst.iter().filter(|o| killed_itself(o)).count(),
            _ => burst.iter().filter(|o| o.started <= injected_at && injected_at < o.started + o.elapsed).count(),
        };
        report.adds = new_pods.len();
        report.adds_failed = burst.iter().filter(|o| o.call.command == "ADD" && !o.ok()).count();
        for (o, kill) in burst.iter().zip(&plan.kills) {
            if !o.ok() {
                let answer = answer_of(o, kill.is_some());
                if answer == "hung" || answer == "no CNI error" {
                    report.other.push(format!("{answer}: {}", o.describe()));
                }
                *report.answers.entry(answer).or_default() += 1;
            }
        }

        // What the live pods hold: their ADDs' answers.
        let live: BTreeMap<String, Vec<IpAddr>> =
            burst.iter().filter(|o| o.call.command == "ADD" && o.ok()).map(|o| (format!("default/{}", o.call.pod_name()), addresses(o))).collect();
        let found = self.stale(&live)?;
        report.leaks_found = found.len();

        // The runtime: a DEL for every failed ADD, a failed DEL again, until they succeed.
        let mut history: Vec<Outcome> = burst;
        let mut pending: Vec<(String, String)> =
            history.iter().filter(|o| !o.ok()).map(|o| (o.call.container_id.clone(), o.call.pod_name().to_string())).collect();
        for attempt in 1..=DEL_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            if attempt > 1 {
                std::thread::sleep(Duration::from_secs(1));
            }
            let dels = run_concurrently(&self.bin, &net.calls("DEL", &pending, HEAL_BUDGET), None);
            pending = dels.iter().filter(|o| !o.ok()).map(|o| (o.call.container_id.clone(), o.call.pod_name().to_string())).collect();
            if attempt == DEL_ATTEMPTS {
                report.other.extend(dels.iter().filter(|o| !o.ok()).map(|o| format!("DEL failed {DEL_ATTEMPTS} times: {}", o.describe())));
            }
            history.extend(dels);
        }
        report.calls = history.len();
        for o in history.iter().filter(|o| !o.ok()) {
            *report.messages.entry(format!("{} {}", o.call.command, blurred_message(o))).or_default() += 1;
        }
        let after_dels = self.stale(&live)?;
        world.controller_pass()?;
        let left = self.stale(&live)?;
        report.freed_by_dels = found.len().saturating_sub(after_dels.len());
        report.freed_by_controller = after_dels.len().saturating_sub(left.len());

        // The history of this trial and the previous one against the pools.
        let entries = world.entries()?;
        let held = entries.iter().flatten().map(|(a, e)| (*a, attachment_of_entry(&e.podref, &e.id, &e.ifname))).collect();
        let all: Vec<&Outcome> = self.prev_calls.iter().chain(&history).collect();
        let mut leaks: BTreeSet<String> = left.into_iter().collect();
        for violation in History::of(&all).check(&held) {
            match violation {
                Violation::HeldTwice { address, first, second } => report.duplicates.push(format!("{address} by {} and {}", first.holder, second.holder)),
                Violation::Lost { address, by, found } => report.lost.push(format!("{address} of {} (held by {found:?})", by.holder)),
                Violation::Leaked { address, by } => {
                    leaks.insert(format!("entry {address} of {}", by.holder));
                }
            }
        }
        report.leaks_left = leaks.into_iter().collect();
        report.check_findings = world.pools_check()?;

        let new: BTreeSet<&str> = new_pods.iter().map(|(cid, _)| cid.as_str()).collect();
        self.prev_calls = history.into_iter().filter(|o| new.contains(o.call.container_id.as_str())).collect();
        self.prev_pods = new_pods;
        if !report.findings().is_empty() {
            eprintln!("{}\nlogs of the trial's calls: keep them with the run directory {}", report.line(), world.dir().display());
            for o in &self.prev_calls {
                eprintln!("--- {}\n{}", o.describe(), net.log_text(&o.call.command, &o.call.container_id));
            }
        }
        Ok(report)
    }

    /// Every entry and reservation of the ranges not held by a live pod
    /// (`podref` → the addresses its ADD answered) for one of its addresses.
    fn stale(&self, live: &BTreeMap<String, Vec<IpAddr>>) -> Result<Vec<String>> {
        let holds = |podref: &str, address: &IpAddr| live.get(podref).is_some_and(|a| a.contains(address));
        let mut out = Vec::new();
        for entries in self.world.entries().context("reading the pools")? {
            out.extend(entries.values().filter(|e| !holds(&e.podref, &e.address)).map(|e| format!("entry {} of {} ({})", e.address, e.podref, e.id)));
        }
        for (name, spec) in self.world.reservations().context("reading the reservations")? {
            let podref = spec["podref"].as_str().unwrap_or_default();
            let address = name.replace('-', ":").parse::<IpAddr>().ok();
            if !address.is_some_and(|a| holds(podref, &a)) {
                out.push(format!("reservation {name} of {podref} ({})", spec["containerid"].as_str().unwrap_or_default()));
            }
        }
        Ok(out)
    }
}

/// A successful ADD's addresses.
fn addresses(o: &Outcome) -> Vec<IpAddr> {
    o.ips().iter().map(|ip| addr_of(ip)).collect()
}

/// Whether the call's process died of the SIGKILL an armed failpoint sends.
fn killed_itself(o: &Outcome) -> bool {
    use std::os::unix::process::ExitStatusExt;
    !o.timed_out && o.status.signal() == Some(9)
}

/// How a failed call ended: `killed` (by the plan), `hung` (past its
/// watchdog unplanned), `killed at the failpoint`, `code N` (a CNI error),
/// `no CNI error` (it died).
fn answer_of(o: &Outcome, planned_kill: bool) -> String {
    if o.timed_out {
        return if planned_kill { "killed".into() } else { "hung".into() };
    }
    if killed_itself(o) {
        return "killed at the failpoint".into();
    }
    match serde_json::from_str::<serde_json::Value>(&o.stdout).ok().and_then(|v| v["code"].as_u64()) {
        Some(code) => format!("{} code {code}", o.call.command),
        None => "no CNI error".into(),
    }
}

/// Fisher-Yates, from the trial's generator.
fn shuffle<T>(items: &mut [T], rng: &mut TrialRng) {
    for i in (1..items.len()).rev() {
        items.swap(i, rng.below(i + 1));
    }
}

/// Trials summed per fault: the table of a run.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub trials: usize,
    pub calls: usize,
    pub hit: usize,
    pub adds: usize,
    pub adds_failed: usize,
    pub duplicates: usize,
    pub leaks_found: usize,
    pub freed_by_dels: usize,
    pub freed_by_controller: usize,
    pub leaks_left: usize,
    pub lost: usize,
    pub check_findings: usize,
    pub other: usize,
    pub messages: BTreeMap<String, usize>,
}

impl Tally {
    pub fn add(&mut self, r: &TrialReport) {
        self.trials += 1;
        self.calls += r.calls;
        self.hit += r.hit;
        self.adds += r.adds;
        self.adds_failed += r.adds_failed;
        self.duplicates += r.duplicates.len();
        self.leaks_found += r.leaks_found;
        self.freed_by_dels += r.freed_by_dels;
        self.freed_by_controller += r.freed_by_controller;
        self.leaks_left += r.leaks_left.len();
        self.lost += r.lost.len();
        self.check_findings += r.check_findings.len();
        self.other += r.other.len();
        for (m, n) in &r.messages {
            *self.messages.entry(m.clone()).or_default() += n;
        }
    }

    pub fn header() -> String {
        "| datastore | fault | trials | calls | calls hit | ADDs failed | duplicates | leaks found | freed by DELs | freed by controller | leaks left | lost | `pools --check` findings | other |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into()
    }

    pub fn row(&self, datastore: &str, fault: &str) -> String {
        format!(
            "| {datastore} | {fault} | {} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} |",
            self.trials,
            self.calls,
            self.hit,
            self.adds_failed,
            self.adds,
            self.duplicates,
            self.leaks_found,
            self.freed_by_dels,
            self.freed_by_controller,
            self.leaks_left,
            self.lost,
            self.check_findings,
            self.other
        )
    }
}

/// A run of trials: the tally per fault and the reports with findings.
#[derive(Debug, Default)]
pub struct Run {
    pub tallies: BTreeMap<Fault, Tally>,
    pub with_findings: Vec<TrialReport>,
}

impl Run {
    /// The failed calls' messages per fault, most frequent first.
    pub fn messages(&self) -> String {
        let mut out = String::new();
        for (fault, t) in &self.tallies {
            let mut by_count: Vec<(&String, &usize)> = t.messages.iter().collect();
            by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            out.push_str(&format!("{}:\n", fault.label()));
            for (m, n) in by_count {
                out.push_str(&format!("  {n} × {m}\n"));
            }
        }
        out
    }

    /// The table rows of the run, one per fault, for `datastore`.
    pub fn table(&self, datastore: &str) -> String {
        let rows: Vec<String> = self.tallies.iter().map(|(fault, t)| t.row(datastore, fault.label())).collect();
        let mut total = Tally::default();
        for t in self.tallies.values() {
            total.trials += t.trials;
            total.calls += t.calls;
            total.hit += t.hit;
            total.adds += t.adds;
            total.adds_failed += t.adds_failed;
            total.duplicates += t.duplicates;
            total.leaks_found += t.leaks_found;
            total.freed_by_dels += t.freed_by_dels;
            total.freed_by_controller += t.freed_by_controller;
            total.leaks_left += t.leaks_left;
            total.lost += t.lost;
            total.check_findings += t.check_findings;
            total.other += t.other;
        }
        format!("{}\n{}\n{}", Tally::header(), rows.join("\n"), total.row(datastore, "**all**"))
    }
}

/// `trials` trials on `world`, `faults` (each a fault of its datastore)
/// taking turns, drawn from `seed`; `each` sees every report as it is made.
pub fn run_trials(world: &World, faults: &[Fault], trials: usize, seed: u64, tag: &str, mut each: impl FnMut(&TrialReport)) -> Result<Run> {
    let mut runner = Trials::new(world, seed, tag);
    let mut run = Run::default();
    for i in 0..trials {
        let fault = faults[i % faults.len()];
        let report = runner.run(fault).with_context(|| format!("trial {i} ({}) of seed {seed}", fault.label()))?;
        each(&report);
        run.tallies.entry(fault).or_default().add(&report);
        if !report.findings().is_empty() {
            run.with_findings.push(report);
        }
    }
    Ok(run)
}
