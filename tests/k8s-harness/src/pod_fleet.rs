//! Many pods at once, for the benches: created as the scheduler, kubelet and
//! Multus leave them, deleted together, and followed through the IPPool watch
//! until the controller has freed their entries (delete-to-free).

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::NAMESPACE;
use crate::plugin::IPPOOLS;
use crate::pods::NETWORK_STATUS;

/// Runs `work` on every item, at most `width` at a time, and returns the
/// results in the order they finished.
pub async fn in_parallel<T, R, F, Fut>(items: impl IntoIterator<Item = T>, width: usize, work: F) -> Result<Vec<R>>
where
    F: Fn(T) -> Fut,
    Fut: Future<Output = Result<R>> + Send + 'static,
    R: Send + 'static,
{
    let mut running = tokio::task::JoinSet::new();
    let mut out = Vec::new();
    for item in items {
        if running.len() >= width {
            out.push(running.join_next().await.context("a task")???);
        }
        running.spawn(work(item));
    }
    while let Some(done) = running.join_next().await {
        out.push(done??);
    }
    Ok(out)
}

/// A Node object (no status: the controller reads no readiness for slices).
pub async fn create_node(nodes: Api<Node>, name: String) -> Result<()> {
    let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))?;
    nodes.create(&PostParams::default(), &node).await.with_context(|| format!("creating node {name}"))?;
    Ok(())
}

/// The pod as the scheduler and kubelet leave it: on `node`, `Running` with
/// its container running (through the status subresource). With `attached`
/// (network, interface, addresses) it also carries Multus' network-status
/// annotation, written with the create: one request fewer than a separate
/// annotate, the same object.
pub async fn create_running(pods: Api<Pod>, name: String, node: String, attached: Option<(&str, &str, Vec<String>)>) -> Result<()> {
    let mut metadata = json!({"name": name, "namespace": "default"});
    if let Some((network, interface, ips)) = attached {
        let network_status = json!([
            {"name": "cluster", "interface": "eth0", "ips": ["10.244.0.9"], "default": true, "dns": {}},
            {"name": network, "interface": interface, "ips": ips, "mac": "02:00:00:00:00:01", "dns": {}},
        ]);
        metadata["annotations"] = json!({NETWORK_STATUS: network_status.to_string()});
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await.with_context(|| format!("creating pod {name}"))?;
    let status = json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "app", "image": "registry.invalid/app:1", "imageID": "", "ready": true, "restartCount": 0,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
    }]}});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.with_context(|| format!("writing the status of pod {name}"))?;
    Ok(())
}

/// Deletes the pod at once (grace period 0), as a force delete does.
pub async fn delete_now(pods: Api<Pod>, name: String) -> Result<()> {
    pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await.with_context(|| format!("deleting pod {name}"))?;
    Ok(())
}

/// The deleted pods' podrefs a pool still holds.
fn held_podrefs(pool: &DynamicObject, deleted: &BTreeSet<String>) -> BTreeSet<String> {
    let allocations = pool.data.pointer("/spec/allocations").and_then(Value::as_object);
    allocations.into_iter().flatten().filter_map(|(_, e)| e["podref"].as_str()).filter(|p| deleted.contains(*p)).map(str::to_string).collect()
}

/// The next item of a stream (the stream traits come through kube's `WatchStreamExt`).
async fn next<S: WatchStreamExt + ?Sized>(mut stream: Pin<&mut S>) -> Option<S::Item> {
    std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await
}

/// How many of the pools hold an entry of each pod.
fn pools_holding(holding: &HashMap<String, BTreeSet<String>>) -> HashMap<&str, usize> {
    let mut counts = HashMap::new();
    for podref in holding.values().flatten() {
        *counts.entry(podref.as_str()).or_insert(0) += 1;
    }
    counts
}

/// What the IPPool watch saw of the deletes, by podref.
pub struct Followed {
    /// The first delete sent.
    pub started: Instant,
    /// Whether the limit came before every deleted pod's entries were gone.
    pub timed_out: bool,
    pub answered: HashMap<String, Instant>,
    pub first_entry_freed: HashMap<String, Instant>,
    pub last_entry_freed: HashMap<String, Instant>,
}

impl Followed {
    /// Per pod, from its delete's answer to `at` (ms, sorted; negative when
    /// the watch showed it before the answer came).
    pub fn since_answer(&self, at: &HashMap<String, Instant>) -> Vec<f64> {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let mut out: Vec<f64> = at
            .iter()
            .map(|(podref, &at)| {
                let answer = self.answered[podref];
                if at >= answer { ms(at - answer) } else { -ms(answer - at) }
            })
            .collect();
        out.sort_by(f64::total_cmp);
        out
    }
}

/// Deletes the pods (podrefs `default/NAME`) at once and follows the IPPools
/// until none of their entries is left, or `limit`.
pub async fn delete_and_follow(client: &kube::Client, deleted: &BTreeSet<String>, limit: Duration) -> Result<Followed> {
    let gvk = GroupVersionKind::gvk("whereabouts.cni.cncf.io", "v1alpha1", "IPPool");
    let pools: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &ApiResource::from_gvk_with_plural(&gvk, IPPOOLS));
    let mut stream = std::pin::pin!(watcher(pools, watcher::Config::default()));
    let mut holding: HashMap<String, BTreeSet<String>> = HashMap::new();
    // The initial list, before any delete.
    loop {
        match next(stream.as_mut()).await.context("the IPPool watch ended")?? {
            watcher::Event::InitApply(p) => {
                holding.insert(p.metadata.name.clone().unwrap_or_default(), held_podrefs(&p, deleted));
            }
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    let initially: HashMap<String, usize> = pools_holding(&holding).into_iter().map(|(p, n)| (p.to_string(), n)).collect();
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let started = Instant::now();
    let mut deletes = tokio::task::JoinSet::new();
    for podref in deleted {
        let (api, podref) = (api.clone(), podref.clone());
        deletes.spawn(async move {
            delete_now(api, podref.trim_start_matches("default/").to_string()).await?;
            anyhow::Ok((podref, Instant::now()))
        });
    }
    let (mut first_entry_freed, mut freed_at) = (HashMap::new(), HashMap::new());
    let end = tokio::time::Instant::now() + limit;
    let mut timed_out = false;
    while freed_at.len() < deleted.len() {
        let Ok(event) = tokio::time::timeout_at(end, next(stream.as_mut())).await else {
            timed_out = true;
            break;
        };
        match event.context("the IPPool watch ended")? {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                holding.insert(p.metadata.name.clone().unwrap_or_default(), held_podrefs(&p, deleted));
            }
            Ok(watcher::Event::Delete(p)) => {
                holding.remove(&p.metadata.name.clone().unwrap_or_default());
            }
            Ok(_) => continue,
            Err(e) => {
                eprintln!("IPPool watch: {e}; it starts over");
                continue;
            }
        }
        let now = Instant::now();
        let counts = pools_holding(&holding);
        for podref in deleted {
            let left = counts.get(podref.as_str()).copied().unwrap_or(0);
            if left < initially.get(podref).copied().unwrap_or(0) {
                first_entry_freed.entry(podref.clone()).or_insert(now);
            }
            if left == 0 {
                freed_at.entry(podref.clone()).or_insert(now);
            }
        }
    }
    let mut answered = HashMap::new();
    while let Some(done) = deletes.join_next().await {
        let (podref, at) = done??;
        answered.insert(podref, at);
    }
    Ok(Followed { started, timed_out, answered, first_entry_freed, last_entry_freed: freed_at })
}
