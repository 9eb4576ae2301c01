//! Where the etcd datastore keeps what, and how a value reads (pure logic).
//!
//! Under a prefix (`etcd_prefix`, default [`DEFAULT_PREFIX`]):
//!
//! - `<prefix>pools/<pool name>`: one key per pool (the engine's pool name:
//!   `[<network_name>-]<range CIDR with : and / as ->`), value the pool as JSON in
//!   the logical shape of a whereabouts `IPPool` spec (the
//!   [pool document](crate::datastore::pool_document), compact):
//!   `{"range": "<CIDR>", "allocations": {"<offset>": {"id": <container ID>,
//!   "podref": "<namespace>/<pod>", "ifname": <interface>}}}`, offsets decimal,
//!   in ascending order;
//! - `<prefix>reservations/<reservation name>`: one key per reserved address when
//!   `enable_overlapping_ranges` is on (the name of whereabouts'
//!   `OverlappingRangeIPReservation`: `[<network_name>-]<address with : as ->`),
//!   value `{"containerid", "podref", "ifname"}` of the attachment holding it.
//!
//! A pool's version is the key's `mod_revision` (decimal); absent = empty.

use serde::{Deserialize, Serialize};
use thereabouts_allocator::attachment::{Holder, owns};
use thereabouts_allocator::model::{Allocation, Claim};

use crate::datastore::pool_document::{claim_fields, claim_of};

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

/// A reservation's value: the attachment holding the address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationValue {
    pub containerid: String,
    #[serde(default)]
    pub podref: String,
    #[serde(default)]
    pub ifname: String,
    /// The claim that owns the address (`pool_document::claim_fields`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipamclaimref: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resourceclaimref: String,
}

impl ReservationValue {
    pub fn of(holder: &Allocation) -> Self {
        let (ipamclaimref, resourceclaimref) = claim_fields(holder.claim.as_ref());
        ReservationValue {
            containerid: holder.container_id.clone(),
            podref: holder.pod_ref.clone(),
            ifname: holder.ifname.clone(),
            ipamclaimref: ipamclaimref.to_string(),
            resourceclaimref: resourceclaimref.to_string(),
        }
    }

    pub fn claim(&self) -> Option<Claim> {
        claim_of(&self.ipamclaimref, &self.resourceclaimref)
    }

    pub fn encode(&self) -> Vec<u8> {
        // Field order as whereabouts' IPPool entries; claim fields only when set.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not a reservation value: {e}"))
    }

    /// Whether it reserves the address for `holder`'s attachment or claim
    /// (see [`owns`]; thereabouts always writes the interface here).
    pub fn is_for(&self, holder: &Allocation) -> bool {
        let recorded = Holder { container_id: &self.containerid, pod_ref: &self.podref, ifname: &self.ifname };
        owns(recorded, self.claim().as_ref(), holder.holder(), holder.claim.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(offset: u128, cid: &str) -> Allocation {
        Allocation { offset, container_id: cid.into(), pod_ref: "default/pod".into(), ifname: "eth0".into(), claim: None }
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
    fn bad_reservation_values_are_errors_not_panics() {
        assert!(ReservationValue::decode(b"{").is_err());
        assert!(ReservationValue::decode(br#"{"podref": "p"}"#).is_err());
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

    #[test]
    fn a_claims_reservation_is_for_whoever_holds_the_claim() {
        let vm = Some(Claim::IpamClaim("default/vm".into()));
        let r = ReservationValue::of(&Allocation { claim: vm.clone(), ..alloc(1, "c1") });
        assert_eq!(String::from_utf8(r.encode()).unwrap(), r#"{"containerid":"c1","podref":"default/pod","ifname":"eth0","ipamclaimref":"default/vm"}"#);
        assert_eq!(ReservationValue::decode(&r.encode()).unwrap(), r);
        assert!(r.is_for(&Allocation { pod_ref: "default/launcher-2".into(), claim: vm, ..alloc(1, "c9") }));
        assert!(!r.is_for(&alloc(1, "c1")), "the same pod without the claim");
    }
}
