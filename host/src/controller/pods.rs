//! What the reconciler needs to know about a Pod, and no more: a Pod read from
//! the apiserver is decoded straight into [`PodFacts`] (serde skips every other
//! field), so a pass keeps a couple of hundred bytes per pod instead of whole
//! objects. Node and interface names are shared ([`Names`]): 150 000 pods name
//! a few thousand nodes and a few interfaces.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use serde::Deserialize;

/// The annotation multus writes once a pod's networks are attached.
pub const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

/// One attachment as multus reports it in the network-status annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    pub interface: Arc<str>,
    pub ips: Box<[IpAddr]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub phase: Phase,
    /// `spec.nodeName`; empty while unscheduled.
    pub node: Arc<str>,
    /// When every container has terminated (the latest `finishedAt`, Unix
    /// seconds), or for a pod with no container status, its latest condition
    /// change; `None` while a container runs or nothing says when.
    pub finished_at: Option<i64>,
    /// The network-status annotation; `None` when missing or unreadable (an
    /// ADD may not have been reported yet).
    pub network_status: Option<Box<[Attached]>>,
}

/// One shared copy of each node and interface name a pass has seen.
#[derive(Debug, Default)]
pub struct Names(HashSet<Arc<str>>);

impl Names {
    pub fn shared(&mut self, name: &str) -> Arc<str> {
        if let Some(known) = self.0.get(name) {
            return known.clone();
        }
        let new: Arc<str> = name.into();
        self.0.insert(new.clone());
        new
    }
}

impl PodFacts {
    /// Every address the pod reports on `interface`, when it reports that interface.
    pub fn addresses_on(&self, interface: &str) -> Option<&[IpAddr]> {
        self.network_status.as_ref()?.iter().find(|a| &*a.interface == interface).map(|a| &a.ips[..])
    }

    /// Every address the pod reports, on any interface.
    pub fn all_addresses(&self) -> impl Iterator<Item = &IpAddr> {
        self.network_status.iter().flatten().flat_map(|a| a.ips.iter())
    }
}

/// A Pod as the apiserver sends it, reduced to the fields read here.
#[derive(Deserialize)]
pub struct PodJson {
    #[serde(default)]
    metadata: MetaJson,
    #[serde(default)]
    spec: SpecJson,
    #[serde(default)]
    status: StatusJson,
}

#[derive(Deserialize, Default)]
struct MetaJson {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default)]
struct SpecJson {
    #[serde(default, rename = "nodeName")]
    node_name: Option<String>,
}

#[derive(Deserialize, Default)]
struct StatusJson {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    conditions: Option<Vec<ConditionJson>>,
    #[serde(default, rename = "containerStatuses")]
    container_statuses: Option<Vec<ContainerStatusJson>>,
}

#[derive(Deserialize)]
struct ConditionJson {
    #[serde(default, rename = "lastTransitionTime")]
    last_transition_time: Option<String>,
}

#[derive(Deserialize)]
struct ContainerStatusJson {
    #[serde(default)]
    state: Option<StateJson>,
}

#[derive(Deserialize)]
struct StateJson {
    #[serde(default)]
    terminated: Option<TerminatedJson>,
}

#[derive(Deserialize)]
struct TerminatedJson {
    #[serde(default, rename = "finishedAt")]
    finished_at: Option<String>,
}

#[derive(Deserialize)]
struct NetworkStatusJson {
    #[serde(default)]
    interface: String,
    #[serde(default)]
    ips: Vec<String>,
}

impl PodJson {
    /// `namespace/name`, the podref the plugin records.
    pub fn podref(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    pub fn facts(&self, names: &mut Names) -> PodFacts {
        let phase = match self.status.phase.as_deref() {
            Some("Pending") => Phase::Pending,
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            _ => Phase::Unknown,
        };
        let network_status = self.metadata.annotations.as_ref().and_then(|a| a.get(NETWORK_STATUS)).and_then(|text| parse_network_status(text, names));
        PodFacts { phase, node: names.shared(self.spec.node_name.as_deref().unwrap_or_default()), finished_at: self.finished_at(), network_status }
    }

    fn finished_at(&self) -> Option<i64> {
        let statuses = self.status.container_statuses.as_deref().unwrap_or_default();
        if statuses.is_empty() {
            let conditions = self.status.conditions.as_deref().unwrap_or_default();
            return conditions.iter().filter_map(|c| c.last_transition_time.as_deref().and_then(unix_seconds)).max();
        }
        let mut latest = None;
        for status in statuses {
            let finished = status.state.as_ref()?.terminated.as_ref()?.finished_at.as_deref().and_then(unix_seconds)?;
            latest = latest.max(Some(finished));
        }
        latest
    }
}

/// Multus' annotation: a JSON list of `{"name", "interface", "ips", ...}`.
/// An entry without an interface is kept with an empty one.
pub fn parse_network_status(text: &str, names: &mut Names) -> Option<Box<[Attached]>> {
    let list: Vec<NetworkStatusJson> = serde_json::from_str(text).ok()?;
    Some(
        list.into_iter()
            .map(|n| Attached {
                interface: names.shared(&n.interface),
                ips: n.ips.iter().filter_map(|ip| thereabouts_allocator::ip::parse_ip_strict(ip)).collect(),
            })
            .collect(),
    )
}

/// An RFC 3339 time as the apiserver writes it (`2026-12-01T22:33:42Z`, UTC)
/// to Unix seconds.
pub fn unix_seconds(text: &str) -> Option<i64> {
    let (date, time) = text.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let time = time.trim_end_matches('Z');
    let time = time.split(['.', '+']).next()?;
    let mut t = time.split(':').map(|p| p.parse::<i64>().ok());
    let (h, min, s) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + min * 60 + s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(pod: serde_json::Value) -> PodFacts {
        serde_json::from_value::<PodJson>(pod).unwrap().facts(&mut Names::default())
    }

    #[test]
    fn times_read_as_the_apiserver_writes_them() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_seconds("2026-12-01T22:33:42Z"), Some(1_796_164_422));
        assert_eq!(unix_seconds("2024-02-29T00:00:01.5Z"), Some(1_709_164_801));
        assert_eq!(unix_seconds("yesterday"), None);
    }

    #[test]
    fn a_pod_reduces_to_what_the_reconciler_reads() {
        let status = r#"[{"name":"cbr0","interface":"eth0","ips":["10.0.0.5"],"default":true},
                         {"name":"default/blue","interface":"net1","ips":["192.0.2.7","2001:db8::7"]}]"#;
        let pod = facts(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "annotations": {NETWORK_STATUS: status, "other": "x"}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]},
        }));
        assert_eq!((pod.phase, &*pod.node, pod.finished_at), (Phase::Running, "node-1", None));
        assert_eq!(pod.addresses_on("net1").unwrap(), ["192.0.2.7".parse::<IpAddr>().unwrap(), "2001:db8::7".parse().unwrap()]);
        assert_eq!(pod.addresses_on("net2"), None);
        assert_eq!(pod.all_addresses().count(), 3);
    }

    #[test]
    fn a_pod_is_finished_when_every_container_has_terminated() {
        let terminated = |at: &str| serde_json::json!({"state": {"terminated": {"exitCode": 0, "finishedAt": at}}});
        let done = facts(
            serde_json::json!({"status": {"phase": "Succeeded", "containerStatuses": [terminated("1970-01-01T00:01:00Z"), terminated("1970-01-01T00:02:00Z")]}}),
        );
        assert_eq!((done.phase, done.finished_at), (Phase::Succeeded, Some(120)));
        let one_runs =
            facts(serde_json::json!({"status": {"phase": "Failed", "containerStatuses": [terminated("1970-01-01T00:01:00Z"), {"state": {"running": {}}}]}}));
        assert_eq!(one_runs.finished_at, None);
        let evicted =
            facts(serde_json::json!({"status": {"phase": "Failed", "conditions": [{"type": "Ready", "lastTransitionTime": "1970-01-01T00:00:30Z"}]}}));
        assert_eq!(evicted.finished_at, Some(30));
        assert_eq!(facts(serde_json::json!({})).phase, Phase::Unknown);
    }

    #[test]
    fn pods_on_one_node_share_its_name_and_their_interfaces_names() {
        let mut names = Names::default();
        let status = r#"[{"interface": "net1", "ips": ["192.0.2.7"]}]"#;
        let pod = |name: &str| serde_json::json!({"metadata": {"name": name, "annotations": {NETWORK_STATUS: status}}, "spec": {"nodeName": "node-1"}});
        let (a, b) = (serde_json::from_value::<PodJson>(pod("a")).unwrap(), serde_json::from_value::<PodJson>(pod("b")).unwrap());
        let (a, b) = (a.facts(&mut names), b.facts(&mut names));
        assert!(std::sync::Arc::ptr_eq(&a.node, &b.node));
        let interface = |p: &PodFacts| p.network_status.as_ref().unwrap()[0].interface.clone();
        assert!(std::sync::Arc::ptr_eq(&interface(&a), &interface(&b)));
    }

    #[test]
    fn an_unreadable_network_status_is_no_evidence() {
        let pod = facts(serde_json::json!({"metadata": {"annotations": {NETWORK_STATUS: "not json"}}}));
        assert_eq!(pod.network_status, None);
    }
}
