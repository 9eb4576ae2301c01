//! GC (CNI 1.1.0) through the standard interface: the attachments not listed in
//! `cni.dev/valid-attachments` lose their addresses, the listed ones keep theirs; an
//! attachment is (containerID, ifname), so a listed ID with another ifname is not valid.

use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::Path;
use thereabouts_e2e::*;

fn add(bin: &Path, conf: &str, cid: &str, ifname: &str) {
    let mut c = Call::pod("ADD", cid, &format!("pod-{cid}"));
    c.ifname = ifname.into();
    let o = c.run(bin, conf);
    o.expect_ok("ADD");
    assert_eq!(o.ips().len(), 2, "{}", o.describe());
}

fn holders(data: &Path) -> BTreeSet<(String, String)> {
    let (pools, _) = read_store(data).unwrap_or_else(|e| panic!("{e}"));
    check_unique(&pools).unwrap_or_else(|e| panic!("{e}"));
    pools.iter().flat_map(|p| p.allocs.iter().map(|a| (a.id.clone(), a.ifname.clone()))).collect()
}

fn gc(bin: &Path, conf: &Value, key: &str, valid: &[(&str, &str)]) {
    let mut c = conf.clone();
    c[key] = Value::Array(valid.iter().map(|(id, ifn)| json!({"containerID": id, "ifname": ifn})).collect());
    Call::global("GC").run(bin, &c.to_string()).expect_ok("GC");
}

fn set(v: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn gc_frees_exactly_the_attachments_not_listed() {
    let bin = thereabouts_bin();
    let tmp = TempDir::new("gc");
    let data = tmp.sub("data");
    let conf = thereabouts_conf("1.1.0", "thab-gc", &data, None, &["192.0.2.0/24", "2001:db8:9c::/64"]);
    let cs = conf.to_string();
    add(&bin, &cs, "gc-a", "eth0");
    add(&bin, &cs, "gc-b", "eth0");
    add(&bin, &cs, "gc-c", "eth0");
    add(&bin, &cs, "gc-c", "net1");
    assert_eq!(holders(&data), set(&[("gc-a", "eth0"), ("gc-b", "eth0"), ("gc-c", "eth0"), ("gc-c", "net1")]));

    gc(&bin, &conf, "cni.dev/valid-attachments", &[("gc-a", "eth0"), ("gc-b", "eth0"), ("gc-c", "eth0"), ("gc-c", "net1")]);
    assert_eq!(
        holders(&data),
        set(&[("gc-a", "eth0"), ("gc-b", "eth0"), ("gc-c", "eth0"), ("gc-c", "net1")]),
        "GC with every attachment listed must free nothing"
    );

    gc(&bin, &conf, "cni.dev/valid-attachments", &[("gc-a", "eth0"), ("gc-b", "eth9"), ("gc-c", "net1")]);
    assert_eq!(holders(&data), set(&[("gc-a", "eth0"), ("gc-c", "net1")]), "GC must free gc-b/eth0 (only gc-b/eth9 is valid) and gc-c/eth0");

    gc(&bin, &conf, "cni.dev/valid-attachments", &[("someone-else", "eth0")]);
    assert_eq!(holders(&data), BTreeSet::new(), "GC with no matching attachment must free everything");
}

/// The `spec-v1.1.0` tag spells the key `cni.dev/attachments`; libcni ≥ 1.2.3 sends both.
/// A plugin given only the old spelling must honour it (not treat the list as absent).
#[test]
fn gc_honours_the_old_key_spelling() {
    let bin = thereabouts_bin();
    let tmp = TempDir::new("gc-old");
    let data = tmp.sub("data");
    let conf = thereabouts_conf("1.1.0", "thab-gc-old", &data, None, &["198.51.100.0/24", "2001:db8:9d::/64"]);
    let cs = conf.to_string();
    add(&bin, &cs, "old-a", "eth0");
    add(&bin, &cs, "old-b", "eth0");
    gc(&bin, &conf, "cni.dev/attachments", &[("old-a", "eth0")]);
    assert_eq!(holders(&data), set(&[("old-a", "eth0")]), "GC given only `cni.dev/attachments` must keep old-a and free old-b");
}
