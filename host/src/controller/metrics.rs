//! Every metric `thereabouts controller` exports, registered once in one
//! Prometheus registry (prefix `thereabouts`), so the loops only call small
//! methods on a shared [`Metrics`] and `/metrics` (`http.rs`) only calls
//! [`Metrics::encode`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolState {
    datastore: String,
    pool: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    datastore: String,
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PassLabels {
    kind: String,
    outcome: &'static str,
}

/// A label set of one label, the label named as the field.
macro_rules! one_label {
    ($name:ident, $label:ident) => {
        #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
        struct $name {
            $label: String,
        }
    };
}
one_label!(ReasonLabel, reason);
one_label!(KindLabel, kind);
one_label!(ClassLabel, class);

const STATES: [&str; 3] = ["capacity", "allocated", "free"];

/// The kinds of reconcile pass (`reconcile::Scope::kind`).
pub const PASS_KINDS: [&str; 3] = ["full", "pod_delete", "node_slices"];

fn duration_histogram() -> Histogram {
    // 1 ms doubling 16 times reaches 65.5 s: a pass over a handful of pools up to a full resync
    // against a slow API server.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    // An IPv6 pool holds up to 2^128 addresses: i64 cannot, f64 approximates.
    pool_addresses: Family<PoolState, Gauge<f64, AtomicU64>>,
    pool_entries_without_podref: Family<PoolLabel, Gauge>,
    freed: Family<ReasonLabel, Counter>,
    passes: Family<PassLabels, Counter>,
    pass_duration: Family<KindLabel, Histogram, fn() -> Histogram>,
    api_errors: Family<ClassLabel, Counter>,
    leader: Gauge,
    // The families cannot list their label sets, so the pools last reported are kept here to
    // drop the ones that went away.
    known_pools: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

/// The controller's metrics; cheap to clone (one shared registry).
#[derive(Clone, Debug)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("thereabouts");
        let pool_addresses = Family::<PoolState, Gauge<f64, AtomicU64>>::default();
        registry.register("pool_addresses", "Addresses of a pool by state (capacity, allocated, free)", pool_addresses.clone());
        let pool_entries_without_podref = Family::<PoolLabel, Gauge>::default();
        registry.register(
            "pool_entries_without_podref",
            "Allocations of a pool with an empty podref (written by very old clients), never freed by the controller",
            pool_entries_without_podref.clone(),
        );
        let freed = Family::<ReasonLabel, Counter>::default();
        registry.register("addresses_freed", "Addresses the controller freed, by reason", freed.clone());
        let passes = Family::<PassLabels, Counter>::default();
        registry.register("reconcile_passes", "Passes by kind (full, pod_delete, node_slices) and outcome (ok, failed)", passes.clone());
        // Every pass series from the start, at 0: an alert on failed passes then
        // selects a series before the first failure, and rate() sees the first one.
        for kind in PASS_KINDS {
            for outcome in ["ok", "failed"] {
                drop(passes.get_or_create(&PassLabels { kind: kind.to_string(), outcome }));
            }
        }
        let pass_duration = Family::<KindLabel, Histogram, fn() -> Histogram>::new_with_constructor(duration_histogram);
        registry.register_with_unit("reconcile_duration", "Duration of a reconcile pass, by kind", Unit::Seconds, pass_duration.clone());
        let api_errors = Family::<ClassLabel, Counter>::default();
        registry.register("api_errors", "Failed Kubernetes API requests, by class", api_errors.clone());
        let leader = Gauge::default();
        registry.register("leader", "1 while this replica holds the controller Lease, else 0", leader.clone());
        let inner = Inner {
            registry,
            pool_addresses,
            pool_entries_without_podref,
            freed,
            passes,
            pass_duration,
            api_errors,
            leader,
            known_pools: Mutex::new(BTreeMap::new()),
        };
        Metrics { inner: Arc::new(inner) }
    }

    /// Reports the pools of `datastore` (`kubernetes` or `etcd`), `(pool, capacity, allocated,
    /// entries without podref)`, and forgets every pool of it not in the list.
    pub fn set_pools(&self, datastore: &str, pools: &[(String, u128, u128, u64)]) {
        let inner = &self.inner;
        // A panic elsewhere while holding the lock leaves the set intact: keep using it.
        let mut known = inner.known_pools.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let current: BTreeSet<String> = pools.iter().map(|(pool, ..)| pool.clone()).collect();
        let label = |pool: &str| PoolLabel { datastore: datastore.to_string(), pool: pool.to_string() };
        let state = |pool: &str, state| PoolState { datastore: datastore.to_string(), pool: pool.to_string(), state };
        for gone in known.get(datastore).into_iter().flat_map(|k| k.difference(&current)) {
            for s in STATES {
                inner.pool_addresses.remove(&state(gone, s));
            }
            inner.pool_entries_without_podref.remove(&label(gone));
        }
        for (pool, capacity, allocated, without_podref) in pools {
            let free = capacity.saturating_sub(*allocated);
            // u128 as f64 rounds to nearest and cannot overflow (2^128 < f64::MAX).
            for (s, value) in [("capacity", *capacity), ("allocated", *allocated), ("free", free)] {
                inner.pool_addresses.get_or_create(&state(pool, s)).set(value as f64);
            }
            let without_podref = i64::try_from(*without_podref).unwrap_or(i64::MAX);
            inner.pool_entries_without_podref.get_or_create(&label(pool)).set(without_podref);
        }
        known.insert(datastore.to_string(), current);
    }

    pub fn freed(&self, reason: &str) {
        self.inner.freed.get_or_create(&ReasonLabel { reason: reason.to_string() }).inc();
    }

    pub fn freed_count(&self, reason: &str) -> u64 {
        self.inner.freed.get(&ReasonLabel { reason: reason.to_string() }).map(|c| c.get()).unwrap_or(0)
    }

    /// One pass of `kind` (one of [`PASS_KINDS`]) ended.
    pub fn pass(&self, kind: &str, ok: bool, duration: Duration) {
        let outcome = if ok { "ok" } else { "failed" };
        self.inner.passes.get_or_create(&PassLabels { kind: kind.to_string(), outcome }).inc();
        self.inner.pass_duration.get_or_create(&KindLabel { kind: kind.to_string() }).observe(duration.as_secs_f64());
    }

    pub fn api_error(&self, class: &str) {
        self.inner.api_errors.get_or_create(&ClassLabel { class: class.to_string() }).inc();
    }

    pub fn set_leader(&self, leading: bool) {
        self.inner.leader.set(i64::from(leading));
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        match prometheus_client::encoding::text::encode(&mut text, &self.inner.registry) {
            Ok(()) => text,
            // Only a failing writer can fail, and a String never does; if it ever did, a scrape
            // must see an invalid exposition rather than a partial one.
            Err(e) => format!("# error encoding the metrics: {e}\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The controller shares one Metrics between its tasks.
    const _: fn() = || {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Metrics>();
    };

    #[test]
    fn counters_appear_in_the_text() {
        let metrics = Metrics::new();
        metrics.freed("pod_gone");
        metrics.freed("pod_gone");
        metrics.freed("orphan_reservation");
        metrics.api_error("conflict");
        metrics.pass("full", true, Duration::from_millis(3));
        metrics.pass("pod_delete", false, Duration::from_secs(2));
        assert_eq!(metrics.freed_count("pod_gone"), 2);
        assert_eq!(metrics.freed_count("released_by_hand"), 0);
        let text = metrics.encode();
        assert!(text.contains("thereabouts_addresses_freed_total{reason=\"pod_gone\"} 2\n"), "{text}");
        assert!(text.contains("thereabouts_addresses_freed_total{reason=\"orphan_reservation\"} 1\n"), "{text}");
        assert!(text.contains("thereabouts_api_errors_total{class=\"conflict\"} 1\n"), "{text}");
        assert!(text.contains("thereabouts_reconcile_passes_total{kind=\"full\",outcome=\"ok\"} 1\n"), "{text}");
        assert!(text.contains("thereabouts_reconcile_passes_total{kind=\"pod_delete\",outcome=\"failed\"} 1\n"), "{text}");
        assert!(text.contains("thereabouts_reconcile_duration_seconds_count{kind=\"full\"} 1\n"), "{text}");
        assert!(text.contains("thereabouts_reconcile_duration_seconds_bucket{le=\"0.004\",kind=\"full\"} 1\n"), "{text}");
        assert!(text.contains("# TYPE thereabouts_reconcile_duration_seconds histogram\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn every_pass_series_exists_at_zero_before_the_first_pass() {
        let text = Metrics::new().encode();
        for kind in PASS_KINDS {
            for outcome in ["ok", "failed"] {
                assert!(text.contains(&format!("thereabouts_reconcile_passes_total{{kind=\"{kind}\",outcome=\"{outcome}\"}} 0\n")), "{text}");
            }
        }
    }

    #[test]
    fn pools_are_set_and_dropped() {
        let metrics = Metrics::new();
        metrics.set_pools("kubernetes", &[("192.0.2.0-24".to_string(), 254, 10, 1), ("2001-db8---64".to_string(), 1 << 64, 3, 0)]);
        metrics.set_pools("etcd", &[("198.51.100.0-24".to_string(), 254, 1, 0)]);
        let text = metrics.encode();
        let pool = r#"datastore="kubernetes",pool="192.0.2.0-24""#;
        assert!(text.contains(&format!("thereabouts_pool_addresses{{{pool},state=\"capacity\"}} 254.0\n")), "{text}");
        assert!(text.contains(&format!("thereabouts_pool_addresses{{{pool},state=\"allocated\"}} 10.0\n")), "{text}");
        assert!(text.contains(&format!("thereabouts_pool_addresses{{{pool},state=\"free\"}} 244.0\n")), "{text}");
        assert!(text.contains(&format!("thereabouts_pool_entries_without_podref{{{pool}}} 1\n")), "{text}");
        assert!(text.contains("pool=\"2001-db8---64\",state=\"capacity\"}"), "{text}");

        metrics.set_pools("kubernetes", &[("2001-db8---64".to_string(), u128::MAX, u128::MAX, u64::MAX)]);
        let text = metrics.encode();
        assert!(!text.contains("192.0.2.0-24") && text.contains("198.51.100.0-24"), "another datastore's pools stay: {text}");
        assert!(text.contains("pool=\"2001-db8---64\",state=\"free\"} 0.0\n"), "{text}");
        assert!(text.contains(&format!("pool=\"2001-db8---64\"}} {}\n", i64::MAX)), "{text}");

        metrics.set_pools("kubernetes", &[]);
        metrics.set_pools("etcd", &[]);
        assert!(!metrics.encode().contains("pool="));
    }

    #[test]
    fn leader_flips() {
        let metrics = Metrics::new();
        assert!(metrics.encode().contains("thereabouts_leader 0\n"));
        metrics.set_leader(true);
        assert!(metrics.encode().contains("thereabouts_leader 1\n"));
        metrics.set_leader(false);
        assert!(metrics.encode().contains("thereabouts_leader 0\n"));
    }
}
