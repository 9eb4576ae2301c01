//! IPAMClaims and the pods that name them, as KubeVirt's ipam-extensions
//! makes them, for the claim tests and `bench_claims`.

use anyhow::Result;
use serde_json::{Value, json};

use crate::plugin::Objects;
use crate::{Cluster, deploy_dir, pods};

/// The claims' API group and version.
pub const CLAIMS: &str = "k8s.cni.cncf.io/v1alpha1";

/// Namespace `namespace`, and `deploy/rbac-persistent-ips.yaml` applied and in force there.
pub async fn prepare(cluster: &Cluster, namespace: &str) -> Result<()> {
    pods::namespace(cluster, namespace).await?;
    cluster.apply_path(&deploy_dir().join("rbac-persistent-ips.yaml")).await?;
    cluster.wait_plugin_allowed("patch", "k8s.cni.cncf.io", "ipamclaims/status", namespace).await
}

/// The IPAMClaim `name` of network `blue` in the namespace of `objects`, as
/// ipam-extensions creates it (`spec.interface` empty).
pub fn create(objects: &Objects, name: &str) -> Result<Value> {
    let claim = json!({"apiVersion": CLAIMS, "kind": "IPAMClaim", "metadata": {"name": name}, "spec": {"network": "blue", "interface": ""}});
    objects.create_at(CLAIMS, "ipamclaims", &claim)
}

/// A launcher pod whose network-selection element for network `blue` names
/// `vm`'s claim (`<vm>.blue`), as ipam-extensions mutates it; Multus passes
/// none of it to the plugin.
pub async fn launcher(cluster: &Cluster, namespace: &str, pod: &str, vm: &str) -> Result<()> {
    pods::create_labelled(cluster, namespace, pod, &[]).await?;
    let networks = json!([{"name": "blue", "namespace": namespace, "ipam-claim-reference": format!("{vm}.blue")}]).to_string();
    pods::annotate(cluster, namespace, pod, &[("k8s.v1.cni.cncf.io/networks", &networks)]).await
}
