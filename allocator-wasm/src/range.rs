//! One range entry of a config → a [`NormalizedRange`]: network, effective first and
//! last usable address, excluded blocks, usable count, gateway and pool name.
//! Implements whereabouts' range forms (`pkg/config/config.go`) and `GetIPRange`
//! (`pkg/iphelpers/iphelpers.go`), and rejects what whereabouts only fails on
//! later (ranges with no usable address, bad excludes).

use std::net::IpAddr;

use crate::error::{ConfigError, Result};
use crate::ip::{self, Cidr, Family, format_ip, from_u128, to_u128};
use crate::model::NormalizedRange;
use crate::naming;

/// A range entry as written: the legacy top-level fields or one `ipRanges` item.
#[derive(Debug, Clone, Default)]
pub struct RangeSpec {
    /// JSON path of the entry, for error messages (`ipam` or `ipam.ipRanges[2]`).
    pub path: String,
    pub range: String,
    pub range_start: Option<IpAddr>,
    pub range_end: Option<IpAddr>,
    pub exclude: Vec<String>,
    /// The entry's own gateway (thereabouts extension for `ipRanges` items).
    pub gateway: Option<IpAddr>,
}

/// Normalize one range entry. `default_gateway` is the top-level `gateway`, used
/// only when it has the range's family and the entry has no gateway of its own.
pub fn normalize_range(spec: &RangeSpec, default_gateway: Option<IpAddr>, network_name: &str) -> Result<NormalizedRange> {
    let range_field = format!("{}.range", spec.path);
    let (cidr, mut start, mut end) = parse_range_text(&spec.range, &range_field)?;
    if spec.range.split_once('-').is_none() {
        start = spec.range_start;
        end = spec.range_end;
    }
    if ip::is_ipv4_mapped(cidr.ip) {
        return Err(ConfigError::invalid(range_field, format!("IPv4-mapped IPv6 range {:?} is not supported; write it as IPv4", spec.range)));
    }
    let family = cidr.family();
    let network = cidr.network();
    let broadcast = cidr.broadcast();
    let canonical = cidr.network_text();
    if broadcast - network < 2 {
        return Err(ConfigError::invalid(
            range_field,
            format!("range {canonical} has no usable address (network and broadcast addresses are never handed out; use at most /30 for IPv4, /126 for IPv6)"),
        ));
    }

    // GetIPRange: start replaces first iff inside the usable span; end replaces last
    // iff inside [first, last]. Addresses of the other family are outside the span.
    let mut first = network + 1;
    let mut last = broadcast - 1;
    if let Some(s) = start.take().filter(|s| Family::of(*s) == family).map(to_u128) {
        if s >= first && s <= last {
            first = s;
        }
    }
    if let Some(e) = end.take().filter(|e| Family::of(*e) == family).map(to_u128) {
        if e >= first && e <= last {
            last = e;
        }
    }

    let mut exclude_cidrs = Vec::with_capacity(spec.exclude.len());
    let mut blocks = Vec::with_capacity(spec.exclude.len());
    for (i, text) in spec.exclude.iter().enumerate() {
        let field = format!("{}.exclude[{i}]", spec.path);
        let block = parse_exclude(text).ok_or_else(|| {
            ConfigError::invalid(&field, format!("could not parse exclude {text:?}: expected a CIDR (192.0.2.0/28) or an IP address"))
        })?;
        exclude_cidrs.push(block.network_text());
        if block.family() == family {
            let (lo, hi) = (block.network().max(first), block.broadcast().min(last));
            if lo <= hi {
                blocks.push((lo - network, hi - network));
            }
        }
    }
    let excluded = merge_intervals(blocks);
    let span = last - first + 1; // cannot overflow: broadcast - network >= 2 keeps it < 2^128
    let excluded_count: u128 = excluded.iter().map(|(lo, hi)| hi - lo + 1).sum();

    let gateway = match spec.gateway {
        Some(gw) if Family::of(gw) != family => {
            return Err(ConfigError::invalid(
                format!("{}.gateway", spec.path),
                format!("gateway {gw} is not of the range's family ({canonical})"),
            ));
        }
        Some(gw) => Some(gw),
        None => default_gateway.filter(|gw| Family::of(*gw) == family),
    };

    Ok(NormalizedRange {
        pool_name: naming::pool_name_for_network(&canonical, network_name),
        cidr: canonical,
        prefix_len: cidr.prefix,
        family,
        network,
        first: format_ip(from_u128(family, first)),
        last: format_ip(from_u128(family, last)),
        first_offset: first - network,
        last_offset: last - network,
        excludes: spec.exclude.clone(),
        exclude_cidrs,
        excluded,
        usable: span - excluded_count,
        gateway: gateway.map(format_ip),
        requested: None,
    })
}

/// The two range forms: `start-end/prefix` (start and end taken from the text,
/// overriding `range_start`/`range_end`) and a CIDR whose host bits are dropped.
/// Both accept IPv4 leading zeros, as whereabouts' sloppy parsers do.
fn parse_range_text(text: &str, field: &str) -> Result<(Cidr, Option<IpAddr>, Option<IpAddr>)> {
    if let Some((start_text, cidr_text)) = text.split_once('-') {
        let start = ip::parse_ip_sloppy(start_text)
            .ok_or_else(|| ConfigError::invalid(field, format!("invalid range start IP {start_text:?} in {text:?}")))?;
        let cidr = ip::parse_cidr(cidr_text, true).ok_or_else(|| {
            ConfigError::invalid(field, format!("invalid CIDR {cidr_text:?} in {text:?} (expected start-end/prefix, e.g. 192.0.2.10-192.0.2.20/24)"))
        })?;
        if !cidr.contains(Family::of(start), to_u128(start)) {
            return Err(ConfigError::invalid(field, format!("invalid range start for CIDR {}: {start}", cidr.network_text())));
        }
        return Ok((cidr, Some(start), Some(cidr.ip)));
    }
    let cidr = ip::parse_cidr(text, true)
        .ok_or_else(|| ConfigError::invalid(field, format!("invalid CIDR {text:?} (expected e.g. 192.0.2.0/24 or 2001:db8::/64)")))?;
    Ok((cidr, None, None))
}

/// An exclude is a CIDR (host bits ignored) or a bare IP (a /32 or /128), parsed strictly.
fn parse_exclude(text: &str) -> Option<Cidr> {
    if text.contains('/') {
        ip::parse_cidr(text, false)
    } else {
        ip::parse_ip_strict(text).map(|ip| Cidr { ip, prefix: Family::of(ip).bits() })
    }
}

/// Sort and merge overlapping or adjacent inclusive intervals.
fn merge_intervals(mut blocks: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    blocks.sort_unstable();
    let mut merged: Vec<(u128, u128)> = Vec::with_capacity(blocks.len());
    for (lo, hi) in blocks {
        match merged.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(range: &str) -> RangeSpec {
        RangeSpec { path: "ipam".into(), range: range.into(), ..Default::default() }
    }
    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn cidr_with_host_bits_is_normalized_and_starts_after_the_network() {
        let r = normalize_range(&spec("10.10.10.10/24"), None, "").unwrap();
        assert_eq!(r.cidr, "10.10.10.0/24");
        assert_eq!((r.first.as_str(), r.last.as_str()), ("10.10.10.1", "10.10.10.254"));
        assert_eq!(r.usable, 254);
        assert_eq!(r.pool_name, "10.10.10.0-24");
    }

    #[test]
    fn ipv6_never_hands_out_the_all_zeros_or_all_ones_host() {
        let r = normalize_range(&spec("abcd::1/64"), None, "").unwrap();
        assert_eq!(r.cidr, "abcd::/64");
        assert_eq!((r.first.as_str(), r.last.as_str()), ("abcd::1", "abcd::ffff:ffff:ffff:fffe"));
        assert_eq!(r.usable, (1u128 << 64) - 2);
    }

    #[test]
    fn start_end_form_sets_bounds_and_overrides_explicit_ones() {
        let mut s = spec("192.168.1.5-192.168.1.25/24");
        s.range_start = Some(ip("192.168.1.100"));
        let r = normalize_range(&s, None, "").unwrap();
        assert_eq!((r.first.as_str(), r.last.as_str()), ("192.168.1.5", "192.168.1.25"));
        assert_eq!(r.cidr, "192.168.1.0/24");
    }

    #[test]
    fn start_end_form_rejects_start_outside_the_cidr() {
        let err = normalize_range(&spec("192.168.1.5-192.168.2.25/28"), None, "").unwrap_err();
        assert_eq!(err.message, "ipam.range: invalid range start for CIDR 192.168.2.16/28: 192.168.1.5");
        assert_eq!(err.code, 7);
    }

    #[test]
    fn start_end_form_accepts_leading_zeros() {
        let r = normalize_range(&spec("00192.00168.1.5-000000192.168.1.25/24"), None, "").unwrap();
        assert_eq!((r.first.as_str(), r.last.as_str()), ("192.168.1.5", "192.168.1.25"));
    }

    #[test]
    fn start_end_bounds_are_inclusive_and_ignored_outside_the_span() {
        let mut s = spec("192.0.2.0/24");
        s.range_start = Some(ip("192.0.2.10"));
        s.range_end = Some(ip("192.0.2.20"));
        let r = normalize_range(&s, None, "").unwrap();
        assert_eq!((r.first.as_str(), r.last.as_str(), r.usable), ("192.0.2.10", "192.0.2.20", 11));
        // Outside the usable span: ignored.
        s.range_start = Some(ip("192.0.2.0"));
        s.range_end = Some(ip("192.0.2.255"));
        let r = normalize_range(&s, None, "").unwrap();
        assert_eq!((r.first.as_str(), r.last.as_str()), ("192.0.2.1", "192.0.2.254"));
        s.range_start = Some(ip("198.51.100.5"));
        let r = normalize_range(&s, None, "").unwrap();
        assert_eq!(r.first, "192.0.2.1");
        // End before start: ignored. start == end: one address.
        s.range_start = Some(ip("192.0.2.50"));
        s.range_end = Some(ip("192.0.2.40"));
        let r = normalize_range(&s, None, "").unwrap();
        assert_eq!((r.first.as_str(), r.last.as_str()), ("192.0.2.50", "192.0.2.254"));
        s.range_end = Some(ip("192.0.2.50"));
        assert_eq!(normalize_range(&s, None, "").unwrap().usable, 1);
    }

    #[test]
    fn ranges_without_usable_addresses_are_rejected() {
        for r in ["192.0.2.0/31", "192.0.2.1/32", "2001:db8::/127", "2001:db8::1/128"] {
            let err = normalize_range(&spec(r), None, "").unwrap_err();
            assert_eq!(err.field, "ipam.range", "{r}");
            assert!(err.message.contains("no usable address"), "{}", err.message);
        }
        assert_eq!(normalize_range(&spec("192.0.2.0/30"), None, "").unwrap().usable, 2);
        assert_eq!(normalize_range(&spec("2001:db8::/126"), None, "").unwrap().usable, 2);
    }

    #[test]
    fn excludes_accept_cidrs_and_bare_ips_and_reject_garbage() {
        let mut s = spec("192.0.2.0/24");
        s.exclude = vec!["192.0.2.0/28".into(), "192.0.2.20".into(), "192.0.2.17/31".into()];
        let r = normalize_range(&s, None, "").unwrap();
        assert_eq!(r.exclude_cidrs, vec!["192.0.2.0/28", "192.0.2.20/32", "192.0.2.16/31"]);
        // .1-.15 and .16-.17 merge; .20 separate; .0 is outside [first,last].
        assert_eq!(r.excluded, vec![(1, 17), (20, 20)]);
        assert_eq!(r.usable, 254 - 17 - 1);
        s.exclude = vec!["192.0.2.0/28".into(), "nope".into()];
        let err = normalize_range(&s, None, "").unwrap_err();
        assert_eq!(err.field, "ipam.exclude[1]");
        s.exclude = vec!["010.0.0.1".into()];
        assert!(normalize_range(&s, None, "").is_err(), "excludes are parsed strictly");
    }

    #[test]
    fn exclude_host_bits_are_masked() {
        let mut s = spec("100::/120");
        s.exclude = vec!["100::2:1/126".into()];
        // 100::2:1/126 is 100::2:0/126, outside 100::/120 entirely.
        assert!(normalize_range(&s, None, "").unwrap().excluded.is_empty());
        s.exclude = vec!["100::11/126".into()];
        assert_eq!(normalize_range(&s, None, "").unwrap().excluded, vec![(0x10, 0x13)]);
    }

    #[test]
    fn top_level_gateway_applies_only_to_its_family_and_entries_may_override() {
        let gw = Some(ip("192.0.2.1"));
        let v4 = normalize_range(&spec("192.0.2.0/24"), gw, "").unwrap();
        let v6 = normalize_range(&spec("2001:db8::/64"), gw, "").unwrap();
        assert_eq!(v4.gateway.as_deref(), Some("192.0.2.1"));
        assert_eq!(v6.gateway, None);
        let mut s = spec("2001:db8::/64");
        s.gateway = Some(ip("2001:db8::1"));
        assert_eq!(normalize_range(&s, gw, "").unwrap().gateway.as_deref(), Some("2001:db8::1"));
        s.gateway = Some(ip("192.0.2.1"));
        assert_eq!(normalize_range(&s, gw, "").unwrap_err().field, "ipam.gateway");
    }

    #[test]
    fn pool_name_carries_the_network_name() {
        let r = normalize_range(&spec("2001:db8::/64"), None, "blue").unwrap();
        assert_eq!(r.pool_name, "blue-2001-db8---64");
    }

    #[test]
    fn ipv4_mapped_ranges_are_refused() {
        assert!(normalize_range(&spec("::ffff:192.0.2.0/120"), None, "").is_err());
    }
}

/// Rebuild the derived parts of a range (network, merged exclude intervals) from
/// the fields a `normalized-range` record carries across the component boundary.
pub fn derived_parts(cidr: &str, first_offset: u128, last_offset: u128, exclude_cidrs: &[String]) -> Result<(u128, Vec<(u128, u128)>)> {
    let parsed = ip::parse_cidr(cidr, false).ok_or_else(|| ConfigError::invalid("range.cidr", format!("invalid CIDR {cidr:?}")))?;
    let network = parsed.network();
    let (first, last) = (network + first_offset, network.saturating_add(last_offset));
    if first_offset == 0 || last > parsed.broadcast() || first > last {
        return Err(ConfigError::invalid("range", format!("offsets {first_offset}..{last_offset} do not fit {cidr}")));
    }
    let mut blocks = Vec::with_capacity(exclude_cidrs.len());
    for (i, text) in exclude_cidrs.iter().enumerate() {
        let block = parse_exclude(text).ok_or_else(|| ConfigError::invalid(format!("range.exclude-cidrs[{i}]"), format!("invalid CIDR {text:?}")))?;
        if block.family() == parsed.family() {
            let (lo, hi) = (block.network().max(first), block.broadcast().min(last));
            if lo <= hi {
                blocks.push((lo - network, hi - network));
            }
        }
    }
    Ok((network, merge_intervals(blocks)))
}
