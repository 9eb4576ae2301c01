//! Benchmark (issue 14): what policy extensions cost a CNI ADD, whole process,
//! on the file datastore. Five sides in interleaved rounds (the order rotates
//! every round so machine noise hits all alike), each with its own data dir:
//! no policy; one (sticky-ordinal); the same one from a cache where the
//! plugin cannot keep its records (host/src/policy/records.rs), so each ADD
//! hashes the file and validates the settings; three (sticky-ordinal,
//! keep-addresses, namespace-ranges); and the hostile loop with `timeout_ms`
//! 10, whose ADD fails, to time a deadline's stop. Prints the ADD's p50 and p90 per side and
//! the added cost against no policy.
//!
//! Usage: bench_policies [--rounds N] (default 300) [--base DIR] [--also NAME=BIN[,NAME2=BIN2...]]
//! `--base`: where the data dirs and the cache go (default the system temp
//! dir); a tmpfs such as /dev/shm takes the disk's fsyncs out of the figures
//! when other work on the machine makes them slow and noisy.
//! `--also`: more thereabouts binaries (e.g. the build before a change, see
//! bench_host_local) measured in the same interleaved rounds, each with its
//! own no-policy, one-policy and three-policy sides; the policies are also
//! compiled by its own `thereabouts policy compile` (an artifact it cannot
//! load has another compatibility key, so both builds' artifacts coexist).
//! Build first: bash scripts/build-plugin.sh && cargo build --release -p thereabouts-e2e
//! (it builds the policies itself, with scripts/build-policies.sh)

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use thereabouts_e2e::*;

struct Side {
    name: String,
    /// The plugin binary (another build with `--also`).
    bin: std::path::PathBuf,
    /// The side whose p50 its added cost is measured against.
    base: usize,
    conf: String,
    cache: std::path::PathBuf,
    fails: bool,
    add: Vec<Duration>,
}

fn conf(dir: &Path, policies: Value) -> String {
    let mut c = thereabouts_conf("1.1.0", "bench", dir, None, &["192.0.2.0/24", "2001:db8::/64"]);
    c["ipam"]["policies"] = policies;
    c.to_string()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let mut rounds = 300usize;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--rounds") {
        rounds = args.get(i + 1).and_then(|v| v.parse().ok()).expect("--rounds N");
    }
    let also: Vec<(String, std::path::PathBuf)> = args
        .iter()
        .position(|a| a == "--also")
        .map(|i| {
            let list = args.get(i + 1).expect("--also NAME=BIN[,NAME2=BIN2...]");
            list.split(',')
                .map(|s| {
                    let (name, bin) = s.split_once('=').expect("--also NAME=BIN");
                    let bin = std::path::PathBuf::from(bin);
                    assert!(bin.is_file(), "--also {name}: {} is not a file", bin.display());
                    (name.to_string(), bin)
                })
                .collect()
        })
        .unwrap_or_default();
    let policy = built_policy;
    let base = args.iter().position(|a| a == "--base").map(|i| std::path::PathBuf::from(args.get(i + 1).expect("--base DIR")));
    let tmp = base.map_or_else(|| TempDir::new("bench-policies"), |b| TempDir::new_in(&b, "bench-policies"));
    let cache = tmp.sub("cache");
    for name in ["sticky-ordinal", "keep-addresses", "namespace-ranges", "hostile-fixtures"] {
        compile_policy(&policy(name), &cache);
        for (_, bin) in &also {
            let ran = std::process::Command::new(bin)
                .args(["policy", "compile"])
                .arg(policy(name))
                .arg("--cache")
                .arg(&cache)
                .env_remove("CNI_COMMAND")
                .output()
                .expect("policy compile");
            assert!(ran.status.success(), "{} policy compile {name}: {}", bin.display(), String::from_utf8_lossy(&ran.stderr));
        }
    }
    // A cache where the plugin cannot leave its records (a file stands where
    // each record directory would be): every ADD hashes the policy file and
    // asks validate-settings, as before the records existed.
    let bare = tmp.sub("cache-without-records");
    compile_policy(&policy("sticky-ordinal"), &bare);
    for name in ["by-file", "settings"] {
        std::fs::write(bare.join(name), b"").expect("blocking a record directory");
    }
    // `timeout_ms` 1000: a shared machine can stall a process for tens of
    // milliseconds, which must not fail a measured ADD; the budget does not
    // change what a call costs (one timer either way).
    let sticky = json!({"name": "sticky", "path": policy("sticky-ordinal"), "settings": {"base": 10}, "timeout_ms": 1000});
    let keep = json!({"name": "keep", "path": policy("keep-addresses"), "settings": {"deny": ["192.0.2.250"]}, "timeout_ms": 1000});
    let ns = json!({"name": "ns", "path": policy("namespace-ranges"), "settings": {"namespaces": {"team-a": [1]}}, "timeout_ms": 1000});
    let hostile = json!({"name": "hostile", "path": policy("hostile-fixtures"), "settings": {"hook": "pick-address", "do": "loop"}, "timeout_ms": 10});
    let this = thereabouts_bin();
    let side = |name: &str, bin: &Path, base, conf, cache: &Path, fails| Side {
        name: name.to_string(),
        bin: bin.to_path_buf(),
        base,
        conf,
        cache: cache.to_path_buf(),
        fails,
        add: Vec::new(),
    };
    let mut sides = vec![
        side("no policy", &this, 0, conf(&tmp.sub("none"), json!([])), &cache, false),
        side("1 policy", &this, 0, conf(&tmp.sub("one"), json!([sticky])), &cache, false),
        side("1 policy, no records", &this, 0, conf(&tmp.sub("bare"), json!([sticky])), &bare, false),
        side("3 policies", &this, 0, conf(&tmp.sub("three"), json!([sticky, keep, ns])), &cache, false),
        side("hostile loop, 10 ms", &this, 0, conf(&tmp.sub("hostile"), json!([hostile])), &cache, true),
    ];
    for (name, bin) in &also {
        let base = sides.len();
        sides.push(side(&format!("{name}: no policy"), bin, base, conf(&tmp.sub(&format!("{name}-none")), json!([])), &cache, false));
        sides.push(side(&format!("{name}: 1 policy"), bin, base, conf(&tmp.sub(&format!("{name}-one")), json!([sticky])), &cache, false));
        sides.push(side(&format!("{name}: 3 policies"), bin, base, conf(&tmp.sub(&format!("{name}-three")), json!([sticky, keep, ns])), &cache, false));
    }
    let n = sides.len();
    for round in 0..rounds + 10 {
        for k in 0..n {
            let side = &mut sides[(round + k) % n];
            // Pods `web-<round>`: the sticky policy has an ordinal to work on.
            let (pod, cid) = (format!("web-{}", round % 200), format!("c{round}"));
            let call = |cmd: &str| {
                let mut c = Call::pod(cmd, &cid, &pod);
                c.ifname = "net1".into();
                Invocation::new(c, side.conf.as_str()).env("THEREABOUTS_POLICY_CACHE", side.cache.to_str().unwrap()).run(&side.bin)
            };
            let add = call("ADD");
            assert_eq!(add.ok(), !side.fails, "{} ADD: {}", side.name, add.describe());
            if !side.fails {
                assert!(call("DEL").ok(), "{} DEL", side.name);
            }
            if round >= 10 {
                side.add.push(add.elapsed);
            }
        }
    }
    let stats = |v: &[Duration]| {
        let mut s = v.to_vec();
        s.sort();
        (percentile(&s, 50.0), percentile(&s, 90.0))
    };
    println!("ADD, whole process, file datastore, dual-stack, {rounds} interleaved rounds:");
    for side in &sides {
        let (p50, p90) = stats(&side.add);
        let (base50, base90) = stats(&sides[side.base].add);
        println!(
            "  {:<30} p50 {:>6.2} ms  p90 {:>6.2} ms  (+{:.2} ms at p50, +{:.2} ms at p90 against {})",
            side.name,
            ms(p50),
            ms(p90),
            ms(p50.saturating_sub(base50)),
            ms(p90.saturating_sub(base90)),
            sides[side.base].name
        );
    }
}
