//! Pods as a kubelet and multus would leave them, on simulated nodes (no
//! kubelet runs): a Pod object with `spec.nodeName`, its status written
//! through the status subresource, and the `k8s.v1.cni.cncf.io/network-status`
//! annotation listing the addresses of each attachment; and labelled Pods in
//! namespaces of their own, as policies that read a pod's labels see them.

use std::net::IpAddr;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::Cluster;

pub const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

/// The Pod `default/<name>` on `node`; answers its UID.
pub async fn create(cluster: &Cluster, name: &str, node: &str) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client().await?, "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
    }))?;
    let created = pods.create(&PostParams::default(), &pod).await.with_context(|| format!("creating pod {name}"))?;
    Ok(created.metadata.uid.unwrap_or_default())
}

/// The Namespace `name`, created unless it exists.
pub async fn namespace(cluster: &Cluster, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(cluster.admin_client().await?);
    if namespaces.get_opt(name).await?.is_none() {
        let ns: Namespace = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))?;
        namespaces.create(&PostParams::default(), &ns).await.with_context(|| format!("creating namespace {name}"))?;
    }
    Ok(())
}

/// The Pod `<namespace>/<name>` with `labels`, on no node (what a policy reads
/// of it is its metadata); answers its UID.
pub async fn create_labelled(cluster: &Cluster, namespace: &str, name: &str, labels: &[(&str, &str)]) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client().await?, namespace);
    let labels: serde_json::Map<String, Value> = labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
    }))?;
    let created = pods.create(&PostParams::default(), &pod).await.with_context(|| format!("creating pod {namespace}/{name}"))?;
    Ok(created.metadata.uid.unwrap_or_default())
}

/// Sets the labels `labels` on Pod `<namespace>/<name>` (a merge patch: others stay).
pub async fn label(cluster: &Cluster, namespace: &str, name: &str, labels: &[(&str, &str)]) -> Result<()> {
    merge_metadata(cluster, namespace, name, "labels", labels).await.with_context(|| format!("labelling pod {namespace}/{name}"))
}

/// Sets `pairs` in the metadata map `field` (labels, annotations) of Pod
/// `<namespace>/<name>`, by a merge patch: other keys stay.
async fn merge_metadata(cluster: &Cluster, namespace: &str, name: &str, field: &str, pairs: &[(&str, &str)]) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client().await?, namespace);
    let map: serde_json::Map<String, Value> = pairs.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&json!({"metadata": {field: map}}))).await?;
    Ok(())
}

/// The status a kubelet writes: `Running` with its container running,
/// `Succeeded`/`Failed` with it terminated at `finished_at` (RFC 3339), or
/// `Pending` with it waiting.
pub async fn set_phase(cluster: &Cluster, name: &str, phase: &str, finished_at: &str) -> Result<()> {
    let state = match phase {
        "Running" => json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
        "Succeeded" | "Failed" => json!({"terminated": {"exitCode": 0, "finishedAt": finished_at}}),
        _ => json!({"waiting": {"reason": "ContainerCreating"}}),
    };
    let status = json!({"status": {"phase": phase, "containerStatuses": [{
        "name": "app", "image": "registry.invalid/app:1", "imageID": "", "ready": phase == "Running", "restartCount": 0, "state": state,
    }]}});
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client().await?, "default");
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.with_context(|| format!("writing the status of pod {name}"))?;
    Ok(())
}

/// The network-status annotation as multus writes it after the ADDs: the
/// cluster network, then `interface` of the NAD `default/<network>` with `ips`.
pub async fn set_network_status(cluster: &Cluster, name: &str, network: &str, interface: &str, ips: &[IpAddr]) -> Result<()> {
    let status = json!([
        {"name": "cluster", "interface": "eth0", "ips": ["10.244.0.9"], "default": true, "dns": {}},
        {"name": format!("default/{network}"), "interface": interface, "ips": ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(), "mac": "02:00:00:00:00:01", "dns": {}},
    ]);
    let patch = json!({"metadata": {"annotations": {NETWORK_STATUS: status.to_string()}}});
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client().await?, "default");
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.with_context(|| format!("annotating pod {name}"))?;
    Ok(())
}

/// Deleted at once (`--grace-period=0 --force`): no kubelet confirms a graceful delete here.
pub async fn delete(cluster: &Cluster, name: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client().await?, "default");
    pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await.with_context(|| format!("deleting pod {name}"))?;
    Ok(())
}

/// A Node object whose `Ready` condition is `ready`, as a kubelet (or the
/// node lifecycle controller, for an unreachable node) reports it.
pub async fn node(cluster: &Cluster, name: &str, ready: bool) -> Result<()> {
    let nodes: Api<Node> = Api::all(cluster.admin_client().await?);
    if nodes.get_opt(name).await?.is_none() {
        let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))?;
        nodes.create(&PostParams::default(), &node).await.with_context(|| format!("creating node {name}"))?;
    }
    let (status, reason) = if ready { ("True", "KubeletReady") } else { ("Unknown", "NodeStatusUnknown") };
    let patch = json!({"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": reason, "message": "",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]}});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.with_context(|| format!("writing the status of node {name}"))?;
    Ok(())
}

/// Events with `reason` on pod `default/<name>`.
pub async fn events_of(cluster: &Cluster, name: &str, reason: &str) -> Result<Vec<Value>> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(cluster.admin_client().await?, "default");
    let listed = events.list(&Default::default()).await?;
    Ok(listed
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some(reason))
        .map(|e| serde_json::to_value(e).unwrap_or(Value::Null))
        .collect())
}

/// `seconds` ago, as the apiserver writes times (RFC 3339, UTC).
pub fn time_ago(seconds: i64) -> String {
    let at = k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(seconds);
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Sets `annotations` on Pod `<namespace>/<name>` (a merge patch: others stay).
pub async fn annotate(cluster: &Cluster, namespace: &str, name: &str, annotations: &[(&str, &str)]) -> Result<()> {
    merge_metadata(cluster, namespace, name, "annotations", annotations).await.with_context(|| format!("annotating pod {namespace}/{name}"))
}
