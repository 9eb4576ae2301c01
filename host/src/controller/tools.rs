//! The reconciler's tools for a person at a terminal, each run once and
//! answered with a report the CLI (`cli.rs`) prints:
//! - `thereabouts reconcile`: one full pass of the controller's reconciler
//!   (`reconcile.rs`), dry or real, without leader election;
//! - `thereabouts release`: frees a pod's or an address's entries by hand,
//!   through the same guarded writes as a pass (`store.rs`), without asking
//!   whether the pod exists: the person decided;
//! - `thereabouts pools --check`: what is inconsistent in the datastore
//!   ([`check`], pure, so each kind of finding is pinned by a test below).
//!
//! They work on the shared datastore of a network config, opened in one place
//! ([`open_store`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use thereabouts_allocator::model::{DatastoreSettings, NormalizedConfig};

use super::api::Api;
use super::held::{Entry, EntryIndex, Holdings, Reservation};
use super::kube_store::Written;
use super::lease_guard::WriteGuard;
use super::metrics::Metrics;
use super::reconcile::{Report, Scope};
use super::store::Store;
use super::verdict::Reason;
use crate::datastore::kubernetes::kubeconfig;

/// Runs `work` on a current-thread runtime, as `controller::run` does.
pub fn block_on<T>(work: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the tokio runtime")?;
    runtime.block_on(work)
}

/// The datastore of `config` and the client that reads pods (and records
/// Events): `kubeconfig`, else the datastore's own.
pub async fn open(config: &NormalizedConfig, kubeconfig: Option<&Path>, identity: &str) -> Result<(Store, kube::Client)> {
    let (store, own) = open_store(config, identity).await?;
    let path = kubeconfig.or(own.as_deref()).context("this datastore has no kubeconfig: name one that may read pods with --kubeconfig")?;
    let pods = super::client(Some(path), identity).await.context("the client that reads pods")?;
    Ok((store, pods))
}

/// The datastore of `config`, and the kubeconfig it is reached with (if any):
/// the one place that knows which datastores these tools serve.
pub async fn open_store(config: &NormalizedConfig, identity: &str) -> Result<(Store, Option<PathBuf>)> {
    match served(&config.datastore)? {
        Served::Kubernetes(path) => {
            let (_, namespace) = kubeconfig::read(&path).map_err(|e| anyhow!("kubeconfig {}: {e}", path.display()))?;
            let client = super::client(Some(&path), identity).await?;
            Ok((super::kube_store(client, &Metrics::new(), &namespace), Some(path)))
        }
        Served::Etcd => {
            let store = super::etcd_store::EtcdStore::connect(&config.datastore).await?;
            Ok((Store::Etcd(Box::new(store)), None))
        }
    }
}

/// A shared datastore these tools serve.
#[derive(Debug, PartialEq, Eq)]
enum Served {
    /// Its kubeconfig.
    Kubernetes(PathBuf),
    Etcd,
}

/// Which shared datastore `settings` names; an error naming why for any other.
fn served(settings: &DatastoreSettings) -> Result<Served> {
    let kubeconfig = settings.kubeconfig.as_deref().filter(|k| !k.is_empty());
    match (settings.kind.as_deref(), kubeconfig) {
        // As the plugin does: a kubeconfig alone means the Kubernetes datastore.
        (Some("kubernetes") | None, Some(path)) => Ok(Served::Kubernetes(PathBuf::from(path))),
        (Some("kubernetes"), None) => bail!("the kubernetes datastore needs \"kubernetes\": {{\"kubeconfig\": \"<path>\"}} in the ipam section"),
        (Some("etcd"), _) => Ok(Served::Etcd),
        (Some("file"), _) => {
            bail!("datastore file: node-local pools, freed by the plugin's own checks; this command serves a shared datastore (kubernetes or etcd)")
        }
        (Some(other), _) => bail!("unknown datastore {other:?}"),
        (None, None) => bail!("ipam.datastore is not set: this command serves the kubernetes and etcd datastores"),
    }
}

/// `namespace/name`, as a `--pod` value.
pub fn parse_podref(text: &str) -> Result<String, String> {
    match text.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains('/') => Ok(text.to_string()),
        _ => Err(format!("{text:?} is no NAMESPACE/NAME")),
    }
}

// ---- reconcile ----

/// One entry a pass freed (or would free), or left without a podref.
#[derive(Debug, Clone, Serialize)]
pub struct EntryRow {
    pub address: String,
    pub pool: String,
    pub podref: String,
    pub ifname: String,
    pub container_id: String,
    /// The metric's `reason` label (empty for an entry left alone).
    pub reason: &'static str,
    pub why: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReservationRow {
    pub name: String,
    pub podref: String,
    pub reason: &'static str,
    pub why: &'static str,
}

/// `reconcile --output json`.
#[derive(Debug, Clone, Serialize)]
pub struct ReconcileReport {
    pub datastore: String,
    pub dry_run: bool,
    pub pods_read: usize,
    pub entries: Vec<EntryRow>,
    pub reservations: Vec<ReservationRow>,
    /// Left because they changed between the read and the write.
    pub changed_meanwhile: usize,
    /// Never freed on a guess: no `namespace/name` to look the pod up by.
    pub without_podref: Vec<EntryRow>,
}

impl ReconcileReport {
    /// 0 when nothing was (or would be) freed, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        u8::from(!self.entries.is_empty() || !self.reservations.is_empty() || self.changed_meanwhile > 0)
    }
}

/// One full pass. A real one writes unguarded (no Lease): its writes are the
/// guarded ones of every pass, which leave what changed since the read, so a
/// controller running at the same time costs only "changed meanwhile".
pub async fn reconcile(store: Store, pods: kube::Client, dry: bool, completed_grace: Duration, identity: &str) -> Result<ReconcileReport> {
    let datastore = store.describe();
    // One pass remembers nothing: a reservation without its entry is freed
    // when seen (a person decided to run it; the controller waits instead).
    let mut reconciler = super::reconciler(pods, Metrics::new(), store, identity, WriteGuard::Unguarded, completed_grace, Duration::ZERO);
    // One pass by hand sees each claim once: unreserved now is unreserved.
    reconciler.unreserved = super::resource_claims::Unreserved::new(Duration::ZERO);
    let report = reconciler.pass(&Scope::Full, dry).await?;
    Ok(reconcile_report(datastore, dry, report))
}

fn entry_row(e: &Entry, reason: Option<Reason>) -> EntryRow {
    EntryRow {
        address: e.address.to_string(),
        pool: e.pool.to_string(),
        podref: e.holder.pod_ref.clone(),
        ifname: e.holder.ifname.clone(),
        container_id: e.holder.container_id.clone(),
        reason: reason.map_or("", Reason::label),
        why: reason.map_or("no namespace/name podref: never freed on a guess", Reason::describe),
    }
}

fn reconcile_report(datastore: String, dry_run: bool, report: Report) -> ReconcileReport {
    ReconcileReport {
        datastore,
        dry_run,
        pods_read: report.pods_read,
        entries: report.entries.iter().map(|(e, reason)| entry_row(e, Some(*reason))).collect(),
        reservations: report
            .reservations
            .iter()
            .map(|(r, reason)| ReservationRow { name: r.name.clone(), podref: r.podref.clone(), reason: reason.label(), why: reason.describe() })
            .collect(),
        changed_meanwhile: report.changed_meanwhile,
        without_podref: report.without_podref.iter().map(|e| entry_row(e, None)).collect(),
    }
}

// ---- release ----

/// What `release` frees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Every entry of the pod (`namespace/name`), and its reservations.
    Pod(String),
    /// The entries holding the address (of one pool when named).
    Address { address: IpAddr, pool: Option<String> },
}

/// What a guarded write did, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Freed,
    ChangedMeanwhile,
}

impl Outcome {
    fn of(w: Written) -> Outcome {
        match w {
            Written::Done => Outcome::Freed,
            Written::ChangedMeanwhile => Outcome::ChangedMeanwhile,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Freed => "freed",
            Outcome::ChangedMeanwhile => "changed meanwhile, left",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Released<T> {
    #[serde(flatten)]
    pub what: T,
    pub outcome: Outcome,
}

/// `release --output json`.
#[derive(Debug, Clone, Serialize)]
pub struct ReleaseReport {
    pub datastore: String,
    pub entries: Vec<Released<EntryRow>>,
    pub reservations: Vec<Released<ReservationRow>>,
}

impl ReleaseReport {
    /// 0 when something was freed and nothing changed meanwhile, else 1.
    pub fn exit_code(&self) -> u8 {
        let outcomes: Vec<Outcome> = self.entries.iter().map(|e| e.outcome).chain(self.reservations.iter().map(|r| r.outcome)).collect();
        u8::from(outcomes.is_empty() || outcomes.contains(&Outcome::ChangedMeanwhile))
    }
}

/// The entries `target` names. An address held by more than one attachment
/// (two networks, or a duplicate `pools --check` reports) is an error unless a
/// pool narrows it: freeing them all would free another pod's address.
pub fn entries_of<'a>(held: &'a Holdings, target: &Target) -> Result<Vec<&'a Entry>> {
    let picked: Vec<&Entry> = held
        .entries
        .iter()
        .filter(|e| match target {
            Target::Pod(podref) => e.holder.pod_ref == *podref,
            Target::Address { address, pool } => e.address == *address && pool.as_ref().is_none_or(|p| *e.pool == **p),
        })
        .collect();
    if let Target::Address { address, .. } = target {
        let holders: BTreeSet<_> = picked.iter().map(|e| attachment(e)).collect();
        if holders.len() > 1 {
            let held_by: Vec<String> = picked.iter().map(|e| format!("{} in IPPool {}", e.holder.pod_ref, e.pool)).collect();
            bail!("{address} is held by more than one attachment ({}): name the pool with --pool", held_by.join(", "));
        }
    }
    Ok(picked)
}

/// The reservations to delete once `freed` are gone: theirs, and for a pod
/// every one of it, except those of an entry that changed meanwhile (`kept`),
/// which someone else holds now.
pub fn reservations_of<'a>(held: &'a Holdings, target: &Target, freed: &[&Entry], kept: &[&Entry]) -> Vec<&'a Reservation> {
    held.reservations
        .iter()
        .filter(|r| freed.iter().any(|e| r.backs(e)) || matches!(target, Target::Pod(p) if r.podref == *p))
        .filter(|r| !kept.iter().any(|e| r.backs(e)))
        .collect()
}

/// Frees `target` by hand; `events` records an Event on each freed entry's
/// pod (best effort: a person's identity may not create Events).
pub async fn release(store: &Store, events: kube::Client, target: &Target, identity: &str) -> Result<ReleaseReport> {
    let held = store.read(None).await.context("reading the pools")?;
    let picked = entries_of(&held, target)?;
    let mut by_pool: BTreeMap<&str, Vec<&Entry>> = BTreeMap::new();
    for e in &picked {
        by_pool.entry(e.pool.as_ref()).or_default().push(e);
    }
    let events = Api { client: events, metrics: Metrics::new() };
    let mut report = ReleaseReport { datastore: store.describe(), entries: Vec::new(), reservations: Vec::new() };
    let (mut freed, mut kept) = (Vec::new(), Vec::new());
    for (pool, entries) in by_pool {
        let written = store.remove_entries(pool, &entries).await.with_context(|| format!("removing entries of IPPool {pool}"))?;
        for (e, w) in entries.into_iter().zip(written) {
            let outcome = Outcome::of(w);
            match outcome {
                Outcome::Freed => {
                    record_event(&events, e, identity).await;
                    freed.push(e);
                }
                Outcome::ChangedMeanwhile => kept.push(e),
            }
            report.entries.push(Released { what: entry_row(e, Some(Reason::ReleasedByHand)), outcome });
        }
    }
    for r in reservations_of(&held, target, &freed, &kept) {
        let written = store.delete_reservation(r).await.with_context(|| format!("deleting reservation {}", r.name))?;
        let what =
            ReservationRow { name: r.name.clone(), podref: r.podref.clone(), reason: Reason::ReleasedByHand.label(), why: Reason::ReleasedByHand.describe() };
        report.reservations.push(Released { what, outcome: Outcome::of(written) });
    }
    Ok(report)
}

/// The Event the controller records for an address it frees, saying it was
/// freed by hand.
async fn record_event(api: &Api, e: &Entry, identity: &str) {
    let place = format!("IPPool {}", e.pool);
    if let Err(err) = super::events::record_freed(api, &e.holder.pod_ref, &e.address.to_string(), &place, Reason::ReleasedByHand, identity).await {
        crate::logging::error(format!("freed {} of {}, but cannot record its Event: {err}", e.address, e.holder.pod_ref));
    }
}

// ---- pools --check ----

/// A kind of inconsistency `pools --check` finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Problem {
    /// A pool, or a key of one, that could not be read: left alone by every pass.
    Unreadable,
    /// One address held by two attachments in overlapping pools of one network.
    DuplicateAddress,
    /// With overlapping ranges on, an entry no reservation protects.
    EntryWithoutReservation,
    /// A reservation no entry holds: an ADD in flight, or a leak.
    ReservationWithoutEntry,
    /// An entry without a `namespace/name` podref: never freed by the reconciler.
    WithoutPodref,
}

impl Problem {
    pub fn label(self) -> &'static str {
        match self {
            Problem::Unreadable => "unreadable",
            Problem::DuplicateAddress => "duplicate_address",
            Problem::EntryWithoutReservation => "entry_without_reservation",
            Problem::ReservationWithoutEntry => "reservation_without_entry",
            Problem::WithoutPodref => "without_podref",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub problem: Problem,
    pub address: Option<String>,
    /// The pool(s) or the reservation.
    pub place: String,
    pub podref: String,
    pub detail: String,
}

/// `pools --check --output json`.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub datastore: String,
    pub pools: usize,
    pub entries: usize,
    pub reservations: usize,
    pub findings: Vec<Finding>,
}

impl CheckReport {
    pub fn exit_code(&self) -> u8 {
        u8::from(!self.findings.is_empty())
    }
}

/// Reads every pool and reservation of `store` and checks them.
pub async fn check_store(store: &Store, overlapping_ranges: bool) -> Result<CheckReport> {
    let held = store.read(None).await.context("reading the pools")?;
    let findings = check(&held, overlapping_ranges);
    Ok(CheckReport { datastore: store.describe(), pools: held.pools.len(), entries: held.entries.len(), reservations: held.reservations.len(), findings })
}

/// Every inconsistency of `held`, by kind. Entries without a reservation
/// count only with `overlapping_ranges` on: without it the plugin writes none.
pub fn check(held: &Holdings, overlapping_ranges: bool) -> Vec<Finding> {
    let index = EntryIndex::new(&held.entries);
    let mut findings = unreadable(held);
    findings.extend(duplicates(held));
    if overlapping_ranges {
        let protected: std::collections::HashSet<(&str, &str)> =
            held.reservations.iter().flat_map(|r| index.backed_by(r)).map(|e| (e.pool.as_ref(), e.key.as_str())).collect();
        let unprotected = held.entries.iter().filter(|e| !protected.contains(&(e.pool.as_ref(), e.key.as_str())));
        let why = "no OverlappingRangeIPReservation protects it: an overlapping range may hand it out again";
        findings.extend(unprotected.map(|e| entry_finding(Problem::EntryWithoutReservation, e, why.into())));
    }
    findings.extend(held.reservations.iter().filter(|r| !index.is_backed(r)).map(reservation_without_entry));
    let without_podref = held.entries.iter().filter(|e| !e.holder.pod_ref.contains('/') && e.holder.claim.is_none());
    findings.extend(
        without_podref.map(|e| entry_finding(Problem::WithoutPodref, e, format!("container {:?}: the reconciler never frees it", e.holder.container_id))),
    );
    findings
}

fn entry_finding(problem: Problem, e: &Entry, detail: String) -> Finding {
    Finding { problem, address: Some(e.address.to_string()), place: e.pool.to_string(), podref: e.holder.pod_ref.clone(), detail }
}

fn unreadable(held: &Holdings) -> Vec<Finding> {
    let whole = held.unreadable_pools.iter().map(|why| Finding {
        problem: Problem::Unreadable,
        address: None,
        place: String::new(),
        podref: String::new(),
        detail: why.clone(),
    });
    let keys = held.pools.iter().flat_map(|p| {
        p.unreadable.iter().map(|why| Finding {
            problem: Problem::Unreadable,
            address: None,
            place: p.name.clone(),
            podref: String::new(),
            detail: why.clone(),
        })
    });
    whole.chain(keys).collect()
}

fn reservation_without_entry(r: &Reservation) -> Finding {
    let age = match r.age {
        Some(age) if age < super::ADD_BUDGET => format!("created {} s ago: may be an ADD in flight", age.as_secs()),
        Some(age) => format!("created {} s ago", age.as_secs()),
        None => "age unknown".into(),
    };
    Finding {
        problem: Problem::ReservationWithoutEntry,
        address: None,
        place: r.name.clone(),
        podref: r.podref.clone(),
        detail: format!("no pool entry holds it ({age})"),
    }
}

/// Who holds an entry, for telling a duplicate from one attachment's own
/// entries in two overlapping ranges.
fn attachment(e: &Entry) -> (&str, &str, &str) {
    (&e.holder.pod_ref, &e.holder.ifname, &e.holder.container_id)
}

/// A pool's name without its range's part (`blue-192.0.2.0-24` → `blue-`):
/// the pools of one network share it. A name not made that way is its own.
fn network_of<'a>(pool: &'a str, range: &str) -> &'a str {
    let suffix = super::canonical_cidr(range).map(|c| thereabouts_allocator::naming::pool_name_for_network(&c, ""));
    suffix.and_then(|s| pool.strip_suffix(s.as_str())).unwrap_or(pool)
}

fn duplicates(held: &Holdings) -> Vec<Finding> {
    let ranges: BTreeMap<&str, &str> = held.pools.iter().map(|p| (p.name.as_str(), p.range.as_str())).collect();
    let mut by_address: BTreeMap<(&str, IpAddr), Vec<&Entry>> = BTreeMap::new();
    for e in &held.entries {
        let network = network_of(&e.pool, ranges.get(e.pool.as_ref()).copied().unwrap_or_default());
        by_address.entry((network, e.address)).or_default().push(e);
    }
    by_address
        .into_iter()
        .filter(|(_, entries)| entries.iter().map(|e| attachment(e)).collect::<BTreeSet<_>>().len() > 1)
        .map(|((_, address), entries)| {
            let list = |f: fn(&Entry) -> String| entries.iter().map(|e| f(e)).collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>().join(", ");
            Finding {
                problem: Problem::DuplicateAddress,
                address: Some(address.to_string()),
                place: list(|e| e.pool.to_string()),
                podref: list(|e| e.holder.pod_ref.clone()),
                detail: format!("held {} times, by {}", entries.len(), list(|e| format!("{} ({})", e.holder.pod_ref, e.holder.container_id))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::held::PoolSummary;
    use serde_json::Value;
    use thereabouts_allocator::model::Allocation;

    fn entry(pool: &str, address: &str, podref: &str, cid: &str) -> Entry {
        Entry {
            pool: pool.into(),
            address: address.parse().unwrap(),
            holder: Allocation { offset: 1, container_id: cid.into(), pod_ref: podref.into(), ifname: "net1".into(), claim: None },
            key: "1".into(),
            id: Value::Null,
            pool_version: "".into(),
        }
    }
    fn reservation(name: &str, podref: &str, cid: &str) -> Reservation {
        Reservation {
            name: name.into(),
            podref: podref.into(),
            containerid: cid.into(),
            ifname: "net1".into(),
            claim: None,
            uid: String::new(),
            version: String::new(),
            age: Some(Duration::from_secs(600)),
            unbacked_for: None,
        }
    }
    fn pool(name: &str, range: &str) -> PoolSummary {
        PoolSummary { name: name.into(), range: range.into(), capacity: 0, entries: 0, without_podref: 0, unreadable: Vec::new() }
    }
    fn held(entries: Vec<Entry>, reservations: Vec<Reservation>) -> Holdings {
        let pools = vec![pool("blue-192.0.2.0-24", "192.0.2.0/24"), pool("blue-192.0.2.0-25", "192.0.2.0/25"), pool("red-192.0.2.0-24", "192.0.2.0/24")];
        Holdings { entries, reservations, pools, unreadable_pools: Vec::new() }
    }
    fn problems(held: &Holdings, overlapping: bool) -> Vec<(Problem, String)> {
        check(held, overlapping).into_iter().map(|f| (f.problem, f.address.unwrap_or(f.place))).collect()
    }

    #[test]
    fn a_consistent_datastore_has_no_findings() {
        let h = held(vec![entry("blue-192.0.2.0-24", "192.0.2.1", "ns/a", "c1")], vec![reservation("blue-192.0.2.1", "ns/a", "c1")]);
        assert_eq!(problems(&h, true), []);
    }

    #[test]
    fn an_entry_without_its_reservation_counts_only_with_overlapping_ranges() {
        let h = held(vec![entry("blue-192.0.2.0-24", "192.0.2.1", "ns/a", "c1")], vec![reservation("blue-192.0.2.1", "ns/b", "c2")]);
        assert_eq!(problems(&h, true)[0], (Problem::EntryWithoutReservation, "192.0.2.1".into()));
        assert_eq!(problems(&h, false), [(Problem::ReservationWithoutEntry, "blue-192.0.2.1".into())]);
    }

    #[test]
    fn a_reservation_without_an_entry_is_found() {
        let h = held(vec![], vec![reservation("blue-192.0.2.9", "ns/a", "c1")]);
        assert_eq!(problems(&h, true), [(Problem::ReservationWithoutEntry, "blue-192.0.2.9".into())]);
    }

    #[test]
    fn an_address_in_two_overlapping_pools_of_one_network_is_a_duplicate() {
        let a = entry("blue-192.0.2.0-24", "192.0.2.5", "ns/a", "c1");
        let b = entry("blue-192.0.2.0-25", "192.0.2.5", "ns/b", "c2");
        assert_eq!(problems(&held(vec![a.clone(), b], vec![]), false), [(Problem::DuplicateAddress, "192.0.2.5".into())]);
        let own = entry("blue-192.0.2.0-25", "192.0.2.5", "ns/a", "c1");
        assert_eq!(problems(&held(vec![a.clone(), own], vec![]), false), [], "one attachment's entries in two ranges");
        let other_network = entry("red-192.0.2.0-24", "192.0.2.5", "ns/b", "c2");
        assert_eq!(problems(&held(vec![a, other_network], vec![]), false), [], "another network");
    }

    #[test]
    fn an_entry_without_a_podref_is_found() {
        let h = held(vec![entry("blue-192.0.2.0-24", "192.0.2.1", "", "old-client")], vec![]);
        assert_eq!(problems(&h, false), [(Problem::WithoutPodref, "192.0.2.1".into())]);
    }

    #[test]
    fn unreadable_pools_and_keys_are_found() {
        let mut h = held(vec![], vec![]);
        h.unreadable_pools.push("IPPool broken: no spec.range".into());
        h.pools[0].unreadable.push("key \"x\" is no offset".into());
        assert_eq!(problems(&h, false), [(Problem::Unreadable, String::new()), (Problem::Unreadable, "blue-192.0.2.0-24".into())]);
    }

    #[test]
    fn release_by_address_refuses_an_address_of_two_attachments_unless_a_pool_is_named() {
        let a = entry("blue-192.0.2.0-24", "192.0.2.5", "ns/a", "c1");
        let h = held(vec![a.clone(), entry("red-192.0.2.0-24", "192.0.2.5", "ns/b", "c2")], vec![]);
        let address = "192.0.2.5".parse().unwrap();
        assert!(entries_of(&h, &Target::Address { address, pool: None }).is_err());
        assert_eq!(entries_of(&h, &Target::Address { address, pool: Some("blue-192.0.2.0-24".into()) }).unwrap(), [&a]);
    }

    #[test]
    fn release_by_pod_takes_its_reservations_but_not_those_of_an_entry_taken_over() {
        let (freed, taken) = (entry("blue-192.0.2.0-24", "192.0.2.1", "ns/a", "c1"), entry("blue-192.0.2.0-24", "192.0.2.2", "ns/a", "c1"));
        let stray = reservation("blue-192.0.2.9", "ns/a", "c0");
        let h = held(vec![], vec![reservation("blue-192.0.2.1", "ns/a", "c1"), reservation("blue-192.0.2.2", "ns/a", "c1"), stray.clone()]);
        let names = |t: &Target| reservations_of(&h, t, &[&freed], &[&taken]).into_iter().map(|r| r.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&Target::Pod("ns/a".into())), ["blue-192.0.2.1", "blue-192.0.2.9"]);
        assert_eq!(names(&Target::Address { address: freed.address, pool: None }), ["blue-192.0.2.1"]);
        assert_eq!(parse_podref("ns/a"), Ok("ns/a".into()));
        assert!(parse_podref("a").is_err() && parse_podref("ns/").is_err());
    }

    #[test]
    fn the_shared_datastores_are_served_and_the_file_store_is_not() {
        let settings = |kind: Option<&str>| DatastoreSettings { kind: kind.map(Into::into), kubeconfig: Some("/k".into()), ..DatastoreSettings::default() };
        assert_eq!(served(&settings(None)).unwrap(), Served::Kubernetes(PathBuf::from("/k")));
        assert_eq!(served(&settings(Some("etcd"))).unwrap(), Served::Etcd);
        assert!(served(&settings(Some("file"))).unwrap_err().to_string().contains("node-local"));
    }
}
