//! The pods and nodes a pass decides on, read after the datastore: every Pod
//! (a full pass; a consistent paged LIST, of which only the pods the
//! datastore names are kept) or only the pods named by the entries of a
//! deleted pod (one consistent GET each), and the readiness of the nodes.

use std::collections::{BTreeSet, HashMap, HashSet};

use futures_util::{StreamExt, stream};
use serde::Deserialize;

use super::api::{Api, ApiError};
use super::pods::{Names, PodFacts, PodJson};
use super::verdict::PodView;
use crate::datastore::kubernetes::crd::escape;
use thereabouts_allocator::model::Claim;

const PODS_PAGE: u32 = 500;
/// Nodes per page: a real Node is 10 to 50 KB (its image list), and a page is
/// held whole while it is decoded.
const NODES_PAGE: u32 = 100;
/// Pod GETs of a delete pass in flight together (100 deleted pods: 100 GETs,
/// each a few ms, on the way to every free).
const GETS_AT_ONCE: usize = 16;

#[derive(Debug, Default)]
pub struct PodsAt {
    pods: HashMap<Box<str>, PodFacts>,
    ready: HashMap<String, bool>,
    names: Names,
    /// The IPAMClaims that exist (`namespace/name`), when they were read.
    ipam_claims: Option<HashSet<String>>,
    /// The ResourceClaims (by UID) that keep their devices' addresses, when
    /// they were read ([`super::resource_claims::Unreserved::read`]).
    pub resource_claims: Option<HashSet<String>>,
}

impl PodView for PodsAt {
    fn pod(&self, podref: &str) -> Option<&PodFacts> {
        self.pods.get(podref)
    }
    fn node_ready(&self, node: &str) -> Option<bool> {
        self.ready.get(node).copied()
    }
    fn claim_gone(&self, claim: &Claim) -> bool {
        match claim {
            Claim::IpamClaim(r) => self.ipam_claims.as_ref().is_some_and(|known| !known.contains(r)),
            Claim::ResourceClaim(uid) => self.resource_claims.as_ref().is_some_and(|live| !live.contains(uid)),
        }
    }
}

/// Every IPAMClaim of the cluster (`k8s.cni.cncf.io/v1alpha1`).
pub const IPAM_CLAIMS: &str = "/apis/k8s.cni.cncf.io/v1alpha1/ipamclaims";
const CLAIMS_PAGE: u32 = 500;

impl PodsAt {
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Reads which IPAMClaims exist, so that the entries of a deleted one
    /// are freed. Where the CRD is not installed (or the controller may not
    /// list claims), none is known and none is freed.
    pub async fn read_ipam_claims(&mut self, api: &Api) -> Result<(), ApiError> {
        #[derive(Deserialize)]
        struct ClaimJson {
            metadata: ClaimMeta,
        }
        #[derive(Deserialize)]
        struct ClaimMeta {
            #[serde(default)]
            namespace: String,
            #[serde(default)]
            name: String,
        }
        let mut known = HashSet::new();
        match api
            .list_pages::<ClaimJson>(IPAM_CLAIMS, CLAIMS_PAGE, |c| {
                known.insert(format!("{}/{}", c.metadata.namespace, c.metadata.name));
            })
            .await
        {
            Ok(()) => self.ipam_claims = Some(known),
            Err(e) if e.code() == Some(404) => self.ipam_claims = None,
            // An older controller.yaml: the claims' entries wait, the rest of the pass goes on.
            Err(e) if e.code() == Some(403) => {
                crate::logging::error(format!("controller: may not list IPAMClaims ({e}); their addresses are kept until deploy/controller.yaml is applied"));
                self.ipam_claims = None;
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Every pod of the cluster that `wanted` names (the podrefs the
    /// datastore holds): a pod without an entry or a reservation decides
    /// nothing, so its facts are dropped with its page. The LIST is still of
    /// whole pods: a verdict reads `status` (phase, container states) and
    /// `spec.nodeName`, which a metadata-only list does not carry.
    pub async fn all(api: &Api, wanted: &HashSet<&str>) -> Result<PodsAt, ApiError> {
        let mut at = PodsAt::default();
        // At most one per wanted podref: the map never grows by doubling past it.
        at.pods.reserve(wanted.len());
        api.list_pages::<PodJson>("/api/v1/pods", PODS_PAGE, |p| {
            let podref = p.podref();
            if wanted.contains(podref.as_str()) {
                let facts = p.facts(&mut at.names);
                at.pods.insert(podref.into_boxed_str(), facts);
            }
        })
        .await?;
        at.ready = nodes(api).await?;
        Ok(at)
    }

    /// The pods of `podrefs` (`namespace/name`) that exist, read
    /// [`GETS_AT_ONCE`] at a time, and the readiness of their nodes alone.
    pub async fn only(api: &Api, podrefs: &BTreeSet<String>) -> Result<PodsAt, ApiError> {
        let mut at = PodsAt::default();
        let gets = podrefs.iter().filter_map(|podref| podref.split_once('/').map(|(ns, name)| (podref, ns, name))).map(|(podref, namespace, name)| {
            let path = format!("/api/v1/namespaces/{}/pods/{}", escape(namespace), escape(name));
            async move {
                match api.get::<PodJson>(&path).await {
                    Ok(p) => Ok(Some((podref, p))),
                    Err(e) if e.code() == Some(404) => Ok(None),
                    Err(e) => Err(e),
                }
            }
        });
        let found: Vec<Result<Option<(&String, PodJson)>, ApiError>> = stream::iter(gets).buffer_unordered(GETS_AT_ONCE).collect().await;
        for got in found {
            if let Some((podref, p)) = got? {
                let facts = p.facts(&mut at.names);
                at.pods.insert(podref.as_str().into(), facts);
            }
        }
        let on: BTreeSet<&str> = at.pods.values().map(|p| &*p.node).filter(|n| !n.is_empty()).collect();
        for node in on {
            // A LIST of the one node: the controller may list nodes, not get them.
            let path = format!("/api/v1/nodes?fieldSelector=metadata.name%3D{}", escape(node));
            api.list_pages::<NodeJson>(&path, 1, |n| {
                let is_ready = n.is_ready();
                at.ready.insert(n.metadata.name, is_ready);
            })
            .await?;
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

impl NodeJson {
    fn is_ready(&self) -> bool {
        self.status.conditions.iter().any(|c| c.kind == "Ready" && c.status == "True")
    }
}

/// Each node's `Ready` condition (a Node's status is decoded for that alone:
/// its image list can be tens of KB).
async fn nodes(api: &Api) -> Result<HashMap<String, bool>, ApiError> {
    let mut ready = HashMap::new();
    api.list_pages::<NodeJson>("/api/v1/nodes", NODES_PAGE, |n| {
        let is_ready = n.is_ready();
        ready.insert(n.metadata.name, is_ready);
    })
    .await?;
    Ok(ready)
}
