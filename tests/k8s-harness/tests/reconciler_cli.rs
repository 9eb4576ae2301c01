//! The reconciler's tools for a person at a terminal (`thereabouts reconcile`,
//! `release`, `pools --check`, `host/src/controller/tools.rs`) against the
//! real kube-apiserver: states prepared with the release plugin's ADDs and by
//! hand (JSON patches, deletes), then the release binary as a person runs it,
//! checked by its exit status (0 clean, 1 a problem, 2 an error) and by the
//! addresses its output names.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, TempDir, thereabouts_bin};
use thereabouts_k8s_harness::controller;
use thereabouts_k8s_harness::plugin::{IPPOOLS, Objects, RESERVATIONS, kubernetes_conf};
use thereabouts_k8s_harness::pods;
use thereabouts_k8s_harness::{Cluster, block_on};

const V4: &str = "192.0.2.0/24";
const V6: &str = "2001:db8::/64";
const POOLS: [&str; 2] = ["blue-192.0.2.0-24", "blue-2001-db8---64"];

/// A cluster with the controller's identity installed, a Ready node-1, and
/// the network config `blue` written to a file for `--config`.
struct Setup {
    cluster: Cluster,
    objects: Objects,
    /// The controller's kubeconfig: an identity that may list pods.
    kubeconfig: PathBuf,
    conf: Value,
    conf_file: PathBuf,
    _tmp: TempDir,
}

fn setup(tag: &str) -> Setup {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    block_on(pods::node(&cluster, "node-1", true)).unwrap();
    let conf = kubernetes_conf("blue", &cluster.plugin_kubeconfig(), Some("blue"), &[V4, V6]);
    let tmp = TempDir::new(tag);
    let conf_file = tmp.path().join("blue.conf");
    std::fs::write(&conf_file, conf.to_string()).unwrap();
    Setup { cluster, objects, kubeconfig, conf, conf_file, _tmp: tmp }
}

/// What the CLI answered.
struct Ran {
    code: i32,
    stdout: String,
}

impl Ran {
    /// Whether a line of the output has the word `kind` and the cell `text`.
    fn names(&self, kind: &str, text: &str) -> bool {
        self.stdout.lines().any(|l| l.contains(kind) && l.split_whitespace().any(|cell| cell == text))
    }
}

impl Setup {
    /// The plugin's ADD on net1 for pod `default/<pod>` with `conf`.
    fn add_with(&self, conf: &Value, pod: &str) -> Vec<IpAddr> {
        let mut call = Call::pod("ADD", &format!("cid-{pod}"), pod);
        call.ifname = "net1".into();
        let outcome = Invocation::new(call, conf.to_string()).run(&thereabouts_bin());
        outcome.expect_ok("ADD");
        outcome.ips().iter().map(|a| a.split('/').next().unwrap().parse().unwrap()).collect()
    }

    /// A pod on node-1 that ran its ADD, is Running and reported by multus.
    fn running_pod(&self, pod: &str) -> Vec<IpAddr> {
        block_on(pods::create(&self.cluster, pod, "node-1")).unwrap();
        let ips = self.add_with(&self.conf, pod);
        block_on(pods::set_phase(&self.cluster, pod, "Running", "")).unwrap();
        block_on(pods::set_network_status(&self.cluster, pod, "blue", "net1", &ips)).unwrap();
        ips
    }

    /// `thereabouts <args> --config <blue.conf>`.
    fn run(&self, args: &[&str]) -> Ran {
        let out = Command::new(thereabouts_bin()).args(args).arg("--config").arg(&self.conf_file).env_remove("CNI_COMMAND").output().unwrap();
        let ran = Ran { code: out.status.code().unwrap_or(-1), stdout: String::from_utf8_lossy(&out.stdout).into_owned() };
        eprintln!("thereabouts {args:?}: exit {}\n{}{}", ran.code, ran.stdout, String::from_utf8_lossy(&out.stderr));
        ran
    }

    /// `reconcile --dry-run`, reading pods as the controller.
    fn dry_run(&self) -> Ran {
        self.run(&["reconcile", "--dry-run", "--kubeconfig", self.kubeconfig.to_str().unwrap()])
    }

    /// Offsets of the entries of `default/<pod>` in `pool`.
    fn offsets_of(&self, pool: &str, pod: &str) -> Vec<String> {
        let podref = format!("default/{pod}");
        self.objects.allocations(pool).unwrap().into_iter().filter(|(_, e)| e["podref"] == podref.as_str()).map(|(offset, _)| offset).collect()
    }

    fn entries_of(&self, pod: &str) -> usize {
        POOLS.iter().map(|pool| self.offsets_of(pool, pod).len()).sum()
    }

    /// Names of the reservations of `default/<pod>`.
    fn reservations_of(&self, pod: &str) -> Vec<String> {
        let podref = format!("default/{pod}");
        self.objects.list(RESERVATIONS).unwrap().into_iter().filter(|(_, r)| r["spec"]["podref"] == podref.as_str()).map(|(name, _)| name).collect()
    }

    /// Every pool's and reservation's content, to show nothing was written.
    fn snapshot(&self) -> (Vec<Value>, Vec<String>) {
        let pools = POOLS.iter().map(|p| self.objects.get(IPPOOLS, p).unwrap().map_or(Value::Null, |o| o["spec"].clone())).collect();
        (pools, self.objects.list(RESERVATIONS).unwrap().into_keys().collect())
    }

    fn patch_pool(&self, pool: &str, ops: Value) {
        self.objects.json_patch(IPPOOLS, pool, &ops).unwrap().unwrap();
    }
}

#[test]
fn reconcile_dry_run_lists_a_deleted_pods_addresses_exits_1_and_writes_nothing() {
    let s = setup("cli-dry-run");
    let gone = s.running_pod("gone");
    let stays = s.running_pod("stays");
    block_on(pods::delete(&s.cluster, "gone")).unwrap();
    let before = s.snapshot();
    let ran = s.dry_run();
    assert_eq!(ran.code, 1);
    for ip in &gone {
        assert!(ran.names("pod_gone", &ip.to_string()), "{ip} is listed");
    }
    assert!(stays.iter().all(|ip| !ran.names("", &ip.to_string())), "a live pod's addresses are not listed");
    assert_eq!(s.snapshot(), before, "a dry run writes nothing");
}

#[test]
fn reconcile_dry_run_on_a_clean_state_exits_0() {
    let s = setup("cli-dry-run-clean");
    s.running_pod("live");
    assert_eq!(s.dry_run().code, 0);
}

#[test]
fn reconcile_frees_without_dry_run_and_then_finds_nothing() {
    let s = setup("cli-reconcile");
    s.running_pod("gone");
    s.running_pod("stays");
    block_on(pods::delete(&s.cluster, "gone")).unwrap();
    let kubeconfig = s.kubeconfig.to_str().unwrap();
    assert_eq!(s.run(&["reconcile", "--kubeconfig", kubeconfig]).code, 1, "it found something to free");
    assert_eq!((s.entries_of("gone"), s.reservations_of("gone").len()), (0, 0));
    assert_eq!((s.entries_of("stays"), s.reservations_of("stays").len()), (2, 2));
    assert_eq!(s.dry_run().code, 0);
}

#[test]
fn reconcile_with_an_identity_that_may_not_list_pods_exits_2() {
    let s = setup("cli-reconcile-denied");
    s.running_pod("live");
    // Without --kubeconfig: the plugin's identity, which may not list pods.
    assert_eq!(s.run(&["reconcile", "--dry-run"]).code, 2);
}

#[test]
fn release_pod_frees_its_entries_and_reservations_and_then_finds_nothing() {
    let s = setup("cli-release-pod");
    s.running_pod("x");
    s.running_pod("y");
    assert_eq!((s.entries_of("x"), s.reservations_of("x").len()), (2, 2));
    let kubeconfig = s.kubeconfig.to_str().unwrap();
    assert_eq!(s.run(&["release", "--pod", "default/x", "--kubeconfig", kubeconfig]).code, 0);
    assert_eq!((s.entries_of("x"), s.reservations_of("x").len()), (0, 0));
    assert_eq!((s.entries_of("y"), s.reservations_of("y").len()), (2, 2), "another pod keeps its addresses");
    assert_eq!(s.run(&["release", "--pod", "default/x"]).code, 1, "nothing left to release");
}

#[test]
fn release_address_frees_that_address_only() {
    let s = setup("cli-release-address");
    let ips = s.running_pod("x");
    let v4 = ips.iter().find(|ip| ip.is_ipv4()).unwrap().to_string();
    let ran = s.run(&["release", "--address", &v4]);
    assert_eq!(ran.code, 0);
    assert!(ran.names("freed", &v4));
    assert_eq!((s.offsets_of(POOLS[0], "x").len(), s.offsets_of(POOLS[1], "x").len()), (0, 1));
    assert_eq!(s.reservations_of("x").len(), 1, "the IPv6 address keeps its reservation");
}

#[test]
fn pools_check_on_a_clean_cluster_exits_0() {
    let s = setup("cli-check-clean");
    s.running_pod("live");
    assert_eq!(s.run(&["pools", "--check"]).code, 0);
}

#[test]
fn pools_check_finds_an_entry_without_its_reservation() {
    let s = setup("cli-check-no-reservation");
    let ips = s.running_pod("x");
    let v4 = ips.iter().find(|ip| ip.is_ipv4()).unwrap().to_string();
    let name = s.reservations_of("x").into_iter().find(|n| n.ends_with(&v4)).unwrap();
    s.objects.delete(RESERVATIONS, &name).unwrap();
    let ran = s.run(&["pools", "--check"]);
    assert_eq!(ran.code, 1);
    assert!(ran.names("entry_without_reservation", &v4), "{v4} is named");
}

#[test]
fn pools_check_finds_a_reservation_without_its_entry() {
    let s = setup("cli-check-no-entry");
    let ips = s.running_pod("x");
    let v4 = ips.iter().find(|ip| ip.is_ipv4()).unwrap().to_string();
    let offset = s.offsets_of(POOLS[0], "x").pop().unwrap();
    s.patch_pool(POOLS[0], json!([{"op": "remove", "path": format!("/spec/allocations/{offset}")}]));
    let ran = s.run(&["pools", "--check"]);
    assert_eq!(ran.code, 1);
    assert!(ran.names("reservation_without_entry", &format!("blue-{v4}")), "its reservation is named");
}

#[test]
fn pools_check_finds_an_entry_with_an_empty_podref() {
    let s = setup("cli-check-no-podref");
    s.running_pod("live");
    s.patch_pool(POOLS[0], json!([{"op": "add", "path": "/spec/allocations/200", "value": {"id": "old-client", "podref": ""}}]));
    let ran = s.run(&["pools", "--check"]);
    assert_eq!(ran.code, 1);
    assert!(ran.names("without_podref", "192.0.2.200"));
}

#[test]
fn pools_check_finds_one_address_in_two_overlapping_pools() {
    let s = setup("cli-check-duplicate");
    // Two networks without network_name: their pools share the empty prefix.
    let wide = kubernetes_conf("wide", &s.cluster.plugin_kubeconfig(), None, &["192.0.2.0/24"]);
    let narrow = kubernetes_conf("narrow", &s.cluster.plugin_kubeconfig(), None, &["192.0.2.0/25"]);
    let a = s.add_with(&wide, "a")[0];
    s.add_with(&narrow, "b");
    let (wide_pool, narrow_pool) = ("192.0.2.0-24", "192.0.2.0-25");
    let offset = s.offsets_of(wide_pool, "a").pop().unwrap();
    let entry = json!({"id": "cid-b", "podref": "default/b", "ifname": "net1"});
    s.patch_pool(narrow_pool, json!([{"op": "add", "path": format!("/spec/allocations/{offset}"), "value": entry}]));
    std::fs::write(&s.conf_file, wide.to_string()).unwrap();
    let ran = s.run(&["pools", "--check"]);
    assert_eq!(ran.code, 1);
    assert!(ran.names("duplicate_address", &a.to_string()), "{a} is named");
}
