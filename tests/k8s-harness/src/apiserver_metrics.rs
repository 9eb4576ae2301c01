//! The apiserver's own request counters for the resources an IPAM plugin
//! uses, read from its `/metrics`: benchmark figures (`bench_k8s_burst`), not
//! assertions.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::plugin::GROUP_VERSION;

/// What the apiserver counted for the resources of [`counted_group`] in its
/// `/metrics`, summed over the other labels:
///
/// * `requests`: `apiserver_request_total` by (verb, resource, code): every
///   request that reached it;
/// * `etcd`: `etcd_request_duration_seconds_count` by (operation, resource): the
///   storage operations behind them — a PATCH the apiserver had to re-apply
///   because the object changed under it (`GuaranteedUpdate`) costs one etcd
///   `update` per attempt;
/// * `seconds`: `apiserver_request_duration_seconds_sum` by (verb, resource):
///   the time requests spent inside the apiserver.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestCounts {
    pub requests: BTreeMap<(String, String, String), f64>,
    pub etcd: BTreeMap<(String, String), f64>,
    pub seconds: BTreeMap<(String, String), f64>,
}

/// Whether an API group is counted: the pools' and reservations', and Leases',
/// which whereabouts takes for its global lock and thereabouts for its turns
/// (the apiserver's own identity Lease adds one renewal per 10 s).
pub fn counted_group(group: &str) -> bool {
    group == "coordination.k8s.io" || GROUP_VERSION.split('/').next() == Some(group)
}

/// The samples of metric `name` whose `group` label is a [`counted_group`].
fn group_samples<'a>(metrics: &'a str, name: &'a str) -> impl Iterator<Item = (HashMap<String, String>, f64)> + 'a {
    metrics.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = rest.rsplit_once("} ")?;
        let labels = parse_labels(labels);
        if !labels.get("group").is_some_and(|g| counted_group(g)) {
            return None;
        }
        Some((labels, value.trim().parse::<f64>().ok()?))
    })
}

fn minus<K: Ord + Clone>(now: &BTreeMap<K, f64>, before: &BTreeMap<K, f64>) -> BTreeMap<K, f64> {
    now.iter().map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0))).filter(|(_, v)| *v > 0.0).collect()
}

fn plus<K: Ord + Clone>(total: &mut BTreeMap<K, f64>, more: &BTreeMap<K, f64>) {
    for (k, v) in more {
        *total.entry(k.clone()).or_insert(0.0) += v;
    }
}

/// A sum from +0.0: an empty f64 sum is -0.0, printed "-0.00".
fn sum<'a>(values: impl Iterator<Item = &'a f64>) -> f64 {
    values.fold(0.0, |a, b| a + b)
}

impl RequestCounts {
    /// Parses the Prometheus text of `/metrics`.
    pub fn parse(metrics: &str) -> RequestCounts {
        let mut counts = RequestCounts::default();
        let key = |labels: &HashMap<String, String>, k: &str| labels.get(k).cloned().unwrap_or_default();
        for (l, v) in group_samples(metrics, "apiserver_request_total") {
            *counts.requests.entry((key(&l, "verb"), key(&l, "resource"), key(&l, "code"))).or_insert(0.0) += v;
        }
        for (l, v) in group_samples(metrics, "etcd_request_duration_seconds_count") {
            *counts.etcd.entry((key(&l, "operation"), key(&l, "resource"))).or_insert(0.0) += v;
        }
        for (l, v) in group_samples(metrics, "apiserver_request_duration_seconds_sum") {
            *counts.seconds.entry((key(&l, "verb"), key(&l, "resource"))).or_insert(0.0) += v;
        }
        counts
    }

    /// The counts of `self` minus those of `before` (an earlier scrape).
    pub fn since(&self, before: &RequestCounts) -> RequestCounts {
        RequestCounts {
            requests: minus(&self.requests, &before.requests),
            etcd: minus(&self.etcd, &before.etcd),
            seconds: minus(&self.seconds, &before.seconds),
        }
    }

    /// Adds `other`'s counts (another phase).
    pub fn add(&mut self, other: &RequestCounts) {
        plus(&mut self.requests, &other.requests);
        plus(&mut self.etcd, &other.etcd);
        plus(&mut self.seconds, &other.seconds);
    }

    /// Requests of `verb` to `resource` answered `code`.
    pub fn of(&self, verb: &str, resource: &str, code: &str) -> f64 {
        self.requests.get(&(verb.to_string(), resource.to_string(), code.to_string())).copied().unwrap_or(0.0)
    }

    pub fn total(&self) -> f64 {
        sum(self.requests.values())
    }

    /// Requests answered 409 (AlreadyExists, Conflict) or 422 (a failed JSON-patch test).
    pub fn conflicts(&self) -> f64 {
        sum(self.requests.iter().filter(|((_, _, code), _)| code == "409" || code == "422").map(|(_, v)| v))
    }

    /// Requests the apiserver answered with a server error (5xx: 500, 503
    /// overload, 504 timeout).
    pub fn server_errors(&self) -> f64 {
        sum(self.requests.iter().filter(|((_, _, code), _)| code.starts_with('5')).map(|(_, v)| v))
    }

    /// etcd writes (create, update, delete, including the apiserver's own retries).
    pub fn etcd_writes(&self) -> f64 {
        sum(self.etcd.iter().filter(|((op, _), _)| matches!(op.as_str(), "create" | "update" | "delete")).map(|(_, v)| v))
    }

    /// `VERB resource code` → count, for a breakdown.
    pub fn lines(&self) -> Vec<(String, f64)> {
        self.requests.iter().map(|((verb, resource, code), v)| (format!("{verb} {resource} {code}"), *v)).collect()
    }

    /// `operation resource` → count of etcd operations.
    pub fn etcd_lines(&self) -> Vec<(String, f64)> {
        self.etcd.iter().map(|((op, resource), v)| (format!("{op} {resource}"), *v)).collect()
    }

    /// `VERB resource` → mean time inside the apiserver.
    pub fn mean_durations(&self) -> Vec<(String, Duration)> {
        self.seconds
            .iter()
            .filter_map(|((verb, resource), secs)| {
                let n = sum(self.requests.iter().filter(|((v, r, _), _)| v == verb && r == resource).map(|(_, n)| n));
                (n > 0.0).then(|| (format!("{verb} {resource}"), Duration::from_secs_f64(secs / n)))
            })
            .collect()
    }
}

fn parse_labels(text: &str) -> HashMap<String, String> {
    // name="value",name="value" (values here hold no quotes or commas).
    let mut out = HashMap::new();
    for part in text.split("\",") {
        if let Some((k, v)) = part.split_once("=\"") {
            out.insert(k.trim().to_string(), v.trim_end_matches('"').to_string());
        }
    }
    out
}

/// Scrapes `/metrics` as admin (blocking: a private current-thread runtime).
pub struct Metrics {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
}

impl Metrics {
    pub fn admin(cluster: &crate::Cluster) -> Result<Metrics> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let client = runtime.block_on(cluster.admin_client())?;
        Ok(Metrics { runtime, client })
    }

    /// The Prometheus text of `/metrics`.
    pub fn text(&self) -> Result<String> {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        self.runtime.block_on(self.client.request_text(request)).context("GET /metrics")
    }

    pub fn requests(&self) -> Result<RequestCounts> {
        let text = self.text()?;
        let counts = RequestCounts::parse(&text);
        if !text.contains("apiserver_request_total") {
            bail!("/metrics has no apiserver_request_total");
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counts_parse_and_subtract() {
        let before = RequestCounts::parse(
            "# HELP apiserver_request_total x\n\
             apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"whereabouts.cni.cncf.io\",resource=\"ippools\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1alpha1\"} 3\n\
             apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1\"} 99\n",
        );
        let after = RequestCounts::parse(
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"whereabouts.cni.cncf.io\",resource=\"ippools\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1alpha1\"} 5\n\
             apiserver_request_total{code=\"422\",component=\"apiserver\",dry_run=\"\",group=\"whereabouts.cni.cncf.io\",resource=\"ippools\",scope=\"resource\",subresource=\"\",verb=\"PATCH\",version=\"v1alpha1\"} 1\n\
             apiserver_request_duration_seconds_sum{component=\"apiserver\",dry_run=\"\",group=\"whereabouts.cni.cncf.io\",resource=\"ippools\",scope=\"resource\",subresource=\"\",verb=\"PATCH\",version=\"v1alpha1\"} 0.5\n\
             etcd_request_duration_seconds_count{group=\"whereabouts.cni.cncf.io\",operation=\"update\",resource=\"ippools\"} 4\n\
             etcd_request_duration_seconds_count{group=\"whereabouts.cni.cncf.io\",operation=\"get\",resource=\"ippools\"} 2\n",
        );
        let d = after.since(&before);
        assert_eq!(d.total(), 3.0);
        assert_eq!(d.conflicts(), 1.0);
        assert_eq!(d.etcd_writes(), 4.0);
        assert_eq!(d.mean_durations(), [("PATCH ippools".to_string(), Duration::from_millis(500))]);
        assert_eq!(d.lines(), [("GET ippools 200".to_string(), 2.0), ("PATCH ippools 422".to_string(), 1.0)]);
    }
}
