//! Policy extensions on the etcd datastore, through the CNI protocol against a
//! real etcd (3.6, from tests/k8s-bins; plain, on loopback), the keys and values
//! unchanged by the policy:
//!
//! * sticky-ordinal (`base` 10): the StatefulSet pod web-3 gets first + 10 + 3
//!   in each range (192.0.2.14, 2001:db8::e), another pod the built-in choice,
//!   and web-3 comes back to the same addresses after its DEL, with a new
//!   container ID;
//! * what a policy ADD stores is exactly what an ADD without a policy stores
//!   for the same pod at the same addresses (under another prefix, the
//!   addresses reached with `range_start` instead): the same keys, the same
//!   values byte for byte.
//!
//! Binary: `$THEREABOUTS_BIN`, else `target/plugin/thereabouts` (tests/k8s.sh builds it with scripts/build-plugin.sh).

use std::path::Path;

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir, built_policy, compile_policy, thereabouts_bin};
use thereabouts_k8s_harness::etcd::{self, Etcd};

const RANGES: [&str; 2] = ["192.0.2.0/24", "2001:db8::/64"];
const V4_POOL: &str = "/thereabouts/pools/192.0.2.0-24";
const V6_POOL: &str = "/thereabouts/pools/2001-db8---64";
/// Where sticky-ordinal puts web-3 with `base` 10: first (.1 / ::1) + 10 + 3.
const STICKY: [&str; 2] = ["192.0.2.14/24", "2001:db8::e/64"];

/// One CNI call of pod `default/<pod>` (interface eth0) with the policy cache `cache`.
fn call(conf: &Value, cache: &Path, command: &str, pod: &str, cid: &str) -> Outcome {
    Invocation::new(Call::pod(command, cid, pod), conf.to_string()).env("THEREABOUTS_POLICY_CACHE", cache.to_str().unwrap()).run(&thereabouts_bin())
}

fn add(conf: &Value, cache: &Path, pod: &str, cid: &str) -> Vec<String> {
    let out = call(conf, cache, "ADD", pod, cid);
    out.expect_ok(&format!("ADD {pod} ({cid})"));
    out.ips()
}

fn entry(cid: &str, pod: &str) -> String {
    format!(r#"{{"id":"{cid}","podref":"default/{pod}","ifname":"eth0"}}"#)
}

fn reservation(cid: &str, pod: &str) -> String {
    format!(r#"{{"containerid":"{cid}","podref":"default/{pod}","ifname":"eth0"}}"#)
}

/// Every key under `prefix`, the prefix cut off, with its value.
fn dump_under(etcd: &Etcd, prefix: &str) -> Vec<(String, String)> {
    etcd.dump(prefix).unwrap().into_iter().map(|(k, v)| (k[prefix.len()..].to_string(), v)).collect()
}

#[test]
fn sticky_ordinal_keeps_a_pods_addresses_on_etcd_and_stores_what_a_plain_add_stores() {
    let etcd = Etcd::start_plain().expect("starting etcd");
    let tmp = TempDir::new("policy-etcd");
    let cache = tmp.sub("cache");
    compile_policy(&built_policy("sticky-ordinal"), &cache);
    let mut conf = etcd::etcd_conf(etcd.access(), "thab-etcd", &RANGES);
    conf["ipam"]["policies"] = json!([{"name": "sticky", "path": built_policy("sticky-ordinal"), "settings": {"base": 10}}]);

    assert_eq!(add(&conf, &cache, "web-3", "c1"), STICKY, "first + base + ordinal");
    let after_first = dump_under(&etcd, "/thereabouts/");

    // The same pod at the same addresses without a policy, in a fresh prefix:
    // range_start makes .14 / ::e the built-in choice. Byte for byte the same
    // keys and values, so any whereabouts-compatible reader sees no difference.
    let mut plain = etcd::etcd_conf(etcd.access(), "thab-etcd", &RANGES);
    plain["ipam"]["etcd_prefix"] = json!("/plain/");
    plain["ipam"]["ipRanges"] = json!([{"range": RANGES[0], "range_start": "192.0.2.14"}, {"range": RANGES[1], "range_start": "2001:db8::e"}]);
    assert_eq!(add(&plain, &cache, "web-3", "c1"), STICKY, "range_start: the built-in choice lands on the same addresses");
    assert_eq!(after_first, dump_under(&etcd, "/plain/"), "a policy ADD stores exactly what a plain ADD stores");
    assert_eq!(
        after_first,
        [
            ("pools/192.0.2.0-24".to_string(), format!(r#"{{"range":"192.0.2.0/24","allocations":{{"14":{}}}}}"#, entry("c1", "web-3"))),
            ("pools/2001-db8---64".to_string(), format!(r#"{{"range":"2001:db8::/64","allocations":{{"14":{}}}}}"#, entry("c1", "web-3"))),
            ("reservations/192.0.2.14".to_string(), reservation("c1", "web-3")),
            ("reservations/2001-db8--e".to_string(), reservation("c1", "web-3")),
        ],
        "the whereabouts layout: offsets in decimal, reservations by address"
    );

    // No ordinal: the built-in choice, beside web-3 in the same pool values.
    assert_eq!(add(&conf, &cache, "filler", "c2"), ["192.0.2.1/24", "2001:db8::1/64"], "no ordinal: the built-in choice");
    let both = |web3_cid: &str| {
        let allocations = format!(r#"{{"1":{},"14":{}}}"#, entry("c2", "filler"), entry(web3_cid, "web-3"));
        vec![
            (V4_POOL.to_string(), format!(r#"{{"range":"192.0.2.0/24","allocations":{allocations}}}"#)),
            (V6_POOL.to_string(), format!(r#"{{"range":"2001:db8::/64","allocations":{allocations}}}"#)),
            ("/thereabouts/reservations/192.0.2.1".to_string(), reservation("c2", "filler")),
            ("/thereabouts/reservations/192.0.2.14".to_string(), reservation(web3_cid, "web-3")),
            ("/thereabouts/reservations/2001-db8--1".to_string(), reservation("c2", "filler")),
            ("/thereabouts/reservations/2001-db8--e".to_string(), reservation(web3_cid, "web-3")),
        ]
    };
    assert_eq!(etcd.dump("/thereabouts/").unwrap(), both("c1"));

    // DEL web-3: its entries and reservations go, the filler's stay.
    call(&conf, &cache, "DEL", "web-3", "c1").expect_ok("DEL web-3");
    let allocations = format!(r#"{{"1":{}}}"#, entry("c2", "filler"));
    assert_eq!(
        etcd.dump("/thereabouts/").unwrap(),
        [
            (V4_POOL.to_string(), format!(r#"{{"range":"192.0.2.0/24","allocations":{allocations}}}"#)),
            (V6_POOL.to_string(), format!(r#"{{"range":"2001:db8::/64","allocations":{allocations}}}"#)),
            ("/thereabouts/reservations/192.0.2.1".to_string(), reservation("c2", "filler")),
            ("/thereabouts/reservations/2001-db8--1".to_string(), reservation("c2", "filler")),
        ],
        "DEL freed web-3's addresses"
    );

    // Re-created with a new container ID: the same addresses, stored as before
    // but for the container ID.
    assert_eq!(add(&conf, &cache, "web-3", "c3"), STICKY, "re-created after its DEL");
    assert_eq!(etcd.dump("/thereabouts/").unwrap(), both("c3"));
}
