//! Where each range of a config may take an address on this node: the range
//! itself, or, for a range with `node_slice_size`, the slices of it this node
//! holds (each a range of its own to the engine, with its own per-node pool).
//! Resolved once per call, before the pools are read: one read of each sliced
//! range's `NodeSlicePool`, from the apiserver's cache.

use std::time::Instant;

use thereabouts_allocator::attachment::Holder;
use thereabouts_allocator::ip::Family;
use thereabouts_allocator::model::{NormalizedConfig, NormalizedRange};

use crate::component::{EngineComponent, EngineFailure};
use crate::datastore::pool_note::PoolNote;
use crate::datastore::{Datastore, DatastoreError, NodeSlices, PoolId, SliceCandidates};
use crate::ipam::IpamError;
use crate::node_name;

/// The slices of one range a claim may take, from the engine. The engine's
/// first failure is kept for the caller (the store speaks none of its errors).
struct Candidates<'a> {
    engine: &'a mut EngineComponent,
    range: &'a NormalizedRange,
    network_name: &'a str,
    node: &'a str,
    failure: Option<anyhow::Error>,
}

impl SliceCandidates for Candidates<'_> {
    fn usable(&mut self, slice: &str) -> bool {
        match self.engine.slice_of_range(self.range, self.network_name, self.node, slice) {
            Ok(Ok(_)) => true,
            Ok(Err(_)) => false,
            Err(e) => {
                self.failure.get_or_insert(e);
                false
            }
        }
    }

    fn near_home(&mut self, node: &str, n: usize) -> Vec<String> {
        let count = thereabouts_allocator::slices::count(self.range).unwrap_or(0);
        let Ok(len) = usize::try_from(count) else { return Vec::new() };
        let home = crate::datastore::kubernetes::slices::home(node, len);
        (0..n.min(len)).filter_map(|k| thereabouts_allocator::slices::slice_at(self.range, ((home + k) % len) as u128)).collect()
    }

    fn layout(&mut self) -> Vec<String> {
        match self.engine.node_slices(self.range) {
            Ok(Ok(slices)) => slices,
            Ok(Err(_)) => Vec::new(),
            Err(e) => {
                self.failure.get_or_insert(e);
                Vec::new()
            }
        }
    }
}

/// Per range of the config, the ranges an address may come from, in order of
/// preference.
#[derive(Debug, Clone)]
pub struct Placement {
    pub choices: Vec<Vec<NormalizedRange>>,
    /// Per range of the config: whether its choices are this node's slices.
    sliced: Vec<bool>,
    /// This node's name, when a range is sliced.
    pub node: Option<String>,
    /// Per range of the config: no slice was free when its pools reached
    /// `node_slice_max_entries`, so they fill up past it.
    past_bound: Vec<bool>,
    /// Per range of the config: the pools of its choices an ADD does not read,
    /// as its node noted them at the bound without the asking pod
    /// ([`Placement::leave_out_full`]).
    left_out: Vec<Vec<String>>,
    /// Some range's slices are those the node remembers, maybe not all it
    /// holds (read with [`Claims::Remembered`] or [`Claims::Allowed`]).
    some_slices: bool,
}

/// Whether a call may claim a slice for its node when it holds none (ADD) or
/// only reads what the node holds (every other command), and how it finds
/// what the node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claims {
    /// ADD: the slices the node remembers (read by name), a claim when none has room.
    Allowed,
    /// A DEL's first look: the slices the node remembers, no claim. What a
    /// DEL does not find there it looks for in every slice (see `cni::commands`).
    Remembered,
    /// CHECK, and a DEL's second look: every slice the node holds (a LIST).
    None,
}

impl Placement {
    /// Every range as configured: no node slices.
    pub fn whole(config: &NormalizedConfig) -> Self {
        Placement {
            choices: config.ranges.iter().map(|r| vec![r.clone()]).collect(),
            sliced: vec![false; config.ranges.len()],
            node: None,
            past_bound: vec![false; config.ranges.len()],
            left_out: vec![Vec::new(); config.ranges.len()],
            some_slices: false,
        }
    }

    /// The ranges this node may use. Without `node_slice_size`, [`Placement::whole`]
    /// and no request.
    pub fn resolve(
        engine: &mut EngineComponent,
        store: &dyn Datastore,
        config: &NormalizedConfig,
        claims: Claims,
        deadline: Instant,
    ) -> Result<Self, IpamError> {
        if config.ranges.iter().all(|r| r.node_slicing.is_none()) {
            return Ok(Self::whole(config));
        }
        let node = node_name::discover(config.configuration_path.as_deref())
            .map_err(|e| DatastoreError::Unconfigured { field: "NODENAME", message: e.to_string() })?;
        let mut choices = Vec::with_capacity(config.ranges.len());
        let mut some_slices = false;
        for range in &config.ranges {
            let Some(slicing) = &range.node_slicing else {
                choices.push(vec![range.clone()]);
                continue;
            };
            // A CHECK looks in every slice of the node; an ADD needs one with room.
            let every = claims == Claims::None;
            let mut read = |fresh| {
                let mut candidates = Candidates { engine: &mut *engine, range, network_name: &config.network_name, node: &node, failure: None };
                let found = match store.node_slices(&slicing.slice_pool, &node, fresh, every, &mut candidates, deadline) {
                    // No NodeSlicePool: nothing of this range is on this node. A DEL
                    // (or CHECK) then has nothing to free there; an ADD fails below.
                    Err(DatastoreError::NoSlice { .. }) if claims != Claims::Allowed => Ok(NodeSlices { slices: Vec::new(), all: true }),
                    other => other,
                };
                match candidates.failure {
                    Some(e) => Err(IpamError::from(EngineFailure(e))),
                    None => found.map_err(IpamError::from),
                }
            };
            let mut found = read(false)?;
            if found.slices.is_empty() {
                // The cache may not have seen the controller's assignment yet.
                found = read(true)?;
            }
            some_slices |= !found.all;
            let slices = found.slices;
            let mut ranges = Vec::with_capacity(slices.len());
            for slice in &slices {
                match engine.slice_of_range(range, &config.network_name, &node, slice).map_err(EngineFailure)? {
                    Ok(r) => ranges.push(r),
                    // A slice of an old layout, or one outside range_start/end: never ours to use.
                    Err(e) => crate::logging::debug(format!("slice {slice} of {}: not usable ({})", slicing.slice_pool, e.message)),
                }
            }
            choices.push(ranges);
        }
        let sliced = config.ranges.iter().map(|r| r.node_slicing.is_some()).collect();
        let n = config.ranges.len();
        let mut placement = Placement { choices, sliced, node: Some(node), past_bound: vec![false; n], left_out: vec![Vec::new(); n], some_slices };
        if claims == Claims::Allowed {
            for index in 0..config.ranges.len() {
                if placement.choices[index].is_empty() {
                    placement.claim(engine, store, config, index, deadline)?;
                }
            }
        }
        Ok(placement)
    }

    /// Claims one more slice of range `index` for this node (its slices are
    /// full, or it has none) and adds it to the choices; fails when no slice is free.
    pub fn claim(
        &mut self,
        engine: &mut EngineComponent,
        store: &dyn Datastore,
        config: &NormalizedConfig,
        index: usize,
        deadline: Instant,
    ) -> Result<(), IpamError> {
        let sliced = config.ranges.get(index).and_then(|range| Some((range, range.node_slicing.as_ref()?)));
        let (Some(node), Some((range, slicing))) = (self.node.clone(), sliced) else {
            return Err(IpamError::EngineAnswer { detail: "claim for a range that is not sliced" });
        };
        let mut candidates = Candidates { engine: &mut *engine, range, network_name: &config.network_name, node: &node, failure: None };
        let known: Vec<String> = self.choices[index].iter().map(|r| r.cidr.clone()).collect();
        let claimed = store.claim_slice(&slicing.slice_pool, &node, &known, &mut candidates, deadline)?;
        if let Some(e) = candidates.failure {
            return Err(EngineFailure(e).into());
        }
        let Some(slice) = claimed else {
            return Err(DatastoreError::NoSlice {
                slice_pool: slicing.slice_pool.clone(),
                node,
                detail: format!("every slice of range {} is held by a node or being handed back", range.cidr),
            }
            .into());
        };
        let slice_range = engine
            .slice_of_range(range, &config.network_name, &node, &slice)
            .map_err(EngineFailure)?
            .map_err(|e| IpamError::Unplaceable { message: e.message })?;
        self.choices[index].push(slice_range);
        Ok(())
    }

    /// This node's `slices` of every range of `config` (the choices a
    /// resolve would make), for tests of what an ADD picks.
    #[cfg(test)]
    pub fn of_slices(config: &NormalizedConfig, node: &str, slices: &[&[&str]]) -> Self {
        let choices = config
            .ranges
            .iter()
            .zip(slices)
            .map(|(range, held)| held.iter().filter_map(|s| thereabouts_allocator::slices::in_slice(range, &config.network_name, node, s).ok()).collect())
            .collect();
        let n = config.ranges.len();
        Placement { choices, sliced: vec![true; n], node: Some(node.into()), past_bound: vec![false; n], left_out: vec![Vec::new(); n], some_slices: false }
    }

    /// Whether some range's slices are only those the node remembers: a DEL
    /// that did not find all it looked for should look in every slice.
    pub fn some_slices(&self) -> bool {
        self.some_slices
    }

    /// The entries a pool of range `index` may hold before the node prefers
    /// a new slice: `node_slice_max_entries`, until no slice was free.
    pub fn entry_bound(&self, config: &NormalizedConfig, index: usize) -> Option<u32> {
        let max = config.ranges.get(index)?.node_slicing.as_ref()?.max_entries?;
        (!self.past_bound.get(index).copied().unwrap_or(false)).then_some(max)
    }

    /// The node's pools of range `index` hold `node_slice_max_entries` each
    /// and still have room (or were noted so and left out): claims one more
    /// slice, or, when none is free, reads them all and lets them fill up
    /// past the bound (an ADD never fails for the bound).
    pub fn claim_past_bound(
        &mut self,
        engine: &mut EngineComponent,
        store: &dyn Datastore,
        config: &NormalizedConfig,
        index: usize,
        deadline: Instant,
    ) -> Result<(), IpamError> {
        match self.claim(engine, store, config, index, deadline) {
            Err(IpamError::Datastore(DatastoreError::NoSlice { .. })) => {
                self.lift_bound(index);
                Ok(())
            }
            other => other,
        }
    }

    /// Range `index`'s pools fill up past `node_slice_max_entries`.
    pub(crate) fn lift_bound(&mut self, index: usize) {
        if let Some(past) = self.past_bound.get_mut(index) {
            *past = true;
        }
        self.read_every(index);
    }

    /// An ADD's reads stay flat in the pods of its node: of each range with
    /// `node_slice_max_entries`, it leaves out the pools its node noted at
    /// the bound that do not hold `asking` already (`pool_note.rs`). So a
    /// node with many full slices reads the one it fills, not all of them,
    /// and when all are noted full it claims a slice without reading them.
    /// `notes`: [`Datastore::pool_notes`].
    pub fn leave_out_full(&mut self, config: &NormalizedConfig, asking: Holder, notes: &dyn Fn(&[PoolId]) -> Vec<Option<PoolNote>>) {
        for index in 0..self.choices.len() {
            let Some(bound) = self.entry_bound(config, index) else { continue };
            let pools: Vec<PoolId> = self.choices[index].iter().map(crate::ipam::pool_of).collect();
            let notes = notes(&pools);
            let full: Vec<String> = pools
                .iter()
                .zip(notes)
                .filter(|(_, note)| note.as_ref().is_some_and(|n| n.entries >= bound as usize && !n.may_hold(asking)))
                .map(|(pool, _)| pool.name.clone())
                .collect();
            self.left_out[index] = full;
        }
    }

    /// An IPAMClaim keeps `addresses`: each sliced range with one of them
    /// reads and writes only the pool of the slice that holds it, whichever
    /// node holds the slice (a VM moved to another node keeps its address,
    /// which stays in the first node's slice until the claim is deleted).
    pub fn hold_claim(
        &mut self,
        engine: &mut EngineComponent,
        store: &dyn Datastore,
        config: &NormalizedConfig,
        addresses: &[std::net::IpAddr],
        deadline: Instant,
    ) -> Result<(), IpamError> {
        for (index, range) in config.ranges.iter().enumerate() {
            let Some(slicing) = &range.node_slicing else { continue };
            let Some(address) = addresses.iter().find(|ip| thereabouts_allocator::planner::offset_of(range, **ip).is_some()) else { continue };
            let slices = engine.node_slices(range).map_err(EngineFailure)?.map_err(|e| IpamError::Unplaceable { message: e.message })?;
            let holds = |slice: &&String| {
                thereabouts_allocator::ip::parse_cidr(slice, true)
                    .is_some_and(|c| c.contains(Family::of(*address), thereabouts_allocator::ip::to_u128(*address)))
            };
            let Some(slice) = slices.iter().find(holds) else { continue };
            let Some(node) = store.slice_holder(&slicing.slice_pool, slice, deadline)? else {
                return Err(IpamError::Unplaceable {
                    message: format!("the claim's address {address} is in slice {slice} of {}, which no node holds", slicing.slice_pool),
                });
            };
            let held = engine
                .slice_of_range(range, &config.network_name, &node, slice)
                .map_err(EngineFailure)?
                .map_err(|e| IpamError::Unplaceable { message: e.message })?;
            self.choices[index] = vec![held];
            self.read_every(index);
        }
        Ok(())
    }

    /// Range `index`'s choices an ADD reads.
    pub fn reading(&self, index: usize) -> impl Iterator<Item = &NormalizedRange> {
        let left_out = self.left_out.get(index).map(Vec::as_slice).unwrap_or_default();
        self.choices.get(index).into_iter().flatten().filter(|r| !left_out.contains(&r.pool_name))
    }

    /// Whether the call left out pools of range `index`.
    pub fn left_out_some(&self, index: usize) -> bool {
        self.left_out.get(index).is_some_and(|left| !left.is_empty())
    }

    /// Reads every pool of range `index` from now on.
    fn read_every(&mut self, index: usize) {
        if let Some(left) = self.left_out.get_mut(index) {
            left.clear();
        }
    }

    /// Whether any range is sliced.
    pub fn is_sliced(&self) -> bool {
        self.node.is_some()
    }

    /// Every pool a choice the call reads is on, each once, in range order; a
    /// node's slice pools are [`PoolId::node_local`].
    pub fn pools(&self) -> Vec<PoolId> {
        let mut pools = crate::ipam::distinct_pools_of((0..self.choices.len()).flat_map(|index| self.reading(index)));
        for pool in &mut pools {
            pool.node_local = self.choices.iter().zip(&self.sliced).any(|(c, sliced)| *sliced && c.iter().any(|r| r.pool_name == pool.name));
        }
        pools
    }

    /// The config with every choice as a range of its own: what a DEL searches,
    /// and what usage reports per slice.
    pub fn expanded(&self, config: &NormalizedConfig) -> NormalizedConfig {
        NormalizedConfig { ranges: self.choices.iter().flatten().cloned().collect(), ..config.clone() }
    }
}
