//! What a burst of calls came to, for a test's assertion message or a line on
//! stderr: failures grouped by message, latency percentiles, a one-line summary.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use thereabouts_e2e::Outcome;

use crate::log_stats::LogStats;

/// A failure's message with numbers and names blurred (`#`), to group failures.
pub fn blurred_message(outcome: &Outcome) -> String {
    let error = serde_json::from_str::<Value>(&outcome.stdout).ok().and_then(|v| {
        let msg = v.get("msg")?.as_str()?;
        let blurred: Vec<&str> = msg.split(' ').map(|w| if w.chars().any(|c| c.is_ascii_digit()) { "#" } else { w }).collect();
        Some(format!("[code {}] {}", v.get("code")?, blurred.join(" ")))
    });
    match error {
        Some(e) => e,
        None if outcome.timed_out => "killed by the watchdog".to_string(),
        None => format!("no CNI error on stdout (exit {:?})", outcome.status.code()),
    }
}

/// The failed calls grouped by [`blurred_message`], most frequent first.
pub fn failure_summary(outcomes: &[Outcome]) -> Vec<(usize, String)> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| !o.ok()) {
        *counts.entry(blurred_message(o)).or_insert(0) += 1;
    }
    let mut v: Vec<(usize, String)> = counts.into_iter().map(|(m, n)| (n, m)).collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    v
}

/// One line about a burst: calls, rate, latency percentiles, and what the
/// plugins' logs count per call (`requests_of`: "API", "etcd").
pub fn summary(what: &str, outcomes: &[Outcome], wall: Duration, stats: &LogStats, requests_of: &str) -> String {
    let times: Vec<Duration> = outcomes.iter().map(|o| o.elapsed).collect();
    format!(
        "{what}: {} calls in {wall:.2?} ({:.0}/s); p50 {:.0?} p99 {:.0?} max {:.0?}; {:.1} {requests_of} requests and {:.2} re-plans per call (plugin logs)",
        outcomes.len(),
        outcomes.len() as f64 / wall.as_secs_f64(),
        percentile(&times, 50.0),
        percentile(&times, 99.0),
        percentile(&times, 100.0),
        stats.requests as f64 / outcomes.len() as f64,
        stats.replans as f64 / outcomes.len() as f64,
    )
}

/// Panics with the failures grouped by message and the first few in full
/// (everything needed to reproduce them).
pub fn expect_all_ok(outcomes: &[Outcome], what: &str) {
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.ok()).collect();
    if !failed.is_empty() {
        let groups: Vec<String> = failure_summary(outcomes).into_iter().map(|(n, m)| format!("  {n} × {m}")).collect();
        let shown: Vec<String> = failed.iter().take(3).map(|o| o.describe()).collect();
        panic!("{what}: {} of {} calls failed:\n{}\nfirst ones:\n{}", failed.len(), outcomes.len(), groups.join("\n"), shown.join("\n---\n"));
    }
}

/// Nearest-rank percentile of durations (`p` in 0..=100); zero when empty.
pub fn percentile(durations: &[Duration], p: f64) -> Duration {
    let mut sorted = durations.to_vec();
    sorted.sort();
    thereabouts_e2e::percentile(&sorted, p)
}

/// A latency for a table: whole milliseconds from 100 ms, else one decimal.
pub fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 100.0 { format!("{ms:.0} ms") } else { format!("{ms:.1} ms") }
}

/// `value` per call, two decimals.
pub fn per_call(value: f64, calls: usize) -> String {
    format!("{:.2}", value / calls.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_group_by_blurred_message() {
        use std::os::unix::process::ExitStatusExt;
        let outcome = |stdout: &str| Outcome {
            call: thereabouts_e2e::Call::pod("ADD", "c", "p"),
            status: std::process::ExitStatus::from_raw(256),
            stdout: stdout.to_string(),
            stderr: String::new(),
            started: std::time::Instant::now(),
            elapsed: Duration::ZERO,
            timed_out: false,
        };
        let a = outcome(
            r#"{"code": 11, "msg": "Kubernetes API server https://127.0.0.1:3456 unavailable while reading IPPool kube-system/192.0.2.0-24: no answer within 10000 ms"}"#,
        );
        let b = outcome(
            r#"{"code": 11, "msg": "Kubernetes API server https://127.0.0.1:3456 unavailable while reading IPPool kube-system/2001-db8---64: no answer within 9000 ms"}"#,
        );
        assert_eq!(blurred_message(&a), "[code 11] Kubernetes API server # unavailable while reading IPPool # no answer within # ms");
        assert_eq!(
            failure_summary(&[a, b, outcome("")]),
            [
                (2, "[code 11] Kubernetes API server # unavailable while reading IPPool # no answer within # ms".to_string()),
                (1, "no CNI error on stdout (exit Some(1))".to_string())
            ]
        );
    }
}
