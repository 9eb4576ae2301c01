//! Where the etcd datastore keeps what, and how a value reads (pure logic).
//!
//! Under a prefix (`etcd_prefix`, default [`DEFAULT_PREFIX`]):
//!
//! - `<prefix>pools/<pool name>`: one key per pool (the engine's pool name:
//!   `[<network_name>-]<range CIDR with : and / as ->`), value the pool as JSON in
//!   the logical shape of a whereabouts `IPPool` spec:
//!   `{"range": "<CIDR>", "allocations": {"<offset>": {"id": <container ID>,
//!   "podref": "<namespace>/<pod>", "ifname": <interface>}}}`, offsets decimal,
//!   in ascending order;
//! - `<prefix>reservations/<reservation name>`: one key per reserved address when
//!   `enable_overlapping_ranges` is on (the name of whereabouts'
//!   `OverlappingRangeIPReservation`: `[<network_name>-]<address with : as ->`),
//!   value `{"containerid", "podref", "ifname"}` of the attachment holding it.
//!
//! A pool's version is the key's `mod_revision` (decimal); absent = empty.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use thereabouts_allocator::attachment::{Holder, Ifname, same_attachment};
use thereabouts_allocator::model::Allocation;

/// Where keys live when `etcd_prefix` is not set.
pub const DEFAULT_PREFIX: &str = "/thereabouts/";

/// The key names of one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
}

impl Layout {
    /// `configured` (`etcd_prefix`) with a trailing `/`, [`DEFAULT_PREFIX`] when unset or empty.
    pub fn new(configured: Option<&str>) -> Self {
        let mut prefix = configured.map(str::trim).filter(|p| !p.is_empty()).unwrap_or(DEFAULT_PREFIX).to_string();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Layout { prefix }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn pool_key(&self, pool_name: &str) -> String {
        format!("{}pools/{pool_name}", self.prefix)
    }

    pub fn reservation_key(&self, reservation_name: &str) -> String {
        format!("{}reservations/{reservation_name}", self.prefix)
    }
}

/// A pool's value: its range and its allocations by offset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolValue {
    pub range: String,
    pub allocations: BTreeMap<u128, EntryValue>,
}

/// One allocation as stored (whereabouts' `IPAllocation` field names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryValue {
    pub id: String,
    #[serde(default)]
    pub podref: String,
    #[serde(default)]
    pub ifname: String,
}

impl PoolValue {
    pub fn empty(range: &str) -> Self {
        PoolValue { range: range.to_string(), allocations: BTreeMap::new() }
    }

    pub fn entries(&self) -> Vec<Allocation> {
        self.allocations
            .iter()
            .map(|(&offset, e)| Allocation { offset, container_id: e.id.clone(), pod_ref: e.podref.clone(), ifname: e.ifname.clone() })
            .collect()
    }

    /// JSON, offsets in ascending numeric order (the map keeps insertion order).
    pub fn encode(&self) -> Vec<u8> {
        let allocations: Map<String, Value> =
            self.allocations.iter().map(|(offset, e)| (offset.to_string(), json!({"id": e.id, "podref": e.podref, "ifname": e.ifname}))).collect();
        json!({"range": self.range, "allocations": allocations}).to_string().into_bytes()
    }

    /// Reads a stored value; the error says what is wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct Raw {
            #[serde(default)]
            range: String,
            #[serde(default)]
            allocations: BTreeMap<String, EntryValue>,
        }
        let raw: Raw = serde_json::from_slice(bytes).map_err(|e| format!("not a pool value: {e}"))?;
        let mut allocations = BTreeMap::new();
        for (key, entry) in raw.allocations {
            let offset = key.parse::<u128>().map_err(|_| format!("allocation key {key:?} is not a decimal offset"))?;
            allocations.insert(offset, entry);
        }
        Ok(PoolValue { range: raw.range, allocations })
    }
}

/// A reservation's value: the attachment holding the address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationValue {
    pub containerid: String,
    #[serde(default)]
    pub podref: String,
    #[serde(default)]
    pub ifname: String,
}

impl ReservationValue {
    pub fn of(holder: &Allocation) -> Self {
        ReservationValue { containerid: holder.container_id.clone(), podref: holder.pod_ref.clone(), ifname: holder.ifname.clone() }
    }

    pub fn encode(&self) -> Vec<u8> {
        json!({"containerid": self.containerid, "podref": self.podref, "ifname": self.ifname}).to_string().into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not a reservation value: {e}"))
    }

    /// Whether it reserves the address for `holder`'s attachment (see
    /// [`same_attachment`]; thereabouts always writes the interface here).
    pub fn is_for(&self, holder: &Allocation) -> bool {
        let recorded = Holder { container_id: &self.containerid, pod_ref: &self.podref, ifname: &self.ifname };
        same_attachment(recorded, holder.holder(), Ifname::Required)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(offset: u128, cid: &str) -> Allocation {
        Allocation { offset, container_id: cid.into(), pod_ref: "default/pod".into(), ifname: "eth0".into() }
    }

    #[test]
    fn keys_live_under_the_prefix() {
        let default = Layout::new(None);
        assert_eq!(default.pool_key("192.0.2.0-24"), "/thereabouts/pools/192.0.2.0-24");
        assert_eq!(default.reservation_key("blue-2001-db8--1"), "/thereabouts/reservations/blue-2001-db8--1");
        assert_eq!(Layout::new(Some("")).prefix(), DEFAULT_PREFIX);
        assert_eq!(Layout::new(Some("/cluster-a")).pool_key("p"), "/cluster-a/pools/p");
        assert_eq!(Layout::new(Some("/cluster-a/")).prefix(), "/cluster-a/");
    }

    #[test]
    fn pool_values_round_trip_in_offset_order() {
        let mut pool = PoolValue::empty("2001:db8::/64");
        for offset in [10u128, 2, 1 << 70] {
            pool.allocations.insert(offset, EntryValue { id: format!("c{offset}"), podref: "default/pod".into(), ifname: "eth0".into() });
        }
        let text = String::from_utf8(pool.encode()).unwrap();
        assert!(text.starts_with(r#"{"range":"2001:db8::/64","allocations":{"2":{"id":"c2","podref":"default/pod","ifname":"eth0"},"10":"#), "{text}");
        assert!(text.contains(&format!("\"{}\"", 1u128 << 70)), "{text}");
        let back = PoolValue::decode(text.as_bytes()).unwrap();
        assert_eq!(back, pool);
        assert_eq!(back.entries().iter().map(|a| a.offset).collect::<Vec<_>>(), [2, 10, 1 << 70]);
    }

    #[test]
    fn bad_values_are_errors_not_panics() {
        assert!(PoolValue::decode(b"").is_err());
        assert!(PoolValue::decode(b"[1]").is_err());
        let bad_key = PoolValue::decode(br#"{"range":"x","allocations":{"-1":{"id":"c"}}}"#).unwrap_err();
        assert!(bad_key.contains("\"-1\""), "{bad_key}");
        assert!(PoolValue::decode(br#"{"range":"x","allocations":{"1":{"podref":"p"}}}"#).is_err());
        assert!(ReservationValue::decode(b"{").is_err());
        // Missing optional fields read as empty.
        assert_eq!(PoolValue::decode(b"{}").unwrap(), PoolValue::default());
    }

    #[test]
    fn reservations_know_their_attachment() {
        let r = ReservationValue::of(&alloc(1, "c1"));
        assert_eq!(String::from_utf8(r.encode()).unwrap(), r#"{"containerid":"c1","podref":"default/pod","ifname":"eth0"}"#);
        assert_eq!(ReservationValue::decode(&r.encode()).unwrap(), r);
        assert!(r.is_for(&alloc(7, "c2")), "same pod and interface, new sandbox");
        assert!(!r.is_for(&Allocation { ifname: "net1".into(), ..alloc(1, "c1") }));
        let no_pod = ReservationValue { podref: String::new(), ..r.clone() };
        assert!(no_pod.is_for(&Allocation { pod_ref: String::new(), ..alloc(1, "c1") }));
        assert!(!no_pod.is_for(&Allocation { pod_ref: String::new(), ..alloc(1, "c2") }));
    }
}
