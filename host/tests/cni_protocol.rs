//! The built binary through the CNI protocol: env vars + stdin in, one JSON
//! document on stdout, exit status. Every command in every spec version, the
//! allocation guarantees, and bad input (which must leave the datastore
//! byte-for-byte untouched).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use thereabouts::datastore::pool_file;

const VERSIONS: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_thereabouts"))
}

/// A scratch directory removed at the end of the test.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("thereabouts-proto-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn data(&self) -> PathBuf {
        self.0.join("data")
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}\nstderr: {}", self.stdout, self.stderr))
    }
    /// Asserts a CNI error with `code` and returns its message.
    fn error(&self, code: u64) -> String {
        assert_ne!(self.code, 0, "expected failure, got success: {}", self.stdout);
        let doc = self.json();
        assert_eq!(doc["code"], code, "wrong code in {}", self.stdout);
        doc["msg"].as_str().unwrap_or_default().to_string()
    }
    fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "expected success, got {}\nstdout: {}\nstderr: {}", self.code, self.stdout, self.stderr);
        self
    }
}

fn run_with(program: &Path, env: &[(&str, &str)], stdin: &str) -> Outcome {
    let mut child = Command::new(program)
        .env_clear()
        .env("THEREABOUTS_TIMEOUT_MS", "5000")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn plugin");
    // The plugin may fail on its environment before reading stdin (broken pipe).
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    Outcome { code: out.status.code().unwrap_or(-1), stdout: String::from_utf8_lossy(&out.stdout).into(), stderr: String::from_utf8_lossy(&out.stderr).into() }
}

fn run(env: &[(&str, &str)], stdin: &str) -> Outcome {
    run_with(&binary(), env, stdin)
}

/// ADD/DEL/CHECK environment for a container.
fn cni_env<'a>(command: &'a str, container: &'a str, args: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", container),
        ("CNI_NETNS", "/var/run/netns/test"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        ("CNI_ARGS", args),
    ]
}

fn pod(name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}")
}

fn add(stdin: &str, container: &str, pod_name: &str) -> Outcome {
    run(&cni_env("ADD", container, &pod(pod_name)), stdin)
}
fn del(stdin: &str, container: &str) -> Outcome {
    run(&cni_env("DEL", container, ""), stdin)
}

/// A network config (not a list) with the given ipam section.
fn net(version: &str, ipam: Value) -> String {
    json!({"cniVersion": version, "name": "testnet", "type": "bridge", "ipam": ipam}).to_string()
}

fn dual_stack(version: &str, data: &Path) -> String {
    net(
        version,
        json!({
            "type": "thereabouts",
            "datastore": "file",
            "data_dir": data,
            "ipRanges": [{"range": "192.0.2.0/24", "gateway": "192.0.2.254"}, {"range": "2001:db8::/64"}],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]
        }),
    )
}

/// Every file under `dir` with its bytes (empty map for a missing dir).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

fn pool_doc(data: &Path, name: &str) -> Value {
    let (_, payload) = pool_file::read_path(&data.join(format!("{name}.pool"))).unwrap().expect("an intact version");
    serde_json::from_slice(&payload).unwrap()
}

fn seed_pool(data: &Path, name: &str, version: u64, doc: &Value) {
    pool_file::write_path(&data.join(format!("{name}.pool")), version, doc.to_string().as_bytes()).unwrap();
}

fn addresses(result: &Value) -> Vec<String> {
    result["ips"].as_array().unwrap().iter().map(|ip| ip["address"].as_str().unwrap().to_string()).collect()
}

#[test]
fn every_command_in_every_spec_version() {
    for version in VERSIONS {
        let scratch = Scratch::new(&format!("versions-{version}"));
        let config = dual_stack(version, &scratch.data());

        let result = add(&config, "c1", "pod1").ok().json();
        assert_eq!(result["cniVersion"], version);
        match version {
            "0.1.0" | "0.2.0" => {
                assert_eq!(result["ip4"], json!({"ip": "192.0.2.1/24", "gateway": "192.0.2.254", "routes": [{"dst": "0.0.0.0/0"}]}));
                assert_eq!(result["ip6"], json!({"ip": "2001:db8::1/64", "routes": [{"dst": "::/0"}]}));
                assert_eq!(result["dns"], json!({}));
                assert!(result.get("ips").is_none());
            }
            "0.3.0" | "0.3.1" | "0.4.0" => {
                assert_eq!(
                    result["ips"],
                    json!([
                        {"version": "4", "address": "192.0.2.1/24", "gateway": "192.0.2.254"},
                        {"version": "6", "address": "2001:db8::1/64"}
                    ])
                );
                assert_eq!(result["routes"], json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]));
                assert_eq!(result["dns"], json!({}));
            }
            _ => {
                assert_eq!(result["ips"], json!([{"address": "192.0.2.1/24", "gateway": "192.0.2.254"}, {"address": "2001:db8::1/64"}]));
                assert!(result.get("dns").is_none(), "1.x omits empty dns");
            }
        }
        assert!(result.get("interfaces").is_none());
        assert!(add(&config, "c1", "pod1").ok().stdout.contains("192.0.2.1/24"), "ADD is idempotent");

        // CHECK exists from 0.4.0 on; it needs the ADD result as prevResult.
        let mut with_prev: Value = serde_json::from_str(&config).unwrap();
        with_prev["prevResult"] = result.clone();
        let check = run(&cni_env("CHECK", "c1", &pod("pod1")), &with_prev.to_string());
        if ["0.4.0", "1.0.0", "1.1.0"].contains(&version) {
            check.ok();
        } else {
            assert!(check.error(1).contains("CHECK"));
        }

        // GC and STATUS exist from 1.1.0 on.
        let gc_env = [("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")];
        let status_env = [("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/opt/cni/bin")];
        let mut gc_config = serde_json::from_str::<Value>(&config).unwrap();
        gc_config["cni.dev/valid-attachments"] = json!([{"containerID": "c1", "ifname": "eth0"}]);
        if version == "1.1.0" {
            run(&gc_env, &gc_config.to_string()).ok();
            run(&status_env, &config).ok();
        } else {
            run(&gc_env, &gc_config.to_string()).error(1);
            run(&status_env, &config).error(1);
        }
        assert_eq!(pool_doc(&scratch.data(), "192.0.2.0-24")["allocations"]["1"]["id"], "c1", "GC kept the valid attachment");

        let version_doc = run(&[("CNI_COMMAND", "VERSION")], &format!("{{\"cniVersion\":\"{version}\"}}")).ok().json();
        assert_eq!(version_doc["cniVersion"], version);
        assert_eq!(version_doc["supportedVersions"], json!(VERSIONS));

        assert_eq!(del(&config, "c1").ok().stdout, "", "DEL prints nothing");
        assert_eq!(pool_doc(&scratch.data(), "192.0.2.0-24")["allocations"], json!({}));
        assert_eq!(pool_doc(&scratch.data(), "2001-db8---64")["allocations"], json!({}));
        del(&config, "c1").ok();
    }
}

#[test]
fn version_needs_no_stdin_and_answers_latest() {
    let out = Command::new(binary()).env_clear().env("CNI_COMMAND", "VERSION").stdin(Stdio::null()).output().unwrap();
    assert!(out.status.success());
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["cniVersion"], "1.1.0");
    assert_eq!(doc["supportedVersions"], json!(VERSIONS));
}

#[test]
fn add_is_idempotent_per_pod_and_interface() {
    let scratch = Scratch::new("idempotent");
    let config = dual_stack("1.0.0", &scratch.data());
    assert_eq!(addresses(&add(&config, "c1", "web-0").ok().json()), ["192.0.2.1/24", "2001:db8::1/64"]);
    assert_eq!(addresses(&add(&config, "c2", "web-1").ok().json()), ["192.0.2.2/24", "2001:db8::2/64"]);
    // The same pod re-created under a new sandbox keeps its address; the entry
    // now names the new container.
    assert_eq!(addresses(&add(&config, "c1-new", "web-0").ok().json()), ["192.0.2.1/24", "2001:db8::1/64"]);
    let pool = pool_doc(&scratch.data(), "192.0.2.0-24");
    assert_eq!((&pool["network"], &pool["allocations"]["1"]), (&json!("testnet"), &json!({"id": "c1-new", "podref": "default/web-0", "ifname": "eth0"})));
    assert_eq!(pool["allocations"].as_object().unwrap().len(), 2);
    // The old container's DEL no longer matches anything.
    del(&config, "c1").ok();
    assert_eq!(pool_doc(&scratch.data(), "192.0.2.0-24")["allocations"].as_object().unwrap().len(), 2);
    // Without Kubernetes pod names, (container ID, ifname) is the identity.
    let out = run(&cni_env("ADD", "plain", ""), &config).ok().json();
    let again = run(&cni_env("ADD", "plain", ""), &config).ok().json();
    assert_eq!(addresses(&out), addresses(&again));
    assert_eq!(addresses(&out), ["192.0.2.3/24", "2001:db8::3/64"]);
}

#[test]
fn del_of_an_unknown_container_succeeds_and_writes_nothing() {
    let scratch = Scratch::new("del-unknown");
    let config = dual_stack("1.0.0", &scratch.data());
    del(&config, "never-added").ok();
    assert!(!scratch.data().exists(), "DEL must not create the data dir");
    add(&config, "c1", "p1").ok();
    let before = snapshot(&scratch.data());
    del(&config, "someone-else").ok();
    assert_eq!(snapshot(&scratch.data()), before);
}

#[test]
fn check_reports_missing_and_mismatched_allocations() {
    let scratch = Scratch::new("check");
    let config = dual_stack("1.0.0", &scratch.data());
    let result = add(&config, "c1", "p1").ok().json();
    let with_prev = |prev: Value| {
        let mut doc: Value = serde_json::from_str(&config).unwrap();
        doc["prevResult"] = prev;
        doc.to_string()
    };
    run(&cni_env("CHECK", "c1", &pod("p1")), &with_prev(result.clone())).ok();
    let mut wrong = result.clone();
    wrong["ips"][0]["address"] = json!("192.0.2.77/24");
    let msg = run(&cni_env("CHECK", "c1", &pod("p1")), &with_prev(wrong)).error(999);
    assert!(msg.contains("192.0.2.1/24") || msg.contains("192.0.2.77/24"), "{msg}");
    let msg = run(&cni_env("CHECK", "other", &pod("p2")), &with_prev(result.clone())).error(999);
    assert!(msg.contains("no allocation"), "{msg}");
    assert!(run(&cni_env("CHECK", "c1", &pod("p1")), &config).error(7).contains("prevResult"));
    del(&config, "c1").ok();
    run(&cni_env("CHECK", "c1", &pod("p1")), &with_prev(result)).error(999);
}

#[test]
fn gc_frees_attachments_that_are_not_valid() {
    let scratch = Scratch::new("gc");
    let config = dual_stack("1.1.0", &scratch.data());
    for (c, p) in [("c1", "p1"), ("c2", "p2"), ("c3", "p3")] {
        add(&config, c, p).ok();
    }
    let gc_env = [("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin"), ("CNI_CONTAINERID", ""), ("CNI_IFNAME", "")];
    let mut doc: Value = serde_json::from_str(&config).unwrap();
    doc["cni.dev/valid-attachments"] = json!([{"containerID": "c2", "ifname": "eth0"}]);
    // The key of the tagged 1.1.0 text is honoured too.
    doc["cni.dev/attachments"] = json!([{"containerID": "c3", "ifname": "eth0"}]);
    assert_eq!(run(&gc_env, &doc.to_string()).ok().stdout, "");
    for pool in ["192.0.2.0-24", "2001-db8---64"] {
        let allocations = pool_doc(&scratch.data(), pool)["allocations"].clone();
        let ids: Vec<&str> = allocations.as_object().unwrap().values().map(|e| e["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["c2", "c3"], "pool {pool}");
    }
    // The freed lowest address is handed out again.
    assert_eq!(addresses(&add(&config, "c4", "p4").ok().json())[0], "192.0.2.1/24");
}

/// Two networks on one range without distinct `network_name`s share its pool.
/// Each network's GC frees only the entries that network created, and no GC
/// frees an entry of unknown origin (as written before the network was recorded).
#[test]
fn gc_frees_only_the_calling_networks_entries() {
    let scratch = Scratch::new("gc-networks");
    let ipam = json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(), "range": "192.0.2.0/24"});
    let config = |name: &str| json!({"cniVersion": "1.1.0", "name": name, "type": "bridge", "ipam": ipam}).to_string();
    let (a, b) = (config("net-a"), config("net-b"));
    std::fs::create_dir_all(scratch.data()).unwrap();
    seed_pool(
        &scratch.data(),
        "192.0.2.0-24",
        1,
        &json!({"range": "192.0.2.0/24", "allocations": {"9": {"id": "old", "podref": "default/old", "ifname": "eth0"}}}),
    );
    add(&a, "c1", "p1").ok();
    assert_eq!(addresses(&add(&b, "c2", "p2").ok().json()), ["192.0.2.2/24"]);
    let gc = |config: &str| {
        let mut doc: Value = serde_json::from_str(config).unwrap();
        doc["cni.dev/valid-attachments"] = json!([]);
        run(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")], &doc.to_string()).ok();
        let allocations = pool_doc(&scratch.data(), "192.0.2.0-24")["allocations"].clone();
        allocations.as_object().unwrap().values().map(|e| e["id"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(gc(&a), ["c2", "old"]);
    // B's next pod gets the address A freed, not pod 2's.
    assert_eq!(addresses(&add(&b, "c3", "p3").ok().json()), ["192.0.2.1/24"]);
    assert_eq!(gc(&b), ["old"]);
}

/// `enable_overlapping_ranges` (on by default): overlapping ranges of one
/// `network_name` never hand out one address twice, on the file store as on the
/// shared stores, whether they belong to two networks or to one config. Per
/// case: each network's ipam settings, then the ADDs in order (network, the
/// addresses that pod gets).
#[test]
fn overlapping_ranges_never_share_an_address() {
    let range = |cidr: &str| json!({"range": cidr});
    type Case<'a> = (&'a str, Vec<Value>, Vec<(usize, Vec<&'a str>)>);
    let cases: Vec<Case> = vec![
        (
            "a /24 and a /28 inside it",
            vec![range("192.0.2.0/24"), range("192.0.2.0/28")],
            vec![(0, vec!["192.0.2.1/24"]), (1, vec!["192.0.2.2/28"]), (0, vec!["192.0.2.3/24"]), (1, vec!["192.0.2.4/28"])],
        ),
        (
            "both in one config",
            vec![json!({"ipRanges": [{"range": "192.0.2.0/24"}, {"range": "192.0.2.0/28"}]})],
            vec![(0, vec!["192.0.2.1/24", "192.0.2.2/28"]), (0, vec!["192.0.2.3/24", "192.0.2.4/28"])],
        ),
        (
            "a /28 further up a /24 (offsets differ)",
            vec![json!({"range": "192.0.2.0/24", "range_start": "192.0.2.17"}), range("192.0.2.16/28")],
            vec![(1, vec!["192.0.2.17/28"]), (0, vec!["192.0.2.18/24"]), (1, vec!["192.0.2.19/28"])],
        ),
        (
            "a /48 and a /49 (as a /16 and a /17)",
            vec![range("2001:db8::/48"), range("2001:db8::/49")],
            vec![(0, vec!["2001:db8::1/48"]), (1, vec!["2001:db8::2/49"]), (1, vec!["2001:db8::3/49"]), (0, vec!["2001:db8::4/48"])],
        ),
        ("IPv6 /124 and /126", vec![range("2001:db8::/124"), range("2001:db8::/126")], vec![(1, vec!["2001:db8::1/126"]), (0, vec!["2001:db8::2/124"])]),
        (
            "network_name scopes the reservations",
            vec![
                json!({"range": "192.0.2.0/24", "network_name": "blue"}),
                json!({"range": "192.0.2.0/28", "network_name": "blue"}),
                json!({"range": "192.0.2.0/28", "network_name": "red"}),
            ],
            vec![(0, vec!["192.0.2.1/24"]), (1, vec!["192.0.2.2/28"]), (2, vec!["192.0.2.1/28"])],
        ),
        (
            "switched off: whereabouts' sharing",
            vec![json!({"range": "192.0.2.0/24", "enable_overlapping_ranges": false}), json!({"range": "192.0.2.0/28", "enable_overlapping_ranges": false})],
            vec![(0, vec!["192.0.2.1/24"]), (1, vec!["192.0.2.1/28"])],
        ),
    ];
    for (i, (what, networks, adds)) in cases.into_iter().enumerate() {
        let scratch = Scratch::new(&format!("overlap-{i}"));
        let configs: Vec<String> = networks
            .into_iter()
            .enumerate()
            .map(|(n, mut ipam)| {
                ipam.as_object_mut().unwrap().extend([
                    ("type".into(), json!("thereabouts")),
                    ("datastore".into(), json!("file")),
                    ("data_dir".into(), json!(scratch.data())),
                ]);
                json!({"cniVersion": "1.0.0", "name": format!("net-{n}"), "type": "bridge", "ipam": ipam}).to_string()
            })
            .collect();
        for (pod, (network, expected)) in adds.into_iter().enumerate() {
            assert_eq!(addresses(&add(&configs[network], &format!("c{pod}"), &format!("p{pod}")).ok().json()), expected, "{what}: pod {pod}");
        }
    }
}

#[test]
fn status_reports_exhaustion_and_an_unusable_datastore() {
    let scratch = Scratch::new("status");
    let status_env = [("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/opt/cni/bin")];
    let small = net("1.1.0", json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(), "range": "192.0.2.0/30"}));
    run(&status_env, &small).ok();
    add(&small, "c1", "p1").ok();
    run(&status_env, &small).ok();
    add(&small, "c2", "p2").ok();
    assert!(run(&status_env, &small).error(50).contains("192.0.2.0/30"));
    assert!(add(&small, "c3", "p3").error(999).contains("Could not allocate IP in range"));

    std::fs::write(scratch.path("a-file"), b"x").unwrap();
    let broken = net("1.1.0", json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.path("a-file"), "range": "192.0.2.0/24"}));
    assert!(run(&status_env, &broken).error(50).contains("datastore unusable"));
}

#[test]
fn status_names_the_range_that_ran_out() {
    let scratch = Scratch::new("status-second");
    let status_env = [("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/opt/cni/bin")];
    let two = net(
        "1.1.0",
        json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(), "ipRanges": [{"range": "198.51.100.0/24"}, {"range": "192.0.2.0/30"}]}),
    );
    add(&two, "c1", "p1").ok();
    add(&two, "c2", "p2").ok();
    let message = run(&status_env, &two).error(50);
    assert!(message.contains("192.0.2.0/30") && !message.contains("198.51.100.0/24"), "{message}");
}

#[test]
fn multi_range_add_is_all_or_nothing() {
    let scratch = Scratch::new("all-or-nothing");
    let config = net(
        "1.0.0",
        json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(),
               "ipRanges": [{"range": "192.0.2.0/24"}, {"range": "198.51.100.0/30"}]}),
    );
    add(&config, "c1", "p1").ok();
    add(&config, "c2", "p2").ok();
    let before = snapshot(&scratch.data());
    let msg = add(&config, "c3", "p3").error(999);
    assert!(msg.contains("198.51.100.0/30"), "{msg}");
    assert_eq!(snapshot(&scratch.data()), before, "the first range must not keep a partial allocation");
    // Once the second range has room again, both are allocated together.
    del(&config, "c1").ok();
    assert_eq!(addresses(&add(&config, "c3", "p3").ok().json()), ["192.0.2.1/24", "198.51.100.1/30"]);
}

#[test]
fn first_available_adds_from_one_range_and_dels_and_checks_cleanly() {
    let scratch = Scratch::new("first-available");
    let config = net(
        "1.0.0",
        json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(), "ipRangesAllocation": "first_available",
               "ipRanges": [{"range": "192.0.2.0/30"}, {"range": "198.51.100.0/24"}]}),
    );
    let second_pool = scratch.data().join("198.51.100.0-24.pool");
    assert_eq!(addresses(&add(&config, "c1", "p1").ok().json()), ["192.0.2.1/30"]);
    assert_eq!(addresses(&add(&config, "c2", "p2").ok().json()), ["192.0.2.2/30"]);
    assert!(!second_pool.exists(), "an ADD served by the first range writes only its pool");
    // DEL of an attachment with no entry (no pool, even) in the second range.
    del(&config, "c2").ok();
    assert_eq!(pool_doc(&scratch.data(), "192.0.2.0-30")["allocations"].as_object().unwrap().len(), 1);
    assert_eq!(addresses(&add(&config, "c2", "p2").ok().json()), ["192.0.2.2/30"]);
    // The first range is full: the next one serves.
    let third = add(&config, "c3", "p3").ok().json();
    assert_eq!(addresses(&third), ["198.51.100.1/24"]);
    let mut with_prev: Value = serde_json::from_str(&config).unwrap();
    with_prev["prevResult"] = third;
    run(&cni_env("CHECK", "c3", &pod("p3")), &with_prev.to_string()).ok();
    // A repeated ADD keeps the pod where it is, though the first range has room again.
    del(&config, "c1").ok();
    assert_eq!(addresses(&add(&config, "c3", "p3").ok().json()), ["198.51.100.1/24"]);
    del(&config, "c3").ok();
    assert!(pool_doc(&scratch.data(), "198.51.100.0-24")["allocations"].as_object().unwrap().is_empty());
    assert_eq!(addresses(&add(&config, "c4", "p4").ok().json()), ["192.0.2.1/30"]);
}

#[test]
fn installed_as_whereabouts_with_whereabouts_type() {
    let scratch = Scratch::new("whereabouts-name");
    let alias = scratch.path("whereabouts");
    std::os::unix::fs::symlink(binary(), &alias).unwrap();
    let config =
        net("0.3.1", json!({"type": "whereabouts", "datastore": "file", "data_dir": scratch.data(), "range": "192.0.2.0/24", "exclude": ["192.0.2.0/30"]}));
    let result = run_with(&alias, &cni_env("ADD", "c1", &pod("p1")), &config).ok().json();
    assert_eq!(result["ips"], json!([{"version": "4", "address": "192.0.2.4/24"}]));
    run_with(&alias, &cni_env("DEL", "c1", ""), &config).ok();
    let version = run_with(&alias, &[("CNI_COMMAND", "VERSION")], "").ok().json();
    assert_eq!(version["supportedVersions"], json!(VERSIONS));
}

#[test]
fn conflists_static_addresses_dns_and_requested_ips() {
    let scratch = Scratch::new("extras");
    let conflist = json!({
        "cniVersion": "1.0.0", "name": "listnet",
        "plugins": [
            {"type": "bridge", "bridge": "br0",
             "runtimeConfig": {"ips": ["192.0.2.50"]},
             "ipam": {"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(),
                      "ipRanges": [{"range": "192.0.2.0/24"}],
                      "addresses": [{"address": "203.0.113.9/24", "gateway": "203.0.113.1"}],
                      "dns": {"nameservers": ["192.0.2.53"], "search": ["example.test"]}}},
            {"type": "portmap"}
        ]
    })
    .to_string();
    let result = add(&conflist, "c1", "p1").ok().json();
    assert_eq!(result["ips"], json!([{"address": "192.0.2.50/24"}, {"address": "203.0.113.9/24", "gateway": "203.0.113.1"}]));
    assert_eq!(result["dns"], json!({"nameservers": ["192.0.2.53"], "search": ["example.test"]}));
    // CNI_ARGS IP= adds a static address after the configured ones.
    let plain = dual_stack("1.0.0", &scratch.data());
    let result = run(&cni_env("ADD", "c2", "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p2;IP=203.0.113.20/24"), &plain).ok().json();
    assert_eq!(addresses(&result), ["192.0.2.1/24", "2001:db8::1/64", "203.0.113.20/24"]);
}

#[test]
fn a_configured_gateway_is_never_handed_out() {
    let scratch = Scratch::new("gateway");
    let per_range = net(
        "1.0.0",
        json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.path("a"),
        "ipRanges": [{"range": "192.0.2.0/29", "gateway": "192.0.2.1"}]}),
    );
    let top_level = net(
        "1.0.0",
        json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.path("b"),
        "gateway": "192.0.2.1", "range": "192.0.2.0/29"}),
    );
    for config in [per_range, top_level] {
        let result = add(&config, "c1", "p1").ok().json();
        assert_eq!(result["ips"], json!([{"address": "192.0.2.2/29", "gateway": "192.0.2.1"}]), "{config}");
    }
}

#[test]
fn routes_are_printed_in_go_canonical_form() {
    let scratch = Scratch::new("routes");
    let config = net(
        "1.0.0",
        json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(),
        "ipRanges": [{"range": "192.0.2.0/24"}, {"range": "2001:db8::/64"}],
        "routes": [{"dst": "3ffe:ffff:0:01ff::1/64", "gw": "2001:DB8::0001", "comment": "dropped"},
                   {"dst": "198.51.100.0/24", "gw": "::ffff:192.0.2.254", "mtu": 1400, "table": 0}]}),
    );
    let result = add(&config, "c1", "p1").ok().json();
    assert_eq!(
        result["routes"],
        json!([{"dst": "3ffe:ffff:0:1ff::1/64", "gw": "2001:db8::1"},
                                        {"dst": "198.51.100.0/24", "gw": "192.0.2.254", "mtu": 1400, "table": 0}])
    );
}

#[test]
fn flat_file_is_optional_but_used_when_present() {
    let scratch = Scratch::new("flat");
    let flat = scratch.path("flat.conf");
    std::fs::write(&flat, json!({"datastore": "file", "data_dir": scratch.data(), "range": "198.51.100.0/24"}).to_string()).unwrap();
    let config = net("1.0.0", json!({"type": "whereabouts", "configuration_path": flat}));
    assert_eq!(addresses(&add(&config, "c1", "p1").ok().json()), ["198.51.100.1/24"]);
    // A directory is searched for whereabouts.conf, then thereabouts.conf.
    std::fs::create_dir_all(scratch.path("dir")).unwrap();
    std::fs::copy(&flat, scratch.path("dir/thereabouts.conf")).unwrap();
    let config = net("1.0.0", json!({"type": "whereabouts", "configuration_path": scratch.path("dir")}));
    assert_eq!(addresses(&add(&config, "c2", "p2").ok().json()), ["198.51.100.2/24"]);
    // Found but unreadable: code 7 naming the path.
    std::fs::create_dir_all(scratch.path("bad/whereabouts.conf")).unwrap();
    let config = net("1.0.0", json!({"type": "whereabouts", "configuration_path": scratch.path("bad")}));
    assert!(add(&config, "c3", "p3").error(7).contains("bad/whereabouts.conf"));
}

/// A relative `log_file` would be created wherever the runtime runs the
/// plugin: it is ignored (logging goes to stderr), and the ADD is served.
#[test]
fn a_relative_log_file_is_ignored_and_nothing_lands_in_the_working_directory() {
    let scratch = Scratch::new("relative-log");
    let cwd = scratch.path("runtime-cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let config =
        net("1.0.0", json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(), "range": "192.0.2.0/24", "log_file": "192.0.2.300"}));
    let mut child = Command::new(binary())
        .env_clear()
        .envs(cni_env("ADD", "c1", &pod("p1")))
        .current_dir(&cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(config.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stderr).contains("log_file \"192.0.2.300\""), "one line says why");
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0, "the runtime's working directory is left alone");
}

#[test]
fn log_file_and_level_are_honoured_and_stdout_stays_clean() {
    let scratch = Scratch::new("logging");
    let log = scratch.path("plugin.log");
    let config = net(
        "1.0.0",
        json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(), "range": "192.0.2.0/24", "log_file": log, "log_level": "debug"}),
    );
    add(&config, "c1", "p1").ok().json();
    del(&config, "c1").ok();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("[debug] ADD container=c1") && text.contains("[verbose] DEL c1/eth0"), "{text}");
}

#[test]
fn concurrent_adds_never_share_an_address() {
    let scratch = Scratch::new("concurrent");
    let config = dual_stack("1.0.0", &scratch.data());
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let config = config.clone();
            std::thread::spawn(move || addresses(&add(&config, &format!("c{i}"), &format!("p{i}")).ok().json()))
        })
        .collect();
    let mut all: Vec<String> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let count = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), count);
    assert_eq!(pool_doc(&scratch.data(), "192.0.2.0-24")["allocations"].as_object().unwrap().len(), 8);
}

/// Node slices live in NodeSlicePools: on the file datastore, and with a size
/// that does not fit, `node_slice_size` is a config error naming it, and nothing is written.
#[test]
fn node_slice_size_off_kubernetes_or_misfit_is_a_config_error() {
    let scratch = Scratch::new("slices-file");
    let conf = |size: &str| {
        net("1.0.0", json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(), "range": "192.0.2.0/24", "node_slice_size": size}))
    };
    for (size, needle) in [("/26", "node_slice_size needs the kubernetes datastore"), ("/31", "ipam.node_slice_size")] {
        let mut env = cni_env("ADD", "c1", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p1");
        env.push(("NODENAME", "node-a"));
        let msg = run(&env, &conf(size)).error(7);
        assert!(msg.contains(needle), "{size}: {msg:?}");
    }
    assert!(snapshot(&scratch.data()).is_empty());
}

/// Bad input: the right code, a non-zero exit, and the datastore untouched.
#[test]
fn bad_input_fails_cleanly_without_touching_the_datastore() {
    let scratch = Scratch::new("bad-input");
    let good = dual_stack("1.0.0", &scratch.data());
    add(&good, "c1", "p1").ok();
    let before = snapshot(&scratch.data());
    assert!(!before.is_empty());
    let ipam = |extra: Value| {
        let mut ipam = json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(), "range": "192.0.2.0/24"});
        for (k, v) in extra.as_object().unwrap() {
            ipam[k] = v.clone();
        }
        ipam
    };
    std::fs::write(scratch.path("a-file"), b"not a directory").unwrap();
    let bad_configs: Vec<(String, u64, &str)> = vec![
        ("{not json".into(), 6, "JSON"),
        ("[1,2]".into(), 6, "JSON object"),
        (net("0.9.0", ipam(json!({}))), 1, "incompatible CNI versions"),
        (net("1.0.0", ipam(json!({"range": "192.0.2.0/33"}))), 7, "ipam.range"),
        (net("1.0.0", ipam(json!({"range": "not-a-cidr"}))), 7, "ipam.range"),
        (net("1.0.0", ipam(json!({"routes": [{"dst": "0.0.0.0/0", "gw": "192.0.2.001"}]}))), 7, "ipam.routes[0].gw"),
        (net("1.0.0", json!({"type": "host-local", "subnet": "192.0.2.0/24"})), 7, "IPAM type"),
        (net("1.0.0", json!({"type": "thereabouts", "range": "192.0.2.0/24"})), 7, "ipam.datastore is not set"),
        (
            net("1.0.0", json!({"type": "thereabouts", "range": "192.0.2.0/24", "kubernetes": {"kubeconfig": "/etc/kc"}})),
            7,
            "kubeconfig /etc/kc is unusable: cannot read it",
        ),
        (net("1.0.0", ipam(json!({"datastore": "etcd"}))), 7, "needs \"etcd_host\""),
        (
            net("1.0.0", ipam(json!({"datastore": "etcd", "etcd_host": "127.0.0.1:2379", "etcd_ca_cert_file": "/nonexistent/ca.pem"}))),
            7,
            "etcd_ca_cert_file /nonexistent/ca.pem",
        ),
        (net("1.0.0", ipam(json!({"data_dir": scratch.path("a-file")}))), 7, "not a directory"),
        (net("1.0.0", ipam(json!({"data_dir": scratch.path("a-file/sub")}))), 7, "not a directory"),
        (net("1.0.0", ipam(json!({"data_dir": "relative/data"}))), 7, "ipam.data_dir: path \"relative/data\" is not absolute"),
        (net("1.0.0", ipam(json!({"configuration_path": "whereabouts.d"}))), 7, "ipam.configuration_path: path \"whereabouts.d\" is not absolute"),
        (net("1.0.0", ipam(json!({"kubernetes": {"kubeconfig": "kc"}, "datastore": "kubernetes"}))), 7, "ipam.kubernetes.kubeconfig: path \"kc\""),
        (
            net("1.0.0", ipam(json!({"datastore": "etcd", "etcd_host": "127.0.0.1:2379", "etcd_key_file": "certs/key.pem"}))),
            7,
            "ipam.etcd_key_file: path \"certs/key.pem\" is not absolute",
        ),
        (net("1.0.0", ipam(json!({"policies": [{"name": "p", "path": "p.wasm"}]}))), 7, "ipam.policies[0].path"),
        (json!({"cniVersion": "1.0.0", "type": "bridge", "ipam": ipam(json!({}))}).to_string(), 7, "name"),
        (json!({"cniVersion": "1.0.0", "name": "n", "type": "bridge"}).to_string(), 7, "ipam"),
    ];
    for (stdin, code, needle) in &bad_configs {
        for command in ["ADD", "DEL"] {
            let out = run(&cni_env(command, "c9", &pod("p9")), stdin);
            let msg = out.error(*code);
            assert!(msg.contains(needle), "{command} {stdin}: {msg:?} lacks {needle:?}");
            assert_eq!(snapshot(&scratch.data()), before, "{command} {stdin} changed the datastore");
        }
    }
    // Environment problems.
    let msg = run(&[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "c9")], &good).error(4);
    assert_eq!(msg, "required env variables [CNI_NETNS,CNI_IFNAME,CNI_PATH] missing");
    assert_eq!(run(&[("CNI_COMMAND", "BOGUS")], &good).error(4), "unknown CNI_COMMAND: BOGUS");
    let pod9 = pod("p9");
    let mut bad_ifname = cni_env("ADD", "c9", &pod9);
    bad_ifname[3] = ("CNI_IFNAME", "eth0:1");
    run(&bad_ifname, &good).error(4);
    assert_eq!(run(&cni_env("ADD", "-bad-id", &pod("p9")), &good).error(4), "invalid characters in containerID");
    assert!(run(&cni_env("ADD", "c9", "K8S_POD_NAME=x;FOO=bar"), &good).error(4).contains("FOO"));
    // Unsupported version on CHECK/GC paths, and errors carry the config's version.
    let out = run(&cni_env("ADD", "c9", &pod("p9")), &net("1.0.0", ipam(json!({"range": "192.0.2.0/33"}))));
    assert_eq!(out.json()["cniVersion"], "1.0.0");
    assert_eq!(snapshot(&scratch.data()), before);
}

#[test]
fn cli_preview_pools_and_engine_component() {
    let scratch = Scratch::new("cli");
    let config_path = scratch.path("net.conflist");
    let conflist = json!({"cniVersion": "1.0.0", "name": "clinet", "plugins": [{"type": "bridge", "ipam": {
        "type": "thereabouts", "datastore": "file", "data_dir": scratch.data(),
        "ipRanges": [{"range": "192.0.2.0/30"}, {"range": "2001:db8::/64", "gateway": "2001:db8::ffff"}]}}]});
    std::fs::write(&config_path, conflist.to_string()).unwrap();
    let cli = |args: &[&str]| Command::new(binary()).env_clear().args(args).output().unwrap();

    let out = cli(&["preview", "--config", config_path.to_str().unwrap(), "--pods", "3", "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["ranges"][0],
        json!({"cidr": "192.0.2.0/30", "first": "192.0.2.1", "last": "192.0.2.2", "usable": "2", "pool_name": "192.0.2.0-30", "gateway": null})
    );
    assert_eq!(report["ranges"][1]["gateway"], "2001:db8::ffff");
    assert_eq!(report["pods"][0], json!({"pod": 1, "addresses": ["192.0.2.1/30", "2001:db8::1/64"]}));
    // Pod 3's ADD would fail (the /30 is full) and store nothing: no address at all.
    assert_eq!(report["pods"][2], json!({"pod": 3, "addresses": [null, null]}));
    assert!(!scratch.data().exists(), "preview writes nothing");

    let stdin = serde_json::to_string(&conflist).unwrap();
    add(&stdin, "c1", "p1").ok();
    let out = cli(&["pools", "--config", config_path.to_str().unwrap(), "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pools: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(pools["ranges"][0]["allocated"], "1");
    assert_eq!(pools["ranges"][0]["free"], "1");
    let table = String::from_utf8(cli(&["pools", "--config", config_path.to_str().unwrap()]).stdout).unwrap();
    assert!(table.contains("192.0.2.0-30") && table.contains("FREE"), "{table}");
    let preview_from_store = cli(&["preview", "--config", config_path.to_str().unwrap(), "--from-datastore", "--output", "json"]);
    let report: Value = serde_json::from_slice(&preview_from_store.stdout).unwrap();
    assert_eq!(report["pods"][0]["addresses"][0], "192.0.2.2/30");

    let wasm = scratch.path("engine.wasm");
    assert!(cli(&["engine-component", "--out", wasm.to_str().unwrap()]).status.success());
    assert_eq!(&std::fs::read(&wasm).unwrap()[..4], b"\0asm");

    let out = cli(&["--version"]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("thereabouts "));
    let out = cli(&["preview", "--config", scratch.path("missing.conf").to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("missing.conf"));
}

/// `preview --from-objects`: the next pods of a cluster from its objects as
/// `kubectl get ... -o json` prints them, read by the engine's `cluster-pools`
/// (pods' entries, a claim's entry and another network's reservation taken).
#[test]
fn cli_preview_from_a_clusters_objects() {
    let scratch = Scratch::new("cli-objects");
    let config_path = scratch.path("net.conf");
    let config = net("1.0.0", json!({"type": "whereabouts", "range": "192.0.2.0/28", "network_name": "blue"}));
    std::fs::write(&config_path, config).unwrap();
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool", "metadata": {"name": "blue-192.0.2.0-28", "namespace": "kube-system"},
         "spec": {"range": "192.0.2.0/28", "allocations": {
            "1": {"id": "c1", "podref": "ns/a", "ifname": "net1"},
            "2": {"id": "c2", "podref": "ns/virt-launcher-vm", "ifname": "net1", "ipamclaimref": "ns/vm.blue"}}}},
        {"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "OverlappingRangeIPReservation",
         "metadata": {"name": "blue-192.0.2.3", "namespace": "kube-system"}, "spec": {"podref": "ns/racer", "ifname": "net1"}},
        {"apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim", "metadata": {"name": "vm.blue", "namespace": "ns"}, "spec": {"network": "blue", "interface": "net1"}}]});
    let objects_path = scratch.path("cluster.json");
    std::fs::write(&objects_path, objects.to_string()).unwrap();
    let cli = |args: &[&str]| Command::new(binary()).env_clear().args(args).output().unwrap();
    let (config, file) = (config_path.to_str().unwrap(), objects_path.to_str().unwrap());

    let out = cli(&["preview", "--config", config, "--from-objects", file, "--pods", "2", "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pods"], json!([{"pod": 1, "addresses": ["192.0.2.4/28"]}, {"pod": 2, "addresses": ["192.0.2.5/28"]}]));
    let table = cli(&["preview", "--config", config, "--from-objects", file]);
    let stderr = String::from_utf8_lossy(&table.stderr);
    assert!(stderr.contains("2 entries (1 owned by a claim), 1 other reservations, 1 IPAMClaims"), "{stderr}");

    // A dump that is not one names what is wrong, and where.
    std::fs::write(&objects_path, r#"{"kind": "List", "items": [{"kind": "IPPool", "metadata": {"name": "blue-192.0.2.0-28"}, "spec": {"allocations": []}}]}"#)
        .unwrap();
    let out = cli(&["preview", "--config", config, "--from-objects", file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("spec.allocations is not an object") && stderr.contains("cluster.json"), "{stderr}");
    let out = cli(&["preview", "--config", config, "--from-objects", file, "--from-datastore"]);
    assert!(!out.status.success(), "one start only");
}

/// Every CLI verb that reads a config says what is wrong with it once: the
/// error's causes are not printed again after its own message.
#[test]
fn cli_config_errors_read_once() {
    let scratch = Scratch::new("cli-errors");
    let config_path = scratch.path("bad.conf");
    let bad = net(
        "1.0.0",
        json!({"type": "thereabouts", "datastore": "file", "data_dir": scratch.data(), "ipRanges": [{"range": "192.0.2.0/24", "exclude": ["bogus"]}]}),
    );
    std::fs::write(&config_path, bad).unwrap();
    let config = config_path.to_str().unwrap();
    for args in [
        &["preview", "--config", config][..],
        &["pools", "--config", config],
        &["reconcile", "--dry-run", "--config", config],
        &["release", "--pod", "ns/p", "--config", config],
        &["policy", "run", "--config", config],
    ] {
        let out = Command::new(binary()).env_clear().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        let field = "ipam.ipRanges[0].exclude[0]";
        assert_eq!(stderr.matches(field).count(), 1, "{args:?} names {field} once: {stderr}");
        assert!(stderr.contains("bad.conf") && stderr.contains("\"bogus\""), "{args:?}: {stderr}");
    }
}

/// The shipped examples stay valid: each previews, and ADD/DEL work on it with
/// its data_dir moved to a scratch directory. They use documentation ranges only.
#[test]
fn examples_are_valid_configs() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&examples).unwrap().flatten() {
        let path = entry.path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !(name.ends_with(".conf") || name.ends_with(".conflist")) {
            continue;
        }
        seen += 1;
        let scratch = Scratch::new(&format!("example-{name}"));
        let text = std::fs::read_to_string(&path).unwrap().replace("/var/lib/cni/thereabouts", scratch.data().to_str().unwrap());
        let out = Command::new(binary()).env_clear().args(["preview", "--config", path.to_str().unwrap(), "--output", "json"]).output().unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        for range in report["ranges"].as_array().unwrap() {
            let cidr = range["cidr"].as_str().unwrap();
            assert!(
                ["192.0.2.", "198.51.100.", "203.0.113.", "2001:db8:"].iter().any(|p| cidr.starts_with(p)),
                "{name} uses {cidr}, not a documentation range"
            );
        }
        let result = add(&text, "c1", "p1").ok().json();
        let expected: Vec<Value> = report["pods"][0]["addresses"].as_array().unwrap().clone();
        let got: Vec<Value> = match result.get("ips") {
            Some(ips) => ips.as_array().unwrap().iter().map(|ip| ip["address"].clone()).collect(),
            None => vec![result["ip4"]["ip"].clone()],
        };
        assert_eq!(got, expected, "{name}: ADD hands out what preview announced");
        del(&text, "c1").ok();
    }
    assert!(seen >= 4, "examples/ lost its configs");
}

/// The file store's one crash window: a kill between the slot writes of a two-pool
/// commit leaves only the first pool updated. The retried ADD reuses that entry
/// and completes the other pool; DEL would release it just the same.
#[test]
fn a_partial_commit_is_repaired_by_the_next_add_or_del() {
    let scratch = Scratch::new("partial");
    let config = dual_stack("1.0.0", &scratch.data());
    std::fs::create_dir_all(scratch.data()).unwrap();
    let partial = json!({"range": "192.0.2.0/24", "allocations": {"1": {"id": "c1", "podref": "default/p1", "ifname": "eth0"}}});
    seed_pool(&scratch.data(), "192.0.2.0-24", 1, &partial);
    assert_eq!(addresses(&add(&config, "c1", "p1").ok().json()), ["192.0.2.1/24", "2001:db8::1/64"]);
    assert_eq!(pool_doc(&scratch.data(), "2001-db8---64")["allocations"]["1"]["id"], "c1");
    assert_eq!(pool_doc(&scratch.data(), "192.0.2.0-24")["allocations"].as_object().unwrap().len(), 1);

    seed_pool(
        &scratch.data(),
        "192.0.2.0-24",
        9,
        &json!({"range": "192.0.2.0/24", "allocations": {"5": {"id": "c2", "podref": "default/p2", "ifname": "eth0"}}}),
    );
    del(&config, "c2").ok();
    assert_eq!(pool_doc(&scratch.data(), "192.0.2.0-24")["allocations"], json!({}));
}
