//! The IPAMClaim an ADD allocates for, on a network with `allowPersistentIPs`
//! (KubeVirt's persistent IPs; `docs/claims.md`).
//!
//! Multus does not hand a network-selection element's `ipam-claim-reference`
//! to the delegate (its own element type has no such field), so the claim is
//! found, in this order:
//! 1. in stdin, `args.cni["ipam-claim-reference"]` (an element's `cni-args`)
//!    or a top-level `ipam-claim-reference` (the engine reads both);
//! 2. in the pod's `k8s.v1.cni.cncf.io/networks` annotation, which KubeVirt's
//!    ipam-extensions fills: the element whose `interface` is CNI_IFNAME, else
//!    the element Multus names CNI_IFNAME by position (`net<n>`), else the one
//!    element that names a claim.
//!
//! A claim lives in its pod's namespace: a reference to another is refused.

use std::time::Instant;

use serde_json::Value;
use thereabouts_allocator::model::{Claim, NormalizedConfig};

use super::error::{CniError, code};
use crate::datastore::kubernetes::KubernetesStore;
use crate::datastore::kubernetes::ipam_claims::{IpamClaimState, status_patch};

/// Multus' network-selection annotation.
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
const REFERENCE_KEY: &str = "ipam-claim-reference";

/// The claim an ADD allocates for, and what it holds.
#[derive(Debug, Clone)]
pub struct ClaimedAdd {
    pub namespace: String,
    pub name: String,
    pub pod: String,
    pub state: IpamClaimState,
}

impl ClaimedAdd {
    pub fn claim(&self) -> Claim {
        Claim::IpamClaim(format!("{}/{}", self.namespace, self.name))
    }

    /// The addresses its `status.ips` names (those that parse).
    pub fn addresses(&self) -> Vec<std::net::IpAddr> {
        self.state.ips.iter().filter_map(|t| t.split_once('/').map_or(t.as_str(), |(ip, _)| ip).parse().ok()).collect()
    }
}

/// The claim reference of the pod's network-selection element for `ifname`.
pub fn reference_in_networks(annotation: &str, ifname: &str) -> Option<String> {
    let Ok(Value::Array(elements)) = serde_json::from_str::<Value>(annotation.trim()) else { return None };
    let reference = |e: &Value| e.get(REFERENCE_KEY).and_then(Value::as_str).filter(|r| !r.is_empty()).map(str::to_string);
    let interface = |e: &Value| e.get("interface").and_then(Value::as_str).filter(|i| !i.is_empty()).map(str::to_string);
    if let Some(e) = elements.iter().find(|e| interface(e).as_deref() == Some(ifname)) {
        return reference(e);
    }
    // Multus names an element without `interface` net<position>, from net1.
    let by_position = elements.iter().enumerate().find(|(i, e)| interface(e).is_none() && format!("net{}", i + 1) == ifname).map(|(_, e)| e);
    if let Some(e) = by_position {
        return reference(e);
    }
    let mut claiming = elements.iter().filter_map(reference);
    match (claiming.next(), claiming.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

/// `namespace/name` of the claim `reference` names for a pod of `pod_namespace`.
pub fn claim_name(reference: &str, pod_namespace: &str) -> Result<(String, String), CniError> {
    let (namespace, name) = reference.split_once('/').unwrap_or((pod_namespace, reference));
    if namespace != pod_namespace {
        return Err(CniError::new(code::INVALID_CONFIG, format!("IPAMClaim {reference} is in namespace {namespace}, not the pod's ({pod_namespace})"))
            .with_details(format!("field: {REFERENCE_KEY}")));
    }
    Ok((namespace.to_string(), name.to_string()))
}

/// The claim of this ADD, read; `None` when the pod names none for `ifname`.
pub fn read(
    store: &KubernetesStore,
    config: &NormalizedConfig,
    ifname: &str,
    annotations: &[(String, String)],
    deadline: Instant,
) -> Result<Option<ClaimedAdd>, CniError> {
    let (pod_namespace, pod) = config.pod_ref.split_once('/').unwrap_or(("", ""));
    let from_pod = || annotations.iter().find(|(k, _)| k == NETWORKS_ANNOTATION).and_then(|(_, v)| reference_in_networks(v, ifname));
    let Some(reference) = config.ipam_claim_reference.clone().or_else(from_pod) else { return Ok(None) };
    if pod.is_empty() {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("IPAMClaim {reference} needs the pod's name: CNI_ARGS has no K8S_POD_NAMESPACE and K8S_POD_NAME"),
        ));
    }
    let (namespace, name) = claim_name(&reference, pod_namespace)?;
    match store.ipam_claim(&namespace, &name, deadline)? {
        Some(state) => Ok(Some(ClaimedAdd { namespace, name, pod: pod.to_string(), state })),
        // Made before the pod by whoever asked for it: the runtime tries again.
        None => Err(CniError::new(code::TRY_AGAIN_LATER, format!("IPAMClaim {namespace}/{name}, named for interface {ifname} of pod {pod}, does not exist"))),
    }
}

/// The config with the claim's `status.ips` as requested addresses, by the
/// engine's rule for every requested address: a claim whose addresses are set
/// gets exactly those (its entries are kept as the pod's are; this covers a
/// pool that lost them).
pub fn with_claim_ips(config: &NormalizedConfig, claimed: &ClaimedAdd) -> Result<NormalizedConfig, CniError> {
    let mut config = config.clone();
    for (i, text) in claimed.state.ips.iter().enumerate() {
        let field = format!("IPAMClaim {}/{} status.ips[{i}]", claimed.namespace, claimed.name);
        thereabouts_allocator::config::request_address(&mut config.ranges, &field, text)?;
    }
    Ok(config)
}

/// Records the outcome in the claim's status: its addresses (when it had
/// none), the pod now holding them, and a condition; or the failure.
pub fn record(store: &KubernetesStore, claimed: &ClaimedAdd, outcome: Result<&[String], &str>, deadline: Instant) -> Result<(), CniError> {
    let now = crate::controller::reconcile::rfc3339(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()));
    let patch = match outcome {
        Ok(addresses) => status_patch(claimed.state.ips.is_empty().then_some(addresses), &claimed.pod, None, &now),
        Err(error) => status_patch(None, &claimed.pod, Some(error), &now),
    };
    store.patch_ipam_claim_status(&claimed.namespace, &claimed.name, &patch, deadline).map_err(CniError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBEVIRT: &str =
        r#"[{"name":"blue","namespace":"default","ipam-claim-reference":"vm-a.blue"},{"name":"red","interface":"data","ipam-claim-reference":"vm-a.red"}]"#;

    #[test]
    fn the_element_of_the_interface_names_the_claim() {
        assert_eq!(reference_in_networks(KUBEVIRT, "data").as_deref(), Some("vm-a.red"));
        assert_eq!(reference_in_networks(KUBEVIRT, "net1").as_deref(), Some("vm-a.blue"), "net<position>, as Multus names it");
        assert_eq!(reference_in_networks(KUBEVIRT, "net9"), None, "two claims, none for this interface");
        assert_eq!(reference_in_networks(r#"[{"name":"blue","ipam-claim-reference":"c"}]"#, "eth7").as_deref(), Some("c"));
        assert_eq!(reference_in_networks("blue,red", "net1"), None, "the short form names no claim");
    }

    #[test]
    fn an_add_reads_its_claim_then_writes_only_the_claims_status() {
        use crate::datastore::kubernetes::mock_api::{Answer, store};
        use serde_json::json;
        let claim = json!({"metadata": {"name": "vm-a.blue"}, "status": {"ips": ["192.0.2.5/24"], "ownerPod": {"name": "launcher-1"}}});
        let (store, log, _) = store("kube-system", vec![Answer::Ok(claim), Answer::Ok(json!({}))]);
        let stdin = r#"{"cniVersion":"1.0.0","name":"blue","allowPersistentIPs":true,"ipam":{"type":"thereabouts","range":"192.0.2.0/24"}}"#;
        let config = thereabouts_allocator::config::normalize(stdin, None, "K8S_POD_NAMESPACE=vms;K8S_POD_NAME=launcher-2").unwrap();
        let annotations = [(NETWORKS_ANNOTATION.to_string(), r#"[{"name":"blue","ipam-claim-reference":"vm-a.blue"}]"#.to_string())];
        let deadline = Instant::now() + std::time::Duration::from_secs(5);

        let claimed = read(&store, &config, "net1", &annotations, deadline).unwrap().unwrap();
        assert_eq!(claimed.addresses(), ["192.0.2.5".parse::<std::net::IpAddr>().unwrap()]);
        record(&store, &claimed, Ok(&["192.0.2.5/24".to_string()]), deadline).unwrap();
        let claim_path = "/apis/k8s.cni.cncf.io/v1alpha1/namespaces/vms/ipamclaims/vm-a.blue";
        assert_eq!(log.lines(), [format!("GET {claim_path}"), format!("PATCH {claim_path}/status")]);
        let status = &log.body(1)["status"];
        assert_eq!((status.get("ips"), &status["ownerPod"]), (None, &json!({"name": "launcher-2"})), "its addresses were set: kept as they are");
    }

    #[test]
    fn a_claims_addresses_become_requests_by_the_engines_rule() {
        let stdin = r#"{"cniVersion":"1.0.0","name":"blue","ipam":{"type":"thereabouts","ipRanges":[{"range":"192.0.2.0/24"},{"range":"2001:db8::/64"}]}}"#;
        let config = thereabouts_allocator::config::normalize(stdin, None, "").unwrap();
        let claimed = |ips: &[&str]| ClaimedAdd {
            namespace: "vms".into(),
            name: "vm-a.blue".into(),
            pod: "launcher".into(),
            state: IpamClaimState { ips: ips.iter().map(|s| s.to_string()).collect(), ..IpamClaimState::default() },
        };
        let requested = |c: &NormalizedConfig| c.ranges.iter().map(|r| r.requested.clone()).collect::<Vec<_>>();
        let placed = with_claim_ips(&config, &claimed(&["2001:db8::7/64", "192.0.2.9/24"])).unwrap();
        assert_eq!(requested(&placed), [Some("192.0.2.9".into()), Some("2001:db8::7".into())]);
        let outside = with_claim_ips(&config, &claimed(&["198.51.100.1/24"])).unwrap_err();
        assert_eq!((outside.code, outside.details.as_str()), (code::INVALID_CONFIG, "field: IPAMClaim vms/vm-a.blue status.ips[0]"));
        // A range asked for twice: the runtime's request and the claim's.
        let mut asked = config.clone();
        asked.ranges[0].requested = Some("192.0.2.3".into());
        assert!(with_claim_ips(&asked, &claimed(&["192.0.2.9/24"])).is_err());
    }

    #[test]
    fn a_claim_in_another_namespace_is_refused() {
        assert_eq!(claim_name("c", "ns").unwrap(), ("ns".to_string(), "c".to_string()));
        assert_eq!(claim_name("ns/c", "ns").unwrap(), ("ns".to_string(), "c".to_string()));
        let refused = claim_name("other/c", "ns").unwrap_err();
        assert_eq!((refused.code, refused.details.as_str()), (code::INVALID_CONFIG, "field: ipam-claim-reference"));
    }
}
