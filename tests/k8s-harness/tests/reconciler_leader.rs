//! Leadership and outages against the real kube-apiserver: two replicas of
//! `thereabouts controller`, the leader killed mid-pass; a Lease taken away
//! mid-pass; the apiserver killed and restarted mid-pass. What each replica
//! wrote, and when, comes from the apiserver's audit log: every replica's
//! requests carry `thereabouts-controller/<identity>` as user agent.

use std::time::Duration;

use serde_json::json;
use thereabouts_e2e::{Call, Invocation, TempDir, thereabouts_bin};
use thereabouts_k8s_harness::controller::{self, Controller, Settings};
use thereabouts_k8s_harness::plugin::{Objects, RESERVATIONS, kubernetes_conf};
use thereabouts_k8s_harness::{AuditedWrite, Cluster, LatencyProxy, NAMESPACE, block_on, pods, wait_until};

const V4: &str = "192.0.2.0/24";
const V6: &str = "2001:db8::/64";

fn now_us() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_microsecond()
}

struct Setup {
    cluster: Cluster,
    objects: Objects,
    tmp: TempDir,
    /// The controller's kubeconfig through a proxy that adds latency, so that a pass lasts seconds.
    slow: std::path::PathBuf,
    _proxy: LatencyProxy,
}

/// `gone` pods that ran their ADD and were deleted without a DEL, and `live`
/// running ones: a first pass has 4 writes per gone pod to make.
fn setup(tag: &str, gone: usize, live: usize) -> Setup {
    let cluster = Cluster::prepared().unwrap();
    let objects = Objects::admin(&cluster).unwrap();
    let tmp = TempDir::new(tag);
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    block_on(pods::node(&cluster, "node-1", true)).unwrap();
    let conf = kubernetes_conf("blue", &cluster.plugin_kubeconfig(), Some("blue"), &[V4, V6]);
    for i in 0..gone + live {
        let pod = if i < gone { format!("gone-{i}") } else { format!("live-{i}") };
        block_on(pods::create(&cluster, &pod, "node-1")).unwrap();
        let mut call = Call::pod("ADD", &format!("cid-{pod}"), &pod);
        call.ifname = "net1".into();
        let outcome = Invocation::new(call, conf.to_string()).run(&thereabouts_bin());
        outcome.expect_ok("ADD");
        if i < gone {
            block_on(pods::delete(&cluster, &pod)).unwrap();
        } else {
            let ips: Vec<_> = outcome.ips().iter().map(|a| a.split('/').next().unwrap().parse().unwrap()).collect();
            block_on(pods::set_phase(&cluster, &pod, "Running", "")).unwrap();
            block_on(pods::set_network_status(&cluster, &pod, "blue", "net1", &ips)).unwrap();
        }
    }
    let proxy = LatencyProxy::with_latency(&cluster, Duration::from_millis(60)).unwrap();
    let slow = tmp.path().join("slow.kubeconfig");
    proxy.kubeconfig(&kubeconfig, &slow).unwrap();
    Setup { cluster, objects, tmp, slow, _proxy: proxy }
}

impl Setup {
    fn start(&self, identity: &str, lease_seconds: u64) -> (Controller, String) {
        let settings = Settings { identity: identity.into(), lease_seconds, ..Settings::default() };
        let c = Controller::run(&thereabouts_bin(), &self.slow, &settings, &self.tmp.path().join(format!("controller-{identity}.log"))).unwrap();
        let agent = format!("thereabouts-controller/{identity}-{}", c.pid());
        (c, agent)
    }

    /// The pools' and reservations' writes `agent` sent (not its Lease's).
    fn writes_of(&self, agent: &str) -> Vec<AuditedWrite> {
        self.cluster.audit_writes().unwrap().into_iter().filter(|w| w.user_agent == agent && !w.object.starts_with("leases/")).collect()
    }

    fn reservations_of(&self, prefix: &str) -> usize {
        self.objects.list(RESERVATIONS).unwrap().values().filter(|r| r["spec"]["podref"].as_str().unwrap_or_default().starts_with(prefix)).count()
    }

    fn lease_holder(&self) -> String {
        let lease = self.objects.list_at("coordination.k8s.io/v1", "leases").unwrap();
        lease.get("thereabouts-controller").and_then(|l| l["spec"]["holderIdentity"].as_str()).unwrap_or_default().to_string()
    }
}

#[test]
fn the_leader_killed_mid_pass_is_replaced_within_a_lease_and_two_replicas_never_write_together() {
    let s = setup("leader-kill", 20, 5);
    let lease_seconds = 4;
    let (mut a, agent_a) = s.start("a", lease_seconds);
    wait_until("a leads", Duration::from_secs(20), Duration::from_millis(50), || s.lease_holder().starts_with("a-"));
    let (b, agent_b) = s.start("b", lease_seconds);
    wait_until("a is mid-pass", Duration::from_secs(30), Duration::from_millis(50), || s.writes_of(&agent_a).len() >= 3);
    a.kill();
    let killed = now_us();
    wait_until("b leads", Duration::from_secs(20), Duration::from_millis(50), || s.lease_holder().starts_with("b-"));
    let took_over = (now_us() - killed) as f64 / 1e6;
    wait_until("every gone pod is freed", Duration::from_secs(60), Duration::from_millis(50), || s.reservations_of("default/gone") == 0);

    let (writes_a, writes_b) = (s.writes_of(&agent_a), s.writes_of(&agent_b));
    let last_a = writes_a.iter().map(|w| w.answered_us).max().unwrap();
    let first_b = writes_b.iter().map(|w| w.received_us).min().expect("b wrote after taking over");
    let leases: Vec<String> = s
        .cluster
        .audit_writes()
        .unwrap()
        .iter()
        .filter(|w| w.object == "leases/thereabouts-controller" && w.code < 300)
        .map(|w| format!("{} {} {}", w.received_us, w.user_agent, w.verb))
        .collect();
    eprintln!(
        "a wrote {} times, was killed, b took the Lease {took_over:.2} s later and wrote {} times; Lease writes: {leases:#?}",
        writes_a.len(),
        writes_b.len()
    );
    // Renewals come every duration minus grace (a third): 4 s + 2 s, and the proxy's latency.
    assert!(took_over <= (lease_seconds + 2) as f64 + 1.0, "b took over after {took_over:.2} s");
    // A write of a's may still be in flight (through the latency proxy) when
    // it dies and be answered after; what counts is that b's come after it.
    assert!(first_b > last_a, "the replicas' writes overlap: a's last answered at {last_a}, b's first received at {first_b}");
    assert_eq!(s.reservations_of("default/live"), 10, "the live pods keep their reservations");
    drop(b);
}

#[test]
fn a_replica_whose_lease_is_taken_mid_pass_stops_before_its_next_write() {
    let s = setup("leader-lost", 20, 0);
    let (_a, agent_a) = s.start("a", 30);
    wait_until("a is mid-pass", Duration::from_secs(30), Duration::from_millis(50), || s.writes_of(&agent_a).len() >= 3);
    // Another replica's Lease, as if a's renewals had stopped reaching the apiserver.
    let lease = json!({"spec": {"holderIdentity": "intruder", "renewTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(), "leaseDurationSeconds": 60}});
    let taken = now_us();
    block_on(async {
        let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> = kube::Api::namespaced(s.cluster.admin_client().await?, NAMESPACE);
        leases.patch("thereabouts-controller", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&lease)).await?;
        anyhow::Ok(())
    })
    .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let after: Vec<_> = s.writes_of(&agent_a).into_iter().filter(|w| w.received_us > taken).collect();
    // One batch of writes (4, `reconcile::WRITES_AT_ONCE`) may have been on its way.
    assert!(after.len() <= 4, "a wrote {} times after losing its Lease: {after:?}", after.len());
    assert!(s.reservations_of("default/gone") > 0, "the pass stopped: some gone pods are left for the next leader");
}

#[test]
fn an_apiserver_restarted_mid_pass_is_survived_and_nothing_live_is_freed() {
    let s = setup("leader-restart", 20, 10);
    let (c, agent) = s.start("a", 4);
    wait_until("a is mid-pass", Duration::from_secs(30), Duration::from_millis(50), || s.writes_of(&agent).len() >= 3);
    s.cluster.stop_apiserver();
    std::thread::sleep(Duration::from_secs(2));
    s.cluster.start_apiserver().unwrap();
    wait_until("every gone pod is freed after the restart", Duration::from_secs(90), Duration::from_millis(50), || s.reservations_of("default/gone") == 0);
    assert_eq!(s.reservations_of("default/live"), 20, "the live pods keep their reservations");
    let sample = r#"thereabouts_reconcile_passes_total{kind="full",outcome="failed"}"#;
    eprintln!("passes failed during the outage: {}", c.metric(sample).unwrap_or(0.0));
}
