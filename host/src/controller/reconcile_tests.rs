//! A pass's conversation with the apiserver, pinned request by request
//! against a scripted server (`mock_api`): the read order (pools and
//! reservations, then pods and nodes), the Lease read before each batch of
//! writes, the guarded writes' exact bodies, and what a failed guard or a
//! lost Lease leaves unwritten.

use serde_json::{Value, json};

use super::lease_guard::WriteGuard;
use super::metrics::Metrics;
use super::reconcile::{Scope, rfc3339};
use crate::datastore::kubernetes::mock_api::{self, Answer, Log};

const POOLS: &str = "GET /apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/ippools?limit=4";
const ORIPS: &str = "GET /apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/overlappingrangeipreservations?limit=500";
const PODS: &str = "GET /api/v1/pods?limit=500";
const NODES: &str = "GET /api/v1/nodes?limit=100";
const LEASE: &str = "GET /apis/coordination.k8s.io/v1/namespaces/kube-system/leases/thereabouts-controller";
const PATCH: &str = "PATCH /apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/ippools/blue-192.0.2.0-24?fieldManager=thereabouts-controller";
const DELETE: &str = "DELETE /apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/overlappingrangeipreservations/blue-192.0.2.1";
const EVENT: &str = "POST /api/v1/namespaces/default/events";

fn list(items: Vec<Value>) -> Answer {
    Answer::Ok(json!({"metadata": {"resourceVersion": "9"}, "items": items}))
}

/// A pool holding `gone`'s address 192.0.2.1 and `live`'s 192.0.2.2, the
/// reservation of the first, `live` running and reporting its address.
fn reads() -> Vec<Answer> {
    let pool = json!({"metadata": {"name": "blue-192.0.2.0-24", "resourceVersion": "7"}, "spec": {"range": "192.0.2.0/24", "allocations": {
        "1": {"id": "c-gone", "podref": "default/gone", "ifname": "net1"},
        "2": {"id": "c-live", "podref": "default/live", "ifname": "net1"},
    }}});
    let orip = json!({"metadata": {"name": "blue-192.0.2.1", "uid": "u1", "resourceVersion": "5", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"podref": "default/gone", "ifname": "net1", "containerid": "c-gone"}});
    let status = r#"[{"name": "default/blue", "interface": "net1", "ips": ["192.0.2.2"]}]"#;
    let live = json!({"metadata": {"name": "live", "namespace": "default", "uid": "u", "annotations": {"k8s.v1.cni.cncf.io/network-status": status}},
        "spec": {"nodeName": "node-1"}, "status": {"phase": "Running"}});
    let node = json!({"metadata": {"name": "node-1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    vec![list(vec![pool]), list(vec![orip]), list(vec![live]), list(vec![node])]
}

fn lease(holder: &str) -> Answer {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    Answer::Ok(json!({"spec": {"holderIdentity": holder, "renewTime": rfc3339(now), "leaseDurationSeconds": 15}}))
}

async fn pass(script: Vec<Answer>) -> (anyhow::Result<super::reconcile::Report>, Log) {
    let (client, log, _) = mock_api::client("kube-system", script);
    let metrics = Metrics::new();
    let guard =
        WriteGuard::Lease { api: super::api::Api { client: client.clone(), metrics: metrics.clone() }, namespace: "kube-system".into(), identity: "me".into() };
    let store = super::kube_store(client.clone(), &metrics, "kube-system");
    let reconciler = super::reconciler(client, metrics, store, "me", guard, std::time::Duration::from_secs(60), std::time::Duration::ZERO);
    (reconciler.pass(&Scope::Full, false).await, log)
}

#[tokio::test(flavor = "current_thread")]
async fn a_pass_reads_then_frees_with_guarded_writes_after_the_lease_check() {
    let mut script = reads();
    script.extend([lease("me"), Answer::Ok(json!({})), lease("me"), Answer::Ok(json!({})), Answer::Ok(json!({}))]);
    let (report, log) = pass(script).await;
    assert_eq!(report.unwrap().entries.len(), 1);
    assert_eq!(log.lines(), [POOLS, ORIPS, PODS, NODES, LEASE, PATCH, LEASE, DELETE, EVENT]);
    assert_eq!(
        log.body(5),
        json!([{"op": "test", "path": "/spec/allocations/1/id", "value": "c-gone"}, {"op": "remove", "path": "/spec/allocations/1"}]),
        "only the gone pod's entry, only while it is still its container's"
    );
    assert_eq!(log.body(7)["preconditions"], json!({"uid": "u1", "resourceVersion": "5"}));
    assert_eq!(log.body(8)["reason"], "IPAddressGarbageCollected");
}

/// The LIST of the reservations labelled with `gone`'s attachment.
fn labelled() -> String {
    let label = crate::datastore::kubernetes::crd::attachment_label("c-gone", "net1");
    format!(
        "GET /apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/overlappingrangeipreservations?labelSelector=thereabouts.cni.dev%2Fattachment%20in%20%28{label}%29&limit=500"
    )
}

/// A reconciler on `script` that writes without a Lease check, and its log.
fn unguarded_reconciler(script: Vec<Answer>) -> (super::reconcile::Reconciler, Log) {
    let (client, log, _) = mock_api::client("kube-system", script);
    let metrics = Metrics::new();
    let store = super::kube_store(client.clone(), &metrics, "kube-system");
    (super::reconciler(client, metrics, store, "me", WriteGuard::Unguarded, std::time::Duration::from_secs(60), std::time::Duration::ZERO), log)
}

fn gone(pod: &str) -> Scope {
    Scope::Pods([pod.to_string()].into())
}

/// A LIST by name: the controller may list pools, not get them.
const POOL_BY_NAME: &str = "GET /apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/ippools?fieldSelector=metadata.name%3Dblue-192.0.2.0-24";

#[tokio::test(flavor = "current_thread")]
async fn a_delete_pass_reads_by_name_the_pools_its_pods_held_at_the_last_read_of_every_pool() {
    let (pool, orip) = (reads().remove(0), reads().remove(1));
    let mut script = reads();
    script.extend([pool, orip, Answer::Status(404, "not found", Value::Null)]);
    script.extend([list(vec![])]);
    let (reconciler, log) = unguarded_reconciler(script);

    reconciler.pass(&Scope::Full, true).await.unwrap();
    let report = reconciler.pass(&gone("default/gone"), true).await.unwrap();
    assert_eq!((report.entries.len(), report.reservations.len()), (1, 1));
    // A pod no pool held then: it may have an entry since, so every pool.
    reconciler.pass(&gone("default/new"), true).await.unwrap();
    assert_eq!(log.lines()[4..], [POOL_BY_NAME, &labelled(), "GET /api/v1/namespaces/default/pods/gone", POOLS]);
}

#[tokio::test(flavor = "current_thread")]
async fn with_the_pool_watch_in_step_a_delete_pass_reads_only_the_pools_the_watch_saw_its_pod_in() {
    let (watched, pool, orip) = (reads().remove(0), reads().remove(0), reads().remove(1));
    let script = vec![watched, Answer::Silent, pool, orip, Answer::Status(404, "not found", Value::Null)];
    let (reconciler, log) = unguarded_reconciler(script);
    let super::store::Store::Kube(kube) = &reconciler.store else { unreachable!() };
    super::pool_index::spawn_pool_watch(&reconciler.api.client, "kube-system", kube.pool_index.clone());
    for _ in 0..200 {
        if log.lines().len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(log.lines()[1].contains("ippools?") && log.lines()[1].contains("watch=true"), "{:?}", log.lines());

    // Made after the watch listed, without an entry: no pool to read.
    let report = reconciler.pass(&gone("default/new"), true).await.unwrap();
    assert_eq!((report.entries.len(), log.lines().len()), (0, 2));
    let report = reconciler.pass(&gone("default/gone"), true).await.unwrap();
    assert_eq!((report.entries.len(), report.reservations.len()), (1, 1));
    assert_eq!(log.lines()[2..], [POOL_BY_NAME, &labelled(), "GET /api/v1/namespaces/default/pods/gone"]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_delete_pass_reads_every_reservation_when_one_of_its_entries_has_no_labelled_one() {
    // whereabouts labels none of its reservations.
    let (pool, orip) = (reads().remove(0), reads().remove(1));
    let mut script = reads();
    script.extend([pool, list(vec![]), orip, Answer::Status(404, "not found", Value::Null)]);
    let (reconciler, log) = unguarded_reconciler(script);

    reconciler.pass(&Scope::Full, true).await.unwrap();
    let report = reconciler.pass(&gone("default/gone"), true).await.unwrap();
    assert_eq!((report.entries.len(), report.reservations.len()), (1, 1));
    assert_eq!(log.lines()[4..], [POOL_BY_NAME, &labelled(), ORIPS, "GET /api/v1/namespaces/default/pods/gone"]);
}

/// A pool holding one address of the IPAMClaim `default/vm.blue`, whose launcher pod is gone.
fn claim_pool() -> Answer {
    list(vec![json!({"metadata": {"name": "blue-192.0.2.0-24", "resourceVersion": "7"}, "spec": {"range": "192.0.2.0/24", "allocations": {
        "1": {"id": "c-gone", "podref": "default/gone", "ifname": "net1", "ipamclaimref": "default/vm.blue"}}}})])
}

const CLAIMS: &str = "GET /apis/k8s.cni.cncf.io/v1alpha1/ipamclaims?limit=500";

#[tokio::test(flavor = "current_thread")]
async fn a_claims_address_is_freed_when_the_claim_is_gone_not_when_its_pod_is() {
    let claim = json!({"metadata": {"namespace": "default", "name": "vm.blue"}});
    let (reconciler, log) = unguarded_reconciler(vec![claim_pool(), list(vec![]), list(vec![]), list(vec![]), list(vec![claim])]);
    assert_eq!(reconciler.pass(&Scope::Full, true).await.unwrap().entries.len(), 0);
    assert_eq!(log.lines(), [POOLS, ORIPS, PODS, NODES, CLAIMS]);
    let (reconciler, _) = unguarded_reconciler(vec![claim_pool(), list(vec![]), list(vec![]), list(vec![]), list(vec![])]);
    let report = reconciler.pass(&Scope::Full, true).await.unwrap();
    assert_eq!(report.entries.iter().map(|(_, why)| *why).collect::<Vec<_>>(), [super::verdict::Reason::ClaimGone]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_controller_that_may_not_list_claims_keeps_their_addresses_and_ends_its_pass() {
    let forbidden = Answer::Status(403, "ipamclaims is forbidden", Value::Null);
    let (reconciler, _) = unguarded_reconciler(vec![claim_pool(), list(vec![]), list(vec![]), list(vec![]), forbidden]);
    assert_eq!(reconciler.pass(&Scope::Full, true).await.unwrap().entries.len(), 0);
}

/// A pool holding the address of a DRA device (`eth1`) of the ResourceClaim with UID `rc-1`; no pod.
fn device_pool() -> Answer {
    list(vec![json!({"metadata": {"name": "blue-192.0.2.0-24", "resourceVersion": "7"}, "spec": {"range": "192.0.2.0/24", "allocations": {
        "1": {"id": "rc-1", "podref": "", "ifname": "eth1", "resourceclaimref": "rc-1"}}}})])
}

const RESOURCE_CLAIMS: &str = "GET /apis/resource.k8s.io/v1/resourceclaims?limit=500";

#[tokio::test(flavor = "current_thread")]
async fn a_devices_address_stays_while_its_claim_is_reserved_and_goes_with_the_claim() {
    let reserved = json!({"metadata": {"uid": "rc-1"}, "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}]}});
    let (reconciler, log) = unguarded_reconciler(vec![device_pool(), list(vec![]), list(vec![]), list(vec![]), list(vec![reserved])]);
    let report = reconciler.pass(&Scope::Full, true).await.unwrap();
    assert_eq!((report.entries.len(), report.without_podref.len()), (0, 0), "no pod rule touches it");
    assert_eq!(log.lines(), [POOLS, ORIPS, PODS, NODES, RESOURCE_CLAIMS]);
    let (reconciler, _) = unguarded_reconciler(vec![device_pool(), list(vec![]), list(vec![]), list(vec![]), list(vec![])]);
    let report = reconciler.pass(&Scope::Full, true).await.unwrap();
    assert_eq!(report.entries.iter().map(|(_, why)| *why).collect::<Vec<_>>(), [super::verdict::Reason::ClaimGone]);
}

#[tokio::test(flavor = "current_thread")]
async fn where_dra_is_not_served_a_devices_address_is_kept() {
    let not_served = Answer::Status(404, "the server could not find the requested resource", Value::Null);
    let (reconciler, _) = unguarded_reconciler(vec![device_pool(), list(vec![]), list(vec![]), list(vec![]), not_served]);
    assert_eq!(reconciler.pass(&Scope::Full, true).await.unwrap().entries.len(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn an_entry_taken_over_meanwhile_keeps_its_reservation_and_gets_no_event() {
    let mut script = reads();
    script.extend([lease("me"), Answer::Status(422, "the server rejected our request due to an error in our request", Value::Null)]);
    let (report, log) = pass(script).await;
    let report = report.unwrap();
    assert_eq!((report.entries.len(), report.reservations.len(), report.changed_meanwhile), (0, 0, 1));
    assert_eq!(log.lines(), [POOLS, ORIPS, PODS, NODES, LEASE, PATCH]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_replica_that_does_not_hold_the_lease_writes_nothing() {
    let mut script = reads();
    script.push(lease("other"));
    let (report, log) = pass(script).await;
    assert!(format!("{:#}", report.unwrap_err()).contains("held by \"other\""));
    assert_eq!(log.lines(), [POOLS, ORIPS, PODS, NODES, LEASE]);
}

/// What kube's watcher asks for when its objects are `PartialObjectMeta`.
const METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
const METADATA: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

#[tokio::test(flavor = "current_thread")]
async fn the_pod_watch_lists_and_watches_metadata_only() {
    let script = vec![list(vec![]), Answer::Silent];
    let (client, log, _) = mock_api::client("kube-system", script);
    let (events, _events) = tokio::sync::mpsc::unbounded_channel();
    super::spawn_pod_watch(&client, events);
    for _ in 0..200 {
        if log.sent().len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let sent: Vec<(String, String)> = log.sent().into_iter().map(|s| (s.line.split('?').next().unwrap_or_default().to_string(), s.accept)).collect();
    assert_eq!(sent, [("GET /api/v1/pods".to_string(), METADATA_LIST.to_string()), ("GET /api/v1/pods".to_string(), METADATA.to_string())]);
    assert!(log.lines()[1].contains("watch=true"), "the second request is the watch: {:?}", log.lines());
}

#[tokio::test(flavor = "current_thread")]
async fn the_node_watch_lists_and_watches_metadata_only() {
    // Three watchers, each a LIST then a WATCH, in an order the test does not
    // fix: every answer is an empty list (a WATCH reads it as a failed stream
    // and backs off, after its request was seen). Only the Node ones are pinned.
    let script = (0..6).map(|_| list(vec![])).collect();
    let (client, log, _) = mock_api::client("kube-system", script);
    let (trigger, _triggered) = tokio::sync::mpsc::channel(1);
    super::spawn_watchers(&client, "kube-system", trigger);
    for _ in 0..200 {
        if log.sent().len() >= 6 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let nodes: Vec<String> = log.sent().into_iter().filter(|s| s.line.starts_with("GET /api/v1/nodes")).map(|s| s.accept).collect();
    assert_eq!(nodes, [METADATA_LIST, METADATA]);
}

/// A node-slice pass with nothing to do.
struct NoSlices;

impl super::NodeSlicePass for NoSlices {
    async fn run(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

fn options() -> super::Options {
    let secs = std::time::Duration::from_secs;
    super::Options {
        kubeconfig: None,
        namespace: "kube-system".into(),
        identity: "me".into(),
        lease_seconds: 15,
        resync: secs(30),
        cool_down: secs(150),
        slice_objects: false,
        reconcile_interval: secs(300),
        completed_grace: secs(60),
        unbacked_grace: secs(90),
        unreserved_grace: secs(120),
        etcd_configs: vec![],
        metrics_address: String::new(),
        once: false,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_deleted_pod_is_freed_while_a_full_pass_is_in_progress() {
    // The full pass's first read never answers; the delete pass reads every
    // pool (there was no full read yet), the labelled reservation, the pod.
    let (pool, orip) = (reads().remove(0), reads().remove(1));
    let done = || Answer::Ok(json!({}));
    let script = vec![Answer::Silent, pool, orip, Answer::Status(404, "not found", Value::Null), done(), done(), done()];
    let (reconciler, log) = unguarded_reconciler(script);
    let (reconcilers, metrics) = ([reconciler], Metrics::new());
    let (_watchers, mut triggered) = tokio::sync::mpsc::channel(1);
    let (events, mut pod_events) = tokio::sync::mpsc::unbounded_channel();
    events.send(super::PodEvent::Deleted("default/gone".into())).unwrap();

    let freed = async {
        while !log.lines().iter().any(|l| l == PATCH) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    let (mut slices, options) = (NoSlices, options());
    tokio::select! {
        outcome = super::lead(&mut slices, &reconcilers, &mut triggered, &mut pod_events, &metrics, &options) => panic!("the loops ended: {outcome:?}"),
        waited = tokio::time::timeout(std::time::Duration::from_secs(10), freed) => waited.expect("the delete waited for the full pass"),
    }
    assert_eq!(log.lines()[..2], [POOLS, POOLS], "the full pass's read was first, and is still unanswered");
}

#[test]
fn deletes_that_come_with_a_pod_watch_relist_are_still_freed_at_once() {
    let (queue, mut queued) = tokio::sync::mpsc::unbounded_channel();
    queue.send(super::PodEvent::Relisted).unwrap();
    queue.send(super::PodEvent::Deleted("default/b".into())).unwrap();
    let (pods, relisted, _) = super::collect_deletes(super::PodEvent::Deleted("default/a".into()), &mut queued);
    assert_eq!((pods.into_iter().collect::<Vec<_>>(), relisted), (vec!["default/a".to_string(), "default/b".to_string()], true));
}
