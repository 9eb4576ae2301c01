//! The pods and nodes a pass decides on, read after the datastore: every Pod
//! (a full pass; a consistent paged LIST) or only the pods named by the
//! entries of a deleted pod (one consistent GET each), and every Node's
//! readiness.

use std::collections::{BTreeSet, HashMap};

use serde::Deserialize;

use super::api::{Api, ApiError};
use super::pods::{PodFacts, PodJson};
use super::verdict::PodView;
use crate::datastore::kubernetes::crd::escape;

const PODS_PAGE: u32 = 500;

#[derive(Debug, Default)]
pub struct PodsAt {
    pods: HashMap<String, PodFacts>,
    ready: HashMap<String, bool>,
}

impl PodView for PodsAt {
    fn pod(&self, podref: &str) -> Option<&PodFacts> {
        self.pods.get(podref)
    }
    fn node_ready(&self, node: &str) -> Option<bool> {
        self.ready.get(node).copied()
    }
}

impl PodsAt {
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Every pod of the cluster.
    pub async fn all(api: &Api) -> Result<PodsAt, ApiError> {
        let mut at = PodsAt::default();
        api.list_pages::<PodJson>("/api/v1/pods", PODS_PAGE, |p| {
            at.pods.insert(p.podref(), p.facts());
        })
        .await?;
        at.ready = nodes(api).await?;
        Ok(at)
    }

    /// The pods of `podrefs` (`namespace/name`) that exist.
    pub async fn only(api: &Api, podrefs: &BTreeSet<String>) -> Result<PodsAt, ApiError> {
        let mut at = PodsAt::default();
        for podref in podrefs {
            let Some((namespace, name)) = podref.split_once('/') else { continue };
            let path = format!("/api/v1/namespaces/{}/pods/{}", escape(namespace), escape(name));
            match api.get::<PodJson>(&path).await {
                Ok(p) => {
                    at.pods.insert(podref.clone(), p.facts());
                }
                Err(e) if e.code() == Some(404) => {}
                Err(e) => return Err(e),
            }
        }
        if !at.pods.is_empty() {
            at.ready = nodes(api).await?;
        }
        Ok(at)
    }
}

#[derive(Deserialize)]
struct NodeJson {
    #[serde(default)]
    metadata: NodeMeta,
    #[serde(default)]
    status: NodeStatus,
}

#[derive(Deserialize, Default)]
struct NodeMeta {
    #[serde(default)]
    name: String,
}

#[derive(Deserialize, Default)]
struct NodeStatus {
    #[serde(default)]
    conditions: Vec<NodeCondition>,
}

#[derive(Deserialize)]
struct NodeCondition {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    status: String,
}

/// Each node's `Ready` condition (a Node's status is decoded for that alone:
/// its image list can be tens of KB).
async fn nodes(api: &Api) -> Result<HashMap<String, bool>, ApiError> {
    let mut ready = HashMap::new();
    api.list_pages::<NodeJson>("/api/v1/nodes", PODS_PAGE, |n| {
        let is_ready = n.status.conditions.iter().any(|c| c.kind == "Ready" && c.status == "True");
        ready.insert(n.metadata.name, is_ready);
    })
    .await?;
    Ok(ready)
}
