//! `thereabouts policy compile|check|run|bench`, for a person writing or
//! installing a policy (in the spirit of Kubewarden's `kwctl`). They run the
//! policy exactly as the plugin does: from its precompiled artifact, bounded.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use thereabouts_allocator::model::{PolicyConfig, PolicyMode, PolicyOnError};

use super::artifact;
use super::decide::{Guide, Policies, Subject};
use super::failure::PolicyStop;
use super::hooks::{self, Input, Needs, redacted};
use super::sandbox::PolicyEngine;
use crate::component::EngineComponent;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Precompile a policy component into the root-owned cache the plugin
    /// loads from (runs thereabouts-policy-compiler, installed beside this binary)
    Compile {
        /// The policy component (.wasm), as the config's `path` names it
        wasm: PathBuf,
        /// The cache directory (default /var/lib/thereabouts/policies, or $THEREABOUTS_POLICY_CACHE)
        #[arg(long, value_name = "DIR")]
        cache: Option<PathBuf>,
    },
    /// Load a compiled policy and check settings with its validate-settings
    /// (exit 0 accepted, 1 rejected or failed, 2 not usable)
    Check {
        wasm: PathBuf,
        /// The settings, as JSON
        #[arg(long, default_value = "{}")]
        settings: String,
        #[arg(long, default_value_t = 10)]
        timeout_ms: u32,
        #[arg(long, default_value_t = 4)]
        memory_mib: u32,
    },
    /// Run a config's policies for one attachment on its pools (empty, or
    /// read from its datastore) and print their verdict and the plan; nothing is written
    Run {
        /// CNI network config (.conf) or config list (.conflist) with `policies`
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        #[arg(long, value_name = "NS/NAME", default_value = "default/pod-0")]
        pod: String,
        #[arg(long, default_value = "net1")]
        ifname: String,
        #[arg(long, default_value = "policy-run")]
        container_id: String,
        /// A pod label, key=value (repeatable)
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Start from the allocations in the configured datastore (read-only) instead of empty pools
        #[arg(long)]
        from_datastore: bool,
    },
    /// Measure a compiled policy's cost per call: load, then each hook
    Bench {
        wasm: PathBuf,
        #[arg(long, default_value = "{}")]
        settings: String,
        /// A network config whose ranges the hooks see
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        #[arg(long, default_value_t = 200)]
        calls: u32,
    },
}

/// Runs one; the exit status as `cli::finish` takes it.
pub fn run(command: PolicyCommand) -> Result<u8> {
    match command {
        PolicyCommand::Compile { wasm, cache } => compile(&wasm, cache.as_deref()),
        PolicyCommand::Check { wasm, settings, timeout_ms, memory_mib } => check(&wasm, &settings, timeout_ms, memory_mib),
        PolicyCommand::Run { config, pod, ifname, container_id, labels, from_datastore } => {
            run_policies(&config, &pod, &ifname, &container_id, &labels, from_datastore)
        }
        PolicyCommand::Bench { wasm, settings, config, calls } => bench(&wasm, &settings, &config, calls),
    }
}

/// The compiler binary: beside this one, else on PATH.
fn compiler() -> PathBuf {
    let name = "thereabouts-policy-compiler";
    std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join(name))).filter(|p| p.is_file()).unwrap_or_else(|| PathBuf::from(name))
}

fn compile(wasm: &Path, cache: Option<&Path>) -> Result<u8> {
    let mut command = std::process::Command::new(compiler());
    command.arg("compile").arg(wasm).arg("--cache").arg(cache.map_or_else(artifact::cache_dir, Path::to_path_buf));
    let status = command.status().with_context(|| format!("running {} (install it beside thereabouts)", compiler().display()))?;
    Ok(if status.success() { 0 } else { 2 })
}

fn one_policy(wasm: &Path, settings: &str, timeout_ms: u32, memory_mib: u32) -> Result<PolicyConfig> {
    let settings: serde_json::Value = serde_json::from_str(settings).context("--settings is not JSON")?;
    Ok(PolicyConfig {
        name: wasm.file_stem().map_or_else(|| "policy".into(), |s| s.to_string_lossy().into_owned()),
        path: wasm.to_string_lossy().into_owned(),
        settings: settings.to_string(),
        timeout_ms,
        memory_mib,
        on_error: PolicyOnError::Deny,
        mode: PolicyMode::Enforce,
    })
}

fn check(wasm: &Path, settings: &str, timeout_ms: u32, memory_mib: u32) -> Result<u8> {
    let config = one_policy(wasm, settings, timeout_ms, memory_mib)?;
    let engine = PolicyEngine::new()?;
    let configs = [config];
    match Policies::load_asking(&engine, &configs) {
        Ok(p) => {
            let needs = p.needs();
            println!("{}: settings accepted; needs pod labels: {}, pod annotations: {}", wasm.display(), needs.labels, needs.annotations);
            Ok(0)
        }
        Err(PolicyStop::Load { source, .. }) => Err(source.into()),
        Err(stop) => {
            println!("{stop}");
            Ok(1)
        }
    }
}

pub fn labels_of(pairs: &[String]) -> Result<Vec<(String, String)>> {
    pairs.iter().map(|p| p.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).with_context(|| format!("--label {p}: not KEY=VALUE"))).collect()
}

fn run_policies(path: &Path, pod: &str, ifname: &str, container_id: &str, labels: &[String], from_datastore: bool) -> Result<u8> {
    let mut engine = EngineComponent::load()?;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (namespace, name) = pod.split_once('/').context("--pod is not NS/NAME")?;
    let args = format!("K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}");
    let (config, _) = crate::network_config::load(&mut engine, &text, &args).with_context(|| format!("in {}", path.display()))?;
    if config.policies.is_empty() {
        bail!("{} has no policies", path.display());
    }
    let labels = labels_of(labels)?;
    let policy_engine = PolicyEngine::new()?;
    // A policy's stop and a plan the engine refused are both this
    // attachment's verdict (exit 1); each keeps its own message.
    let verdict = (|| -> anyhow::Result<Vec<String>> {
        let policies = Policies::load(&policy_engine, &config.policies)?;
        let cni_args = [("K8S_POD_NAMESPACE".to_string(), namespace.to_string()), ("K8S_POD_NAME".to_string(), name.to_string())];
        let subject = Subject { pod_namespace: namespace, pod_name: name, container_id, ifname, cni_args: &cni_args, labels: &labels, annotations: &[] };
        let seen = redacted(&config);
        let selection = policies.select(&subject, &seen)?;
        let guide = Guide { policies: &policies, subject, seen, selection };
        crate::ipam::plan_once(&mut engine, &config, container_id, ifname, &guide, from_datastore)
    })();
    match verdict {
        Ok(addresses) => {
            println!("{pod} {ifname}: {}", addresses.join(", "));
            Ok(0)
        }
        Err(e) => {
            println!("{pod} {ifname}: no addresses: {}", crate::causes::describe(&e));
            Ok(1)
        }
    }
}

fn bench(wasm: &Path, settings: &str, config_path: &Path, calls: u32) -> Result<u8> {
    let mut engine = EngineComponent::load()?;
    let text = std::fs::read_to_string(config_path).with_context(|| format!("reading {}", config_path.display()))?;
    let (config, _) = crate::network_config::load(&mut engine, &text, "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-3")?;
    let policy = one_policy(wasm, settings, 1000, 16)?;
    let artifact = artifact::trusted_artifact(wasm, &artifact::cache_dir())?;
    let policy_engine = PolicyEngine::new()?;
    let started = Instant::now();
    let loaded = policy_engine.load(&artifact, policy.timeout_ms, policy.memory_mib)?;
    let load = started.elapsed();
    let seen = redacted(&config);
    // Each call its own attachment (container ID), so each gets a fresh
    // instance; the last line is an attachment as an ADD makes it.
    let settings = policy.settings.as_str();
    let candidates: Vec<String> = Vec::new();
    let report = |hook: &str, what: &str, mut call: Box<dyn FnMut(u32) -> bool + '_>| {
        let mut failed = 0;
        let mut times: Vec<Duration> = (0..calls)
            .map(|i| {
                let t = Instant::now();
                failed += u32::from(!call(i));
                t.elapsed()
            })
            .collect();
        times.sort();
        let at = |q: f64| times[((times.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1e6;
        // A failed call (timeout, trap, bad answer) is timed too, but its
        // figure is not the policy's normal cost: say how many there were.
        let failures = if failed == 0 { String::new() } else { format!(", {failed} failed") };
        println!("{hook:>18}: p50 {:>8.1} µs  p99 {:>8.1} µs  ({calls} {what}{failures})", at(0.5), at(0.99));
    };
    let fresh = "calls, each in a fresh instance";
    println!("{}: artifact {} loaded in {:.1} µs", wasm.display(), artifact.display(), load.as_secs_f64() * 1e6);
    report("validate-settings", fresh, Box::new(|_| hooks::validate_settings(&loaded, &policy.settings).is_ok()));
    report(
        "select-ranges",
        fresh,
        Box::new(|i| {
            let id = format!("bench-{i}");
            let subject = bench_subject(&id);
            hooks::select_ranges(&loaded, &Input { subject: &subject, config: &seen, needs: Needs::default(), settings }).is_ok()
        }),
    );
    report(
        "pick-address",
        fresh,
        Box::new(|i| {
            let id = format!("bench-{i}");
            let subject = bench_subject(&id);
            hooks::pick_address(&loaded, &Input { subject: &subject, config: &seen, needs: Needs::default(), settings }, 0, &candidates).is_ok()
        }),
    );
    report(
        "all three",
        "attachments: select-ranges and a pick-address per range, in one instance",
        Box::new(|i| {
            let id = format!("bench-all-{i}");
            let subject = bench_subject(&id);
            let input = Input { subject: &subject, config: &seen, needs: Needs::default(), settings };
            let ok = hooks::select_ranges(&loaded, &input).is_ok();
            (0..seen.ranges.len() as u32).fold(ok, |ok, r| hooks::pick_address(&loaded, &input, r, &candidates).is_ok() && ok)
        }),
    );
    Ok(0)
}

/// The attachment `policy bench` asks about, with its own container ID.
fn bench_subject(container_id: &str) -> Subject<'_> {
    Subject { pod_namespace: "default", pod_name: "web-3", container_id, ifname: "net1", cni_args: &[], labels: &[], annotations: &[] }
}
