//! The etcd datastore against a real etcd (3.6, from tests/k8s-bins): the
//! release `thereabouts` binary runs as a CNI plugin (a process per call), and
//! the tests read the keys it wrote as etcd's admin. Each test starts its own
//! etcd (about a second), plain or secured (TLS with client certificates, and
//! auth with a plugin user limited to `/thereabouts/`).
//!
//! Binary: `$THEREABOUTS_BIN`, else `target/plugin/thereabouts` (tests/k8s.sh builds it with scripts/build-plugin.sh).

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir, thereabouts_bin};
use thereabouts_k8s_harness::burst::run_concurrently;
use thereabouts_k8s_harness::etcd::{self, Access, Etcd};

const POOLS: &str = "/thereabouts/pools/";
const RESERVATIONS: &str = "/thereabouts/reservations/";

/// A network config for the etcd datastore at `access`.
fn etcd_conf(access: &Access, ranges: &[&str]) -> Value {
    etcd::etcd_conf(access, "thab-etcd", ranges)
}

/// Runs the plugin like a runtime would, with extra environment; killed if it
/// outlives every budget these tests give it.
fn run(call: &Call, stdin: &str, env: &[(&str, &str)]) -> Outcome {
    let invocation = env.iter().fold(Invocation::new(call.clone(), stdin), |i, (k, v)| i.env(k, v));
    invocation.watchdog(Duration::from_secs(180)).run(&thereabouts_bin())
}

fn add(conf: &Value, cid: &str, pod: &str) -> Outcome {
    run(&Call::pod("ADD", cid, pod), &conf.to_string(), &[])
}

fn del(conf: &Value, cid: &str, pod: &str) -> Outcome {
    run(&Call::pod("DEL", cid, pod), &conf.to_string(), &[])
}

fn entry(cid: &str, pod: &str) -> String {
    format!(r#"{{"id":"{cid}","podref":"default/{pod}","ifname":"eth0"}}"#)
}

fn reservation(cid: &str, pod: &str) -> String {
    format!(r#"{{"containerid":"{cid}","podref":"default/{pod}","ifname":"eth0"}}"#)
}

fn keys(dump: &[(String, String)]) -> Vec<&str> {
    dump.iter().map(|(k, _)| k.as_str()).collect()
}

fn pools_report(conf: &Value) -> Value {
    let tmp = TempDir::new("etcd-pools");
    let file = tmp.path().join("net.conf");
    std::fs::write(&file, conf.to_string()).unwrap();
    let out = Command::new(thereabouts_bin()).args(["pools", "--config", file.to_str().unwrap(), "--output", "json"]).output().unwrap();
    assert!(out.status.success(), "pools: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn dual_stack_add_check_status_gc_del_on_plain_etcd() {
    let etcd = Etcd::start_plain().expect("starting etcd");
    let conf = etcd_conf(etcd.access(), &["192.0.2.0/28", "2001:db8:1::/64"]);
    let (v4, v6) = ("/thereabouts/pools/192.0.2.0-28", "/thereabouts/pools/2001-db8-1---64");

    let a = add(&conf, "cid-a", "pod-a");
    a.expect_ok("ADD pod-a");
    assert_eq!(a.ips(), ["192.0.2.1/28", "2001:db8:1::1/64"]);
    let b = add(&conf, "cid-b", "pod-b");
    b.expect_ok("ADD pod-b");
    assert_eq!(b.ips(), ["192.0.2.2/28", "2001:db8:1::2/64"]);
    // The exact keys and values.
    let dump = etcd.dump("/thereabouts/").unwrap();
    assert_eq!(
        dump,
        [
            (v4.to_string(), format!(r#"{{"range":"192.0.2.0/28","allocations":{{"1":{},"2":{}}}}}"#, entry("cid-a", "pod-a"), entry("cid-b", "pod-b"))),
            (v6.to_string(), format!(r#"{{"range":"2001:db8:1::/64","allocations":{{"1":{},"2":{}}}}}"#, entry("cid-a", "pod-a"), entry("cid-b", "pod-b"))),
            (format!("{RESERVATIONS}192.0.2.1"), reservation("cid-a", "pod-a")),
            (format!("{RESERVATIONS}192.0.2.2"), reservation("cid-b", "pod-b")),
            (format!("{RESERVATIONS}2001-db8-1--1"), reservation("cid-a", "pod-a")),
            (format!("{RESERVATIONS}2001-db8-1--2"), reservation("cid-b", "pod-b")),
        ]
    );

    // Idempotent ADD: the same addresses, nothing written.
    let revisions = (etcd.get(v4).unwrap().unwrap().1, etcd.get(v6).unwrap().unwrap().1);
    let again = add(&conf, "cid-a", "pod-a");
    again.expect_ok("repeated ADD pod-a");
    assert_eq!(again.ips(), a.ips());
    assert_eq!((etcd.get(v4).unwrap().unwrap().1, etcd.get(v6).unwrap().unwrap().1), revisions);

    // CHECK: right addresses pass, a wrong one fails.
    let mut check = conf.clone();
    check["prevResult"] = json!({"cniVersion": "1.1.0", "ips": [{"address": "192.0.2.2/28"}, {"address": "2001:db8:1::2/64"}]});
    run(&Call::pod("CHECK", "cid-b", "pod-b"), &check.to_string(), &[]).expect_ok("CHECK pod-b");
    check["prevResult"]["ips"][0]["address"] = json!("192.0.2.9/28");
    run(&Call::pod("CHECK", "cid-b", "pod-b"), &check.to_string(), &[]).expect_cni_error("CHECK with a wrong address");

    // STATUS, and `thereabouts pools` through the same datastore.
    run(&Call::global("STATUS"), &conf.to_string(), &[]).expect_ok("STATUS");
    let report = pools_report(&conf);
    assert!(report["datastore"].as_str().unwrap().contains(&format!("etcd datastore: prefix /thereabouts/ at {}", etcd.endpoint())), "{report}");
    assert_eq!((report["ranges"][0]["allocated"].as_str(), report["ranges"][0]["free"].as_str()), (Some("2"), Some("12")));
    assert_eq!(report["ranges"][1]["pool_name"], "2001-db8-1---64");

    // GC: etcd is shared by every node, so this node's list cannot condemn anything.
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    run(&Call::global("GC"), &gc.to_string(), &[]).expect_ok("GC");
    assert_eq!(etcd.dump("/thereabouts/").unwrap(), dump);

    // DEL of a container never seen: success, nothing written.
    del(&conf, "cid-unknown", "pod-x").expect_ok("DEL of an unknown container");
    assert_eq!(etcd.dump("/thereabouts/").unwrap(), dump);

    // DEL pod-a: its entries and reservations go, pod-b's stay; a repeat is fine.
    del(&conf, "cid-a", "pod-a").expect_ok("DEL pod-a");
    let after = etcd.dump("/thereabouts/").unwrap();
    assert_eq!(keys(&after), [v4, v6, "/thereabouts/reservations/192.0.2.2", "/thereabouts/reservations/2001-db8-1--2"]);
    assert_eq!(after[0].1, format!(r#"{{"range":"192.0.2.0/28","allocations":{{"2":{}}}}}"#, entry("cid-b", "pod-b")));
    del(&conf, "cid-a", "pod-a").expect_ok("repeated DEL pod-a");
    del(&conf, "cid-b", "pod-b").expect_ok("DEL pod-b");
    let empty = etcd.dump("/thereabouts/").unwrap();
    assert_eq!(keys(&empty), [v4, v6], "pools stay, empty; no reservation left");
    assert!(empty.iter().all(|(_, v)| v.ends_with(r#""allocations":{}}"#)), "{empty:?}");
}

#[test]
fn overlapping_ranges_never_share_an_address_and_a_later_range_exhausted_writes_nothing() {
    let etcd = Etcd::start_plain().expect("starting etcd");
    let wide = etcd_conf(etcd.access(), &["192.0.2.0/24"]);
    let narrow = etcd_conf(etcd.access(), &["192.0.2.0/28"]);
    // Alternate between the two pools: each address is reserved once, whoever
    // takes it, so the /24 steps over what the /28 holds and the other way round.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..6 {
        let conf = if i % 2 == 0 { &narrow } else { &wide };
        let o = add(conf, &format!("cid-{i}"), &format!("pod-{i}"));
        o.expect_ok("ADD");
        let ip = o.ips()[0].split('/').next().unwrap().to_string();
        assert!(seen.insert(ip.clone()), "{ip} handed out twice");
    }
    assert_eq!(seen.len(), 6);
    let pools: Vec<_> = etcd.dump(POOLS).unwrap();
    assert_eq!(keys(&pools), ["/thereabouts/pools/192.0.2.0-24", "/thereabouts/pools/192.0.2.0-28"]);
    assert_eq!(etcd.dump(RESERVATIONS).unwrap().len(), 6);

    // A reservation held by someone else (written behind the plugin's back) is
    // planned around.
    etcd.put("/thereabouts/reservations/192.0.2.7", &reservation("cid-other", "pod-other")).unwrap();
    let o = add(&wide, "cid-7", "pod-7");
    o.expect_ok("ADD around a foreign reservation");
    assert_eq!(o.ips(), ["192.0.2.8/24"]);

    // Multi-range ADD whose second range is full: nothing of it is written.
    let tiny = etcd_conf(etcd.access(), &["198.51.100.0/30"]);
    add(&tiny, "cid-t1", "pod-t1").expect_ok("ADD t1");
    add(&tiny, "cid-t2", "pod-t2").expect_ok("ADD t2");
    let before = etcd.dump("/thereabouts/").unwrap();
    let both = etcd_conf(etcd.access(), &["203.0.113.0/24", "198.51.100.0/30"]);
    let e = add(&both, "cid-z", "pod-z").expect_cni_error("ADD with the second range exhausted");
    assert!(e["msg"].as_str().unwrap().contains("198.51.100."), "{e}");
    assert_eq!(etcd.dump("/thereabouts/").unwrap(), before, "nothing of the failed ADD was written");
}

/// A pod's sandbox re-created: the new container adopts the entry, then the
/// old container's DEL comes. The entry and its reservation stay.
#[test]
fn the_old_containers_del_keeps_the_reservation_its_pod_still_uses() {
    let etcd = Etcd::start_plain().expect("starting etcd");
    let wide = etcd_conf(etcd.access(), &["192.0.2.0/24"]);
    let narrow = etcd_conf(etcd.access(), &["192.0.2.0/28"]);
    assert_eq!(add(&wide, "cid-r1", "renewed").ips(), ["192.0.2.1/24"]);
    assert_eq!(add(&wide, "cid-r2", "renewed").ips(), ["192.0.2.1/24"]);
    del(&wide, "cid-r1", "renewed").expect_ok("DEL of the old container");
    let (pool, _) = etcd.get("/thereabouts/pools/192.0.2.0-24").unwrap().expect("pool");
    assert!(pool.contains(&format!(r#""1":{}"#, entry("cid-r2", "renewed"))), "{pool}");
    let (held, _) = etcd.get(&format!("{RESERVATIONS}192.0.2.1")).unwrap().expect("the reservation stays");
    assert!(held.contains(r#""podref":"default/renewed""#), "{held}");
    assert_eq!(add(&narrow, "cid-o", "other").ips(), ["192.0.2.2/28"], "an overlapping range plans around the address");
    del(&wide, "cid-r2", "renewed").expect_ok("DEL of the new container");
    assert_eq!(etcd.get(&format!("{RESERVATIONS}192.0.2.1")).unwrap(), None);
}

/// A loopback port nobody listens on.
fn dead_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn an_unreachable_etcd_is_try_again_later_within_the_deadline() {
    let access = Access { endpoint: format!("127.0.0.1:{}", dead_port()), user: None, tls: None };
    let conf = etcd_conf(&access, &["192.0.2.0/24"]).to_string();
    let budget = [("THEREABOUTS_TIMEOUT_MS", "2000")];
    let o = run(&Call::pod("ADD", "cid-a", "pod-a"), &conf, &budget);
    let e = o.expect_cni_error("ADD with etcd down");
    assert_eq!(e["code"], 11, "{}", o.describe());
    assert!(e["msg"].as_str().unwrap().contains("unavailable"), "{e}");
    assert!(o.elapsed < Duration::from_secs(5), "took {:?}", o.elapsed);
    let o = run(&Call::global("STATUS"), &conf, &budget);
    assert_eq!(o.expect_cni_error("STATUS with etcd down")["code"], 50, "{}", o.describe());
    assert!(o.elapsed < Duration::from_secs(5), "took {:?}", o.elapsed);
}

#[test]
fn tls_and_auth_work_and_bad_credentials_or_files_are_named() {
    let etcd = Etcd::start_secured().expect("starting etcd with TLS and auth");
    let access = etcd.access().clone();
    let conf = etcd_conf(&access, &["192.0.2.0/28", "2001:db8:2::/64"]);
    assert!(access.endpoint.starts_with("https://"));

    let a = add(&conf, "cid-a", "pod-a");
    a.expect_ok("ADD over TLS as the plugin user");
    assert_eq!(a.ips(), ["192.0.2.1/28", "2001:db8:2::1/64"]);
    assert_eq!(keys(&etcd.dump("/thereabouts/").unwrap()).len(), 4);
    run(&Call::global("STATUS"), &conf.to_string(), &[]).expect_ok("STATUS over TLS");
    del(&conf, "cid-a", "pod-a").expect_ok("DEL over TLS");
    let before = etcd.dump("/").unwrap();
    assert_eq!(before.iter().filter(|(k, _)| k.starts_with(RESERVATIONS)).count(), 0);

    // Wrong password: denied, named, not retried as transient.
    let mut wrong = conf.clone();
    wrong["ipam"]["etcd_password"] = json!("not-the-password");
    let o = add(&wrong, "cid-b", "pod-b");
    let e = o.expect_cni_error("ADD with a wrong password");
    let msg = e["msg"].as_str().unwrap();
    assert_eq!(e["code"], 999, "{}", o.describe());
    assert!(msg.contains("denied") && msg.contains("authentication failed") && msg.contains("etcd_password"), "{msg}");

    // A prefix outside the plugin user's role: denied, naming the permission.
    let mut elsewhere = conf.clone();
    elsewhere["ipam"]["etcd_prefix"] = json!("/elsewhere/");
    let e = add(&elsewhere, "cid-b", "pod-b").expect_cni_error("ADD outside the role's prefix");
    assert!(e["msg"].as_str().unwrap().contains("permission denied"), "{e}");

    // Certificate files that do not exist, or are no certificates: config errors naming them.
    let mut missing = conf.clone();
    missing["ipam"]["etcd_cert_file"] = json!("/nonexistent/thereabouts-client.pem");
    let e = add(&missing, "cid-b", "pod-b").expect_cni_error("ADD with a missing certificate file");
    assert_eq!(e["code"], 7);
    let msg = e["msg"].as_str().unwrap();
    assert!(msg.contains("etcd_cert_file") && msg.contains("/nonexistent/thereabouts-client.pem"), "{msg}");
    let mut junk = conf.clone();
    junk["ipam"]["etcd_ca_cert_file"] = json!(etcd.dir().join("etcd.log"));
    let e = add(&junk, "cid-b", "pod-b").expect_cni_error("ADD with a CA file that holds no certificate");
    assert!(e["code"] == 7 && e["msg"].as_str().unwrap().contains("etcd_ca_cert_file"), "{e}");

    // A CA that did not sign etcd's certificate: the handshake fails; the
    // answer comes within the budget and says so.
    let mut untrusted = conf.clone();
    untrusted["ipam"]["etcd_ca_cert_file"] = json!(access.tls.as_ref().unwrap().1);
    let o = run(&Call::pod("ADD", "cid-b", "pod-b"), &untrusted.to_string(), &[("THEREABOUTS_TIMEOUT_MS", "3000")]);
    let e = o.expect_cni_error("ADD trusting the wrong CA");
    assert_eq!(e["code"], 999, "{}", o.describe());
    assert!(e["msg"].as_str().unwrap().contains("rejected") && e["msg"].as_str().unwrap().contains("certificate"), "{e}");
    assert!(o.elapsed < Duration::from_secs(6), "took {:?}", o.elapsed);

    // None of the failed calls wrote anything.
    assert_eq!(etcd.dump("/").unwrap(), before);
}

#[test]
fn concurrent_adds_conflict_retry_and_never_share_an_address() {
    let etcd = Etcd::start_plain().expect("starting etcd");
    let conf = etcd_conf(etcd.access(), &["192.0.2.0/27", "2001:db8:3::/64"]).to_string();
    // Twelve plugins at once on the same two pools: the losers of each
    // transaction read again and plan again.
    let calls: Vec<Invocation> = (0..12).map(|i| Invocation::new(Call::pod("ADD", &format!("cid-{i}"), &format!("pod-{i}")), conf.clone())).collect();
    let mut v4 = std::collections::BTreeSet::new();
    for o in run_concurrently(&thereabouts_bin(), &calls, None) {
        o.expect_ok("concurrent ADD");
        assert!(v4.insert(o.ips()[0].clone()), "duplicate: {}", o.describe());
    }
    let dump = etcd.dump("/thereabouts/").unwrap();
    let pool: Value = serde_json::from_str(&dump.iter().find(|(k, _)| k == "/thereabouts/pools/192.0.2.0-27").unwrap().1).unwrap();
    assert_eq!(pool["allocations"].as_object().unwrap().len(), 12);
    assert_eq!(dump.iter().filter(|(k, _)| k.starts_with(RESERVATIONS)).count(), 24);
}

#[test]
fn teardown_leaves_nothing_behind() {
    let etcd = Etcd::start_secured().expect("starting etcd");
    let (pid, dir) = (etcd.pid().unwrap(), etcd.dir().to_path_buf());
    assert!(thereabouts_k8s_harness::pid_alive(pid) && dir.is_dir());
    drop(etcd);
    assert!(!thereabouts_k8s_harness::pid_alive(pid), "etcd {pid} still running");
    assert!(!dir.exists(), "{} left behind", dir.display());
}
