//! `IPAMClaim`s (`k8s.cni.cncf.io/v1alpha1`, k8snetworkplumbingwg/ipamclaims)
//! as the plugin reads and writes them: one GET of the claim an ADD allocates
//! for, and merge patches of its `status` subresource (`ips`, `ownerPod`,
//! `conditions`). The plugin's RBAC grants `get` on `ipamclaims` and `patch`
//! on `ipamclaims/status`, nothing more.

use std::time::Instant;

use http::Method;
use serde_json::{Value, json};

use super::{JSON_MERGE_PATCH, KubernetesStore, Reply, crd};
use crate::datastore::DatastoreError;

/// What an ADD needs of a claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpamClaimState {
    /// `status.ips` as written (CIDR or bare addresses); empty when unset.
    pub ips: Vec<String>,
    /// `status.ownerPod.name`.
    pub owner_pod: String,
}

/// The path of claim `name` in `namespace`, or of its status subresource.
pub fn claim_path(namespace: &str, name: &str, status: bool) -> String {
    let sub = if status { "/status" } else { "" };
    format!("/apis/k8s.cni.cncf.io/v1alpha1/namespaces/{}/ipamclaims/{}{sub}", crd::escape(namespace), crd::escape(name))
}

/// The state of a claim object as the apiserver returns it (the engine's
/// reading, shared with `preview --from-objects`).
pub fn parse_claim(object: &Value) -> IpamClaimState {
    let status = thereabouts_allocator::objects::ipam_claim_status(object);
    IpamClaimState { ips: status.ips, owner_pod: status.owner_pod }
}

/// A `status` merge patch: `ips` when given, `ownerPod`, and one condition
/// `IPsAllocated` (True with `reason` `Allocated`, or False with the error).
pub fn status_patch(ips: Option<&[String]>, owner_pod: &str, failure: Option<&str>, now_rfc3339: &str) -> Value {
    let (status, reason, message) = match failure {
        None => ("True", "Allocated", format!("addresses held by pod {owner_pod}")),
        Some(error) => ("False", "AllocationFailed", error.to_string()),
    };
    let condition = json!({"type": "IPsAllocated", "status": status, "reason": reason, "message": message, "lastTransitionTime": now_rfc3339});
    let mut patch = json!({"status": {"conditions": [condition]}});
    if failure.is_none() {
        patch["status"]["ownerPod"] = json!({"name": owner_pod});
    }
    if let Some(ips) = ips {
        patch["status"]["ips"] = json!(ips);
    }
    patch
}

impl KubernetesStore {
    /// The claim `namespace/name`; `None` when there is no such claim.
    pub fn ipam_claim(&self, namespace: &str, name: &str, deadline: Instant) -> Result<Option<IpamClaimState>, DatastoreError> {
        let action = format!("reading IPAMClaim {namespace}/{name}");
        match self.call(Method::GET, &claim_path(namespace, name, false), None, &action, deadline)? {
            Reply::Object(object) => Ok(Some(parse_claim(&object))),
            Reply::Status(status) if status.code == 404 => Ok(None),
            Reply::Status(status) => Err(self.status_error(&status, &action)),
        }
    }

    /// Merges `patch` into the claim's `status` subresource.
    pub fn patch_ipam_claim_status(&self, namespace: &str, name: &str, patch: &Value, deadline: Instant) -> Result<(), DatastoreError> {
        let action = format!("writing the status of IPAMClaim {namespace}/{name}");
        match self.call(Method::PATCH, &claim_path(namespace, name, true), Some((JSON_MERGE_PATCH, patch)), &action, deadline)? {
            Reply::Object(_) => Ok(()),
            Reply::Status(status) => Err(self.status_error(&status, &action)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_reads_its_ips_and_owner_pod_and_nothing_else() {
        let object = json!({"spec": {"network": "blue", "interface": ""}, "status": {"ips": ["192.0.2.5/24", "2001:db8::5/64"], "ownerPod": {"name": "virt-launcher-a"}}});
        assert_eq!(parse_claim(&object), IpamClaimState { ips: vec!["192.0.2.5/24".into(), "2001:db8::5/64".into()], owner_pod: "virt-launcher-a".into() });
        assert_eq!(parse_claim(&json!({"spec": {}})), IpamClaimState::default());
    }

    #[test]
    fn a_failure_writes_a_false_condition_and_keeps_the_owner() {
        let patch = status_patch(None, "p", Some("range exhausted"), "2026-12-04T00:00:00Z");
        assert_eq!(patch["status"]["conditions"][0]["status"], "False");
        assert!(patch["status"].get("ownerPod").is_none() && patch["status"].get("ips").is_none());
        let ips = ["192.0.2.5/24".to_string()];
        let patch = status_patch(Some(&ips), "p", None, "2026-12-04T00:00:00Z");
        assert_eq!(patch["status"]["ips"], json!(["192.0.2.5/24"]));
        assert_eq!(patch["status"]["ownerPod"], json!({"name": "p"}));
    }
}
