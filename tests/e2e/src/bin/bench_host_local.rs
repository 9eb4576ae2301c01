//! Benchmark (issue 3): whole-process CNI ADD and DEL of a dual-stack config, thereabouts
//! on its file datastore versus Debian's host-local (/usr/lib/cni/host-local), same ranges,
//! each with its own data dir, interleaved round by round (the order alternates every
//! round) so that machine noise hits both alike. Prints medians, p90 and the ratio
//! thereabouts / host-local, plus the release binary's size.
//!
//! Usage: bench_host_local [--rounds N] [--prefill K[,K2...]] [--base DIR[,DIR2...]]
//!   (defaults: 300 rounds; prefill 0,100 = an empty pool, then 100 live pods per pool;
//!   data dirs under each DIR in turn, default the temp dir and then /dev/shm: the tmpfs
//!   run takes the disk out, which matters because thereabouts fsyncs its pool files and
//!   directory while host-local does not fsync at all)
//!   --concurrency W,M: afterwards, W processes at once x M ADDs each, then as many DELs,
//!   on each plugin in turn (default 16,15; 0 skips): throughput and per-call tail.
//!   W x M must fit the IPv4 documentation range 192.0.2.0/24 (at most 253).
//!   --also NAME=BIN[,NAME2=BIN2...]: more thereabouts binaries measured in the same
//!   interleaved rounds (e.g. the build before a change: before/after in one run).
//! Build first: bash scripts/build-plugin.sh && cargo build --release -p thereabouts-e2e

use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};
use thereabouts_e2e::*;

const HOST_LOCAL: &str = "/usr/lib/cni/host-local";

struct Side {
    name: String,
    bin: std::path::PathBuf,
    conf: String,
    add: Vec<Duration>,
    del: Vec<Duration>,
    both: Vec<Duration>,
}

impl Side {
    fn call(&self, cmd: &str, cid: &str) -> Duration {
        let o = Call::pod(cmd, cid, cid).run(&self.bin, &self.conf);
        assert!(o.ok(), "{} {cmd} {cid} failed: {}", self.name, o.describe());
        o.elapsed
    }
    fn round(&mut self, cid: &str, record: bool) {
        let a = self.call("ADD", cid);
        let d = self.call("DEL", cid);
        if record {
            self.add.push(a);
            self.del.push(d);
            self.both.push(a + d);
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn stats(v: &[Duration]) -> (Duration, Duration) {
    let mut s = v.to_vec();
    s.sort();
    (percentile(&s, 50.0), percentile(&s, 90.0))
}

fn version_cost(bin: &Path, n: usize) -> Duration {
    let mut v: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let o = std::process::Command::new(bin).env_clear().env("CNI_COMMAND", "VERSION").output().unwrap();
            assert!(o.status.success());
            t.elapsed()
        })
        .collect();
    v.sort();
    percentile(&v, 50.0)
}

/// Filesystem type of `p` (from `stat -f`), for the report.
fn fs_type(p: &Path) -> String {
    std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(p)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().replace("ext2/ext3", "ext2/3/4"))
        .unwrap_or_else(|| "?".into())
}

fn main() {
    let mut rounds = 300usize;
    let mut prefills = vec![0usize, 100];
    let mut conc = (16usize, 15usize);
    let mut also: Vec<(String, std::path::PathBuf)> = Vec::new();
    let mut bases = vec![std::env::temp_dir()];
    if Path::new("/dev/shm").is_dir() {
        bases.push("/dev/shm".into());
    }
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--rounds" => {
                rounds = args[i + 1].parse().expect("--rounds N");
                i += 1;
            }
            "--prefill" => {
                prefills = args[i + 1].split(',').map(|s| s.parse().expect("--prefill K[,K]")).collect();
                i += 1;
            }
            "--also" => {
                also = args[i + 1]
                    .split(',')
                    .map(|s| {
                        let (name, bin) = s.split_once('=').expect("--also NAME=BIN");
                        (name.to_string(), bin.into())
                    })
                    .collect();
                i += 1;
            }
            "--base" => {
                bases = args[i + 1].split(',').map(Into::into).collect();
                i += 1;
            }
            "--concurrency" => {
                let v: Vec<usize> = args[i + 1].split(',').map(|s| s.parse().expect("--concurrency W,M")).collect();
                conc = (v[0], *v.get(1).unwrap_or(&15));
                assert!(conc.0 * conc.1 <= 253, "--concurrency W,M: W x M = {} addresses live at once do not fit 192.0.2.0/24 (253)", conc.0 * conc.1);
                i += 1;
            }
            "-h" | "--help" => {
                println!("usage: bench_host_local [--rounds N] [--prefill K[,K2...]] [--base DIR[,DIR2...]] [--concurrency W,M] [--also NAME=BIN,...]");
                return;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 1;
    }
    assert!(Path::new(HOST_LOCAL).is_file(), "{HOST_LOCAL} missing: apt-get install -y containernetworking-plugins");
    let thab = thereabouts_bin();
    let size = std::fs::metadata(&thab).unwrap().len();
    let hl_size = std::fs::metadata(HOST_LOCAL).unwrap().len();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);

    println!("# thereabouts vs host-local: whole-process CNI ADD + DEL, dual-stack (192.0.2.0/24 + 2001:db8::/64), cniVersion 1.0.0");
    println!("thereabouts binary: {} ({} bytes = {:.2} MiB)", thab.display(), size, size as f64 / 1048576.0);
    println!("host-local binary:  {HOST_LOCAL} ({} bytes = {:.2} MiB)", hl_size, hl_size as f64 / 1048576.0);
    println!("machine: {cpus} CPU(s) visible; {rounds} interleaved rounds per scenario (order alternates each round), 10 warm-up rounds");
    for (name, bin) in &also {
        let size = std::fs::metadata(bin).unwrap().len();
        println!("{name} binary: {} ({size} bytes = {:.2} MiB)", bin.display(), size as f64 / 1048576.0);
    }
    let (vt, vh) = (version_cost(&thab, 50), version_cost(Path::new(HOST_LOCAL), 50));
    println!("process floor (CNI_COMMAND=VERSION, median of 50): thereabouts {}, host-local {}", ms(vt), ms(vh));
    for (name, bin) in &also {
        println!("process floor of {name}: {}", ms(version_cost(bin, 50)));
    }

    for (base, &prefill) in bases.iter().flat_map(|b| prefills.iter().map(move |p| (b, p))) {
        let tmp = TempDir::new_in(base, "bench");
        let thab_dir = tmp.sub("thereabouts");
        let hl_dir = tmp.sub("host-local");
        let thab_conf = thereabouts_conf("1.0.0", "thab-bench", &thab_dir, None, &["192.0.2.0/24", "2001:db8::/64"]).to_string();
        let hl_conf = json!({
            "cniVersion": "1.0.0", "name": "thab-bench", "type": "thab-e2e",
            "ipam": {"type": "host-local", "dataDir": hl_dir.to_str().unwrap(),
                     "ranges": [[{"subnet": "192.0.2.0/24"}], [{"subnet": "2001:db8::/64"}]]}
        })
        .to_string();
        let mut sides = vec![
            Side { name: "thereabouts".into(), bin: thab.clone(), conf: thab_conf, add: vec![], del: vec![], both: vec![] },
            Side { name: "host-local".into(), bin: HOST_LOCAL.into(), conf: hl_conf, add: vec![], del: vec![], both: vec![] },
        ];
        for (name, bin) in &also {
            let dir = tmp.sub(name);
            let conf = thereabouts_conf("1.0.0", "thab-bench", &dir, None, &["192.0.2.0/24", "2001:db8::/64"]).to_string();
            sides.push(Side { name: name.clone(), bin: bin.clone(), conf, add: vec![], del: vec![], both: vec![] });
        }
        for s in sides.iter_mut() {
            for k in 0..prefill {
                s.call("ADD", &format!("fill-{k}"));
            }
            for w in 0..10 {
                s.round(&format!("warm-{w}"), false);
            }
        }
        for r in 0..rounds {
            let cid = format!("bench-{r}");
            // Every side goes first equally often (two sides: alternating).
            let n = sides.len();
            for k in 0..n {
                sides[(r + k) % n].round(&cid, true);
            }
        }
        println!();
        println!("## scenario: data dirs under {} ({}), {prefill} live allocations per pool before measuring", base.display(), fs_type(base));
        println!("{:<12} {:>22} {:>22} {:>22}", "", "ADD median / p90", "DEL median / p90", "ADD+DEL median / p90");
        for s in &sides {
            let (a50, a90) = stats(&s.add);
            let (d50, d90) = stats(&s.del);
            let (b50, b90) = stats(&s.both);
            println!(
                "{:<12} {:>22} {:>22} {:>22}",
                s.name,
                format!("{} / {}", ms(a50), ms(a90)),
                format!("{} / {}", ms(d50), ms(d90)),
                format!("{} / {}", ms(b50), ms(b90))
            );
        }
        for (k, side) in sides.iter().enumerate().filter(|(k, _)| *k != 1) {
            let r = |f: fn(&Side) -> &Vec<Duration>, p: usize| {
                let (t50, t90) = stats(f(&sides[k]));
                let (h50, h90) = stats(f(&sides[1]));
                if p == 50 { t50.as_secs_f64() / h50.as_secs_f64() } else { t90.as_secs_f64() / h90.as_secs_f64() }
            };
            println!(
                "ratio {}/host-local: ADD {:.2}x, DEL {:.2}x, ADD+DEL {:.2}x (medians); ADD+DEL p90 {:.2}x  [target <= 0.50x]",
                side.name,
                r(|s| &s.add, 50),
                r(|s| &s.del, 50),
                r(|s| &s.both, 50),
                r(|s| &s.both, 90)
            );
        }
    }
    if conc.0 > 0 {
        concurrent(&thab, conc.0, conc.1, &std::env::temp_dir());
    }
}

/// W threads, each running M whole-process calls back to back, all against one store.
fn fan(side: &Side, cmd: &str, w: usize, m: usize) -> (Duration, Vec<Duration>) {
    let t = Instant::now();
    let mut all: Vec<Duration> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..w).map(|k| s.spawn(move || (0..m).map(|j| side.call(cmd, &format!("c-{k}-{j}"))).collect::<Vec<_>>())).collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let wall = t.elapsed();
    all.sort();
    (wall, all)
}

fn concurrent(thab: &Path, w: usize, m: usize, base: &Path) {
    let tmp = TempDir::new_in(base, "bench-conc");
    // W x M live addresses at once, in documentation ranges (checked when parsed: at most 253).
    let (v4, v6) = ("192.0.2.0/24", "2001:db8::/64");
    let thab_dir = tmp.sub("thereabouts");
    let hl_dir = tmp.sub("host-local");
    let sides = [
        Side {
            name: "thereabouts".into(),
            bin: thab.into(),
            conf: thereabouts_conf("1.0.0", "thab-bench", &thab_dir, None, &[v4, v6]).to_string(),
            add: vec![],
            del: vec![],
            both: vec![],
        },
        Side {
            name: "host-local".into(),
            bin: HOST_LOCAL.into(),
            conf: json!({"cniVersion": "1.0.0", "name": "thab-bench", "type": "thab-e2e",
                "ipam": {"type": "host-local", "dataDir": hl_dir.to_str().unwrap(), "ranges": [[{"subnet": v4}], [{"subnet": v6}]]}})
            .to_string(),
            add: vec![],
            del: vec![],
            both: vec![],
        },
    ];
    println!();
    println!(
        "## concurrency: {w} processes at once x {m} ADDs each, then the same DELs ({}, {}), data dirs under {} ({})",
        v4,
        v6,
        base.display(),
        fs_type(base)
    );
    println!("{:<12} {:>8} {:>8} {:>38} {:>38}", "", "ADD/s", "DEL/s", "ADD median / p90 / max", "DEL median / p90 / max");
    for side in &sides {
        let (aw, a) = fan(side, "ADD", w, m);
        let (dw, d) = fan(side, "DEL", w, m);
        let n = (w * m) as f64;
        let f = |v: &[Duration]| format!("{} / {} / {}", ms(percentile(v, 50.0)), ms(percentile(v, 90.0)), ms(*v.last().unwrap()));
        println!("{:<12} {:>8.1} {:>8.1} {:>38} {:>38}", side.name, n / aw.as_secs_f64(), n / dw.as_secs_f64(), f(&a), f(&d));
    }
}
