//! The allocation cycle shared by every command and every datastore, in the
//! order host-local's `cmdAdd` reads: begin the call's transaction → load its
//! pools → let the engine plan → commit all pools at once with compare-and-swap
//! → on a [`Retry`], load again and plan again ([`until_committed`] holds the
//! retry policy) until the call's deadline. The engine is told how many
//! conflicts the call met (`request.contention`): racing ADDs then spread over
//! the lowest free addresses instead of all planning the lowest one again.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use thereabouts_allocator::attachment::{Holder, Ifname, may_own, same_attachment};
use thereabouts_allocator::model::{
    self, Allocation, Assignment, Claim, NormalizedConfig, NormalizedRange, PlanFailure, PlanOutcome, PoolSnapshot, PoolState, RangesAllocation, Request,
    Reservations,
};

use crate::component::{EngineComponent, EngineFailure};
use crate::datastore::{Change, Datastore, DatastoreError, Outcome, Pool, PoolId, PoolUpdate, Purpose, Retry, Transaction, release_group};
use crate::placement::Placement;
use crate::policy::decide::{Guide, GuideError};

/// Why a command's allocation cycle failed.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    #[error(transparent)]
    Datastore(#[from] DatastoreError),
    #[error(transparent)]
    Engine(#[from] EngineFailure),
    /// The engine could not place the attachment: a range is full, or a
    /// requested address cannot be had. The message is whereabouts' where it has one.
    #[error("{message}")]
    Unplaceable { message: String },
    /// The engine answered something that contradicts what it was given: a bug.
    #[error("engine answer inconsistent: {detail}")]
    EngineAnswer { detail: &'static str },
    /// A policy stopped the ADD (it failed with `on_error: deny`, or refused).
    #[error(transparent)]
    Policy(#[from] crate::policy::failure::PolicyStop),
    /// Every slice this node holds of a sliced range is full, or holds
    /// `node_slice_max_entries` (`at_bound`): claim another
    /// ([`Placement::claim`]) and allocate again.
    #[error("the node's slices of range {cidr} are full")]
    SlicesFull { range_index: usize, cidr: String, at_bound: bool },
}

/// Who a call is about: CNI_CONTAINERID and CNI_IFNAME.
#[derive(Debug, Clone, Copy)]
pub struct Attachment<'a> {
    pub container_id: &'a str,
    pub ifname: &'a str,
    /// The ResourceClaim a device's release speaks for (the profile
    /// provider's); `None` for every CNI call.
    pub claim: Option<&'a model::Claim>,
}

pub fn pool_of(range: &NormalizedRange) -> PoolId {
    PoolId { name: range.pool_name.clone(), cidr: range.cidr.clone(), node_local: false }
}

/// The config's pools, each once, in range order (two ranges may share a pool).
fn distinct_pools(config: &NormalizedConfig) -> Vec<PoolId> {
    distinct_pools_of(&config.ranges)
}

pub(crate) fn distinct_pools_of<'a>(ranges: impl IntoIterator<Item = &'a NormalizedRange>) -> Vec<PoolId> {
    let mut seen = HashSet::new();
    ranges.into_iter().map(pool_of).filter(|p| seen.insert(p.name.clone())).collect()
}

/// The config an ADD plans: each range's choice ([`Placement`]) that holds the
/// attachment's entry already, else the first with a free address and, where
/// the range has `node_slice_max_entries`, fewer entries than that (so no pool
/// object a call rewrites grows past it while a slice is free to claim).
/// Without node slices, the config itself.
fn chosen<'c>(
    config: &'c NormalizedConfig,
    placement: &Placement,
    loaded: &BTreeMap<String, Pool>,
    asking: Holder,
    claim: Option<&Claim>,
) -> Result<Cow<'c, NormalizedConfig>, IpamError> {
    if !placement.is_sliced() {
        return Ok(Cow::Borrowed(config));
    }
    let mut ranges = Vec::with_capacity(config.ranges.len());
    for index in 0..placement.choices.len() {
        let choices: Vec<&NormalizedRange> = placement.reading(index).collect();
        let in_span = |r: &NormalizedRange, o: u128| o >= r.first_offset && o <= r.last_offset && !r.excluded.iter().any(|(lo, hi)| (*lo..=*hi).contains(&o));
        let holds =
            |r: &NormalizedRange| entries_of(loaded, &r.pool_name).iter().any(|e| may_own(e.holder(), e.claim.as_ref(), asking, claim) && in_span(r, e.offset));
        let has_room = |r: &NormalizedRange| {
            let pool = loaded.get(&r.pool_name);
            let entries = pool.map(|p| p.entries.iter().map(|e| e.offset)).into_iter().flatten();
            let reserved = pool.map(|p| p.reserved.iter().copied()).into_iter().flatten();
            let taken: BTreeSet<u128> = entries.chain(reserved).filter(|o| in_span(r, *o)).collect();
            (taken.len() as u128) < r.usable
        };
        let bound = placement.entry_bound(config, index);
        let under_bound = |r: &NormalizedRange| bound.is_none_or(|max| entries_of(loaded, &r.pool_name).len() < max as usize);
        let pick = choices.iter().find(|r| holds(r)).or_else(|| choices.iter().find(|r| has_room(r) && under_bound(r)));
        match (pick, config.ranges.get(index)) {
            (Some(range), _) => ranges.push((*range).clone()),
            (None, Some(whole)) if whole.node_slicing.is_some() => {
                return Err(IpamError::SlicesFull { range_index: index, cidr: whole.cidr.clone(), at_bound: choices.iter().any(|r| has_room(r)) });
            }
            // Unsliced and full: the engine says so in whereabouts' words.
            (None, _) => ranges.push(choices.first().map(|r| (*r).clone()).ok_or(IpamError::EngineAnswer { detail: "a range without a choice" })?),
        }
    }
    Ok(Cow::Owned(NormalizedConfig { ranges, ..config.clone() }))
}

/// The transaction's pools as loaded, by name.
fn load_all(tx: &mut dyn Transaction, pools: &[PoolId]) -> Result<BTreeMap<String, Pool>, IpamError> {
    Ok(pools.iter().map(|p| p.name.clone()).zip(tx.load()?).collect())
}

/// The pools as they are now, read once (no locks, no writes).
fn read_all(store: &dyn Datastore, pools: &[PoolId], deadline: Instant) -> Result<BTreeMap<String, Pool>, IpamError> {
    load_all(store.begin(pools, Purpose::Read, deadline)?.as_mut(), pools)
}

fn entries_of<'a>(loaded: &'a BTreeMap<String, Pool>, pool: &str) -> &'a [Allocation] {
    loaded.get(pool).map(|p| p.entries.as_slice()).unwrap_or_default()
}

/// A pool as the engine takes it: the offsets of its entries.
fn pool_state(pool: &PoolId, entries: &[Allocation]) -> PoolState {
    PoolState { name: pool.name.clone(), snapshot: PoolSnapshot::with_taken(entries.iter().map(|e| e.offset)) }
}

/// Per-pool change lists in range order, turned into updates against the versions read.
struct Changes {
    order: Vec<PoolId>,
    by_pool: BTreeMap<String, Vec<Change>>,
}

impl Changes {
    fn new() -> Self {
        Changes { order: Vec::new(), by_pool: BTreeMap::new() }
    }
    fn push(&mut self, pool: PoolId, change: Change) {
        if !self.by_pool.contains_key(&pool.name) {
            self.order.push(pool.clone());
        }
        self.by_pool.entry(pool.name).or_default().push(change);
    }
    fn is_empty(&self) -> bool {
        self.by_pool.is_empty()
    }
    fn has(&self, pool: &PoolId, change: &Change) -> bool {
        self.by_pool.get(&pool.name).is_some_and(|changes| changes.contains(change))
    }
    /// The [`Change::Unreserve`]s, with their pools.
    fn unreserves(&self) -> impl Iterator<Item = (PoolId, Change)> + '_ {
        self.order
            .iter()
            .flat_map(move |pool| self.by_pool[&pool.name].iter().filter(|c| matches!(c, Change::Unreserve { .. })).map(move |c| (pool.clone(), c.clone())))
    }
    fn into_updates(mut self, pools: &BTreeMap<String, Pool>) -> Vec<PoolUpdate> {
        self.order
            .into_iter()
            .map(|pool| PoolUpdate {
                expected: pools.get(&pool.name).map(|p| p.version.clone()).unwrap_or_default(),
                changes: self.by_pool.remove(&pool.name).unwrap_or_default(),
                pool,
            })
            .collect()
    }
}

/// Runs one read-plan-commit cycle until it commits: `plan` gets the pools as
/// loaded and the number of conflicts met so far, or since the transaction got
/// its turn (the engine's `contention`: after a lost race, contenders spread
/// over more free addresses instead of all planning the lowest one again) and returns no updates when there is nothing
/// to commit. The retry policy lives here alone: a [`Retry::Reserved`] is
/// planned around at once, a [`Retry::Conflict`] after a jittered pause (the
/// store's [`Capabilities::conflict_pauses`](crate::datastore::Capabilities)),
/// both until the deadline. In a turn, `plan` also gets the DELs queued behind
/// this call that its commit may serve ([`Transaction::queued_releases`]).
fn until_committed<T>(
    tx: &mut dyn Transaction,
    pools: &[PoolId],
    pauses: (Duration, Duration),
    deadline: Instant,
    what: &str,
    mut plan: impl FnMut(&BTreeMap<String, Pool>, u32, &[model::Attachment]) -> Result<(T, Vec<PoolUpdate>), IpamError>,
) -> Result<T, IpamError> {
    let mut backoff = crate::datastore::retry::Backoff::between(pauses.0, pauses.1);
    let mut conflicts = 0u32;
    // Conflicts since the call last waited for its turn: what the plan spreads by.
    let mut contention = 0u32;
    loop {
        let loaded = load_all(tx, pools)?;
        let queued = if tx.serialized() { tx.queued_releases() } else { Vec::new() };
        let (value, updates) = plan(&loaded, contention, &queued)?;
        if updates.is_empty() {
            return Ok(value);
        }
        match tx.commit(&updates)? {
            Outcome::Committed => {
                if conflicts > 0 {
                    crate::logging::verbose(format!("{what}: committed after {conflicts} conflict(s)"));
                }
                return Ok(value);
            }
            // Neither is contention: plan again at once, while time is left.
            Outcome::Retry(retry @ (Retry::Reserved { .. } | Retry::Turn)) => {
                let waiting = match retry {
                    Retry::Reserved { pool, name } => {
                        crate::logging::debug(format!("{what}: address {name} of pool {pool} is reserved by an overlapping range; planning around it"));
                        "planning around reservations"
                    }
                    _ => "waiting for its turn",
                };
                if Instant::now() >= deadline {
                    return Err(DatastoreError::Timeout { what: format!("{what} ({waiting})") }.into());
                }
            }
            Outcome::Retry(Retry::Conflict { pool }) => {
                conflicts += 1;
                crate::logging::debug(format!("{what}: pool {pool} changed concurrently; planning again"));
                let out_of_time = if tx.serialized() {
                    // It waited for its turn: the next attempt meets (nearly)
                    // nobody, so it plans the lowest free addresses at once.
                    contention = 0;
                    Instant::now() >= deadline
                } else {
                    contention += 1;
                    !backoff.pause(deadline)
                };
                if out_of_time {
                    return Err(DatastoreError::Timeout { what: format!("{what} ({conflicts} conflicting updates)") }.into());
                }
            }
        }
    }
}

/// Begins `purpose`'s transaction over `pools` and runs [`until_committed`] in it.
fn cycle<T>(
    store: &dyn Datastore,
    pools: &[PoolId],
    purpose: Purpose,
    deadline: Instant,
    what: &str,
    mut plan: impl FnMut(&BTreeMap<String, Pool>, u32) -> Result<(T, Vec<PoolUpdate>), IpamError>,
) -> Result<T, IpamError> {
    let mut tx = store.begin(pools, purpose, deadline)?;
    until_committed(tx.as_mut(), pools, store.capabilities().conflict_pauses, deadline, what, |loaded, contention, _| plan(loaded, contention))
}

/// Whether this call keeps cluster-wide reservations (whereabouts'
/// `enable_overlapping_ranges`, on by default) in a store that holds them.
fn reserves(store: &dyn Datastore, config: &NormalizedConfig) -> bool {
    config.enable_overlapping_ranges && store.capabilities().reservations
}

/// What a failed plan tells the runtime. Exhaustion keeps whereabouts' message.
fn plan_failure(failure: PlanFailure) -> IpamError {
    match failure {
        PlanFailure::Exhausted { message } | PlanFailure::Rejected { message } | PlanFailure::BadPick { message, .. } => IpamError::Unplaceable { message },
    }
}

/// The config's pools as the engine plans an ADD on them.
fn states_of(config: &NormalizedConfig, loaded: &BTreeMap<String, Pool>, asking: Holder, claim: Option<&Claim>, reserving: bool) -> Vec<PoolState> {
    distinct_pools(config)
        .iter()
        .map(|pool| {
            let entries = entries_of(loaded, &pool.name);
            let mut state = pool_state(pool, entries);
            // The pod's own entries (the container's outside Kubernetes): the
            // engine decides whether one is this attachment's address to keep.
            state.snapshot.held = entries.iter().filter(|e| may_own(e.holder(), e.claim.as_ref(), asking, claim)).cloned().collect();
            // Addresses an earlier attempt found reserved by an overlapping range.
            if reserving {
                state.snapshot.reserved = loaded.get(&pool.name).map(|p| p.reserved.clone()).unwrap_or_default();
            }
            state
        })
        .collect()
}

/// What a guided ADD would hand out (`ip/prefix` per range served), planned
/// once on the pools as they are (or empty), without writing: `policy run`.
pub fn plan_once(
    engine: &mut EngineComponent,
    config: &NormalizedConfig,
    container_id: &str,
    ifname: &str,
    guide: &Guide,
    from_datastore: bool,
) -> anyhow::Result<Vec<String>> {
    let pools = distinct_pools(config);
    let loaded = if from_datastore {
        let store = crate::datastore::open(&config.datastore, &config.name)?;
        read_all(store.as_ref(), &pools, Instant::now() + Duration::from_secs(30))?
    } else {
        BTreeMap::new()
    };
    let mut request = Request {
        container_id: container_id.into(),
        pod_ref: config.pod_ref.clone(),
        ifname: ifname.into(),
        requested_ip: None,
        contention: 0,
        guidance: None,
        preferred: Vec::new(),
        claim: None,
    };
    let asking = Holder { container_id: &request.container_id, pod_ref: &request.pod_ref, ifname: &request.ifname };
    let states = states_of(config, &loaded, asking, None, false);
    let planned = guide.plan(engine, config, &states, Reservations::AsRead, &mut request)?.planned;
    let outcomes = planned.map_err(plan_failure)?;
    Ok(outcomes.iter().map(|o| o.assignment().address.clone()).collect())
}

/// What an ADD asks for beyond its config: the policies' decisions, and the
/// addresses its pod prefers (`preferred_ip_annotation`).
#[derive(Clone, Copy, Default)]
pub struct Wishes<'w, 'e> {
    pub guide: Option<&'w Guide<'w, 'e>>,
    pub preferred: &'w [String],
    /// The claim the attachment allocates for (its entries are the claim's).
    pub claim: Option<&'w Claim>,
}

/// ADD: one address from every range (`ipRangesAllocation` `all`) or from the
/// first with room (`first_available`), all recorded in one commit, or none.
/// Returns the assignments in the order the engine served the ranges, each
/// naming its range (`range_index`).
pub fn allocate(
    engine: &mut EngineComponent,
    store: &dyn Datastore,
    config: &NormalizedConfig,
    placement: &Placement,
    who: Attachment,
    wishes: Wishes,
    deadline: Instant,
) -> Result<Vec<Assignment>, IpamError> {
    let Wishes { guide, preferred, claim } = wishes;
    let mut request = Request {
        container_id: who.container_id.into(),
        pod_ref: config.pod_ref.clone(),
        ifname: who.ifname.into(),
        requested_ip: None,
        contention: 0,
        guidance: None,
        preferred: preferred.to_vec(),
        claim: claim.cloned(),
    };
    let pools = placement.pools();
    let reserving = reserves(store, config);
    cycle(store, &pools, Purpose::Update, deadline, "ADD", |loaded, conflicts| {
        request.contention = conflicts;
        let asking = Holder { container_id: &request.container_id, pod_ref: &request.pod_ref, ifname: &request.ifname };
        let config = chosen(config, placement, loaded, asking, request.claim.as_ref())?;
        let config = config.as_ref();
        let states = states_of(config, loaded, asking, request.claim.as_ref(), reserving);
        let planned = match guide {
            None => engine.plan_all(config, &states, Reservations::AsRead, &request).map_err(EngineFailure)?,
            Some(guide) => {
                guide
                    .plan(engine, config, &states, Reservations::AsRead, &mut request)
                    .map_err(|e| match e {
                        GuideError::Stop(stop) => IpamError::Policy(stop),
                        GuideError::Engine(e) => IpamError::Engine(e),
                    })?
                    .planned
            }
        };
        let outcomes = planned.map_err(plan_failure)?;
        let mut changes = Changes::new();
        let mut assignments = Vec::with_capacity(outcomes.len());
        // The engine answers for the ranges it served (every range with
        // `all`, one with `first-available`), each naming its range: only
        // their pools are written.
        for outcome in outcomes {
            let range = config
                .ranges
                .get(outcome.assignment().range_index as usize)
                .ok_or(IpamError::EngineAnswer { detail: "an address in a range the config does not have" })?;
            match outcome {
                PlanOutcome::Fresh { assignment } => {
                    let entry = Allocation {
                        offset: assignment.offset,
                        container_id: request.container_id.clone(),
                        pod_ref: request.pod_ref.clone(),
                        ifname: request.ifname.clone(),
                        claim: request.claim.clone(),
                    };
                    if reserving {
                        changes.push(pool_of(range), Change::Reserve { name: assignment.reservation.clone(), holder: entry.clone() });
                    }
                    changes.push(pool_of(range), Change::Insert(entry));
                    assignments.push(assignment);
                }
                PlanOutcome::Reuse { assignment, held_index } => {
                    let held = states
                        .iter()
                        .find(|s| s.name == range.pool_name)
                        .and_then(|s| s.snapshot.held.get(held_index as usize))
                        .ok_or(IpamError::EngineAnswer { detail: "reused an entry it was not given" })?;
                    let moved = held.pod_ref != request.pod_ref || held.ifname != request.ifname;
                    if held.claim.is_some() && (moved || held.container_id != request.container_id) {
                        let holder = Allocation {
                            offset: held.offset,
                            container_id: request.container_id.clone(),
                            pod_ref: request.pod_ref.clone(),
                            ifname: request.ifname.clone(),
                            claim: held.claim.clone(),
                        };
                        changes.push(pool_of(range), Change::TakeOver { offset: held.offset, from: held.container_id.clone(), holder });
                    } else if held.container_id != request.container_id {
                        changes.push(pool_of(range), Change::SetContainerId { offset: held.offset, container_id: request.container_id.clone() });
                    } else {
                        // The read may lag behind the pool (Kubernetes reads
                        // its cache): the entry may be gone already.
                        changes.push(pool_of(range), Change::Keep { offset: held.offset, container_id: request.container_id.clone() });
                    }
                    assignments.push(assignment);
                }
            }
        }
        let updates = if changes.is_empty() { Vec::new() } else { changes.into_updates(loaded) };
        Ok((assignments, updates))
    })
}

impl Attachment<'_> {
    /// Whether `entry` is held by this attachment now (its container and
    /// interface), whoever owns it.
    fn holds(&self, entry: &Allocation) -> bool {
        entry.container_id == self.container_id && entry.ifname == self.ifname
    }
}

impl From<Attachment<'_>> for model::Attachment {
    fn from(who: Attachment) -> Self {
        model::Attachment { container_id: who.container_id.into(), ifname: who.ifname.into(), claim: who.claim.cloned() }
    }
}

/// Removes the entries of `pool` the engine finds for `attachments` (and, when
/// reserving, their reservations); `each` sees every removed entry. Returns how many.
#[allow(clippy::too_many_arguments, reason = "one call site per command, each naming what it passes")]
fn release_in(
    engine: &mut EngineComponent,
    config: &NormalizedConfig,
    pool: &PoolId,
    entries: &[Allocation],
    attachments: &[model::Attachment],
    reserving: bool,
    changes: &mut Changes,
    mut each: impl FnMut(&Allocation),
) -> Result<usize, IpamError> {
    let Some(range) = config.range_of_pool(&pool.name) else { return Ok(0) };
    let mut removed = 0;
    for released in engine.release(range, &config.network_name, entries, attachments).map_err(EngineFailure)? {
        let Some(entry) = entries.get(released.index as usize) else { continue };
        // Removed already: a DEL queued behind this one under its own
        // attachment (a ticket it left behind), or named twice.
        if changes.has(pool, &Change::Remove { offset: entry.offset }) {
            continue;
        }
        changes.push(pool.clone(), Change::Remove { offset: entry.offset });
        if reserving && let Some(name) = released.reservation {
            changes.push(pool.clone(), Change::Unreserve { name, holder: entry.clone() });
        }
        each(entry);
        removed += 1;
    }
    Ok(removed)
}

/// What a DEL found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Entries this call's writes removed.
    pub removed: usize,
    /// Whether its first read found the attachment's entries in as many ranges
    /// as an ADD gives it (one with `first_available`): its ADD completed, so
    /// nothing of it lies outside the pools read. When not, a DEL that read the
    /// slices its node remembers reads every slice, and the datastore looks for
    /// reservations a failed ADD left ([`Transaction::free_leftovers`]).
    pub found_all: bool,
}

/// DEL: forgets the attachment's entries in every pool the config's ranges may
/// have given it (each of this node's slices, with node slices). Nothing to
/// forget is success.
pub fn release(
    engine: &mut EngineComponent,
    store: &dyn Datastore,
    config: &NormalizedConfig,
    placement: &Placement,
    who: Attachment,
    deadline: Instant,
) -> Result<Released, IpamError> {
    // One entry per range of the config as written (its slices are ranges of the expanded one).
    let ranges_held = match config.ip_ranges_allocation {
        RangesAllocation::FirstAvailable => 1,
        RangesAllocation::All => config.ranges.len(),
    };
    let config = &placement.expanded(config);
    let pools = placement.pools();
    let reserving = reserves(store, config);
    let purpose = if reserving { Purpose::Release { container_id: who.container_id, ifname: who.ifname } } else { Purpose::Update };
    let mut tx = store.begin(&pools, purpose, deadline)?;
    // A device's release is its own: the DELs of a group are pods'.
    if who.claim.is_none() {
        tx.release_together(&release_group(&config.network_name, &pools), &who.into());
    }
    // Reservations of entries this DEL leaves to a newer container of the same
    // pod (an ADD adopted them): still in use, whoever made them.
    let mut in_use = Vec::new();
    // The reservations of this attachment's entries as first planned: when a
    // later read finds an entry gone (a DEL of its group removed it, see
    // `Transaction::release_together`), the reservation is still this DEL's to drop.
    let mut first_planned: Vec<(PoolId, Change)> = Vec::new();
    let mut found_first: Option<usize> = None;
    let removed = until_committed(tx.as_mut(), &pools, store.capabilities().conflict_pauses, deadline, "DEL", |loaded, _, queued| {
        found_first.get_or_insert_with(|| pools.iter().map(|pool| entries_of(loaded, &pool.name).iter().filter(|e| who.holds(e)).count()).sum());
        let mut changes = Changes::new();
        let mut removed = 0;
        in_use.clear();
        for pool in &pools {
            let entries = entries_of(loaded, &pool.name);
            if reserving && !config.pod_ref.is_empty() {
                let asking = Holder { container_id: who.container_id, pod_ref: &config.pod_ref, ifname: who.ifname };
                let adopted: Vec<model::Attachment> = entries
                    .iter()
                    .filter(|e| e.container_id != who.container_id && same_attachment(e.holder(), asking, Ifname::Required))
                    .map(|e| model::Attachment { container_id: e.container_id.clone(), ifname: e.ifname.clone(), claim: None })
                    .collect();
                if let Some(range) = config.range_of_pool(&pool.name)
                    && !adopted.is_empty()
                {
                    in_use.extend(
                        engine.release(range, &config.network_name, entries, &adopted).map_err(EngineFailure)?.into_iter().filter_map(|r| r.reservation),
                    );
                }
            }
            removed += release_in(engine, config, pool, entries, &[who.into()], reserving, &mut changes, |_| ())?;
            // The DELs this one serves: their entries only; each drops its own
            // reservations once it learns it was served.
            if !queued.is_empty() {
                release_in(engine, config, pool, entries, queued, false, &mut changes, |_| ())?;
            }
        }
        if first_planned.is_empty() {
            first_planned = changes.unreserves().collect();
        } else {
            for (pool, unreserve) in &first_planned {
                let Change::Unreserve { holder, name } = unreserve else { continue };
                let gone = !entries_of(loaded, &pool.name).iter().any(|e| e.offset == holder.offset && e.container_id == holder.container_id);
                // Not gone but adopted: a first read from the apiserver's
                // cache showed the entry still as this container's, and it is
                // a newer container's of the same pod now, reservation and all.
                if gone && !in_use.contains(name) && !changes.has(pool, unreserve) {
                    changes.push(pool.clone(), unreserve.clone());
                }
            }
        }
        let updates = if changes.is_empty() { Vec::new() } else { changes.into_updates(loaded) };
        Ok((removed, updates))
    })?;
    let found_all = found_first.unwrap_or(0) >= ranges_held;
    // With some slices only, the caller looks again in every slice, and that
    // release looks for the leftovers.
    if reserving && !found_all && !placement.some_slices() {
        let leftovers = tx.free_leftovers(&in_use)?;
        if leftovers > 0 {
            crate::logging::verbose(format!(
                "DEL {}/{}: freed {leftovers} reservation(s) an earlier ADD left without a pool entry",
                who.container_id, who.ifname
            ));
        }
    }
    Ok(Released { removed, found_all })
}

/// CHECK: the attachment's entry in each range of the config, with the range
/// (or node slice) it is in; `None` where it has none.
pub fn find(
    store: &dyn Datastore,
    config: &NormalizedConfig,
    placement: &Placement,
    who: Attachment,
    deadline: Instant,
) -> Result<Vec<Option<(NormalizedRange, Allocation)>>, IpamError> {
    let loaded = read_all(store, &placement.pools(), deadline)?;
    let mut found = Vec::with_capacity(config.ranges.len());
    for choices in &placement.choices {
        let mut hit = None;
        for range in choices {
            let entries = entries_of(&loaded, &range.pool_name);
            // Entries inside this range only: two ranges may share a pool with
            // different range_start/range_end. A claim's entry is its holder's
            // too, though no DEL releases it.
            if let Some(entry) = entries.iter().find(|e| who.holds(e) && e.offset >= range.first_offset && e.offset <= range.last_offset) {
                hit = Some((range.clone(), entry.clone()));
                break;
            }
        }
        found.push(hit);
    }
    Ok(found)
}

/// GC: removes every entry of the config's pools that this network created and
/// whose (container ID, ifname) is not a valid attachment. Returns the removed
/// entries with their pools.
///
/// Only this network's own entries: networks on the same range without distinct
/// `network_name`s share a pool, and the valid attachments are those of the
/// calling network alone, so another network's live entries would look like
/// garbage. An entry whose creator is unknown (written before the file store
/// recorded it) is never freed on a guess; its DEL frees it.
///
/// Only for stores this node alone writes: CNI GC lists the attachments of this
/// node's runtime, and in a store shared by every node (Kubernetes, etcd) the
/// other nodes' live entries would look like garbage. There GC removes nothing;
/// whereabouts leaves stale entries to its reconciler, and thereabouts has none
/// yet, so they stay until removed by hand.
pub fn collect_garbage(
    engine: &mut EngineComponent,
    store: &dyn Datastore,
    config: &NormalizedConfig,
    valid: &HashSet<(String, String)>,
    claims_gone: &HashSet<model::Claim>,
    deadline: Instant,
) -> Result<Vec<(PoolId, Allocation)>, IpamError> {
    if store.capabilities().shared_by_nodes {
        crate::logging::verbose(format!(
            "GC: {} is shared by every node; this node's runtime cannot tell which entries are garbage, nothing removed",
            store.describe()
        ));
        return Ok(Vec::new());
    }
    let pools = distinct_pools(config);
    let reserving = reserves(store, config);
    cycle(store, &pools, Purpose::Update, deadline, "GC", |loaded, _| {
        let mut changes = Changes::new();
        let mut removed = Vec::new();
        for pool in &pools {
            let Some(read) = loaded.get(&pool.name) else { continue };
            // Only entries this network created: networks that share a range share
            // its pool, and an entry with no recorded creator (written before the
            // creator was recorded) is never freed on a guess.
            let ours: Vec<Allocation> = read.entries.iter().filter(|e| read.created_by.get(&e.offset).is_some_and(|n| **n == *config.name)).cloned().collect();
            let entries = ours.as_slice();
            // A pod's entry whose attachment the runtime no longer has; a
            // claim's whose claim is gone (its pods come and go: valid or not).
            let garbage: BTreeSet<(&str, &str, Option<&model::Claim>)> = entries
                .iter()
                .filter(|e| match &e.claim {
                    None => !valid.contains(&(e.container_id.clone(), e.ifname.clone())),
                    Some(claim) => claims_gone.contains(claim),
                })
                .map(|e| (e.container_id.as_str(), e.ifname.as_str(), e.claim.as_ref()))
                .collect();
            if garbage.is_empty() {
                continue;
            }
            let garbage: Vec<model::Attachment> = garbage
                .into_iter()
                .map(|(container_id, ifname, claim)| model::Attachment { container_id: container_id.into(), ifname: ifname.into(), claim: claim.cloned() })
                .collect();
            release_in(engine, config, pool, entries, &garbage, reserving, &mut changes, |entry| removed.push((pool.clone(), entry.clone())))?;
        }
        let updates = if changes.is_empty() { Vec::new() } else { changes.into_updates(loaded) };
        Ok((removed, updates))
    })
}

/// Usage of one range, for STATUS and the `pools` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeUsage {
    pub cidr: String,
    pub pool_name: String,
    pub first: String,
    pub last: String,
    pub usable: u128,
    /// Entries on addresses this range hands out.
    pub allocated: u128,
    /// `usable - allocated`.
    pub free: u128,
    /// Every entry of the pool (other ranges on the same pool, stale data included).
    pub pool_entries: usize,
}

pub fn usage(engine: &mut EngineComponent, store: &dyn Datastore, config: &NormalizedConfig, deadline: Instant) -> Result<Vec<RangeUsage>, IpamError> {
    let pools = distinct_pools(config);
    let loaded = read_all(store, &pools, deadline)?;
    let states: Vec<PoolState> = pools.iter().map(|p| pool_state(p, entries_of(&loaded, &p.name))).collect();
    let usage = engine.usage(config, &states).map_err(EngineFailure)?;
    Ok(config
        .ranges
        .iter()
        .zip(usage)
        .map(|(range, u)| RangeUsage {
            cidr: range.cidr.clone(),
            pool_name: range.pool_name.clone(),
            first: range.first.clone(),
            last: range.last.clone(),
            usable: range.usable,
            allocated: u128::from(u.allocated),
            free: u.free,
            pool_entries: entries_of(&loaded, &range.pool_name).len(),
        })
        .collect())
}

/// The config's pools as they are now (their entries' offsets), for the engine's preview.
pub fn pool_states(store: &dyn Datastore, config: &NormalizedConfig, deadline: Instant) -> Result<Vec<PoolState>, IpamError> {
    let pools = distinct_pools(config);
    let loaded = read_all(store, &pools, deadline)?;
    Ok(pools.iter().map(|p| pool_state(p, entries_of(&loaded, &p.name))).collect())
}

/// The claims that own entries of the config's pools.
pub fn claims_held(store: &dyn Datastore, config: &NormalizedConfig, deadline: Instant) -> Result<std::collections::HashSet<model::Claim>, IpamError> {
    let pools = distinct_pools(config);
    let loaded = read_all(store, &pools, deadline)?;
    Ok(pools.iter().flat_map(|p| entries_of(&loaded, &p.name)).filter_map(|e| e.claim.clone()).collect())
}

/// `ip/prefix` of an entry of `range`'s pool.
pub fn address_of(range: &NormalizedRange, offset: u128) -> Option<String> {
    thereabouts_allocator::planner::address_at(range, offset).map(|ip| format!("{ip}/{}", range.prefix_len))
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use super::*;
    use crate::datastore::Version;
    use crate::datastore::pool_note::PoolNote;

    fn pool(name: &str) -> PoolId {
        PoolId { name: name.into(), cidr: format!("{name}/24"), node_local: false }
    }

    #[test]
    fn changes_group_by_pool_in_first_use_order_with_read_versions() {
        let mut changes = Changes::new();
        changes.push(pool("b"), Change::Remove { offset: 1 });
        changes.push(pool("a"), Change::Remove { offset: 2 });
        changes.push(pool("b"), Change::Remove { offset: 3 });
        let mut read = BTreeMap::new();
        read.insert("b".to_string(), Pool { version: Version("7".into()), ..Pool::default() });
        let updates = changes.into_updates(&read);
        assert_eq!(updates.len(), 2);
        assert_eq!((updates[0].pool.name.as_str(), updates[0].expected.clone(), updates[0].changes.len()), ("b", Version("7".into()), 2));
        assert_eq!((updates[1].pool.name.as_str(), updates[1].expected.clone()), ("a", Version::absent()));
    }

    /// A node's pools of range 0 at `entries` each, bound 2 (`node_slice_max_entries`).
    fn chosen_at(entries: &[usize], past_bound: bool) -> Result<String, IpamError> {
        let text =
            r#"{"cniVersion":"1.0.0","name":"net1","ipam":{"type":"thereabouts","range":"192.0.2.0/24","node_slice_size":"/28","node_slice_max_entries":2}}"#;
        let config = thereabouts_allocator::config::normalize(text, None, "").expect("a valid config");
        let slices = ["192.0.2.0/28", "192.0.2.16/28", "192.0.2.32/28"];
        let mut placement = Placement::of_slices(&config, "node-a", &[&slices[..entries.len()]]);
        if past_bound {
            placement.lift_bound(0);
        }
        let mut loaded = BTreeMap::new();
        for (choice, n) in placement.choices[0].iter().zip(entries) {
            let entry =
                |i: usize| Allocation { offset: 1 + i as u128, container_id: format!("c{i}"), pod_ref: "ns/p".into(), ifname: "eth0".into(), claim: None };
            loaded.insert(choice.pool_name.clone(), Pool { entries: (0..*n).map(entry).collect(), ..Pool::default() });
        }
        let asking = Holder { container_id: "new", pod_ref: "ns/new", ifname: "eth0" };
        chosen(&config, &placement, &loaded, asking, None).map(|c| c.ranges[0].cidr.clone())
    }

    #[test]
    fn an_add_takes_the_first_slice_under_node_slice_max_entries_else_claims_or_fills_past_it() {
        assert_eq!(chosen_at(&[2, 1], false).unwrap(), "192.0.2.16/28");
        assert!(matches!(chosen_at(&[2, 2], false), Err(IpamError::SlicesFull { at_bound: true, .. })));
        assert!(matches!(chosen_at(&[14, 14], false), Err(IpamError::SlicesFull { at_bound: false, .. })), "a /28 holds 14");
        // No slice was free to claim: the pools fill up past the bound.
        assert_eq!(chosen_at(&[2, 2], true).unwrap(), "192.0.2.0/28");
    }

    #[test]
    fn an_add_leaves_out_the_pools_its_node_noted_full_unless_they_hold_its_pod_and_reads_them_all_past_the_bound() {
        let text =
            r#"{"cniVersion":"1.0.0","name":"net1","ipam":{"type":"thereabouts","range":"192.0.2.0/24","node_slice_size":"/28","node_slice_max_entries":2}}"#;
        let config = thereabouts_allocator::config::normalize(text, None, "").expect("a valid config");
        let placement = Placement::of_slices(&config, "node-a", &[&["192.0.2.0/28", "192.0.2.16/28", "192.0.2.32/28"]]);
        let pool = |i: usize| placement.choices[0][i].pool_name.clone();
        let entry = |offset, pod: &str| Allocation { offset, container_id: format!("c{offset}"), pod_ref: pod.into(), ifname: "eth0".into(), claim: None };
        let full = PoolNote::of(&[entry(1, "ns/a"), entry(2, "ns/b")]);
        let notes = [full.clone(), PoolNote::of(&[entry(3, "ns/c"), entry(4, "ns/d")]), PoolNote::of(&[entry(5, "ns/e")])];
        let two_full = |pools: &[PoolId]| notes.iter().take(pools.len()).cloned().map(Some).collect();
        let reads = |pod: &str, notes: &dyn Fn(&[PoolId]) -> Vec<Option<PoolNote>>| {
            let mut p = placement.clone();
            p.leave_out_full(&config, Holder { container_id: "new", pod_ref: pod, ifname: "eth0" }, notes);
            p
        };
        let names = |p: &Placement| p.pools().into_iter().map(|p| p.name).collect::<Vec<_>>();

        let mut new_pod = reads("ns/new", &two_full);
        assert_eq!(names(&new_pod), [pool(2)]);
        assert_eq!(names(&reads("ns/a", &two_full)), [pool(0), pool(2)], "the pool noted with its pod");
        assert!(names(&reads("ns/new", &|pools: &[PoolId]| vec![Some(full.clone()); pools.len()])).is_empty(), "all noted full: it claims");
        assert_eq!(names(&reads("ns/new", &|pools: &[PoolId]| vec![None; pools.len()])).len(), 3, "no notes");
        assert!(new_pod.left_out_some(0));
        new_pod.lift_bound(0);
        assert_eq!(names(&new_pod).len(), 3, "no slice free: it reads them all, past the bound");
    }

    /// A DEL in its turn serves the DELs queued behind it: an entry is
    /// removed once, even when the queue names this DEL's own attachment.
    #[test]
    fn a_del_serving_its_own_attachment_from_the_queue_removes_each_entry_once() {
        let mut engine = crate::component::test_engine();
        let stdin = r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","datastore":"file","range":"192.0.2.0/24"}}"#;
        let config = engine.normalize(stdin, None, "").unwrap().unwrap();
        let entry = |offset, cid: &str| Allocation { offset, container_id: cid.into(), pod_ref: String::new(), ifname: "eth0".into(), claim: None };
        let queued = vec![
            model::Attachment { container_id: "c1".into(), ifname: "eth0".into(), claim: None },
            model::Attachment { container_id: "c2".into(), ifname: "eth0".into(), claim: None },
        ];
        let store = Scripted {
            pool: Pool { version: Version("3".into()), entries: vec![entry(5, "c1"), entry(6, "c2")], ..Pool::default() },
            queued,
            ..scripted(vec![Ok(Outcome::Committed)])
        };
        let placement = Placement::whole(&config);
        let removed = release(
            &mut engine,
            &store,
            &config,
            &placement,
            Attachment { container_id: "c1", ifname: "eth0", claim: None },
            Instant::now() + Duration::from_secs(10),
        );
        assert_eq!(removed.unwrap().removed, 1);
        assert_eq!(store.committed.borrow()[0].changes, [Change::Remove { offset: 5 }, Change::Remove { offset: 6 }]);
    }

    /// A DEL that finds its attachment's entries asks for no leftover
    /// reservations (Kubernetes: a LIST that walks every reservation of the
    /// namespace); one that finds none does.
    #[test]
    fn a_del_looks_for_leftover_reservations_only_when_it_misses_an_entry() {
        let mut engine = crate::component::test_engine();
        let stdin = r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","datastore":"file","range":"192.0.2.0/24"}}"#;
        let config = engine.normalize(stdin, None, "").unwrap().unwrap();
        let entry = |cid: &str| Allocation { offset: 5, container_id: cid.into(), pod_ref: String::new(), ifname: "eth0".into(), claim: None };
        for (holder, asked) in [("c1", 0), ("c2", 1)] {
            let store = Scripted {
                pool: Pool { version: Version("3".into()), entries: vec![entry(holder)], ..Pool::default() },
                reservations: true,
                ..scripted(vec![Ok(Outcome::Committed)])
            };
            let who = Attachment { container_id: "c1", ifname: "eth0", claim: None };
            let released = release(&mut engine, &store, &config, &Placement::whole(&config), who, Instant::now() + Duration::from_secs(10)).unwrap();
            assert_eq!((released.found_all, store.leftovers_asked.get()), (asked == 0, asked), "entry of {holder}");
        }
    }

    /// A store whose loads show `pool` and whose commits answer from a
    /// script; it records the commits and counts the transactions ended.
    struct Scripted {
        pool: Pool,
        /// What the first loads show instead of `pool`, one each (a cache behind).
        stale: RefCell<Vec<Pool>>,
        /// What its transactions' `queued_releases` answer.
        queued: Vec<model::Attachment>,
        answers: RefCell<Vec<Result<Outcome, DatastoreError>>>,
        committed: RefCell<Vec<PoolUpdate>>,
        ended: Cell<u32>,
        /// Whether it keeps reservations, and how often a DEL asked it for leftovers.
        reservations: bool,
        leftovers_asked: Cell<u32>,
    }

    struct ScriptedTx<'a>(&'a Scripted);

    impl Transaction for ScriptedTx<'_> {
        fn load(&mut self) -> Result<Vec<Pool>, DatastoreError> {
            let mut stale = self.0.stale.borrow_mut();
            Ok(vec![if stale.is_empty() { self.0.pool.clone() } else { stale.remove(0) }])
        }
        fn commit(&mut self, updates: &[PoolUpdate]) -> Result<Outcome, DatastoreError> {
            self.0.committed.borrow_mut().extend_from_slice(updates);
            self.0.answers.borrow_mut().remove(0)
        }
        fn serialized(&self) -> bool {
            !self.0.queued.is_empty()
        }
        fn queued_releases(&mut self) -> Vec<model::Attachment> {
            self.0.queued.clone()
        }
        fn free_leftovers(&mut self, _in_use: &[String]) -> Result<usize, DatastoreError> {
            self.0.leftovers_asked.set(self.0.leftovers_asked.get() + 1);
            Ok(0)
        }
    }

    impl Drop for ScriptedTx<'_> {
        fn drop(&mut self) {
            self.0.ended.set(self.0.ended.get() + 1);
        }
    }

    impl Datastore for Scripted {
        fn describe(&self) -> String {
            "scripted".into()
        }
        fn capabilities(&self) -> crate::datastore::Capabilities {
            if self.reservations {
                crate::datastore::Capabilities::shared(crate::datastore::retry::DEFAULT_PAUSES)
            } else {
                crate::datastore::Capabilities::NODE_LOCAL
            }
        }
        fn check_usable(&self, _deadline: Instant) -> Result<(), DatastoreError> {
            Ok(())
        }
        fn begin<'s>(&'s self, _pools: &[PoolId], _purpose: Purpose<'_>, _deadline: Instant) -> Result<Box<dyn Transaction + 's>, DatastoreError> {
            Ok(Box::new(ScriptedTx(self)))
        }
    }

    fn scripted(answers: Vec<Result<Outcome, DatastoreError>>) -> Scripted {
        Scripted {
            pool: Pool::default(),
            stale: RefCell::new(Vec::new()),
            queued: Vec::new(),
            answers: RefCell::new(answers),
            committed: RefCell::new(Vec::new()),
            ended: Cell::new(0),
            reservations: false,
            leftovers_asked: Cell::new(0),
        }
    }

    fn one_update() -> Vec<PoolUpdate> {
        vec![PoolUpdate { pool: pool("p"), expected: Version::absent(), changes: vec![Change::Remove { offset: 1 }] }]
    }

    #[test]
    fn attempts_learn_the_conflicts_met_and_the_transaction_ends_however_the_cycle_does() {
        let conflict = || Ok(Outcome::Retry(Retry::Conflict { pool: "p".into() }));
        let reserved = || Ok(Outcome::Retry(Retry::Reserved { pool: "p".into(), name: "192.0.2.1".into() }));
        // Two races and another range's reservation, then success: the reservation
        // is planned around at once and does not count as contention.
        let store = scripted(vec![conflict(), reserved(), conflict(), Ok(Outcome::Committed)]);
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let out = cycle(&store, &[pool("p")], Purpose::Update, deadline, "ADD", |_, contention| {
            seen.push(contention);
            Ok((contention, one_update()))
        });
        assert_eq!(out.unwrap(), 2);
        assert_eq!(seen, [0, 1, 1, 2]);
        assert_eq!(store.ended.get(), 1);
        // Failing calls end the transaction too.
        let store = scripted(vec![conflict(), Err(DatastoreError::Unavailable { server: "s".into(), action: "a".into(), detail: "d".into() })]);
        let unavailable = cycle(&store, &[pool("p")], Purpose::Update, deadline, "ADD", |_, _| Ok(((), one_update())));
        assert!(matches!(unavailable, Err(IpamError::Datastore(DatastoreError::Unavailable { .. }))), "{unavailable:?}");
        assert_eq!(store.ended.get(), 1);
        let store = scripted(vec![conflict()]);
        let failed = cycle(&store, &[pool("p")], Purpose::Update, deadline, "ADD", |_, c| {
            if c == 0 { Ok(((), one_update())) } else { Err(IpamError::Unplaceable { message: "plan failed".into() }) }
        });
        assert!(matches!(failed, Err(IpamError::Unplaceable { message }) if message == "plan failed"));
        assert_eq!(store.ended.get(), 1);
    }

    /// A retried ADD keeps its entry only if the commit finds it still there: a
    /// read from the apiserver's cache can show an entry removed a moment ago
    /// (the call's own rollback), whose address another pod may hold by now.
    #[test]
    fn a_retried_add_keeps_its_entry_only_through_a_guarded_commit() {
        let mut engine = crate::component::test_engine();
        let stdin = r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","datastore":"file","range":"192.0.2.0/24"}}"#;
        let config = engine.normalize(stdin, None, "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p").unwrap().unwrap();
        let entry = Allocation { offset: 5, container_id: "c1".into(), pod_ref: "default/p".into(), ifname: "eth0".into(), claim: None };
        let store = Scripted { pool: Pool { version: Version("3".into()), entries: vec![entry], ..Pool::default() }, ..scripted(vec![Ok(Outcome::Committed)]) };
        let who = Attachment { container_id: "c1", ifname: "eth0", claim: None };
        let out = allocate(&mut engine, &store, &config, &Placement::whole(&config), who, Wishes::default(), Instant::now() + Duration::from_secs(5)).unwrap();
        assert_eq!(out[0].address, "192.0.2.5/24");
        let committed = store.committed.borrow();
        assert_eq!(committed.len(), 1);
        assert_eq!(committed[0].changes, [Change::Keep { offset: 5, container_id: "c1".into() }]);
        assert_eq!(committed[0].expected, Version("3".into()));
    }

    /// The DEL of a pod's old container after a newer one adopted its entry
    /// (a sandbox re-created): a first read from the apiserver's cache can
    /// still show the entry as the old container's. The commit then fails the
    /// entry's test, and the DEL reads again: the entry, and the reservation
    /// named after its address, are the newer container's now, and stay.
    #[test]
    fn a_del_that_first_read_an_adopted_entry_as_its_own_leaves_its_reservation() {
        let mut engine = crate::component::test_engine();
        let stdin = r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","datastore":"file","range":"192.0.2.0/24"}}"#;
        let config = engine.normalize(stdin, None, "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p").unwrap().unwrap();
        let entry = |cid: &str| Allocation { offset: 5, container_id: cid.into(), pod_ref: "default/p".into(), ifname: "eth0".into(), claim: None };
        let store = Scripted {
            pool: Pool { version: Version("4".into()), entries: vec![entry("c2")], ..Pool::default() },
            stale: RefCell::new(vec![Pool { version: Version("3".into()), entries: vec![entry("c1")], ..Pool::default() }]),
            reservations: true,
            ..scripted(vec![Ok(Outcome::Retry(Retry::Conflict { pool: "192.0.2.0-24".into() })), Ok(Outcome::Committed)])
        };
        let who = Attachment { container_id: "c1", ifname: "eth0", claim: None };
        release(&mut engine, &store, &config, &Placement::whole(&config), who, Instant::now() + Duration::from_secs(10)).unwrap();
        let committed = store.committed.borrow();
        assert!(matches!(committed[0].changes[..], [Change::Remove { offset: 5 }, Change::Unreserve { .. }]), "{:?}", committed[0]);
        assert!(committed[1..].iter().all(|u| u.changes.is_empty()), "after the second read: {:?}", &committed[1..]);
    }
}
