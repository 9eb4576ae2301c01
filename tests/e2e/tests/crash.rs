//! Crash safety: SIGKILL plugin processes at random points of ADD and DEL (several at once,
//! so kills also land while others wait on the store), and after every round check that
//! the store is still sound:
//! - every pool file parses (no torn write), no address is held twice;
//! - no committed allocation was lost (every ADD that completed is still exactly in the files);
//! - every entry belongs to an attachment the test created (completed or killed);
//! - the next calls still complete (a killed holder does not leave a stale lock).
//!
//! Then GC with the attachments the test believes alive must free whatever the killed
//! calls left, and DEL of the survivors empties the pools.
//!
//! Knob: `THAB_E2E_CRASH_TRIALS` (default 400 killed-or-not calls).

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;
use thereabouts_e2e::*;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    Add,
    Del,
}

enum Fate {
    Done(Box<Outcome>),
    Killed,
}

/// Runs the call and SIGKILLs it if it is still running after `delay`.
fn run_and_maybe_kill(bin: &Path, call: &Call, conf: &str, delay: Duration) -> Fate {
    let outcome = Invocation::new(call.clone(), conf).watchdog(delay).run(bin);
    if outcome.timed_out { Fate::Killed } else { Fate::Done(Box::new(outcome)) }
}

struct World {
    /// completed ADDs not deleted since: cid -> addresses from the result
    alive: BTreeMap<String, Vec<IpAddr>>,
    /// attachments whose last call was killed or failed: may or may not hold addresses
    uncertain: BTreeSet<String>,
}

fn verify(data: &Path, w: &World, when: &str) -> usize {
    let (pools, _) = read_store(data).unwrap_or_else(|e| panic!("{when}: {e}"));
    let by_addr = check_unique(&pools).unwrap_or_else(|e| panic!("{when}: {e}"));
    let mut held: BTreeMap<&str, BTreeSet<IpAddr>> = BTreeMap::new();
    for (a, e) in &by_addr {
        held.entry(e.id.as_str()).or_default().insert(*a);
        assert!(
            w.alive.contains_key(&e.id) || w.uncertain.contains(&e.id),
            "{when}: {a} is held by {:?}, which the test never saw allocate (and never left half-done)",
            e.id
        );
    }
    for (cid, ips) in &w.alive {
        let want: BTreeSet<IpAddr> = ips.iter().copied().collect();
        let got = held.get(cid.as_str()).cloned().unwrap_or_default();
        assert_eq!(got, want, "{when}: completed ADD {cid} got {want:?} but the pool files now hold {got:?} for it (lost or changed allocation)");
    }
    by_addr.values().filter(|e| w.uncertain.contains(&e.id)).count()
}

#[test]
fn sigkill_during_add_and_del_keeps_the_store_sound_and_gc_frees_the_leftovers() {
    let bin = thereabouts_bin();
    let trials = knob("THAB_E2E_CRASH_TRIALS", 400);
    let lanes = 4;
    let tmp = TempDir::new("crash");
    let data = tmp.sub("data");
    let conf_v = thereabouts_conf("1.1.0", "thab-crash", &data, None, &["192.0.2.0/24", "2001:db8:cc::/64"]);
    let conf = conf_v.to_string();

    // Calibrate the kill window on this machine: about twice a contended ADD.
    let mut d: Vec<Duration> = (0..6)
        .map(|i| {
            let o = Call::pod("ADD", &format!("calib-{i}"), &format!("calib-{i}")).run(&bin, &conf);
            o.expect_ok("calibration ADD");
            o.elapsed
        })
        .collect();
    for i in 0..6 {
        Call::pod("DEL", &format!("calib-{i}"), &format!("calib-{i}")).run(&bin, &conf).expect_ok("calibration DEL");
    }
    d.sort();
    let mut window_us = (percentile(&d, 50.0).as_micros() as u64 * 2 * lanes as u64 / 2).max(3000);
    let first_window = window_us;

    let mut w = World { alive: BTreeMap::new(), uncertain: BTreeSet::new() };
    let (mut add_killed, mut add_done, mut del_killed, mut del_done) = (0usize, 0usize, 0usize, 0usize);
    let mut errors: Vec<String> = Vec::new();
    let mut next = 0usize;
    let mut max_uncertain_entries = 0usize;
    let mut ran = 0usize;
    while ran < trials {
        // Plan one round: up to `lanes` calls at once on distinct attachments.
        let mut plan: Vec<(Op, String)> = Vec::new();
        let mut busy = BTreeSet::new();
        for _ in 0..lanes {
            let del_candidates: Vec<String> = w.alive.keys().chain(w.uncertain.iter()).filter(|c| !busy.contains(*c)).cloned().collect();
            let want_del = !del_candidates.is_empty() && (fastrand::f32() < 0.4 || w.alive.len() + w.uncertain.len() > 150);
            let (op, cid) = if want_del {
                (Op::Del, del_candidates[fastrand::usize(..del_candidates.len())].clone())
            } else {
                next += 1;
                (Op::Add, format!("crash-{next}"))
            };
            busy.insert(cid.clone());
            plan.push((op, cid));
        }
        // A call in flight is uncertain until we know how it ended.
        for (_, cid) in &plan {
            w.alive.remove(cid);
            w.uncertain.insert(cid.clone());
        }
        let fates: Vec<(Op, String, Fate)> = std::thread::scope(|s| {
            let hs: Vec<_> = plan
                .iter()
                .map(|(op, cid)| {
                    let (bin, conf) = (&bin, &conf);
                    let delay = Duration::from_micros(fastrand::u64(0..=window_us));
                    s.spawn(move || {
                        let call = Call::pod(if *op == Op::Add { "ADD" } else { "DEL" }, cid, cid);
                        (*op, cid.clone(), run_and_maybe_kill(bin, &call, conf, delay))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut killed_now = 0;
        for (op, cid, fate) in fates {
            ran += 1;
            match (op, fate) {
                (Op::Add, Fate::Killed) => {
                    add_killed += 1;
                    killed_now += 1;
                }
                (Op::Del, Fate::Killed) => {
                    del_killed += 1;
                    killed_now += 1;
                }
                (Op::Add, Fate::Done(o)) => {
                    add_done += 1;
                    if o.ok() {
                        let ips = o.ips().iter().map(|s| addr_of(s)).collect::<Vec<_>>();
                        assert_eq!(ips.len(), 2, "{}", o.describe());
                        w.uncertain.remove(&cid);
                        w.alive.insert(cid, ips);
                    } else {
                        errors.push(o.describe());
                    }
                }
                (Op::Del, Fate::Done(o)) => {
                    del_done += 1;
                    if o.ok() {
                        w.uncertain.remove(&cid);
                    } else {
                        errors.push(o.describe());
                    }
                }
            }
        }
        // Everything of this round is dead now: the store must be sound.
        max_uncertain_entries = max_uncertain_entries.max(verify(&data, &w, &format!("after {ran} trials")));
        // Keep roughly half of the calls killed.
        if killed_now * 4 > plan.len() * 3 {
            window_us = window_us * 5 / 4;
        } else if killed_now * 4 < plan.len() {
            window_us = (window_us * 4 / 5).max(500);
        }
    }
    assert!(
        errors.is_empty(),
        "{} calls that were not killed failed (after earlier kills); first:\n{}",
        errors.len(),
        errors.iter().take(3).cloned().collect::<Vec<_>>().join("\n---\n")
    );
    assert!(add_killed >= trials / 10 && del_killed >= trials / 20, "too few kills to mean anything (ADD killed {add_killed}, DEL killed {del_killed})");
    assert!(add_done >= trials / 10, "too few calls completed between kills ({add_done} ADDs): a killed call may leave the store locked");

    // Leftover temp/lock files must not break anything: a fresh ADD (bounded by CALL_TIMEOUT) works.
    let (_, others) = read_store(&data).unwrap();
    let fresh = Call::pod("ADD", "crash-fresh", "crash-fresh").run(&bin, &conf);
    fresh.expect_ok("ADD after the crash trials");
    w.alive.insert("crash-fresh".into(), fresh.ips().iter().map(|s| addr_of(s)).collect());
    let before_gc = verify(&data, &w, "before GC");

    // GC with the attachments the test believes alive frees whatever the killed calls left.
    let mut gc_conf: Value = conf_v.clone();
    gc_conf["cni.dev/valid-attachments"] = Value::Array(w.alive.keys().map(|c| json!({"containerID": c, "ifname": "eth0"})).collect());
    Call::global("GC").run(&bin, &gc_conf.to_string()).expect_ok("GC");
    // Counted while the killed calls' attachments are still known as such.
    let after_gc = verify(&data, &w, "after GC");
    assert_eq!(after_gc, 0, "GC left {after_gc} entries of killed calls");
    let uncertain_n = w.uncertain.len();
    w.uncertain.clear(); // from now on, only the alive ones may hold addresses
    verify(&data, &w, "after GC, with only the alive attachments known");
    let (pools, _) = read_store(&data).unwrap();
    assert_eq!(count_allocs(&pools), 2 * w.alive.len(), "after GC only the alive attachments may hold addresses");

    // DEL of the survivors empties the pools.
    for cid in w.alive.keys() {
        Call::pod("DEL", cid, cid).run(&bin, &conf).expect_ok("DEL after GC");
    }
    let (pools, others_end) = read_store(&data).unwrap();
    assert_eq!(count_allocs(&pools), 0, "allocations left after DEL of every survivor");

    println!(
        "crash: {ran} trials ({lanes} at a time, kill window 0..{first_window}us initially, {window_us}us at the end): \
         ADD killed {add_killed} / completed {add_done}, DEL killed {del_killed} / completed {del_done}; every pool file parsed after every round, \
         0 duplicates, 0 lost allocations; at most {max_uncertain_entries} addresses held by killed calls at a time, {before_gc} before GC, \
         {after_gc} after GC ({uncertain_n} uncertain attachments, {} alive kept); non-pool files left in the data dir: {} ({:?}), {} at the end",
        w.alive.len(),
        others.len(),
        others.iter().take(5).map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect::<Vec<_>>(),
        others_end.len()
    );
}
