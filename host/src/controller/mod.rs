//! `thereabouts controller`: the cluster-side loops, one process for the whole
//! cluster, kept out of the CNI binary's per-call path (the plugin never runs
//! any of this). It runs as a Deployment of two replicas; one works at a time,
//! chosen by leader election on the Lease `thereabouts-controller`
//! (kube-lease-manager). Today it lays out node slices (`slice_pass.rs`): a
//! pass on start, on every change of a Node, a NetworkAttachmentDefinition or
//! a NodeSlicePool, and every `--resync`.

mod layout;
mod slice_pass;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube_lease_manager::LeaseManagerBuilder;

use crate::datastore::kubernetes::kubeconfig;
pub use slice_pass::{NAD_RESOURCE, NODE_SLICE_POOL_RESOURCE};

/// What `thereabouts controller` is told on its command line.
#[derive(Debug, Clone)]
pub struct Options {
    /// A kubeconfig file; in-cluster configuration when none.
    pub kubeconfig: Option<PathBuf>,
    /// Where NodeSlicePools and IPPools live (the plugins' kubeconfig namespace).
    pub namespace: String,
    /// This replica's name in the Lease.
    pub identity: String,
    pub lease_seconds: u64,
    pub resync: Duration,
    /// How long a handed-back slice waits before another node may claim it:
    /// longer than any plugin call that read the old table can run (the
    /// plugin's ADD budget, 120 s, by default).
    pub cool_down: Duration,
    /// One pass, without leader election, then exit (for scripts and tests).
    pub once: bool,
}

/// `192.0.2.7/24` → `192.0.2.0/24`; `None` when not a CIDR.
pub fn canonical_cidr(text: &str) -> Option<String> {
    thereabouts_allocator::ip::parse_cidr(text, true).map(|c| c.network_text())
}

/// Runs until the process is killed (or one pass with `once`).
pub fn run(options: Options) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the tokio runtime")?;
    runtime.block_on(serve(options))
}

async fn client(options: &Options) -> Result<kube::Client> {
    let config = match &options.kubeconfig {
        Some(path) => {
            let (file, _) = kubeconfig::read(path).map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display()))?;
            kubeconfig::client_config(file).await.map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::incluster().context("reading the in-cluster configuration (set --kubeconfig outside a pod)")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

async fn serve(options: Options) -> Result<()> {
    let client = client(&options).await?;
    let mut pass = slice_pass::SlicePass::new(client.clone(), &options)?;
    if options.once {
        return pass.run().await;
    }
    let (trigger, mut triggered) = tokio::sync::mpsc::channel::<()>(1);
    spawn_watchers(&client, &options.namespace, trigger);
    let lease = LeaseManagerBuilder::new(client, "thereabouts-controller")
        .with_namespace(options.namespace.clone())
        .with_identity(options.identity.clone())
        .with_duration(options.lease_seconds)
        .with_grace(options.lease_seconds.div_ceil(3).max(1))
        .build()
        .await
        .context("setting up leader election")?;
    let (mut leading, _task) = lease.watch().await;
    loop {
        while !*leading.borrow_and_update() {
            leading.changed().await.context("leader election stopped")?;
        }
        crate::logging::verbose(format!("controller {}: leading", options.identity));
        while *leading.borrow() {
            if let Err(e) = pass.run().await {
                crate::logging::error(format!("controller: node-slice pass failed: {e:#}"));
            }
            tokio::select! {
                _ = triggered.recv() => tokio::time::sleep(Duration::from_millis(100)).await,
                _ = tokio::time::sleep(options.resync) => {}
                changed = leading.changed() => changed.context("leader election stopped")?,
            }
            // Several events in a row make one pass.
            while triggered.try_recv().is_ok() {}
        }
        crate::logging::verbose(format!("controller {}: no longer leading", options.identity));
    }
}

/// A watch event's handler: wake the loop (a pending wake-up is enough).
fn wake<T>(trigger: tokio::sync::mpsc::Sender<()>) -> impl FnMut(T) -> std::future::Ready<()> {
    move |_| {
        let _ = trigger.try_send(());
        std::future::ready(())
    }
}

/// Wakes the loop on every change of what the layout depends on.
fn spawn_watchers(client: &kube::Client, namespace: &str, trigger: tokio::sync::mpsc::Sender<()>) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let nads: Api<DynamicObject> = Api::all_with(client.clone(), &NAD_RESOURCE.api_resource());
    let slice_pools: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &NODE_SLICE_POOL_RESOURCE.api_resource());
    tokio::spawn(watcher(nodes, watcher::Config::default()).default_backoff().for_each(wake(trigger.clone())));
    tokio::spawn(watcher(nads, watcher::Config::default()).default_backoff().for_each(wake(trigger.clone())));
    tokio::spawn(watcher(slice_pools, watcher::Config::default()).default_backoff().for_each(wake(trigger)));
}
