//! Policies' guidance (`request.guidance` in the WIT) checked against a config:
//! which ranges a request is served from, in which order, and what a pick in
//! one range may name. A policy's answer is never trusted: an index out of
//! bounds, a repeated range or a preferred address the range does not hand
//! out is `rejected` (a bad answer), never an allocation.

use crate::ip::{Family, parse_ip_strict, to_u128};
use crate::model::{Guidance, NormalizedRange, PlanFailure, RangePick};

/// A request's guidance, validated against a config with `range_count` ranges.
#[derive(Debug, Default)]
pub struct Resolved<'g> {
    /// Indexes of the ranges to serve, in order.
    pub order: Vec<usize>,
    /// The pick of each range (by range index), if any.
    picks: Vec<Option<&'g RangePick>>,
}

impl<'g> Resolved<'g> {
    pub fn pick(&self, index: usize) -> Option<&'g RangePick> {
        self.picks.get(index).copied().flatten()
    }
}

fn rejected(message: String) -> PlanFailure {
    PlanFailure::Rejected { message }
}

/// The serving order and picks; without guidance every range in config order.
pub fn resolve(range_count: usize, guidance: Option<&Guidance>) -> Result<Resolved<'_>, PlanFailure> {
    let mut picks = vec![None; range_count];
    let Some(guidance) = guidance else { return Ok(Resolved { order: (0..range_count).collect(), picks }) };
    let order = match &guidance.ranges {
        None => (0..range_count).collect(),
        Some(listed) => {
            let mut seen = vec![false; range_count];
            let mut order = Vec::with_capacity(listed.len());
            for &index in listed {
                let i = in_bounds(index, range_count, "selects")?;
                if std::mem::replace(&mut seen[i], true) {
                    return Err(rejected(format!("policy guidance selects range {index} more than once")));
                }
                order.push(i);
            }
            order
        }
    };
    for pick in &guidance.picks {
        let i = in_bounds(pick.range_index, range_count, "has a pick for")?;
        if picks[i].replace(pick).is_some() {
            return Err(rejected(format!("policy guidance has more than one pick for range {}", pick.range_index)));
        }
    }
    Ok(Resolved { order, picks })
}

fn in_bounds(index: u32, range_count: usize, what: &str) -> Result<usize, PlanFailure> {
    usize::try_from(index)
        .ok()
        .filter(|&i| i < range_count)
        .ok_or_else(|| rejected(format!("policy guidance {what} range {index}, but the config has {range_count} range(s) (indexes from 0)")))
}

/// Where an address a policy named lies in a range's network, or why it is
/// not an address of the range at all (not one, other family, other network).
fn network_offset(range: &NormalizedRange, text: &str) -> Result<u128, String> {
    let Some(ip) = parse_ip_strict(text).map(|ip| ip.to_canonical()) else { return Err(format!("{text} is not an address")) };
    let family = Family::of(ip);
    if family != range.family {
        return Err(format!("{text} is IPv{} in an IPv{} range", family.number(), range.family.number()));
    }
    let value = to_u128(ip);
    if !range.network_contains(family, value) {
        return Err(format!("{text} is outside range {}", range.cidr));
    }
    Ok(value - range.network)
}

/// The offset of an address a policy preferred, when the range hands it out:
/// in [first, last], neither the gateway nor excluded. Else why not.
pub fn preferred_offset(range: &NormalizedRange, text: &str) -> Result<u128, String> {
    let offset = network_offset(range, text)?;
    if offset < range.first_offset || offset > range.last_offset {
        return Err(format!("{text} is outside range {} (it hands out {} - {})", range.cidr, range.first, range.last));
    }
    // The gateway is among the excluded blocks: asked first, so the message says which.
    if range.gateway.as_deref().and_then(parse_ip_strict).is_some_and(|gw| to_u128(gw.to_canonical()) == range.network + offset) {
        return Err(format!("{text} is the gateway of {}", range.cidr));
    }
    if range.excluded.iter().any(|&(lo, hi)| offset >= lo && offset <= hi) {
        return Err(format!("{text} is excluded in {} (exclude: [{}])", range.cidr, range.excludes.join(" ")));
    }
    Ok(offset)
}

/// Offsets (in the range's network) of the pick's `refuse` list. An entry that
/// is not an address of the range's network is ignored: refusing what the
/// range would never hand out is harmless, and a policy that refuses from a
/// generic list (say every address of a rack) need not filter it per range.
pub fn refused_offsets(range: &NormalizedRange, pick: Option<&RangePick>) -> Vec<u128> {
    pick.map(|p| p.refuse.iter().filter_map(|text| network_offset(range, text).ok()).collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range::{RangeSpec, normalize_range};

    fn range() -> NormalizedRange {
        let spec = RangeSpec {
            path: "ipam".into(),
            range: "192.0.2.0/24".into(),
            range_end: "192.0.2.200".parse().ok(),
            exclude: vec!["192.0.2.16/30".into()],
            gateway: "192.0.2.1".parse().ok(),
            ..Default::default()
        };
        normalize_range(&spec, None, "").expect("a valid range")
    }

    fn guidance(ranges: Option<Vec<u32>>, picks: &[u32]) -> Guidance {
        Guidance { ranges, picks: picks.iter().map(|&range_index| RangePick { range_index, ..Default::default() }).collect() }
    }

    fn message(failure: PlanFailure) -> String {
        failure.message().to_string()
    }

    #[test]
    fn without_guidance_every_range_in_config_order() {
        assert_eq!(resolve(3, None).unwrap().order, [0, 1, 2]);
        assert_eq!(resolve(3, Some(&guidance(None, &[]))).unwrap().order, [0, 1, 2]);
        let g = guidance(Some(vec![2, 0]), &[0]);
        let resolved = resolve(3, Some(&g)).unwrap();
        assert_eq!(resolved.order, [2, 0]);
        assert!(resolved.pick(0).is_some() && resolved.pick(2).is_none() && resolved.pick(9).is_none());
    }

    #[test]
    fn indexes_out_of_bounds_and_repeats_are_rejected() {
        let m = message(resolve(2, Some(&guidance(Some(vec![0, 2]), &[]))).unwrap_err());
        assert_eq!(m, "policy guidance selects range 2, but the config has 2 range(s) (indexes from 0)");
        let m = message(resolve(2, Some(&guidance(Some(vec![1, 1]), &[]))).unwrap_err());
        assert_eq!(m, "policy guidance selects range 1 more than once");
        let m = message(resolve(2, Some(&guidance(None, &[5]))).unwrap_err());
        assert!(m.starts_with("policy guidance has a pick for range 5"), "{m}");
        let m = message(resolve(2, Some(&guidance(None, &[1, 1]))).unwrap_err());
        assert_eq!(m, "policy guidance has more than one pick for range 1");
    }

    #[test]
    fn a_preferred_address_must_be_one_the_range_hands_out() {
        let r = range();
        assert_eq!(preferred_offset(&r, "192.0.2.7"), Ok(7));
        for (text, why) in [
            ("192.0.2.300", "192.0.2.300 is not an address"),
            ("192.0.2.7/24", "192.0.2.7/24 is not an address"),
            ("2001:db8::7", "2001:db8::7 is IPv6 in an IPv4 range"),
            ("198.51.100.7", "198.51.100.7 is outside range 192.0.2.0/24"),
            ("192.0.2.201", "192.0.2.201 is outside range 192.0.2.0/24 (it hands out 192.0.2.1 - 192.0.2.200)"),
            ("192.0.2.0", "192.0.2.0 is outside range 192.0.2.0/24"),
            ("192.0.2.1", "192.0.2.1 is the gateway of 192.0.2.0/24"),
            ("192.0.2.17", "192.0.2.17 is excluded in 192.0.2.0/24 (exclude: [192.0.2.16/30])"),
        ] {
            let got = preferred_offset(&r, text).unwrap_err();
            assert!(got.starts_with(why), "{text}: {got}");
        }
    }

    #[test]
    fn refusals_outside_the_network_are_ignored() {
        let pick = RangePick { refuse: vec!["192.0.2.9".into(), "nonsense".into(), "198.51.100.1".into(), "2001:db8::1".into()], ..Default::default() };
        assert_eq!(refused_offsets(&range(), Some(&pick)), [9]);
        assert!(refused_offsets(&range(), None).is_empty());
    }
}
