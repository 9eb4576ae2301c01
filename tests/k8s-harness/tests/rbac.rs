//! `deploy/` against the real kube-apiserver:
//!
//! * `rbac_yaml_grants_exactly_what_the_plugin_needs`: the plugin identity
//!   (ServiceAccount `kube-system/thereabouts`) starts with no rights (the harness
//!   grants none); after `deploy/rbac.yaml` alone it can send every request the
//!   Kubernetes datastore sends (IPPool get/list/create/JSON patch; ORIP
//!   create/get/list/delete) in kube-system, and gets 403 for everything else: other
//!   verbs on the same kinds (PUT, delete and watch pools; patch, watch and PUT
//!   reservations; deletecollection), the same kinds in other namespaces, secrets,
//!   namespaces, pods, nodes, CRDs, RBAC objects; Leases (turn tickets) only to
//!   create, list, watch, patch and delete in kube-system.
//!   The kubeconfig written by `deploy/install-cni.sh` from the plugin's token and
//!   the cluster CA authenticates against the apiserver and lands in kube-system.
//! * `rbac_pod_labels_yaml_grants_get_on_pods_and_nothing_more`: the opt-in
//!   `rbac-pod-labels.yaml` (for policies that read a pod's labels or
//!   annotations) adds exactly `get` on pods, in every namespace: listing,
//!   watching and changing pods, their subresources (status, log) and
//!   everything `rbac.yaml` refuses stay refused. (That a label policy's ADD
//!   fails without it and succeeds with it: tests/policies.rs.)
//! * `manifests_pass_strict_server_side_validation`: every object of `rbac.yaml`,
//!   `rbac-pod-labels.yaml`, `flowcontrol.yaml` and `daemonset.yaml` is accepted by a
//!   server-side apply with strict field validation (an unknown or misplaced field
//!   fails), the DaemonSet is stored, and its mounts, environment and ServiceAccount
//!   agree with the installer script and the RBAC manifests.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::{Value, json};
use thereabouts_k8s_harness::{Cluster, FIELD_MANAGER, NAMESPACE, deploy_dir, split_yaml};

const GROUP: &str = "whereabouts.cni.cncf.io";
const PLUGIN_USER: &str = "system:serviceaccount:kube-system:thereabouts";

fn ippools() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1alpha1", "IPPool"), "ippools")
}

fn orips() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1alpha1", "OverlappingRangeIPReservation"), "overlappingrangeipreservations")
}

fn pool(name: &str, range: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"range": range, "allocations": {}}
    }))
    .unwrap()
}

fn orip(name: &str, pod: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "OverlappingRangeIPReservation",
        "metadata": {"name": name},
        "spec": {"podref": pod, "ifname": "net1", "containerid": "c0ffee"}
    }))
    .unwrap()
}

/// Panics unless `result` is the apiserver's 403 for the plugin identity.
#[track_caller]
fn forbidden<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => assert!(s.message.contains(PLUGIN_USER), "{what}: 403 for another user? {}", s.message),
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    }
}

#[track_caller]
fn allowed<T>(what: &str, result: Result<T, kube::Error>) -> T {
    result.unwrap_or_else(|e| panic!("{what}: expected success, got {e:?}"))
}

/// Does a SubjectAccessReview (evaluated by the apiserver's real authorizer) allow
/// the ServiceAccount `user` to `verb` `group`/`resource` in `namespace` (None =
/// all namespaces / cluster scope)?
async fn may(admin: &kube::Client, user: &str, verb: &str, group: &str, resource: &str, namespace: Option<&str>) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(vec!["system:serviceaccounts".into(), "system:serviceaccounts:kube-system".into(), "system:authenticated".into()]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                namespace: namespace.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(admin.clone());
    let answer = api.create(&PostParams::default(), &review).await.unwrap();
    answer.status.unwrap().allowed
}

fn install_script() -> PathBuf {
    deploy_dir().join("install-cni.sh")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_yaml_grants_exactly_what_the_plugin_needs() {
    let cluster = Cluster::start().expect("starting etcd + kube-apiserver");
    cluster.install_crds().await.expect("installing deploy/crds");
    let admin = cluster.admin_client().await.unwrap();
    let plugin = cluster.plugin_client().await.unwrap();
    let pools = Api::<DynamicObject>::namespaced_with(plugin.clone(), NAMESPACE, &ippools());
    let reservations = Api::<DynamicObject>::namespaced_with(plugin.clone(), NAMESPACE, &orips());

    // Before deploy/rbac.yaml the plugin identity can do nothing: every right it
    // shows below comes from that file alone.
    forbidden("get IPPool before rbac.yaml", pools.get("192.0.2.0-24").await);
    forbidden("list IPPools before rbac.yaml", pools.list(&ListParams::default()).await);
    forbidden("create ORIP before rbac.yaml", reservations.create(&PostParams::default(), &orip("192.0.2.9", "default/p")).await);

    cluster.install_rbac().await.expect("applying deploy/rbac.yaml");

    // ---- kube-system: the plugin's own namespace. Every request the Kubernetes
    // datastore sends (host/src/datastore/kubernetes) succeeds.
    // IPPool: create (first use of a range), get, list with limit=1 (STATUS), JSON
    // patch led by a resourceVersion test (commit and rollback, whereabouts' form).
    let created = allowed("create IPPool", pools.create(&PostParams::default(), &pool("192.0.2.0-24", "192.0.2.0/24")).await);
    let rv = created.metadata.resource_version.clone().unwrap();
    let read = allowed("get IPPool", pools.get("192.0.2.0-24").await);
    let list = allowed("list IPPools (limit=1)", pools.list(&ListParams::default().limit(1)).await);
    assert_eq!(list.items.len(), 1);
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "test", "path": "/spec/allocations/1", "value": null},
        {"op": "add", "path": "/spec/allocations/1",
         "value": {"id": "c0ffee", "podref": "default/pod-a", "ifname": "net1"}}
    ]))
    .unwrap();
    let patched = allowed("JSON-patch IPPool", pools.patch("192.0.2.0-24", &PatchParams::default(), &Patch::Json::<()>(patch.clone())).await);
    assert_eq!(patched.data["spec"]["allocations"]["1"]["id"], "c0ffee");
    // The same patch again: the resourceVersion moved, so the apiserver answers
    // 422 (the conflict the datastore retries on), not 403.
    match pools.patch("192.0.2.0-24", &PatchParams::default(), &Patch::Json::<()>(patch)).await {
        Err(kube::Error::Api(s)) if s.code == 422 => {}
        other => panic!("stale JSON patch: expected 422, got {other:?}"),
    }
    // Not needed by the plugin, so not granted.
    forbidden("PUT IPPool", pools.replace("192.0.2.0-24", &PostParams::default(), &read).await);
    forbidden("delete IPPool", pools.delete("192.0.2.0-24", &DeleteParams::default()).await);
    forbidden("delete all IPPools", pools.delete_collection(&DeleteParams::default(), &ListParams::default()).await);
    forbidden("watch IPPools", pools.watch(&WatchParams::default(), "0").await.map(|_| ()));

    // ORIP: create, get (who holds it), delete with a UID precondition.
    let reserved = allowed("create ORIP", reservations.create(&PostParams::default(), &orip("192.0.2.1", "default/pod-a")).await);
    let got = allowed("get ORIP", reservations.get("192.0.2.1").await);
    assert_eq!(got.data["spec"]["podref"], "default/pod-a");
    // DEL lists the reservations labelled with its attachment.
    allowed("list ORIPs by label", reservations.list(&ListParams::default().labels("thereabouts.cni.dev/attachment=0123456789abcdef")).await);
    forbidden("merge-patch ORIP", reservations.patch("192.0.2.1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"containerid": "f00d"}}))).await);
    forbidden("PUT ORIP", reservations.replace("192.0.2.1", &PostParams::default(), &got).await);
    forbidden("delete all ORIPs", reservations.delete_collection(&DeleteParams::default(), &ListParams::default()).await);
    forbidden("watch ORIPs", reservations.watch(&WatchParams::default(), "0").await.map(|_| ()));
    allowed(
        "delete ORIP (UID precondition)",
        reservations
            .delete(
                "192.0.2.1",
                &DeleteParams {
                    preconditions: Some(kube::api::Preconditions { uid: reserved.metadata.uid.clone(), resource_version: None }),
                    ..Default::default()
                },
            )
            .await,
    );

    // ---- Other namespaces: nothing, not even reading. Objects exist there (made
    // by the admin), so a 403 cannot be mistaken for a 404.
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "tenant-a"}})).unwrap())
        .await
        .expect("admin creates namespace tenant-a");
    for ns in ["default", "tenant-a"] {
        Api::<DynamicObject>::namespaced_with(admin.clone(), ns, &ippools())
            .create(&PostParams::default(), &pool("198.51.100.0-24", "198.51.100.0/24"))
            .await
            .unwrap();
        Api::<DynamicObject>::namespaced_with(admin.clone(), ns, &orips()).create(&PostParams::default(), &orip("198.51.100.1", "default/x")).await.unwrap();
        let p = Api::<DynamicObject>::namespaced_with(plugin.clone(), ns, &ippools());
        let o = Api::<DynamicObject>::namespaced_with(plugin.clone(), ns, &orips());
        forbidden(&format!("get IPPool in {ns}"), p.get("198.51.100.0-24").await);
        forbidden(&format!("list IPPools in {ns}"), p.list(&ListParams::default()).await);
        forbidden(&format!("create IPPool in {ns}"), p.create(&PostParams::default(), &pool("203.0.113.0-24", "203.0.113.0/24")).await);
        forbidden(
            &format!("patch IPPool in {ns}"),
            p.patch("198.51.100.0-24", &PatchParams::default(), &Patch::Merge(json!({"spec": {"allocations": {}}}))).await,
        );
        forbidden(&format!("get ORIP in {ns}"), o.get("198.51.100.1").await);
        forbidden(&format!("create ORIP in {ns}"), o.create(&PostParams::default(), &orip("203.0.113.1", "default/y")).await);
        forbidden(&format!("delete ORIP in {ns}"), o.delete("198.51.100.1", &DeleteParams::default()).await);
    }
    forbidden("list IPPools in all namespaces", Api::<DynamicObject>::all_with(plugin.clone(), &ippools()).list(&ListParams::default()).await);
    forbidden("list ORIPs in all namespaces", Api::<DynamicObject>::all_with(plugin.clone(), &orips()).list(&ListParams::default()).await);

    // ---- Everything else, cluster-wide and in its own namespace.
    let lp = ListParams::default();
    forbidden("list secrets (all)", Api::<Secret>::all(plugin.clone()).list(&lp).await);
    forbidden("list secrets in kube-system", Api::<Secret>::namespaced(plugin.clone(), NAMESPACE).list(&lp).await);
    forbidden("get a secret in kube-system", Api::<Secret>::namespaced(plugin.clone(), NAMESPACE).get("anything").await);
    forbidden(
        "create a namespace",
        Api::<Namespace>::all(plugin.clone()).create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "evil"}})).unwrap()).await,
    );
    forbidden("list namespaces", Api::<Namespace>::all(plugin.clone()).list(&lp).await);
    forbidden("list nodes", Api::<Node>::all(plugin.clone()).list(&lp).await);
    forbidden("list pods (all)", Api::<Pod>::all(plugin.clone()).list(&lp).await);
    forbidden("list pods in kube-system", Api::<Pod>::namespaced(plugin.clone(), NAMESPACE).list(&lp).await);
    forbidden("list configmaps in kube-system", Api::<ConfigMap>::namespaced(plugin.clone(), NAMESPACE).list(&lp).await);
    // NodeSlicePools: get (a node's slices), patch (a claim in the list), list,
    // create and delete (a claim as a slice object, taken back when the list
    // refuses it), not update: the controller lays them out.
    let slice_pools = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1alpha1", "NodeSlicePool"), "nodeslicepools");
    let layout: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "NodeSlicePool", "metadata": {"name": "rbac-slices"},
        "spec": {"range": "192.0.2.0/24", "sliceSize": "/26"}, "status": {"allocations": [{"nodeName": "", "sliceRange": "192.0.2.0/26"}]},
    }))
    .unwrap();
    Api::<DynamicObject>::namespaced_with(admin.clone(), NAMESPACE, &slice_pools).create(&PostParams::default(), &layout).await.unwrap();
    let slices = Api::<DynamicObject>::namespaced_with(plugin.clone(), NAMESPACE, &slice_pools);
    allowed("get a NodeSlicePool", slices.get("rbac-slices").await);
    let claim = json!([{"op": "test", "path": "/status/allocations/0/nodeName", "value": ""}, {"op": "replace", "path": "/status/allocations/0/nodeName", "value": "n1"}]);
    allowed("claim a slice", slices.patch("rbac-slices", &PatchParams::default(), &Patch::<()>::Json(serde_json::from_value(claim).unwrap())).await);
    allowed("list slice objects", slices.list(&lp).await);
    forbidden("PUT a NodeSlicePool", slices.replace("rbac-slices", &PostParams::default(), &layout).await);
    forbidden("watch NodeSlicePools", slices.watch(&WatchParams::default().timeout(1), "0").await.map(|_| ()));
    forbidden(
        "create a NodeSlicePool elsewhere",
        Api::<DynamicObject>::namespaced_with(plugin.clone(), "default", &slice_pools).create(&PostParams::default(), &layout).await,
    );
    // Leases: the turn tickets in kube-system (create, list, watch, patch to
    // renew, delete), nothing more, and nothing elsewhere.
    let leases = Api::<Lease>::namespaced(plugin.clone(), NAMESPACE);
    let ticket: Lease = serde_json::from_value(json!({"metadata": {"generateName": "thereabouts-turn-", "labels": {"thereabouts.io/turn": "pools"}}})).unwrap();
    let ticket = allowed("create a turn ticket", leases.create(&PostParams::default(), &ticket).await);
    let name = ticket.metadata.name.clone().unwrap();
    allowed("list turn tickets", leases.list(&ListParams::default().labels("thereabouts.io/turn=pools")).await);
    allowed("watch a turn ticket", leases.watch(&WatchParams::default().fields(&format!("metadata.name={name}")).timeout(1), "0").await.map(|_| ()));
    allowed("renew a turn ticket", leases.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"leaseDurationSeconds": 2}}))).await);
    forbidden("get a lease", leases.get(&name).await);
    forbidden("PUT a lease", leases.replace(&name, &PostParams::default(), &ticket).await);
    forbidden("delete all leases", leases.delete_collection(&DeleteParams::default(), &ListParams::default()).await);
    allowed("delete a turn ticket", leases.delete(&name, &DeleteParams::default()).await);
    forbidden("list leases in default", Api::<Lease>::namespaced(plugin.clone(), "default").list(&lp).await);
    forbidden(
        "create a lease in default",
        Api::<Lease>::namespaced(plugin.clone(), "default")
            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "whereabouts"}})).unwrap())
            .await,
    );
    forbidden("list CRDs", Api::<CustomResourceDefinition>::all(plugin.clone()).list(&lp).await);
    forbidden(
        "delete the IPPool CRD",
        Api::<CustomResourceDefinition>::all(plugin.clone()).delete("ippools.whereabouts.cni.cncf.io", &DeleteParams::default()).await,
    );
    // No escalation: it cannot bind itself to more.
    forbidden(
        "create a RoleBinding in kube-system",
        Api::<RoleBinding>::namespaced(plugin.clone(), NAMESPACE)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "more"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                    "subjects": [{"kind": "ServiceAccount", "name": "thereabouts", "namespace": "kube-system"}]
                }))
                .unwrap(),
            )
            .await,
    );
    forbidden("get its own ServiceAccount", Api::<ServiceAccount>::namespaced(plugin.clone(), NAMESPACE).get("thereabouts").await);

    // The plugin may not watch pods either (a SubjectAccessReview: the same authorizer).
    assert!(!may(&admin, PLUGIN_USER, "watch", "", "pods", None).await);

    // ---- The kubeconfig the DaemonSet's installer writes works against the real
    // apiserver, with the plugin's rights and the pools' namespace.
    let work = ScratchDir::new();
    let (sa, bin, conf) = (work.sub("sa"), work.sub("bin"), work.sub("net.d"));
    std::fs::write(sa.join("token"), cluster.plugin_token()).unwrap();
    std::fs::write(sa.join("ca.crt"), cluster.ca_pem().unwrap()).unwrap();
    std::fs::write(sa.join("namespace"), NAMESPACE).unwrap();
    std::fs::write(work.path().join("fake-plugin"), "#!/bin/sh\n").unwrap();
    let port = cluster.server_url().rsplit(':').next().unwrap().to_string();
    let out = Command::new("sh")
        .arg(install_script())
        .arg("--once")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("THEREABOUTS_BINARY", work.path().join("fake-plugin"))
        .env("CNI_BIN_DIR", &bin)
        .env("CNI_CONF_DIR", &conf)
        .env("HOST_CNI_CONF_DIR", &conf)
        .env("SERVICE_ACCOUNT_DIR", &sa)
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", &port)
        .output()
        .unwrap();
    assert!(out.status.success(), "install-cni.sh --once failed: {}", String::from_utf8_lossy(&out.stderr));
    let flat: Value = serde_json::from_slice(&std::fs::read(conf.join("thereabouts.d/thereabouts.conf")).unwrap()).unwrap();
    let kubeconfig = PathBuf::from(flat["kubernetes"]["kubeconfig"].as_str().unwrap());
    assert_eq!(kubeconfig, conf.join("thereabouts.d/thereabouts.kubeconfig"));
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    assert_eq!(config.default_namespace, NAMESPACE);
    let installed = kube::Client::try_from(config).unwrap();
    let via_installed: Api<DynamicObject> = Api::default_namespaced_with(installed.clone(), &ippools());
    let list = allowed("list IPPools with the installer's kubeconfig", via_installed.list(&ListParams::default()).await);
    assert_eq!(list.items.len(), 1, "the pool created above, in kube-system");
    forbidden(
        "list IPPools in default with the installer's kubeconfig",
        Api::<DynamicObject>::namespaced_with(installed, "default", &ippools()).list(&ListParams::default()).await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_pass_strict_server_side_validation() {
    let cluster = Cluster::start().expect("starting etcd + kube-apiserver");
    let admin = cluster.admin_client().await.unwrap();

    // Every object, server-side applied with fieldValidation=Strict: an unknown
    // or misplaced field is an error instead of a warning.
    let rbac = strict_apply(&admin, &deploy_dir().join("rbac.yaml")).await;
    let kinds: Vec<String> = rbac.iter().map(|o| format!("{}/{}", o.types.as_ref().unwrap().kind, o.metadata.name.as_ref().unwrap())).collect();
    assert_eq!(kinds, ["ServiceAccount/thereabouts", "Role/thereabouts", "RoleBinding/thereabouts",]);
    for o in &rbac {
        if let Some(ns) = &o.metadata.namespace {
            assert_eq!(ns, NAMESPACE, "{kinds:?}");
        }
    }
    // The opt-in for policies that read pods: `get` on pods and nothing else,
    // bound to the ServiceAccount of rbac.yaml.
    let pod_labels = strict_apply(&admin, &deploy_dir().join("rbac-pod-labels.yaml")).await;
    let kinds: Vec<String> = pod_labels.iter().map(|o| format!("{}/{}", o.types.as_ref().unwrap().kind, o.metadata.name.as_ref().unwrap())).collect();
    assert_eq!(kinds, ["ClusterRole/thereabouts-pod-labels", "ClusterRoleBinding/thereabouts-pod-labels"]);
    assert_eq!(pod_labels[0].data["rules"], json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]));
    assert_eq!(pod_labels[1].data["roleRef"], json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "thereabouts-pod-labels"}));
    let service_account = rbac.iter().find(|o| o.types.as_ref().unwrap().kind == "ServiceAccount").unwrap();
    assert_eq!(
        pod_labels[1].data["subjects"],
        json!([{"kind": "ServiceAccount", "name": service_account.metadata.name, "namespace": service_account.metadata.namespace}])
    );
    // The opt-in for IPAMClaims: get pods and claims, patch claims' status, nothing else.
    let persistent = strict_apply(&admin, &deploy_dir().join("rbac-persistent-ips.yaml")).await;
    assert_eq!(
        persistent[0].data["rules"],
        json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["ipamclaims"], "verbs": ["get"]},
            {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["ipamclaims/status"], "verbs": ["patch"]}
        ])
    );
    assert_eq!(persistent[1].data["subjects"], pod_labels[1].data["subjects"]);
    let applied = strict_apply(&admin, &deploy_dir().join("daemonset.yaml")).await;
    assert_eq!(applied.len(), 1);
    // The flow-control objects: the schema matches the plugin's ServiceAccount
    // of rbac.yaml, and points at the priority level defined beside it.
    let flow = strict_apply(&admin, &deploy_dir().join("flowcontrol.yaml")).await;
    assert_eq!(flow.len(), 2);
    let level = flow.iter().find(|o| o.types.as_ref().unwrap().kind == "PriorityLevelConfiguration").expect("a PriorityLevelConfiguration");
    let schema = flow.iter().find(|o| o.types.as_ref().unwrap().kind == "FlowSchema").expect("a FlowSchema");
    assert_eq!(schema.data["spec"]["priorityLevelConfiguration"]["name"], json!(level.metadata.name));
    let subject = &schema.data["spec"]["rules"][0]["subjects"][0]["serviceAccount"];
    assert_eq!((subject["namespace"].as_str(), subject["name"].as_str()), (Some(NAMESPACE), Some("thereabouts")));

    // The controller: its identity, cluster reads, namespaced writes and Deployment,
    // all in the plugin's namespace, running the binary where the image puts it.
    let control = strict_apply(&admin, &deploy_dir().join("controller.yaml")).await;
    let kind_of = |o: &kube::api::DynamicObject| o.types.as_ref().unwrap().kind.clone();
    let mut kinds: Vec<String> = control.iter().map(kind_of).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        ["ClusterRole", "ClusterRoleBinding", "Deployment", "FlowSchema", "PriorityLevelConfiguration", "Role", "RoleBinding", "Service", "ServiceAccount"]
    );
    // Its requests have a priority level of their own, matched by its ServiceAccount.
    let schema = control.iter().find(|o| kind_of(o) == "FlowSchema").unwrap();
    let level = control.iter().find(|o| kind_of(o) == "PriorityLevelConfiguration").unwrap();
    assert_eq!(schema.data["spec"]["priorityLevelConfiguration"]["name"], json!(level.metadata.name));
    assert_eq!(schema.data["spec"]["rules"][0]["subjects"][0]["serviceAccount"], json!({"name": "thereabouts-controller", "namespace": NAMESPACE}));
    let deployment = control.iter().find(|o| kind_of(o) == "Deployment").unwrap();
    // The metrics Service selects the Deployment's pods, on the port its probes use.
    let service = control.iter().find(|o| kind_of(o) == "Service").unwrap();
    assert_eq!(service.data["spec"]["selector"], deployment.data["spec"]["template"]["metadata"]["labels"]);
    let container = &deployment.data["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["ports"][0]["name"], service.data["spec"]["ports"][0]["targetPort"]);
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(deployment.data["spec"]["template"]["spec"]["serviceAccountName"], "thereabouts-controller");
    let command = &deployment.data["spec"]["template"]["spec"]["containers"][0]["command"];
    assert_eq!(command, &json!(["/opt/thereabouts/thereabouts", "controller", "--reconcile-interval-seconds=300"]));
    // The binary takes that command line (clap refuses an unknown flag before it prints help).
    let args: Vec<&str> = command.as_array().unwrap()[1..].iter().map(|a| a.as_str().unwrap()).collect();
    let parsed = std::process::Command::new(thereabouts_e2e::thereabouts_bin()).args(&args).arg("--help").output().unwrap();
    assert!(parsed.status.success(), "{}", String::from_utf8_lossy(&parsed.stderr));

    // Stored as written, in the namespace of the Role and ServiceAccount.
    let ds = Api::<DaemonSet>::namespaced(admin.clone(), NAMESPACE).get("thereabouts").await.expect("the DaemonSet is stored");
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("thereabouts"));
    Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE).get("thereabouts").await.expect("its ServiceAccount exists in the same namespace");
    assert_eq!(pod.host_network, Some(true));
    let tolerations = pod.tolerations.unwrap();
    assert!(
        tolerations.iter().any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()),
        "tolerates every taint: {tolerations:?}"
    );
    let c = &pod.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));

    // The container and the installer agree: the script is where the image puts
    // it, every variable the manifest sets is one the script reads, and each
    // host directory is mounted where the script writes by default.
    let script = std::fs::read_to_string(install_script()).unwrap();
    assert_eq!(c.command.as_deref(), Some(&["/opt/thereabouts/install-cni.sh".to_string()][..]));
    for e in c.env.as_deref().unwrap_or_default() {
        assert!(script.contains(&format!("{}=${{{}:-", e.name, e.name)), "the DaemonSet sets {} but install-cni.sh does not read it", e.name);
    }
    let default_of = |var: &str| -> String {
        let key = format!("{var}=${{{var}:-");
        let rest = &script[script.find(&key).unwrap_or_else(|| panic!("{var} in script")) + key.len()..];
        rest[..rest.find('}').unwrap()].to_string()
    };
    let volumes = pod.volumes.unwrap();
    let host_path_at = |mount: &str| -> String {
        let m = c.volume_mounts.as_ref().unwrap().iter().find(|m| m.mount_path == mount).unwrap_or_else(|| panic!("nothing mounted at {mount}"));
        let v = volumes.iter().find(|v| v.name == m.name).unwrap();
        v.host_path.as_ref().unwrap().path.clone()
    };
    assert_eq!(host_path_at(&default_of("CNI_BIN_DIR")), "/opt/cni/bin");
    assert_eq!(host_path_at(&default_of("CNI_CONF_DIR")), default_of("HOST_CNI_CONF_DIR"));
    assert_eq!(default_of("HOST_CNI_CONF_DIR"), "/etc/cni/net.d");
    // Policies: the host's cache where the plugin looks by default, and the
    // optional ConfigMap where the installer takes them from.
    assert_eq!(host_path_at(&default_of("POLICY_CACHE_DIR")), "/var/lib/thereabouts/policies");
    let policy_dir =
        c.env.as_deref().unwrap_or_default().iter().find(|e| e.name == "POLICY_DIR").and_then(|e| e.value.clone()).unwrap_or_else(|| default_of("POLICY_DIR"));
    let m = c.volume_mounts.as_ref().unwrap().iter().find(|m| m.mount_path == policy_dir).unwrap_or_else(|| panic!("nothing mounted at {policy_dir}"));
    assert_eq!(m.read_only, Some(true));
    let source = volumes.iter().find(|v| v.name == m.name).unwrap().config_map.as_ref().expect("the policies come from a ConfigMap");
    assert_eq!((source.name.as_str(), source.optional), ("thereabouts-policies", Some(true)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_pod_labels_yaml_grants_get_on_pods_and_nothing_more() {
    let cluster = Cluster::start().expect("starting etcd + kube-apiserver");
    cluster.install_rbac().await.expect("applying deploy/rbac.yaml");
    let admin = cluster.admin_client().await.unwrap();
    let plugin = cluster.plugin_client().await.unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "tenant-a"}})).unwrap())
        .await
        .expect("admin creates namespace tenant-a");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "db-1", "labels": {"tier": "db"}},
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]}
    }))
    .unwrap();
    for ns in ["default", "tenant-a"] {
        Api::<Pod>::namespaced(admin.clone(), ns).create(&PostParams::default(), &pod).await.unwrap();
    }
    // rbac.yaml alone: no pod is readable.
    forbidden("get a pod before rbac-pod-labels.yaml", Api::<Pod>::namespaced(plugin.clone(), "tenant-a").get("db-1").await);

    cluster.apply_path(&deploy_dir().join("rbac-pod-labels.yaml")).await.expect("applying deploy/rbac-pod-labels.yaml");
    for ns in ["default", "tenant-a"] {
        cluster.wait_plugin_allowed("get", "", "pods", ns).await.unwrap();
        let pods = Api::<Pod>::namespaced(plugin.clone(), ns);
        let got = allowed(&format!("get a pod in {ns}"), pods.get("db-1").await);
        assert_eq!(got.metadata.labels.unwrap()["tier"], "db");
        forbidden(&format!("list pods in {ns}"), pods.list(&ListParams::default()).await);
        forbidden(&format!("watch pods in {ns}"), pods.watch(&WatchParams::default(), "0").await.map(|_| ()));
        forbidden(
            &format!("patch a pod in {ns}"),
            pods.patch("db-1", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"tier": "web"}}}))).await,
        );
        forbidden(&format!("delete a pod in {ns}"), pods.delete("db-1", &DeleteParams::default()).await);
        forbidden(&format!("create a pod in {ns}"), pods.create(&PostParams::default(), &pod).await);
        forbidden(&format!("get a pod's status in {ns}"), pods.get_status("db-1").await);
        forbidden(&format!("get a pod's log in {ns}"), pods.logs("db-1", &Default::default()).await);
        forbidden(&format!("get a secret in {ns}"), Api::<Secret>::namespaced(plugin.clone(), ns).get("anything").await);
    }
    forbidden("list pods (all)", Api::<Pod>::all(plugin.clone()).list(&ListParams::default()).await);
    // The same through the authorizer, cluster-wide too (None).
    for namespace in [Some("tenant-a"), None] {
        for (verb, resource) in
            [("get", "pods"), ("list", "pods"), ("watch", "pods"), ("update", "pods"), ("deletecollection", "pods"), ("get", "nodes"), ("get", "secrets")]
        {
            let expected = verb == "get" && resource == "pods";
            assert_eq!(may(&admin, PLUGIN_USER, verb, "", resource, namespace).await, expected, "{verb} {resource} in {namespace:?}");
        }
    }
    // What rbac.yaml gave is unchanged, and no more: the pools of other namespaces stay out of reach.
    assert!(may(&admin, PLUGIN_USER, "patch", GROUP, "ippools", Some(NAMESPACE)).await);
    assert!(!may(&admin, PLUGIN_USER, "get", GROUP, "ippools", Some("tenant-a")).await);
}

/// Server-side apply of every object in `file` with strict field validation.
async fn strict_apply(client: &kube::Client, file: &Path) -> Vec<DynamicObject> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = Vec::new();
    for value in split_yaml(&text).unwrap() {
        let obj: DynamicObject = serde_json::from_value(value).unwrap();
        let types = obj.types.clone().unwrap();
        let (group, version) = types.api_version.split_once('/').unwrap_or(("", &types.api_version));
        let gvk = GroupVersionKind::gvk(group, version, &types.kind);
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(client.clone(), obj.metadata.namespace.as_deref().expect("namespaced objects name their namespace"), &ar),
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        let name = obj.metadata.name.clone().unwrap();
        let applied = api
            .patch(&name, &PatchParams::apply(FIELD_MANAGER).force().validation_strict(), &Patch::Apply(&obj))
            .await
            .unwrap_or_else(|e| panic!("{}: {} {name} rejected: {e:?}", file.display(), types.kind));
        out.push(applied);
    }
    out
}

/// A private temp dir, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> ScratchDir {
        let p = std::env::temp_dir().join(format!(
            "thereabouts-rbac-test-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
        ));
        std::fs::create_dir_all(&p).unwrap();
        ScratchDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn sub(&self, name: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The controller's identity (`deploy/controller.yaml`): what the reconciler
/// and the slice layout do, and nothing else. (The reconciler tests run with
/// this identity: that it suffices is shown there.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_yaml_grants_exactly_what_the_controller_needs() {
    let cluster = Cluster::start().expect("starting etcd + kube-apiserver");
    cluster.install_crds().await.expect("installing deploy/crds");
    let admin = cluster.admin_client().await.unwrap();
    cluster.apply_path(&deploy_dir().join("controller.yaml")).await.unwrap();
    let user = "system:serviceaccount:kube-system:thereabouts-controller";
    let ns = Some(NAMESPACE);
    let allowed = [
        ("list", "", "pods", None),
        ("watch", "", "pods", None),
        ("get", "", "pods", Some("default")),
        ("list", "", "nodes", None),
        ("create", "", "events", Some("default")),
        ("list", GROUP, "ippools", ns),
        ("watch", GROUP, "ippools", ns),
        ("patch", GROUP, "ippools", ns),
        ("list", GROUP, "overlappingrangeipreservations", ns),
        ("delete", GROUP, "overlappingrangeipreservations", ns),
        ("update", GROUP, "nodeslicepools", ns),
        ("delete", GROUP, "nodeslicepools", ns),
        ("get", "coordination.k8s.io", "leases", ns),
        ("patch", "coordination.k8s.io", "leases", ns),
        ("list", "k8s.cni.cncf.io", "network-attachment-definitions", None),
        ("list", "k8s.cni.cncf.io", "ipamclaims", None),
        ("watch", "k8s.cni.cncf.io", "ipamclaims", None),
        ("list", "resource.k8s.io", "resourceclaims", None),
        ("watch", "resource.k8s.io", "resourceclaims", None),
    ];
    let refused = [
        ("delete", "", "pods", Some("default")),
        ("patch", "", "pods", Some("default")),
        ("list", "", "secrets", None),
        ("get", "", "secrets", ns),
        ("patch", "", "nodes", None),
        ("patch", "", "events", Some("default")),
        ("create", GROUP, "ippools", ns),
        ("delete", GROUP, "ippools", ns),
        ("patch", GROUP, "ippools", Some("default")),
        ("create", GROUP, "overlappingrangeipreservations", ns),
        ("delete", GROUP, "overlappingrangeipreservations", Some("default")),
        ("delete", "coordination.k8s.io", "leases", ns),
        ("get", "coordination.k8s.io", "leases", Some("default")),
        ("list", "", "configmaps", ns),
    ];
    for (verb, group, resource, namespace) in allowed {
        assert!(may(&admin, user, verb, group, resource, namespace).await, "{verb} {group}/{resource} in {namespace:?} is refused");
    }
    for (verb, group, resource, namespace) in refused {
        assert!(!may(&admin, user, verb, group, resource, namespace).await, "{verb} {group}/{resource} in {namespace:?} is allowed");
    }
}
