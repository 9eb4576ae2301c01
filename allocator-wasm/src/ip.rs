//! Address arithmetic on 128-bit integers, and parsing/formatting that matches
//! what whereabouts (Go's `net` package) accepts and prints.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IPv4 or IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
    /// Address width in bits.
    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
    /// 4 or 6, as CNI's `ips[].version` and the WIT records carry it.
    pub fn number(self) -> u8 {
        match self {
            Family::V4 => 4,
            Family::V6 => 6,
        }
    }
}

/// An address as (family, integer value).
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u32::from(v4) as u128,
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address with integer value `value` in `family`. Values wider than the family
/// are truncated, which callers never pass (offsets are bounded by the range).
pub fn from_u128(family: Family, value: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// Host-part mask for a prefix length: all ones in the bits after the prefix.
pub fn host_mask(family: Family, prefix: u8) -> u128 {
    let host_bits = u32::from(family.bits() - prefix);
    if host_bits == 0 {
        0
    } else if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    }
}

/// Canonical text of an address, as Go's `net.IP.String()` prints it: RFC 5952
/// for IPv6 (Rust's formatter follows the same rules), and an IPv4-mapped IPv6
/// address (`::ffff:192.0.2.1`) as plain IPv4 (`192.0.2.1`), because Go holds
/// both in the same 16 bytes and prints whatever `To4()` accepts as IPv4.
pub fn format_ip(ip: IpAddr) -> String {
    ip.to_canonical().to_string()
}

/// Strict parse, like Go's `net.ParseIP` since Go 1.17: no leading zeros in IPv4.
pub fn parse_ip_strict(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>().ok()
}

/// Sloppy parse, like `k8s.io/utils/net.ParseIPSloppy`, which whereabouts uses for
/// top-level fields: IPv4 octets may carry leading zeros and are read as decimal
/// (`00192.00168.1.44` is 192.168.1.44).
pub fn parse_ip_sloppy(text: &str) -> Option<IpAddr> {
    if let Some(ip) = parse_ip_strict(text) {
        return Some(ip);
    }
    if text.contains(':') {
        return None;
    }
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in octets.iter_mut() {
        let part = parts.next()?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let trimmed = part.trim_start_matches('0');
        let value: u32 = if trimmed.is_empty() {
            0
        } else if trimmed.len() > 3 {
            return None;
        } else {
            trimmed.parse().ok()?
        };
        *octet = u8::try_from(value).ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(IpAddr::V4(Ipv4Addr::from(octets)))
}

/// A parsed CIDR: the address as written (host bits kept) and the prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub ip: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn family(&self) -> Family {
        Family::of(self.ip)
    }
    /// Network address as an integer (host bits cleared).
    pub fn network(&self) -> u128 {
        to_u128(self.ip) & !host_mask(self.family(), self.prefix)
    }
    /// All-ones host address as an integer.
    pub fn broadcast(&self) -> u128 {
        self.network() | host_mask(self.family(), self.prefix)
    }
    pub fn contains(&self, family: Family, value: u128) -> bool {
        family == self.family() && value >= self.network() && value <= self.broadcast()
    }
    /// Whether the two networks share an address (one nests in the other).
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.family() == other.family() && self.network() <= other.broadcast() && other.network() <= self.broadcast()
    }
    /// Canonical `network/prefix`, as Go's `IPNet.String()` prints it.
    pub fn network_text(&self) -> String {
        format!("{}/{}", format_ip(from_u128(self.family(), self.network())), self.prefix)
    }
    /// The CIDR the way Go sees it: an IPv4-mapped IPv6 address is IPv4, and its
    /// 128-bit mask shrinks to the mask's last 32 bits (`IPNet.String()` prints
    /// `::ffff:192.0.2.1/120` as `192.0.2.1/24`, and anything below /96 as /0).
    pub fn unmapped(&self) -> Cidr {
        match self.ip.to_canonical() {
            v4 @ IpAddr::V4(_) if self.family() == Family::V6 => Cidr { ip: v4, prefix: self.prefix.saturating_sub(96) },
            _ => *self,
        }
    }
    /// `address/prefix` with the host bits kept, as Go's `IPNet.String()` prints
    /// what CNI's `types.ParseCIDR` parsed (`2001:DB8:0:01ff::1/64` is
    /// `2001:db8:0:1ff::1/64`).
    pub fn text(&self) -> String {
        let go = self.unmapped();
        format!("{}/{}", format_ip(go.ip), go.prefix)
    }
}

/// The offsets, in the network `[to_network, to_end]`, of the addresses at
/// `offsets` of the network starting at `from_network`, for those inside it:
/// how the entries of one pool become taken offsets of an overlapping one.
pub fn offsets_in(from_network: u128, offsets: impl Iterator<Item = u128>, to_network: u128, to_end: u128) -> impl Iterator<Item = u128> {
    offsets.filter_map(move |o| from_network.checked_add(o)).filter(move |a| (to_network..=to_end).contains(a)).map(move |a| a - to_network)
}

/// Parse `addr/prefix`. `sloppy` admits leading zeros in IPv4 (ParseCIDRSloppy).
pub fn parse_cidr(text: &str, sloppy: bool) -> Option<Cidr> {
    let (addr, prefix) = text.split_once('/')?;
    let ip = if sloppy { parse_ip_sloppy(addr)? } else { parse_ip_strict(addr)? };
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    if prefix > Family::of(ip).bits() {
        return None;
    }
    Some(Cidr { ip, prefix })
}

/// True for IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`), which Go treats as
/// IPv4 and Rust as IPv6; we refuse them in ranges rather than guess.
pub fn is_ipv4_mapped(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sloppy_ipv4_accepts_leading_zeros_as_decimal() {
        assert_eq!(parse_ip_sloppy("00192.00168.1.44"), Some("192.168.1.44".parse().unwrap()));
        assert_eq!(parse_ip_sloppy("010.0.0.1"), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(parse_ip_sloppy("256.0.0.1"), None);
        assert_eq!(parse_ip_sloppy("1.2.3"), None);
        assert_eq!(parse_ip_sloppy("1.2.3.4.5"), None);
        assert_eq!(parse_ip_sloppy(""), None);
    }

    #[test]
    fn strict_ipv4_rejects_leading_zeros() {
        assert_eq!(parse_ip_strict("010.0.0.1"), None);
        assert!(parse_ip_strict("2001:db8::1").is_some());
    }

    #[test]
    fn cidr_network_and_broadcast_for_both_families() {
        let c = parse_cidr("10.10.10.10/24", false).unwrap();
        assert_eq!(c.network_text(), "10.10.10.0/24");
        assert_eq!(from_u128(Family::V4, c.broadcast()).to_string(), "10.10.10.255");
        let c = parse_cidr("abcd::1/64", false).unwrap();
        assert_eq!(c.network_text(), "abcd::/64");
        assert_eq!(from_u128(Family::V6, c.broadcast()).to_string(), "abcd::ffff:ffff:ffff:ffff");
        let c = parse_cidr("0.0.0.0/0", false).unwrap();
        assert_eq!(c.broadcast(), u32::MAX as u128);
        let c = parse_cidr("::/0", false).unwrap();
        assert_eq!(c.broadcast(), u128::MAX);
    }

    #[test]
    fn cidr_rejects_bad_prefixes() {
        assert!(parse_cidr("192.0.2.0/33", false).is_none());
        assert!(parse_cidr("192.0.2.0/", false).is_none());
        assert!(parse_cidr("192.0.2.0/-1", false).is_none());
        assert!(parse_cidr("192.0.2.0", false).is_none());
        assert!(parse_cidr("2001:db8::/129", false).is_none());
    }

    #[test]
    fn ipv6_text_is_rfc5952_like_go() {
        assert_eq!(format_ip("2001:0db8:0000:0000:0001:0000:0000:0001".parse().unwrap()), "2001:db8::1:0:0:1");
        assert_eq!(format_ip("fd00:0:0:10::".parse().unwrap()), "fd00:0:0:10::");
    }

    #[test]
    fn ipv4_mapped_addresses_print_as_ipv4_like_go() {
        assert_eq!(format_ip("::ffff:192.0.2.1".parse().unwrap()), "192.0.2.1");
        // IPv4-compatible (no ffff) is plain IPv6 in Go too.
        assert_eq!(format_ip("::192.0.2.1".parse().unwrap()), "::c000:201");
    }

    #[test]
    fn cidr_text_keeps_host_bits_and_unmaps_like_go() {
        assert_eq!(parse_cidr("3ffe:ffff:0:01ff::1/64", false).unwrap().text(), "3ffe:ffff:0:1ff::1/64");
        assert_eq!(parse_cidr("2001:DB8::/32", false).unwrap().text(), "2001:db8::/32");
        assert_eq!(parse_cidr("192.0.2.7/24", false).unwrap().text(), "192.0.2.7/24");
        let mapped = parse_cidr("::ffff:192.0.2.7/120", false).unwrap();
        assert_eq!((mapped.text(), mapped.unmapped().family()), ("192.0.2.7/24".to_string(), Family::V4));
        assert_eq!(parse_cidr("::ffff:192.0.2.7/64", false).unwrap().text(), "192.0.2.7/0");
    }
}
