//! The exact requests of each path of the store, driven through `ipam` with the
//! real engine against an in-memory etcd ([`memory`]): one store per CNI call,
//! as the plugin runs, each call's requests pinned with their guards, and the
//! keys left behind.

use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use thereabouts_allocator::model::NormalizedConfig;

use super::memory::MemoryEtcd;
use super::transport::Failure;
use super::*;
use crate::component::EngineComponent;
use crate::ipam::{self, Attachment, IpamError};

const P24: &str = "/thereabouts/pools/192.0.2.0-24";
const P30: &str = "/thereabouts/pools/192.0.2.0-30";
const R1: &str = "/thereabouts/reservations/192.0.2.1";
const R2: &str = "/thereabouts/reservations/192.0.2.2";

/// One node's plugin calls for a network on `ranges`, against one etcd.
struct Node {
    engine: MutexGuard<'static, EngineComponent>,
    etcd: MemoryEtcd,
    conf: Value,
}

impl Node {
    fn new(ranges: &[&str], overlapping: bool) -> Node {
        let ipam = json!({
            "type": "thereabouts", "datastore": "etcd", "etcd_host": "127.0.0.1:2379", "enable_overlapping_ranges": overlapping,
            "ipRanges": ranges.iter().map(|r| json!({"range": r})).collect::<Vec<_>>(),
        });
        let conf = json!({"cniVersion": "1.1.0", "name": "net", "type": "x", "ipam": ipam});
        Node { engine: crate::component::test_engine(), etcd: MemoryEtcd::default(), conf }
    }

    fn config(&mut self, pod: &str) -> NormalizedConfig {
        crate::network_config::load(&mut self.engine, &self.conf.to_string(), &format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}")).unwrap().0
    }

    /// Runs `call` on a store of its own (a plugin process); returns its
    /// outcome and its requests, which the store counted exactly.
    fn call<T>(&mut self, pod: &str, call: impl FnOnce(&mut EngineComponent, &EtcdStore, &NormalizedConfig) -> T) -> (T, Vec<String>) {
        let config = self.config(pod);
        let d = &config.datastore;
        let store = EtcdStore::with_transport(settings::read(d).unwrap(), Layout::new(d.etcd_prefix.as_deref()), Box::new(self.etcd.client()));
        let outcome = call(&mut self.engine, &store, &config);
        let log = self.etcd.take_log();
        assert_eq!(store.requests() as usize, log.len(), "{log:?}");
        (outcome, log)
    }

    fn add(&mut self, cid: &str, pod: &str) -> (Result<Vec<String>, IpamError>, Vec<String>) {
        self.call(pod, |engine, store, config| {
            let who = Attachment { container_id: cid, ifname: "eth0", claim: None };
            ipam::allocate(engine, store, config, &crate::placement::Placement::whole(config), who, ipam::Wishes::default(), deadline())
                .map(|a| a.into_iter().map(|a| a.address).collect())
        })
    }

    fn del(&mut self, cid: &str, pod: &str) -> (Result<usize, IpamError>, Vec<String>) {
        self.call(pod, |engine, store, config| {
            ipam::release(
                engine,
                store,
                config,
                &crate::placement::Placement::whole(config),
                Attachment { container_id: cid, ifname: "eth0", claim: None },
                deadline(),
            )
            .map(|r| r.removed)
        })
    }
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

fn entry(cid: &str, pod: &str) -> String {
    format!(r#"{{"id":"{cid}","podref":"default/{pod}","ifname":"eth0"}}"#)
}

fn pool(range: &str, entries: &[(u128, &str, &str)]) -> String {
    let entries: Vec<String> = entries.iter().map(|(offset, cid, pod)| format!(r#""{offset}":{}"#, entry(cid, pod))).collect();
    format!(r#"{{"range":"{range}","allocations":{{{}}}}}"#, entries.join(","))
}

fn reservation(cid: &str, pod: &str) -> String {
    format!(r#"{{"containerid":"{cid}","podref":"default/{pod}","ifname":"eth0"}}"#)
}

fn kv(key: &str, value: String) -> (String, String) {
    (key.to_string(), value)
}

#[test]
fn an_uncontended_add_is_one_read_and_one_guarded_transaction() {
    let mut n = Node::new(&["192.0.2.0/24"], true);
    let (ips, log) = n.add("c1", "a");
    assert_eq!(ips.unwrap(), ["192.0.2.1/24"]);
    assert_eq!(
        log,
        [
            "CONNECT",
            "GET pools/192.0.2.0-24",
            "TXN GET reservations/192.0.2.1",
            "TXN if create(pools/192.0.2.0-24)=0, create(reservations/192.0.2.1)=0 then PUT reservations/192.0.2.1, PUT pools/192.0.2.0-24 -> succeeded",
        ]
    );
    assert_eq!(n.etcd.dump(), [kv(P24, pool("192.0.2.0/24", &[(1, "c1", "a")])), kv(R1, reservation("c1", "a"))]);

    // `enable_overlapping_ranges: false`: no reservation keys; the next ADD is
    // guarded by the revision its read saw (the first commit's, 2).
    drop(n);
    let mut n = Node::new(&["192.0.2.0/24"], false);
    assert_eq!(n.add("c1", "a").1[1..], ["GET pools/192.0.2.0-24", "TXN if create(pools/192.0.2.0-24)=0 then PUT pools/192.0.2.0-24 -> succeeded"]);
    let (ips, log) = n.add("c2", "b");
    assert_eq!(ips.unwrap(), ["192.0.2.2/24"]);
    assert_eq!(log, ["CONNECT", "GET pools/192.0.2.0-24", "TXN if mod(pools/192.0.2.0-24)=2 then PUT pools/192.0.2.0-24 -> succeeded"]);
    assert_eq!(n.etcd.dump(), [kv(P24, pool("192.0.2.0/24", &[(1, "c1", "a"), (2, "c2", "b")]))]);
}

#[test]
fn a_dual_stack_add_reads_both_pools_in_one_transaction_and_commits_both_in_one() {
    let mut n = Node::new(&["192.0.2.0/24", "2001:db8::/64"], true);
    let (ips, log) = n.add("c1", "a");
    assert_eq!(ips.unwrap(), ["192.0.2.1/24", "2001:db8::1/64"]);
    assert_eq!(
        log,
        [
            "CONNECT",
            "TXN GET pools/192.0.2.0-24, GET pools/2001-db8---64",
            "TXN GET reservations/192.0.2.1, GET reservations/2001-db8--1",
            "TXN if create(pools/192.0.2.0-24)=0, create(reservations/192.0.2.1)=0, create(pools/2001-db8---64)=0, create(reservations/2001-db8--1)=0 \
             then PUT reservations/192.0.2.1, PUT pools/192.0.2.0-24, PUT reservations/2001-db8--1, PUT pools/2001-db8---64 -> succeeded",
        ]
    );
    // The DEL in the same shape: one read, one read of the reservations, one commit.
    let (removed, log) = n.del("c1", "a");
    assert_eq!(removed.unwrap(), 2);
    assert_eq!(
        log,
        [
            "CONNECT",
            "TXN GET pools/192.0.2.0-24, GET pools/2001-db8---64",
            "TXN GET reservations/192.0.2.1, GET reservations/2001-db8--1",
            "TXN if mod(pools/192.0.2.0-24)=2, mod(reservations/192.0.2.1)=2, mod(pools/2001-db8---64)=2, mod(reservations/2001-db8--1)=2 \
             then DELETE reservations/192.0.2.1, PUT pools/192.0.2.0-24, DELETE reservations/2001-db8--1, PUT pools/2001-db8---64 -> succeeded",
        ]
    );
    assert_eq!(n.etcd.dump(), [kv(P24, pool("192.0.2.0/24", &[])), kv("/thereabouts/pools/2001-db8---64", pool("2001:db8::/64", &[]))]);
}

#[test]
fn an_add_that_loses_the_race_reads_again_and_plans_again() {
    // A /30: .1 and .2 only, so the re-plan's choice does not depend on the spread.
    let mut n = Node::new(&["192.0.2.0/30"], true);
    // Another writer takes .1 between this ADD's read and its commit.
    n.etcd.before(4, |keys| keys.put(P30, &pool("192.0.2.0/30", &[(1, "c9", "z")])));
    let (ips, log) = n.add("c1", "a");
    assert_eq!(ips.unwrap(), ["192.0.2.2/30"]);
    assert_eq!(
        log,
        [
            "CONNECT",
            "GET pools/192.0.2.0-30",
            "TXN GET reservations/192.0.2.1",
            "TXN if create(pools/192.0.2.0-30)=0, create(reservations/192.0.2.1)=0 then PUT reservations/192.0.2.1, PUT pools/192.0.2.0-30 -> failed",
            "GET pools/192.0.2.0-30",
            "TXN GET reservations/192.0.2.2",
            "TXN if mod(pools/192.0.2.0-30)=2, create(reservations/192.0.2.2)=0 then PUT reservations/192.0.2.2, PUT pools/192.0.2.0-30 -> succeeded",
        ]
    );
    // Nothing of the failed transaction landed: no reservation of .1.
    assert_eq!(n.etcd.dump(), [kv(P30, pool("192.0.2.0/30", &[(1, "c9", "z"), (2, "c1", "a")])), kv(R2, reservation("c1", "a"))]);
}

#[test]
fn an_address_an_overlapping_range_reserved_is_planned_around_at_once() {
    let mut n = Node::new(&["192.0.2.0/24"], true);
    // Reserved by another network's /28 before this ADD read its pool.
    n.etcd.put(R1, &reservation("c9", "z"));
    let (ips, log) = n.add("c1", "a");
    // The lowest free: not a conflict, whose re-plan would spread (to .7 here).
    assert_eq!(ips.unwrap(), ["192.0.2.2/24"]);
    assert_eq!(
        log,
        [
            "CONNECT",
            "GET pools/192.0.2.0-24",
            "TXN GET reservations/192.0.2.1",
            // Refused before anything is written; read again and planned around .1.
            "GET pools/192.0.2.0-24",
            "TXN GET reservations/192.0.2.2",
            "TXN if create(pools/192.0.2.0-24)=0, create(reservations/192.0.2.2)=0 then PUT reservations/192.0.2.2, PUT pools/192.0.2.0-24 -> succeeded",
        ]
    );
    assert_eq!(n.etcd.dump()[1..], [kv(R1, reservation("c9", "z")), kv(R2, reservation("c1", "a"))]);
}

#[test]
fn a_del_deletes_the_entry_and_its_reservation_in_one_transaction() {
    let mut n = Node::new(&["192.0.2.0/24"], true);
    n.add("c1", "a").0.unwrap();
    n.add("c2", "b").0.unwrap();
    let (removed, log) = n.del("c1", "a");
    assert_eq!(removed.unwrap(), 1);
    assert_eq!(
        log,
        [
            "CONNECT",
            "GET pools/192.0.2.0-24",
            "TXN GET reservations/192.0.2.1",
            "TXN if mod(pools/192.0.2.0-24)=3, mod(reservations/192.0.2.1)=2 then DELETE reservations/192.0.2.1, PUT pools/192.0.2.0-24 -> succeeded",
        ]
    );
    assert_eq!(n.etcd.dump(), [kv(P24, pool("192.0.2.0/24", &[(2, "c2", "b")])), kv(R2, reservation("c2", "b"))]);
    // Nothing of its left: one read, nothing written.
    let (removed, log) = n.del("c1", "a");
    assert_eq!((removed.unwrap(), log), (0, vec!["CONNECT".to_string(), "GET pools/192.0.2.0-24".into()]));
}

/// Issue 11, defect 3: a pod's sandbox re-created (the new container adopts
/// the entry), then the old container's DEL: entry and reservation stay.
#[test]
fn the_old_containers_del_keeps_the_reservation_its_pod_still_uses() {
    let mut n = Node::new(&["192.0.2.0/24"], true);
    n.add("c1", "a").0.unwrap();
    let (ips, log) = n.add("c2", "a");
    assert_eq!(ips.unwrap(), ["192.0.2.1/24"]);
    assert_eq!(log, ["CONNECT", "GET pools/192.0.2.0-24", "TXN if mod(pools/192.0.2.0-24)=2 then PUT pools/192.0.2.0-24 -> succeeded"]);
    let (removed, log) = n.del("c1", "a");
    assert_eq!((removed.unwrap(), log), (0, vec!["CONNECT".to_string(), "GET pools/192.0.2.0-24".into()]));
    assert_eq!(n.etcd.dump(), [kv(P24, pool("192.0.2.0/24", &[(1, "c2", "a")])), kv(R1, reservation("c1", "a"))]);
    // The new container's DEL frees both: the reservation is its pod's.
    let (removed, log) = n.del("c2", "a");
    assert_eq!(removed.unwrap(), 1);
    assert_eq!(
        log[3],
        "TXN if mod(pools/192.0.2.0-24)=3, mod(reservations/192.0.2.1)=2 then DELETE reservations/192.0.2.1, PUT pools/192.0.2.0-24 -> succeeded"
    );
    assert_eq!(n.etcd.dump(), [kv(P24, pool("192.0.2.0/24", &[]))]);
}

#[test]
fn failures_are_classed_as_unavailable_denied_rejected_or_config() {
    let failed = |class| Failure::Failed { class, detail: "cause".into() };
    let server = "etcd http://127.0.0.1:2379";
    let read = "reading pool key /thereabouts/pools/192.0.2.0-24";
    // Each on other requests: the commit (and its 3 resends), the reads, connecting.
    let cases = [
        (4..=7, failed(Class::Transient), format!("{server} unavailable while committing pool(s) 192.0.2.0-24 in one transaction: cause")),
        (2..=2, failed(Class::Denied), format!("{server} denied {read}: cause (check etcd_username, etcd_password and the user's role on the prefix)")),
        (3..=3, failed(Class::Rejected), format!("{server} rejected reading 1 reservation key(s) under /thereabouts/reservations/: cause")),
        (1..=1, Failure::Config { detail: "cause".into() }, "etcd datastore config unusable: connecting: cause".into()),
    ];
    for (requests, failure, message) in cases {
        let mut n = Node::new(&["192.0.2.0/24"], true);
        let class = failure.clone();
        for request in requests.clone() {
            n.etcd.fail(request, failure.clone());
        }
        let request = *requests.end();
        let (result, log) = n.add("c1", "a");
        let Err(IpamError::Datastore(e)) = result else { panic!("{result:?}") };
        let variant_fits = match class {
            Failure::Failed { class: Class::Transient, .. } => matches!(e, DatastoreError::Unavailable { .. }),
            Failure::Failed { class: Class::Denied, .. } => matches!(e, DatastoreError::Denied { .. }),
            Failure::Failed { class: Class::Rejected, .. } => matches!(e, DatastoreError::Rejected { .. }),
            Failure::Config { .. } => matches!(e, DatastoreError::EtcdConfig { .. }),
        };
        assert!(variant_fits, "{e:?}");
        assert_eq!(e.to_string(), message);
        // Not retried past these, nothing written.
        assert_eq!(log.len(), request, "{log:?}");
        assert_eq!(n.etcd.dump(), []);
    }
}

#[test]
fn a_request_that_found_no_member_is_sent_again() {
    let mut n = Node::new(&["192.0.2.0/24"], true);
    // A follower stopped: its connection broke under the read, then the commit.
    n.etcd.fail(2, Failure::Failed { class: Class::Transient, detail: "transport error".into() });
    n.etcd.fail(5, Failure::Failed { class: Class::Transient, detail: "transport error".into() });
    let (result, log) = n.add("c1", "a");
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(log[1..3], ["GET pools/192.0.2.0-24", "GET pools/192.0.2.0-24"]);
    assert_eq!(format!("{} -> succeeded", log[4]), log[5]);
    assert_eq!(n.etcd.dump().len(), 2);
}

#[test]
fn status_probes_the_prefix_and_a_spent_budget_sends_nothing() {
    let etcd = MemoryEtcd::default();
    let d = DatastoreSettings { kind: Some("etcd".into()), etcd_hosts: vec!["127.0.0.1:2379".into()], ..Default::default() };
    let store = || EtcdStore::with_transport(settings::read(&d).unwrap(), Layout::new(None), Box::new(etcd.client()));
    let s = store();
    s.check_usable(Instant::now() + Duration::from_secs(5)).unwrap();
    assert_eq!(etcd.take_log(), ["CONNECT", "PROBE"]);
    // Out of time before the request: counted, never sent, try again later.
    let s = store();
    let e = s.check_usable(Instant::now()).unwrap_err();
    assert_eq!(e.to_string(), "etcd http://127.0.0.1:2379 unavailable while connecting: the call's time budget ran out before the request");
    assert_eq!((s.requests(), etcd.take_log()), (1, Vec::<String>::new()));
}

#[test]
fn a_pool_etcd_refuses_as_too_large_is_full_not_unavailable() {
    let mut n = Node::new(&["192.0.2.0/24"], true);
    n.etcd.fail(4, Failure::Failed { class: Class::Rejected, detail: "status: InvalidArgument, message: \"etcdserver: request is too large\"".into() });
    let (result, _) = n.add("c1", "a");
    let Err(IpamError::Datastore(e)) = result else { panic!("{result:?}") };
    assert!(matches!(&e, DatastoreError::PoolTooLarge { object, entries: 1 } if object == "etcd pool key(s) 192.0.2.0-24"), "{e:?}");
    assert_eq!(n.etcd.dump(), []);
}
