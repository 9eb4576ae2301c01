//! A cluster's state as `kubectl get ippools,overlappingrangeipreservations,
//! nodeslicepools,ipamclaims -o json` prints it, turned into the pools one
//! config plans from (see `cluster-pools` in the WIT): what `thereabouts
//! preview --from-objects` and the playground start from, read by the same
//! names the Kubernetes datastore reads (`network_name`-scoped pool names; a
//! sliced range's per-node pools, found through its `NodeSlicePool`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde_json::Value;

use crate::error::{ConfigError, Result, code};
use crate::ip::{self, Family, format_ip, from_u128, to_u128};
use crate::model::{Allocation, Claim, NormalizedConfig, NormalizedRange, PoolSnapshot, PoolState};
use crate::{naming, objects};

/// What a cluster's objects hold for one config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterState {
    /// One per pool of the config, in range order: what `preview` and `usage` take.
    pub pools: Vec<PoolState>,
    /// Every entry of those pools, by range then offset.
    pub entries: Vec<ClusterEntry>,
    /// Reservations of addresses of the config's ranges that no entry of the
    /// range's pool holds (another network's, a pool this config does not
    /// read, a racing ADD's): taken, as the plugin would find them.
    pub reserved: Vec<ReservedAddress>,
    /// Every `IPAMClaim` listed.
    pub ipam_claims: Vec<IpamClaimFound>,
    /// Objects that change nothing for this config, and why.
    pub ignored: Vec<IgnoredObject>,
}

/// One pool entry, placed in its range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterEntry {
    /// The first range (index into the config's) on the entry's pool.
    pub range_index: u32,
    /// The `IPPool` holding it (a node's pool for a sliced range).
    pub pool_object: String,
    /// The address, without prefix.
    pub ip: String,
    /// `offset` from the range's network (not the node slice's).
    pub allocation: Allocation,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservedAddress {
    pub range_index: u32,
    pub ip: String,
    /// The reservation's `metadata.name`.
    pub name: String,
    pub pod_ref: String,
    pub claim: Option<Claim>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamClaimFound {
    /// `namespace/name`, as an entry's `ipamclaimref` names it.
    pub name: String,
    /// `spec.network`, `spec.interface`.
    pub network: String,
    pub interface: String,
    pub ips: Vec<String>,
    pub owner_pod: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredObject {
    pub kind: String,
    pub name: String,
    pub reason: String,
}

/// Where an `IPPool` of the config puts its entries.
struct Target {
    pool: String,
    range_index: usize,
    /// The pool's network minus the range's (a node's slice starts inside it).
    shift: u128,
}

/// The pools `config` plans from, given `objects`: JSON of a `v1` `List`
/// (`items`), or one object.
pub fn cluster_pools(config: &NormalizedConfig, objects: &str) -> Result<ClusterState> {
    let document: Value = serde_json::from_str(objects).map_err(|e| ConfigError::new(code::DECODE, "objects", format!("objects: not JSON: {e}")))?;
    let items = items_of(&document)?;
    let mut state = ClusterState::default();
    let (targets, slice_pools) = targets(config, &items);
    let mut taken: BTreeMap<String, BTreeSet<u128>> = BTreeMap::new();
    let mut read_pools = BTreeSet::new();
    let mut reservations = Vec::new();
    let mut ignored = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let kind = item.get("kind").and_then(Value::as_str).unwrap_or_default();
        let name = item.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let namespace = item.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
        let mut ignore = |reason: String| ignored.push(IgnoredObject { kind: kind.to_string(), name: name.to_string(), reason });
        match kind {
            "IPPool" => match targets.get(name) {
                None => ignore("not a pool of this config".into()),
                Some(_) if !read_pools.insert(name) => ignore(format!("an IPPool named {name} came earlier in the list (another namespace?)")),
                Some(target) => {
                    let pool = objects::pool_entries(item)
                        .map_err(|e| ConfigError::new(code::DECODE, format!("objects.items[{index}].spec.allocations"), format!("IPPool {name}: {e}")))?;
                    let range = &config.ranges[target.range_index];
                    let held = taken.entry(target.pool.clone()).or_default();
                    for keyed in pool.entries {
                        let offset = target.shift.saturating_add(keyed.entry.offset);
                        let Some(ip) = address(range, offset) else {
                            ignore(format!("entry {} is outside the range's network", keyed.key));
                            continue;
                        };
                        held.insert(offset);
                        let allocation = Allocation { offset, ..keyed.entry };
                        state.entries.push(ClusterEntry { range_index: target.range_index as u32, pool_object: name.to_string(), ip, allocation });
                    }
                    for key in pool.unparsable {
                        ignore(format!("key {key:?} is no offset (or repeats one), skipped as whereabouts skips it"));
                    }
                }
            },
            "OverlappingRangeIPReservation" if !config.enable_overlapping_ranges => {
                ignore("enable_overlapping_ranges is false: the plugin reads no reservation".into())
            }
            "OverlappingRangeIPReservation" => reservations.push(objects::reservation(item)),
            "NodeSlicePool" if slice_pools.contains(name) => {}
            "NodeSlicePool" => ignore("not the NodeSlicePool of a range of this config".into()),
            "IPAMClaim" => {
                let status = objects::ipam_claim_status(item);
                let spec = |field: &str| item.pointer(&format!("/spec/{field}")).and_then(Value::as_str).unwrap_or_default().to_string();
                state.ipam_claims.push(IpamClaimFound {
                    name: format!("{namespace}/{name}"),
                    network: spec("network"),
                    interface: spec("interface"),
                    ips: status.ips,
                    owner_pod: status.owner_pod,
                });
            }
            "" => ignore(format!("items[{index}] has no kind")),
            other => ignore(format!("kind {other} is not read")),
        }
    }
    state.ignored = ignored;
    let mut reserved: BTreeMap<String, BTreeSet<u128>> = BTreeMap::new();
    for r in reservations {
        match reserved_at(config, &r, &taken) {
            Ok(found) => {
                for (pool, offset, at) in found {
                    reserved.entry(pool).or_default().insert(offset);
                    state.reserved.push(at);
                }
            }
            Err(reason) => state.ignored.push(IgnoredObject { kind: "OverlappingRangeIPReservation".into(), name: r.name.clone(), reason }),
        }
    }
    state.entries.sort_by_key(|e| (e.range_index, e.allocation.offset));
    state.pools = pool_states(config, &taken, &reserved);
    Ok(state)
}

/// The objects of a `List`, or the one object given.
fn items_of(document: &Value) -> Result<Vec<&Value>> {
    let not_a_list =
        || ConfigError::new(code::DECODE, "objects", "objects: expected what `kubectl get ... -o json` prints: a List with items, or one object with a kind");
    let object = document.as_object().ok_or_else(not_a_list)?;
    match object.get("items") {
        Some(Value::Array(items)) => Ok(items.iter().collect()),
        Some(Value::Null) => Ok(Vec::new()),
        Some(_) => Err(ConfigError::new(code::DECODE, "objects.items", "objects.items: not a list")),
        None if object.get("kind").is_some_and(Value::is_string) => Ok(vec![document]),
        None => Err(not_a_list()),
    }
}

/// Every `IPPool` name the config reads, with where its entries go, and the
/// `NodeSlicePool`s read to find a sliced range's node pools.
fn targets(config: &NormalizedConfig, items: &[&Value]) -> (BTreeMap<String, Target>, BTreeSet<String>) {
    let mut targets = BTreeMap::new();
    let mut slice_pools = BTreeSet::new();
    for (range_index, range) in config.ranges.iter().enumerate() {
        let pool = range.pool_name.clone();
        targets.entry(pool.clone()).or_insert(Target { pool: pool.clone(), range_index, shift: 0 });
        let Some(slicing) = &range.node_slicing else { continue };
        for item in items.iter().filter(|o| o.get("kind").and_then(Value::as_str) == Some("NodeSlicePool")) {
            let name = item.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            // The layout object, or one of its slice objects (one per held slice).
            let slice_object = name.strip_prefix(slicing.slice_pool.as_str()).is_some_and(|rest| rest.starts_with("-slice-"));
            if name != slicing.slice_pool && !slice_object {
                continue;
            }
            slice_pools.insert(name.to_string());
            for (node, slice) in held_slices(item) {
                let Some(cidr) = ip::parse_cidr(&slice, false).filter(|c| range.network_contains(c.family(), c.network())) else { continue };
                let node_pool = naming::node_pool_name(&cidr.network_text(), &node, &config.network_name);
                targets.entry(node_pool).or_insert(Target { pool: pool.clone(), range_index, shift: cidr.network() - range.network });
            }
        }
    }
    (targets, slice_pools)
}

/// `status.allocations` of a `NodeSlicePool`: `(nodeName, sliceRange)` of each held slice.
fn held_slices(object: &Value) -> Vec<(String, String)> {
    let listed = object.pointer("/status/allocations").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    listed
        .iter()
        .filter_map(|a| Some((a.get("nodeName")?.as_str()?.to_string(), a.get("sliceRange")?.as_str()?.to_string())))
        .filter(|(node, _)| !node.is_empty())
        .collect()
}

fn address(range: &NormalizedRange, offset: u128) -> Option<String> {
    crate::planner::address_at(range, offset).map(format_ip)
}

/// The address a reservation's name gives (see `naming::reservation_name`),
/// for this config's `network_name`.
fn reserved_address(name: &str, network_name: &str) -> Option<IpAddr> {
    let bare = if network_name.is_empty() { name } else { name.strip_prefix(network_name)?.strip_prefix('-')? };
    ip::parse_ip_strict(bare).or_else(|| ip::parse_ip_strict(&bare.replace('-', ":")))
}

/// The pools (and their offsets) a reservation takes an address of: those of
/// the config's ranges whose network holds it, and whose pool holds no entry
/// there (the entry's own reservation changes nothing).
fn reserved_at(
    config: &NormalizedConfig,
    r: &objects::Reservation,
    taken: &BTreeMap<String, BTreeSet<u128>>,
) -> std::result::Result<Vec<(String, u128, ReservedAddress)>, String> {
    let ip = reserved_address(&r.name, &config.network_name).ok_or_else(|| match config.network_name.as_str() {
        "" => "its name is no address (a reservation of a network with a network_name?)".to_string(),
        scope => format!("its name is not {scope}- and an address: another network's"),
    })?;
    let (family, value) = (Family::of(ip), to_u128(ip));
    let mut pools = BTreeSet::new();
    let mut found = Vec::new();
    let mut inside = false;
    for (index, range) in config.ranges.iter().enumerate() {
        if !range.network_contains(family, value) || !pools.insert(range.pool_name.as_str()) {
            continue;
        }
        inside = true;
        let offset = value - range.network;
        if taken.get(&range.pool_name).is_some_and(|t| t.contains(&offset)) {
            continue;
        }
        let at = ReservedAddress {
            range_index: index as u32,
            ip: format_ip(from_u128(family, value)),
            name: r.name.clone(),
            pod_ref: r.podref.clone(),
            claim: r.claim.clone(),
        };
        found.push((range.pool_name.clone(), offset, at));
    }
    if !inside {
        return Err("the address is in none of the config's ranges".into());
    }
    Ok(found)
}

/// One pool state per distinct pool of the config, in range order.
fn pool_states(config: &NormalizedConfig, taken: &BTreeMap<String, BTreeSet<u128>>, reserved: &BTreeMap<String, BTreeSet<u128>>) -> Vec<PoolState> {
    let mut seen = BTreeSet::new();
    let none = BTreeSet::new();
    config
        .ranges
        .iter()
        .filter(|r| seen.insert(r.pool_name.as_str()))
        .map(|r| {
            let mut snapshot = PoolSnapshot::with_taken(taken.get(&r.pool_name).unwrap_or(&none).iter().copied());
            snapshot.reserved = reserved.get(&r.pool_name).unwrap_or(&none).iter().copied().collect();
            PoolState { name: r.pool_name.clone(), snapshot }
        })
        .collect()
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
