//! Object names the datastores use, exactly as whereabouts derives them, so that a
//! cluster can swap plugins and keep its `IPPool` and
//! `OverlappingRangeIPReservation` objects.

use crate::error::{ConfigError, Result};
use crate::ip::{self, format_ip};

/// `IPPool` name for a range: `:` and `/` become `-`, prefixed with
/// `<network_name>-` when a network name is set. `cidr` is canonicalized first.
pub fn pool_name(cidr: &str, network_name: &str) -> Result<String> {
    let parsed = ip::parse_cidr(cidr, true).ok_or_else(|| ConfigError::invalid("cidr", format!("invalid CIDR {cidr:?}")))?;
    Ok(pool_name_for_network(&parsed.network_text(), network_name))
}

/// Same as [`pool_name`] for an already canonical `network/prefix` text.
pub fn pool_name_for_network(canonical_cidr: &str, network_name: &str) -> String {
    let mut normalized = canonical_cidr.to_string();
    if normalized.ends_with(':') {
        normalized.push('0');
    }
    let normalized = normalized.replace([':', '/'], "-");
    with_network_prefix(normalized, network_name)
}

/// whereabouts' per-node pool of a node slice: `<node>-<slice as in a pool
/// name>`, prefixed with `<network_name>-` when set. `slice` is canonical.
pub fn node_pool_name(slice: &str, node: &str, network_name: &str) -> String {
    with_network_prefix(pool_name_for_network(slice, node), network_name)
}

/// Whether `name` may be (part of) an object name, a DNS subdomain: lowercase
/// letters, digits, '-' and '.', starting and ending with a letter or digit.
pub fn is_object_name_part(name: &str) -> bool {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    name.len() <= 200 && name.bytes().next().is_some_and(ok) && name.bytes().last().is_some_and(ok) && name.bytes().all(|b| ok(b) || b == b'-' || b == b'.')
}

/// `OverlappingRangeIPReservation` name for an address: canonical text, a `0`
/// appended when it ends with `:`, then `:` turned to `-`, prefixed with
/// `<network_name>-` when set.
pub fn reservation_name(address: &str, network_name: &str) -> Result<String> {
    let parsed = ip::parse_ip_sloppy(address).ok_or_else(|| ConfigError::invalid("ip", format!("invalid IP address {address:?}")))?;
    Ok(reservation_name_of(&format_ip(parsed), network_name))
}

/// Same as [`reservation_name`] for an address already in canonical text.
pub fn reservation_name_of(canonical_ip: &str, network_name: &str) -> String {
    let mut text = canonical_ip.replace(':', "-");
    if text.ends_with('-') {
        text.push('0');
    }
    with_network_prefix(text, network_name)
}

fn with_network_prefix(name: String, network_name: &str) -> String {
    if network_name.is_empty() { name } else { format!("{network_name}-{name}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Vectors from whereabouts v0.9.4 `pkg/storage/kubernetes/ipam.go` (pool and
    // reservation names; the IPv4 pool names are those of its `ipam_test.go`).
    #[test]
    fn pool_names_match_whereabouts() {
        assert_eq!(pool_name("192.168.1.0/24", "").unwrap(), "192.168.1.0-24");
        assert_eq!(pool_name("10.0.0.0/8", "test").unwrap(), "test-10.0.0.0-8");
        assert_eq!(pool_name("caa5::/64", "").unwrap(), "caa5---64");
        assert_eq!(pool_name("2001::/116", "").unwrap(), "2001---116");
        assert_eq!(pool_name("fd00:0:0:10::/64", "").unwrap(), "fd00-0-0-10---64");
        // Host bits are dropped before naming.
        assert_eq!(pool_name("192.0.2.77/24", "").unwrap(), "192.0.2.0-24");
        assert!(pool_name("not-a-cidr", "").is_err());
    }

    #[test]
    fn reservation_names_match_whereabouts() {
        assert_eq!(reservation_name("192.168.22.1", "").unwrap(), "192.168.22.1");
        assert_eq!(reservation_name("2001::2:3:1", "").unwrap(), "2001--2-3-1");
        assert_eq!(reservation_name("2001:db8:480:603d:304:403::", "").unwrap(), "2001-db8-480-603d-304-403--0");
        assert_eq!(reservation_name("10.10.0.1", "mynet").unwrap(), "mynet-10.10.0.1");
        assert!(reservation_name("bogus", "").is_err());
    }
}
