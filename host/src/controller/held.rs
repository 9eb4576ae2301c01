//! What a shared datastore holds, as the reconciler reads it: every pool entry
//! and every reservation, each with what its guarded removal must test (the
//! entry's `id` as stored; the reservation's UID and version). The same shape
//! for the Kubernetes and the etcd datastore, so one decision serves both.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use thereabouts_allocator::attachment::{Holder, Ifname, owns_record};
use thereabouts_allocator::ip::{self, Family};
use thereabouts_allocator::model::{Allocation, Claim};

/// One pool entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Shared by every entry of the pool (a pass holds 50 000 entries).
    pub pool: Arc<str>,
    pub address: IpAddr,
    /// Container ID, podref and interface, as recorded.
    pub holder: Allocation,
    /// The key it is stored under (whereabouts writes `%d`; `05` stays `05`).
    pub key: String,
    /// The `id` member exactly as stored: what a removal tests.
    pub id: Value,
    /// The pool's version when read (`resourceVersion`, or etcd's `mod_revision`).
    pub pool_version: Arc<str>,
}

/// One `OverlappingRangeIPReservation` (or etcd reservation key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// `[<network_name>-]<address with : as ->`.
    pub name: String,
    pub podref: String,
    pub containerid: String,
    pub ifname: String,
    /// The claim that owns the address, when one does.
    pub claim: Option<Claim>,
    /// What a guarded delete must still find: the object's UID (Kubernetes),
    /// empty on etcd.
    pub uid: String,
    /// `resourceVersion` (Kubernetes) or `mod_revision` (etcd).
    pub version: String,
    /// How long it has existed, when the datastore says.
    pub age: Option<Duration>,
    /// How long this replica has seen it without an entry holding its
    /// address (set by the reconciler, which remembers across passes).
    pub unbacked_for: Option<Duration>,
}

/// A pool's size, for the metrics and `pools --check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSummary {
    pub name: String,
    pub range: String,
    /// Addresses of the range less the network address (and the IPv4
    /// broadcast): a pool does not record its config's exclusions.
    pub capacity: u128,
    pub entries: u128,
    pub without_podref: u64,
    /// Keys that are no offset, and entries outside the range: left alone.
    pub unreadable: Vec<String>,
}

/// Everything read in one pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Holdings {
    pub entries: Vec<Entry>,
    pub reservations: Vec<Reservation>,
    pub pools: Vec<PoolSummary>,
    /// Pools that could not be read at all (named, with why).
    pub unreadable_pools: Vec<String>,
}

impl Holdings {
    /// Adds pool `name` of `range` as read at `version`: its summary, and
    /// each `(entry, key as stored, id as stored)` in range, of the podrefs in
    /// `only` when given. `unreadable` lists what the datastore could not parse.
    pub fn add_pool<'e>(
        &mut self,
        name: &str,
        range: &str,
        version: &str,
        unreadable: Vec<String>,
        entries: impl IntoIterator<Item = (&'e Allocation, String, Value)>,
        only: Option<&BTreeSet<String>>,
    ) {
        let (pool, version): (Arc<str>, Arc<str>) = (name.into(), version.into());
        let mut summary =
            PoolSummary { name: name.to_string(), range: range.to_string(), capacity: capacity_of(range), entries: 0, without_podref: 0, unreadable };
        for (a, key, id) in entries {
            let Some(address) = address_at(range, a.offset) else {
                summary.unreadable.push(format!("offset {} is outside {range:?}", a.offset));
                continue;
            };
            summary.entries += 1;
            // A claim's entry may name no pod (a DRA device's); its claim frees it.
            if !a.pod_ref.contains('/') && a.claim.is_none() {
                summary.without_podref += 1;
            }
            if only.is_some_and(|o| !o.contains(&a.pod_ref)) {
                continue;
            }
            self.entries.push(Entry { pool: pool.clone(), address, holder: a.clone(), key, id, pool_version: version.clone() });
        }
        self.pools.push(summary);
    }
}

/// The address at `offset` of `range` (a pool's `spec.range`), `None` when
/// the range is no CIDR or the offset leaves it.
pub fn address_at(range: &str, offset: u128) -> Option<IpAddr> {
    let cidr = ip::parse_cidr(range, true)?;
    let value = cidr.network().checked_add(offset)?;
    (value <= cidr.broadcast()).then(|| ip::from_u128(cidr.family(), value))
}

/// What [`PoolSummary::capacity`] says of a range.
pub fn capacity_of(range: &str) -> u128 {
    let Some(cidr) = ip::parse_cidr(range, true) else { return 0 };
    let size = (cidr.broadcast() - cidr.network()).saturating_add(1);
    match cidr.family() {
        Family::V4 if cidr.prefix < 31 => size - 2,
        Family::V4 => size,
        Family::V6 if cidr.prefix < 128 => size - 1,
        Family::V6 => size,
    }
}

/// The part of a reservation name that an address becomes (`2001:db8::` →
/// `2001-db8--0`), as whereabouts names reservations.
pub fn reservation_suffix(address: IpAddr) -> String {
    thereabouts_allocator::naming::reservation_name_of(&ip::format_ip(address), "")
}

impl Reservation {
    /// Whether it reserves `address`: its name is the address's, alone or
    /// after a network name.
    pub fn names(&self, address: IpAddr) -> bool {
        let suffix = reservation_suffix(address);
        self.name == suffix || self.name.strip_suffix(&suffix).is_some_and(|rest| rest.ends_with('-'))
    }

    /// Whether it is the reservation of `entry`: its address, and the same
    /// attachment (whereabouts before v0.8.0 wrote no interface) or claim
    /// (whose entry a new pod may hold since).
    pub fn backs(&self, entry: &Entry) -> bool {
        let recorded = Holder { container_id: &self.containerid, pod_ref: &self.podref, ifname: &self.ifname };
        self.names(entry.address) && owns_record(recorded, self.claim.as_ref(), entry.holder.holder(), entry.holder.claim.as_ref(), Ifname::MayBeMissing)
    }
}

/// The parts of a reservation name that may be an address's: the name is
/// `<suffix>` or `<network>-<suffix>`, so every tail after a `-`.
fn name_tails(name: &str) -> impl Iterator<Item = &str> {
    std::iter::once(name).chain(name.match_indices('-').map(move |(i, _)| &name[i + 1..]))
}

/// Entries by the reservation-name part of their address: which entries a
/// reservation may back, without comparing every reservation with every
/// entry (50 000 of each in a large cluster).
pub struct EntryIndex<'a> {
    by_suffix: std::collections::HashMap<String, Vec<&'a Entry>>,
}

impl<'a> EntryIndex<'a> {
    pub fn new(entries: impl IntoIterator<Item = &'a Entry>) -> Self {
        let mut by_suffix: std::collections::HashMap<String, Vec<&'a Entry>> = std::collections::HashMap::new();
        for e in entries {
            by_suffix.entry(reservation_suffix(e.address)).or_default().push(e);
        }
        EntryIndex { by_suffix }
    }

    /// An index of the `entries` that one of `reservations` may back, alone:
    /// a cluster without reservations (or with few) keeps no copy of every
    /// entry's address text.
    pub fn for_reservations(entries: impl IntoIterator<Item = &'a Entry>, reservations: &[Reservation]) -> Self {
        if reservations.is_empty() {
            return EntryIndex { by_suffix: std::collections::HashMap::new() };
        }
        let tails: std::collections::HashSet<&str> = reservations.iter().flat_map(|r| name_tails(&r.name)).collect();
        let mut by_suffix: std::collections::HashMap<String, Vec<&'a Entry>> = std::collections::HashMap::new();
        for e in entries {
            let suffix = reservation_suffix(e.address);
            if tails.contains(suffix.as_str()) {
                by_suffix.entry(suffix).or_default().push(e);
            }
        }
        EntryIndex { by_suffix }
    }

    /// The entries `r` backs ([`Reservation::backs`]).
    pub fn backed_by<'r>(&'r self, r: &'r Reservation) -> impl Iterator<Item = &'a Entry> + 'r {
        name_tails(&r.name).filter_map(|t| self.by_suffix.get(t)).flatten().copied().filter(|e| r.backs(e))
    }

    pub fn is_backed(&self, r: &Reservation) -> bool {
        self.backed_by(r).next().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation(name: &str, podref: &str) -> Reservation {
        Reservation {
            name: name.into(),
            podref: podref.into(),
            containerid: "c1".into(),
            ifname: "net1".into(),
            claim: None,
            uid: String::new(),
            version: String::new(),
            age: None,
            unbacked_for: None,
        }
    }

    #[test]
    fn addresses_are_the_range_network_plus_the_offset() {
        assert_eq!(address_at("192.0.2.0/24", 7), Some("192.0.2.7".parse().unwrap()));
        assert_eq!(address_at("192.0.2.64/26", 1), Some("192.0.2.65".parse().unwrap()));
        assert_eq!(address_at("192.0.2.0/24", 256), None);
        assert_eq!(address_at("2001:db8::/64", 0x10), Some("2001:db8::10".parse().unwrap()));
        assert_eq!(address_at("nonsense", 1), None);
        assert_eq!((capacity_of("192.0.2.0/24"), capacity_of("192.0.2.0/31"), capacity_of("2001:db8::/120")), (254, 2, 255));
    }

    #[test]
    fn a_reservation_names_its_address_with_or_without_a_network() {
        let v6: IpAddr = "2001:db8::".parse().unwrap();
        assert!(reservation("2001-db8--0", "ns/a").names(v6));
        assert!(reservation("blue-2001-db8--0", "ns/a").names(v6));
        assert!(!reservation("2001-db8--1", "ns/a").names(v6));
        let v4: IpAddr = "2.0.2.1".parse().unwrap();
        assert!(!reservation("192.0.2.1", "ns/a").names(v4), "a longer address is another address");
        let entry = |podref: &str, ifname: &str| Entry {
            pool: "p".into(),
            address: "192.0.2.1".parse().unwrap(),
            holder: Allocation { offset: 1, container_id: "c2".into(), pod_ref: podref.into(), ifname: ifname.into(), claim: None },
            key: "1".into(),
            id: Value::Null,
            pool_version: "".into(),
        };
        assert!(reservation("blue-192.0.2.1", "ns/a").backs(&entry("ns/a", "net1")));
        assert!(!reservation("blue-192.0.2.1", "ns/a").backs(&entry("ns/b", "net1")));
        assert!(!reservation("blue-192.0.2.1", "ns/a").backs(&entry("ns/a", "net2")));
        let (mine, other) = (entry("ns/a", "net1"), entry("ns/b", "net1"));
        let index = EntryIndex::new([&mine, &other]);
        assert_eq!(index.backed_by(&reservation("blue-192.0.2.1", "ns/a")).collect::<Vec<_>>(), [&mine]);
        assert!(index.is_backed(&reservation("192.0.2.1", "ns/b")) && !index.is_backed(&reservation("192.0.2.2", "ns/a")));
    }

    #[test]
    fn an_index_for_reservations_holds_only_the_entries_they_may_back() {
        let entry = |address: &str| Entry {
            pool: "p".into(),
            address: address.parse().unwrap(),
            holder: Allocation { offset: 1, container_id: "c1".into(), pod_ref: "ns/a".into(), ifname: "net1".into(), claim: None },
            key: "1".into(),
            id: Value::Null,
            pool_version: "".into(),
        };
        let (one, two) = (entry("192.0.2.1"), entry("192.0.2.2"));
        let reservations = [reservation("blue-192.0.2.1", "ns/a")];
        let index = EntryIndex::for_reservations([&one, &two], &reservations);
        assert_eq!((index.by_suffix.len(), index.backed_by(&reservations[0]).collect::<Vec<_>>()), (1, vec![&one]));
        assert!(EntryIndex::for_reservations([&one, &two], &[]).by_suffix.is_empty());
    }
}
