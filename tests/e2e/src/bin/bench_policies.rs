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
//! Usage: bench_policies [--rounds N] (default 300)
//! Build first: bash scripts/build-plugin.sh && cargo build --release -p thereabouts-e2e
//! (it builds the policies itself, with scripts/build-policies.sh)

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use thereabouts_e2e::*;

struct Side {
    name: &'static str,
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
    let policy = built_policy;
    let tmp = TempDir::new("bench-policies");
    let cache = tmp.sub("cache");
    for name in ["sticky-ordinal", "keep-addresses", "namespace-ranges", "hostile-fixtures"] {
        compile_policy(&policy(name), &cache);
    }
    // A cache where the plugin cannot leave its records (a file stands where
    // each record directory would be): every ADD hashes the policy file and
    // asks validate-settings, as before the records existed.
    let bare = tmp.sub("cache-without-records");
    compile_policy(&policy("sticky-ordinal"), &bare);
    for name in ["by-file", "settings"] {
        std::fs::write(bare.join(name), b"").expect("blocking a record directory");
    }
    let sticky = json!({"name": "sticky", "path": policy("sticky-ordinal"), "settings": {"base": 10}});
    let keep = json!({"name": "keep", "path": policy("keep-addresses"), "settings": {"deny": ["192.0.2.250"]}});
    let ns = json!({"name": "ns", "path": policy("namespace-ranges"), "settings": {"namespaces": {"team-a": [1]}}});
    let hostile = json!({"name": "hostile", "path": policy("hostile-fixtures"), "settings": {"hook": "pick-address", "do": "loop"}, "timeout_ms": 10});
    let side = |name, conf, cache: &Path, fails| Side { name, conf, cache: cache.to_path_buf(), fails, add: Vec::new() };
    let mut sides = vec![
        side("no policy", conf(&tmp.sub("none"), json!([])), &cache, false),
        side("1 policy", conf(&tmp.sub("one"), json!([sticky])), &cache, false),
        side("1 policy, no records", conf(&tmp.sub("bare"), json!([sticky])), &bare, false),
        side("3 policies", conf(&tmp.sub("three"), json!([sticky, keep, ns])), &cache, false),
        side("hostile loop, 10 ms", conf(&tmp.sub("hostile"), json!([hostile])), &cache, true),
    ];
    let n = sides.len();
    for round in 0..rounds + 10 {
        for k in 0..n {
            let side = &mut sides[(round + k) % n];
            // Pods `web-<round>`: the sticky policy has an ordinal to work on.
            let (pod, cid) = (format!("web-{}", round % 200), format!("c{round}"));
            let call = |cmd: &str| {
                let mut c = Call::pod(cmd, &cid, &pod);
                c.ifname = "net1".into();
                Invocation::new(c, side.conf.as_str()).env("THEREABOUTS_POLICY_CACHE", side.cache.to_str().unwrap()).run(&thereabouts_bin())
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
    let (base50, _) = stats(&sides[0].add);
    println!("ADD, whole process, file datastore, dual-stack, {rounds} interleaved rounds:");
    for side in &sides {
        let (p50, p90) = stats(&side.add);
        println!("  {:<22} p50 {:>6.2} ms  p90 {:>6.2} ms  (+{:.2} ms at p50 against no policy)", side.name, ms(p50), ms(p90), ms(p50.saturating_sub(base50)));
    }
}
