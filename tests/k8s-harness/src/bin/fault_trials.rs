//! Fault trials, long (issue 26 §2): `--trials N` trials of one datastore,
//! its faults taking turns (or only `--fault F`: plugin-kill, failpoint,
//! server-restart, leader-loss, follower-loss, latency, reset-peer,
//! black-hole; src/fault_trial.rs, src/faults.rs), every choice
//! drawn from `--seed S` (printed; the same seed replays the same choices),
//! each trial's line as it ends, then the table for docs/reliability.md:
//! per fault, trials, calls, calls the fault hit, ADDs failed, duplicates,
//! leaks found / freed by the runtime's DELs / freed by the controller / left,
//! addresses lost, `pools --check` findings. Exit status 1 on any finding.
//!
//! ```sh
//! bash scripts/build-plugin.sh
//! THEREABOUTS_K8S_BINS=... THEREABOUTS_TOXIPROXY_DIR=... \
//!   cargo run --release -p thereabouts-k8s-harness --bin fault_trials -- --datastore etcd --trials 200 --seed 1
//! ```

use anyhow::{Context, Result, bail};
use thereabouts_k8s_harness::Cluster;
use thereabouts_k8s_harness::fault_trial::run_trials;
use thereabouts_k8s_harness::fault_world::{World, network_of};
use thereabouts_k8s_harness::faults::{Datastore, Fault};
use thereabouts_k8s_harness::trial_rng::TrialRng;

struct Options {
    datastore: Datastore,
    /// Only this fault (`--fault`), else every fault of the datastore in turn.
    fault: Option<Fault>,
    trials: usize,
    seed: u64,
}

fn options() -> Result<Options> {
    let mut o = Options { datastore: Datastore::Kubernetes, fault: None, trials: 50, seed: TrialRng::clock_seed() };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--datastore" => {
                let text = value()?;
                o.datastore = Datastore::parse(&text).with_context(|| format!("--datastore kubernetes|etcd, not {text:?}"))?;
            }
            "--fault" => {
                let text = value()?;
                o.fault = Some(Fault::parse(&text).with_context(|| format!("--fault: no fault {text:?}"))?);
            }
            "--trials" => o.trials = value()?.parse().context("--trials N")?,
            "--seed" => o.seed = value()?.parse().context("--seed S (a number)")?,
            other => bail!("unknown argument {other:?}; usage: fault_trials --datastore kubernetes|etcd [--fault F] --trials N --seed S"),
        }
    }
    Ok(o)
}

fn main() -> Result<()> {
    let o = options()?;
    let datastore = o.datastore.label();
    println!("fault trials: datastore {datastore}, {} trials, seed {}", o.trials, o.seed);
    let cluster = std::sync::Arc::new(Cluster::prepared()?);
    let (name, ranges) = network_of(o.datastore);
    let world = World::start(o.datastore, cluster, name, &ranges)?;
    let started = std::time::Instant::now();
    let faults = match o.fault {
        Some(fault) if o.datastore.faults().contains(&fault) => vec![fault],
        Some(fault) => bail!("--fault {}: not a fault of the {datastore} datastore", fault.slug()),
        None => o.datastore.faults().to_vec(),
    };
    let run = run_trials(&world, &faults, o.trials, o.seed, &format!("bench-{datastore}"), |r| println!("{}", r.line()))?;
    println!("\n{} trials in {:.0?}, seed {}\n\n{}", o.trials, started.elapsed(), o.seed, run.table(datastore));
    println!("\nfailed calls by message:\n{}", run.messages());
    if !run.with_findings.is_empty() {
        for r in &run.with_findings {
            println!("\ntrial {} (seed {}): {}", r.trial, r.seed, r.plan);
            for f in r.findings() {
                println!("  {f}");
            }
        }
        std::process::exit(1);
    }
    Ok(())
}
