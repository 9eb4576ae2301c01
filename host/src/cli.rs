//! The command line beside CNI mode (used when `CNI_COMMAND` is not set):
//! look at what a config would hand out, and at how full its pools are.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use thereabouts_allocator::model::{NormalizedConfig, PreviewTable};

use crate::component::EngineComponent;
use crate::json::pretty;
use crate::placement::{Claims, Placement};
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
        Otherwise the commands below inspect a network config (a .conf or .conflist file).",
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
    },
    /// Show usage of every range's pool in the configured datastore
    Pools {
        /// CNI network config (.conf) or config list (.conflist)
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
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
        /// Seconds between full reconcile passes (a pod's delete frees its
        /// addresses at once; full passes catch what no event told)
        #[arg(long, default_value_t = 300)]
        reconcile_interval_seconds: u64,
        /// Seconds a completed (Succeeded or Failed) pod keeps its addresses
        #[arg(long, default_value_t = 60)]
        completed_grace_seconds: u64,
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
        CliCommand::Preview { config, pods, output, from_datastore } => preview(&config, pods, output, from_datastore),
        CliCommand::Pools { config, output } => pools(&config, output),
        CliCommand::Controller {
            kubeconfig,
            namespace,
            identity,
            lease_seconds,
            resync_seconds,
            cool_down_seconds,
            reconcile_interval_seconds,
            completed_grace_seconds,
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
                reconcile_interval: std::time::Duration::from_secs(reconcile_interval_seconds),
                completed_grace: std::time::Duration::from_secs(completed_grace_seconds),
                metrics_address,
                once,
            })
        }
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
    /// One per range, in range order: `ip/prefix`, or `null` for every range of a pod whose ADD would fail.
    pub addresses: Vec<Option<String>>,
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
                    Some(line) if !config.ranges.is_empty() => line.split(' ').map(|a| Some(a.to_string())).collect(),
                    Some(_) => Vec::new(),
                    None => vec![None; config.ranges.len()],
                };
                PreviewPod { pod, addresses }
            })
            .collect(),
    }
}

fn preview(path: &Path, pods: u32, output: Output, from_datastore: bool) -> Result<()> {
    let mut engine = EngineComponent::load()?;
    let config = load_config(&mut engine, path)?;
    let pools = if from_datastore {
        let store = datastore::open(&config.datastore, &config.name)?;
        ipam::pool_states(store.as_ref(), &config, command_deadline())?
    } else {
        Vec::new()
    };
    let previewed = engine.preview(&config, &pools, pods)?;
    let report = preview_report(&config, &previewed, pods);
    match output {
        Output::Json => print!("{}", pretty(&report)),
        Output::Table => {
            let mut rows = vec![vec!["RANGE".to_string(), "FIRST".into(), "LAST".into(), "USABLE".into(), "GATEWAY".into(), "POOL".into()]];
            rows.extend(report.ranges.iter().map(|r| {
                vec![r.cidr.clone(), r.first.clone(), r.last.clone(), r.usable.clone(), r.gateway.clone().unwrap_or_else(|| "-".into()), r.pool_name.clone()]
            }));
            println!("{}", table(&rows));
            let mut rows = vec![std::iter::once("POD".to_string()).chain(report.ranges.iter().map(|r| r.cidr.clone())).collect::<Vec<_>>()];
            rows.extend(
                report
                    .pods
                    .iter()
                    .map(|p| std::iter::once(p.pod.to_string()).chain(p.addresses.iter().map(|a| a.clone().unwrap_or_else(|| "exhausted".into()))).collect()),
            );
            print!("{}", table(&rows));
        }
    }
    Ok(())
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
    fn tables_align_columns() {
        let t = table(&[vec!["A".into(), "BB".into()], vec!["CCC".into(), "D".into()]]);
        assert_eq!(t, "A    BB\nCCC  D\n");
    }
}
