//! Data plane end to end: Debian's `bridge` plugin (containernetworking-plugins) delegates
//! IPAM to our release `thereabouts` binary, in real network namespaces; the container's
//! eth0 must carry exactly the addresses in the result, in the configured order, and DEL
//! must take them away and free them in the pool files.
//!
//! Needs root (CI runs as root): without it these tests FAIL, they do not skip.
//! Isolation: the bridge lives in a namespace of its own (`…-h`, the "host" side), the
//! container side in `…-c`; nothing is configured in the machine's own namespace, only
//! documentation ranges are used, and both namespaces are deleted on drop, even on failure.

use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use thereabouts_e2e::*;

const BRIDGE_PLUGIN: &str = "/usr/lib/cni/bridge";

fn sh(args: &[&str]) -> std::process::Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("exec {args:?}: {e}"))
}

fn must(args: &[&str]) -> String {
    let o = sh(args);
    assert!(o.status.success(), "{args:?} failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// Two network namespaces (host side with the bridge, container side); removed on drop.
struct Netns {
    host: String,
    ctr: String,
}

impl Netns {
    fn new(tag: &str) -> Netns {
        assert!(is_root(), "the data-plane e2e tests need root (they create network namespaces and a bridge); run them as root (CI does)");
        assert!(Path::new(BRIDGE_PLUGIN).is_file(), "{BRIDGE_PLUGIN} missing: apt-get install -y containernetworking-plugins (tests/host-e2e.sh does)");
        let n = Netns { host: format!("thab-e2e-{tag}-h"), ctr: format!("thab-e2e-{tag}-c") };
        n.cleanup(); // leftovers of an interrupted earlier run
        for ns in [&n.host, &n.ctr] {
            let o = sh(&["ip", "netns", "add", ns]);
            assert!(
                o.status.success(),
                "`ip netns add {ns}` is not permitted here ({}): the data-plane tests need CAP_SYS_ADMIN/CAP_NET_ADMIN",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            // IPv6 on (some hosts boot with it off by default), no DAD delays.
            for (k, v) in [("all/disable_ipv6", "0"), ("default/disable_ipv6", "0"), ("default/accept_dad", "0")] {
                must(&["ip", "netns", "exec", ns, "sh", "-c", &format!("echo {v} > /proc/sys/net/ipv6/conf/{k}")]);
            }
        }
        must(&["ip", "-n", &n.host, "link", "set", "lo", "up"]);
        must(&["ip", "-n", &n.ctr, "link", "set", "lo", "up"]);
        n
    }
    fn ctr_path(&self) -> String {
        format!("/var/run/netns/{}", self.ctr)
    }
    fn cleanup(&self) {
        let _ = sh(&["ip", "netns", "del", &self.ctr]);
        let _ = sh(&["ip", "netns", "del", &self.host]);
    }
    /// Global (non link-local) addresses on `dev` in the container, as `ip/prefix`; None if the device is gone.
    fn addrs(&self, dev: &str) -> Option<BTreeSet<(IpAddr, u8)>> {
        let o = sh(&["ip", "-n", &self.ctr, "-j", "addr", "show", "dev", dev]);
        if !o.status.success() {
            return None;
        }
        let v: Value = serde_json::from_slice(&o.stdout).expect("ip -j output");
        let mut set = BTreeSet::new();
        for link in v.as_array().into_iter().flatten() {
            for a in link["addr_info"].as_array().into_iter().flatten() {
                if a["scope"] == "link" {
                    continue; // fe80:: and friends
                }
                let ip: IpAddr = a["local"].as_str().unwrap().parse().unwrap();
                set.insert((ip, a["prefixlen"].as_u64().unwrap() as u8));
            }
        }
        Some(set)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the host-side namespace removes the bridge and the veth pair with it.
        self.cleanup();
    }
}

/// CNI_PATH directory holding the bridge plugin and our binary under the name `thereabouts`.
fn plugin_dir(tmp: &TempDir, bin: &Path) -> PathBuf {
    let d = tmp.sub("cni-bin");
    std::os::unix::fs::symlink(BRIDGE_PLUGIN, d.join("bridge")).unwrap();
    std::os::unix::fs::symlink(bin, d.join("thereabouts")).unwrap();
    d
}

fn parse_cidr(s: &str) -> (IpAddr, u8) {
    let (ip, len) = s.split_once('/').unwrap();
    (ip.parse().unwrap(), len.parse().unwrap())
}

/// Runs bridge ADD then DEL with thereabouts as IPAM; `expect_in` is, per result position,
/// the range the address must come from.
fn bridge_round_trip(tag: &str, bridge: &str, legacy: Option<&str>, ranges: &[&str], expect_in: &[&str]) {
    let bin = thereabouts_bin();
    let tmp = TempDir::new(tag);
    let data = tmp.sub("data");
    let dir = plugin_dir(&tmp, &bin);
    let ns = Netns::new(tag);

    // cniVersion 1.0.0: the newest the bookworm bridge plugin (1.1.1) speaks.
    let mut conf = thereabouts_conf("1.0.0", &format!("thab-e2e-{tag}"), &data, legacy, ranges);
    conf["type"] = json!("bridge");
    conf["bridge"] = json!(bridge);
    conf["isGateway"] = json!(false);
    conf["ipMasq"] = json!(false);
    let conf = conf.to_string();
    let cid = format!("e2e-{tag}-ctr");
    let call = |cmd: &str| Call {
        command: cmd.into(),
        container_id: cid.clone(),
        netns: ns.ctr_path(),
        ifname: "eth0".into(),
        cni_args: k8s_args(&format!("pod-{tag}")),
        cni_path: dir.to_str().unwrap().into(),
    };
    // The bridge plugin runs in the host-side namespace, as a runtime would run it in the host's.
    let in_host = |c: &Call| -> Outcome {
        let wrapper = tmp.path().join("in-host-ns.sh");
        std::fs::write(&wrapper, format!("#!/bin/sh\nexec ip netns exec {} {BRIDGE_PLUGIN}\n", ns.host)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        c.run(&wrapper, &conf)
    };

    let add = in_host(&call("ADD"));
    add.expect_ok("bridge ADD with ipam thereabouts");
    let ips = add.ips();
    assert_eq!(ips.len(), expect_in.len(), "result must carry one address per range: {}", add.describe());
    for (i, (ip, range)) in ips.iter().zip(expect_in).enumerate() {
        let (a, len) = parse_cidr(ip);
        let (net, rlen) = range_network(range);
        assert_eq!(len, rlen, "ips[{i}] {ip}: prefix length must be that of {range}");
        assert_eq!(
            range_network(&format!("{a}/{rlen}")).0,
            net,
            "ips[{i}] = {ip} should come from {range} (result order: legacy range first, then ipRanges in order)"
        );
    }
    let want: BTreeSet<(IpAddr, u8)> = ips.iter().map(|s| parse_cidr(s)).collect();
    let got = ns.addrs("eth0").unwrap_or_else(|| panic!("eth0 missing in {} after ADD", ns.ctr));
    assert_eq!(got, want, "eth0 in {} must carry exactly the allocated addresses", ns.ctr);

    let (pools, _) = read_store(&data).unwrap_or_else(|e| panic!("{e}"));
    let held: BTreeSet<IpAddr> = check_unique(&pools).unwrap().into_iter().filter(|(_, e)| e.id == cid).map(|(a, _)| a).collect();
    assert_eq!(held, want.iter().map(|(a, _)| *a).collect(), "pool files must hold exactly the result's addresses for {cid}");

    in_host(&call("DEL")).expect_ok("bridge DEL with ipam thereabouts");
    if let Some(left) = ns.addrs("eth0") {
        let still: Vec<_> = left.intersection(&want).collect();
        assert!(still.is_empty(), "addresses still on eth0 after DEL: {still:?}");
    }
    let (pools, _) = read_store(&data).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(count_allocs(&pools), 0, "pool files must hold no entry after DEL");
    in_host(&call("DEL")).expect_ok("repeated bridge DEL (must be idempotent)");
}

#[test]
fn bridge_dual_stack_ip_ranges() {
    bridge_round_trip("ds", "thabe0", None, &["192.0.2.0/24", "2001:db8:1::/64"], &["192.0.2.0/24", "2001:db8:1::/64"]);
}

#[test]
fn bridge_two_ipv4_ranges() {
    bridge_round_trip("v4v4", "thabe1", None, &["198.51.100.0/24", "203.0.113.0/24"], &["198.51.100.0/24", "203.0.113.0/24"]);
}

#[test]
fn bridge_legacy_range_plus_ip_ranges() {
    bridge_round_trip(
        "legacy",
        "thabe2",
        Some("203.0.113.0/24"),
        &["198.51.100.0/24", "2001:db8:3::/64"],
        &["203.0.113.0/24", "198.51.100.0/24", "2001:db8:3::/64"],
    );
}
