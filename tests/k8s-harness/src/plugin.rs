//! Helpers for tests that run the `thereabouts` CNI plugin (a real process) on the
//! Kubernetes datastore of a harness [`Cluster`]:
//!
//! * [`kubernetes_conf`]: a network config whose `ipam` uses the datastore with a
//!   given kubeconfig, network name and ranges;
//! * [`Objects`]: a blocking view of the whereabouts objects as the admin sees
//!   them, raw JSON as served (for wire-format comparisons), plus create/delete;
//! * [`kubeconfig_variant`]: a copy of a harness kubeconfig with edits (another
//!   namespace, a wrong token, ...).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::{Cluster, NAMESPACE};

pub const GROUP_VERSION: &str = "whereabouts.cni.cncf.io/v1alpha1";
pub const IPPOOLS: &str = "ippools";
pub const RESERVATIONS: &str = "overlappingrangeipreservations";

/// `{"cniVersion": "1.1.0", "name": <name>, "ipam": {"type": "thereabouts",
/// "datastore": "kubernetes", "kubernetes": {"kubeconfig": ...}, "ipRanges": [...]}}`,
/// with `network_name` when given.
pub fn kubernetes_conf(name: &str, kubeconfig: &Path, network_name: Option<&str>, ranges: &[&str]) -> Value {
    let mut ipam = json!({
        "type": "thereabouts",
        "datastore": "kubernetes",
        "kubernetes": {"kubeconfig": kubeconfig.to_str().expect("utf-8 path")},
        "ipRanges": ranges.iter().map(|r| json!({"range": r})).collect::<Vec<_>>(),
    });
    if let Some(n) = network_name {
        ipam["network_name"] = json!(n);
    }
    json!({"cniVersion": "1.1.0", "name": name, "type": "thab-k8s", "ipam": ipam})
}

/// Writes a copy of the kubeconfig `source` to `dest` after `edit` changed it
/// (as JSON: `contexts[0].context.namespace`, `users[0].user.token`, ...).
pub fn kubeconfig_variant(source: &Path, dest: &Path, edit: impl FnOnce(&mut Value)) -> Result<()> {
    let text = std::fs::read_to_string(source).with_context(|| format!("reading {}", source.display()))?;
    let mut doc: Value = serde_yaml_ng::from_str(&text).context("parsing the kubeconfig")?;
    edit(&mut doc);
    std::fs::write(dest, serde_yaml_ng::to_string(&doc)?).with_context(|| format!("writing {}", dest.display()))
}

/// The admin's view of the whereabouts objects in one namespace, blocking (a
/// private current-thread runtime), so tests can interleave it with plugin runs.
pub struct Objects {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
    namespace: String,
}

impl Objects {
    /// The admin identity, in the kubeconfigs' namespace (`kube-system`).
    pub fn admin(cluster: &Cluster) -> Result<Objects> {
        Self::admin_in(cluster, NAMESPACE)
    }

    pub fn admin_in(cluster: &Cluster, namespace: &str) -> Result<Objects> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let client = runtime.block_on(cluster.admin_client())?;
        Ok(Objects { runtime, client, namespace: namespace.to_string() })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn path(&self, plural: &str, name: Option<&str>) -> String {
        self.path_in(GROUP_VERSION, plural, name)
    }

    fn path_in(&self, group_version: &str, plural: &str, name: Option<&str>) -> String {
        let base = format!("/apis/{group_version}/namespaces/{}/{plural}", self.namespace);
        match name {
            Some(n) => format!("{base}/{n}"),
            None => base,
        }
    }

    fn send(&self, method: http::Method, path: &str, body: Option<&Value>) -> Result<Option<String>> {
        let content_type = if method == http::Method::PATCH { "application/merge-patch+json" } else { "application/json" };
        let mut request = http::Request::builder().method(method).uri(path);
        let bytes = match body {
            Some(b) => {
                request = request.header("content-type", content_type);
                serde_json::to_vec(b)?
            }
            None => Vec::new(),
        };
        let request = request.body(bytes)?;
        match self.runtime.block_on(self.client.request_text(request)) {
            Ok(text) => Ok(Some(text)),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(e).with_context(|| path.to_string()),
        }
    }

    /// The object's JSON text exactly as the apiserver serves it, `None` if absent.
    pub fn raw(&self, plural: &str, name: &str) -> Result<Option<String>> {
        self.send(http::Method::GET, &self.path(plural, Some(name)), None)
    }

    pub fn get(&self, plural: &str, name: &str) -> Result<Option<Value>> {
        Ok(match self.raw(plural, name)? {
            Some(text) => Some(serde_json::from_str(&text)?),
            None => None,
        })
    }

    /// Every object of the kind in the namespace, by name.
    pub fn list(&self, plural: &str) -> Result<BTreeMap<String, Value>> {
        self.list_at(GROUP_VERSION, plural)
    }

    /// [`Objects::list`] for a kind of another API group (`coordination.k8s.io/v1`).
    pub fn list_at(&self, group_version: &str, plural: &str) -> Result<BTreeMap<String, Value>> {
        let text = self.send(http::Method::GET, &self.path_in(group_version, plural, None), None)?.unwrap_or_default();
        let list: Value = serde_json::from_str(&text)?;
        Ok(list["items"].as_array().into_iter().flatten().map(|o| (o["metadata"]["name"].as_str().unwrap_or_default().to_string(), o.clone())).collect())
    }

    /// `spec.allocations` of a pool (empty when the pool or the map is absent).
    pub fn allocations(&self, pool: &str) -> Result<BTreeMap<String, Value>> {
        Ok(self.get(IPPOOLS, pool)?.and_then(|p| p["spec"]["allocations"].as_object().cloned()).map(|m| m.into_iter().collect()).unwrap_or_default())
    }

    /// Reservations by name: their `spec`.
    pub fn reservations(&self) -> Result<BTreeMap<String, Value>> {
        Ok(self.list(RESERVATIONS)?.into_iter().map(|(n, o)| (n, o["spec"].clone())).collect())
    }

    /// Creates an object (JSON or YAML text of one object) in the namespace.
    pub fn create(&self, plural: &str, object: &Value) -> Result<Value> {
        self.create_at(GROUP_VERSION, plural, object)
    }

    /// [`Objects::create`] for a kind of another API group (`coordination.k8s.io/v1`).
    pub fn create_at(&self, group_version: &str, plural: &str, object: &Value) -> Result<Value> {
        let text = self.send(http::Method::POST, &self.path_in(group_version, plural, None), Some(object))?;
        match text {
            Some(t) => Ok(serde_json::from_str(&t)?),
            None => bail!("creating {plural}: 404 (namespace or CRD missing?)"),
        }
    }

    pub fn create_yaml(&self, plural: &str, yaml: &str) -> Result<Value> {
        let object: Value = serde_yaml_ng::from_str(yaml).context("parsing YAML")?;
        self.create(plural, &object)
    }

    /// Sets an annotation (a JSON merge patch): a write by someone else that
    /// moves the object's `resourceVersion` without touching its allocations.
    pub fn annotate(&self, plural: &str, name: &str, key: &str, value: &str) -> Result<()> {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        self.send(http::Method::PATCH, &self.path(plural, Some(name)), Some(&patch)).map(|_| ())
    }

    /// Sends a JSON patch (RFC 6902) as the admin: the object written, or the
    /// API's refusal code (422 when a `test` failed, 404, ...).
    pub fn json_patch(&self, plural: &str, name: &str, ops: &Value) -> Result<std::result::Result<Value, u16>> {
        self.request(http::Method::PATCH, plural, Some(name), "application/json-patch+json", ops)
    }

    /// Sends `body` (of `content_type`) to one object, or without `name` to the
    /// collection, as the admin: the answer's JSON, or the API's refusal code
    /// (404, 409, 422, ...).
    pub fn request(&self, method: http::Method, plural: &str, name: Option<&str>, content_type: &str, body: &Value) -> Result<std::result::Result<Value, u16>> {
        let request =
            http::Request::builder().method(method).uri(self.path(plural, name)).header("content-type", content_type).body(serde_json::to_vec(body)?)?;
        match self.runtime.block_on(self.client.request_text(request)) {
            Ok(text) => Ok(Ok(serde_json::from_str(&text)?)),
            Err(kube::Error::Api(s)) => Ok(Err(s.code)),
            Err(e) => Err(e.into()),
        }
    }

    /// Merge-patches the `status` subresource of an object of another API group.
    pub fn patch_status_at(&self, group_version: &str, plural: &str, name: &str, patch: &Value) -> Result<()> {
        let path = format!("{}/status", self.path_in(group_version, plural, Some(name)));
        self.send(http::Method::PATCH, &path, Some(patch))?.map(|_| ()).with_context(|| format!("{path}: 404"))
    }

    pub fn delete(&self, plural: &str, name: &str) -> Result<()> {
        self.send(http::Method::DELETE, &self.path(plural, Some(name)), None).map(|_| ())
    }

    /// [`Objects::delete`] for a kind of another API group.
    pub fn delete_at(&self, group_version: &str, plural: &str, name: &str) -> Result<()> {
        self.send(http::Method::DELETE, &self.path_in(group_version, plural, Some(name)), None).map(|_| ())
    }

    /// Creates (or keeps) a namespace.
    pub fn ensure_namespace(&self, name: &str) -> Result<()> {
        let request = http::Request::builder()
            .method(http::Method::POST)
            .uri("/api/v1/namespaces")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))?)?;
        match self.runtime.block_on(self.client.request_text(request)) {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Server-side-applies a YAML stream (RBAC objects of a test, say) as admin.
    pub fn apply(&self, yaml: &str) -> Result<()> {
        self.runtime.block_on(crate::apply_yaml(&self.client, yaml, &self.namespace)).map(|_| ())
    }
}
