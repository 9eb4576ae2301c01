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
    /// The entry's own `node_slice_size` (thereabouts extension for `ipRanges`
    /// items; the top-level one applies to entries without).
    pub node_slice_size: Option<String>,
    /// The entry's own `node_slice_max_entries` (as `node_slice_size`).
    pub node_slice_max_entries: Option<u32>,
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
    if let Some(s) = start.take().filter(|s| Family::of(*s) == family).map(to_u128).filter(|s| (first..=last).contains(s)) {
        first = s;
    }
    if let Some(e) = end.take().filter(|e| Family::of(*e) == family).map(to_u128).filter(|e| (first..=last).contains(e)) {
        last = e;
    }

    if family == Family::V6 && first <= MAPPED_V4.1 && last >= MAPPED_V4.0 {
        return Err(ConfigError::invalid(
            range_field,
            format!(
                "range {canonical} holds the IPv4-mapped block ::ffff:0:0/96, whose addresses Go programs read and print as IPv4; set range_start/range_end around it or use another network"
            ),
        ));
    }

    let mut excludes = Vec::with_capacity(spec.exclude.len());
    for (i, text) in spec.exclude.iter().enumerate() {
        let field = format!("{}.exclude[{i}]", spec.path);
        excludes.push(
            parse_exclude(text)
                .ok_or_else(|| ConfigError::invalid(&field, format!("could not parse exclude {text:?}: expected a CIDR (192.0.2.0/28) or an IP address")))?,
        );
    }

    // Go reads an IPv4-mapped gateway as IPv4 (and prints it so), and so do we.
    let gateway = match spec.gateway.map(|gw| gw.to_canonical()) {
        Some(gw) if Family::of(gw) != family => {
            return Err(ConfigError::invalid(format!("{}.gateway", spec.path), format!("gateway {gw} is not of the range's family ({canonical})")));
        }
        Some(gw) => Some(gw),
        None => default_gateway.map(|gw| gw.to_canonical()).filter(|gw| Family::of(*gw) == family),
    };

    let excluded = excluded_blocks(network, first, last, family, &excludes, gateway);
    let span = last - first + 1; // cannot overflow: broadcast - network >= 2 keeps it < 2^128
    let excluded_count: u128 = excluded.iter().map(|(lo, hi)| hi - lo + 1).sum();

    Ok(NormalizedRange {
        pool_name: naming::pool_name_for_network(&canonical, network_name),
        cidr: canonical,
        prefix_len: cidr.prefix,
        network_prefix: cidr.prefix,
        family,
        network,
        first: format_ip(from_u128(family, first)),
        last: format_ip(from_u128(family, last)),
        first_offset: first - network,
        last_offset: last - network,
        excludes: spec.exclude.clone(),
        exclude_cidrs: excludes.iter().map(Cidr::network_text).collect(),
        excluded,
        usable: span - excluded_count,
        gateway: gateway.map(format_ip),
        requested: None,
        node_slicing: None,
    })
}

/// The two range forms: `start-end/prefix` (start and end taken from the text,
/// overriding `range_start`/`range_end`) and a CIDR whose host bits are dropped.
/// Both accept IPv4 leading zeros, as whereabouts' sloppy parsers do.
fn parse_range_text(text: &str, field: &str) -> Result<(Cidr, Option<IpAddr>, Option<IpAddr>)> {
    if let Some((start_text, cidr_text)) = text.split_once('-') {
        let start = ip::parse_ip_sloppy(start_text).ok_or_else(|| ConfigError::invalid(field, format!("invalid range start IP {start_text:?} in {text:?}")))?;
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
    if text.contains('/') { ip::parse_cidr(text, false) } else { ip::parse_ip_strict(text).map(|ip| Cidr { ip, prefix: Family::of(ip).bits() }) }
}

/// ::ffff:0:0/96 as an inclusive interval of IPv6 integers.
const MAPPED_V4: (u128, u128) = (0xffff_0000_0000, 0xffff_ffff_ffff);

/// The offsets of [first, last] that are never handed out, as sorted, merged
/// intervals: the exclude blocks of the range's family, and the gateway.
///
/// The gateway is the router's own address, never a pod's: host-local and
/// Spiderpool skip it too, while whereabouts hands it out (whereabouts#601). It
/// counts as excluded when it lies in [first, last], so the usable count, the
/// preview and every plan agree. `excludes`/`exclude-cidrs` stay as written.
fn excluded_blocks(network: u128, first: u128, last: u128, family: Family, excludes: &[Cidr], gateway: Option<IpAddr>) -> Vec<(u128, u128)> {
    let gateway_block = gateway.filter(|gw| Family::of(*gw) == family).map(|gw| (to_u128(gw), to_u128(gw)));
    let blocks = excludes
        .iter()
        .filter(|block| block.family() == family)
        .map(|block| (block.network(), block.broadcast()))
        .chain(gateway_block)
        .filter_map(|(lo, hi)| {
            let (lo, hi) = (lo.max(first), hi.min(last));
            (lo <= hi).then(|| (lo - network, hi - network))
        })
        .collect();
    merge_intervals(blocks)
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

/// Rebuild the derived parts of a range (network, merged excluded intervals,
/// gateway included) from the fields a `normalized-range` record carries across
/// the component boundary.
pub fn derived_parts(cidr: &str, first_offset: u128, last_offset: u128, exclude_cidrs: &[String], gateway: Option<&str>) -> Result<(Cidr, Vec<(u128, u128)>)> {
    let parsed = ip::parse_cidr(cidr, false).ok_or_else(|| ConfigError::invalid("range.cidr", format!("invalid CIDR {cidr:?}")))?;
    let network = parsed.network();
    let (first, last) = (network + first_offset, network.saturating_add(last_offset));
    if first_offset == 0 || last > parsed.broadcast() || first > last {
        return Err(ConfigError::invalid("range", format!("offsets {first_offset}..{last_offset} do not fit {cidr}")));
    }
    let excludes = exclude_cidrs
        .iter()
        .enumerate()
        .map(|(i, text)| parse_exclude(text).ok_or_else(|| ConfigError::invalid(format!("range.exclude-cidrs[{i}]"), format!("invalid CIDR {text:?}"))))
        .collect::<Result<Vec<_>>>()?;
    let gateway = gateway
        .map(|text| ip::parse_ip_strict(text).ok_or_else(|| ConfigError::invalid("range.gateway", format!("invalid IP address {text:?}"))))
        .transpose()?;
    Ok((parsed, excluded_blocks(network, first, last, parsed.family(), &excludes, gateway)))
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
    fn a_gateway_inside_the_span_is_excluded_and_not_counted() {
        let mut s = spec("192.0.2.0/29");
        s.gateway = Some(ip("192.0.2.1"));
        let r = normalize_range(&s, None, "").unwrap();
        assert_eq!((r.excluded.clone(), r.usable), (vec![(1, 1)], 5));
        assert_eq!(r.exclude_cidrs, Vec::<String>::new(), "excludes stay as written");
        // The top-level gateway too, merged with an exclude that already covers it.
        let mut s = spec("192.0.2.0/29");
        s.exclude = vec!["192.0.2.1".into()];
        let r = normalize_range(&s, Some(ip("192.0.2.1")), "").unwrap();
        assert_eq!((r.excluded.clone(), r.usable), (vec![(1, 1)], 5));
        // Outside [first, last] (here before range_start) it costs nothing.
        let mut s = spec("192.0.2.0/29");
        s.range_start = Some(ip("192.0.2.3"));
        assert_eq!(normalize_range(&s, Some(ip("192.0.2.1")), "").unwrap().usable, 4);
        // The component boundary rebuilds the same intervals.
        let mut s = spec("2001:db8::/126");
        s.gateway = Some(ip("2001:db8::2"));
        let r = normalize_range(&s, None, "").unwrap();
        let (_, excluded) = derived_parts(&r.cidr, r.first_offset, r.last_offset, &r.exclude_cidrs, r.gateway.as_deref()).unwrap();
        assert_eq!((excluded, r.usable), (vec![(2, 2)], 1));
    }

    #[test]
    fn an_ipv4_mapped_gateway_is_ipv4() {
        let r = normalize_range(&spec("192.0.2.0/24"), Some(ip("::ffff:192.0.2.9")), "").unwrap();
        assert_eq!((r.gateway.as_deref(), r.usable), (Some("192.0.2.9"), 253));
    }

    #[test]
    fn pool_name_carries_the_network_name() {
        let r = normalize_range(&spec("2001:db8::/64"), None, "blue").unwrap();
        assert_eq!(r.pool_name, "blue-2001-db8---64");
    }

    #[test]
    fn ipv4_mapped_ranges_are_refused() {
        assert!(normalize_range(&spec("::ffff:192.0.2.0/120"), None, "").is_err());
        // Go would print the addresses of ::ffff:0:0/96 as IPv4 in a pod's result.
        let err = normalize_range(&spec("::/64"), None, "").unwrap_err();
        assert!(err.message.contains("::ffff:0:0/96"), "{}", err.message);
        let mut s = spec("::/64");
        s.range_end = Some(ip("::fffe:ffff:ffff"));
        assert!(normalize_range(&s, None, "").is_ok(), "a span that stops short of the block is fine");
    }
}
