//! Pod latency on a real node, in the manner of Multus' kube-burner `podLatency`
//! job: N pods created at once with a secondary network (a Multus NAD on a
//! bridge), the time from each pod's creation request to its Ready condition,
//! p50 and p99, with thereabouts (installed by its chart), whereabouts v0.9.4 and
//! host-local as the IPAM of the same NAD, on the same node, in one run.
//!
//!   bash tests/node.sh builds what it needs; then
//!   cargo run --release -p thereabouts-node-tests --bin bench_pod_latency -- [--rounds R] [N...]
//!
//! (defaults: 1 round, N = 50 100). Each round runs every size with every IPAM,
//! the IPAMs' order turning from burst to burst; with several rounds the
//! summary gives each figure's median over the rounds, beside each round's.
//!
//! Needs THEREABOUTS_K8S_BINS, THEREABOUTS_NODE_BINS, THEREABOUTS_HELM and
//! THEREABOUTS_WHEREABOUTS_DIR (tests/k8s-bins/build-peers.sh).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use thereabouts_node_tests::{Installed, pod_spec};

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut rounds = 1;
    if let Some(i) = args.iter().position(|a| a == "--rounds") {
        rounds = args.get(i + 1).context("--rounds R")?.parse().context("--rounds R")?;
        args.drain(i..i + 2);
    }
    let counts: Vec<usize> = args.iter().map(|a| a.parse()).collect::<Result<_, _>>().context("counts")?;
    let counts = if counts.is_empty() { vec![50, 100] } else { counts };
    anyhow::ensure!(rounds > 0 && counts.iter().all(|&n| n > 0), "rounds and pod counts must be at least 1");
    let installed = Installed::start()?;
    let node = &installed.node;
    // whereabouts v0.9.4's plugin beside thereabouts, with a flat file of its own.
    let peers = std::path::PathBuf::from(std::env::var_os("THEREABOUTS_WHEREABOUTS_DIR").context("THEREABOUTS_WHEREABOUTS_DIR")?);
    std::fs::copy(peers.join("whereabouts"), node.cni_bin_dir().join("whereabouts"))?;
    let whereabouts_flat = node.dir().join("whereabouts.conf");
    std::fs::write(&whereabouts_flat, json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": installed.cluster().admin_kubeconfig()}}).to_string())?;
    let ipams = [
        (
            "thereabouts",
            "t",
            json!({"type": "thereabouts", "configuration_path": installed.flat_file(), "ipRanges": [{"range": "192.0.2.0/25"}, {"range": "2001:db8:10::/64"}]}),
        ),
        (
            "whereabouts",
            "w",
            json!({"type": "whereabouts", "configuration_path": whereabouts_flat, "ipRanges": [{"range": "192.0.2.128/25"}, {"range": "2001:db8:20::/64"}]}),
        ),
        (
            "host-local",
            "h",
            json!({"type": "host-local", "dataDir": node.dir().join("bench-host-local"), "ranges": [[{"subnet": "203.0.113.0/24"}], [{"subnet": "2001:db8:30::/64"}]]}),
        ),
    ];
    // (size, IPAM) -> each round's (p50, p99, max).
    let mut results: BTreeMap<(usize, &str), Vec<[f64; 3]>> = BTreeMap::new();
    let mut turn = 0;
    for round in 0..rounds {
        for &n in &counts {
            // The order turns every burst, so that drift on a busy machine spreads over all three.
            for k in 0..ipams.len() {
                let (name, suffix, ipam) = &ipams[(k + turn) % ipams.len()];
                let nad = format!("bench-{name}");
                installed.nad_raw(&nad, suffix, ipam.clone())?;
                let figures = percentiles(burst(&installed, &nad, n)?);
                eprintln!("round {}: {n} pods, {name}: p50 {:.2} s, p99 {:.2} s", round + 1, figures[0], figures[1]);
                results.entry((n, name)).or_default().push(figures);
            }
            turn += 1;
        }
    }
    println!("| pods at once | IPAM | p50 | p99 | max | p99 of each round |");
    println!("|---|---|---|---|---|---|");
    for ((n, name), runs) in &results {
        let median = |i: usize| {
            let mut v: Vec<f64> = runs.iter().map(|r| r[i]).collect();
            v.sort_by(f64::total_cmp);
            // Of an even count, the mean of the middle two.
            (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0
        };
        let each: Vec<String> = runs.iter().map(|r| format!("{:.2}", r[1])).collect();
        println!("| {n} | {name} | {:.2} s | {:.2} s | {:.2} s | {} |", median(0), median(1), median(2), each.join(" / "));
    }
    Ok(())
}

/// p50, p99 and max of one burst's latencies, in seconds.
fn percentiles(mut l: Vec<Duration>) -> [f64; 3] {
    l.sort();
    let p = |q: f64| l[((l.len() as f64 * q).ceil() as usize).saturating_sub(1).min(l.len() - 1)].as_secs_f64();
    [p(0.5), p(0.99), l[l.len() - 1].as_secs_f64()]
}

/// N pods on `nad` created at once; each one's time from its creation request
/// to Ready (polled every 100 ms); then all deleted and their sandboxes stopped.
fn burst(installed: &Installed, nad: &str, n: usize) -> Result<Vec<Duration>> {
    let names: Vec<String> = (0..n).map(|i| format!("{nad}-{i}")).collect();
    let mut created = BTreeMap::new();
    for name in &names {
        let pod = pod_spec(name, nad, "sleep 3600");
        created.insert(name.clone(), Instant::now());
        installed.create_pod_value(pod)?;
    }
    let mut ready: BTreeMap<String, Duration> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while ready.len() < n {
        anyhow::ensure!(Instant::now() < deadline, "{} of {n} pods on {nad} Ready after 600 s", ready.len());
        for pod in installed.pods(&format!("{nad}-"))? {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let is_ready = pod.status.and_then(|s| s.conditions).unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True");
            if is_ready && !ready.contains_key(&name) {
                ready.insert(name.clone(), created[&name].elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for name in &names {
        installed.delete_pod(name)?;
    }
    installed.wait("the burst's pods are gone", Duration::from_secs(300), || Ok(installed.pods(&format!("{nad}-"))?.is_empty()))?;
    // Their sandboxes stopped too: the next burst does not share the node with teardowns.
    installed.node.wait_namespace_stopped(thereabouts_node_tests::PODS, Duration::from_secs(300))?;
    Ok(ready.into_values().collect())
}
