//! Fault trials, short (issue 26 §2): the Kubernetes and the etcd datastore
//! through the CNI protocol (the release `thereabouts` binary, one process per
//! call) with concurrent ADDs and DELs, each trial with one fault injected at
//! a random moment and healed (`src/fault_trial.rs`):
//!
//! * Kubernetes: plugin processes SIGKILLed; the apiserver killed and
//!   restarted; toxiproxy between plugin and apiserver adding latency,
//!   resetting connections, black-holing them;
//! * etcd (a 3-member cluster): plugin processes SIGKILLed; the leader
//!   killed and restarted; a follower killed and restarted; toxiproxy in front
//!   of one member or all three.
//!
//! After each trial the runtime's DELs and one controller pass: no address
//! held twice, nothing lost, no entry or reservation without a live holder,
//! `pools --check` clean; any finding fails the test. Two trials per fault
//! here; `bench`-style long runs: the `fault_trials` binary
//! (docs/reliability.md, "Injected faults"). The seed is printed;
//! `THEREABOUTS_FAULT_SEED` replays a run's choices.
//!
//! Binary: `$THEREABOUTS_BIN`, else `target/plugin/thereabouts` (tests/k8s.sh builds it with scripts/build-plugin.sh).

use std::sync::Mutex;

use thereabouts_k8s_harness::Cluster;
use thereabouts_k8s_harness::fault_trial::run_trials;
use thereabouts_k8s_harness::fault_world::{World, network_of};
use thereabouts_k8s_harness::faults::Datastore;
use thereabouts_k8s_harness::trial_rng::TrialRng;

/// Trials per fault of a datastore.
const PER_FAULT: usize = 2;

/// Held by each test for its whole run: a burst takes the machine's cores,
/// and a fault must not land on the other test's calls.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn trials_of(datastore: Datastore) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let seed = std::env::var("THEREABOUTS_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(TrialRng::clock_seed);
    eprintln!("fault trials of the {} datastore: seed {seed} (THEREABOUTS_FAULT_SEED={seed} replays the choices)", datastore.label());
    let cluster = Cluster::shared().expect("starting a prepared control plane");
    let (name, ranges) = network_of(datastore);
    let world = World::start(datastore, cluster, name, &ranges).expect("starting the servers of the trials");
    let trials = PER_FAULT * datastore.faults().len();
    let run =
        run_trials(&world, datastore.faults(), trials, seed, &format!("ci-{}", datastore.label()), |r| eprintln!("{}", r.line())).expect("running the trials");
    eprintln!("{}\nfailed calls by message:\n{}", run.table(datastore.label()), run.messages());
    let findings: Vec<String> =
        run.with_findings.iter().flat_map(|r| r.findings().into_iter().map(move |f| format!("trial {} (seed {}): {f}", r.trial, r.seed))).collect();
    assert!(findings.is_empty(), "seed {seed}: {} findings:\n{}", findings.len(), findings.join("\n"));
    // A trial that hit nothing proves nothing: the faults must have met calls.
    let hit: usize = run.tallies.values().map(|t| t.hit).sum();
    assert!(hit > 0, "no fault of seed {seed} met a call in flight");
}

#[test]
fn kubernetes_datastore_under_injected_faults() {
    trials_of(Datastore::Kubernetes);
}

#[test]
fn etcd_datastore_under_injected_faults() {
    trials_of(Datastore::Etcd);
}
