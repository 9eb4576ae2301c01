//! What DRANET's profile provider costs per call (issue 25's figure): the
//! release `thereabouts profile-provider` on a unix socket, on the harness's
//! real apiserver, one call at a time over a kept HTTP/1 connection (as
//! DRANET's Go client keeps it), against a plain CNI ADD of the same binary in
//! the same run (DRANET's whereabouts provider runs its plugin once per call).
//!
//! ```sh
//! bash scripts/build-plugin.sh
//! THEREABOUTS_K8S_BINS=$(bash tests/k8s-bins/build.sh) \
//!   cargo run --release -p thereabouts-k8s-harness --bin bench_profile_provider -- --devices 200
//! ```
//!
//! For each of `--devices N` (200) claims, interleaved: a plain CNI ADD (one
//! process), a GetProfileConfig that allocates, the kubelet's repeat (the
//! same addresses), and the ReleaseProfileConfig. Prints p50, p90 and p99 of
//! each kind, from sending the request to the whole answer read.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use thereabouts_e2e::{Call, Invocation, TempDir, thereabouts_bin};
use thereabouts_k8s_harness::plugin::kubernetes_conf;
use thereabouts_k8s_harness::profile_provider::{Client, ProfileProvider, request};
use thereabouts_k8s_harness::report::{ms, percentile};
use thereabouts_k8s_harness::{Cluster, block_on, pods};

const NS: &str = "dra";
const RANGES: [&str; 2] = ["192.0.2.0/24", "2001:db8:91::/64"];
const PROFILE: &str = "dra-blue";

fn timed<T>(what: &str, call: impl FnOnce() -> Result<(u16, T)>) -> Result<Duration> {
    let started = Instant::now();
    let (status, _) = call()?;
    let elapsed = started.elapsed();
    if status != 200 {
        bail!("{what}: HTTP {status}");
    }
    Ok(elapsed)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let devices: usize = match args.iter().position(|a| a == "--devices") {
        Some(i) => args.get(i + 1).context("--devices needs a number")?.parse()?,
        None => 200,
    };
    let cluster = Cluster::prepared()?;
    block_on(async {
        pods::namespace(&cluster, NS).await?;
        for i in 0..devices {
            pods::create_labelled(&cluster, NS, &format!("plain-{i}"), &[]).await?;
        }
        anyhow::Ok(())
    })?;
    let work = TempDir::new("bench-profile-provider");
    let profiles = work.path().join("profiles");
    std::fs::create_dir_all(&profiles)?;
    std::fs::write(profiles.join("dra-blue.conf"), kubernetes_conf(PROFILE, &cluster.plugin_kubeconfig(), Some("dra"), &RANGES).to_string())?;
    let socket = work.path().join("profile.sock");
    let _provider = ProfileProvider::start(&thereabouts_bin(), &profiles, &socket, &work.path().join("provider.log"))?;
    let mut client = Client::new(&socket)?;
    let plain = kubernetes_conf("plain", &cluster.plugin_kubeconfig(), Some("plain"), &RANGES).to_string();

    let (mut adds, mut gets, mut repeats, mut releases) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..devices {
        let mut call = Call::pod("ADD", &format!("c-{i}"), &format!("plain-{i}"));
        call.cni_args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME=plain-{i}");
        let out = Invocation::new(call, plain.clone()).run(&thereabouts_bin());
        if !out.ok() {
            bail!("plain ADD {i}: {}", out.describe());
        }
        adds.push(out.elapsed);
        let body = request(&format!("claim-uid-{i}"), "eth1", PROFILE);
        gets.push(timed("GetProfileConfig", || client.get_profile(&body))?);
        repeats.push(timed("GetProfileConfig again", || client.get_profile(&body))?);
        releases.push(timed("ReleaseProfileConfig", || client.release_profile(&body).map(|s| (s, ())))?);
    }
    println!("bench_profile_provider: {devices} calls of each kind, one at a time, interleaved, dual-stack ({} + {})", RANGES[0], RANGES[1]);
    println!();
    println!("| call | p50 | p90 | p99 |");
    println!("|---|---|---|---|");
    for (kind, times) in [
        ("plain CNI ADD (a process per call)", &adds),
        ("GetProfileConfig, allocating", &gets),
        ("GetProfileConfig, repeated (the same addresses)", &repeats),
        ("ReleaseProfileConfig", &releases),
    ] {
        println!("| {kind} | {} | {} | {} |", ms(percentile(times, 50.0)), ms(percentile(times, 90.0)), ms(percentile(times, 99.0)));
    }
    Ok(())
}
