//! Node slices (`node_slice_size`): a range divided into equal blocks that nodes
//! hold, each node allocating only from its own blocks, in a pool of its own.
//! Wire-compatible with whereabouts' Fast IPAM: the same `NodeSlicePool` name, the
//! same slices in the same order, the same per-node pool names and offsets. Unlike
//! whereabouts, every range is sliced (IPv6 too, each with its own
//! `NodeSlicePool`), and a slice keeps the range's `exclude`, `range_start`,
//! `range_end` and gateway.

use crate::error::{ConfigError, Result};
use crate::ip::{self, Cidr, format_ip, from_u128};
use crate::model::{NodeSlicing, NormalizedRange};
use crate::naming;

/// The most slices whereabouts' shape keeps in one `NodeSlicePool` object
/// (about 60 bytes a slice: 250 KB, far below etcd's 1.5 MiB, whereabouts#497).
/// A range of more slices keeps each held slice in an object of its own.
pub const ONE_OBJECT_SLICES: u32 = 4096;

/// The most slices a range may be divided into: 5 000 nodes and more, each
/// with room for more than one slice. It bounds the layout a claim walks and
/// the table the controller keeps per range (about 4 MB at most).
pub const MAX_SLICES: u32 = 65_536;

/// `node_slice_size` of a range (`"/22"` or `"22"`), checked against the range:
/// at least as long as its prefix, leaving each slice a usable address, and at
/// most [`MAX_SLICES`] slices.
pub fn slicing(range: &NormalizedRange, size: &str, field: &str, slice_pool: String) -> Result<NodeSlicing> {
    let digits = size.trim().strip_prefix('/').unwrap_or(size.trim());
    let bits = range.family.bits();
    let prefix_len: u8 = digits
        .parse()
        .ok()
        .filter(|p| *p <= bits)
        .ok_or_else(|| ConfigError::invalid(field, format!("invalid node_slice_size {size:?}: expected a prefix length such as \"/26\"")))?;
    let network_prefix = range.network_prefix;
    if prefix_len < network_prefix {
        return Err(ConfigError::invalid(
            field,
            format!(
                "node_slice_size /{prefix_len} does not fit range {}: a slice must be at least as long as the range's prefix; give this range its own node_slice_size",
                range.cidr
            ),
        ));
    }
    if prefix_len > bits - 2 {
        return Err(ConfigError::invalid(
            field,
            format!(
                "node_slice_size /{prefix_len} leaves no usable address in a slice (each slice loses its network and broadcast addresses); use at most /{}",
                bits - 2
            ),
        ));
    }
    if prefix_len - network_prefix > MAX_SLICES.ilog2() as u8 {
        return Err(ConfigError::invalid(
            field,
            format!(
                "node_slice_size /{prefix_len} divides range {} into 2^{} slices; at most {MAX_SLICES} are allowed (use /{} or shorter)",
                range.cidr,
                prefix_len - network_prefix,
                network_prefix + MAX_SLICES.ilog2() as u8
            ),
        ));
    }
    Ok(NodeSlicing { slice_pool, prefix_len, max_entries: None })
}

/// The name of a range's `NodeSlicePool`: whereabouts' for the first range
/// (`network_name`, or the network's `name`), `<that>-<range as in a pool name>`
/// for another range.
pub fn slice_pool_name(base: &str, first_cidr: &str, range: &NormalizedRange) -> String {
    if range.cidr == first_cidr { base.to_string() } else { naming::pool_name_for_network(&range.cidr, base) }
}

/// Every slice of a sliced range, in address order (whereabouts' order).
pub fn layout(range: &NormalizedRange) -> Result<Vec<String>> {
    Ok((0..count(range)?).filter_map(|i| slice_at(range, i)).collect())
}

/// How many slices a sliced range has.
pub fn count(range: &NormalizedRange) -> Result<u128> {
    let slicing = sliced(range)?;
    Ok(1u128 << (slicing.prefix_len - range.network_prefix))
}

/// Slice `index` of [`layout`] without the others (a node looking near its
/// home reads a few of 65 536); `None` past the end or for a range without slices.
pub fn slice_at(range: &NormalizedRange, index: u128) -> Option<String> {
    let slicing = sliced(range).ok()?;
    let step_bits = range.family.bits() - slicing.prefix_len;
    (index < count(range).ok()?).then(|| format!("{}/{}", format_ip(from_u128(range.family, range.network + (index << step_bits))), slicing.prefix_len))
}

/// `range` as the slice `slice` of node `node` serves it: the slice's network,
/// first and last usable address of the slice inside the range's own bounds, the
/// range's excludes and gateway, the range's prefix length for results
/// (whereabouts: the mask of the NAD's range), and the per-node pool
/// `<network_name>-<node>-<slice as in a pool name>`. The result is no longer
/// sliced (`node_slicing` is none).
pub fn in_slice(range: &NormalizedRange, network_name: &str, node: &str, slice: &str) -> Result<NormalizedRange> {
    let slicing = sliced(range)?;
    let cidr = ip::parse_cidr(slice, false).ok_or_else(|| ConfigError::invalid("slice", format!("invalid slice CIDR {slice:?}")))?;
    if cidr.family() != range.family || cidr.prefix != slicing.prefix_len || !range.network_contains(range.family, cidr.network()) {
        return Err(ConfigError::invalid("slice", format!("{slice} is not a /{} slice of {}", slicing.prefix_len, range.cidr)));
    }
    if !naming::is_object_name_part(node) {
        return Err(ConfigError::invalid(
            "node",
            format!(
                "invalid node name {node:?}: a node's pools are named after it, so it must be a lowercase DNS name (set NODENAME or <configuration_path>/nodename)"
            ),
        ));
    }
    let (network, broadcast) = (cidr.network(), cidr.broadcast());
    let first = (network + 1).max(range.network + range.first_offset);
    let last = (broadcast - 1).min(range.network + range.last_offset);
    if first > last {
        return Err(ConfigError::invalid("slice", format!("slice {slice} holds no address of {} between {} and {}", range.cidr, range.first, range.last)));
    }
    let excluded = clip(&range.excluded, range.network, network, first, last);
    let span = last - first + 1;
    let canonical = Cidr { ip: cidr.ip, prefix: cidr.prefix }.network_text();
    Ok(NormalizedRange {
        pool_name: naming::node_pool_name(&canonical, node, network_name),
        cidr: canonical,
        prefix_len: range.prefix_len,
        network_prefix: cidr.prefix,
        family: range.family,
        network,
        first: format_ip(from_u128(range.family, first)),
        last: format_ip(from_u128(range.family, last)),
        first_offset: first - network,
        last_offset: last - network,
        excludes: range.excludes.clone(),
        exclude_cidrs: range.exclude_cidrs.clone(),
        usable: span - excluded.iter().map(|(lo, hi)| hi - lo + 1).sum::<u128>(),
        excluded,
        gateway: range.gateway.clone(),
        requested: range.requested.clone(),
        node_slicing: None,
    })
}

fn sliced(range: &NormalizedRange) -> Result<&NodeSlicing> {
    range.node_slicing.as_ref().ok_or_else(|| ConfigError::invalid("range", format!("range {} has no node_slice_size", range.cidr)))
}

/// The range's excluded intervals (offsets from `from`) that meet [first, last],
/// as offsets from `to`.
fn clip(excluded: &[(u128, u128)], from: u128, to: u128, first: u128, last: u128) -> Vec<(u128, u128)> {
    excluded
        .iter()
        .filter_map(|(lo, hi)| {
            let (lo, hi) = ((from + lo).max(first), (from + hi).min(last));
            (lo <= hi).then(|| (lo - to, hi - to))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::normalize;

    fn config(ipam: &str) -> crate::model::NormalizedConfig {
        normalize(&format!(r#"{{"cniVersion":"1.0.0","name":"net1","ipam":{{"type":"whereabouts",{ipam}}}}}"#), None, "").unwrap()
    }
    fn error(ipam: &str) -> ConfigError {
        normalize(&format!(r#"{{"cniVersion":"1.0.0","name":"net1","ipam":{{"type":"whereabouts",{ipam}}}}}"#), None, "").unwrap_err()
    }

    #[test]
    fn the_first_range_is_sliced_as_whereabouts_does() {
        let c = config(r#""range":"192.0.2.0/24","node_slice_size":"/26""#);
        let slicing = c.ranges[0].node_slicing.as_ref().unwrap();
        assert_eq!((slicing.slice_pool.as_str(), slicing.prefix_len), ("net1", 26));
        assert_eq!(layout(&c.ranges[0]).unwrap(), ["192.0.2.0/26", "192.0.2.64/26", "192.0.2.128/26", "192.0.2.192/26"]);
        let r = in_slice(&c.ranges[0], "", "node-a", "192.0.2.64/26").unwrap();
        assert_eq!((r.pool_name.as_str(), r.cidr.as_str(), r.prefix_len), ("node-a-192.0.2.64-26", "192.0.2.64/26", 24));
        assert_eq!((r.first.as_str(), r.last.as_str(), r.usable), ("192.0.2.65", "192.0.2.126", 62));
    }

    #[test]
    fn every_range_is_sliced_ipv6_included_each_in_its_own_node_slice_pool() {
        let c = config(
            r#""network_name":"blue","ipRanges":[{"range":"198.51.100.0/24"},{"range":"2001:db8::/64","node_slice_size":"/76"}],"node_slice_size":"26""#,
        );
        let v6 = c.ranges[1].node_slicing.as_ref().unwrap();
        assert_eq!((v6.slice_pool.as_str(), v6.prefix_len), ("blue-2001-db8---64", 76));
        let all = layout(&c.ranges[1]).unwrap();
        assert_eq!((all.len(), count(&c.ranges[1]).unwrap()), (4096, 4096));
        assert_eq!(
            [slice_at(&c.ranges[1], 1), slice_at(&c.ranges[1], 4095), slice_at(&c.ranges[1], 4096)],
            [Some(all[1].clone()), Some(all[4095].clone()), None]
        );
        let r = in_slice(&c.ranges[1], "blue", "node-a", "2001:db8:0:0:10::/76").unwrap();
        assert_eq!((r.pool_name.as_str(), r.first.as_str(), r.prefix_len), ("blue-node-a-2001-db8-0-0-10---76", "2001:db8::10:0:0:1", 64));
    }

    #[test]
    fn exclude_range_bounds_and_gateway_hold_inside_a_slice() {
        let c = config(r#""range":"192.0.2.0/24","range_end":"192.0.2.100","gateway":"192.0.2.65","exclude":["192.0.2.64/29"],"node_slice_size":"/26""#);
        let r = in_slice(&c.ranges[0], "", "n", "192.0.2.64/26").unwrap();
        // .65..=.71 excluded (the /29 and the gateway), .100 is range_end.
        assert_eq!((r.first.as_str(), r.last.as_str(), r.usable), ("192.0.2.65", "192.0.2.100", 36 - 7));
        assert!(in_slice(&c.ranges[0], "", "n", "192.0.2.128/26").is_err(), "beyond range_end");
    }

    #[test]
    fn sizes_that_do_not_fit_are_refused_naming_the_field() {
        let e = error(r#""ipRanges":[{"range":"192.0.2.0/24"},{"range":"2001:db8::/64"}],"node_slice_size":"/26""#);
        assert_eq!(e.field, "ipam.ipRanges[1].node_slice_size");
        assert!(e.message.contains("does not fit range 2001:db8::/64"), "{}", e.message);
        assert_eq!(error(r#""range":"192.0.2.0/24","node_slice_size":"/31""#).field, "ipam.node_slice_size");
        assert!(error(r#""range":"10.0.0.0/8","node_slice_size":"/25""#).message.contains("use /24 or shorter"));
        assert!(error(r#""range":"192.0.2.0/24","node_slice_size":"big""#).message.contains("invalid node_slice_size"));
    }

    #[test]
    fn node_slice_max_entries_applies_top_level_or_per_entry_and_must_be_a_positive_count() {
        let c = config(
            r#""network_name":"blue","ipRanges":[{"range":"198.51.100.0/24"},{"range":"2001:db8::/64","node_slice_size":"/76","node_slice_max_entries":8}],"node_slice_size":"26","node_slice_max_entries":32"#,
        );
        let max = |i: usize| c.ranges[i].node_slicing.as_ref().unwrap().max_entries;
        assert_eq!((max(0), max(1)), (Some(32), Some(8)));
        assert_eq!(config(r#""range":"192.0.2.0/24","node_slice_size":"/26""#).ranges[0].node_slicing.as_ref().unwrap().max_entries, None);
        for bad in ["0", "-1", "1.5", "\"8\"", "4294967296"] {
            let e = error(&format!(r#""range":"192.0.2.0/24","node_slice_size":"/26","node_slice_max_entries":{bad}"#));
            assert_eq!(e.field, "ipam.node_slice_max_entries", "{bad}");
        }
        assert_eq!(
            error(r#""ipRanges":[{"range":"192.0.2.0/24","node_slice_max_entries":0}],"node_slice_size":"/26""#).field,
            "ipam.ipRanges[0].node_slice_max_entries"
        );
    }

    #[test]
    fn a_slice_of_another_size_or_range_or_a_bad_node_name_is_refused() {
        let c = config(r#""range":"192.0.2.0/24","node_slice_size":"/26""#);
        assert!(in_slice(&c.ranges[0], "", "n", "192.0.2.0/25").is_err());
        assert!(in_slice(&c.ranges[0], "", "n", "198.51.100.0/26").is_err());
        assert_eq!(in_slice(&c.ranges[0], "", "Node_A", "192.0.2.0/26").unwrap_err().field, "node");
    }
}
