//! Which entries and reservations a pass frees, and why: a pure decision over
//! what the datastore held (read first, at revision A) and what the pods were
//! (read after, at P ≥ A). An entry read at A was written by an ADD, and a
//! runtime calls ADD only for a pod that exists, so its pod is in the pod read
//! unless it was deleted (whereabouts#207 read pods first and freed fresh
//! allocations). The rules, one test each below, are the table in
//! `docs/controller.md`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::held::{Entry, EntryIndex, Holdings, Reservation};
use super::pods::{Phase, PodFacts};
use thereabouts_allocator::ip::Family;
use thereabouts_allocator::model::Claim;

/// Why an address is given back; the value of the freed-addresses metric's
/// `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// No Pod of that name: it was deleted and its DEL never came.
    PodGone,
    /// The pod completed (`Succeeded`/`Failed`) longer ago than the grace.
    PodCompleted,
    /// The pod runs with another address of this interface, held by another
    /// entry of it: this one belongs to a sandbox that is gone.
    SandboxReplaced,
    /// A reservation no pool entry holds, of a pod that does not use it.
    OrphanReservation,
    /// `thereabouts release`.
    ReleasedByHand,
    /// The claim that owned it (an IPAMClaim) was deleted.
    ClaimGone,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::PodGone => "pod_gone",
            Reason::PodCompleted => "pod_completed",
            Reason::SandboxReplaced => "sandbox_replaced",
            Reason::OrphanReservation => "orphan_reservation",
            Reason::ReleasedByHand => "released_by_hand",
            Reason::ClaimGone => "claim_gone",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Reason::PodGone => "its pod is gone",
            Reason::PodCompleted => "its pod completed",
            Reason::SandboxReplaced => "its pod runs with another address on this interface",
            Reason::OrphanReservation => "no pool entry holds it and its pod does not use it",
            Reason::ReleasedByHand => "released by hand",
            Reason::ClaimGone => "the claim that owned it is gone",
        }
    }
}

/// What the rules need besides the snapshots.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Unix seconds.
    pub now: i64,
    /// How long a completed pod keeps its addresses (its runtime's DEL may still come).
    pub completed_grace: Duration,
    /// How long a reservation without an entry is an ADD in flight: longer
    /// than the plugin's ADD budget.
    pub add_budget: Duration,
    /// How long a reservation must have been seen without an entry before it
    /// is freed. Whoever removed the entry (a DEL, whereabouts' own control
    /// loop) deletes the reservation next, and whereabouts deletes it by name
    /// without a precondition: freed earlier, its address could be taken
    /// again in between, and that delete would hit the new holder's.
    pub unbacked_grace: Duration,
}

/// The pods at P, and the nodes' readiness.
pub trait PodView {
    /// `None`: no Pod of that `namespace/name`.
    fn pod(&self, podref: &str) -> Option<&PodFacts>;
    /// `Some(true)` for a node whose `Ready` condition is `True`.
    fn node_ready(&self, node: &str) -> Option<bool>;
    /// Whether the claim is known to be gone (read after the datastore, as
    /// the pods are). Unknown (not read, its CRD not installed) is not gone.
    fn claim_gone(&self, _claim: &Claim) -> bool {
        false
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Entries to remove, each with its reason.
    pub entries: Vec<(Entry, Reason)>,
    /// Reservations to delete: the freed entries' own, then orphans.
    pub reservations: Vec<(Reservation, Reason)>,
    /// Entries never freed on a guess (an empty or malformed podref).
    pub without_podref: Vec<Entry>,
}

pub fn decide(held: &Holdings, pods: &dyn PodView, rules: Rules) -> Verdict {
    let mut verdict = Verdict { entries: Vec::new(), reservations: Vec::new(), without_podref: Vec::new() };
    let mut by_attachment: BTreeMap<(&str, &str), Vec<&Entry>> = BTreeMap::new();
    for e in &held.entries {
        by_attachment.entry((e.holder.pod_ref.as_str(), e.holder.ifname.as_str())).or_default().push(e);
    }
    for e in &held.entries {
        // A claim's address outlives every pod that holds it: only the
        // claim's end frees it, and no pod rule does.
        if let Some(claim) = &e.holder.claim {
            if pods.claim_gone(claim) {
                verdict.entries.push((e.clone(), Reason::ClaimGone));
            }
            continue;
        }
        if !e.holder.pod_ref.contains('/') {
            verdict.without_podref.push(e.clone());
            continue;
        }
        let siblings = by_attachment.get(&(e.holder.pod_ref.as_str(), e.holder.ifname.as_str())).map_or(&[][..], Vec::as_slice);
        if let Some(reason) = entry_reason(e, siblings, pods, rules) {
            verdict.entries.push((e.clone(), reason));
        }
    }
    let all = EntryIndex::for_reservations(&held.entries, &held.reservations);
    let freed = EntryIndex::new(verdict.entries.iter().map(|(e, _)| e));
    let reasons: BTreeMap<(&str, &str), Reason> = verdict.entries.iter().map(|(e, r)| ((e.pool.as_ref(), e.key.as_str()), *r)).collect();
    let mut reservations = Vec::new();
    for r in &held.reservations {
        if let Some(e) = freed.backed_by(r).next() {
            reservations.push((r.clone(), reasons[&(e.pool.as_ref(), e.key.as_str())]));
        } else if !all.is_backed(r) && orphaned(r, pods, rules) {
            reservations.push((r.clone(), Reason::OrphanReservation));
        }
    }
    verdict.reservations = reservations;
    verdict
}

/// Whether the pod is settled enough for its evidence to count: scheduled on
/// a node that is known and `Ready`. A pod on a node that stopped reporting may
/// still run; deleting the pod is what frees it.
fn on_ready_node(pod: &PodFacts, pods: &dyn PodView) -> bool {
    !pod.node.is_empty() && pods.node_ready(&pod.node) == Some(true)
}

fn completed(pod: &PodFacts, pods: &dyn PodView, rules: Rules) -> bool {
    let grace = i64::try_from(rules.completed_grace.as_secs()).unwrap_or(i64::MAX);
    matches!(pod.phase, Phase::Succeeded | Phase::Failed) && on_ready_node(pod, pods) && pod.finished_at.is_some_and(|at| rules.now.saturating_sub(at) >= grace)
}

fn entry_reason(e: &Entry, siblings: &[&Entry], pods: &dyn PodView, rules: Rules) -> Option<Reason> {
    let Some(pod) = pods.pod(&e.holder.pod_ref) else { return Some(Reason::PodGone) };
    if completed(pod, pods, rules) {
        return Some(Reason::PodCompleted);
    }
    if pod.phase != Phase::Running || !on_ready_node(pod, pods) || e.holder.ifname.is_empty() {
        return None;
    }
    let reported = pod.addresses_on(&e.holder.ifname)?;
    let family = Family::of(e.address);
    let replaced = !reported.contains(&e.address)
        && siblings.iter().any(|s| s.holder.container_id != e.holder.container_id && Family::of(s.address) == family && reported.contains(&s.address));
    replaced.then_some(Reason::SandboxReplaced)
}

/// A reservation no entry holds: an ADD between its reservation and its pool
/// write, unless its pod is gone or completed, or runs, reports its networks
/// without this address, and the reservation is older than an ADD can take;
/// and in every case only once it has been seen so for the unbacked grace.
fn orphaned(r: &Reservation, pods: &dyn PodView, rules: Rules) -> bool {
    if r.unbacked_for.is_none_or(|d| d < rules.unbacked_grace) {
        return false;
    }
    if let Some(claim) = &r.claim {
        return pods.claim_gone(claim);
    }
    if !r.podref.contains('/') {
        return false;
    }
    let Some(pod) = pods.pod(&r.podref) else { return true };
    if completed(pod, pods, rules) {
        return true;
    }
    let old = r.age.is_some_and(|age| age >= rules.add_budget);
    old && pod.phase == Phase::Running && on_ready_node(pod, pods) && pod.network_status.is_some() && !pod.all_addresses().any(|ip| r.names(*ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::pods::Attached;
    use serde_json::Value;
    use std::collections::BTreeMap;
    use std::net::IpAddr;
    use thereabouts_allocator::model::Allocation;

    #[derive(Default)]
    struct View {
        pods: BTreeMap<String, PodFacts>,
        ready: BTreeMap<String, bool>,
        claims_gone: Vec<Claim>,
    }
    impl PodView for View {
        fn pod(&self, podref: &str) -> Option<&PodFacts> {
            self.pods.get(podref)
        }
        fn node_ready(&self, node: &str) -> Option<bool> {
            self.ready.get(node).copied()
        }
        fn claim_gone(&self, claim: &Claim) -> bool {
            self.claims_gone.contains(claim)
        }
    }

    const RULES: Rules =
        Rules { now: 1_000, completed_grace: Duration::from_secs(60), add_budget: Duration::from_secs(150), unbacked_grace: Duration::from_secs(60) };

    fn entry(address: &str, cid: &str, podref: &str) -> Entry {
        Entry {
            pool: "192.0.2.0-24".into(),
            address: address.parse().unwrap(),
            holder: Allocation { offset: 0, container_id: cid.into(), pod_ref: podref.into(), ifname: "net1".into(), claim: None },
            key: "0".into(),
            id: Value::String(cid.into()),
            pool_version: "1".into(),
        }
    }
    fn reservation(name: &str, cid: &str, podref: &str, age: u64) -> Reservation {
        Reservation {
            name: name.into(),
            podref: podref.into(),
            containerid: cid.into(),
            ifname: "net1".into(),
            claim: None,
            uid: "u".into(),
            version: "1".into(),
            age: Some(Duration::from_secs(age)),
            // Seen without an entry long ago, unless a test says otherwise.
            unbacked_for: Some(Duration::from_secs(10_000)),
        }
    }
    fn pod(phase: Phase, status: Option<&[&str]>) -> PodFacts {
        let ips = |l: &[&str]| l.iter().map(|s| s.parse::<IpAddr>().unwrap()).collect();
        PodFacts {
            phase,
            node: "node-1".into(),
            finished_at: None,
            network_status: status.map(|l| vec![Attached { interface: "net1".into(), ips: ips(l) }].into()),
        }
    }
    fn view(pods: &[(&str, PodFacts)]) -> View {
        View { pods: pods.iter().map(|(n, p)| (n.to_string(), p.clone())).collect(), ready: [("node-1".to_string(), true)].into(), claims_gone: Vec::new() }
    }
    fn held(entries: Vec<Entry>, reservations: Vec<Reservation>) -> Holdings {
        Holdings { entries, reservations, ..Holdings::default() }
    }
    fn reasons(v: &Verdict) -> Vec<(String, Reason)> {
        v.entries.iter().map(|(e, r)| (e.address.to_string(), *r)).chain(v.reservations.iter().map(|(r, why)| (r.name.clone(), *why))).collect()
    }

    #[test]
    fn a_claims_address_outlives_its_pods_and_ends_with_the_claim() {
        let vm = Claim::IpamClaim("ns/vm.net".into());
        let mut e = entry("192.0.2.1", "c1", "ns/launcher-a");
        e.holder.claim = Some(vm.clone());
        // The ORIP still names the first launcher pod; the claim makes it the entry's.
        let r = Reservation { claim: Some(vm.clone()), ..reservation("192.0.2.1", "c0", "ns/launcher-old", 0) };
        let h = held(vec![e], vec![r]);
        assert_eq!(reasons(&decide(&h, &view(&[]), RULES)), [], "its pods are gone, the claim is not");
        let gone = View { claims_gone: vec![vm], ..view(&[]) };
        assert_eq!(reasons(&decide(&h, &gone, RULES)), [("192.0.2.1".into(), Reason::ClaimGone), ("192.0.2.1".into(), Reason::ClaimGone)]);
    }

    #[test]
    fn a_gone_pod_frees_its_entries_and_their_reservations() {
        let h = held(vec![entry("192.0.2.1", "c1", "ns/a")], vec![reservation("192.0.2.1", "c1", "ns/a", 0)]);
        let v = decide(&h, &view(&[]), RULES);
        assert_eq!(reasons(&v), [("192.0.2.1".into(), Reason::PodGone), ("192.0.2.1".into(), Reason::PodGone)]);
    }

    #[test]
    fn a_pending_pod_or_one_without_network_status_keeps_everything() {
        let h = held(vec![entry("192.0.2.1", "c1", "ns/a")], vec![reservation("192.0.2.9", "c1", "ns/a", 10_000)]);
        assert_eq!(reasons(&decide(&h, &view(&[("ns/a", pod(Phase::Pending, None))]), RULES)), []);
        assert_eq!(reasons(&decide(&h, &view(&[("ns/a", pod(Phase::Running, None))]), RULES)), []);
    }

    #[test]
    fn a_completed_pod_frees_after_the_grace() {
        let h = held(vec![entry("192.0.2.1", "c1", "ns/a")], vec![]);
        let done = |at| PodFacts { finished_at: Some(at), ..pod(Phase::Succeeded, None) };
        assert_eq!(reasons(&decide(&h, &view(&[("ns/a", done(RULES.now - 59))]), RULES)), []);
        assert_eq!(reasons(&decide(&h, &view(&[("ns/a", done(RULES.now - 60))]), RULES)), [("192.0.2.1".into(), Reason::PodCompleted)]);
        let failed = PodFacts { phase: Phase::Failed, ..done(0) };
        assert_eq!(reasons(&decide(&h, &view(&[("ns/a", failed)]), RULES)).len(), 1);
    }

    #[test]
    fn a_pod_on_a_node_that_is_not_ready_keeps_everything() {
        let h = held(vec![entry("192.0.2.1", "c1", "ns/a"), entry("192.0.2.2", "c2", "ns/a")], vec![]);
        let done = PodFacts { finished_at: Some(0), ..pod(Phase::Failed, Some(&["192.0.2.2"])) };
        let mut v = view(&[("ns/a", done)]);
        v.ready.insert("node-1".into(), false);
        assert_eq!(reasons(&decide(&h, &v, RULES)), []);
        v.ready.clear();
        assert_eq!(reasons(&decide(&h, &v, RULES)), [], "a node not listed is not known to be ready");
    }

    #[test]
    fn a_re_created_sandbox_frees_the_entry_its_pod_no_longer_reports() {
        let old = entry("192.0.2.1", "c1", "ns/a");
        let new = entry("192.0.2.2", "c2", "ns/a");
        let h = held(vec![old.clone(), new.clone()], vec![reservation("192.0.2.1", "c1", "ns/a", 0)]);
        let running = pod(Phase::Running, Some(&["192.0.2.2"]));
        assert_eq!(
            reasons(&decide(&h, &view(&[("ns/a", running.clone())]), RULES)),
            [("192.0.2.1".into(), Reason::SandboxReplaced), ("192.0.2.1".into(), Reason::SandboxReplaced)]
        );
        // Not unambiguous: no other entry of the pod holds a reported address,
        // or the same container holds both.
        assert_eq!(reasons(&decide(&held(vec![old.clone()], vec![]), &view(&[("ns/a", running.clone())]), RULES)), []);
        let same_container = Entry { holder: Allocation { container_id: "c1".into(), ..new.holder.clone() }, ..new };
        assert_eq!(reasons(&decide(&held(vec![old, same_container], vec![]), &view(&[("ns/a", running)]), RULES)), []);
    }

    #[test]
    fn a_statefulset_pod_re_created_under_its_name_keeps_its_entry() {
        // The old pod is gone; the new one (another UID) has not run its ADD,
        // which will take the entry over.
        let h = held(vec![entry("192.0.2.1", "c1", "ns/db-0")], vec![reservation("192.0.2.1", "c1", "ns/db-0", 0)]);
        assert_eq!(reasons(&decide(&h, &view(&[("ns/db-0", pod(Phase::Pending, None))]), RULES)), []);
        assert_eq!(reasons(&decide(&h, &view(&[("ns/db-0", pod(Phase::Running, Some(&["192.0.2.1"])))]), RULES)), []);
    }

    #[test]
    fn an_empty_podref_is_reported_and_never_freed() {
        let h = held(vec![entry("192.0.2.1", "c1", ""), entry("192.0.2.2", "c1", "no-slash")], vec![reservation("192.0.2.1", "c1", "", 10_000)]);
        let v = decide(&h, &view(&[]), RULES);
        assert_eq!((reasons(&v), v.without_podref.len()), (vec![], 2));
    }

    #[test]
    fn a_reservation_without_an_entry_is_an_add_in_flight_until_proven_otherwise() {
        let orip = |age| held(vec![], vec![reservation("192.0.2.9", "c1", "ns/a", age)]);
        let running = pod(Phase::Running, Some(&["192.0.2.2"]));
        assert_eq!(reasons(&decide(&orip(10), &view(&[("ns/a", running.clone())]), RULES)), [], "young: an ADD in flight");
        assert_eq!(reasons(&decide(&orip(150), &view(&[("ns/a", running)]), RULES)), [("192.0.2.9".into(), Reason::OrphanReservation)]);
        assert_eq!(reasons(&decide(&orip(150), &view(&[("ns/a", pod(Phase::Pending, None))]), RULES)), []);
        assert_eq!(reasons(&decide(&orip(150), &view(&[("ns/a", pod(Phase::Running, Some(&["192.0.2.9"])))]), RULES)), []);
        assert_eq!(reasons(&decide(&orip(0), &view(&[]), RULES)), [("192.0.2.9".into(), Reason::OrphanReservation)], "its pod is gone");
    }

    #[test]
    fn a_reservation_just_seen_without_its_entry_waits_for_the_unbacked_grace() {
        let seen = |secs: Option<u64>| {
            let mut h = held(vec![], vec![reservation("192.0.2.9", "c1", "ns/gone", 10_000)]);
            h.reservations[0].unbacked_for = secs.map(Duration::from_secs);
            reasons(&decide(&h, &view(&[]), RULES))
        };
        assert_eq!(seen(None), [], "not seen before: whoever removed its entry deletes it next");
        assert_eq!(seen(Some(59)), []);
        assert_eq!(seen(Some(60)), [("192.0.2.9".into(), Reason::OrphanReservation)]);
    }

    #[test]
    fn a_live_entry_keeps_its_reservation() {
        let h = held(vec![entry("192.0.2.1", "c1", "ns/a")], vec![reservation("blue-192.0.2.1", "c1", "ns/a", 10_000)]);
        assert_eq!(reasons(&decide(&h, &view(&[("ns/a", pod(Phase::Running, Some(&["192.0.2.1"])))]), RULES)), []);
    }
}
