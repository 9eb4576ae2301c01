//! What the planning targets share: a random allocation scenario (a config of
//! up to three ranges, each pool's state, the request) built from the fuzzer's
//! bytes, and the allocator's promise checked on every plan.

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use thereabouts_allocator::guidance;
use thereabouts_allocator::ip::Family;
use thereabouts_allocator::model::{
    Allocation, Claim, Guidance, NormalizedConfig, PlanOutcome, PoolSnapshot, PoolState, RangePick, RangesAllocation, Request, Reservations,
};
use thereabouts_allocator::{normalize, planner, pools};

/// Documentation networks only (RFC 5737, RFC 3849).
const V4_BASES: [&str; 3] = ["192.0.2.0", "198.51.100.0", "203.0.113.0"];
const V6_BASES: [&str; 2] = ["2001:db8::", "2001:db8:1::"];

/// One `ipRanges` entry, small enough that pools fill up.
#[derive(Debug, Arbitrary)]
pub struct RangeSpec {
    v6: bool,
    base: u8,
    /// Host bits: 2..=8 (a /30../24 or a /126../120).
    host_bits: u8,
    start: Option<u8>,
    end: Option<u8>,
    excludes: Vec<(u8, u8)>,
    gateway: Option<u8>,
}

impl RangeSpec {
    fn family_bits(&self) -> u32 {
        if self.v6 { 128 } else { 32 }
    }

    fn host_bits(&self) -> u32 {
        2 + u32::from(self.host_bits % 7)
    }

    fn base(&self) -> &'static str {
        if self.v6 { V6_BASES[usize::from(self.base) % V6_BASES.len()] } else { V4_BASES[usize::from(self.base) % V4_BASES.len()] }
    }

    fn address(&self, offset: u8) -> String {
        address_in(self.base(), self.v6, u128::from(offset) % (1 << self.host_bits()))
    }

    fn json(&self) -> serde_json::Value {
        let prefix = self.family_bits() - self.host_bits();
        let mut entry = serde_json::json!({ "range": format!("{}/{prefix}", self.base()) });
        if let Some(s) = self.start {
            entry["range_start"] = self.address(s).into();
        }
        if let Some(e) = self.end {
            entry["range_end"] = self.address(e).into();
        }
        let excludes: Vec<String> =
            self.excludes.iter().take(4).map(|&(o, len)| format!("{}/{}", self.address(o), self.family_bits() - u32::from(len % 3))).collect();
        if !excludes.is_empty() {
            entry["exclude"] = excludes.into();
        }
        if let Some(g) = self.gateway {
            entry["gateway"] = self.address(g).into();
        }
        entry
    }
}

fn address_in(base: &str, v6: bool, offset: u128) -> String {
    if v6 {
        let b: std::net::Ipv6Addr = base.parse().unwrap_or(std::net::Ipv6Addr::UNSPECIFIED);
        std::net::Ipv6Addr::from(u128::from(b) + offset).to_string()
    } else {
        let b: std::net::Ipv4Addr = base.parse().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
        std::net::Ipv4Addr::from(u32::from(b) + offset as u32).to_string()
    }
}

/// An entry of a pool: an offset and one of a few holders.
#[derive(Debug, Arbitrary)]
pub struct EntrySpec {
    offset: u8,
    holder: u8,
    claim: Option<u8>,
}

/// A random scenario: the config, each pool's entries and reservations, the request.
#[derive(Debug, Arbitrary)]
pub struct Scenario {
    ranges: Vec<RangeSpec>,
    first_available: bool,
    overlapping: bool,
    network_name: bool,
    entries: Vec<Vec<EntrySpec>>,
    reserved: Vec<Vec<u8>>,
    from_pools: bool,
    holder: u8,
    claim: Option<u8>,
    contention: u8,
    preferred: Vec<(u8, u8)>,
    /// runtimeConfig.ips: (range index, offset).
    requested: Option<(u8, u8)>,
}

/// What a policy answered, as the engine receives it.
#[derive(Debug, Arbitrary)]
pub struct AnswerSpec {
    ranges: Option<Vec<u8>>,
    picks: Vec<PickSpec>,
}

#[derive(Debug, Arbitrary)]
pub struct PickSpec {
    range_index: u8,
    prefer: Vec<(u8, u8)>,
    refuse: Vec<(u8, u8)>,
    veto: bool,
    /// Text that is not an address of the range, to see it refused.
    garbage: Option<String>,
}

/// A planning problem ready for the engine.
pub struct Built {
    pub config: NormalizedConfig,
    pub pools: Vec<PoolState>,
    pub reservations: Reservations,
    pub request: Request,
}

fn holder(n: u8, claim: Option<u8>) -> (String, String, String, Option<Claim>) {
    let n = n % 4;
    let claim = claim.map(|c| match c % 3 {
        0 => Claim::IpamClaim(format!("ns/vm{}", c % 2)),
        _ => Claim::ResourceClaim(format!("uid-{}", c % 2)),
    });
    (format!("c{n}"), format!("ns/pod{n}"), "net1".to_string(), claim)
}

impl Scenario {
    /// The config the scenario describes, normalized as the plugin does; `None`
    /// when the engine refuses it (a config error is the config target's concern).
    pub fn build(&self) -> Option<Built> {
        let ranges: Vec<&RangeSpec> = self.ranges.iter().take(3).collect();
        if ranges.is_empty() {
            return None;
        }
        let mut ipam = serde_json::json!({
            "type": "thereabouts",
            "datastore": "file",
            "ipRanges": ranges.iter().map(|r| r.json()).collect::<Vec<_>>(),
            "enable_overlapping_ranges": self.overlapping,
        });
        if self.first_available {
            ipam["ipRangesAllocation"] = "first_available".into();
        }
        if self.network_name {
            ipam["network_name"] = "blue".into();
        }
        let mut stdin = serde_json::json!({"cniVersion": "1.0.0", "name": "fuzz", "type": "bridge", "ipam": ipam});
        if let Some((index, offset)) = self.requested
            && let Some(r) = ranges.get(usize::from(index) % ranges.len())
        {
            stdin["runtimeConfig"] = serde_json::json!({"ips": [format!("{}/{}", r.address(offset), r.family_bits() - r.host_bits())]});
        }
        let config = normalize(&stdin.to_string(), None, "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod0").ok()?;
        let pools = config
            .ranges
            .iter()
            .enumerate()
            .map(|(i, range)| {
                let mut snapshot = PoolSnapshot::default();
                let mut seen = BTreeSet::new();
                let span = 1u128 << (if range.family == Family::V6 { 128 } else { 32 } - u32::from(range.network_prefix));
                for e in self.entries.get(i).map(Vec::as_slice).unwrap_or_default().iter().take(64) {
                    let offset = u128::from(e.offset) % span;
                    if !seen.insert(offset) {
                        continue;
                    }
                    let (container_id, pod_ref, ifname, claim) = holder(e.holder, e.claim);
                    snapshot.held.push(Allocation { offset, container_id, pod_ref, ifname, claim });
                    snapshot.taken.push(offset as u64);
                }
                snapshot.reserved = self.reserved.get(i).map(|r| r.iter().take(16).map(|&o| u128::from(o) % span).collect()).unwrap_or_default();
                PoolState { name: range.pool_name.clone(), snapshot }
            })
            .collect();
        let (container_id, pod_ref, ifname, claim) = holder(self.holder, self.claim);
        let preferred = self.preferred.iter().take(4).filter_map(|&(r, o)| ranges.get(usize::from(r) % ranges.len()).map(|spec| spec.address(o))).collect();
        let request =
            Request { container_id, pod_ref, ifname, requested_ip: None, contention: u32::from(self.contention % 12), guidance: None, preferred, claim };
        let reservations = if self.from_pools { Reservations::FromPools } else { Reservations::AsRead };
        Some(Built { config, pools, reservations, request })
    }

    /// `answer` as guidance for this scenario's ranges.
    pub fn guidance(&self, answer: &AnswerSpec) -> Guidance {
        let ranges: Vec<&RangeSpec> = self.ranges.iter().take(3).collect();
        let address = |&(r, o): &(u8, u8)| ranges.get(usize::from(r) % ranges.len().max(1)).map(|spec| spec.address(o));
        let picks = answer
            .picks
            .iter()
            .take(4)
            .map(|p| {
                let mut prefer: Vec<String> = p.prefer.iter().take(4).filter_map(address).collect();
                prefer.extend(p.garbage.clone());
                RangePick {
                    range_index: u32::from(p.range_index % 4),
                    prefer,
                    refuse: p.refuse.iter().take(8).filter_map(address).collect(),
                    veto: p.veto.then(|| "fuzz".to_string()),
                }
            })
            .collect();
        Guidance { ranges: answer.ranges.as_ref().map(|r| r.iter().take(4).map(|&i| u32::from(i % 4)).collect()), picks }
    }
}

/// The allocator's promise for one plan: an address it hands out is in its
/// range, neither excluded nor the gateway, free in its pool (and, where the
/// plan reads them, in the pools it overlaps), not refused by a policy, and no
/// two ranges of one answer give the same address. An address the attachment
/// already holds is kept as it is.
pub fn check_plan(built: &Built, outcomes: &[PlanOutcome]) {
    let Built { config, pools, reservations, request } = built;
    let mut given = Vec::new();
    let mut ranges_seen = BTreeSet::new();
    for outcome in outcomes {
        let a = outcome.assignment();
        let index = a.range_index as usize;
        let range = &config.ranges[index];
        assert!(ranges_seen.insert(index), "range {index} planned twice");
        given.push(((range.family, range.network + a.offset), matches!(outcome, PlanOutcome::Fresh { .. })));
        let pool = pools::snapshot_of(pools, &range.pool_name);
        match outcome {
            PlanOutcome::Reuse { held_index, .. } => {
                let held = pool.held.get(*held_index as usize).expect("a reuse points at an entry");
                assert_eq!(held.offset, a.offset, "a reuse keeps the entry's address");
            }
            PlanOutcome::Fresh { .. } => {
                assert!(range.first_offset <= a.offset && a.offset <= range.last_offset, "{} is outside {}..{}", a.ip, range.first, range.last);
                assert!(!range.excluded.iter().any(|&(lo, hi)| lo <= a.offset && a.offset <= hi), "{} is excluded or the gateway", a.ip);
                assert!(!pool.occupied().any(|o| o == a.offset), "{} is taken in its pool", a.ip);
                if *reservations == Reservations::FromPools && config.enable_overlapping_ranges {
                    let others = pools::held_by_other_pools(config, pools, range);
                    assert!(!others.contains(&a.offset), "{} is held by an overlapping pool", a.ip);
                }
                let pick = request.guidance.as_ref().and_then(|g| g.picks.iter().find(|p| p.range_index as usize == index));
                assert!(!guidance::refused_offsets(range, pick).contains(&a.offset), "{} was refused by the policy", a.ip);
                assert!(pick.is_none_or(|p| p.veto.is_none()), "a vetoed range gave {}", a.ip);
                assert_eq!(planner::address_at(range, a.offset).map(|ip| ip.to_string()), Some(a.ip.clone()));
            }
        }
    }
    // A pod may already hold one address in two overlapping pools (kept as it
    // is); a new address is one no other range of the answer gives.
    for (address, fresh) in &given {
        let times = given.iter().filter(|(other, _)| other == address).count();
        assert!(!fresh || times == 1, "{:?} handed out twice in one answer: {outcomes:?}", address);
    }
    if config.ip_ranges_allocation == RangesAllocation::FirstAvailable {
        assert!(outcomes.len() <= 1, "first_available gave {} addresses", outcomes.len());
    }
}
