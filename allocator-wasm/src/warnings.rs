//! Warnings about a valid config: what is allowed but likely a mistake. The
//! playground shows them beside its preview; the texts name ranges 1-based.

use crate::ip::parse_ip_sloppy;
use crate::model::{ConfigWarning, NormalizedConfig, NormalizedRange, WarningKind};
use crate::planner::offset_of;

/// See `warnings` in the WIT: overlapping pairs of ranges first, then gateways.
pub fn warnings(config: &NormalizedConfig) -> Vec<ConfigWarning> {
    let ranges = &config.ranges;
    let mut out = Vec::new();
    for (i, a) in ranges.iter().enumerate() {
        for (j, b) in ranges.iter().enumerate().skip(i + 1) {
            if let Some(text) = overlap(config, (i, a), (j, b)) {
                out.push(ConfigWarning { kind: WarningKind::Overlap, text });
            }
        }
    }
    out.extend(ranges.iter().enumerate().filter_map(|(i, r)| gateway(i, r)).map(|text| ConfigWarning { kind: WarningKind::Gateway, text }));
    out
}

fn overlap(config: &NormalizedConfig, (i, a): (usize, &NormalizedRange), (j, b): (usize, &NormalizedRange)) -> Option<String> {
    if a.family != b.family {
        return None;
    }
    let (i, j) = (i + 1, j + 1);
    if a.cidr == b.cidr {
        return Some(format!(
            "Ranges {i} and {j} are the same network {}: they share the IPPool {}, and each pod takes two addresses from it.",
            a.cidr, a.pool_name
        ));
    }
    // Networks either nest or are disjoint; nested ones overlap where their spans do.
    if !a.shares_network_with(b) {
        return None;
    }
    let (a_first, a_last) = (a.network + a.first_offset, a.network + a.last_offset);
    let (b_first, b_last) = (b.network + b.first_offset, b.network + b.last_offset);
    if a_first > b_last || b_first > a_last {
        return None;
    }
    let lo = if a_first > b_first { &a.first } else { &b.first };
    let hi = if a_last < b_last { &a.last } else { &b.last };
    let consequence = if config.enable_overlapping_ranges {
        "With enable_overlapping_ranges (on) an address taken in one is skipped in the other."
    } else {
        "enable_overlapping_ranges is off: the plugin may hand the same address out from both pools."
    };
    Some(format!("Ranges {i} ({}) and {j} ({}) overlap ({lo} – {hi}). {consequence}", a.cidr, b.cidr))
}

/// A gateway outside the range's network. One inside it is never handed out (the
/// engine excludes it), so it needs no warning.
fn gateway(i: usize, r: &NormalizedRange) -> Option<String> {
    let gateway = r.gateway.as_deref()?;
    match parse_ip_sloppy(gateway).and_then(|ip| offset_of(r, ip)) {
        Some(_) => None,
        None => Some(format!("Range {} ({}): gateway {gateway} is outside the range's network.", i + 1, r.cidr)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warnings_of(ipam: &str) -> Vec<(WarningKind, String)> {
        let c = crate::normalize(&format!(r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"type":"thereabouts",{ipam}}}}}"#), None, "").unwrap();
        warnings(&c).into_iter().map(|w| (w.kind, w.text)).collect()
    }

    #[test]
    fn nested_ranges_overlap_where_their_spans_do() {
        let w = warnings_of(
            r#""ipRanges":[{"range":"192.0.2.0/24","gateway":"192.0.2.3"},{"range":"192.0.2.128/25","gateway":"192.0.2.129","exclude":["192.0.2.129/32"]}]"#,
        );
        // The gateways are inside their networks: never handed out, nothing to warn about.
        assert_eq!(w.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [WarningKind::Overlap]);
        assert_eq!(
            w[0].1,
            "Ranges 1 (192.0.2.0/24) and 2 (192.0.2.128/25) overlap (192.0.2.129 – 192.0.2.254). With enable_overlapping_ranges (on) an address taken in one is skipped in the other."
        );
        // Spans that do not meet, networks that do not nest, other families: nothing.
        assert!(warnings_of(r#""ipRanges":[{"range":"192.0.2.0/24","range_end":"192.0.2.100"},{"range":"192.0.2.128/25"}]"#).is_empty());
        assert!(warnings_of(r#""ipRanges":[{"range":"192.0.2.0/25"},{"range":"192.0.2.128/25"},{"range":"2001:db8::/64"}]"#).is_empty());
    }

    #[test]
    fn the_same_network_twice_shares_one_pool() {
        let w = warnings_of(r#""enable_overlapping_ranges":false,"ipRanges":[{"range":"192.0.2.0/24"},{"range":"192.0.2.0/24"},{"range":"192.0.2.0/28"}]"#);
        assert_eq!(w[0].1, "Ranges 1 and 2 are the same network 192.0.2.0/24: they share the IPPool 192.0.2.0-24, and each pod takes two addresses from it.");
        assert!(w[1].1.ends_with("enable_overlapping_ranges is off: the plugin may hand the same address out from both pools."), "{}", w[1].1);
        assert_eq!(w.len(), 3);
    }

    #[test]
    fn a_gateway_outside_the_network_or_span() {
        let w = warnings_of(r#""range":"192.0.2.0/24","range_start":"192.0.2.10","gateway":"192.0.2.1""#);
        assert!(w.is_empty(), "{w:?}");
        let w = warnings_of(r#""range":"192.0.2.0/24","gateway":"198.51.100.1""#);
        assert_eq!(w, [(WarningKind::Gateway, "Range 1 (192.0.2.0/24): gateway 198.51.100.1 is outside the range's network.".to_string())]);
    }
}
