//! What a datastore holds, compared with what the CNI results said: the
//! allocations of a pool by address ([`PoolEntry`]), the reservations of some
//! ranges, and [`check_held`], which ties each successful ADD to its entries and
//! reservations (the same check for IPPools and for etcd pool keys).

use std::collections::BTreeMap;
use std::net::IpAddr;

use anyhow::{Context, Result};
use serde_json::Value;
use thereabouts_e2e::history::{Attachment, History, attachment_of_entry};
use thereabouts_e2e::{Outcome, add_offset, addr_of, range_network};

use crate::addresses::{contains, reservation_name};
use crate::plugin::Objects;

/// One entry of an IPPool, with its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolEntry {
    pub key: String,
    pub address: IpAddr,
    pub id: String,
    pub podref: String,
    pub ifname: String,
}

/// `spec.allocations` of the pool `name` (of `range`) by address. Panics on a
/// key that is not a decimal offset.
pub fn pool_entries(objects: &Objects, name: &str, range: &str) -> Result<BTreeMap<IpAddr, PoolEntry>> {
    entries_by_address(name, range, objects.allocations(name)?)
}

/// Allocations in the IPPool spec shape (decimal offset → `{id, podref,
/// ifname}`) of the pool `name` (of `range`), by address: what an IPPool and
/// an etcd pool key both hold.
pub fn entries_by_address(name: &str, range: &str, allocations: BTreeMap<String, Value>) -> Result<BTreeMap<IpAddr, PoolEntry>> {
    let (net, _) = range_network(range);
    let mut out = BTreeMap::new();
    for (key, v) in allocations {
        let offset: u128 = key.parse().with_context(|| format!("pool {name}: allocation key {key:?} is no offset"))?;
        let address = add_offset(net, offset);
        let text = |f: &str| v[f].as_str().unwrap_or_default().to_string();
        out.insert(address, PoolEntry { key, address, id: text("id"), podref: text("podref"), ifname: text("ifname") });
    }
    Ok(out)
}

/// Whether the reservation `name` (`network_name` unset) is of an address in
/// one of `ranges`.
pub fn reserves_in(name: &str, ranges: &[&str]) -> bool {
    name.replace('-', ":").parse::<IpAddr>().is_ok_and(|ip| ranges.iter().any(|r| contains(r, ip)))
}

/// The reservations (ORIP `spec`s by name) whose address lies in one of `ranges`.
pub fn reservations_in(objects: &Objects, ranges: &[&str]) -> Result<BTreeMap<String, Value>> {
    Ok(objects.reservations()?.into_iter().filter(|(name, _)| reserves_in(name, ranges)).collect())
}

/// Checks that every successful ADD of `outcomes` got exactly one address per
/// range (of `ranges`), that no address went to two of them, that each
/// address's entry in its pool (`entries`, one map per range, as the datastore
/// holds them) names the call's container, pod and interface, and that each
/// address has one reservation (by [`reservation_name`]) held by that pod.
/// Panics with the first violation. Returns the addresses per range.
pub fn check_held(
    ranges: &[&str],
    outcomes: &[&Outcome],
    entries: &[BTreeMap<IpAddr, PoolEntry>],
    reservations: &BTreeMap<String, Value>,
) -> Vec<BTreeMap<IpAddr, String>> {
    assert_eq!(entries.len(), ranges.len(), "one pool per range");
    let mut by_range: Vec<BTreeMap<IpAddr, String>> = vec![BTreeMap::new(); ranges.len()];
    for o in outcomes {
        let ips = o.ips();
        assert_eq!(ips.len(), ranges.len(), "one address per range: {}", o.describe());
        for ((ip, range), seen) in ips.iter().zip(ranges).zip(by_range.iter_mut()) {
            let a = addr_of(ip);
            assert!(contains(range, a), "{ip} is not in {range}: {}", o.describe());
            if let Some(other) = seen.insert(a, o.call.container_id.clone()) {
                panic!("{a} was handed out twice: to {other} and to {}", o.call.container_id);
            }
        }
    }
    for ((range, pool), seen) in ranges.iter().zip(entries).zip(&by_range) {
        for (a, cid) in seen {
            let o = outcomes.iter().find(|o| &o.call.container_id == cid).expect("an outcome per address");
            let podref = format!("default/{}", o.call.pod_name());
            let e = pool.get(a).unwrap_or_else(|| panic!("{a} of {cid} is not in the pool of {range}"));
            assert_eq!((e.id.as_str(), e.podref.as_str(), e.ifname.as_str()), (cid.as_str(), podref.as_str(), "eth0"), "pool of {range}, entry {}", e.key);
            let held = reservations.get(&reservation_name(*a)).unwrap_or_else(|| panic!("no reservation for {a} of {cid}"));
            assert_eq!(held["podref"], podref, "reservation of {a}");
        }
    }
    by_range
}

/// The history of `outcomes` (every ADD and DEL of a run, [`History`])
/// checked against the pools as read now (`entries`, one map per range): no
/// address certainly held by two attachments at once, and the pools hold what
/// the history leaves held, nothing more (another client's entries aside).
/// Panics naming every violation.
pub fn check_history(outcomes: &[&Outcome], entries: &[BTreeMap<IpAddr, PoolEntry>]) {
    let held: BTreeMap<IpAddr, Attachment> = entries.iter().flatten().map(|(a, e)| (*a, attachment_of_entry(&e.podref, &e.id, &e.ifname))).collect();
    let found = History::of(outcomes).check(&held);
    assert!(found.is_empty(), "the history of {} calls against the pools: {found:#?}", outcomes.len());
}
