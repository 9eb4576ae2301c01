//! `thereabouts controller`: the cluster-side loops, one process for the whole
//! cluster, kept out of the CNI binary's per-call path (the plugin never runs
//! any of this). It runs as a Deployment of two replicas; one works at a time,
//! chosen by leader election on the Lease `thereabouts-controller`
//! (kube-lease-manager). While it leads, two loops run side by side in one task:
//! - the periodic passes: node slices (`slice_pass.rs`) on start, on every
//!   change of a Node, a NetworkAttachmentDefinition or a NodeSlicePool, and
//!   every `--resync`; and the reconciler's full pass (`reconcile.rs`), which
//!   gives back the addresses of pods that are gone, on start, after a pod
//!   watch re-list, and every `--reconcile-interval`;
//! - the pod-delete passes, over the entries of the pods a delete event
//!   names, which never wait for a periodic pass in progress; a watch of
//!   IPPools tells them which pools hold a pod's entries (`pool_index.rs`).
//!
//! `/metrics`, `/healthz` and `/readyz` are served on `--metrics-address`.

mod api;
mod etcd_store;
mod events;
pub mod held;
pub mod http;
mod kube_store;
mod layout;
pub mod lease_guard;
pub mod metrics;
mod pod_source;
mod pods;
mod pool_index;
pub mod reconcile;
#[cfg(test)]
mod reconcile_tests;
mod resource_claims;
mod slice_objects;
mod slice_pass;
pub mod store;
pub mod tools;
pub mod verdict;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use kube::api::{Api as KubeApi, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::datastore::kubernetes::kubeconfig;
pub use slice_pass::{IPAM_CLAIM_RESOURCE, NAD_RESOURCE, NODE_SLICE_POOL_RESOURCE};

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
    /// Layouts of at most 4 096 slices keep slice objects too (`--slice-objects`).
    pub slice_objects: bool,
    /// Time between full reconcile passes.
    pub reconcile_interval: Duration,
    /// How long a completed pod keeps its addresses.
    pub completed_grace: Duration,
    /// How long a reservation is seen without its entry before it is freed.
    pub unbacked_grace: Duration,
    /// How long a ResourceClaim is seen without `status.reservedFor` before
    /// its devices' addresses are freed.
    pub unreserved_grace: Duration,
    /// Network configs (or flat files) of etcd datastores to reconcile too.
    pub etcd_configs: Vec<PathBuf>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served; none when empty.
    pub metrics_address: String,
    /// One pass of each loop, without leader election, then exit (for scripts and tests).
    pub once: bool,
}

/// How long a reservation without its pool entry may be an ADD in flight:
/// the plugin's ADD budget (120 s) and a margin.
pub const ADD_BUDGET: Duration = Duration::from_secs(150);

/// How long a pod delete waits for more deletes: a pool rewrite costs the
/// apiserver ~0.1 s for 1 000 entries, so one rewrite for many deletes is
/// worth a short wait.
const DELETE_BATCH: Duration = Duration::from_millis(200);
const DELETE_BATCH_MAX: Duration = Duration::from_secs(1);

/// When a failed pass is tried again (as a full pass: a delete whose pass
/// failed is otherwise seen by no one until the next interval).
const RETRY_FAILED_PASS: Duration = Duration::from_secs(5);
/// How long after a reservation's unbacked grace ends the pass that frees it runs.
const RECHECK_MARGIN: Duration = Duration::from_millis(200);

/// `192.0.2.7/24` → `192.0.2.0/24`; `None` when not a CIDR.
pub fn canonical_cidr(text: &str) -> Option<String> {
    thereabouts_allocator::ip::parse_cidr(text, true).map(|c| c.network_text())
}

/// Runs until the process is killed (or one pass with `once`).
pub fn run(options: Options) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the tokio runtime")?;
    runtime.block_on(serve(options))
}

/// A client from `--kubeconfig` or the in-cluster configuration. Its
/// requests carry `thereabouts-controller/<identity>` as user agent, so the
/// apiserver's audit log tells the replicas apart.
pub async fn client(kubeconfig_path: Option<&std::path::Path>, identity: &str) -> Result<kube::Client> {
    let mut config = match kubeconfig_path {
        Some(path) => {
            let (file, _) = kubeconfig::read(path).map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display()))?;
            kubeconfig::client_config(file).await.map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::incluster().context("reading the in-cluster configuration (set --kubeconfig outside a pod)")?,
    };
    let agent = ::http::HeaderValue::from_str(&format!("thereabouts-controller/{identity}")).context("the identity is no header value")?;
    config.headers.push((::http::header::USER_AGENT, agent));
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// The Kubernetes datastore of `namespace`, read and written with `client`.
pub fn kube_store(client: kube::Client, metrics: &metrics::Metrics, namespace: &str) -> store::Store {
    store::Store::Kube(kube_store::KubeStore::new(api::Api { client, metrics: metrics.clone() }, namespace.to_string()))
}

/// A reconciler of `store`, reading pods with `client`.
pub fn reconciler(
    client: kube::Client,
    metrics: metrics::Metrics,
    store: store::Store,
    identity: &str,
    guard: lease_guard::WriteGuard,
    completed_grace: Duration,
    unbacked_grace: Duration,
) -> reconcile::Reconciler {
    reconcile::Reconciler {
        api: api::Api { client, metrics: metrics.clone() },
        store,
        metrics,
        guard,
        completed_grace,
        add_budget: ADD_BUDGET,
        unbacked_grace,
        unbacked: reconcile::Unbacked::default(),
        unreserved: resource_claims::Unreserved::default(),
        identity: identity.to_string(),
    }
}

/// What the pod and claim watches tell the loop.
enum PodEvent {
    Deleted(String),
    /// The watch listed every pod again: deletes in between were not seen.
    Relisted,
    /// An IPAMClaim was deleted: a full pass frees what it owned (claims are
    /// few; the pool index is by pod).
    ClaimDeleted,
}

async fn serve(options: Options) -> Result<()> {
    let client = client(options.kubeconfig.as_deref(), &options.identity).await?;
    let metrics = metrics::Metrics::new();
    let health = http::Health::new();
    if !options.metrics_address.is_empty() {
        let listener = http::bind(&options.metrics_address).await.with_context(|| format!("listening on {}", options.metrics_address))?;
        tokio::spawn(http::serve(listener, metrics.clone(), health.clone()));
    }
    let mut engine = crate::component::EngineComponent::load()?;
    let guard = match options.once {
        true => lease_guard::WriteGuard::Unguarded,
        false => lease_guard::WriteGuard::Lease {
            api: api::Api { client: client.clone(), metrics: metrics.clone() },
            namespace: options.namespace.clone(),
            identity: options.identity.clone(),
        },
    };
    let mut stores = vec![kube_store(client.clone(), &metrics, &options.namespace)];
    for path in &options.etcd_configs {
        stores.push(etcd_store_of(&mut engine, path).await?);
    }
    let mut slices = slice_pass::SlicePass::new(api::Api { client: client.clone(), metrics: metrics.clone() }, &options, engine);
    let reconcilers: Vec<reconcile::Reconciler> = stores
        .into_iter()
        .map(|store| {
            let mut r = reconciler(client.clone(), metrics.clone(), store, &options.identity, guard.clone(), options.completed_grace, options.unbacked_grace);
            r.unreserved = resource_claims::Unreserved::new(options.unreserved_grace);
            r
        })
        .collect();
    if options.once {
        slices.run().await?;
        for r in &reconcilers {
            r.pass(&reconcile::Scope::Full, false).await?;
        }
        return Ok(());
    }
    let (trigger, mut triggered) = mpsc::channel::<()>(1);
    spawn_watchers(&client, &options.namespace, trigger);
    if let Some(store::Store::Kube(kube)) = reconcilers.first().map(|r| &r.store) {
        pool_index::spawn_pool_watch(&client, &options.namespace, kube.pool_index.clone());
    }
    let (pod_events, mut pod_events_rx) = mpsc::unbounded_channel();
    spawn_claim_watch(&client, pod_events.clone());
    spawn_pod_watch(&client, pod_events);
    let lease = LeaseManagerBuilder::new(client, lease_guard::LEASE_NAME)
        .with_namespace(options.namespace.clone())
        .with_identity(options.identity.clone())
        .with_duration(options.lease_seconds)
        .with_grace(options.lease_seconds.div_ceil(3).max(1))
        .build()
        .await
        .context("setting up leader election")?;
    let (mut leading, _task) = lease.watch().await;
    health.set_ready(true);
    loop {
        while !*leading.borrow_and_update() {
            tokio::select! {
                changed = leading.changed() => changed.context("leader election stopped")?,
                // Not leading: the leader frees them, or this replica's first full pass does.
                _ = pod_events_rx.recv() => {}
            }
        }
        metrics.set_leader(true);
        crate::logging::verbose(format!("controller {}: leading", options.identity));
        // A lost Lease drops both loops mid-pass; their writes were guarded.
        tokio::select! {
            outcome = lead(&mut slices, &reconcilers, &mut triggered, &mut pod_events_rx, &metrics, &options) => outcome?,
            changed = async {
                while *leading.borrow_and_update() {
                    leading.changed().await?;
                }
                Ok::<(), tokio::sync::watch::error::RecvError>(())
            } => changed.context("leader election stopped")?,
        }
        metrics.set_leader(false);
        crate::logging::verbose(format!("controller {}: no longer leading", options.identity));
    }
}

/// The node-slice pass, as the periodic loop runs it (a trait so that the
/// loops' tests can stand in for it).
trait NodeSlicePass {
    async fn run(&mut self) -> Result<()>;
}

impl NodeSlicePass for slice_pass::SlicePass {
    async fn run(&mut self) -> Result<()> {
        slice_pass::SlicePass::run(self).await
    }
}

/// The passes of the leading replica, until one of its loops fails: the
/// periodic passes and the pod-delete passes, side by side in this task, so
/// that a delete never waits for a full pass in progress (25 s at 60 000
/// pods). Concurrent passes are safe as concurrent plugins are: every write
/// tests what it read.
async fn lead(
    slices: &mut impl NodeSlicePass,
    reconcilers: &[reconcile::Reconciler],
    triggered: &mut mpsc::Receiver<()>,
    pod_events: &mut mpsc::UnboundedReceiver<PodEvent>,
    metrics: &metrics::Metrics,
    options: &Options,
) -> Result<()> {
    let full_due = FullDue::now();
    tokio::select! {
        outcome = periodic_passes(slices, reconcilers, triggered, &full_due, metrics, options) => outcome,
        outcome = delete_passes(reconcilers, pod_events, &full_due, options) => outcome,
    }
}

/// When the next full pass is due; the delete loop brings it forward (a
/// re-list, a failed pass) and wakes the periodic loop.
struct FullDue {
    at: std::cell::Cell<Instant>,
    /// Why it is due then (for the log line of the pass).
    why: std::cell::Cell<&'static str>,
    sooner: tokio::sync::Notify,
}

impl FullDue {
    fn now() -> Self {
        FullDue { at: std::cell::Cell::new(Instant::now()), why: std::cell::Cell::new("start"), sooner: tokio::sync::Notify::new() }
    }

    fn set(&self, at: Instant, why: &'static str) {
        self.at.set(at);
        self.why.set(why);
    }

    fn bring_forward(&self, at: Instant, why: &'static str) {
        if at < self.at.get() {
            self.set(at, why);
            self.sooner.notify_one();
        }
    }
}

/// The node-slice pass (on start, on every change the watchers report, and
/// every `--resync`) and the full reconcile pass (on start, every
/// `--reconcile-interval`, and when [`FullDue`] is brought forward).
async fn periodic_passes(
    slices: &mut impl NodeSlicePass,
    reconcilers: &[reconcile::Reconciler],
    triggered: &mut mpsc::Receiver<()>,
    full_due: &FullDue,
    metrics: &metrics::Metrics,
    options: &Options,
) -> Result<()> {
    let mut next_slices = Instant::now();
    loop {
        if Instant::now() >= next_slices {
            let started = Instant::now();
            let outcome = slices.run().await;
            metrics.pass("node_slices", outcome.is_ok(), started.elapsed());
            if let Err(e) = outcome {
                crate::logging::error(format!("controller: node-slice pass failed: {}", crate::causes::describe(&e)));
            }
            next_slices = Instant::now() + options.resync;
        }
        if Instant::now() >= full_due.at.get() {
            crate::logging::verbose(format!("controller: full reconcile pass ({})", full_due.why.get()));
            // A failed pass (the apiserver away, a lost Lease) is tried again soon.
            let (ok, recheck) = run_passes(reconcilers, &reconcile::Scope::Full).await;
            let (at, why) = next_full_after(ok, recheck, options.reconcile_interval);
            full_due.set(at, why);
        }
        tokio::select! {
            woken = triggered.recv() => {
                woken.context("the watchers stopped")?;
                // Several events in a row make one pass.
                tokio::time::sleep(Duration::from_millis(100)).await;
                while triggered.try_recv().is_ok() {}
                next_slices = Instant::now();
            }
            _ = full_due.sooner.notified() => {}
            _ = tokio::time::sleep_until(next_slices.min(full_due.at.get())) => {}
        }
    }
}

/// A pass over the entries of deleted pods, for each batch of pod deletes.
/// Pods deleted together (a node drained, a namespace removed) make one
/// pass, which reads and writes each pool once: deletes are gathered until
/// none came for DELETE_BATCH, for at most DELETE_BATCH_MAX.
async fn delete_passes(
    reconcilers: &[reconcile::Reconciler],
    events: &mut mpsc::UnboundedReceiver<PodEvent>,
    full_due: &FullDue,
    options: &Options,
) -> Result<()> {
    loop {
        let event = events.recv().await.context("the pod watch stopped")?;
        let started = Instant::now();
        let mut seen = events.len();
        loop {
            tokio::time::sleep(DELETE_BATCH).await;
            let now = events.len();
            if now == seen || started.elapsed() >= DELETE_BATCH_MAX {
                break;
            }
            seen = now;
        }
        let (pods, relisted, claims) = collect_deletes(event, events);
        if relisted {
            full_due.bring_forward(Instant::now(), "the pod watch listed again");
        }
        if claims {
            full_due.bring_forward(Instant::now(), "an IPAMClaim was deleted");
        }
        if !pods.is_empty() {
            let (ok, recheck) = run_passes(reconcilers, &reconcile::Scope::Pods(pods)).await;
            if !ok || recheck.is_some() {
                let (at, why) = next_full_after(ok, recheck, options.reconcile_interval);
                full_due.bring_forward(at, why);
            }
        }
    }
}

/// Whether every pass succeeded.
/// Runs `scope`'s pass in every reconciler. Answers whether all went well,
/// and when the soonest of them wants a full pass again.
async fn run_passes(reconcilers: &[reconcile::Reconciler], scope: &reconcile::Scope) -> (bool, Option<Duration>) {
    let mut ok = true;
    let mut recheck: Option<Duration> = None;
    for r in reconcilers {
        match r.pass(scope, false).await {
            Ok(report) => recheck = recheck.into_iter().chain(report.recheck_in).min(),
            Err(e) => {
                crate::logging::error(format!("controller: {} reconcile pass of {} failed: {}", scope.kind(), r.store.describe(), crate::causes::describe(&e)));
                ok = false;
            }
        }
    }
    (ok, recheck)
}

/// When the next full pass is due after one that went `ok` and wants a
/// look again in `recheck`, and why then (for the pass's log line).
fn next_full_after(ok: bool, recheck: Option<Duration>, interval: Duration) -> (Instant, &'static str) {
    let (wait, why) = if ok { (interval, "interval") } else { (interval.min(RETRY_FAILED_PASS), "a pass failed") };
    // Just past the grace, so the reservation has waited all of it.
    match recheck.map(|r| r + RECHECK_MARGIN) {
        Some(r) if r < wait => (Instant::now() + r, "a reservation's unbacked grace ends"),
        _ => (Instant::now() + wait, why),
    }
}

/// The etcd datastore a network config (or flat file) names.
pub async fn etcd_store_of(engine: &mut crate::component::EngineComponent, path: &std::path::Path) -> Result<store::Store> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (config, _) = crate::network_config::load(engine, &text, "").with_context(|| format!("in {}", path.display()))?;
    if config.datastore.kind.as_deref() != Some("etcd") {
        anyhow::bail!("{}: its datastore is not etcd", path.display());
    }
    Ok(store::Store::Etcd(Box::new(
        etcd_store::EtcdStore::connect(&config.datastore).await.with_context(|| format!("connecting to the etcd of {}", path.display()))?,
    )))
}

/// The deletes already queued with `first`, as one set, and whether a
/// re-list came among them (deletes in between were not seen: a full pass
/// is due). The deletes seen are freed either way, without waiting for it.
fn collect_deletes(first: PodEvent, queued: &mut mpsc::UnboundedReceiver<PodEvent>) -> (BTreeSet<String>, bool, bool) {
    let mut pods = BTreeSet::new();
    let mut relisted = false;
    let mut claims = false;
    for event in std::iter::once(first).chain(std::iter::from_fn(|| queued.try_recv().ok())) {
        match event {
            PodEvent::Deleted(podref) => {
                pods.insert(podref);
            }
            PodEvent::Relisted => relisted = true,
            PodEvent::ClaimDeleted => claims = true,
        }
    }
    (pods, relisted, claims)
}

/// Pod deletes, from a metadata-only watch of every pod (a few hundred bytes
/// a pod instead of whole objects): `Api<PartialObjectMeta<_>>` makes kube
/// ask for `PartialObjectMetadataList` and `PartialObjectMetadata`
/// (`reconcile_tests.rs` pins it).
fn spawn_pod_watch(client: &kube::Client, events: mpsc::UnboundedSender<PodEvent>) {
    let pods: KubeApi<PartialObjectMeta<k8s_openapi::api::core::v1::Pod>> = KubeApi::all(client.clone());
    let mut listed_once = false;
    tokio::spawn(watcher(pods, watcher::Config::default()).default_backoff().for_each(move |event| {
        let sent = match event {
            Ok(watcher::Event::Delete(pod)) => {
                let (namespace, name) = (pod.metadata.namespace.unwrap_or_default(), pod.metadata.name.unwrap_or_default());
                Some(PodEvent::Deleted(format!("{namespace}/{name}")))
            }
            // The first list is the start, which runs a full pass anyway.
            Ok(watcher::Event::InitDone) => std::mem::replace(&mut listed_once, true).then_some(PodEvent::Relisted),
            _ => None,
        };
        if let Some(e) = sent {
            let _ = events.send(e);
        }
        std::future::ready(())
    }));
}

/// IPAMClaim and ResourceClaim deletes, from metadata-only watches. Where
/// the CRD or DRA's API is not served (or may not be watched) a watch backs
/// off and tries again (it may be installed later).
fn spawn_claim_watch(client: &kube::Client, events: mpsc::UnboundedSender<PodEvent>) {
    let claims: KubeApi<PartialObjectMeta<DynamicObject>> = KubeApi::all_with(client.clone(), &IPAM_CLAIM_RESOURCE.api_resource());
    tokio::spawn(watcher(claims, watcher::Config::default()).default_backoff().for_each(claim_deleted(events.clone())));
    let resource_claims: KubeApi<PartialObjectMeta<k8s_openapi::api::resource::v1::ResourceClaim>> = KubeApi::all(client.clone());
    tokio::spawn(watcher(resource_claims, watcher::Config::default()).default_backoff().for_each(claim_deleted(events)));
}

/// A claim watch's handler: a delete brings a full pass forward.
fn claim_deleted<T, E>(events: mpsc::UnboundedSender<PodEvent>) -> impl FnMut(Result<watcher::Event<T>, E>) -> std::future::Ready<()> {
    move |event| {
        if let Ok(watcher::Event::Delete(_)) = event {
            let _ = events.send(PodEvent::ClaimDeleted);
        }
        std::future::ready(())
    }
}

/// A watch event's handler: wake the loop (a pending wake-up is enough).
fn wake<T>(trigger: mpsc::Sender<()>) -> impl FnMut(T) -> std::future::Ready<()> {
    move |_| {
        let _ = trigger.try_send(());
        std::future::ready(())
    }
}

/// Wakes the loop on every change of what the layout depends on.
fn spawn_watchers(client: &kube::Client, namespace: &str, trigger: mpsc::Sender<()>) {
    // The slice pass needs to know that a Node came or went, not what it
    // says: metadata only (a Node's status, its image list, is tens of KB).
    let nodes: KubeApi<PartialObjectMeta<k8s_openapi::api::core::v1::Node>> = KubeApi::all(client.clone());
    let nads: KubeApi<DynamicObject> = KubeApi::all_with(client.clone(), &NAD_RESOURCE.api_resource());
    let slice_pools: KubeApi<DynamicObject> = KubeApi::namespaced_with(client.clone(), namespace, &NODE_SLICE_POOL_RESOURCE.api_resource());
    tokio::spawn(watcher(nodes, watcher::Config::default()).default_backoff().for_each(wake(trigger.clone())));
    tokio::spawn(watcher(nads, watcher::Config::default()).default_backoff().for_each(wake(trigger.clone())));
    tokio::spawn(watcher(slice_pools, watcher::Config::default()).default_backoff().for_each(wake(trigger)));
}
