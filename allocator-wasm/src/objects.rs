//! whereabouts' custom resources as JSON, decoded once for every reader: the
//! plugin's Kubernetes datastore (a GET's or PATCH's answer) and a cluster's
//! state pasted into the playground or given to `thereabouts preview
//! --from-objects` (what `kubectl get ... -o json` prints). Pure decoding, no
//! I/O; unknown fields are ignored, as whereabouts ignores them.
//!
//! - `IPPool`: `spec.range` and `spec.allocations`, a map from the decimal
//!   offset of an address (from the network address) to `{"id", "podref",
//!   "ifname"}`, plus `ipamclaimref` or `resourceclaimref` on an entry a claim
//!   owns;
//! - `OverlappingRangeIPReservation`: `spec` `{"containerid", "podref",
//!   "ifname"}`, and the same claim fields;
//! - `IPAMClaim` (`k8s.cni.cncf.io`): `status.ips` and `status.ownerPod.name`.

use serde_json::{Map, Value};

use crate::attachment::{Holder, Ifname, owns_record};
use crate::model::{Allocation, Claim};

/// An object that cannot be read as whereabouts writes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    #[error("spec.allocations is not an object")]
    AllocationsNotAMap,
}

/// An allocation key: a decimal offset. whereabouts reads keys as signed 64-bit
/// numbers and uses them as unsigned, so a negative key (written by versions
/// before v0.5) names offset `2^64 + key`.
pub fn parse_key(key: &str) -> Option<u128> {
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        return None;
    }
    match key.parse::<u128>() {
        Ok(offset) => Some(offset),
        Err(_) => key.parse::<i64>().ok().filter(|k| *k < 0).map(|k| u128::from(k as u64)),
    }
}

/// The claim an entry or reservation records: `ipamclaimref` (`ns/name`) for
/// an IPAMClaim, `resourceclaimref` (a UID) for a ResourceClaim device, an
/// IPAMClaim when both are set; none when the pod owns it.
pub fn claim_of(ipamclaimref: &str, resourceclaimref: &str) -> Option<Claim> {
    match (ipamclaimref, resourceclaimref) {
        ("", "") => None,
        ("", r) => Some(Claim::ResourceClaim(r.to_string())),
        (r, _) => Some(Claim::IpamClaim(r.to_string())),
    }
}

/// A string member of `object`, empty when missing or not a string (an old
/// client's entry lacks `ifname`; whereabouts reads it as empty too).
fn text(object: &Value, name: &str) -> String {
    object.get(name).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// One `spec.allocations` entry at `offset`: the one decoder of an IPPool entry.
pub fn entry_of(offset: u128, entry: &Value) -> Allocation {
    Allocation {
        offset,
        container_id: text(entry, "id"),
        pod_ref: text(entry, "podref"),
        ifname: text(entry, "ifname"),
        claim: claim_of(&text(entry, "ipamclaimref"), &text(entry, "resourceclaimref")),
    }
}

/// An entry with the key it is stored under (whereabouts writes `%d`; `05`
/// must still be removed under its own name) and its JSON as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyedEntry<'a> {
    pub key: &'a str,
    pub entry: Allocation,
    pub stored: &'a Value,
}

/// What an `IPPool` holds, as far as allocation is concerned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolEntries<'a> {
    /// `spec.range`.
    pub range: Option<&'a str>,
    /// Whether `spec.allocations` is a map (it may be missing or null).
    pub has_allocations: bool,
    /// One per parsable key, in document order, the first of keys naming one offset.
    pub entries: Vec<KeyedEntry<'a>>,
    /// Keys that are no offset, or name an offset an earlier key named: ignored,
    /// as whereabouts ignores them.
    pub unparsable: Vec<String>,
}

/// Reads an `IPPool` object's spec.
pub fn pool_entries(object: &Value) -> Result<PoolEntries<'_>, ObjectError> {
    let spec = object.get("spec").and_then(Value::as_object);
    let mut pool = PoolEntries { range: spec.and_then(|s| s.get("range")).and_then(Value::as_str), ..PoolEntries::default() };
    match spec.and_then(|s| s.get("allocations")) {
        None | Some(Value::Null) => {}
        Some(Value::Object(allocations)) => {
            pool.has_allocations = true;
            read_allocations(allocations, &mut pool);
        }
        Some(_) => return Err(ObjectError::AllocationsNotAMap),
    }
    Ok(pool)
}

fn read_allocations<'a>(allocations: &'a Map<String, Value>, pool: &mut PoolEntries<'a>) {
    let mut seen = std::collections::BTreeSet::new();
    for (key, stored) in allocations {
        // `5` and `05`: one address, the first key wins.
        match parse_key(key).filter(|offset| seen.insert(*offset)) {
            Some(offset) => pool.entries.push(KeyedEntry { key, entry: entry_of(offset, stored), stored }),
            None => pool.unparsable.push(key.clone()),
        }
    }
}

/// What an `OverlappingRangeIPReservation` says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reservation {
    /// `metadata.name`: the reserved address, see `naming::reservation_name`.
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub podref: String,
    pub ifname: String,
    pub containerid: String,
    pub claim: Option<Claim>,
}

pub fn reservation(object: &Value) -> Reservation {
    let metadata = object.get("metadata").unwrap_or(&Value::Null);
    let spec = object.get("spec").unwrap_or(&Value::Null);
    Reservation {
        name: text(metadata, "name"),
        uid: text(metadata, "uid"),
        resource_version: text(metadata, "resourceVersion"),
        podref: text(spec, "podref"),
        ifname: text(spec, "ifname"),
        containerid: text(spec, "containerid"),
        claim: claim_of(&text(spec, "ipamclaimref"), &text(spec, "resourceclaimref")),
    }
}

impl Reservation {
    /// Whether the reservation belongs to `holder`'s attachment (see
    /// [`owns_record`]: the same pod attachment, or the same claim);
    /// whereabouts before v0.8.0 wrote no interface.
    pub fn is_held_by(&self, holder: &Allocation) -> bool {
        let recorded = Holder { container_id: &self.containerid, pod_ref: &self.podref, ifname: &self.ifname };
        owns_record(recorded, self.claim.as_ref(), holder.holder(), holder.claim.as_ref(), Ifname::MayBeMissing)
    }

    /// Whether an ADD planning a fresh entry for `holder` may take this existing
    /// reservation as its own: held by `holder`'s attachment and made by the same
    /// container (a retried ADD), or by whereabouts, whose reservations name no
    /// container and which reuses one of the same pod the same way. One made by
    /// another container of the pod is not taken: the pool as read holds no entry
    /// of the pod there, so that container's DEL has removed it and is about to
    /// delete the reservation, or its ADD failed and its DEL will free it.
    pub fn is_adoptable_by(&self, holder: &Allocation) -> bool {
        self.is_held_by(holder) && (self.containerid.is_empty() || self.containerid == holder.container_id)
    }

    /// Whether this exact attachment (container ID and interface) made it: what
    /// a DEL may free even though no pool entry leads to it.
    pub fn is_made_by(&self, container_id: &str, ifname: &str) -> bool {
        self.containerid == container_id && self.ifname == ifname
    }
}

/// What an `IPAMClaim`'s status says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpamClaimStatus {
    /// `status.ips` as written (CIDR or bare addresses); empty when unset.
    pub ips: Vec<String>,
    /// `status.ownerPod.name`.
    pub owner_pod: String,
}

pub fn ipam_claim_status(object: &Value) -> IpamClaimStatus {
    let ips = object.pointer("/status/ips").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect());
    IpamClaimStatus { ips: ips.unwrap_or_default(), owner_pod: object.pointer("/status/ownerPod/name").and_then(Value::as_str).unwrap_or_default().to_string() }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keys_are_decimal_offsets_and_negative_ones_wrap_as_whereabouts_reads_them() {
        assert_eq!(parse_key("0"), Some(0));
        assert_eq!(parse_key("05"), Some(5));
        assert_eq!(parse_key("18446744073709551622"), Some(u128::from(u64::MAX) + 7));
        assert_eq!(parse_key("-1"), Some(u128::from(u64::MAX)));
        assert_eq!(parse_key("-9223372036854775808"), Some(1 << 63));
        for bad in ["", "x", "1.5", "+3", " 3", "--1", "-", "-99999999999999999999"] {
            assert_eq!(parse_key(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_whereabouts_pool_reads_entry_by_entry_with_claims() {
        let object = json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
            "metadata": {"name": "192.0.2.0-24"},
            "spec": {"range": "192.0.2.0/24", "allocations": {
                "1": {"id": "c1", "podref": "ns/a", "ifname": "net1"},
                "2": {"id": "c2", "podref": "ns/vm-launcher", "ifname": "net1", "ipamclaimref": "ns/vm.net1"},
                "3": {"id": "uid", "podref": "ns/b", "ifname": "eth1", "resourceclaimref": "0f1e"},
                "4": {"id": "old"},
                "04": {"id": "again"},
                "x": {"id": "bad"},
                "-2": {"id": "neg", "podref": "ns/c"}}}});
        let pool = pool_entries(&object).unwrap();
        assert_eq!(pool.range, Some("192.0.2.0/24"));
        assert!(pool.has_allocations);
        let by_key: Vec<(&str, &Allocation)> = pool.entries.iter().map(|e| (e.key, &e.entry)).collect();
        assert_eq!(by_key.len(), 5, "{by_key:?}");
        let entry = |key: &str| pool.entries.iter().find(|e| e.key == key).map(|e| e.entry.clone()).unwrap();
        assert_eq!(entry("1"), Allocation { offset: 1, container_id: "c1".into(), pod_ref: "ns/a".into(), ifname: "net1".into(), claim: None });
        assert_eq!(entry("2").claim, Some(Claim::IpamClaim("ns/vm.net1".into())));
        assert_eq!(entry("3").claim, Some(Claim::ResourceClaim("0f1e".into())));
        assert_eq!((entry("4").pod_ref.as_str(), entry("4").ifname.as_str()), ("", ""), "missing fields read as empty");
        assert_eq!(entry("-2").offset, u128::from(u64::MAX) - 1);
        assert_eq!(pool.entries.iter().find(|e| e.key == "1").unwrap().stored, &object["spec"]["allocations"]["1"]);
        let mut unparsable = pool.unparsable.clone();
        unparsable.sort();
        assert_eq!(unparsable, ["04", "x"]);
    }

    #[test]
    fn missing_allocations_are_empty_and_a_non_map_is_an_error() {
        for empty in [json!({}), json!({"spec": {"range": "192.0.2.0/24"}}), json!({"spec": {"allocations": null}})] {
            let pool = pool_entries(&empty).unwrap();
            assert!(!pool.has_allocations && pool.entries.is_empty(), "{empty}");
        }
        for bad in [json!({"spec": {"allocations": []}}), json!({"spec": {"allocations": "1"}}), json!({"spec": {"allocations": 3}})] {
            assert_eq!(pool_entries(&bad), Err(ObjectError::AllocationsNotAMap), "{bad}");
        }
        // An entry that is no object holds nothing but its offset.
        let odd = json!({"spec": {"allocations": {"7": "text"}}});
        assert_eq!(pool_entries(&odd).unwrap().entries[0].entry.container_id, "");
    }

    #[test]
    fn claims_are_recorded_by_either_field_ipam_claim_first() {
        assert_eq!(claim_of("", ""), None);
        assert_eq!(claim_of("ns/vm", ""), Some(Claim::IpamClaim("ns/vm".into())));
        assert_eq!(claim_of("", "uid"), Some(Claim::ResourceClaim("uid".into())));
        assert_eq!(claim_of("ns/vm", "uid"), Some(Claim::IpamClaim("ns/vm".into())));
    }

    #[test]
    fn reservations_and_ipam_claims_read_their_fields() {
        let orip = json!({"metadata": {"name": "192.0.2.9", "uid": "u", "resourceVersion": "17"},
            "spec": {"podref": "ns/p", "ifname": "net1", "containerid": "c", "ipamclaimref": "ns/vm"}});
        assert_eq!(
            reservation(&orip),
            Reservation {
                name: "192.0.2.9".into(),
                uid: "u".into(),
                resource_version: "17".into(),
                podref: "ns/p".into(),
                ifname: "net1".into(),
                containerid: "c".into(),
                claim: Some(Claim::IpamClaim("ns/vm".into()))
            }
        );
        assert_eq!(reservation(&json!("not an object")), Reservation::default());
        let claim = json!({"status": {"ips": ["192.0.2.5/24", 3], "ownerPod": {"name": "virt-launcher-x"}}});
        assert_eq!(ipam_claim_status(&claim), IpamClaimStatus { ips: vec!["192.0.2.5/24".into()], owner_pod: "virt-launcher-x".into() });
        assert_eq!(ipam_claim_status(&json!({})), IpamClaimStatus::default());
    }
}
