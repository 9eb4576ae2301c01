//! The pool document: how every store that writes a pool whole (the file
//! store's slots, the etcd pool keys) encodes it, in one place.
//!
//! `{"range": "<CIDR>", "allocations": {"<decimal offset>": {"id", "podref",
//! "ifname"}}}` (and `ipamclaimref` or `resourceclaimref` on an entry a claim
//! owns, [`claim_fields`]): the shape of whereabouts' `IPPool` spec (its `IPAllocation`
//! JSON names, in its field order), keys in ascending numeric order. The file
//! store also records the CNI network that created each entry (`network`): once
//! for the pool when one network created every entry (the usual pool), per
//! entry otherwise; and each entry made without a reservation (by a network
//! with `enable_overlapping_ranges: false`) as `"unreserved": true`, so that an
//! overlapping pool does not count it as one. The Kubernetes store writes the same entry shape
//! ([`entry_value`]) but reads `IPPool` objects as whereabouts does, keys it
//! wrote before v0.5 included (`kubernetes::crd::parse_pool`).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thereabouts_allocator::model::{Allocation, Claim};

/// A pool as read: its range and entries in ascending offset order (one per
/// offset), with the network that created each where known. A list, not a
/// map: most reads only plan, and the list is what the planner takes (a map
/// here cost a 100-entry file-store ADD 2 % more instructions).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolDocument {
    pub range: String,
    pub entries: Vec<Allocation>,
    pub created_by: BTreeMap<u128, Arc<str>>,
    /// The offsets whose entry was made without a reservation.
    pub unreserved: BTreeSet<u128>,
}

/// The document on the wire. Typed, with strings borrowed from the input where
/// they need no unescaping, rather than a `serde_json::Value`: a DEL of a
/// 100-entry file pool spent most of its time building and hashing generic maps.
#[derive(Serialize, Deserialize)]
struct Wire<'a> {
    #[serde(borrow)]
    range: Cow<'a, str>,
    /// The network of every entry that names none, written when one network
    /// created them all: the name once, not once per entry, which cost every
    /// read and write of a full pool ~10 % more instructions (callgrind, 100
    /// entries per pool).
    #[serde(borrow, default, skip_serializing_if = "str::is_empty")]
    network: Cow<'a, str>,
    #[serde(borrow, default)]
    allocations: BTreeMap<u128, WireEntry<'a>>,
}

#[derive(Serialize, Deserialize)]
struct WireEntry<'a> {
    #[serde(borrow, default)]
    id: Cow<'a, str>,
    #[serde(borrow, default)]
    podref: Cow<'a, str>,
    #[serde(borrow, default)]
    ifname: Cow<'a, str>,
    /// Empty when unknown: serde borrows from the input into a `Cow<str>`
    /// field, not into an `Option<Cow<str>>`, and this is read for every entry.
    #[serde(borrow, default, skip_serializing_if = "str::is_empty")]
    network: Cow<'a, str>,
    /// Made without a reservation: not one for an overlapping pool.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    unreserved: bool,
    /// The owner when a claim owns the entry ([`claim_fields`]).
    #[serde(borrow, default, skip_serializing_if = "str::is_empty")]
    ipamclaimref: Cow<'a, str>,
    #[serde(borrow, default, skip_serializing_if = "str::is_empty")]
    resourceclaimref: Cow<'a, str>,
}

impl<'a> WireEntry<'a> {
    fn of(a: &'a Allocation, network: &'a str, unreserved: bool) -> Self {
        let (ipamclaimref, resourceclaimref) = claim_fields(a.claim.as_ref());
        WireEntry {
            id: Cow::Borrowed(&a.container_id),
            podref: Cow::Borrowed(&a.pod_ref),
            ifname: Cow::Borrowed(&a.ifname),
            network: Cow::Borrowed(network),
            unreserved,
            ipamclaimref: Cow::Borrowed(ipamclaimref),
            resourceclaimref: Cow::Borrowed(resourceclaimref),
        }
    }
}

/// How every store records an entry's claim, beside the `id`, `podref` and
/// `ifname` of the pod holding it (which whereabouts reads, so it counts the
/// address as taken): `ipamclaimref: "ns/name"` for an IPAMClaim, the field
/// whereabouts PR #742 adds; `resourceclaimref: "ns/name"` for a
/// ResourceClaim device. Both empty: the pod owns it.
pub fn claim_fields(claim: Option<&Claim>) -> (&str, &str) {
    match claim {
        None => ("", ""),
        Some(Claim::IpamClaim(r)) => (r, ""),
        Some(Claim::ResourceClaim(r)) => ("", r),
    }
}

/// The claim [`claim_fields`] recorded (an IPAMClaim when both are set): the
/// engine's reading, which `IPPool` entries and reservations share.
pub use thereabouts_allocator::objects::claim_of;

/// How the document is laid out: for people reading a node's files, or small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Pretty,
    Compact,
}

/// The document of a pool of `range` holding `entries` (by offset), each
/// created by the network `created_by` names, where known, the entries at
/// `unreserved` made without a reservation.
pub fn encode(
    range: &str,
    entries: &BTreeMap<u128, Allocation>,
    created_by: &BTreeMap<u128, Arc<str>>,
    unreserved: &BTreeSet<u128>,
    format: Format,
) -> Vec<u8> {
    let mut creators = created_by.values();
    let first = creators.next();
    let every = first.filter(|n| created_by.len() == entries.len() && creators.all(|m| m == *n)).map_or("", |n| &**n);
    let allocations = entries
        .iter()
        .map(|(&offset, a)| {
            let network = if every.is_empty() { created_by.get(&offset).map_or("", |n| n) } else { "" };
            (offset, WireEntry::of(a, network, unreserved.contains(&offset)))
        })
        .collect();
    let wire = Wire { range: Cow::Borrowed(range), network: Cow::Borrowed(every), allocations };
    match format {
        Format::Pretty => crate::json::pretty(&wire).into_bytes(),
        // Serializing a derive(Serialize) type into a Vec cannot fail.
        Format::Compact => serde_json::to_vec(&wire).unwrap_or_default(),
    }
}

impl PoolDocument {
    pub fn empty(range: &str) -> Self {
        PoolDocument { range: range.to_string(), ..PoolDocument::default() }
    }

    /// Reads a stored document; the error says what is wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let wire: Wire =
            serde_json::from_slice(bytes).map_err(|e| format!("not a pool document ({{\"range\", \"allocations\": {{decimal offset: entry}}}}): {e}"))?;
        // One allocation per network, not per entry: the entries of a pool come
        // from a handful of networks.
        let mut networks: Vec<Arc<str>> = Vec::new();
        let mut created_by = BTreeMap::new();
        let mut unreserved = BTreeSet::new();
        let every = wire.network;
        let entries = wire
            .allocations
            .into_iter()
            .map(|(offset, e)| {
                let network = if e.network.is_empty() { &*every } else { &*e.network };
                if !network.is_empty() {
                    let known = networks.iter().find(|n| ***n == *network).cloned();
                    let network = known.unwrap_or_else(|| {
                        networks.push(Arc::from(network));
                        Arc::clone(&networks[networks.len() - 1])
                    });
                    created_by.insert(offset, network);
                }
                if e.unreserved {
                    unreserved.insert(offset);
                }
                let claim = claim_of(&e.ipamclaimref, &e.resourceclaimref);
                Allocation { offset, container_id: e.id.into_owned(), pod_ref: e.podref.into_owned(), ifname: e.ifname.into_owned(), claim }
            })
            .collect();
        Ok(PoolDocument { range: wire.range.into_owned(), entries, created_by, unreserved })
    }
}

/// One entry as a pool document holds it, for stores that write entries one
/// by one (the Kubernetes JSON patches).
pub fn entry_value(a: &Allocation) -> serde_json::Value {
    serde_json::to_value(WireEntry::of(a, "", false)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(offset: u128, id: &str) -> Allocation {
        Allocation { offset, container_id: id.into(), pod_ref: "ns/p".into(), ifname: "eth0".into(), claim: None }
    }

    fn by_offset(entries: &[Allocation]) -> BTreeMap<u128, Allocation> {
        entries.iter().map(|a| (a.offset, a.clone())).collect()
    }

    fn creators(pairs: &[(u128, &str)]) -> BTreeMap<u128, Arc<str>> {
        pairs.iter().map(|&(o, n)| (o, Arc::from(n))).collect()
    }

    #[test]
    fn a_claims_entry_keeps_every_field_whereabouts_reads_and_adds_its_claim() {
        let vm = Allocation { claim: Some(Claim::IpamClaim("ns/vm.blue".into())), ..alloc(5, "c") };
        let device = Allocation { claim: Some(Claim::ResourceClaim("ns/rc".into())), ..alloc(6, "uid") };
        assert_eq!(entry_value(&vm), serde_json::json!({"id": "c", "podref": "ns/p", "ifname": "eth0", "ipamclaimref": "ns/vm.blue"}));
        assert_eq!(entry_value(&device)["resourceclaimref"], "ns/rc");
        assert_eq!(entry_value(&alloc(7, "c")), serde_json::json!({"id": "c", "podref": "ns/p", "ifname": "eth0"}), "a pod's, as today");
        let entries = by_offset(&[vm, device, alloc(7, "c")]);
        let read = PoolDocument::decode(&encode("192.0.2.0/24", &entries, &BTreeMap::new(), &BTreeSet::new(), Format::Compact)).unwrap();
        assert_eq!(read.entries, entries.values().cloned().collect::<Vec<_>>());
    }

    #[test]
    fn documents_round_trip_with_keys_in_numeric_order() {
        let wide = u128::from(u64::MAX) + 7;
        let (entries, created_by) = (by_offset(&[alloc(wide, "x\"y"), alloc(2, "b")]), creators(&[(wide, "net-a")]));
        for format in [Format::Pretty, Format::Compact] {
            let bytes = encode("2001:db8::/64", &entries, &created_by, &BTreeSet::from([2]), format);
            let text = String::from_utf8(bytes.clone()).unwrap();
            assert!(text.find("\"2\"").unwrap() < text.find("\"18446744073709551622\"").unwrap(), "{text}");
            let read = PoolDocument::decode(&bytes).unwrap();
            let want = PoolDocument {
                range: "2001:db8::/64".into(),
                entries: entries.values().cloned().collect(),
                created_by: created_by.clone(),
                unreserved: BTreeSet::from([2]),
            };
            assert_eq!(read, want);
        }
        let compact = String::from_utf8(encode("2001:db8::/64", &by_offset(&[alloc(2, "b")]), &BTreeMap::new(), &BTreeSet::new(), Format::Compact)).unwrap();
        assert_eq!(compact, r#"{"range":"2001:db8::/64","allocations":{"2":{"id":"b","podref":"ns/p","ifname":"eth0"}}}"#);
        assert_eq!(entry_value(&alloc(2, "b")), serde_json::json!({"id": "b", "podref": "ns/p", "ifname": "eth0"}));
    }

    #[test]
    fn the_creating_network_is_written_once_when_it_made_every_entry() {
        let entries = by_offset(&[alloc(1, "a"), alloc(2, "b")]);
        for (pairs, uniform) in [(&[(1, "net-a"), (2, "net-a")][..], true), (&[(1, "net-a"), (2, "net-b")], false), (&[(2, "net-a")], false), (&[], false)] {
            let bytes = encode("192.0.2.0/24", &entries, &creators(pairs), &BTreeSet::new(), Format::Compact);
            let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(json.get("network").is_some(), uniform, "{json}");
            assert_eq!(PoolDocument::decode(&bytes).unwrap().created_by, creators(pairs));
        }
    }

    #[test]
    fn malformed_documents_are_errors_and_missing_entry_fields_read_as_empty() {
        let sparse = PoolDocument::decode(br#"{"range": "2001:db8::/64", "allocations": {"5": {"id": "c"}}}"#).unwrap();
        assert_eq!(sparse.entries, [Allocation { offset: 5, container_id: "c".into(), pod_ref: String::new(), ifname: String::new(), claim: None }]);
        assert_eq!(PoolDocument::decode(br#"{"range": "2001:db8::/64"}"#).unwrap(), PoolDocument::empty("2001:db8::/64"));
        for bad in [&br#"{"range": "x", "allocations": []}"#[..], br#"{"range": "x", "allocations": {"-1": {}}}"#, br#"{"allocations": {}}"#, b"{", b"", b"[1]"]
        {
            assert!(PoolDocument::decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
