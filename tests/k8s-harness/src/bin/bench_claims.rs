//! What an IPAMClaim costs an ADD (issue 25's figures), against a plain ADD in
//! the same run, on the harness's real apiserver: the release `thereabouts`
//! binary as a CNI plugin, one process per call, one call at a time,
//! interleaved so that the machine's noise falls on all three alike.
//!
//! ```sh
//! bash scripts/build-plugin.sh
//! THEREABOUTS_K8S_BINS=$(bash tests/k8s-bins/build.sh) \
//!   cargo run --release -p thereabouts-k8s-harness --bin bench_claims -- --pods 100
//! ```
//!
//! For each of `--pods N` (100) VMs, in turn:
//! - a plain ADD (a network without `allowPersistentIPs`);
//! - an ADD with a new claim (one pod GET, one claim GET, the allocation, one
//!   status PATCH: `status.ips`, `ownerPod`, a condition);
//! - an ADD with the same claim from another launcher pod, its `status.ips`
//!   set (the restart or migration target: the entry is taken over).
//!
//! Prints p50, p90 and p99 wall time (spawn to exit) of each kind, and the
//! ratios to the plain ADD.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, thereabouts_bin};
use thereabouts_k8s_harness::plugin::{Objects, kubernetes_conf};
use thereabouts_k8s_harness::report::{ms, percentile};
use thereabouts_k8s_harness::{Cluster, block_on, claims, pods};

const NS: &str = "vms";
const RANGES: [&str; 2] = ["192.0.2.0/24", "2001:db8:90::/64"];

fn add(conf: &str, pod: &str, container: &str) -> Result<Duration> {
    let mut call = Call::pod("ADD", container, pod);
    call.ifname = "net1".into();
    call.cni_args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={pod}");
    let out = Invocation::new(call, conf.to_string()).run(&thereabouts_bin());
    if !out.ok() {
        bail!("ADD {pod}: {}", out.describe());
    }
    Ok(out.elapsed)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let pods: usize = match args.iter().position(|a| a == "--pods") {
        Some(i) => args.get(i + 1).context("--pods needs a number")?.parse()?,
        None => 100,
    };
    let cluster = Cluster::prepared()?;
    block_on(async {
        claims::prepare(&cluster, NS).await?;
        for i in 0..pods {
            pods::create_labelled(&cluster, NS, &format!("plain-{i}"), &[]).await?;
            for launcher in ["a", "b"] {
                claims::launcher(&cluster, NS, &format!("launcher-{i}-{launcher}"), &format!("vm-{i}")).await?;
            }
        }
        anyhow::Ok(())
    })?;
    let objects = Objects::admin_in(&cluster, NS)?;
    for i in 0..pods {
        claims::create(&objects, &format!("vm-{i}.blue"))?;
    }
    let plain = kubernetes_conf("plain", &cluster.plugin_kubeconfig(), Some("plain"), &RANGES).to_string();
    let mut claimed: Value = kubernetes_conf("blue", &cluster.plugin_kubeconfig(), Some("claims"), &RANGES);
    claimed["allowPersistentIPs"] = json!(true);
    let claimed = claimed.to_string();

    let (mut plain_adds, mut new_claims, mut set_claims) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..pods {
        plain_adds.push(add(&plain, &format!("plain-{i}"), &format!("c-plain-{i}"))?);
        new_claims.push(add(&claimed, &format!("launcher-{i}-a"), &format!("c-{i}-a"))?);
        set_claims.push(add(&claimed, &format!("launcher-{i}-b"), &format!("c-{i}-b"))?);
    }
    println!("bench_claims: {pods} ADDs of each kind, one at a time, interleaved, dual-stack ({} + {})", RANGES[0], RANGES[1]);
    println!();
    println!("| ADD | p50 | p90 | p99 | p50 against plain |");
    println!("|---|---|---|---|---|");
    let base = percentile(&plain_adds, 50.0);
    for (kind, times) in
        [("plain (no allowPersistentIPs)", &plain_adds), ("a new claim", &new_claims), ("a claim whose status.ips is set (another launcher pod)", &set_claims)]
    {
        let p50 = percentile(times, 50.0);
        println!(
            "| {kind} | {} | {} | {} | {:.2}x |",
            ms(p50),
            ms(percentile(times, 90.0)),
            ms(percentile(times, 99.0)),
            p50.as_secs_f64() / base.as_secs_f64().max(1e-9)
        );
    }
    Ok(())
}
