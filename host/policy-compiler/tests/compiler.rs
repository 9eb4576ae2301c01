//! The compiler binary on the example policies and on components that are
//! not policies, and its artifacts loaded the way the plugin loads them.
//!
//! The guests are built here (wasm32-unknown-unknown, `--profile wasm`, in
//! target/wasm-guest like host/build.rs and scripts/build-policies.sh: the
//! outer `cargo test` holds the main target dir) and wrapped with the
//! binary's own `componentize`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder, Trap};

include!("../../src/policy_engine_config.rs");

// PartialEq for comparing answers.
wasmtime::component::bindgen!({ world: "policy-extension", path: "../../wit", additional_derives: [PartialEq] });

use exports::thereabouts::ipam::policy::{AttachmentInput, Choice, Needs, Pick, Refusal};

const POLICIES: [&str; 4] = ["sticky-ordinal", "namespace-ranges", "keep-addresses", "hostile-fixtures"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn wasm_guest_dir() -> PathBuf {
    workspace().join("target/wasm-guest/wasm32-unknown-unknown/wasm")
}

/// `cargo build` of wasm guest packages, as host/build.rs runs it.
fn build_guests(packages: &[&str]) {
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo.current_dir(workspace()).args(["build", "--lib", "--target", "wasm32-unknown-unknown", "--profile", "wasm", "--target-dir", "target/wasm-guest"]);
    for p in packages {
        cargo.args(["-p", p]);
    }
    for var in ["CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER", "CARGO_TARGET_DIR", "CARGO_BUILD_TARGET"] {
        cargo.env_remove(var);
    }
    let status = cargo.status().unwrap();
    assert!(status.success(), "building {packages:?} for wasm32-unknown-unknown: {status}");
}

fn compiler(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_thereabouts-policy-compiler")).args(args).env_remove("THEREABOUTS_POLICY_CACHE").output().unwrap()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn failed(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "stdout {}", String::from_utf8_lossy(&out.stdout));
    assert!(out.stdout.is_empty());
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// The four example components, built and wrapped once per test process
/// (under target/tmp: a static is never dropped, so no temp dir to clean).
fn policies() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        build_guests(&POLICIES);
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        // Earlier runs' directories, whose process is gone.
        for old in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
            let name = old.file_name().to_string_lossy().into_owned();
            if name.strip_prefix("policy-compiler-").is_some_and(|pid| !Path::new("/proc").join(pid).exists()) {
                let _ = std::fs::remove_dir_all(old.path());
            }
        }
        let dir = tmp.join(format!("policy-compiler-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in POLICIES {
            let core = wasm_guest_dir().join(format!("{}.wasm", name.replace('-', "_")));
            ok(&compiler(&["componentize".as_ref(), core.as_ref(), "-o".as_ref(), dir.join(format!("{name}.wasm")).as_ref()]));
        }
        dir
    })
}

fn policy(name: &str) -> PathBuf {
    policies().join(format!("{name}.wasm"))
}

fn compat_key(fuel: bool) -> String {
    let args: &[&std::ffi::OsStr] = if fuel { &["compat-key".as_ref(), "--fuel".as_ref()] } else { &["compat-key".as_ref()] };
    ok(&compiler(args)).trim_end().to_string()
}

fn compile(policy: &Path, cache: &Path) -> Output {
    compiler(&["compile".as_ref(), policy.as_ref(), "--cache".as_ref(), cache.as_ref()])
}

fn sha256_hex(path: &Path) -> String {
    Sha256::digest(std::fs::read(path).unwrap()).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_compat_key_is_16_hex_digits_and_fuel_has_its_own() {
    let key = compat_key(false);
    assert_eq!(key.len(), 16, "{key:?}");
    assert!(key.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{key:?}");
    assert_ne!(key, compat_key(true));
}

#[test]
fn each_example_compiles_to_digest_and_compat() {
    let dir = TempDir::new("examples");
    let cache = dir.path().join("var/cache");
    let key = compat_key(false);
    for name in POLICIES {
        let artifact = PathBuf::from(ok(&compile(&policy(name), &cache)).trim_end());
        assert_eq!(artifact, cache.canonicalize().unwrap().join(format!("{}-{key}.cwasm", sha256_hex(&policy(name)))), "{name}");
        assert_eq!(std::fs::metadata(&artifact).unwrap().mode() & 0o7777, 0o644, "{name}");
    }
    assert_eq!(std::fs::metadata(&cache).unwrap().mode() & 0o7777, 0o755);
    // Nothing but the artifacts: the temp files were renamed.
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), POLICIES.len());
    // Again: the same name, replaced in place.
    ok(&compile(&policy("sticky-ordinal"), &cache));
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), POLICIES.len());
}

#[test]
fn a_core_module_is_wrapped_and_named_by_its_own_digest() {
    policies();
    let dir = TempDir::new("core");
    let core = wasm_guest_dir().join("keep_addresses.wasm");
    let artifact = PathBuf::from(ok(&compile(&core, dir.path())).trim_end());
    assert_eq!(artifact.file_name().unwrap().to_str().unwrap(), format!("{}-{}.cwasm", sha256_hex(&core), compat_key(false)));
}

#[test]
fn fuel_artifacts_have_the_fuel_key() {
    let dir = TempDir::new("fuel");
    let out = compiler(&["compile".as_ref(), policy("sticky-ordinal").as_ref(), "--cache".as_ref(), dir.path().as_ref(), "--fuel".as_ref()]);
    assert!(ok(&out).trim_end().ends_with(&format!("-{}.cwasm", compat_key(true))));
}

#[test]
fn the_engine_component_is_refused_naming_the_missing_export() {
    build_guests(&["thereabouts-allocator-component"]);
    let dir = TempDir::new("engine");
    let engine = dir.path().join("engine.wasm");
    ok(&compiler(&["componentize".as_ref(), wasm_guest_dir().join("thereabouts_allocator_component.wasm").as_ref(), "-o".as_ref(), engine.as_ref()]));
    let e = failed(&compile(&engine, &dir.path().join("cache")));
    assert!(e.contains("is not a thereabouts policy: no exported instance named `thereabouts:ipam/policy@0.1.0`"), "{e}");
    assert_eq!(std::fs::read_dir(dir.path().join("cache")).unwrap().count(), 0);
}

/// A component of a made-up world: wit-component's dummy core module for it
/// (every function traps), wrapped.
fn fake_component(dir: &Path, wit: &str) -> PathBuf {
    let mut resolve = wit_parser::Resolve::new();
    let package = resolve.push_str("fake.wit", wit).unwrap();
    let world = resolve.select_world(&[package], Some("fake")).unwrap();
    let mut core = wit_component::dummy_module(&resolve, world, wit_parser::ManglingAndAbi::Legacy(wit_parser::LiftLowerAbi::Sync));
    wit_component::embed_component_metadata(&mut core, &resolve, world, wit_component::StringEncoding::UTF8, false).unwrap();
    let component = wit_component::ComponentEncoder::default().module(&core).unwrap().validate(true).encode().unwrap();
    let path = dir.join("fake.wasm");
    std::fs::write(&path, component).unwrap();
    path
}

#[test]
fn wrong_exports_are_named() {
    let dir = TempDir::new("exports");
    let empty = dir.path().join("empty.wasm");
    std::fs::write(&empty, wasm_encoder::Component::new().finish()).unwrap();
    let e = failed(&compile(&empty, &dir.path().join("cache")));
    assert!(e.contains("no exported instance named `thereabouts:ipam/policy@0.1.0`"), "{e}");

    let missing = fake_component(
        dir.path(),
        "package thereabouts:ipam@0.1.0;
         interface types {}
         interface policy { validate-settings: func(settings: string) -> result<u32, string>; }
         world fake { export types; export policy; }",
    );
    let e = failed(&compile(&missing, &dir.path().join("cache")));
    assert!(e.contains("does not have export `select-ranges`"), "{e}");

    let mistyped = fake_component(
        dir.path(),
        "package thereabouts:ipam@0.1.0;
         interface policy {
             flags needs { pod-labels, pod-annotations }
             validate-settings: func(settings: string) -> result<needs, string>;
             select-ranges: func(namespace: string) -> result<list<u32>, string>;
             pick-address: func() -> u32;
         }
         interface types {}
         world fake { export types; export policy; }",
    );
    let e = failed(&compile(&mistyped, &dir.path().join("cache")));
    assert!(e.contains("export `select-ranges` of thereabouts:ipam/policy@0.1.0 does not have the type wit/ipam.wit gives it"), "{e}");
}

#[test]
fn a_component_with_imports_is_refused() {
    let dir = TempDir::new("imports");
    let importing = fake_component(
        dir.path(),
        "package thereabouts:ipam@0.1.0;
         interface policy { validate-settings: func(settings: string) -> u32; }
         world fake { import log: func(line: string); export policy; }",
    );
    let e = failed(&compile(&importing, &dir.path().join("cache")));
    assert!(e.contains("it imports log; a policy must import nothing"), "{e}");
}

#[test]
fn a_file_that_is_no_component_is_refused() {
    let dir = TempDir::new("random");
    let random = dir.path().join("random.wasm");
    std::fs::write(&random, (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect::<Vec<_>>()).unwrap();
    let e = failed(&compile(&random, &dir.path().join("cache")));
    assert!(e.contains("is not a WebAssembly component or module"), "{e}");
    // A core module's preamble over garbage, and a core module without a component type.
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"\0asm\x01\0\0\0\x01\xff\xff\xff").unwrap();
    let e = failed(&compile(&garbage, &dir.path().join("cache")));
    assert!(e.contains("is a core module"), "{e}");
    let bare = dir.path().join("bare.wasm");
    std::fs::write(&bare, wasm_encoder::Module::new().finish()).unwrap();
    let e = failed(&compile(&bare, &dir.path().join("cache")));
    assert!(e.contains("is a core module without a component type"), "{e}");
    let e = failed(&compile(&dir.path().join("absent.wasm"), &dir.path().join("cache")));
    assert!(e.contains("absent.wasm"), "{e}");
}

#[test]
fn a_cache_others_can_write_is_refused() {
    let dir = TempDir::new("cache-modes");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o775)).unwrap();
    let e = failed(&compile(&policy("sticky-ordinal"), &cache));
    assert!(e.contains("refusing the cache") && e.contains("mode 775 lets group or others write it"), "{e}");
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);

    // A directory above the cache counts too (the plugin checks them all).
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = failed(&compile(&policy("sticky-ordinal"), &open.join("cache")));
    assert!(e.contains("above the cache is mode 777"), "{e}");

    if my_uid() == 0 {
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&cache, Some(65534), None).unwrap();
        let e = failed(&compile(&policy("sticky-ordinal"), &cache));
        assert!(e.contains("the cache is owned by uid 65534, not root"), "{e}");
    }
}

fn my_uid() -> u32 {
    std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX)
}

/// A store like the plugin's: memory bounded, and an epoch deadline the
/// test's own ticker (or nothing) ends.
fn store(engine: &Engine, memory_mib: usize) -> Store<StoreLimits> {
    let mut store = Store::new(engine, StoreLimitsBuilder::new().memory_size(memory_mib << 20).trap_on_grow_failure(true).build());
    store.limiter(|l| l);
    store.set_epoch_deadline(1);
    store
}

fn load(engine: &Engine, name: &str, cache: &Path) -> PolicyExtensionPre<StoreLimits> {
    let artifact = PathBuf::from(ok(&compile(&policy(name), cache)).trim_end());
    // SAFETY: the compiler under test just wrote it, for this engine's configuration.
    let component = unsafe { Component::deserialize_file(engine, &artifact) }.unwrap();
    PolicyExtensionPre::new(Linker::new(engine).instantiate_pre(&component).unwrap()).unwrap()
}

fn validate(pre: &PolicyExtensionPre<StoreLimits>, memory_mib: usize, settings: &str) -> wasmtime::Result<Result<Needs, String>> {
    let mut store = store(pre.engine(), memory_mib);
    let policy = pre.instantiate(&mut store)?;
    policy.thereabouts_ipam_policy().call_validate_settings(&mut store, settings)
}

#[test]
fn artifacts_load_into_the_plugins_engine_and_validate_settings() {
    let dir = TempDir::new("load");
    // The runtime's engine: native target, not the compiler's baseline one.
    let engine = Engine::new(&policy_engine_config()).unwrap();
    for name in POLICIES {
        let pre = load(&engine, name, dir.path());
        assert_eq!(validate(&pre, 4, "{}").unwrap(), Ok(Needs::empty()), "{name}");
        let bad = validate(&pre, 4, r#"{"no-such-key": 1}"#).unwrap().unwrap_err();
        assert!(bad.contains("unknown field `no-such-key`"), "{name}: {bad}");
        if name == "namespace-ranges" {
            assert_eq!(validate(&pre, 4, r#"{"labels": [{"key": "tier", "value": "db", "ranges": [1]}]}"#).unwrap(), Ok(Needs::POD_LABELS));
        }
    }
}

mod input {
    use super::exports::thereabouts::ipam::policy::{AttachmentInput, PodMetadata};
    use super::exports::thereabouts::ipam::types::*;

    fn range(cidr: &str, first: &str, last: &str, family: IpFamily, excludes: &[&str]) -> NormalizedRange {
        let zero = Offset { high: 0, low: 0 };
        NormalizedRange {
            cidr: cidr.into(),
            prefix_len: cidr.split('/').nth(1).unwrap().parse().unwrap(),
            family,
            first: first.into(),
            last: last.into(),
            first_offset: zero,
            last_offset: zero,
            excludes: excludes.iter().map(|e| e.to_string()).collect(),
            exclude_cidrs: excludes.iter().map(|e| e.to_string()).collect(),
            usable: "0".into(),
            gateway: None,
            pool_name: cidr.replace('/', "-"),
            requested: None,
            node_slicing: None,
        }
    }

    /// A dual-stack config plus a second IPv4 range, for pod `ns/name`.
    pub fn attachment(namespace: &str, name: &str, labels: &[(&str, &str)], settings: &str) -> AttachmentInput {
        let config = NormalizedConfig {
            name: "net".into(),
            cni_version: "1.1.0".into(),
            network_name: String::new(),
            enable_overlapping_ranges: true,
            ranges: vec![
                range("192.0.2.0/24", "192.0.2.1", "192.0.2.254", IpFamily::Ipv4, &["192.0.2.16/30"]),
                range("2001:db8::/64", "2001:db8::1", "2001:db8::ffff:ffff:ffff:fffe", IpFamily::Ipv6, &[]),
                range("198.51.100.0/24", "198.51.100.1", "198.51.100.254", IpFamily::Ipv4, &[]),
            ],
            ip_ranges_allocation: RangesAllocation::All,
            preferred_ip_annotation: false,
            allow_persistent_ips: false,
            ipam_claim_reference: None,
            policies: Vec::new(),
            addresses: Vec::new(),
            routes_json: None,
            dns_json: None,
            pod_ref: format!("{namespace}/{name}"),
            datastore: DatastoreSettings {
                kind: None,
                data_dir: None,
                kubeconfig: None,
                etcd_hosts: Vec::new(),
                etcd_username: None,
                etcd_password: None,
                etcd_key_file: None,
                etcd_cert_file: None,
                etcd_ca_cert_file: None,
                etcd_prefix: None,
            },
            log_file: None,
            log_level: None,
            configuration_path: None,
        };
        AttachmentInput {
            pod_namespace: namespace.into(),
            pod_name: name.into(),
            container_id: "c0ffee".into(),
            ifname: "net1".into(),
            cni_args: Vec::new(),
            config,
            pod: (!labels.is_empty())
                .then(|| PodMetadata { labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), annotations: Vec::new() }),
            settings: settings.into(),
        }
    }
}

/// Each example compiled once, called through its component.
struct Examples {
    engine: Engine,
    pres: std::collections::HashMap<&'static str, PolicyExtensionPre<StoreLimits>>,
    _cache: TempDir,
}

impl Examples {
    fn new() -> Self {
        let cache = TempDir::new("answers");
        let engine = Engine::new(&policy_engine_config()).unwrap();
        let pres = POLICIES.iter().map(|&name| (name, load(&engine, name, cache.path()))).collect();
        Examples { engine, pres, _cache: cache }
    }

    fn instance(&self, name: &str) -> (Store<StoreLimits>, PolicyExtension) {
        let mut store = store(&self.engine, 16);
        let policy = self.pres[name].instantiate(&mut store).unwrap();
        (store, policy)
    }

    fn pick(&self, name: &str, input: &AttachmentInput, range: u32) -> Pick {
        let candidates: Vec<String> = (1..=20).map(|n| format!("192.0.2.{n}")).collect();
        let (mut store, policy) = self.instance(name);
        policy.thereabouts_ipam_policy().call_pick_address(&mut store, input, range, &candidates).unwrap()
    }

    fn select(&self, name: &str, input: &AttachmentInput) -> Result<Vec<u32>, String> {
        let (mut store, policy) = self.instance(name);
        policy.thereabouts_ipam_policy().call_select_ranges(&mut store, input).unwrap()
    }
}

#[test]
fn the_examples_answer_through_their_components() {
    use input::attachment;
    let ex = Examples::new();

    let sticky = ex.pick("sticky-ordinal", &attachment("db", "web-7", &[], r#"{"base": 100}"#), 1);
    assert_eq!(sticky.choice, Choice::Prefer(vec!["2001:db8::6c".into()]));
    let keep = ex.pick("keep-addresses", &attachment("db", "x", &[], r#"{"deny": ["192.0.2.10", "192.0.2.12/31"], "only_even": true}"#), 0);
    assert_eq!(keep.choice, Choice::Prefer(["2", "4", "6", "8", "14", "16", "18", "20"].map(|n| format!("192.0.2.{n}")).to_vec()));
    let refusal = |n: u32, reason: &str| Refusal { address: format!("192.0.2.{n}"), reason: reason.into() };
    let mut expected: Vec<Refusal> = [10, 12, 13].map(|n| refusal(n, "deny-listed by settings")).into();
    expected.extend([1, 3, 5, 7, 9, 11, 15, 17, 19].map(|n| refusal(n, "odd offset from the network (only_even)")));
    expected.sort_by_key(|r| r.address.rsplit('.').next().unwrap().parse::<u32>().unwrap());
    assert_eq!(keep.refused, expected);

    let settings = r#"{"namespaces": {"team-a": [2, 0]}, "labels": [{"key": "tier", "value": "db", "ranges": [1]}]}"#;
    assert_eq!(ex.select("namespace-ranges", &attachment("team-a", "x", &[], settings)), Ok(vec![2, 0]));
    assert_eq!(ex.select("namespace-ranges", &attachment("team-a", "x", &[("tier", "db")], settings)), Ok(vec![1]));
    assert_eq!(ex.select("namespace-ranges", &attachment("team-b", "x", &[], settings)), Ok(vec![0, 1, 2]));

    let hostile = |hook: &str, what: &str| attachment("a", "b", &[], &format!(r#"{{"hook": "{hook}", "do": "{what}", "address": "192.0.2.99"}}"#));
    assert_eq!(ex.select("hostile-fixtures", &hostile("select-ranges", "out-of-range")), Ok(vec![3]));
    assert_eq!(ex.select("hostile-fixtures", &hostile("pick-address", "loop")), Ok(vec![0, 1, 2]));
    assert_eq!(ex.pick("hostile-fixtures", &hostile("select-ranges", "loop"), 0).choice, Choice::BuiltIn);
    for (what, range, preferred) in
        [("taken", 0, "192.0.2.99"), ("excluded", 0, "192.0.2.16"), ("out-of-range", 2, "198.51.100.255"), ("other-family", 1, "192.0.2.1")]
    {
        assert_eq!(ex.pick("hostile-fixtures", &hostile("pick-address", what), range).choice, Choice::Prefer(vec![preferred.into()]), "{what}");
    }
}

#[test]
fn the_hostile_fixtures_misbehave_as_named() {
    let dir = TempDir::new("hostile");
    let engine = Engine::new(&policy_engine_config()).unwrap();
    let pre = load(&engine, "hostile-fixtures", dir.path());
    let on_validate = |what: &str| format!(r#"{{"hook": "validate-settings", "do": "{what}"}}"#);
    let trap = |e: wasmtime::Error| *e.downcast_ref::<Trap>().unwrap_or_else(|| panic!("not a trap: {e:?}"));

    assert_eq!(validate(&pre, 4, &on_validate("reject-settings")).unwrap(), Err("hostile-fixtures: settings rejected on purpose".into()));
    assert_eq!(validate(&pre, 4, &on_validate("taken")).unwrap(), Ok(Needs::empty()), "misbehaviours of other hooks are harmless here");
    assert_eq!(validate(&pre, 64, &on_validate("huge-output")).unwrap().unwrap_err().len(), 16 << 20);
    assert_eq!(trap(validate(&pre, 4, &on_validate("trap")).unwrap_err()), Trap::UnreachableCodeReached);
    assert_eq!(trap(validate(&pre, 4, &on_validate("recursion")).unwrap_err()), Trap::StackOverflow);
    let bomb = validate(&pre, 8, &on_validate("memory-bomb")).unwrap_err();
    assert!(format!("{bomb:?}").contains("memory"), "{bomb:?}");

    let weak = engine.weak();
    let ticker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        weak.upgrade().unwrap().increment_epoch();
    });
    assert_eq!(trap(validate(&pre, 4, &on_validate("loop")).unwrap_err()), Trap::Interrupt);
    ticker.join().unwrap();
}

/// A private directory under the system temp dir (sticky /tmp: trusted
/// above, as the plugin would), removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        let path = std::env::temp_dir().join(format!("thab-policy-compiler-{}-{what}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
