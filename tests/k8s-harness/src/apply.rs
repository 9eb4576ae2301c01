//! `kubectl apply --server-side` for test fixtures: multi-document YAML (or JSON)
//! of any kind the apiserver knows, resolved through discovery, applied with a
//! forced server-side apply; CRDs are waited for until Established.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use kube::runtime::wait::{await_condition, conditions};
use serde::Deserialize;

use crate::FIELD_MANAGER;

/// How long a kind may stay unknown to discovery (a CRD applied just before).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);
const CRD_ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);

/// Splits a `---`-separated YAML (or JSON) stream into objects; empty documents
/// are skipped and `kind: List` documents are flattened into their items.
pub fn split_yaml(text: &str) -> Result<Vec<serde_json::Value>> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let v = serde_json::Value::deserialize(doc).with_context(|| format!("YAML document {}", i + 1))?;
        match v {
            serde_json::Value::Null => {}
            serde_json::Value::Object(ref m) if m.get("kind").and_then(|k| k.as_str()) == Some("List") => {
                if let Some(items) = m.get("items").and_then(|i| i.as_array()) {
                    out.extend(items.iter().cloned());
                }
            }
            serde_json::Value::Object(_) => out.push(v),
            other => bail!("YAML document {} is not an object: {other}", i + 1),
        }
    }
    Ok(out)
}

/// Server-side-applies every object of `yaml` with `client`; namespaced objects
/// without `metadata.namespace` go to `default_namespace`.
pub async fn apply_yaml(client: &kube::Client, yaml: &str, default_namespace: &str) -> Result<Vec<DynamicObject>> {
    let mut applied = Vec::new();
    for value in split_yaml(yaml)? {
        let obj: DynamicObject = serde_json::from_value(value).context("not a Kubernetes object")?;
        let types = obj.types.clone().ok_or_else(|| anyhow!("object without apiVersion/kind"))?;
        let name = obj.metadata.name.clone().ok_or_else(|| anyhow!("{} without metadata.name", types.kind))?;
        let (group, version) = match types.api_version.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), types.api_version.clone()),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, &types.kind);
        let what = format!("{} {name}", types.kind);

        let deadline = Instant::now() + DISCOVERY_TIMEOUT;
        let (ar, caps) = loop {
            match kube::discovery::pinned_kind(client, &gvk).await {
                Ok(found) => break found,
                Err(e) if Instant::now() > deadline => {
                    return Err(e).with_context(|| format!("{what}: kind {}/{} unknown", types.api_version, types.kind));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        };
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = obj.metadata.namespace.as_deref().unwrap_or(default_namespace);
                Api::namespaced_with(client.clone(), ns, &ar)
            }
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        let result = api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&obj)).await.with_context(|| format!("applying {what}"))?;

        if group == "apiextensions.k8s.io" && types.kind == "CustomResourceDefinition" {
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            tokio::time::timeout(CRD_ESTABLISHED_TIMEOUT, await_condition(crds, &name, conditions::is_crd_established()))
                .await
                .map_err(|_| anyhow!("CRD {name} not Established within {CRD_ESTABLISHED_TIMEOUT:?}"))?
                .with_context(|| format!("waiting for CRD {name}"))?;
        }
        applied.push(result);
    }
    Ok(applied)
}
