//! Policy extensions through the CNI protocol, on the file datastore: the
//! shipped plugin runs the example policies (policies/, built and compiled
//! by the project's own tools into a root-owned cache made for the test), and
//! the hostile fixtures, which must be stopped with the pool byte-for-byte
//! unchanged and the next call answered normally.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, Outcome, TempDir, built_policy, compile_policy, thereabouts_bin, thereabouts_conf};

/// A test's directory: the pools, and a root-owned cache holding `policies`
/// compiled by `thereabouts policy compile`.
struct Setup {
    dir: TempDir,
}

impl Setup {
    fn new(tag: &str, policies: &[&str]) -> Setup {
        let s = Setup { dir: TempDir::new(tag) };
        for name in policies {
            compile_policy(&policy(name), &s.cache());
        }
        s
    }

    fn cache(&self) -> PathBuf {
        self.dir.sub("cache")
    }

    /// A dual-stack config with `policies`.
    fn conf(&self, policies: Value) -> String {
        let mut conf = thereabouts_conf("1.1.0", "blue", &self.dir.sub("data"), None, &["192.0.2.0/24", "2001:db8::/64"]);
        conf["ipam"]["policies"] = policies;
        conf.to_string()
    }

    fn run(&self, command: &str, pod: &str, cid: &str, conf: &str) -> Outcome {
        let mut call = Call::pod(command, cid, pod);
        call.ifname = "net1".into();
        Invocation::new(call, conf).env("THEREABOUTS_POLICY_CACHE", self.cache().to_str().unwrap()).run(&thereabouts_bin())
    }

    fn add(&self, pod: &str, cid: &str, conf: &str) -> Vec<String> {
        let out = self.run("ADD", pod, cid, conf);
        out.expect_ok(&format!("ADD {pod}"));
        out.ips()
    }

    /// Every file of the datastore, by name, as bytes.
    fn pools(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(self.dir.sub("data")).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        files.sort();
        files.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
    }
}

fn policy(name: &str) -> PathBuf {
    built_policy(name)
}

fn entry(name: &str, policy_name: &str, settings: Value) -> Value {
    json!({"name": name, "path": policy(policy_name), "settings": settings})
}

#[test]
fn a_statefulset_pod_keeps_its_address_across_del_and_re_create() {
    let s = Setup::new("policy-sticky", &["sticky-ordinal"]);
    let conf = s.conf(json!([entry("sticky", "sticky-ordinal", json!({"base": 10}))]));
    assert_eq!(s.add("web-3", "c1", &conf), ["192.0.2.14/24", "2001:db8::e/64"], "first + base + ordinal");
    assert_eq!(s.add("other", "c2", &conf), ["192.0.2.1/24", "2001:db8::1/64"], "no ordinal: the built-in choice");
    s.run("DEL", "web-3", "c1", &conf).expect_ok("DEL web-3");
    assert_eq!(s.add("web-3", "c3", &conf), ["192.0.2.14/24", "2001:db8::e/64"], "re-created under its name, new container");
}

#[test]
fn a_namespace_gets_its_ranges_only() {
    let s = Setup::new("policy-namespace", &["namespace-ranges"]);
    let conf = s.conf(json!([entry("ns", "namespace-ranges", json!({"namespaces": {"team-a": [1]}}))]));
    // Call::pod puts pods in `default`; the policy reads CNI_ARGS' namespace.
    let mut call = Call::pod("ADD", "c1", "db-0");
    call.ifname = "net1".into();
    call.cni_args = call.cni_args.replace("K8S_POD_NAMESPACE=default", "K8S_POD_NAMESPACE=team-a");
    let out = Invocation::new(call, conf.as_str()).env("THEREABOUTS_POLICY_CACHE", s.cache().to_str().unwrap()).run(&thereabouts_bin());
    out.expect_ok("ADD in team-a");
    assert_eq!(out.ips(), ["2001:db8::1/64"]);
    assert_eq!(s.add("web-0", "c2", &conf), ["192.0.2.1/24", "2001:db8::2/64"], "another namespace: every range");
}

#[test]
fn deny_listed_addresses_are_kept_for_something_else() {
    let s = Setup::new("policy-keep", &["keep-addresses"]);
    let conf = s.conf(json!([entry("keep", "keep-addresses", json!({"deny": ["192.0.2.1", "192.0.2.2/31", "2001:db8::1"]}))]));
    assert_eq!(s.add("p1", "c1", &conf), ["192.0.2.4/24", "2001:db8::2/64"]);
}

/// `thereabouts preview` with policies, as JSON (nothing is written).
fn preview(s: &Setup, conf: &str, args: &[&str]) -> Value {
    let file = s.dir.path().join("net.conf");
    std::fs::write(&file, conf).unwrap();
    let out = std::process::Command::new(thereabouts_bin())
        .args(["preview", "--output", "json", "--config", file.to_str().unwrap()])
        .args(args)
        .env("THEREABOUTS_POLICY_CACHE", s.cache())
        .output()
        .unwrap();
    assert!(out.status.success(), "preview: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn preview_plans_pod_after_pod_with_the_policies_and_says_what_they_refused() {
    let s = Setup::new("policy-preview", &["sticky-ordinal", "keep-addresses"]);
    let conf = s.conf(json!([
        entry("sticky", "sticky-ordinal", json!({"base": 1, "statefulsets": ["db"]})),
        entry("keep", "keep-addresses", json!({"deny": ["192.0.2.1"]})),
    ]));
    let report = preview(&s, &conf, &["--pods", "3", "--pod-prefix", "web-"]);
    let pods = report["pods"].as_array().unwrap();
    let addresses: Vec<&Value> = pods.iter().map(|p| &p["addresses"]).collect();
    assert_eq!(addresses, [&json!(["192.0.2.2/24", "2001:db8::1/64"]), &json!(["192.0.2.3/24", "2001:db8::2/64"]), &json!(["192.0.2.4/24", "2001:db8::3/64"])]);
    assert_eq!(pods[0]["name"], "default/web-0");
    assert_eq!(pods[0]["refused"], json!([{"range": 0, "address": "192.0.2.1", "policy": "keep", "reason": "deny-listed by settings"}]));
    assert_eq!(pods[0]["failure"], Value::Null);
    // The StatefulSet the sticky policy serves: db-N at first + base + N.
    let report = preview(&s, &conf, &["--pods", "2", "--pod-prefix", "db-"]);
    let addresses: Vec<&Value> = report["pods"].as_array().unwrap().iter().map(|p| &p["addresses"]).collect();
    assert_eq!(addresses, [&json!(["192.0.2.2/24", "2001:db8::2/64"]), &json!(["192.0.2.3/24", "2001:db8::3/64"])]);
    assert!(std::fs::read_dir(s.dir.sub("data")).map_or(true, |mut d| d.next().is_none()), "preview writes nothing");
}

#[test]
fn a_preview_pod_a_policy_vetoes_fails_alone() {
    let s = Setup::new("policy-preview-veto", &["keep-addresses"]);
    // 192.0.2.0/30 hands out .1 and .2; only .2 has an even offset.
    let mut conf = thereabouts_conf("1.1.0", "blue", &s.dir.sub("data"), None, &["192.0.2.0/30"]);
    conf["ipam"]["policies"] = json!([entry("keep", "keep-addresses", json!({"deny": [], "only_even": true}))]);
    let report = preview(&s, &conf.to_string(), &["--pods", "3"]);
    let pods = report["pods"].as_array().unwrap();
    assert_eq!(pods[0]["addresses"], json!(["192.0.2.2/30"]));
    assert_eq!(pods[1]["addresses"], json!([null]));
    assert!(pods[1]["failure"].as_str().is_some_and(|f| f.contains("keep") && f.contains("only_even")), "{}", pods[1]);
    assert!(pods[2]["failure"].is_string(), "a later pod is planned too");
}

/// The hostile fixture on `hook` doing `what`, with a 50 ms deadline.
fn hostile(hook: &str, what: &str, extra: Value) -> Value {
    let mut settings = json!({"hook": hook, "do": what});
    if let Some(address) = extra.get("address") {
        settings["address"] = address.clone();
    }
    json!([{"name": "hostile", "path": policy("hostile-fixtures"), "settings": settings, "timeout_ms": 50}])
}

/// The ADD fails with a CNI error naming the policy, the hook and `why`; the
/// pool is byte-for-byte as before, and the next ADD is served normally.
fn refused_cleanly(s: &Setup, conf: &str, hook: &str, why: &str) -> Duration {
    let plain = s.conf(json!([]));
    s.add("before", "c0", &plain);
    let before = s.pools();
    let started = Instant::now();
    let out = s.run("ADD", "victim", "c1", conf);
    let took = started.elapsed();
    let error = out.expect_cni_error("ADD with a hostile policy");
    let msg = error["msg"].as_str().unwrap_or_default();
    assert!(msg.contains("\"hostile\"") && msg.contains(hook) && msg.contains(why), "{msg}");
    assert_eq!(s.pools(), before, "the pool changed");
    assert_eq!(s.add("after", "c2", &plain), ["192.0.2.2/24", "2001:db8::2/64"], "the next call");
    took
}

/// A no-policy ADD's time on this machine now, the fastest of three.
fn baseline(s: &Setup) -> Duration {
    let plain = s.conf(json!([]));
    (0..3)
        .map(|i| {
            let t = Instant::now();
            s.add(&format!("baseline-{i}"), &format!("b{i}"), &plain);
            let took = t.elapsed();
            s.run("DEL", &format!("baseline-{i}"), &format!("b{i}"), &plain).expect_ok("DEL");
            took
        })
        .min()
        .unwrap()
}

#[test]
fn an_infinite_loop_is_stopped_within_its_deadline_plus_50_ms() {
    let s = Setup::new("policy-loop", &["hostile-fixtures"]);
    let base = baseline(&s);
    let conf = s.conf(hostile("pick-address", "loop", json!({})));
    let over = (0..3).map(|_| refused_cleanly(&s, &conf, "pick-address", "timed out after 50 ms").saturating_sub(base)).min().unwrap();
    eprintln!("hostile loop: the ADD ended {} ms after a plain one would have (deadline 50 ms)", over.as_millis());
    assert!(over <= Duration::from_millis(100), "stopped {} ms after the call started", over.as_millis());
}

#[test]
fn an_attachments_hooks_share_one_instance_and_the_next_attachment_gets_a_fresh_one() {
    // The probe counts the calls its instance answered and the pods it was
    // asked about, and says so in a refusal's reason (pick-address).
    let s = Setup::new("policy-instances", &["hostile-fixtures"]);
    let mut conf: Value = serde_json::from_str(&s.conf(hostile("pick-address", "count-calls", json!({})))).unwrap();
    let log = s.dir.path().join("plugin.log");
    conf["ipam"]["log_file"] = json!(log);
    conf["ipam"]["log_level"] = json!("debug");
    let conf = conf.to_string();
    // validate-settings runs alone (or is remembered); then select-ranges is
    // call 1, and the two ranges' pick-address calls 2 and 3 of one instance.
    let expected = |pod: &str| [format!("call 2 of this instance, pods {pod}"), format!("call 3 of this instance, pods {pod}")];
    for pod in ["web-0", "web-1"] {
        s.add(pod, &format!("c-{pod}"), &conf);
        let text = std::fs::read_to_string(&log).unwrap();
        for reason in expected(pod) {
            assert!(text.contains(&reason), "ADD {pod}: {reason:?} not logged:\n{text}");
        }
    }
    // preview: one process, pod after pod; each pod's hooks in one instance,
    // never one another pod's.
    let report = preview(&s, &conf, &["--pods", "3", "--pod-prefix", "db-"]);
    for (i, pod) in report["pods"].as_array().unwrap().iter().enumerate() {
        let reasons: Vec<&str> = pod["refused"].as_array().unwrap().iter().map(|r| r["reason"].as_str().unwrap()).collect();
        assert_eq!(reasons, expected(&format!("db-{i}")), "{pod}");
    }
}

#[test]
fn a_memory_bomb_deep_recursion_a_trap_and_a_huge_output_are_stopped() {
    let s = Setup::new("policy-hostile", &["hostile-fixtures"]);
    for (hook, what, why) in [
        ("pick-address", "memory-bomb", "memory limit of 4 MiB"),
        ("select-ranges", "recursion", "overflowed its stack"),
        ("validate-settings", "trap", "trapped"),
        ("pick-address", "huge-output", "memory limit"),
        ("select-ranges", "huge-output", "memory limit"),
    ] {
        refused_cleanly(&s, &s.conf(hostile(hook, what, json!({}))), hook, why);
    }
}

#[test]
fn an_answer_outside_the_free_addresses_of_the_range_is_a_bad_answer() {
    let s = Setup::new("policy-answers", &["hostile-fixtures"]);
    for (what, address, why) in [
        ("taken", json!({"address": "192.0.2.1"}), "192.0.2.1"),
        ("out-of-range", json!({}), "outside range"),
        ("other-family", json!({}), "in an IPv4 range"),
        ("excluded", json!({"address": "192.0.2.200"}), "192.0.2.200"),
    ] {
        let mut conf: Value = serde_json::from_str(&s.conf(hostile("pick-address", what, address))).unwrap();
        conf["ipam"]["ipRanges"][0]["exclude"] = json!(["192.0.2.200/32"]);
        refused_cleanly(&s, &conf.to_string(), "pick-address", why);
    }
}

#[test]
fn settings_the_policy_rejects_fail_the_add_as_a_config_error() {
    let s = Setup::new("policy-settings", &["hostile-fixtures"]);
    let out = s.run("ADD", "p1", "c1", &s.conf(hostile("validate-settings", "reject-settings", json!({}))));
    let error = out.expect_cni_error("ADD");
    assert_eq!(error["code"], 7, "{error}");
    assert!(error["msg"].as_str().unwrap().contains("validate-settings: rejected its settings"), "{error}");
}

#[test]
fn on_error_ignore_and_monitor_mode_fall_back_to_the_built_in_choice() {
    let s = Setup::new("policy-modes", &["hostile-fixtures", "sticky-ordinal"]);
    let mut ignored = hostile("pick-address", "loop", json!({}));
    ignored[0]["on_error"] = json!("ignore");
    assert_eq!(s.add("web-5", "c1", &s.conf(ignored)), ["192.0.2.1/24", "2001:db8::1/64"]);
    let monitored = json!([{"name": "sticky", "path": policy("sticky-ordinal"), "mode": "monitor"}]);
    assert_eq!(s.add("web-7", "c2", &s.conf(monitored)), ["192.0.2.2/24", "2001:db8::2/64"], "monitor: logged, not applied");
}

#[test]
fn a_policy_in_monitor_mode_never_stops_an_add_or_a_preview_pod() {
    let s = Setup::new("policy-monitor", &["hostile-fixtures"]);
    let failing = [
        ("pick-address", "trap", json!({})),
        ("pick-address", "loop", json!({})),
        ("pick-address", "memory-bomb", json!({})),
        ("select-ranges", "recursion", json!({})),
        ("pick-address", "taken", json!({"address": "192.0.2.1"})),
        ("validate-settings", "reject-settings", json!({})),
    ];
    for (i, (hook, what, extra)) in failing.into_iter().enumerate() {
        // `on_error` left at its default, deny: monitor mode alone must keep the pod.
        let mut trial = hostile(hook, what, extra);
        trial[0]["mode"] = json!("monitor");
        let conf = s.conf(trial);
        let pod = format!("m-{i}");
        assert_eq!(s.add(&pod, &pod, &conf), [format!("192.0.2.{}/24", i + 1), format!("2001:db8::{}/64", i + 1)], "{hook} {what}");
        let report = preview(&s, &conf, &["--pods", "1", "--from-datastore"]);
        assert_eq!(report["pods"][0]["failure"], Value::Null, "preview, {hook} {what}: {}", report["pods"][0]);
    }
    // Not even compiled: a trial policy that cannot load is logged and skipped.
    let missing = json!([{"name": "gone", "path": "/nonexistent/gone.wasm", "mode": "monitor"}]);
    assert_eq!(s.add("m-gone", "m-gone", &s.conf(missing)), ["192.0.2.7/24", "2001:db8::7/64"]);
}

#[test]
fn a_policy_not_compiled_is_a_clear_config_error_and_nothing_is_written() {
    let s = Setup::new("policy-uncompiled", &[]);
    let out = s.run("ADD", "p1", "c1", &s.conf(json!([entry("sticky", "sticky-ordinal", json!({}))])));
    let error = out.expect_cni_error("ADD");
    assert_eq!(error["code"], 7, "{error}");
    assert!(error["msg"].as_str().unwrap().contains("thereabouts policy compile"), "{error}");
    assert!(s.pools().is_empty(), "nothing written");
}

#[test]
fn an_artifact_others_could_write_is_never_loaded() {
    use std::os::unix::fs::PermissionsExt;
    let s = Setup::new("policy-untrusted", &["sticky-ordinal"]);
    for artifact in std::fs::read_dir(s.cache()).unwrap().flatten() {
        std::fs::set_permissions(artifact.path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let out = s.run("ADD", "p1", "c1", &s.conf(json!([entry("sticky", "sticky-ordinal", json!({}))])));
    assert!(out.expect_cni_error("ADD")["msg"].as_str().unwrap().contains("not trusted"));
}
