//! The Kubernetes datastore under load and faults, against the real kube-apiserver:
//! the release `thereabouts` binary runs as a CNI plugin, one process per call,
//! many at once (as if from many nodes: distinct container IDs and pods), with the
//! least-privilege plugin identity of `deploy/rbac.yaml`.
//!
//! * a burst of 200 concurrent dual-stack ADDs, then 200 concurrent DELs;
//! * the apiserver killed in the middle of a burst of ADDs with a short deadline;
//! * ADDs and DELs while a whereabouts-style writer keeps changing the same pool.
//!
//! Each call gets a generous deadline where the test checks correctness, not
//! speed (the `bench_k8s_burst` binary measures speed). Each test has a private
//! control plane and runs alone, whatever `--test-threads`: a burst of processes
//! takes the machine's cores, and the tests' outcomes (deadlines, a whole burst
//! finishing within its budget) must not depend on each other.
//!
//! Binary: `$THEREABOUTS_BIN`, else `target/plugin/thereabouts` (tests/k8s.sh builds it with scripts/build-plugin.sh).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Outcome, TempDir, thereabouts_bin};
use thereabouts_k8s_harness::burst::{
    Invocation, LogStats, check_held, expect_all_ok, log_path, pod_name, pods, pool_entries, reservation_name, reservations_in, run_concurrently, run_one,
    run_through_outage, summary,
};
use thereabouts_k8s_harness::plugin::{GROUP_VERSION, IPPOOLS, Objects, RESERVATIONS, kubernetes_conf, with_debug_log};
use thereabouts_k8s_harness::{Cluster, NAMESPACE};

/// The plugin's budget where the tests check correctness, not speed.
const GENEROUS: Duration = Duration::from_secs(120);
/// The harness kills a call that runs this long (a hang).
const WATCHDOG: Duration = Duration::from_secs(180);

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

/// Held by each test for its whole run: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn prepared_cluster() -> Cluster {
    let cluster = Cluster::start().expect("starting etcd + kube-apiserver");
    block_on(async {
        cluster.install_crds().await.expect("installing deploy/crds");
        cluster.install_rbac().await.expect("installing deploy/rbac.yaml");
        cluster.install_flowcontrol().await.expect("installing deploy/flowcontrol.yaml");
    });
    cluster
}

/// Dual-stack config for `ranges` with the plugin identity; each call logs to
/// its own file under `logs` (debug: every API request, every re-plan).
struct Network {
    conf: Value,
    ranges: Vec<&'static str>,
    logs: TempDir,
}

impl Network {
    fn new(cluster: &Cluster, name: &str, ranges: &[&'static str]) -> Network {
        Network { conf: kubernetes_conf(name, &cluster.plugin_kubeconfig(), None, ranges), ranges: ranges.to_vec(), logs: TempDir::new(name) }
    }

    fn stdin(&self, tag: &str) -> String {
        with_debug_log(self.conf.clone(), &log_path(self.logs.path(), tag)).to_string()
    }

    fn invocation(&self, command: &str, cid: &str, pod: &str, budget: Duration) -> Invocation {
        let tag = format!("{}-{cid}", command.to_lowercase());
        Invocation::new(Call::pod(command, cid, pod), self.stdin(&tag)).budget(budget)
    }

    /// ADDs (or DELs) for `pods` = (container ID, pod name).
    fn calls(&self, command: &str, pods: &[(String, String)], budget: Duration) -> Vec<Invocation> {
        pods.iter().map(|(cid, pod)| self.invocation(command, cid, pod, budget)).collect()
    }

    fn log_stats(&self, command: &str, outcomes: &[Outcome]) -> LogStats {
        let mut total = LogStats::default();
        for o in outcomes {
            let tag = format!("{}-{}", command.to_lowercase(), o.call.container_id);
            total.add(&LogStats::read(&log_path(self.logs.path(), &tag)));
        }
        total
    }

    /// IPPool names, in range order (the engine's naming: `192.0.2.0/24` → `192.0.2.0-24`).
    fn pools(&self) -> Vec<(String, &'static str)> {
        self.ranges.iter().map(|r| (r.replace([':', '/'], "-"), *r)).collect()
    }
}

/// [`check_held`] against the IPPools and reservations as the admin reads them.
fn check_results(net: &Network, objects: &Objects, outcomes: &[&Outcome]) -> Vec<BTreeMap<IpAddr, String>> {
    let entries: Vec<_> = net.pools().iter().map(|(pool, range)| pool_entries(objects, pool, range).unwrap()).collect();
    let reservations = reservations_in(objects, &net.ranges).unwrap();
    check_held(&net.ranges, outcomes, &entries, &reservations)
}

/// ≥ 200 concurrent dual-stack ADD processes on one config, then all their DELs
/// at once: every call succeeds, every pod has exactly one address per range and
/// no address is held twice — in the CNI results and in the IPPools as the admin
/// reads them — with one reservation per address; the DELs leave the pools empty
/// and no reservation behind.
#[test]
fn burst_of_200_concurrent_dual_stack_adds_then_dels() {
    const PODS: usize = 200;
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = prepared_cluster();
    let objects = Objects::admin(&cluster).unwrap();
    let bin = thereabouts_bin();
    let net = Network::new(&cluster, "k8s-burst200", &["192.0.2.0/24", "2001:db8:80::/64"]);
    let pods = pods("burst", PODS);

    let started = Instant::now();
    let adds = run_concurrently(&bin, &net.calls("ADD", &pods, GENEROUS), WATCHDOG, None);
    let wall = started.elapsed();
    eprintln!("{}", summary("burst ADD", &adds, wall, &net.log_stats("ADD", &adds), "API"));
    expect_all_ok(&adds, "concurrent ADD");
    let all: Vec<&Outcome> = adds.iter().collect();
    let held = check_results(&net, &objects, &all);
    // Nothing else in the pools, and nothing but these reservations.
    for ((pool, range), seen) in net.pools().iter().zip(&held) {
        let entries = pool_entries(&objects, pool, range).unwrap();
        assert_eq!(entries.len(), PODS, "IPPool {pool} holds {PODS} entries");
        assert_eq!(entries.keys().collect::<BTreeSet<_>>(), seen.keys().collect(), "{pool}");
    }
    assert_eq!(reservations_in(&objects, &net.ranges).unwrap().len(), 2 * PODS, "one reservation per address");

    let started = Instant::now();
    let dels = run_concurrently(&bin, &net.calls("DEL", &pods, GENEROUS), WATCHDOG, None);
    let wall = started.elapsed();
    eprintln!("{}", summary("burst DEL", &dels, wall, &net.log_stats("DEL", &dels), "API"));
    expect_all_ok(&dels, "concurrent DEL");
    for (pool, _) in net.pools() {
        let left = objects.allocations(&pool).unwrap();
        assert!(left.is_empty(), "IPPool {pool} still holds {} entries: {left:?}", left.len());
    }
    let left = reservations_in(&objects, &net.ranges).unwrap();
    assert!(left.is_empty(), "{} reservations left: {left:?}", left.len());
}

/// The apiserver is killed (SIGKILL) while 100 ADDs with a 5 s deadline run,
/// once some have succeeded. Every ADD succeeds or answers CNI code 11 (try
/// again later), and none takes longer than its deadline plus a little (process
/// start on a busy machine). After the restart: every successful pod's
/// addresses are in the pools, unique and reserved; every other entry or
/// reservation belongs to a failed pod (a write whose answer was lost, or a
/// cleanup the outage cut off) and the DEL the runtime sends for each failed pod
/// succeeds and removes it, entries and reservations; then everything can be
/// released.
#[test]
fn apiserver_killed_during_a_burst_leaves_no_partial_allocation() {
    const PODS: usize = 100;
    const DEADLINE: Duration = Duration::from_secs(5);
    // Process start and teardown on two busy cores, and the plugin's bounded
    // cleanup of a failed commit (which fails fast: connections are refused).
    const SLACK: Duration = Duration::from_secs(2);
    // Kill once this many ADDs have succeeded, or at KILL_AT at the latest:
    // the others are in flight (100 processes starting at once on two cores
    // take a second or two before the first answers).
    const KILL_AFTER: usize = 10;
    const KILL_AT: Duration = Duration::from_secs(4);
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = prepared_cluster();
    let objects = Objects::admin(&cluster).unwrap();
    let bin = thereabouts_bin();
    let net = Network::new(&cluster, "k8s-fault", &["198.51.100.0/24", "2001:db8:81::/64"]);
    // The pools exist before the burst, as in a running cluster.
    let warm = run_one(&bin, &net.invocation("ADD", "cid-warm", "warm", GENEROUS), WATCHDOG);
    warm.expect_ok("ADD before the burst");

    let pods = pods("fault", PODS);
    let outage = run_through_outage(&bin, &net.calls("ADD", &pods, DEADLINE), WATCHDOG, KILL_AFTER, KILL_AT, || cluster.stop_apiserver());
    let adds = &outage.outcomes;
    let line = summary("ADD during the outage", adds, outage.wall, &net.log_stats("ADD", adds), "API");
    let ok = outage.check("apiserver killed", line, DEADLINE, SLACK);
    let failed: Vec<&Outcome> = adds.iter().filter(|o| !o.ok()).collect();

    cluster.start_apiserver().expect("restarting kube-apiserver");
    // The successful pods: addresses present, unique, reserved.
    let mut holders: Vec<&Outcome> = ok.clone();
    holders.push(&warm);
    check_results(&net, &objects, &holders);
    // Anything else belongs to a failed pod (a commit whose answer was lost).
    let succeeded: BTreeSet<&str> = holders.iter().map(|o| o.call.container_id.as_str()).collect();
    let failed_cids: BTreeSet<&str> = failed.iter().map(|o| o.call.container_id.as_str()).collect();
    let failed_pods: BTreeSet<String> = failed.iter().map(|o| format!("default/{}", pod_name(&o.call))).collect();
    let mut in_doubt = 0;
    for (pool, range) in net.pools() {
        for e in pool_entries(&objects, &pool, range).unwrap().values() {
            if !succeeded.contains(e.id.as_str()) {
                assert!(failed_cids.contains(e.id.as_str()), "IPPool {pool}: entry of nobody's ADD: {e:?}");
                in_doubt += 1;
            }
        }
    }
    let orphaned: Vec<String> = reservations_in(&objects, &net.ranges)
        .unwrap()
        .into_iter()
        .filter(|(_, spec)| failed_pods.contains(spec["podref"].as_str().unwrap_or_default()))
        .map(|(name, _)| name)
        .collect();
    eprintln!("after the restart: {in_doubt} pool entries and {} reservations of failed ADDs (written, answer lost or cleanup cut off)", orphaned.len());

    // The runtime's DEL for each failed ADD removes whatever it left.
    let failed_pods_list: Vec<(String, String)> = failed.iter().map(|o| (o.call.container_id.clone(), pod_name(&o.call).to_string())).collect();
    let dels = run_concurrently(&bin, &net.calls("DEL", &failed_pods_list, GENEROUS), WATCHDOG, None);
    expect_all_ok(&dels, "DEL of a failed ADD");
    for (pool, range) in net.pools() {
        let entries = pool_entries(&objects, &pool, range).unwrap();
        let stale: Vec<_> = entries.values().filter(|e| failed_cids.contains(e.id.as_str())).collect();
        assert!(stale.is_empty(), "IPPool {pool}: entries of failed ADDs after their DEL: {stale:?}");
        assert_eq!(entries.len(), holders.len(), "IPPool {pool}: exactly the successful pods' entries");
    }
    let stale: Vec<(String, Value)> = reservations_in(&objects, &net.ranges)
        .unwrap()
        .into_iter()
        .filter(|(_, spec)| failed_pods.contains(spec["podref"].as_str().unwrap_or_default()))
        .collect();
    assert!(stale.is_empty(), "reservations of failed ADDs after their DEL: {stale:?}");
    check_results(&net, &objects, &holders);

    // And the cluster carries on: the successful pods are released too.
    let holder_pods: Vec<(String, String)> = holders.iter().map(|o| (o.call.container_id.clone(), pod_name(&o.call).to_string())).collect();
    let dels = run_concurrently(&bin, &net.calls("DEL", &holder_pods, GENEROUS), WATCHDOG, None);
    expect_all_ok(&dels, "DEL after the outage");
    for (pool, _) in net.pools() {
        assert!(objects.allocations(&pool).unwrap().is_empty(), "{pool}");
    }
    let left = reservations_in(&objects, &net.ranges).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// A whereabouts v0.9.4 client on the same IPPool, as a separate thread with the
/// admin identity, every ~50 ms: it adds an entry at the lowest free offset the
/// way whereabouts does (JSON patch: `test` of the `resourceVersion` read and of
/// the entry's absence, `add`; then the reservation), or removes its oldest entry
/// with a PUT of the object read (the `resourceVersion` precondition: 409 when it
/// moved) and deletes its reservation. Conflicts are retried at the next tick.
/// Before each write it checks that every entry it holds is still there, its own.
struct Whereabouts {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
    pool: String,
    range: &'static str,
    /// Entries that stay (pods of the other plugin that live through the test).
    sticky: Vec<(u128, String)>,
    /// Entries added and removed again, oldest first, with their reservation's uid.
    churn: VecDeque<(u128, String, Option<String>)>,
    next_pod: usize,
    stats: WhereaboutsStats,
}

#[derive(Debug, Default)]
struct WhereaboutsStats {
    adds: usize,
    removes: usize,
    conflicts: usize,
    /// Reservations it could not create (someone held the address's ORIP).
    reservations_lost: usize,
    /// Entries of its own found changed or gone: must stay empty.
    violations: Vec<String>,
}

impl Whereabouts {
    const STICKY: [u128; 3] = [3, 7, 11];
    const MAX_CHURN: usize = 3;

    fn start(cluster: &Cluster, pool: &str, range: &'static str) -> Whereabouts {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = runtime.block_on(cluster.admin_client()).unwrap();
        let mut w = Whereabouts {
            runtime,
            client,
            pool: pool.to_string(),
            range,
            sticky: Vec::new(),
            churn: VecDeque::new(),
            next_pod: 0,
            stats: WhereaboutsStats::default(),
        };
        // whereabouts creates a missing pool with an empty allocation map.
        let mut allocations = serde_json::Map::new();
        for offset in Self::STICKY {
            let id = format!("wb-sticky-{offset}");
            allocations.insert(offset.to_string(), json!({"id": id, "podref": format!("other/{id}"), "ifname": "net1"}));
            w.sticky.push((offset, id));
        }
        let body = json!({"apiVersion": GROUP_VERSION, "kind": "IPPool", "metadata": {"name": pool},
            "spec": {"range": range, "allocations": allocations}});
        w.send(http::Method::POST, &w.path(IPPOOLS, None), "application/json", &body).expect("creating the IPPool");
        for (offset, id) in w.sticky.clone() {
            let ip = w.address(offset);
            w.reserve(&ip, &id).expect("reserving a sticky entry");
        }
        w
    }

    fn path(&self, plural: &str, name: Option<&str>) -> String {
        let base = format!("/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}/{plural}");
        name.map_or(base.clone(), |n| format!("{base}/{n}"))
    }

    fn address(&self, offset: u128) -> IpAddr {
        let (net, _) = thereabouts_e2e::range_network(self.range);
        thereabouts_e2e::add_offset(net, offset)
    }

    /// The answer's JSON, or the HTTP code of an API failure.
    fn send(&self, method: http::Method, path: &str, content_type: &str, body: &Value) -> Result<Value, u16> {
        let request = http::Request::builder().method(method).uri(path).header("content-type", content_type).body(serde_json::to_vec(body).unwrap()).unwrap();
        match self.runtime.block_on(self.client.request_text(request)) {
            Ok(text) => Ok(serde_json::from_str(&text).unwrap_or(Value::Null)),
            Err(kube::Error::Api(s)) => Err(s.code),
            Err(e) => panic!("whereabouts writer: {e}"),
        }
    }

    fn get(&self, path: &str) -> Result<Value, u16> {
        let request = http::Request::get(path).body(Vec::new()).unwrap();
        match self.runtime.block_on(self.client.request_text(request)) {
            Ok(text) => Ok(serde_json::from_str(&text).unwrap()),
            Err(kube::Error::Api(s)) => Err(s.code),
            Err(e) => panic!("whereabouts writer: {e}"),
        }
    }

    /// Creates the ORIP of `ip` for pod `other/<id>`; its uid, or the HTTP code.
    fn reserve(&self, ip: &IpAddr, id: &str) -> Result<String, u16> {
        let body = json!({"apiVersion": GROUP_VERSION, "kind": "OverlappingRangeIPReservation",
            "metadata": {"name": reservation_name(*ip)},
            "spec": {"podref": format!("other/{id}"), "ifname": "net1", "containerid": id}});
        self.send(http::Method::POST, &self.path(RESERVATIONS, None), "application/json", &body)
            .map(|o| o["metadata"]["uid"].as_str().unwrap_or_default().to_string())
    }

    fn held(&self) -> Vec<(u128, String)> {
        self.sticky.iter().cloned().chain(self.churn.iter().map(|(o, id, _)| (*o, id.clone()))).collect()
    }

    /// One step: check, then add or remove one entry.
    fn tick(&mut self, tick: usize) {
        let pool = self.get(&self.path(IPPOOLS, Some(&self.pool))).expect("reading the IPPool");
        let rv = pool["metadata"]["resourceVersion"].as_str().unwrap().to_string();
        let allocations = pool["spec"]["allocations"].as_object().cloned().unwrap_or_default();
        for (offset, id) in self.held() {
            let found = allocations.get(&offset.to_string()).map(|e| e["id"].clone());
            if found != Some(json!(id)) {
                self.stats.violations.push(format!("entry {offset} of {id} is now {found:?} (resourceVersion {rv})"));
            }
        }
        let add = self.churn.is_empty() || (self.churn.len() < Self::MAX_CHURN && tick.is_multiple_of(2));
        if add {
            // Lowest free offset whose address nobody has reserved (whereabouts
            // reads the ORIP of a candidate and skips it when held).
            let (_, len) = thereabouts_e2e::range_network(self.range);
            let last = (1u128 << (if self.address(0).is_ipv4() { 32 } else { 128 } - len as u32)) - 2;
            let Some(offset) = (1..=last).find(|o| {
                !allocations.contains_key(&o.to_string()) && self.get(&self.path(RESERVATIONS, Some(&reservation_name(self.address(*o))))) == Err(404)
            }) else {
                return;
            };
            let id = format!("wb-churn-{}", self.next_pod);
            let key = format!("/spec/allocations/{offset}");
            let patch = json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "test", "path": key, "value": null},
                {"op": "add", "path": key, "value": {"id": id, "podref": format!("other/{id}"), "ifname": "net1"}},
            ]);
            match self.send(http::Method::PATCH, &self.path(IPPOOLS, Some(&self.pool)), "application/json-patch+json", &patch) {
                Ok(_) => {
                    self.next_pod += 1;
                    self.stats.adds += 1;
                    let uid = match self.reserve(&self.address(offset), &id) {
                        Ok(uid) => Some(uid),
                        Err(409) => {
                            self.stats.reservations_lost += 1;
                            None
                        }
                        Err(code) => panic!("whereabouts writer: reserving {offset}: {code}"),
                    };
                    self.churn.push_back((offset, id, uid));
                }
                Err(422) => self.stats.conflicts += 1,
                Err(code) => panic!("whereabouts writer: PATCH answered {code}"),
            }
        } else {
            let (offset, _, uid) = self.churn.front().cloned().unwrap();
            let mut replaced = pool.clone();
            replaced["spec"]["allocations"].as_object_mut().unwrap().remove(&offset.to_string());
            match self.send(http::Method::PUT, &self.path(IPPOOLS, Some(&self.pool)), "application/json", &replaced) {
                Ok(_) => {
                    self.churn.pop_front();
                    self.stats.removes += 1;
                    if let Some(uid) = uid {
                        let name = reservation_name(self.address(offset));
                        let options = json!({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}});
                        match self.send(http::Method::DELETE, &self.path(RESERVATIONS, Some(&name)), "application/json", &options) {
                            Ok(_) | Err(404) => {}
                            Err(code) => {
                                panic!("whereabouts writer: deleting reservation {name}: {code}")
                            }
                        }
                    }
                }
                Err(409) => self.stats.conflicts += 1,
                Err(code) => panic!("whereabouts writer: PUT answered {code}"),
            }
        }
    }

    /// Runs [`tick`](Self::tick) every ~50 ms until `stop`.
    fn run(mut self, stop: &AtomicBool) -> Whereabouts {
        let mut tick = 0;
        while !stop.load(Ordering::SeqCst) {
            self.tick(tick);
            tick += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        self
    }
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Concurrent ADDs, then concurrent DELs, while a whereabouts client keeps
/// adding and removing its own entries in the same IPv4 pool (and holds three
/// for good): no address is handed out twice, the plugin never touches the
/// other writer's entries or reservations (nor the other writer the plugin's),
/// and the DELs leave exactly the other writer's entries.
#[test]
fn allocations_while_a_whereabouts_client_writes_the_same_pool() {
    const PODS: usize = 40;
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = prepared_cluster();
    let objects = Objects::admin(&cluster).unwrap();
    let bin = thereabouts_bin();
    let net = Network::new(&cluster, "k8s-mixed", &["203.0.113.0/24", "2001:db8:82::/64"]);
    let (v4_pool, v4_range) = net.pools()[0].clone();
    let pods = pods("mixed", PODS);

    let writer = Whereabouts::start(&cluster, &v4_pool, v4_range);
    let stop = AtomicBool::new(false);
    let (adds, dels, walls, writer) = std::thread::scope(|scope| {
        let background = scope.spawn(|| writer.run(&stop));
        // Stops the writer also when an assertion below fails (the scope waits for it).
        let _stop = StopOnDrop(&stop);
        let started = Instant::now();
        let adds = run_concurrently(&bin, &net.calls("ADD", &pods, GENEROUS), WATCHDOG, None);
        let add_wall = started.elapsed();
        // While the other writer goes on: the plugin's entries as the results say.
        expect_all_ok(&adds, "ADD beside a whereabouts writer");
        let all: Vec<&Outcome> = adds.iter().collect();
        let held = check_results(&net, &objects, &all);
        let foreign: BTreeSet<IpAddr> =
            Whereabouts::STICKY.iter().map(|o| thereabouts_e2e::add_offset(thereabouts_e2e::range_network(v4_range).0, *o)).collect();
        assert!(held[0].keys().all(|a| !foreign.contains(a)), "the plugin handed out a held address");
        let started = Instant::now();
        let dels = run_concurrently(&bin, &net.calls("DEL", &pods, GENEROUS), WATCHDOG, None);
        let del_wall = started.elapsed();
        stop.store(true, Ordering::SeqCst);
        (adds, dels, (add_wall, del_wall), background.join().unwrap())
    });
    let stats = &writer.stats;
    eprintln!(
        "{}\n{}\nwhereabouts writer: {} adds, {} removes, {} conflicts retried, {} reservations found taken",
        summary("ADD beside whereabouts", &adds, walls.0, &net.log_stats("ADD", &adds), "API"),
        summary("DEL beside whereabouts", &dels, walls.1, &net.log_stats("DEL", &dels), "API"),
        stats.adds,
        stats.removes,
        stats.conflicts,
        stats.reservations_lost
    );
    expect_all_ok(&dels, "DEL beside a whereabouts writer");
    assert!(stats.violations.is_empty(), "the other writer's entries changed: {:?}", stats.violations);
    assert!(stats.adds >= 2 && stats.adds + stats.removes + stats.conflicts >= 10, "the other writer kept writing: {stats:?}");

    // Exactly the other writer's entries remain, as it wrote them.
    let entries = pool_entries(&objects, &v4_pool, v4_range).unwrap();
    let remaining: BTreeMap<String, String> = entries.values().map(|e| (e.key.clone(), e.id.clone())).collect();
    let expected: BTreeMap<String, String> = writer.held().into_iter().map(|(o, id)| (o.to_string(), id)).collect();
    assert_eq!(remaining, expected, "IPPool {v4_pool} after the DELs");
    assert!(objects.allocations(&net.pools()[1].0).unwrap().is_empty());
    // Reservations: the other writer's (those it created), none of the plugin's pods.
    let reservations = reservations_in(&objects, &net.ranges).unwrap();
    let plugin_left: Vec<_> = reservations.iter().filter(|(_, spec)| spec["podref"].as_str().unwrap_or_default().starts_with("default/")).collect();
    assert!(plugin_left.is_empty(), "the plugin's reservations left: {plugin_left:?}");
    for (offset, id) in &writer.sticky {
        let name = reservation_name(writer.address(*offset));
        assert_eq!(reservations.get(&name).map(|s| s["podref"].clone()), Some(json!(format!("other/{id}"))), "{name}");
    }
    for (offset, id, uid) in &writer.churn {
        if uid.is_some() {
            let name = reservation_name(writer.address(*offset));
            assert_eq!(reservations.get(&name).map(|s| s["podref"].clone()), Some(json!(format!("other/{id}"))), "{name}");
        }
    }
}
