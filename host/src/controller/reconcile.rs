//! One reconcile pass: read what the datastore holds, then the pods, decide
//! (`verdict.rs`), and free what the verdict names with guarded writes, each
//! after the write guard (`lease_guard.rs`) says this replica still leads.
//! Every freed address gets one log line naming why, a count in
//! `thereabouts_addresses_freed_total`, and an Event on its pod's namespace.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::api::Api;
use super::resource_claims::Unreserved;
use futures_util::future::join_all;

use super::held::{Entry, EntryIndex, Holdings, Reservation};
use super::kube_store::Written;
use super::lease_guard::WriteGuard;
use super::metrics::Metrics;
use super::pod_source::PodsAt;
use super::store::Store;
use super::verdict::{self, Reason, Rules, Verdict};
use crate::logging;
use anyhow::{Context, Result};
use thereabouts_allocator::model::Claim;

/// Which entries a pass looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every entry and reservation (at start, every interval, after a watch re-list).
    Full,
    /// Only those of these pods (`namespace/name`), after their delete events.
    Pods(BTreeSet<String>),
}

impl Scope {
    /// Its name in the metrics (one of [`super::metrics::PASS_KINDS`]).
    pub fn kind(&self) -> &'static str {
        let [full, pod_delete, _] = super::metrics::PASS_KINDS;
        match self {
            Scope::Full => full,
            Scope::Pods(_) => pod_delete,
        }
    }
}

/// What a pass freed (or, dry, would free).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub entries: Vec<(Entry, Reason)>,
    pub reservations: Vec<(Reservation, Reason)>,
    /// Left because they changed between the read and the write.
    pub changed_meanwhile: usize,
    pub without_podref: Vec<Entry>,
    pub pods_read: usize,
    /// When a pass should look again: the soonest a reservation seen without
    /// its entry has waited the unbacked grace (no event would tell).
    pub recheck_in: Option<Duration>,
}

/// Writes sent together after one check of the Lease: a replica that loses
/// its Lease stops before the next batch (this one is on its way).
pub const WRITES_AT_ONCE: usize = 4;
/// Pool writes sent together when the pools are small: the apiserver's cost
/// of a PATCH grows with the object it rewrites (~110 ms of CPU for 1 000
/// entries), so 16 node-slice pools of 60 entries cost less than one range's
/// pool, and 100 pods deleted over 100 nodes need 7 rounds, not 25.
pub const SMALL_WRITES_AT_ONCE: usize = 16;
/// Entries of the pools written together, at most (four 1 000-entry pools,
/// what [`WRITES_AT_ONCE`] was measured with); one pool at least.
const ENTRIES_IN_FLIGHT: u128 = 4_000;
/// Events posted together.
const EVENTS_AT_ONCE: usize = 16;

pub struct Reconciler {
    pub api: Api,
    pub store: Store,
    pub metrics: Metrics,
    pub guard: WriteGuard,
    pub completed_grace: Duration,
    pub add_budget: Duration,
    /// See [`Rules::unbacked_grace`].
    pub unbacked_grace: Duration,
    /// When this replica first saw each reservation without an entry.
    pub unbacked: Unbacked,
    /// When this replica first saw each ResourceClaim without a reservation.
    pub unreserved: Unreserved,
    /// Who reports the Events.
    pub identity: String,
}

impl Reconciler {
    /// One pass; `dry` decides without writing.
    pub async fn pass(&self, scope: &Scope, dry: bool) -> Result<Report> {
        let started = Instant::now();
        let outcome = self.pass_inner(scope, dry).await;
        self.metrics.pass(scope.kind(), outcome.is_ok(), started.elapsed());
        outcome
    }

    async fn pass_inner(&self, scope: &Scope, dry: bool) -> Result<Report> {
        // The datastore first, then the pods (whereabouts#207).
        let only = match scope {
            Scope::Full => None,
            Scope::Pods(podrefs) => Some(podrefs),
        };
        let mut held = self.store.read(only).await.context("reading the pools")?;
        self.unbacked.observe(&mut held, matches!(scope, Scope::Full));
        for failure in &held.unreadable_pools {
            logging::error(format!("controller: {failure}; left alone"));
        }
        if let Scope::Full = scope {
            let pools: Vec<_> = held.pools.iter().map(|p| (p.name.clone(), p.capacity, p.entries, p.without_podref)).collect();
            self.metrics.set_pools(self.store.kind(), &pools);
        }
        let pods = match scope {
            Scope::Full => {
                let wanted: HashSet<&str> =
                    held.entries.iter().map(|e| e.holder.pod_ref.as_str()).chain(held.reservations.iter().map(|r| r.podref.as_str())).collect();
                let mut pods = PodsAt::all(&self.api, &wanted).await.context("listing pods")?;
                // Claims only where a claim owns something: most clusters have none.
                let ipam_claim = |c: Option<&Claim>| matches!(c, Some(Claim::IpamClaim(_)));
                if held.entries.iter().any(|e| ipam_claim(e.holder.claim.as_ref())) || held.reservations.iter().any(|r| ipam_claim(r.claim.as_ref())) {
                    pods.read_ipam_claims(&self.api).await.context("listing IPAMClaims")?;
                }
                let resource_claim = |c: Option<&Claim>| matches!(c, Some(Claim::ResourceClaim(_)));
                if held.entries.iter().any(|e| resource_claim(e.holder.claim.as_ref())) || held.reservations.iter().any(|r| resource_claim(r.claim.as_ref())) {
                    pods.resource_claims = self.unreserved.read(&self.api).await.context("listing ResourceClaims")?;
                }
                pods
            }
            Scope::Pods(_) => {
                let named: BTreeSet<String> =
                    held.entries.iter().map(|e| e.holder.pod_ref.clone()).chain(held.reservations.iter().map(|r| r.podref.clone())).collect();
                PodsAt::only(&self.api, &named).await.context("reading pods")?
            }
        };
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        let rules = Rules { now, completed_grace: self.completed_grace, add_budget: self.add_budget, unbacked_grace: self.unbacked_grace };
        let verdict = verdict::decide(&held, &pods, rules);
        let recheck_in = held.reservations.iter().filter_map(|r| r.unbacked_for).filter(|d| *d < self.unbacked_grace).map(|d| self.unbacked_grace - d).min();
        let mut report = Report { without_podref: verdict.without_podref.clone(), pods_read: pods.len(), recheck_in, ..Report::default() };
        if dry {
            report.entries = verdict.entries;
            report.reservations = verdict.reservations;
            return Ok(report);
        }
        self.free(verdict, &held, &mut report).await?;
        Ok(report)
    }

    /// Frees what `verdict` names: the pools' entries, in batches of
    /// concurrent writes ([`pool_batches`]), then the reservations, in batches
    /// of [`WRITES_AT_ONCE`], each batch sent right after the write guard said
    /// this replica may write; then records the Events (not on the way to
    /// freeing anything).
    async fn free(&self, verdict: Verdict, held: &Holdings, report: &mut Report) -> Result<()> {
        let mut by_pool: BTreeMap<&str, Vec<&(Entry, Reason)>> = BTreeMap::new();
        for freed in &verdict.entries {
            by_pool.entry(freed.0.pool.as_ref()).or_default().push(freed);
        }
        let by_pool: Vec<(&str, Vec<&(Entry, Reason)>)> = by_pool.into_iter().collect();
        let sizes: HashMap<&str, u128> = held.pools.iter().map(|p| (p.name.as_str(), p.entries)).collect();
        // Entries whose removal did not happen keep their reservations.
        let mut kept: Vec<&Entry> = Vec::new();
        let mut events = Vec::new();
        for batch in pool_batches(&by_pool, |pool| sizes.get(pool).copied().unwrap_or(ENTRIES_IN_FLIGHT)) {
            self.guard.check().await.context("before removing entries")?;
            let writes = batch.iter().map(|(pool, freed)| {
                let entries: Vec<&Entry> = freed.iter().map(|(e, _)| e).collect();
                async move { self.store.remove_entries(pool, &entries).await.with_context(|| format!("removing entries of IPPool {pool}")) }
            });
            for ((pool, freed), written) in batch.iter().zip(join_all(writes).await) {
                for ((entry, reason), w) in freed.iter().zip(written?) {
                    match w {
                        Written::Done => {
                            let place = format!("IPPool {pool}");
                            logging::verbose(format!("controller: freed {} of pod {} in {place} ({})", entry.address, entry.holder.pod_ref, reason.describe()));
                            self.metrics.freed(reason.label());
                            events.push((entry.holder.pod_ref.clone(), entry.address.to_string(), place, *reason));
                            report.entries.push((entry.clone(), *reason));
                        }
                        Written::ChangedMeanwhile => {
                            report.changed_meanwhile += 1;
                            kept.push(entry);
                        }
                    }
                }
            }
        }
        let kept = EntryIndex::new(kept);
        let all = EntryIndex::for_reservations(&held.entries, &held.reservations);
        let reservations: Vec<(Reservation, Reason)> = verdict.reservations.into_iter().filter(|(r, _)| !kept.is_backed(r)).collect();
        for batch in reservations.chunks(WRITES_AT_ONCE) {
            self.guard.check().await.context("before deleting reservations")?;
            let deletes =
                batch.iter().map(|(r, _)| async move { self.store.delete_reservation(r).await.with_context(|| format!("deleting reservation {}", r.name)) });
            for ((r, reason), written) in batch.iter().zip(join_all(deletes).await) {
                match written? {
                    Written::Done => {
                        logging::verbose(format!("controller: freed reservation {} of {} ({})", r.name, r.podref, reason.describe()));
                        // An entry freed above already counted the address.
                        if !all.is_backed(r) {
                            self.metrics.freed(reason.label());
                        }
                        report.reservations.push((r.clone(), *reason));
                    }
                    Written::ChangedMeanwhile => report.changed_meanwhile += 1,
                }
            }
        }
        for batch in events.chunks(EVENTS_AT_ONCE) {
            let posts = batch.iter().map(|(podref, address, place, reason)| async move {
                if let Err(e) = super::events::record_freed(&self.api, podref, address, place, *reason, &self.identity).await {
                    logging::error(format!("controller: cannot record the Event for {address} of {podref}: {e}"));
                }
            });
            join_all(posts).await;
        }
        Ok(())
    }
}

/// `by_pool` cut into the batches written together: at most
/// [`SMALL_WRITES_AT_ONCE`] pools, and at most [`ENTRIES_IN_FLIGHT`] entries
/// in them (`size` of each pool), one pool at least.
fn pool_batches<'a, T>(by_pool: &'a [(&'a str, T)], size: impl Fn(&str) -> u128) -> Vec<&'a [(&'a str, T)]> {
    let mut batches = Vec::new();
    let (mut start, mut entries) = (0, 0u128);
    for (i, (pool, _)) in by_pool.iter().enumerate() {
        let n = size(pool);
        if i > start && (i - start == SMALL_WRITES_AT_ONCE || entries + n > ENTRIES_IN_FLIGHT) {
            batches.push(&by_pool[start..i]);
            (start, entries) = (i, 0);
        }
        entries += n;
    }
    if start < by_pool.len() {
        batches.push(&by_pool[start..]);
    }
    batches
}

/// When each reservation (by name, UID and version: a re-created one starts
/// over) was first seen without a pool entry holding its address. Kept in
/// memory: a replica that starts (or takes over) waits the whole grace again.
#[derive(Default)]
pub struct Unbacked(std::sync::Mutex<BTreeMap<(String, String, String), Instant>>);

impl Unbacked {
    /// Sets each reservation's `unbacked_for`. A full read also forgets the
    /// reservations it did not see unbacked; a partial one cannot tell.
    fn observe(&self, held: &mut Holdings, full: bool) {
        let now = Instant::now();
        let entries = EntryIndex::for_reservations(&held.entries, &held.reservations);
        let mut first_seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = BTreeMap::new();
        for r in &mut held.reservations {
            if entries.is_backed(r) {
                continue;
            }
            let key = (r.name.clone(), r.uid.clone(), r.version.clone());
            let since = *first_seen.get(&key).unwrap_or(&now);
            r.unbacked_for = Some(now - since);
            seen.insert(key, since);
        }
        if full {
            *first_seen = seen;
        } else {
            first_seen.extend(seen);
        }
    }
}

/// Unix seconds as `2026-12-01T22:33:42Z`.
pub fn rfc3339(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let rem = unix % 86_400;
    // Civil date from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn small_pools_are_written_sixteen_at_a_time_large_ones_four() {
        let pools: Vec<(String, ())> = (0..40).map(|i| (format!("p{i}"), ())).collect();
        let pools: Vec<(&str, ())> = pools.iter().map(|(n, u)| (n.as_str(), *u)).collect();
        let widths = |size: u128| super::pool_batches(&pools, |_| size).iter().map(|b| b.len()).collect::<Vec<_>>();
        assert_eq!(widths(60), [16, 16, 8]);
        assert_eq!(widths(1_000), [4; 10]);
        assert_eq!(widths(50_000), [1; 40], "a pool larger than the budget goes alone");
    }

    #[test]
    fn times_print_as_the_apiserver_reads_them() {
        assert_eq!(super::rfc3339(1_796_164_422), "2026-12-01T22:33:42Z");
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(crate::controller::pods::unix_seconds(&super::rfc3339(1_709_164_801)), Some(1_709_164_801));
    }
}
