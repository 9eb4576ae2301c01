//! The command line beside CNI mode (used when `CNI_COMMAND` is not set):
//! look at what a config would hand out, and at how full its pools are; run
//! the controller; and the reconciler's tools for a person at a terminal
//! (`reconcile`, `release`, `pools --check`, logic in `controller/tools.rs`),
//! which exit 0 when they find nothing, 1 when they find a problem and 2 when
//! they fail, so that scripts can tell the three apart.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use thereabouts_allocator::model::{NormalizedConfig, PreviewTable};

use crate::component::EngineComponent;
use crate::controller::tools;
use crate::json::pretty;
use crate::placement::{Claims, Placement};
use crate::policy::preview::{PodNames, PolicyView};
use crate::{datastore, ipam, network_config};

#[derive(Debug, Parser)]
#[command(
    name = "thereabouts",
    version,
    about = "A whereabouts-compatible IPAM plugin for CNI, with multi-range (dual-stack) allocation",
    long_about = "A whereabouts-compatible IPAM plugin for CNI, with multi-range (dual-stack) allocation.\n\n\
        CNI MODE: when CNI_COMMAND is set, the binary is a CNI IPAM plugin (ADD, DEL, CHECK, \
        VERSION, GC, STATUS; spec 0.1.0 to 1.1.0) reading the network config on stdin. Install it \
        as /opt/cni/bin/thereabouts, or as /opt/cni/bin/whereabouts to replace whereabouts; \
        \"ipam\": {\"type\": \"thereabouts\"} and {\"type\": \"whereabouts\"} both work.\n\n\
        Otherwise the commands below inspect a network config (a .conf or .conflist file), run \
        the cluster controller, or reconcile its shared datastore by hand.",
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: CliCommand,
}

#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// Show the addresses the next N pods would get, one per range (nothing is written)
    Preview {
        /// CNI network config (.conf) or config list (.conflist) with a thereabouts/whereabouts ipam section
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// How many pods to preview
        #[arg(long, value_name = "N", default_value_t = 1)]
        pods: u32,
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Start from the allocations in the configured datastore (read-only) instead of empty pools
        #[arg(long)]
        from_datastore: bool,
        /// Start from a cluster's state in FILE: the JSON of `kubectl get
        /// ippools,overlappingrangeipreservations,nodeslicepools,ipamclaims -o json`
        #[arg(long, value_name = "FILE", conflicts_with = "from_datastore")]
        from_objects: Option<PathBuf>,
        /// With `policies`: the pods' namespace (pod i is NAMESPACE/PREFIXi, from 0)
        #[arg(long, default_value = "default")]
        namespace: String,
        /// With `policies`: the pods' name prefix (`web-` for a StatefulSet `web`)
        #[arg(long, value_name = "PREFIX", default_value = "pod-")]
        pod_prefix: String,
        /// With `policies`: a label of every pod, KEY=VALUE (repeatable)
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
    },
    /// Show usage of every range's pool in the configured datastore (with
    /// --check: report what is inconsistent in it)
    #[command(long_about = "Show usage of every range's pool in the configured datastore.\n\n\
        With --check (a shared datastore: kubernetes or etcd): read every pool and reservation of the \
        datastore (the IPPools and OverlappingRangeIPReservations of its namespace, or every pool and \
        reservation key under its etcd prefix), not only this config's, and report what is inconsistent: pools or \
        keys that cannot be read, one address held by two attachments in overlapping pools of one \
        network, entries without a reservation (when the config has enable_overlapping_ranges), \
        reservations without an entry (an ADD in flight when young, a leak otherwise) and entries \
        without a podref (never freed by the controller). Nothing is written.\n\n\
        Exit status with --check: 0 nothing found, 1 something found, 2 the check failed.")]
    Pools {
        /// CNI network config (.conf) or config list (.conflist)
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Check the whole datastore for inconsistencies instead of showing usage
        #[arg(long)]
        check: bool,
    },
    /// Run one full reconcile pass now: list (--dry-run) or free the addresses
    /// of pods that are gone
    #[command(long_about = "Run one full reconcile pass of the controller now, on the shared datastore of a \
        network config (kubernetes): read every pool entry and reservation, then every pod and node, \
        and decide, as the controller does, which addresses to give back and why.\n\n\
        With --dry-run nothing is written: the addresses it would free are listed. Without it they are \
        freed, with the controller's guarded writes (an entry or reservation that changed since it was \
        read is left, and reported) but without its leader election: running it beside the controller \
        is safe, each leaves what the other freed. Entries without a podref are listed; they are never \
        freed.\n\n\
        Exit status: 0 nothing to free, 1 it would free (or freed) something, or something changed \
        meanwhile, 2 the pass failed (the apiserver unreachable, a permission missing...).")]
    Reconcile {
        /// CNI network config (.conf) or config list (.conflist) naming the datastore
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// List what it would free, write nothing
        #[arg(long)]
        dry_run: bool,
        /// kubeconfig of an identity that may list pods and nodes (and record
        /// Events); default: the datastore's kubeconfig
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
        /// Seconds a completed (Succeeded or Failed) pod keeps its addresses
        #[arg(long, default_value_t = 60)]
        completed_grace_seconds: u64,
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Free a pod's or an address's pool entries and reservations by hand
    #[command(
        long_about = "Free by hand the pool entries of a pod (--pod) or of an address (--address), and their \
        reservations (for --pod, every reservation of the pod), with the controller's guarded writes: an \
        entry or reservation that changed since it was read is left, and reported. Whether the pod still \
        exists is not asked: you decided. An address held by two attachments needs --pool.\n\n\
        Exit status: 0 something was freed, 1 nothing matched or something changed meanwhile, 2 an error.",
        group(clap::ArgGroup::new("target").required(true).args(["pod", "address"]))
    )]
    Release {
        /// CNI network config (.conf) or config list (.conflist) naming the datastore
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Every entry of this pod
        #[arg(long, value_name = "NS/NAME", value_parser = tools::parse_podref)]
        pod: Option<String>,
        /// The entries holding this address
        #[arg(long, value_name = "IP")]
        address: Option<IpAddr>,
        /// Only in this IPPool (with --address)
        #[arg(long, value_name = "NAME", requires = "address")]
        pool: Option<String>,
        /// kubeconfig of the identity that records an Event on the pod for
        /// each freed address; default: the datastore's kubeconfig
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Run the cluster controller (leader-elected): gives back the addresses of
    /// pods that are gone, and lays out node slices (NodeSlicePools) for every
    /// NetworkAttachmentDefinition with node_slice_size
    Controller {
        /// kubeconfig file (default: the in-cluster configuration)
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
        /// Namespace of the NodeSlicePools and IPPools (the plugins' kubeconfig namespace)
        #[arg(long, env = "THEREABOUTS_NAMESPACE", default_value = "kube-system")]
        namespace: String,
        /// This replica's name in the Lease (default: POD_NAME, else the host name)
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// Leader-election Lease duration, in seconds
        #[arg(long, default_value_t = 15)]
        lease_seconds: u64,
        /// Seconds between full passes, besides the passes on changes
        #[arg(long, default_value_t = 30)]
        resync_seconds: u64,
        /// Seconds a handed-back slice waits before another node may take it;
        /// must exceed the plugin's longest call (its ADD budget, 120 s)
        #[arg(long, default_value_t = 150)]
        cool_down_seconds: u64,
        /// Keep each held slice of a layout of at most 4 096 slices in an
        /// object of its own, besides whereabouts' list (larger layouts always
        /// do); without it such layouts move back to the list alone
        #[arg(long)]
        slice_objects: bool,
        /// Seconds between full reconcile passes (a pod's delete frees its
        /// addresses at once; full passes catch what no event told)
        #[arg(long, default_value_t = 300)]
        reconcile_interval_seconds: u64,
        /// Seconds a completed (Succeeded or Failed) pod keeps its addresses
        #[arg(long, default_value_t = 60)]
        completed_grace_seconds: u64,
        /// Seconds a reservation is seen without its pool entry before it is
        /// freed: whoever removed the entry (a DEL, whereabouts' control loop,
        /// whose delete has no precondition) deletes it meanwhile; longer than
        /// whereabouts' DEL timeout (60 s)
        #[arg(long, default_value_t = 90)]
        unbacked_grace_seconds: u64,
        /// Seconds a DRA ResourceClaim is seen without `status.reservedFor`
        /// (no pod uses it) before its devices' addresses are freed, when
        /// DRANET's release never came
        #[arg(long, default_value_t = 120)]
        unreserved_grace_seconds: u64,
        /// A network config (or flat file) whose etcd datastore the reconciler
        /// serves too, besides the namespace's IPPools (repeatable)
        #[arg(long = "etcd-config", value_name = "FILE")]
        etcd_configs: Vec<PathBuf>,
        /// Where /metrics, /healthz and /readyz are served ("" for nowhere)
        #[arg(long, default_value = crate::controller::http::DEFAULT_ADDRESS)]
        metrics_address: String,
        /// One pass of each loop without leader election, then exit
        #[arg(long)]
        once: bool,
        /// error, verbose or debug (to stderr)
        #[arg(long, default_value = "verbose")]
        log_level: String,
    },
    /// Serve DRANET's profile-provider webhook: addresses for DRA network
    /// devices, owned by their ResourceClaim
    #[command(long_about = "Serve DRANET's profile-provider webhook (kubernetes-sigs/dranet, \
        --profile-provider=webhook --webhook-url=unix:///run/thereabouts/profile.sock): GET /health, \
        POST /GetProfileConfig and POST /ReleaseProfileConfig.\n\n\
        A DRA config's `profile` names a network config of --profiles (a .conf or .json file, by its \
        `name`); its ranges and datastore serve the device. Each device's addresses are owned by its \
        ResourceClaim (by UID) and kept until ReleaseProfileConfig, or until the controller finds the \
        claim gone or unreserved past its grace. A repeated GetProfileConfig answers the same addresses.\n\n\
        Statuses: 400 a request or profile that cannot be served, 404 an unknown profile, 500 what may \
        heal (a full range, an unreachable datastore), which the kubelet tries again.")]
    ProfileProvider {
        /// unix:///path (DRANET's --webhook-url), or tcp://host:port
        #[arg(long, default_value = "unix:///run/thereabouts/profile.sock")]
        listen: crate::profile_provider::serve::Listen,
        /// Directory of profiles: network configs keyed by their `name`
        #[arg(long, value_name = "DIR", default_value = crate::profile_provider::DEFAULT_PROFILES_DIR)]
        profiles: PathBuf,
        /// error, verbose or debug (to stderr)
        #[arg(long, default_value = "verbose")]
        log_level: String,
    },
    /// Policy extensions: compile one for the plugin, check its settings, run
    /// a config's policies offline, measure their cost
    Policy {
        #[command(subcommand)]
        command: crate::policy::tools::PolicyCommand,
    },
    /// Write the embedded engine WebAssembly component (what the playground runs)
    EngineComponent {
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        CliCommand::Preview { config, pods, output, from_datastore, from_objects, namespace, pod_prefix, labels } => {
            let labels = crate::policy::tools::labels_of(&labels)?;
            let start = match from_objects {
                Some(file) => Start::Objects(file),
                None if from_datastore => Start::Datastore,
                None => Start::Empty,
            };
            preview(&config, pods, output, start, &PodNames { namespace: &namespace, prefix: &pod_prefix, labels: &labels })
        }
        CliCommand::Pools { config, output, check: false } => pools(&config, output),
        CliCommand::Pools { config, output, check: true } => finish(check(&config, output)),
        CliCommand::Reconcile { config, dry_run, kubeconfig, completed_grace_seconds, output } => {
            let grace = std::time::Duration::from_secs(completed_grace_seconds);
            finish(reconcile(&config, dry_run, kubeconfig.as_deref(), grace, output))
        }
        CliCommand::Release { config, pod, address, pool, kubeconfig, output } => {
            let target = match (pod, address) {
                (Some(podref), _) => tools::Target::Pod(podref),
                (None, Some(address)) => tools::Target::Address { address, pool },
                (None, None) => anyhow::bail!("name what to release: --pod or --address"),
            };
            finish(release(&config, &target, kubeconfig.as_deref(), output))
        }
        CliCommand::ProfileProvider { listen, profiles, log_level } => {
            crate::logging::configure(Some(&log_level), None);
            let provider = crate::profile_provider::Provider::load(&profiles)?;
            crate::logging::verbose(format!("profile-provider: profiles {}", provider.profile_names().join(", ")));
            crate::profile_provider::serve::run(provider, &listen)
        }
        CliCommand::Controller {
            kubeconfig,
            namespace,
            identity,
            lease_seconds,
            resync_seconds,
            cool_down_seconds,
            slice_objects,
            reconcile_interval_seconds,
            completed_grace_seconds,
            unbacked_grace_seconds,
            unreserved_grace_seconds,
            etcd_configs,
            metrics_address,
            once,
            log_level,
        } => {
            crate::logging::configure(Some(&log_level), None);
            let identity = identity.unwrap_or_else(|| crate::node_name::discover(None).unwrap_or_else(|_| "thereabouts-controller".into()));
            crate::controller::run(crate::controller::Options {
                kubeconfig,
                namespace,
                identity: format!("{identity}-{}", std::process::id()),
                lease_seconds,
                resync: std::time::Duration::from_secs(resync_seconds),
                cool_down: std::time::Duration::from_secs(cool_down_seconds),
                slice_objects,
                reconcile_interval: std::time::Duration::from_secs(reconcile_interval_seconds),
                completed_grace: std::time::Duration::from_secs(completed_grace_seconds),
                unbacked_grace: std::time::Duration::from_secs(unbacked_grace_seconds),
                unreserved_grace: std::time::Duration::from_secs(unreserved_grace_seconds),
                etcd_configs,
                metrics_address,
                once,
            })
        }
        CliCommand::Policy { command } => finish(crate::policy::tools::run(command)),
        CliCommand::EngineComponent { out } => std::fs::write(&out, crate::component::COMPONENT_WASM).with_context(|| format!("writing {}", out.display())),
    }
}

fn load_config(engine: &mut EngineComponent, path: &Path) -> Result<NormalizedConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (config, _) = network_config::load(engine, &text, "").with_context(|| format!("in {}", path.display()))?;
    Ok(config)
}

/// `preview --output json`: a stable, simple shape the playground compares against.
#[derive(Debug, Serialize)]
pub struct PreviewReport {
    pub ranges: Vec<PreviewRange>,
    pub pods: Vec<PreviewPod>,
}

#[derive(Debug, Serialize)]
pub struct PreviewRange {
    pub cidr: String,
    pub first: String,
    pub last: String,
    /// Decimal string: IPv6 counts exceed what JSON numbers carry exactly.
    pub usable: String,
    pub pool_name: String,
    pub gateway: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PreviewPod {
    /// 1-based.
    pub pod: u32,
    /// One per range, in range order: `ip/prefix`, or `null` for every range of a pod whose ADD would fail
    /// (with `first_available`, also for the ranges a served pod gets nothing from).
    pub addresses: Vec<Option<String>>,
    /// With policies: the pod's name, what they refused, why it failed.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyView>,
}

/// `pods` rows from the engine's table: the served pods' addresses, then `null`s.
pub fn preview_report(config: &NormalizedConfig, table: &PreviewTable, pods: u32) -> PreviewReport {
    let mut served = table.addresses.split('\n').take(table.served as usize);
    PreviewReport {
        ranges: config
            .ranges
            .iter()
            .map(|r| PreviewRange {
                cidr: r.cidr.clone(),
                first: r.first.clone(),
                last: r.last.clone(),
                usable: r.usable.to_string(),
                pool_name: r.pool_name.clone(),
                gateway: r.gateway.clone(),
            })
            .collect(),
        pods: (1..=pods)
            .map(|pod| {
                let addresses = match served.next() {
                    // `-`: a range the pod gets nothing from (`first_available`).
                    Some(line) if !config.ranges.is_empty() => line.split(' ').map(|a| (a != "-").then(|| a.to_string())).collect(),
                    Some(_) => Vec::new(),
                    None => vec![None; config.ranges.len()],
                };
                PreviewPod { pod, addresses, policy: None }
            })
            .collect(),
    }
}

/// The report of a preview with policies: one row per pod, planned in turn.
fn policy_preview_report(config: &NormalizedConfig, rows: Vec<crate::policy::preview::PreviewedPod>) -> PreviewReport {
    let mut report = preview_report(config, &PreviewTable::default(), 0);
    report.pods = rows.into_iter().zip(1..).map(|((addresses, view), pod)| PreviewPod { pod, addresses, policy: Some(view) }).collect();
    report
}

/// The pools a preview starts from.
enum Start {
    Empty,
    /// The configured datastore, read once.
    Datastore,
    /// A cluster's objects in a file (`kubectl get ... -o json`).
    Objects(PathBuf),
}

fn preview(path: &Path, pods: u32, output: Output, start: Start, names: &PodNames) -> Result<()> {
    let mut engine = EngineComponent::load()?;
    let config = load_config(&mut engine, path)?;
    let pools = match start {
        Start::Empty => Vec::new(),
        Start::Datastore => {
            let store = datastore::open(&config.datastore, &config.name)?;
            ipam::pool_states(store.as_ref(), &config, command_deadline())?
        }
        Start::Objects(file) => pools_of_objects(&mut engine, &config, &file, output)?,
    };
    let report = if config.policies.is_empty() {
        let previewed = engine.preview(&config, &pools, pods)?;
        preview_report(&config, &previewed, pods)
    } else {
        policy_preview_report(&config, crate::policy::preview::preview(&mut engine, &config, pools, pods, names)?)
    };
    match output {
        Output::Json => print!("{}", pretty(&report)),
        Output::Table => {
            let mut rows = vec![vec!["RANGE".to_string(), "FIRST".into(), "LAST".into(), "USABLE".into(), "GATEWAY".into(), "POOL".into()]];
            rows.extend(report.ranges.iter().map(|r| {
                vec![r.cidr.clone(), r.first.clone(), r.last.clone(), r.usable.clone(), r.gateway.clone().unwrap_or_else(|| "-".into()), r.pool_name.clone()]
            }));
            println!("{}", table(&rows));
            let with_policies = report.pods.iter().any(|p| p.policy.is_some());
            let mut head: Vec<String> = std::iter::once("POD".to_string()).chain(report.ranges.iter().map(|r| r.cidr.clone())).collect();
            if with_policies {
                head.push("POLICIES".into());
            }
            let mut rows = vec![head];
            rows.extend(report.pods.iter().map(|p| {
                // A served pod's empty cells are ranges it does not use (`first_available`).
                let none = match &p.policy {
                    _ if p.addresses.iter().any(Option::is_some) => "-",
                    Some(view) if view.failure.is_some() => "failed",
                    _ => "exhausted",
                };
                let pod = p.policy.as_ref().map_or_else(|| p.pod.to_string(), |v| v.name.clone());
                let mut row: Vec<String> = std::iter::once(pod).chain(p.addresses.iter().map(|a| a.clone().unwrap_or_else(|| none.into()))).collect();
                if let Some(view) = &p.policy {
                    row.push(policy_note(view));
                }
                row
            }));
            print!("{}", table(&rows));
        }
    }
    Ok(())
}

/// The config's pools in a cluster's objects, read by the engine as the
/// playground reads a pasted dump. What it left out goes to stderr (with
/// `--output table`), so that a dump of another network is noticed.
fn pools_of_objects(engine: &mut EngineComponent, config: &NormalizedConfig, file: &Path, output: Output) -> Result<Vec<thereabouts_allocator::PoolState>> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let state = engine.cluster_pools(config, &text)?.with_context(|| format!("in {} (the JSON of `kubectl get ... -o json`)", file.display()))?;
    if output == Output::Table {
        let claims = state.entries.iter().filter(|e| e.allocation.claim.is_some()).count();
        eprintln!(
            "{}: {} entries ({claims} owned by a claim), {} other reservations, {} IPAMClaims; {} objects ignored",
            file.display(),
            state.entries.len(),
            state.reserved.len(),
            state.ipam_claims.len(),
            state.ignored.len()
        );
        for ignored in &state.ignored {
            eprintln!("  ignored {} {}: {}", ignored.kind, ignored.name, ignored.reason);
        }
    }
    Ok(state.pools)
}

/// A pod's failure, else what the policies refused (`-`: nothing).
fn policy_note(view: &PolicyView) -> String {
    if let Some(failure) = &view.failure {
        return failure.clone();
    }
    let refused: Vec<String> = view.refused.iter().map(|r| format!("{} refused {}: {}", r.policy, r.address, r.reason)).collect();
    if refused.is_empty() { "-".into() } else { refused.join("; ") }
}

/// `pools --output json`.
#[derive(Debug, Serialize)]
pub struct PoolsReport {
    pub datastore: String,
    pub ranges: Vec<PoolUsage>,
}

#[derive(Debug, Serialize)]
pub struct PoolUsage {
    pub cidr: String,
    pub pool_name: String,
    pub first: String,
    pub last: String,
    /// Counts as decimal strings (IPv6 ranges exceed JSON's exact integers).
    pub usable: String,
    pub allocated: String,
    pub free: String,
    /// All entries of the pool, including those outside this range's span.
    pub pool_entries: usize,
}

/// The time a CLI command gives the datastore: a DEL's budget.
fn command_deadline() -> std::time::Instant {
    std::time::Instant::now() + datastore::retry::budget(datastore::retry::OTHER_BUDGET)
}

fn pools(path: &Path, output: Output) -> Result<()> {
    let mut engine = EngineComponent::load()?;
    let config = load_config(&mut engine, path)?;
    let store = datastore::open(&config.datastore, &config.name)?;
    let deadline = command_deadline();
    // With node slices: this node's slices (NODENAME), each a row.
    let placement = Placement::resolve(&mut engine, store.as_ref(), &config, Claims::None, deadline)?;
    let usage = ipam::usage(&mut engine, store.as_ref(), &placement.expanded(&config), deadline)?;
    let report = PoolsReport {
        datastore: store.describe(),
        ranges: usage
            .into_iter()
            .map(|u| PoolUsage {
                cidr: u.cidr,
                pool_name: u.pool_name,
                first: u.first,
                last: u.last,
                usable: u.usable.to_string(),
                allocated: u.allocated.to_string(),
                free: u.free.to_string(),
                pool_entries: u.pool_entries,
            })
            .collect(),
    };
    match output {
        Output::Json => print!("{}", pretty(&report)),
        Output::Table => {
            println!("{}", report.datastore);
            let mut rows = vec![vec!["RANGE".to_string(), "POOL".into(), "USABLE".into(), "ALLOCATED".into(), "FREE".into()]];
            rows.extend(report.ranges.iter().map(|r| vec![r.cidr.clone(), r.pool_name.clone(), r.usable.clone(), r.allocated.clone(), r.free.clone()]));
            print!("{}", table(&rows));
        }
    }
    Ok(())
}

/// Ends a tool with its exit status: 0 (nothing found) returns, 1 (a
/// problem found) and 2 (the tool failed) exit here, as `main` knows only 0 and 1.
fn finish(outcome: Result<u8>) -> Result<()> {
    let code = match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", crate::causes::describe(&e));
            2
        }
    };
    if code == 0 {
        return Ok(());
    }
    let _ = std::io::stdout().flush();
    std::process::exit(code.into())
}

/// The config's datastore settings and overlap switch, read the way `pools` reads them.
fn tool_config(path: &Path) -> Result<NormalizedConfig> {
    let mut engine = EngineComponent::load()?;
    load_config(&mut engine, path)
}

fn reconcile(path: &Path, dry: bool, kubeconfig: Option<&Path>, grace: std::time::Duration, output: Output) -> Result<u8> {
    let config = tool_config(path)?;
    let identity = "cli-reconcile";
    let report = tools::block_on(async {
        let (store, pods) = tools::open(&config, kubeconfig, identity).await?;
        tools::reconcile(store, pods, dry, grace, identity).await
    })?;
    match output {
        Output::Json => print!("{}", pretty(&report)),
        Output::Table => print_reconcile(&report),
    }
    Ok(report.exit_code())
}

fn entry_rows(header: &str, entries: &[tools::EntryRow], outcome: impl Fn(usize) -> String) -> Vec<Vec<String>> {
    let mut rows = vec![vec!["ADDRESS".to_string(), "POOL".into(), "PODREF".into(), "IFNAME".into(), header.into()]];
    rows.extend(entries.iter().enumerate().map(|(i, e)| vec![e.address.clone(), e.pool.clone(), e.podref.clone(), e.ifname.clone(), outcome(i)]));
    rows
}

fn reservation_rows(header: &str, reservations: &[(String, String, String)]) -> Vec<Vec<String>> {
    let mut rows = vec![vec!["RESERVATION".to_string(), "PODREF".into(), header.into()]];
    rows.extend(reservations.iter().map(|(name, podref, outcome)| vec![name.clone(), podref.clone(), outcome.clone()]));
    rows
}

fn print_reconcile(report: &tools::ReconcileReport) {
    let verb = if report.dry_run { "would free" } else { "freed" };
    println!("{}; {} pods read", report.datastore, report.pods_read);
    let entries = &report.entries;
    println!("{verb} {} entries, {} reservations", entries.len(), report.reservations.len());
    if !entries.is_empty() {
        print!("{}", table(&entry_rows("WHY", entries, |i| format!("{} ({})", entries[i].why, entries[i].reason))));
    }
    if !report.reservations.is_empty() {
        let rows: Vec<_> = report.reservations.iter().map(|r| (r.name.clone(), r.podref.clone(), format!("{} ({})", r.why, r.reason))).collect();
        print!("{}", table(&reservation_rows("WHY", &rows)));
    }
    if report.changed_meanwhile > 0 {
        println!("{} changed between the read and the write: left for the next pass", report.changed_meanwhile);
    }
    if !report.without_podref.is_empty() {
        println!("{} entries without a podref, never freed:", report.without_podref.len());
        let rows = entry_rows("CONTAINER", &report.without_podref, |i| report.without_podref[i].container_id.clone());
        print!("{}", table(&rows));
    }
}

fn release(path: &Path, target: &tools::Target, kubeconfig: Option<&Path>, output: Output) -> Result<u8> {
    let config = tool_config(path)?;
    let identity = "cli-release";
    let report = tools::block_on(async {
        let (store, events) = tools::open(&config, kubeconfig, identity).await?;
        tools::release(&store, events, target, identity).await
    })?;
    match output {
        Output::Json => print!("{}", pretty(&report)),
        Output::Table => {
            println!("{}", report.datastore);
            if report.entries.is_empty() && report.reservations.is_empty() {
                println!("nothing matched");
            }
            if !report.entries.is_empty() {
                let entries: Vec<_> = report.entries.iter().map(|e| e.what.clone()).collect();
                print!("{}", table(&entry_rows("OUTCOME", &entries, |i| report.entries[i].outcome.label().into())));
            }
            if !report.reservations.is_empty() {
                let rows: Vec<_> = report.reservations.iter().map(|r| (r.what.name.clone(), r.what.podref.clone(), r.outcome.label().into())).collect();
                print!("{}", table(&reservation_rows("OUTCOME", &rows)));
            }
        }
    }
    Ok(report.exit_code())
}

fn check(path: &Path, output: Output) -> Result<u8> {
    let config = tool_config(path)?;
    let report = tools::block_on(async {
        let (store, _) = tools::open_store(&config, "cli-check").await?;
        tools::check_store(&store, config.enable_overlapping_ranges).await
    })?;
    match output {
        Output::Json => print!("{}", pretty(&report)),
        Output::Table => {
            println!("{}; {} pools, {} entries, {} reservations", report.datastore, report.pools, report.entries, report.reservations);
            if report.findings.is_empty() {
                println!("no problems found");
            } else {
                let mut rows = vec![vec!["PROBLEM".to_string(), "ADDRESS".into(), "WHERE".into(), "PODREF".into(), "DETAIL".into()]];
                rows.extend(report.findings.iter().map(|f| {
                    let dash = |s: &str| if s.is_empty() { "-".to_string() } else { s.to_string() };
                    vec![f.problem.label().into(), f.address.clone().unwrap_or_else(|| "-".into()), dash(&f.place), dash(&f.podref), f.detail.clone()]
                }));
                print!("{}", table(&rows));
            }
        }
    }
    Ok(report.exit_code())
}

/// Left-aligned columns separated by two spaces.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().enumerate().map(|(c, s)| format!("{s:<width$}", width = widths[c])).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn preview_reports_the_served_pods_then_nulls() {
        let config = thereabouts_allocator::normalize(
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","ipRanges":[{"range":"192.0.2.0/30"},{"range":"2001:db8::/64"}]}}"#,
            None,
            "",
        )
        .unwrap();
        let report = preview_report(&config, &thereabouts_allocator::preview(&config, &[], 3), 3);
        let pods: Vec<_> = report.pods.iter().map(|p| (p.pod, p.addresses.clone())).collect();
        let some = |a: &str, b: &str| vec![Some(a.to_string()), Some(b.to_string())];
        assert_eq!(pods, [(1, some("192.0.2.1/30", "2001:db8::1/64")), (2, some("192.0.2.2/30", "2001:db8::2/64")), (3, vec![None, None])]);
    }

    #[test]
    fn preview_with_first_available_reports_one_address_per_pod() {
        let config = thereabouts_allocator::normalize(
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","ipRangesAllocation":"first_available","ipRanges":[{"range":"192.0.2.0/30"},{"range":"2001:db8::/64"}]}}"#,
            None,
            "",
        )
        .unwrap();
        let report = preview_report(&config, &thereabouts_allocator::preview(&config, &[], 3), 3);
        let pods: Vec<_> = report.pods.iter().map(|p| p.addresses.clone()).collect();
        let v4 = |a: &str| vec![Some(a.to_string()), None];
        assert_eq!(pods, [v4("192.0.2.1/30"), v4("192.0.2.2/30"), vec![None, Some("2001:db8::1/64".to_string())]]);
    }

    #[test]
    fn tables_align_columns() {
        let t = table(&[vec!["A".into(), "BB".into()], vec!["CCC".into(), "D".into()]]);
        assert_eq!(t, "A    BB\nCCC  D\n");
    }
}
