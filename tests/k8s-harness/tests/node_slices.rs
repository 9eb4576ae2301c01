//! Node slices (`node_slice_size`) against the real kube-apiserver: the
//! `thereabouts controller` (its own identity, `deploy/controller.yaml`) lays
//! out NodeSlicePools from NetworkAttachmentDefinitions for simulated nodes
//! (Node objects, no kubelet), and the release plugin runs on each node
//! (`NODENAME`) with the plugin identity. The decisions themselves are pinned
//! in-process (`host/src/controller/layout.rs`, `allocator-wasm/src/slices.rs`).
//!
//! Each test has its own control plane: the controller serves every NAD and
//! every node of its cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir, result_ips, thereabouts_bin};
use thereabouts_k8s_harness::addresses::contains;
use thereabouts_k8s_harness::apiserver_metrics::Metrics;
use thereabouts_k8s_harness::burst::run_concurrently;
use thereabouts_k8s_harness::controller::{self, Controller};
use thereabouts_k8s_harness::plugin::{IPPOOLS, Objects, RESERVATIONS, kubernetes_conf};
use thereabouts_k8s_harness::{Cluster, block_on, wait_until};

const V4: &str = "192.0.2.0/24";
const V6: &str = "2001:db8::/64";
use thereabouts_k8s_harness::controller::NODE_SLICE_POOLS as SLICE_POOLS;

/// Dual-stack, IPv4 in /28 slices with two excluded blocks, IPv6 in /76 slices.
fn sliced_conf(cluster: &Cluster, network_name: &str, v4: &str) -> Value {
    let mut conf = kubernetes_conf("slices", &cluster.plugin_kubeconfig(), Some(network_name), &[v4, V6]);
    conf["ipam"]["node_slice_size"] = json!("/28");
    conf["ipam"]["ipRanges"][0]["exclude"] = json!(["192.0.2.0/30", "192.0.2.16/30"]);
    conf["ipam"]["ipRanges"][1]["node_slice_size"] = json!("/76");
    conf
}

fn on_node(command: &str, conf: &Value, node: &str, pod: &str) -> Invocation {
    Invocation::new(Call::pod(command, &format!("cid-{pod}"), pod), conf.to_string()).env("NODENAME", node)
}

/// node → slices held, from the NodeSlicePool `name` (empty when absent).
fn holders(objects: &Objects, name: &str) -> BTreeMap<String, Vec<String>> {
    controller::holders_of(&objects.get(SLICE_POOLS, name).unwrap().unwrap_or(Value::Null))
}

fn every_node_holds_one(objects: &Objects, name: &str, nodes: &[&str]) -> bool {
    let held = holders(objects, name);
    held.len() == nodes.len() && nodes.iter().all(|n| held.get(*n).is_some_and(|s| s.len() == 1))
}

fn ips_of(outcome: &Outcome) -> Vec<IpAddr> {
    result_ips(&serde_json::from_str(&outcome.stdout).unwrap()).iter().map(|a| a.split('/').next().unwrap().parse().unwrap()).collect()
}

fn entries_left(objects: &Objects) -> usize {
    objects.list(IPPOOLS).unwrap().values().map(|p| p["spec"]["allocations"].as_object().map_or(0, |a| a.len())).sum()
}

#[test]
fn each_node_allocates_from_its_own_slices_in_both_families_and_claims_another_when_full() {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("slices-alloc");
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    for node in ["node-a", "node-b"] {
        block_on(controller::add_node(&cluster, node)).unwrap();
    }
    let conf = sliced_conf(&cluster, "blue", V4);
    block_on(controller::create_nad(&cluster, "blue", &conf)).unwrap();
    let _controller = Controller::start(&thereabouts_bin(), &kubeconfig, 2, &tmp.path().join("controller.log")).unwrap();
    let (v4_pool, v6_pool) = ("blue", "blue-2001-db8---64");
    wait_until("both nodes hold a slice of each range", Duration::from_secs(30), Duration::from_millis(200), || {
        every_node_holds_one(&objects, v4_pool, &["node-a", "node-b"]) && every_node_holds_one(&objects, v6_pool, &["node-a", "node-b"])
    });

    // 15 pods on node-a, whose /28 serves 11 (two /30 excluded): it claims more.
    let mut calls: Vec<(&str, Invocation)> = (0..15).map(|i| ("node-a", on_node("ADD", &conf, "node-a", &format!("a{i}")))).collect();
    calls.extend((0..5).map(|i| ("node-b", on_node("ADD", &conf, "node-b", &format!("b{i}")))));
    let invocations: Vec<Invocation> = calls.iter().map(|(_, i)| i.clone()).collect();
    let outcomes = run_concurrently(&thereabouts_bin(), &invocations, None);
    let (held_v4, held_v6) = (holders(&objects, v4_pool), holders(&objects, v6_pool));
    let mut seen = BTreeSet::new();
    for ((node, _), outcome) in calls.iter().zip(&outcomes) {
        outcome.expect_ok("ADD on a sliced network");
        let ips = ips_of(outcome);
        assert_eq!(ips.len(), 2, "{}", outcome.stdout);
        assert!(held_v4[*node].iter().any(|s| contains(s, ips[0])), "{} not in {node}'s IPv4 slices {:?}", ips[0], held_v4[*node]);
        assert!(held_v6[*node].iter().any(|s| contains(s, ips[1])), "{} not in {node}'s IPv6 slices {:?}", ips[1], held_v6[*node]);
        assert!(!contains("192.0.2.0/30", ips[0]) && !contains("192.0.2.16/30", ips[0]), "excluded address {} handed out", ips[0]);
        assert!(ips.iter().all(|ip| seen.insert(*ip)), "an address handed out twice: {ips:?}");
        assert!(outcome.stdout.contains("/24") && outcome.stdout.contains("/64"), "results carry the range's prefix: {}", outcome.stdout);
    }
    assert!(held_v4["node-a"].len() >= 2, "node-a claimed another IPv4 slice: {held_v4:?}");

    // Its pods gone, node-a's extra slices go back (after the cool-down) and it keeps one.
    let dels: Vec<Invocation> = calls.iter().map(|(node, i)| on_node("DEL", &conf, node, i.call.pod_name())).collect();
    for outcome in run_concurrently(&thereabouts_bin(), &dels, None) {
        outcome.expect_ok("DEL on a sliced network");
    }
    assert_eq!(entries_left(&objects), 0);
    assert!(objects.list(RESERVATIONS).unwrap().is_empty());
    // A network no NodeSlicePool was laid out for: an ADD waits for one (code 11),
    // a DEL has nothing to free and succeeds.
    let unknown = sliced_conf(&cluster, "nowhere", V4);
    let refused = on_node("ADD", &unknown, "node-a", "u0").run(&thereabouts_bin());
    assert!(refused.stdout.contains("\"code\": 11") && refused.stdout.contains("NodeSlicePool"), "{}", refused.stdout);
    on_node("DEL", &unknown, "node-a", "u0").run(&thereabouts_bin()).expect_ok("DEL without a NodeSlicePool");
    wait_until("node-a is back to one slice and none is cooling", Duration::from_secs(30), Duration::from_millis(200), || {
        let pool = objects.get(SLICE_POOLS, v4_pool).unwrap().unwrap();
        every_node_holds_one(&objects, v4_pool, &["node-a", "node-b"]) && pool["metadata"]["annotations"].get("thereabouts.io/cooling-slices").is_none()
    });
}

#[test]
fn the_controller_follows_nodes_and_nads_survives_a_kill_and_waits_with_a_range_change() {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("slices-lifecycle");
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    let conf = sliced_conf(&cluster, "green", V4);
    block_on(controller::create_nad(&cluster, "green", &conf)).unwrap();
    // A second NAD of the same network agrees; a third asks another range: ignored, not fought over.
    block_on(controller::create_nad(&cluster, "green-copy", &conf)).unwrap();
    block_on(controller::create_nad(&cluster, "green-other", &sliced_conf(&cluster, "green", "198.51.100.0/24"))).unwrap();
    let mut control = Controller::start(&thereabouts_bin(), &kubeconfig, 2, &tmp.path().join("controller-1.log")).unwrap();

    // Nodes join while the controller is killed and started again mid-way.
    let nodes: Vec<String> = (0..8).map(|i| format!("node-{i}")).collect();
    for (i, node) in nodes.iter().enumerate() {
        block_on(controller::add_node(&cluster, node)).unwrap();
        if i == 3 {
            control.kill();
            control = Controller::start(&thereabouts_bin(), &kubeconfig, 2, &tmp.path().join("controller-2.log")).unwrap();
        }
    }
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    wait_until("every node holds exactly one slice", Duration::from_secs(60), Duration::from_millis(200), || every_node_holds_one(&objects, "green", &names));
    let layout = objects.get(SLICE_POOLS, "green").unwrap().unwrap();
    assert_eq!(layout["spec"]["range"], V4, "the oldest NAD's range");
    std::thread::sleep(Duration::from_secs(3));
    let later = objects.get(SLICE_POOLS, "green").unwrap().unwrap();
    assert_eq!(later["metadata"]["resourceVersion"], layout["metadata"]["resourceVersion"], "passes with agreeing NADs write nothing");

    // A pod on node-7, then node-6 leaves: its empty slice goes back; node-7's stays.
    on_node("ADD", &conf, "node-7", "p7").run(&thereabouts_bin()).expect_ok("ADD on node-7");
    block_on(controller::remove_node(&cluster, "node-6")).unwrap();
    wait_until("node-6's slice is handed back", Duration::from_secs(30), Duration::from_millis(200), || !holders(&objects, "green").contains_key("node-6"));

    // A range change waits while node-7's pod holds its old slice, then lays out again.
    for nad in ["green", "green-copy", "green-other"] {
        block_on(controller::create_nad(&cluster, nad, &sliced_conf(&cluster, "green", "198.51.100.0/24"))).unwrap();
    }
    std::thread::sleep(Duration::from_secs(5));
    let waiting = objects.get(SLICE_POOLS, "green").unwrap().unwrap();
    assert_eq!(waiting["spec"]["range"], V4, "not re-laid-out while a slice holds allocations");
    assert!(holders(&objects, "green").contains_key("node-7"));
    on_node("DEL", &conf, "node-7", "p7").run(&thereabouts_bin()).expect_ok("DEL on node-7");
    wait_until("the new range is laid out for every node", Duration::from_secs(60), Duration::from_millis(200), || {
        let pool = objects.get(SLICE_POOLS, "green").unwrap().unwrap();
        let live: Vec<&str> = names.iter().copied().filter(|n| *n != "node-6").collect();
        pool["spec"]["range"] == "198.51.100.0/24" && every_node_holds_one(&objects, "green", &live)
    });
    drop(control);
}

/// A cluster on whereabouts' node slices swaps plugins and keeps its layout and
/// allocations: whereabouts' node-slice-controller lays the pool out and its
/// plugin allocates; then thereabouts' plugin finds the same pods' addresses in
/// the same per-node pools, allocates the next ones there and frees whereabouts'
/// entries; and thereabouts' controller takes the layout over as it is.
#[test]
fn a_cluster_on_whereabouts_node_slices_keeps_its_layout_and_allocations() {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("slices-compat");
    let wb = thereabouts_k8s_harness::peers::whereabouts().unwrap();
    let install = block_on(wb.install(&cluster)).unwrap();
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    for node in ["node-a", "node-b"] {
        block_on(controller::add_node(&cluster, node)).unwrap();
    }
    let mut theirs = thereabouts_k8s_harness::peers::whereabouts_conf(tmp.path(), &install.kubeconfig, "compat", &[V4]).unwrap();
    theirs["ipam"]["node_slice_size"] = json!("/26");
    block_on(controller::create_nad(&cluster, "compat", &theirs)).unwrap();
    let log = std::fs::File::create(tmp.path().join("wb-controller.log")).unwrap();
    let mut wb_controller = std::process::Command::new(&wb.node_slice_controller)
        .arg("--kubeconfig")
        .arg(cluster.admin_kubeconfig())
        .env("WHEREABOUTS_NAMESPACE", thereabouts_k8s_harness::NAMESPACE)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    wait_until("whereabouts laid the slices out", Duration::from_secs(60), Duration::from_millis(200), || {
        every_node_holds_one(&objects, "compat", &["node-a", "node-b"])
    });
    let wb_add = |pod: &str| on_node("ADD", &theirs, "node-a", pod).run(&wb.plugin);
    let old: Vec<IpAddr> = ["w0", "w1"].iter().map(|p| ips_of(wb_add(p).expect_ok("whereabouts ADD"))[0]).collect();

    let mut ours = sliced_conf(&cluster, "compat", V4);
    ours["ipam"]["ipRanges"] = json!([{"range": V4}]);
    ours["ipam"]["node_slice_size"] = json!("/26");
    let add = |pod: &str| ips_of(on_node("ADD", &ours, "node-a", pod).run(&thereabouts_bin()).expect_ok("thereabouts ADD"))[0];
    assert_eq!(add("w0"), old[0], "the same pod keeps whereabouts' address");
    let fresh = add("t0");
    assert!(!old.contains(&fresh) && holders(&objects, "compat")["node-a"].iter().any(|s| contains(s, fresh)));
    let pool_name = format!("compat-node-a-{}", holders(&objects, "compat")["node-a"][0].replace('/', "-"));
    assert_eq!(objects.allocations(&pool_name).unwrap().len(), 3, "one per-node pool holds both plugins' entries");
    on_node("DEL", &ours, "node-a", "w1").run(&thereabouts_bin()).expect_ok("thereabouts DEL of a whereabouts pod");
    assert_eq!(objects.allocations(&pool_name).unwrap().len(), 2);

    // Controllers swapped: thereabouts' keeps whereabouts' layout as it is.
    let layout = holders(&objects, "compat");
    let _ = wb_controller.kill();
    let _ = wb_controller.wait();
    block_on(controller::create_nad(&cluster, "compat", &ours)).unwrap();
    let _ours = Controller::start(&thereabouts_bin(), &kubeconfig, 2, &tmp.path().join("controller.log")).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(holders(&objects, "compat"), layout);
    assert_eq!(objects.get(SLICE_POOLS, "compat").unwrap().unwrap()["spec"]["range"], V4);
}

/// Entries per node pool of `node`, from the IPPools named after it.
fn node_pool_entries(objects: &Objects, node: &str) -> Vec<usize> {
    let pools = objects.list(IPPOOLS).unwrap();
    pools.iter().filter(|(name, _)| name.contains(node)).map(|(_, p)| p["spec"]["allocations"].as_object().map_or(0, |a| a.len())).collect()
}

#[test]
fn a_node_pool_at_node_slice_max_entries_makes_the_node_claim_another_slice_and_fills_past_it_when_none_is_free() {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("slices-bound");
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    for node in ["node-a", "node-b"] {
        block_on(controller::add_node(&cluster, node)).unwrap();
    }
    // 192.0.2.0/26 in four /28 slices of 14 addresses; a node pool takes 3 entries.
    let mut conf = kubernetes_conf("slices", &cluster.plugin_kubeconfig(), Some("green"), &["192.0.2.0/26"]);
    conf["ipam"]["node_slice_size"] = json!("/28");
    conf["ipam"]["node_slice_max_entries"] = json!(3);
    block_on(controller::create_nad(&cluster, "green", &conf)).unwrap();
    let controller = Controller::start(&thereabouts_bin(), &kubeconfig, 2, &tmp.path().join("controller.log")).unwrap();
    wait_until("both nodes hold a slice", Duration::from_secs(30), Duration::from_millis(200), || {
        every_node_holds_one(&objects, "green", &["node-a", "node-b"])
    });
    // The ADDs' pods have no Pod objects: the controller's first full pass
    // would free their entries had it come after them (the next is minutes away).
    wait_until("the controller's first full pass", Duration::from_secs(30), Duration::from_millis(200), || {
        controller.metric(r#"thereabouts_reconcile_passes_total{kind="full",outcome="ok"}"#).unwrap_or(0.0) >= 1.0
    });
    let add = |i: usize| {
        on_node("ADD", &conf, "node-a", &format!("a{i}")).run(&thereabouts_bin()).expect_ok("ADD under a bound");
    };

    (0..9).for_each(add);
    assert_eq!(holders(&objects, "green")["node-a"].len(), 3, "node-a took the two free slices");
    assert_eq!(node_pool_entries(&objects, "node-a"), [3, 3, 3], "no pool past the bound while a slice was free");
    // No slice is free any more: the ADDs still succeed, past the bound.
    (9..12).for_each(add);
    assert_eq!(holders(&objects, "green")["node-a"].len(), 3);
    assert_eq!(node_pool_entries(&objects, "node-a").iter().sum::<usize>(), 12);
}

#[test]
fn an_add_reads_only_the_pool_of_its_node_under_the_bound_not_the_full_ones() {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let metrics = Metrics::admin(&cluster).unwrap();
    let tmp = TempDir::new("slices-flat");
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    block_on(controller::add_node(&cluster, "node-a")).unwrap();
    // 192.0.2.0/26 in four /28 slices; a node pool takes 2 entries.
    let mut conf = kubernetes_conf("slices", &cluster.plugin_kubeconfig(), Some("blue"), &["192.0.2.0/26"]);
    conf["ipam"]["node_slice_size"] = json!("/28");
    conf["ipam"]["node_slice_max_entries"] = json!(2);
    block_on(controller::create_nad(&cluster, "blue", &conf)).unwrap();
    let controller = Controller::start(&thereabouts_bin(), &kubeconfig, 2, &tmp.path().join("controller.log")).unwrap();
    wait_until("node-a holds a slice", Duration::from_secs(30), Duration::from_millis(200), || every_node_holds_one(&objects, "blue", &["node-a"]));
    // From here only the plugin reads the pools.
    drop(controller);
    let add = |i: usize| {
        on_node("ADD", &conf, "node-a", &format!("a{i}")).run(&thereabouts_bin()).expect_ok("ADD under a bound");
    };

    // A pool read is a LIST by name, which the apiserver counts as a GET.
    let pools_read = |i: usize| {
        let before = metrics.requests().unwrap();
        add(i);
        let during = metrics.requests().unwrap().since(&before);
        (during.of("GET", "ippools", "200") + during.of("LIST", "ippools", "200"), during.lines())
    };

    (0..6).for_each(add);
    assert_eq!(node_pool_entries(&objects, "node-a"), [2, 2, 2], "three slices at the bound");
    let (reads, requests) = pools_read(6);
    assert_eq!(reads, 1.0, "noted full: it claims the fourth slice and reads its pool alone: {requests:?}");
    let (reads, requests) = pools_read(7);
    assert_eq!(reads, 1.0, "the fourth slice's pool alone: {requests:?}");
    let mut entries = node_pool_entries(&objects, "node-a");
    entries.sort();
    assert_eq!(entries, [2, 2, 2, 2]);
}

/// node → slices held, from `layout`'s slice objects.
fn object_holders(objects: &Objects, layout: &str) -> BTreeMap<String, Vec<String>> {
    controller::object_holders(&objects.list(SLICE_POOLS).unwrap(), layout)
}

fn shape_of(objects: &Objects, layout: &str) -> Option<String> {
    let pool = objects.get(SLICE_POOLS, layout).unwrap()?;
    pool.pointer("/metadata/annotations/thereabouts.io~1slice-objects").and_then(Value::as_str).map(str::to_string)
}

#[test]
fn a_range_of_more_than_4096_slices_keeps_each_held_slice_in_a_small_object_of_its_own() {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("slices-objects");
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    let nodes = ["node-a", "node-b", "node-c"];
    for node in nodes {
        block_on(controller::add_node(&cluster, node)).unwrap();
    }
    // 2001:db8::/64 in 16 384 /78 slices; a node pool takes 2 entries.
    let mut conf = kubernetes_conf("slices", &cluster.plugin_kubeconfig(), Some("wide"), &[V6]);
    conf["ipam"]["node_slice_size"] = json!("/78");
    conf["ipam"]["node_slice_max_entries"] = json!(2);
    block_on(controller::create_nad(&cluster, "wide", &conf)).unwrap();
    let controller = Controller::start(&thereabouts_bin(), &kubeconfig, 2, &tmp.path().join("controller.log")).unwrap();
    wait_until("every node holds a slice object", Duration::from_secs(60), Duration::from_millis(200), || {
        let held = object_holders(&objects, "wide");
        nodes.iter().all(|n| held.get(*n).is_some_and(|s| s.len() == 1))
    });
    let layout = objects.get(SLICE_POOLS, "wide").unwrap().unwrap();
    assert_eq!((shape_of(&objects, "wide").as_deref(), &layout["status"]["allocations"]), (Some("true"), &json!([])));

    // Five pods on node-a: its pools take two each, so it claims two more slices by creating their objects.
    let mut seen = BTreeSet::new();
    for i in 0..5 {
        let outcome = on_node("ADD", &conf, "node-a", &format!("a{i}")).run(&thereabouts_bin());
        outcome.expect_ok("ADD on a range of slice objects");
        let held = object_holders(&objects, "wide");
        let ip = ips_of(&outcome)[0];
        assert!(held["node-a"].iter().any(|s| contains(s, ip)), "{ip} not in node-a's slices {:?}", held["node-a"]);
        assert!(seen.insert(ip), "{ip} handed out twice");
    }
    assert_eq!(object_holders(&objects, "wide")["node-a"].len(), 3);
    let mut entries = node_pool_entries(&objects, "node-a");
    entries.sort();
    assert_eq!(entries, [1, 2, 2], "no pool past the bound");
    let largest = objects.list(SLICE_POOLS).unwrap().values().map(|o| o.to_string().len()).max().unwrap();
    assert!(largest < 1024, "the largest NodeSlicePool is {largest} bytes");

    // From here only the plugin lists. A LIST by label walks every object of
    // its kind in the apiserver's cache: a DEL that finds its entries in the
    // slices its node remembers sends none; one that finds nothing (repeated)
    // lists the node's slices and the reservations a failed ADD may have left.
    // A node that remembers nothing finds the slice the controller gave it
    // from its home, by name.
    drop(controller);
    let metrics = Metrics::admin(&cluster).unwrap();
    let lists = |command: &str, node: &str, pod: &str| {
        let before = metrics.requests().unwrap();
        on_node(command, &conf, node, pod).run(&thereabouts_bin()).expect_ok(command);
        let during = metrics.requests().unwrap().since(&before);
        ((during.of("LIST", SLICE_POOLS, "200"), during.of("LIST", RESERVATIONS, "200")), during.lines())
    };
    let (first_add, requests) = lists("ADD", "node-b", "b0");
    assert_eq!(first_add, (0.0, 0.0), "node-b's first ADD: {requests:?}");
    assert_eq!(lists("DEL", "node-b", "b0").0, (0.0, 0.0));
    for i in 0..5 {
        let (listed, requests) = lists("DEL", "node-a", &format!("a{i}"));
        assert_eq!(listed, (0.0, 0.0), "DEL of a{i}: {requests:?}");
    }
    assert_eq!(entries_left(&objects), 0);
    let (listed, requests) = lists("DEL", "node-a", "a0");
    assert_eq!(listed, (1.0, 1.0), "a repeated DEL: {requests:?}");
}

#[test]
fn a_layout_moves_to_slice_objects_and_back_while_every_node_keeps_its_slices() {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new("slices-migrate");
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    for node in ["node-a", "node-b"] {
        block_on(controller::add_node(&cluster, node)).unwrap();
    }
    let mut conf = kubernetes_conf("slices", &cluster.plugin_kubeconfig(), Some("blue"), &[V4]);
    conf["ipam"]["node_slice_size"] = json!("/28");
    block_on(controller::create_nad(&cluster, "blue", &conf)).unwrap();
    let run = |objects_too: bool, log: &str| {
        let settings = controller::Settings { slice_objects: objects_too, ..controller::Settings::default() };
        Controller::run(&thereabouts_bin(), &kubeconfig, &settings, &tmp.path().join(log)).unwrap()
    };
    let mut control = run(false, "controller-1.log");
    wait_until("both nodes hold a slice", Duration::from_secs(30), Duration::from_millis(200), || {
        every_node_holds_one(&objects, "blue", &["node-a", "node-b"])
    });
    let before = holders(&objects, "blue");
    on_node("ADD", &conf, "node-a", "p1").run(&thereabouts_bin()).expect_ok("ADD on whereabouts' shape");

    // To slice objects: through both shapes, one cool-down, each held slice an object; the list stays in step.
    control.kill();
    control = run(true, "controller-2.log");
    wait_until("the layout keeps slice objects", Duration::from_secs(60), Duration::from_millis(200), || shape_of(&objects, "blue").as_deref() == Some("true"));
    assert_eq!(object_holders(&objects, "blue"), before);
    block_on(controller::add_node(&cluster, "node-c")).unwrap();
    wait_until("node-c holds a slice object, listed too", Duration::from_secs(30), Duration::from_millis(200), || {
        object_holders(&objects, "blue").contains_key("node-c") && holders(&objects, "blue") == object_holders(&objects, "blue")
    });
    on_node("ADD", &conf, "node-c", "p2").run(&thereabouts_bin()).expect_ok("ADD on slice objects");
    on_node("ADD", &conf, "node-a", "p3").run(&thereabouts_bin()).expect_ok("ADD on slice objects");
    let during = object_holders(&objects, "blue");

    // Back: the list alone, the objects gone, nobody's slice moved.
    control.kill();
    let _control = run(false, "controller-3.log");
    wait_until("the layout is whereabouts' list alone", Duration::from_secs(60), Duration::from_millis(200), || {
        shape_of(&objects, "blue").is_none() && object_holders(&objects, "blue").is_empty()
    });
    assert_eq!(holders(&objects, "blue"), during);
    for (node, pod) in [("node-b", "p4"), ("node-a", "p5")] {
        on_node("ADD", &conf, node, pod).run(&thereabouts_bin()).expect_ok("ADD on whereabouts' shape again");
    }
    for (node, pod) in [("node-a", "p1"), ("node-c", "p2"), ("node-a", "p3"), ("node-b", "p4"), ("node-a", "p5")] {
        on_node("DEL", &conf, node, pod).run(&thereabouts_bin()).expect_ok("DEL");
    }
    assert_eq!(entries_left(&objects), 0);
    assert_eq!(node_pool_entries(&objects, "node-a").len(), 1, "node-a's pods all came from its one slice");
}
