//! The exact requests of each path of the store, against a scripted API server
//! ([`mock_api`]): method, path and query, and the bodies that carry the
//! compare-and-swap (patch `test`s, reservation owners, delete preconditions).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use thereabouts_allocator::model::Allocation;

use super::mock_api::{Answer, store};
use super::*;
use crate::datastore::{Change, Outcome, Pool, PoolUpdate, Retry, Version};

const API: &str = "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/ns";

fn pool(cidr: &str) -> PoolId {
    PoolId { name: cidr.replace('/', "-"), cidr: cidr.into(), node_local: false }
}

fn alloc(offset: u128, cid: &str, pod: &str) -> Allocation {
    Allocation { offset, container_id: cid.into(), pod_ref: format!("default/{pod}"), ifname: "eth0".into(), claim: None }
}

fn entry(cid: &str, pod: &str) -> Value {
    json!({"id": cid, "podref": format!("default/{pod}"), "ifname": "eth0"})
}

/// A LIST of one pool by name, as the apiserver answers it at `revision`.
fn listed(id: &PoolId, rv: &str, revision: &str, allocations: Value) -> Answer {
    let item = json!({"metadata": {"name": id.name, "resourceVersion": rv}, "spec": {"range": id.cidr, "allocations": allocations}});
    Answer::Ok(json!({"metadata": {"resourceVersion": revision}, "items": [item]}))
}

fn empty_list(revision: &str) -> Answer {
    Answer::Ok(json!({"metadata": {"resourceVersion": revision}, "items": []}))
}

fn reservation(name: &str, uid: &str, rv: &str, holder: &Allocation) -> Value {
    json!({"metadata": {"name": name, "uid": uid, "resourceVersion": rv}, "spec": {"containerid": holder.container_id, "podref": holder.pod_ref, "ifname": holder.ifname}})
}

fn created(uid: &str) -> Answer {
    Answer::Ok(json!({"metadata": {"uid": uid}}))
}

fn ok() -> Answer {
    Answer::Ok(json!({}))
}

fn list_path(id: &PoolId) -> String {
    format!("{API}/ippools?fieldSelector=metadata.name%3D{}&resourceVersion=0", id.name)
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn add(id: &PoolId, expected: &str, name: &str, a: &Allocation) -> PoolUpdate {
    PoolUpdate {
        pool: id.clone(),
        expected: Version(expected.into()),
        changes: vec![Change::Reserve { name: name.into(), holder: a.clone() }, Change::Insert(a.clone())],
    }
}

fn conflict(r: Result<Outcome, DatastoreError>) -> bool {
    matches!(r, Ok(Outcome::Retry(Retry::Conflict { .. })))
}

fn reserved(r: Result<Outcome, DatastoreError>) -> bool {
    matches!(r, Ok(Outcome::Retry(Retry::Reserved { .. })))
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

/// A turn ticket for `pools` as the apiserver returns it (created or listed).
fn ticket(name: &str, rv: &str, pools: &str) -> Value {
    json!({"metadata": {"name": name, "resourceVersion": rv, "annotations": {turn::POOLS_ANNOTATION: pools}}})
}

/// The queue as listed: `items` and the caller's own ticket t1 (version 20),
/// which a call finds there until it leaves the queue.
fn tickets(mut items: Vec<Value>) -> Answer {
    items.push(ticket("t1", "20", "192.0.2.0-24"));
    Answer::Ok(json!({"metadata": {"resourceVersion": "100"}, "items": items}))
}

/// The queue as listed after the caller's own ticket left it.
fn tickets_without_mine(items: Vec<Value>) -> Answer {
    Answer::Ok(json!({"metadata": {"resourceVersion": "100"}, "items": items}))
}

/// The answers to a first attempt at 192.0.2.1 of pool `p` that `refusal`
/// turns down, up to the ticket `t1` (version 20) it then creates: read,
/// reservation, the refused patch, the reservation freed before queueing.
fn first_attempt_refused(p: &PoolId, refusal: Answer) -> Vec<Answer> {
    vec![listed(p, "10", "12", json!({})), created("u1"), refusal, ok(), Answer::Ok(ticket("t1", "20", &p.name))]
}

/// Begins a call on `p` and runs the first attempt [`first_attempt_refused`]
/// scripts; it returns having taken its turn or gone without one.
fn lose_first_attempt<'s>(s: &'s KubernetesStore, p: &PoolId) -> Box<dyn Transaction + 's> {
    let mut tx = s.begin(std::slice::from_ref(p), Purpose::Update, deadline()).unwrap();
    tx.load().unwrap();
    assert!(conflict(tx.commit(&[add(p, "10", "192.0.2.1", &alloc(1, "c1", "a"))])));
    tx
}

/// The answers to a first attempt that finds the pool `p` created by someone
/// else (409), frees its reservation of .1 and takes its turn, nobody ahead.
fn lost_pool_creation(p: &PoolId) -> Vec<Answer> {
    vec![empty_list("5"), created("u1"), Answer::Status(409, "AlreadyExists", Value::Null), ok(), Answer::Ok(ticket("t1", "20", &p.name)), tickets(vec![])]
}

/// Begins a call on `p` and runs the attempt [`lost_pool_creation`] scripts
/// (`a` at .1 on a pool that did not exist); it returns in its turn.
fn lose_pool_creation<'s>(s: &'s KubernetesStore, p: &PoolId, a: &Allocation) -> Box<dyn Transaction + 's> {
    let mut tx = s.begin(std::slice::from_ref(p), Purpose::Update, deadline()).unwrap();
    tx.load().unwrap();
    assert!(conflict(tx.commit(&[PoolUpdate { expected: Version::absent(), ..add(p, "", "192.0.2.1", a) }])));
    tx
}

fn uid_precondition(uid: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}})
}

#[test]
fn add_reads_reserves_then_writes_the_pool() {
    let (p, absent) = (pool("192.0.2.0/24"), pool("198.51.100.0/24"));
    let (s, log, script) =
        store("ns", vec![listed(&p, "10", "12", json!({"1": entry("c1", "a")})), empty_list("12"), created("u2"), created("u3"), ok(), ok()]);
    let mut tx = s.begin(&[p.clone(), absent.clone()], Purpose::Update, deadline()).unwrap();
    let loaded = tx.load().unwrap();
    assert_eq!((&loaded[0].version, &loaded[0].entries), (&Version("10".into()), &vec![alloc(1, "c1", "a")]));
    assert_eq!(loaded[1], Pool::default());
    let b = alloc(2, "c2", "b");
    let into_absent = PoolUpdate { expected: Version::absent(), ..add(&absent, "", "198.51.100.2", &b) };
    assert_eq!(tx.commit(&[add(&p, "10", "192.0.2.2", &b), into_absent]).unwrap(), Outcome::Committed);
    assert_eq!(
        log.lines(),
        [
            format!("GET {}", list_path(&p)),
            format!("GET {}", list_path(&absent)),
            format!("POST {API}/overlappingrangeipreservations"),
            format!("POST {API}/overlappingrangeipreservations"),
            format!("PATCH {API}/ippools/192.0.2.0-24"),
            format!("POST {API}/ippools"),
        ]
    );
    assert_eq!(log.body(2), crd::new_reservation("192.0.2.2", "ns", &b));
    // A first attempt fails fast: the version read is tested first.
    assert_eq!(
        log.body(4),
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "10"},
            {"op": "test", "path": "/spec/allocations/2", "value": null},
            {"op": "add", "path": "/spec/allocations/2", "value": entry("c2", "b")}
        ])
    );
    assert_eq!(log.body(5)["spec"], json!({"range": "198.51.100.0/24", "allocations": {"2": entry("c2", "b")}}));
    // Committed: nothing is left to free when the call ends.
    drop(tx);
    assert_eq!(log.lines().len(), 6);
    // Without reservations (`enable_overlapping_ranges: false`): the pool write alone.
    script.then(vec![listed(&p, "13", "13", json!({"1": entry("c1", "a"), "2": entry("c2", "b")})), ok()]);
    let mut tx = s.begin(std::slice::from_ref(&p), Purpose::Update, deadline()).unwrap();
    tx.load().unwrap();
    tx.commit(&[PoolUpdate { pool: p.clone(), expected: Version("13".into()), changes: vec![Change::Insert(alloc(3, "c3", "c"))] }]).unwrap();
    assert_eq!(log.lines()[6..], [format!("GET {}", list_path(&p)), format!("PATCH {API}/ippools/192.0.2.0-24")]);
}

#[test]
fn add_after_a_lost_pool_race_frees_its_reservation_takes_its_turn_and_reuses_reservations_in_it() {
    let p = pool("192.0.2.0/24");
    let a = alloc(1, "c1", "a");
    let (s, log, script) = store("ns", lost_pool_creation(&p));
    // Someone created the pool first (409): a conflict. The reservation goes
    // (those whose turn comes first would plan into it), and the call takes its
    // turn (nobody ahead of it).
    let mut tx = lose_pool_creation(&s, &p, &a);
    assert!(tx.serialized());
    // Planned .1 again on the new read, and its entry's test fails (422).
    script.then(vec![listed(&p, "6", "6", json!({"2": entry("c8", "y")})), created("u2"), Answer::Status(422, "Invalid", Value::Null)]);
    tx.load().unwrap();
    assert!(conflict(tx.commit(&[add(&p, "6", "192.0.2.1", &a)])));
    // c9 got .1: planned around it; in its turn the reservation was kept for
    // the retry, and is freed first now that the plan does not use it.
    script.then(vec![listed(&p, "7", "7", json!({"1": entry("c9", "z"), "2": entry("c8", "y")})), ok(), created("u3"), ok(), ok()]);
    tx.load().unwrap();
    assert_eq!(tx.commit(&[add(&p, "7", "192.0.2.3", &alloc(3, "c1", "a"))]).unwrap(), Outcome::Committed);
    assert!(!tx.serialized());
    let (post, patch) = (format!("POST {API}/overlappingrangeipreservations"), format!("PATCH {API}/ippools/192.0.2.0-24"));
    let delete = format!("DELETE {API}/overlappingrangeipreservations/192.0.2.1");
    assert_eq!(
        log.lines(),
        [
            format!("GET {}", list_path(&p)),
            post.clone(),
            format!("POST {API}/ippools"),
            delete.clone(),
            format!("POST {LEASES}"),
            format!("GET {LEASES}?labelSelector=thereabouts.io%2Fturn%3Dpools&resourceVersion=20&resourceVersionMatch=NotOlderThan"),
            format!("GET {}", list_path(&p)),
            post.clone(),
            patch.clone(),
            format!("GET {}", list_path(&p)),
            delete,
            post,
            patch,
            // Committed: the turn ends.
            format!("DELETE {LEASES}/t1"),
        ]
    );
    assert_eq!(log.body(3), uid_precondition("u1"));
    assert_eq!(log.body(4)["metadata"]["annotations"][turn::POOLS_ANNOTATION], p.name.as_str());
    // In its turn a patch is re-applied by the apiserver, not failed fast.
    assert_eq!(log.body(8)[0], json!({"op": "test", "path": "/spec/allocations/1", "value": null}));
    assert_eq!(log.body(10), uid_precondition("u2"));
}

#[test]
fn a_reservation_an_earlier_attempt_cannot_delete_stops_every_write_until_it_is_deleted() {
    let p = pool("192.0.2.0/24");
    let delete = format!("DELETE {API}/overlappingrangeipreservations/192.0.2.1");
    let unreachable = || [Answer::Unreachable, Answer::Unreachable, Answer::Unreachable];
    let mut answers = lost_pool_creation(&p);
    // The DELETE of the lost race's reservation of .1 finds no apiserver (sent again twice).
    answers.splice(3..4, unreachable());
    let (s, log, script) = store("ns", answers);
    let mut tx = lose_pool_creation(&s, &p, &alloc(1, "c1", "a"));
    // In its turn it plans .2; the reservation of .1 still cannot go: nothing is written.
    script.then(vec![listed(&p, "6", "6", json!({"1": entry("c8", "y")}))]);
    script.then(unreachable().into());
    tx.load().unwrap();
    assert!(conflict(tx.commit(&[add(&p, "6", "192.0.2.2", &alloc(2, "c1", "a"))])));
    assert!(!log.lines().iter().any(|l| l.starts_with(&format!("PATCH {API}/ippools"))));
    // The next attempt deletes it first, then writes.
    script.then(vec![listed(&p, "7", "7", json!({"1": entry("c8", "y")})), ok(), created("u2"), ok(), ok()]);
    tx.load().unwrap();
    assert_eq!(tx.commit(&[add(&p, "7", "192.0.2.2", &alloc(2, "c1", "a"))]).unwrap(), Outcome::Committed);
    let lines = log.lines();
    assert_eq!(lines.iter().filter(|l| **l == delete).count(), 7);
    assert_eq!(
        lines[lines.len() - 4..],
        [delete, format!("POST {API}/overlappingrangeipreservations"), format!("PATCH {API}/ippools/192.0.2.0-24"), format!("DELETE {LEASES}/t1")]
    );
    assert!(script.is_done());
}

#[test]
fn a_reservation_delete_whose_connection_broke_is_sent_again() {
    let p = pool("192.0.2.0/24");
    let mut answers = lost_pool_creation(&p);
    answers.insert(3, Answer::Unreachable);
    let (s, log, script) = store("ns", answers);
    // Its end of turn, when the call is dropped.
    script.then(vec![ok()]);
    // Sent again, the DELETE landed: the lost race goes on into the call's turn.
    assert!(lose_pool_creation(&s, &p, &alloc(1, "c1", "a")).serialized());
    let delete = format!("DELETE {API}/overlappingrangeipreservations/192.0.2.1");
    assert_eq!(log.lines()[3..5], [delete.clone(), delete]);
    assert!(script.is_done());
}

#[test]
fn add_after_a_lost_reservation_race_takes_its_turn_then_plans_around_taken_reservations_on_one_read() {
    let p = pool("192.0.2.0/24");
    let a = alloc(1, "c1", "a");
    let racer = alloc(1, "c9", "z");
    let (s, log, script) = store(
        "ns",
        vec![
            listed(&p, "10", "12", json!({})),
            Answer::Status(409, "AlreadyExists", Value::Null),
            // Made after the read (13 > 12): a racer, not an overlapping range.
            Answer::Ok(reservation("192.0.2.1", "u9", "13", &racer)),
        ],
    );
    let mut tx = s.begin(std::slice::from_ref(&p), Purpose::Update, deadline()).unwrap();
    tx.load().unwrap();
    // The race lost: the call waits for its turn, then reads the pool again.
    script.then(vec![Answer::Ok(ticket("t1", "20", &p.name)), tickets(vec![]), listed(&p, "11", "21", json!({}))]);
    assert!(conflict(tx.commit(&[add(&p, "10", "192.0.2.1", &a)])));
    let again = tx.load().unwrap().remove(0);
    assert_eq!((again.version, again.reserved), (Version("11".into()), vec![1]));
    // In its turn a taken reservation refuses nothing of the pool: no new
    // read, and the reservation is not read either (a race was lost already).
    script.then(vec![Answer::Status(409, "AlreadyExists", Value::Null), created("u3"), ok(), ok()]);
    assert!(conflict(tx.commit(&[add(&p, "11", "192.0.2.2", &alloc(2, "c1", "a"))])));
    assert_eq!(tx.load().unwrap()[0].reserved, [1, 2]);
    tx.commit(&[add(&p, "11", "192.0.2.3", &alloc(3, "c1", "a"))]).unwrap();
    let post = format!("POST {API}/overlappingrangeipreservations");
    assert_eq!(
        log.lines(),
        [
            format!("GET {}", list_path(&p)),
            post.clone(),
            format!("GET {API}/overlappingrangeipreservations/192.0.2.1"),
            format!("POST {LEASES}"),
            format!("GET {LEASES}?labelSelector=thereabouts.io%2Fturn%3Dpools&resourceVersion=20&resourceVersionMatch=NotOlderThan"),
            format!("GET {}", list_path(&p)),
            post.clone(),
            post,
            format!("PATCH {API}/ippools/192.0.2.0-24"),
            format!("DELETE {LEASES}/t1"),
        ]
    );
}

#[test]
fn an_older_reservation_is_an_overlapping_range_and_another_containers_is_not_adopted() {
    let p = pool("192.0.2.0/24");
    let a = alloc(1, "c2", "a");
    // Older than the read (8 <= 12): an overlapping range holds it.
    let (s, log, script) = store(
        "ns",
        vec![
            listed(&p, "10", "12", json!({})),
            Answer::Status(409, "AlreadyExists", Value::Null),
            Answer::Ok(reservation("192.0.2.1", "u9", "8", &alloc(1, "c9", "z"))),
        ],
    );
    let mut tx = s.begin(std::slice::from_ref(&p), Purpose::Update, deadline()).unwrap();
    tx.load().unwrap();
    assert!(reserved(tx.commit(&[add(&p, "10", "192.0.2.1", &a)])));
    // Same pod and interface, but made by its old container c1: that
    // container's DEL frees it, so it is not taken over.
    script.then(vec![Answer::Status(409, "AlreadyExists", Value::Null), Answer::Ok(reservation("192.0.2.2", "u1", "9", &alloc(2, "c1", "a")))]);
    assert!(reserved(tx.commit(&[add(&p, "10", "192.0.2.2", &alloc(2, "c2", "a"))])));
    assert_eq!(tx.load().unwrap()[0].reserved, [1, 2]);
    // Its own (a retried ADD) or whereabouts' (no container): adopted, no request.
    let mine = alloc(3, "c2", "a");
    let whereabouts = json!({"metadata": {"name": "192.0.2.4", "uid": "w", "resourceVersion": "3"}, "spec": {"podref": "default/a", "ifname": "eth0"}});
    script.then(vec![Answer::Status(409, "AlreadyExists", Value::Null), Answer::Ok(reservation("192.0.2.3", "u3", "9", &mine)), ok()]);
    assert_eq!(tx.commit(&[add(&p, "10", "192.0.2.3", &mine)]).unwrap(), Outcome::Committed);
    script.then(vec![listed(&p, "11", "14", json!({"3": entry("c2", "a")})), Answer::Status(409, "AlreadyExists", Value::Null), Answer::Ok(whereabouts), ok()]);
    tx.load().unwrap();
    assert_eq!(tx.commit(&[add(&p, "11", "192.0.2.4", &alloc(4, "c2", "a"))]).unwrap(), Outcome::Committed);
    assert_eq!(log.lines().iter().filter(|l| l.starts_with("DELETE")).count(), 0);
    assert!(script.is_done());
}

/// A read older than this call's own rollback shows its entry: the
/// reservation is kept, and stays the call's, so that the plan that takes the
/// address again on a fresh read uses it instead of finding it "taken" and
/// leaving it behind (the leak seen in CI beside a whereabouts writer).
#[test]
fn a_reservation_kept_on_a_stale_read_stays_the_calls_own() {
    let p = pool("192.0.2.0/24");
    let a = alloc(1, "c1", "a");
    let (s, log, script) = store("ns", lost_pool_creation(&p));
    let mut tx = lose_pool_creation(&s, &p, &a);
    // In its turn: .1 reserved, the pool write refused.
    script.then(vec![listed(&p, "6", "6", json!({})), created("u2"), Answer::Status(422, "Invalid", Value::Null)]);
    tx.load().unwrap();
    assert!(conflict(tx.commit(&[add(&p, "6", "192.0.2.1", &a)])));
    // A stale read shows .1 as its own: kept. This plan (.2) fails too.
    script.then(vec![listed(&p, "7", "7", json!({"1": entry("c1", "a")})), created("u3"), Answer::Status(422, "Invalid", Value::Null)]);
    tx.load().unwrap();
    assert!(conflict(tx.commit(&[add(&p, "7", "192.0.2.2", &alloc(2, "c1", "a"))])));
    // A fresh read: .1 is free again, and its reservation is still this call's.
    script.then(vec![listed(&p, "8", "8", json!({})), ok(), ok(), ok()]);
    let before = log.lines().len();
    tx.load().unwrap();
    assert_eq!(tx.commit(&[add(&p, "8", "192.0.2.1", &a)]).unwrap(), Outcome::Committed);
    let (delete_2, patch) = (format!("DELETE {API}/overlappingrangeipreservations/192.0.2.2"), format!("PATCH {API}/ippools/192.0.2.0-24"));
    assert_eq!(log.lines()[before..], [format!("GET {}", list_path(&p)), delete_2, patch, format!("DELETE {LEASES}/t1")]);
}

#[test]
fn a_failing_later_pool_rolls_back_the_earlier_one_and_frees_the_reservations() {
    let (p4, p6) = (pool("192.0.2.0/24"), PoolId { name: "2001-db8---64".into(), cidr: "2001:db8::/64".into(), node_local: false });
    let (a4, a6) = (alloc(1, "c1", "a"), alloc(1, "c1", "a"));
    let (s, log, _) = store(
        "ns",
        vec![
            listed(&p4, "10", "12", json!({})),
            listed(&p6, "11", "12", json!({})),
            created("u4"),
            created("u6"),
            ok(),
            Answer::Status(403, "Forbidden", Value::Null),
            ok(),
            ok(),
            ok(),
        ],
    );
    let mut tx = s.begin(&[p4.clone(), p6.clone()], Purpose::Update, deadline()).unwrap();
    tx.load().unwrap();
    let e = tx.commit(&[add(&p4, "10", "192.0.2.1", &a4), add(&p6, "11", "2001-db8--1", &a6)]).unwrap_err();
    assert!(matches!(e, DatastoreError::Denied { .. }), "{e}");
    assert_eq!(
        log.lines()[4..7],
        [format!("PATCH {API}/ippools/192.0.2.0-24"), format!("PATCH {API}/ippools/2001-db8---64"), format!("PATCH {API}/ippools/192.0.2.0-24")]
    );
    // The rollback removes only the entry written, if it is still exactly that.
    assert_eq!(log.body(6), json!([{"op": "test", "path": "/spec/allocations/1", "value": entry("c1", "a")}, {"op": "remove", "path": "/spec/allocations/1"}]));
    // Then both reservations go (in no particular order), each only as created.
    let mut freed: Vec<(String, Value)> = log.sent()[7..].iter().map(|s| (s.line.clone(), s.body.clone())).collect();
    freed.sort_by(|a, b| a.0.cmp(&b.0));
    let delete = |name: &str, uid: &str| (format!("DELETE {API}/overlappingrangeipreservations/{name}"), uid_precondition(uid));
    assert_eq!(freed, [delete("192.0.2.1", "u4"), delete("2001-db8--1", "u6")]);
}

#[test]
fn del_frees_its_entries_reservations_and_its_leftovers_but_not_what_its_pod_still_uses() {
    let (p, q) = (pool("192.0.2.0/24"), pool("198.51.100.0/24"));
    let (mine, other_pool) = (alloc(1, "c1", "a"), alloc(1, "c1", "a"));
    let labelled = |name: &str, uid: &str, holder: &Allocation| reservation(name, uid, "3", holder);
    let (s, log, _) = store(
        "ns",
        vec![
            listed(&p, "10", "12", json!({"1": entry("c1", "a"), "5": entry("c2", "a")})),
            listed(&q, "11", "12", json!({"1": entry("c1", "a")})),
            ok(),
            ok(),
            // Each reservation of an entry is read by name, then deleted by its UID.
            Answer::Ok(labelled("192.0.2.1", "u1", &mine)),
            ok(),
            // Not labelled for this attachment (whereabouts made it, or an earlier container).
            Answer::Ok(json!({"metadata": {"name": "198.51.100.1", "uid": "w1"}, "spec": {"podref": "default/a", "ifname": "eth0"}})),
            ok(),
            // The leftovers: one LIST by label, asked for after the commit.
            Answer::Ok(json!({"items": [
                // Left by an ADD of this attachment that failed.
                labelled("192.0.2.9", "u9", &alloc(9, "c1", "a")),
                // Its address now held by the pod's newer container (c2 adopted the entry).
                labelled("192.0.2.5", "u5", &alloc(5, "c1", "a")),
                // Same label value (a hash), another attachment: not ours.
                labelled("192.0.2.7", "u7", &alloc(7, "c7", "q")),
            ]})),
            ok(),
        ],
    );
    let mut tx = s.begin(&[p.clone(), q.clone()], Purpose::Release { container_id: "c1", ifname: "eth0" }, deadline()).unwrap();
    tx.load().unwrap();
    let release = |id: &PoolId, rv: &str, name: &str, holder: &Allocation| PoolUpdate {
        pool: id.clone(),
        expected: Version(rv.into()),
        changes: vec![Change::Remove { offset: holder.offset }, Change::Unreserve { name: name.into(), holder: holder.clone() }],
    };
    tx.commit(&[release(&p, "10", "192.0.2.1", &mine), release(&q, "11", "198.51.100.1", &other_pool)]).unwrap();
    assert_eq!(tx.free_leftovers(&["192.0.2.5".to_string()]).unwrap(), 1);
    let reservation = |method: &str, name: &str| format!("{method} {API}/overlappingrangeipreservations/{name}");
    assert_eq!(
        log.lines(),
        [
            format!("GET {}", list_path(&p)),
            format!("GET {}", list_path(&q)),
            format!("PATCH {API}/ippools/192.0.2.0-24"),
            format!("PATCH {API}/ippools/198.51.100.0-24"),
            reservation("GET", "192.0.2.1"),
            reservation("DELETE", "192.0.2.1"),
            reservation("GET", "198.51.100.1"),
            reservation("DELETE", "198.51.100.1"),
            format!("GET {API}/overlappingrangeipreservations?labelSelector=thereabouts.cni.dev%2Fattachment%3D{}", crd::attachment_label("c1", "eth0")),
            // The leftover; not 192.0.2.5, which the pod still uses.
            reservation("DELETE", "192.0.2.9"),
        ]
    );
    assert_eq!(
        log.body(2),
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "10"},
            {"op": "test", "path": "/spec/allocations/1/id", "value": "c1"},
            {"op": "remove", "path": "/spec/allocations/1"}
        ])
    );
    assert_eq!([log.body(5), log.body(7), log.body(9)], [uid_precondition("u1"), uid_precondition("w1"), uid_precondition("u9")]);
}

/// A DEL whose pool write landed but whose reservation could not be deleted
/// (the apiserver went away in between) fails as unavailable: answered as a
/// success, the runtime would never send it again and the reservation would
/// block its address. The runtime's retry finds no entry of the attachment
/// and deletes the reservation labelled with it.
#[test]
fn a_del_that_cannot_delete_the_reservation_of_an_entry_it_removed_fails_and_its_retry_deletes_it() {
    let p = pool("192.0.2.0/24");
    let mine = alloc(1, "c1", "a");
    let releasing = || Purpose::Release { container_id: "c1", ifname: "eth0" };
    let reservation_line = |method: &str| format!("{method} {API}/overlappingrangeipreservations/192.0.2.1");
    let (s, log, script) =
        store("ns", vec![listed(&p, "10", "12", json!({"1": entry("c1", "a")})), ok(), Answer::Unreachable, Answer::Unreachable, Answer::Unreachable]);
    let mut tx = s.begin(std::slice::from_ref(&p), releasing(), deadline()).unwrap();
    tx.load().unwrap();
    let release = PoolUpdate {
        pool: p.clone(),
        expected: Version("10".into()),
        changes: vec![Change::Remove { offset: 1 }, Change::Unreserve { name: "192.0.2.1".into(), holder: mine.clone() }],
    };
    let e = tx.commit(&[release]).unwrap_err();
    assert!(matches!(e, DatastoreError::Unavailable { .. }), "{e}");
    drop(tx);
    assert_eq!(log.lines(), [vec![format!("GET {}", list_path(&p)), format!("PATCH {API}/ippools/192.0.2.0-24")], vec![reservation_line("GET"); 3]].concat());
    assert!(script.is_done());

    // The retry: nothing of c1 in the pool, its labelled reservation deleted.
    let (s, log, script) =
        store("ns", vec![listed(&p, "11", "13", json!({})), Answer::Ok(json!({"items": [reservation("192.0.2.1", "u1", "3", &mine)]})), ok()]);
    let mut tx = s.begin(std::slice::from_ref(&p), releasing(), deadline()).unwrap();
    tx.load().unwrap();
    assert_eq!(tx.free_leftovers(&[]).unwrap(), 1);
    assert_eq!(log.lines().last(), Some(&reservation_line("DELETE")));
    assert_eq!(log.body(2), uid_precondition("u1"));
    assert!(script.is_done());
}

#[test]
fn answers_are_classed_as_denied_unavailable_or_rejected() {
    let status = |code| Answer::Status(code, "Failure", Value::Null);
    // Each class with the answers that lead to it; a silent server within 200 ms.
    let classes: [(Vec<Answer>, &str); 12] = [
        (vec![status(401)], "denied"),
        (vec![status(403)], "denied"),
        (vec![status(500)], "unavailable"),
        (vec![status(502)], "unavailable"),
        // Throttled, then served: retried.
        (vec![status(429), status(429), ok()], "ok"),
        (vec![status(503), ok()], "ok"),
        // A read whose connection broke is sent again, twice.
        (vec![Answer::Unreachable, ok()], "ok"),
        (vec![Answer::Unreachable, Answer::Unreachable, Answer::Unreachable], "unavailable"),
        (vec![Answer::Silent], "unavailable"),
        (vec![status(400)], "rejected"),
        (vec![status(404)], "rejected"),
        (vec![status(409)], "rejected"),
    ];
    for (answers, class) in classes {
        let requests = answers.len();
        let budget = Duration::from_millis(if matches!(answers[0], Answer::Silent) { 200 } else { 5000 });
        let (s, log, script) = store("ns", answers);
        let got = match s.check_usable(Instant::now() + budget) {
            Ok(()) => "ok",
            Err(DatastoreError::Denied { .. }) => "denied",
            Err(DatastoreError::Unavailable { .. }) => "unavailable",
            Err(DatastoreError::Rejected { .. }) => "rejected",
            Err(other) => panic!("{other}"),
        };
        assert_eq!(got, class, "{:?}", log.lines());
        assert_eq!(log.lines(), vec![format!("GET {API}/ippools?limit=1"); requests]);
        assert!(script.is_done());
    }
}

#[test]
fn throttling_is_retried_until_the_deadline_then_unavailable() {
    let (s, log, _) = store("ns", (0..100).map(|_| Answer::Status(429, "TooManyRequests", Value::Null)).collect());
    let e = s.check_usable(Instant::now() + Duration::from_secs(3)).unwrap_err();
    assert!(matches!(e, DatastoreError::Unavailable { .. }), "{e}");
    // More than the 5 a fixed 4 retries sent (the backoff reaches 1 s).
    assert!(log.lines().len() >= 6, "{:?}", log.lines());
}

#[test]
fn a_pool_write_whose_answer_was_lost_keeps_the_reservations_of_what_may_have_landed() {
    let (p4, p6) = (pool("192.0.2.0/24"), PoolId { name: "2001-db8---64".into(), cidr: "2001:db8::/64".into(), node_local: false });
    let a = alloc(1, "c1", "a");
    let deletes = |rollback: Answer| {
        // The IPv4 pool is written; the IPv6 PATCH gets no answer, and may land
        // after the client gave up. So may the IPv4 rollback, if it gets none.
        let reads = vec![listed(&p4, "10", "12", json!({})), listed(&p6, "11", "12", json!({})), created("u4"), created("u6"), ok(), Answer::Silent];
        let (s, log, script) = store("ns", reads);
        script.then(vec![rollback, ok(), ok()]);
        let mut tx = s.begin(&[p4.clone(), p6.clone()], Purpose::Update, Instant::now() + Duration::from_millis(300)).unwrap();
        tx.load().unwrap();
        let e = tx.commit(&[add(&p4, "10", "192.0.2.1", &a), add(&p6, "11", "2001-db8--1", &a)]).unwrap_err();
        assert!(matches!(e, DatastoreError::Unavailable { .. }), "{e}");
        drop(tx);
        log.lines().into_iter().filter(|l| l.starts_with("DELETE")).collect::<Vec<_>>()
    };
    // An entry that lands after all keeps its reservation; the DEL the runtime
    // sends next frees both (the reservation by its attachment label).
    assert_eq!(deletes(ok()), [format!("DELETE {API}/overlappingrangeipreservations/192.0.2.1")]);
    assert_eq!(deletes(Answer::Unreachable), Vec::<String>::new());
}

#[test]
fn a_pool_the_apiserver_refuses_as_too_large_is_full_and_frees_its_reservation() {
    let p = pool("2001:db8::/64");
    let a = alloc(3, "c1", "a");
    let too_large = Answer::Status(500, "etcdserver: request is too large", Value::Null);
    let (s, log, _) = store("ns", vec![listed(&p, "10", "12", json!({"1": entry("c8", "y"), "2": entry("c9", "z")})), created("u1"), too_large, ok()]);
    let mut tx = s.begin(std::slice::from_ref(&p), Purpose::Update, deadline()).unwrap();
    tx.load().unwrap();
    let e = tx.commit(&[add(&p, "10", "2001-db8--3", &a)]).unwrap_err();
    assert!(matches!(&e, DatastoreError::PoolTooLarge { object, entries: 3 } if *object == format!("IPPool ns/{}", p.name)), "{e:?}");
    assert!(e.to_string().contains("--max-request-bytes"), "{e}");
    // Refused, not lost: the reservation of the address goes at once.
    assert_eq!(log.lines()[3], format!("DELETE {API}/overlappingrangeipreservations/2001-db8--3"));
}

#[test]
fn a_lost_race_waits_for_the_ticket_ahead_to_go() {
    let p = pool("192.0.2.0/24");
    let deleted = Answer::Ok(json!({"type": "DELETED", "object": ticket("t0", "19", &p.name)}));
    // The pool moved since the read: the version test fails at once.
    let mut answers =
        first_attempt_refused(&p, Answer::Status(422, "Invalid", json!({"causes": [{"message": "testing value /metadata/resourceVersion failed"}]})));
    // Ahead: t0 (same pool, older); not t2 (newer) nor t9 (another pool).
    let still_there = Answer::Ok(ticket("t1", "20", &p.name));
    answers.extend([tickets(vec![ticket("t0", "19", &p.name), ticket("t2", "21", &p.name), ticket("t9", "18", "other")]), deleted, still_there, ok()]);
    let (s, log, _) = store("ns", answers);
    let tx = lose_first_attempt(&s, &p);
    assert!(tx.serialized());
    assert_eq!(log.lines()[3], format!("DELETE {API}/overlappingrangeipreservations/192.0.2.1"));
    assert_eq!(log.lines()[6], format!("GET {LEASES}?watch=true&fieldSelector=metadata.name%3Dt0&resourceVersion=100&timeoutSeconds=1"));
    // Its own ticket is still there: its turn (not served by a DEL's write).
    assert_eq!(log.lines()[7], format!("GET {LEASES}/t1"));
    drop(tx);
    // The turn ends with the call.
    assert_eq!(log.lines()[8..], [format!("DELETE {LEASES}/t1")]);
}

#[test]
fn a_holder_reads_the_pool_as_new_as_the_holder_before_it_wrote_it_and_leaves_its_own_write_on_its_ticket() {
    let p = pool("192.0.2.0/24");
    let mut gone = ticket("t0", "19", &p.name);
    gone["metadata"]["annotations"][turn::WRITTEN_ANNOTATION] = json!(format!("{}=25,other=3", p.name));
    let mut answers = first_attempt_refused(&p, Answer::Status(422, "Invalid", Value::Null));
    answers.extend([
        tickets(vec![ticket("t0", "19", &p.name)]),
        Answer::Ok(json!({"type": "DELETED", "object": gone})),
        Answer::Ok(ticket("t1", "20", &p.name)),
    ]);
    let (s, log, script) = store("ns", answers);
    let mut tx = lose_first_attempt(&s, &p);
    script.then(vec![listed(&p, "25", "26", json!({})), created("u2"), Answer::Ok(json!({"metadata": {"resourceVersion": "27"}})), ok(), ok()]);
    tx.load().unwrap();
    // Not the cache as it is: it may not hold t0's write yet.
    assert_eq!(log.lines()[8], format!("GET {API}/ippools?fieldSelector=metadata.name%3D192.0.2.0-24&resourceVersion=25&resourceVersionMatch=NotOlderThan"));
    assert_eq!(tx.commit(&[add(&p, "25", "192.0.2.1", &alloc(1, "c1", "a"))]).unwrap(), Outcome::Committed);
    drop(tx);
    assert_eq!(log.lines()[11..], [format!("PATCH {LEASES}/t1"), format!("DELETE {LEASES}/t1")]);
    assert_eq!(log.body(11)["metadata"]["annotations"][turn::WRITTEN_ANNOTATION], format!("{}=27", p.name));
}

#[test]
fn a_queue_that_shows_no_sign_of_life_loses_its_head() {
    let p = pool("192.0.2.0/24");
    let stuck = || tickets(vec![ticket("t0", "19", &p.name)]);
    let mut answers = first_attempt_refused(&p, Answer::Status(409, "Conflict", Value::Null));
    answers.extend([stuck(), Answer::Silent, stuck(), ok(), tickets(vec![]), ok()]);
    let (s, log, _) = store("ns", answers);
    let tx = lose_first_attempt(&s, &p);
    assert!(tx.serialized());
    // Unchanged for a whole STALL: deleted, only as it was seen.
    assert_eq!(log.lines()[8], format!("DELETE {LEASES}/t0"));
    assert_eq!(log.body(8), json!({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": "19"}}));
}

#[test]
fn without_the_right_to_leases_a_lost_race_goes_on_without_a_turn() {
    let p = pool("192.0.2.0/24");
    let a = alloc(1, "c1", "a");
    let mut answers = first_attempt_refused(&p, Answer::Status(409, "Conflict", Value::Null));
    // The ticket is refused instead of created.
    answers.pop();
    answers.push(Answer::Status(403, "Forbidden", Value::Null));
    let (s, log, script) = store("ns", answers);
    let mut tx = lose_first_attempt(&s, &p);
    assert!(!tx.serialized());
    script.then(vec![listed(&p, "11", "13", json!({})), created("u2"), ok()]);
    tx.load().unwrap();
    assert_eq!(tx.commit(&[add(&p, "11", "192.0.2.1", &a)]).unwrap(), Outcome::Committed);
    // The patch is then re-applied inside the apiserver: no version test.
    assert_eq!(log.lines()[7], format!("PATCH {API}/ippools/192.0.2.0-24"));
    assert_eq!(log.body(7)[0], json!({"op": "test", "path": "/spec/allocations/1", "value": null}));
}

#[test]
fn a_watch_from_a_revision_too_old_lists_the_queue_again() {
    let p = pool("192.0.2.0/24");
    let gone = Answer::Ok(
        json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired", "message": "too old resource version"}}),
    );
    let deleted = Answer::Ok(json!({"type": "DELETED", "object": ticket("t0", "19", &p.name)}));
    let ahead = || tickets(vec![ticket("t0", "19", &p.name)]);
    let mut answers = first_attempt_refused(&p, Answer::Status(409, "Conflict", Value::Null));
    answers.extend([ahead(), gone, ahead(), deleted, ok(), ok()]);
    let (s, log, _) = store("ns", answers);
    let tx = lose_first_attempt(&s, &p);
    // Still in the queue, not gone ahead without a turn.
    assert!(tx.serialized());
    assert_eq!(log.lines().iter().filter(|l| l.contains("watch=true")).count(), 2);
}

/// A DEL's turn ticket: it offers `container`'s release in `group`.
fn del_ticket(name: &str, rv: &str, pools: &str, group: &str, container: &str) -> Value {
    let mut t = ticket(name, rv, pools);
    t["metadata"]["annotations"][turn::RELEASE_GROUP_ANNOTATION] = json!(group);
    t["metadata"]["annotations"][turn::RELEASE_CONTAINER_ANNOTATION] = json!(container);
    t["metadata"]["annotations"][turn::RELEASE_IFNAME_ANNOTATION] = json!("eth0");
    t
}

fn remove(id: &PoolId, rv: &str, offsets: &[u128]) -> PoolUpdate {
    PoolUpdate { pool: id.clone(), expected: Version(rv.into()), changes: offsets.iter().map(|&offset| Change::Remove { offset }).collect() }
}

/// A DEL of c1: it reads, then queues with ticket t1 (version 20), offering
/// its release in group `g`, before any write.
fn del_queueing<'s>(s: &'s KubernetesStore, p: &PoolId) -> Box<dyn Transaction + 's> {
    let mut tx = s.begin(std::slice::from_ref(p), Purpose::Update, deadline()).unwrap();
    tx.release_together("g", &thereabouts_allocator::model::Attachment { container_id: "c1".into(), ifname: "eth0".into(), claim: None });
    tx.load().unwrap();
    assert_eq!(tx.commit(&[remove(p, "10", &[1])]).unwrap(), Outcome::Retry(Retry::Turn));
    tx
}

#[test]
fn a_del_in_its_turn_removes_the_entries_of_its_groups_dels_queued_behind_it_then_dismisses_them() {
    let p = pool("192.0.2.0/24");
    let held = json!({"1": entry("c1", "a"), "2": entry("c2", "b"), "3": entry("c3", "c"), "5": entry("c5", "e")});
    let queue = || {
        tickets(vec![
            del_ticket("t2", "21", &p.name, "g", "c2"),
            del_ticket("t5", "24", &p.name, "g", "c5"),
            // Another network's DEL, and a DEL of this group on other pools: not served.
            del_ticket("t3", "22", &p.name, "h", "c3"),
            del_ticket("t4", "23", "192.0.2.0-24,other", "g", "c3"),
        ])
    };
    let answers = vec![
        listed(&p, "10", "12", held.clone()),
        Answer::Ok(del_ticket("t1", "20", &p.name, "g", "c1")),
        queue(),
        listed(&p, "11", "13", held),
        ok(),
        ok(),
        ok(),
        ok(),
    ];
    let (s, log, _) = store("ns", answers);
    let mut tx = del_queueing(&s, &p);
    assert_eq!(log.body(1)["metadata"]["annotations"][turn::RELEASE_CONTAINER_ANNOTATION], "c1");
    assert!(tx.serialized());
    let queued = tx.queued_releases();
    let attachment = |c: &str| thereabouts_allocator::model::Attachment { container_id: c.into(), ifname: "eth0".into(), claim: None };
    assert_eq!(queued, [attachment("c2"), attachment("c5")]);
    tx.load().unwrap();
    assert_eq!(tx.commit(&[remove(&p, "11", &[1, 2, 5])]).unwrap(), Outcome::Committed);
    // The queue as the wait listed it; one write for all three; then the
    // served DELs' tickets go, newest first, then its own.
    assert_eq!(log.lines().iter().filter(|l| l.contains("labelSelector=thereabouts.io")).count(), 1);
    let deleted = [format!("DELETE {LEASES}/t5"), format!("DELETE {LEASES}/t2"), format!("DELETE {LEASES}/t1")];
    assert_eq!(log.lines()[4..], [vec![format!("PATCH {API}/ippools/192.0.2.0-24")], deleted.to_vec()].concat());
}

#[test]
fn a_del_in_its_turn_does_not_dismiss_a_queued_del_whose_entries_are_gone_already() {
    let p = pool("192.0.2.0/24");
    let answers = vec![
        listed(&p, "10", "12", json!({"1": entry("c1", "a"), "2": entry("c2", "b")})),
        Answer::Ok(del_ticket("t1", "20", &p.name, "g", "c1")),
        tickets(vec![del_ticket("t2", "21", &p.name, "g", "c2")]),
        // c2 was served by the write before this turn; its ticket is still queued.
        listed(&p, "11", "13", json!({"1": entry("c1", "a")})),
        ok(),
        ok(),
    ];
    let (s, log, _) = store("ns", answers);
    let mut tx = del_queueing(&s, &p);
    assert_eq!(tx.queued_releases().len(), 1);
    tx.load().unwrap();
    assert_eq!(tx.commit(&[remove(&p, "11", &[1])]).unwrap(), Outcome::Committed);
    assert_eq!(log.lines()[4..], [format!("PATCH {API}/ippools/192.0.2.0-24"), format!("DELETE {LEASES}/t1")]);
}

#[test]
fn a_del_whose_ticket_left_the_queue_was_served_and_reads_the_pool_as_new_as_the_queue_it_listed() {
    let p = pool("192.0.2.0/24");
    let answers = vec![
        listed(&p, "10", "12", json!({"1": entry("c1", "a")})),
        Answer::Ok(del_ticket("t1", "20", &p.name, "g", "c1")),
        // t1 is gone: the holder t0 served it.
        tickets_without_mine(vec![del_ticket("t0", "19", &p.name, "g", "c0")]),
        listed(&p, "12", "101", json!({})),
    ];
    let (s, log, _) = store("ns", answers);
    let mut tx = del_queueing(&s, &p);
    assert!(tx.serialized());
    // No watch, and no turn to serve others in.
    assert!(tx.queued_releases().is_empty());
    tx.load().unwrap();
    assert_eq!(log.lines()[3], format!("GET {API}/ippools?fieldSelector=metadata.name%3D192.0.2.0-24&resourceVersion=100&resourceVersionMatch=NotOlderThan"));
    drop(tx);
    // Its ticket is gone already: nothing to delete.
    assert_eq!(log.lines().len(), 4);
}

#[test]
fn a_del_whose_ticket_went_while_it_watched_the_one_ahead_was_served_at_that_delete() {
    let p = pool("192.0.2.0/24");
    let mut deleted_t0 = ticket("t0", "19", &p.name);
    deleted_t0["metadata"]["resourceVersion"] = json!("30");
    let answers = vec![
        listed(&p, "10", "12", json!({"1": entry("c1", "a")})),
        Answer::Ok(del_ticket("t1", "20", &p.name, "g", "c1")),
        tickets(vec![del_ticket("t0", "19", &p.name, "g", "c0")]),
        Answer::Ok(json!({"type": "DELETED", "object": deleted_t0})),
        Answer::Status(404, "NotFound", Value::Null),
        listed(&p, "12", "31", json!({})),
    ];
    let (s, log, _) = store("ns", answers);
    let mut tx = del_queueing(&s, &p);
    assert!(tx.queued_releases().is_empty());
    tx.load().unwrap();
    assert_eq!(log.lines()[4], format!("GET {LEASES}/t1"));
    assert_eq!(log.lines()[5], format!("GET {API}/ippools?fieldSelector=metadata.name%3D192.0.2.0-24&resourceVersion=30&resourceVersionMatch=NotOlderThan"));
    drop(tx);
    assert_eq!(log.lines().len(), 6);
}

fn slice_pool(allocations: Value) -> Answer {
    Answer::Ok(json!({"metadata": {"resourceVersion": "9"}, "spec": {"range": "192.0.2.0/24", "sliceSize": "/26"}, "status": {"allocations": allocations}}))
}

/// Claims may take any of these slices (in address order).
struct AnySlice(Vec<&'static str>);
impl crate::datastore::SliceCandidates for AnySlice {
    fn usable(&mut self, _: &str) -> bool {
        true
    }
    fn layout(&mut self) -> Vec<String> {
        self.0.iter().map(|s| s.to_string()).collect()
    }
    fn near_home(&mut self, node: &str, n: usize) -> Vec<String> {
        let home = slices::home(node, self.0.len());
        self.0.iter().cycle().skip(home).take(n.min(self.0.len())).map(|s| s.to_string()).collect()
    }
}

/// A layout object whose slices are objects of their own (`shape`: the annotation).
fn layout_of_objects(shape: &str, allocations: Value) -> Answer {
    Answer::Ok(json!({
        "metadata": {"resourceVersion": "9", "annotations": {slices::SLICE_OBJECTS_ANNOTATION: shape}},
        "spec": {"range": "192.0.2.0/24", "sliceSize": "/26"},
        "status": {"allocations": allocations}
    }))
}

fn slice_objects(held: &[(&str, &str)]) -> Answer {
    let items: Vec<Value> = held.iter().map(|(node, slice)| slices::SliceObject::object("net1", "ns", "/26", slice, node, None)).collect();
    Answer::Ok(json!({"metadata": {"resourceVersion": "10"}, "items": items}))
}

#[test]
fn with_slice_objects_a_node_lists_its_own_by_label_from_the_cache() {
    let (s, log, _) = store("ns", vec![layout_of_objects("true", json!([])), slice_objects(&[("a", "192.0.2.128/26")])]);
    assert_eq!(s.node_slices("net1", "a", false, true, &mut AnySlice(vec![]), deadline()).unwrap().slices, ["192.0.2.128/26"]);
    assert_eq!(
        log.lines()[1],
        format!("GET {API}/nodeslicepools?labelSelector=thereabouts.io%2Fslice-of%3Dnet1%2Cthereabouts.io%2Fslice-node%3Da&resourceVersion=0")
    );
}

#[test]
fn with_slice_objects_an_add_reads_the_slices_its_node_remembers_by_name_and_a_del_lists_them_all() {
    // Its own namespace: what a node remembers outlives the test process.
    let ns = format!("held-{}", std::process::id());
    let mine = |slice: &str| Answer::Ok(slices::SliceObject::object("net1", &ns, "/26", slice, "a", None));
    let answers = vec![
        layout_of_objects("true", json!([])),
        slice_objects(&[("a", "192.0.2.128/26")]),
        layout_of_objects("true", json!([])),
        mine("192.0.2.128/26"),
        layout_of_objects("true", json!([])),
        slice_objects(&[("a", "192.0.2.128/26"), ("a", "192.0.2.192/26")]),
    ];
    let (s, log, _) = store(&ns, answers);
    // Nothing remembered yet: the LIST by label, remembered.
    assert_eq!(s.node_slices("net1", "a", false, false, &mut AnySlice(vec![]), deadline()).unwrap().slices, ["192.0.2.128/26"]);
    // The next ADD reads its slice by name; a DEL lists every slice of the node.
    assert_eq!(s.node_slices("net1", "a", false, false, &mut AnySlice(vec![]), deadline()).unwrap().slices, ["192.0.2.128/26"]);
    assert_eq!(
        log.lines()[3],
        format!(
            "GET {}/namespaces/{ns}/nodeslicepools/{}?resourceVersion=0",
            API.split("/namespaces/").next().unwrap(),
            slices::slice_object_name("net1", "192.0.2.128/26")
        )
    );
    assert_eq!(s.node_slices("net1", "a", false, true, &mut AnySlice(vec![]), deadline()).unwrap().slices, ["192.0.2.128/26", "192.0.2.192/26"]);
    assert!(log.lines()[5].contains("labelSelector"));
}

#[test]
fn with_slice_objects_a_node_that_remembers_nothing_reads_the_slices_from_its_home_by_name() {
    let ns = format!("home-{}", std::process::id());
    let layout = vec!["192.0.2.0/26", "192.0.2.64/26", "192.0.2.128/26", "192.0.2.192/26"];
    let home = slices::home("a", layout.len());
    let (first, second) = (layout[home], layout[(home + 1) % layout.len()]);
    let answers = vec![
        layout_of_objects("true", json!([])),
        Answer::Status(404, "NotFound", Value::Null),
        Answer::Ok(slices::SliceObject::object("net1", &ns, "/26", second, "a", None)),
    ];
    let (s, log, _) = store(&ns, answers);
    let found = s.node_slices("net1", "a", false, false, &mut AnySlice(layout.clone()), deadline()).unwrap();
    assert_eq!(found, crate::datastore::NodeSlices { slices: vec![second.to_string()], all: false });
    let by_name = |slice: &str| {
        let root = API.split("/namespaces/").next().unwrap();
        format!("GET {root}/namespaces/{ns}/nodeslicepools/{}?resourceVersion=0", slices::slice_object_name("net1", slice))
    };
    assert_eq!(log.lines()[1..], [by_name(first), by_name(second)]);
}

#[test]
fn with_slice_objects_a_claim_creates_one_small_object_and_a_taken_slice_answers_409() {
    let taken = Answer::Status(409, "AlreadyExists", Value::Null);
    let (s, log, _) = store("ns", vec![layout_of_objects("true", json!([])), slice_objects(&[]), taken, created("u1")]);
    let layout = vec!["192.0.2.0/26", "192.0.2.64/26", "192.0.2.128/26", "192.0.2.192/26"];
    let claimed = s.claim_slice("net1", "a", &[], &mut AnySlice(layout.clone()), deadline()).unwrap().unwrap();
    assert_eq!(log.lines()[2..], [format!("POST {API}/nodeslicepools"), format!("POST {API}/nodeslicepools")]);
    // The first slice tried was taken; the next in the layout is the node's.
    let first = log.body(2)["spec"]["range"].as_str().unwrap().to_string();
    let next = layout[(layout.iter().position(|s| *s == first).unwrap() + 1) % layout.len()];
    assert_eq!(claimed, next);
    assert_eq!(log.body(3)["metadata"]["name"], slices::slice_object_name("net1", next));
    assert_eq!(log.body(3)["status"]["allocations"], json!([{"nodeName": "a", "sliceRange": next}]));
}

#[test]
fn between_shapes_a_claim_the_list_refuses_takes_its_object_back_and_tries_the_next_slice() {
    let free = json!([{"nodeName": "x", "sliceRange": "192.0.2.0/26"}, {"nodeName": "", "sliceRange": "192.0.2.64/26"}, {"nodeName": "", "sliceRange": "192.0.2.128/26"}]);
    let taken = json!([{"nodeName": "x", "sliceRange": "192.0.2.0/26"}, {"nodeName": "y", "sliceRange": "192.0.2.64/26"}, {"nodeName": "", "sliceRange": "192.0.2.128/26"}]);
    let refused = Answer::Status(422, "Invalid", Value::Null);
    let answers = vec![
        layout_of_objects("both:5", free.clone()),
        slice_objects(&[]),
        created("u1"),
        refused,
        ok(),
        layout_of_objects("both:5", taken.clone()),
        slice_objects(&[]),
        created("u2"),
        ok(),
    ];
    let (s, log, _) = store("ns", answers);
    assert_eq!(s.claim_slice("net1", "a", &[], &mut AnySlice(vec![]), deadline()).unwrap().as_deref(), Some("192.0.2.128/26"));
    let (pools, layout) = (format!("{API}/nodeslicepools"), format!("{API}/nodeslicepools/net1"));
    let object = format!("{API}/nodeslicepools/{}", slices::slice_object_name("net1", "192.0.2.64/26"));
    assert_eq!(log.lines()[2..5], [format!("POST {pools}"), format!("PATCH {layout}"), format!("DELETE {object}")]);
    assert_eq!(log.body(4)["preconditions"], json!({"uid": "u1"}));
    assert_eq!(log.lines()[7..], [format!("POST {pools}"), format!("PATCH {layout}")]);
}

#[test]
fn a_node_reads_its_slices_from_the_cache_and_once_from_etcd_when_it_holds_none() {
    let held = json!([{"nodeName": "a", "sliceRange": "192.0.2.0/26"}, {"nodeName": "a", "sliceRange": "192.0.2.64/26"}]);
    let (s, log, _) = store("ns", vec![slice_pool(held.clone()), slice_pool(held)]);
    assert_eq!(s.node_slices("net1", "a", false, false, &mut AnySlice(vec![]), deadline()).unwrap().slices, ["192.0.2.0/26", "192.0.2.64/26"]);
    assert!(s.node_slices("net1", "b", true, false, &mut AnySlice(vec![]), deadline()).unwrap().slices.is_empty());
    assert_eq!(log.lines(), [format!("GET {API}/nodeslicepools/net1?resourceVersion=0"), format!("GET {API}/nodeslicepools/net1")]);
}

#[test]
fn a_claim_that_loses_its_slot_reads_again_and_takes_the_next_free_slice() {
    let free = json!([{"nodeName": "x", "sliceRange": "192.0.2.0/26"}, {"nodeName": "", "sliceRange": "192.0.2.64/26"}, {"nodeName": "", "sliceRange": "192.0.2.128/26"}]);
    let taken = json!([{"nodeName": "x", "sliceRange": "192.0.2.0/26"}, {"nodeName": "y", "sliceRange": "192.0.2.64/26"}, {"nodeName": "", "sliceRange": "192.0.2.128/26"}]);
    let refused = Answer::Status(422, "Invalid", Value::Null);
    let (s, log, _) = store("ns", vec![slice_pool(free), refused, slice_pool(taken), ok()]);
    assert_eq!(s.claim_slice("net1", "a", &[], &mut AnySlice(vec![]), deadline()).unwrap().as_deref(), Some("192.0.2.128/26"));
    let path = format!("{API}/nodeslicepools/net1");
    assert_eq!(log.lines(), [format!("GET {path}"), format!("PATCH {path}"), format!("GET {path}"), format!("PATCH {path}")]);
    assert_eq!(log.body(3)[1], json!({"op": "test", "path": "/status/allocations/2/nodeName", "value": ""}));
}

#[test]
fn a_claim_takes_a_slice_a_sibling_call_of_the_node_claimed_meanwhile() {
    let held = json!([{"nodeName": "a", "sliceRange": "192.0.2.0/26"}, {"nodeName": "a", "sliceRange": "192.0.2.64/26"}, {"nodeName": "", "sliceRange": "192.0.2.128/26"}]);
    let (s, log, _) = store("ns", vec![slice_pool(held)]);
    let known = ["192.0.2.0/26".to_string()];
    assert_eq!(s.claim_slice("net1", "a", &known, &mut AnySlice(vec![]), deadline()).unwrap().as_deref(), Some("192.0.2.64/26"));
    assert_eq!(log.lines().len(), 1, "no patch");
}

#[test]
fn a_nodes_calls_on_its_slice_pools_take_turns_on_the_node_and_read_what_the_last_wrote() {
    // Its own namespace: the node's lock files outlive the test process.
    let ns = format!("turns-{}", std::process::id());
    let p = PoolId { node_local: true, ..pool("192.0.2.0/26") };
    let written = Answer::Ok(json!({"metadata": {"resourceVersion": "77"}}));
    let script = vec![listed(&p, "10", "12", json!({})), created("u1"), written, listed(&p, "77", "78", json!({"1": entry("c1", "a")}))];
    let (s, log, script) = store(&ns, script);
    let mut first = s.begin(std::slice::from_ref(&p), Purpose::Update, deadline()).unwrap();
    assert!(first.serialized(), "the node's turn from the start");
    first.load().unwrap();
    assert_eq!(first.commit(&[add(&p, "10", "192.0.2.1", &alloc(1, "c1", "a"))]).unwrap(), Outcome::Committed);
    drop(first);
    let mut second = s.begin(std::slice::from_ref(&p), Purpose::Update, deadline()).unwrap();
    second.load().unwrap();
    let lines = log.lines();
    assert!(lines[0].ends_with("resourceVersion=0"), "no holder before it: {}", lines[0]);
    // No version test in the node's turn, and no ticket: the entry tests arbitrate.
    assert!(log.body(2).as_array().unwrap().iter().all(|op| op["path"] != "/metadata/resourceVersion"), "{}", log.body(2));
    assert!(lines[3].contains("resourceVersion=77&resourceVersionMatch=NotOlderThan"), "{lines:?}");
    assert_eq!(s.pool_notes(std::slice::from_ref(&p))[0].as_ref().map(|n| n.entries), Some(1), "noted for ADDs that leave full pools out");
    drop(second);
    // A version this apiserver never gave (its etcd was replaced): read as it is.
    let mut third = s.begin(std::slice::from_ref(&p), Purpose::Update, deadline()).unwrap();
    script.then(vec![Answer::Status(504, "Timeout", Value::Null), listed(&p, "5", "6", json!({}))]);
    assert_eq!(third.load().unwrap()[0].version, Version("5".into()));
    assert!(log.lines()[5].ends_with("resourceVersion=0"), "{:?}", log.lines());
    drop(third);
    let dir = std::path::Path::new(super::node_turn::LOCK_DIR);
    for file in ["lock", "note"] {
        let _ = std::fs::remove_file(dir.join(format!("{}_{}.{file}", s.lock_scope(), p.name)));
    }
}
