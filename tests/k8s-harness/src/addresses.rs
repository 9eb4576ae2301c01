//! Address arithmetic the tests compare results with: whether an address lies
//! in a range, and the names whereabouts gives pools and reservations.

use std::net::IpAddr;

use thereabouts_e2e::range_network;

/// Whether `ip` lies inside `range` (`net/len`).
pub fn contains(range: &str, ip: IpAddr) -> bool {
    let (net, len) = range_network(range);
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len as u32) };
            u32::from(a) & mask == u32::from(n)
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - len as u32) };
            u128::from(a) & mask == u128::from(n)
        }
        _ => false,
    }
}

/// whereabouts' ORIP name of an address (`network_name` unset): the address's
/// text with `:` replaced by `-` (`2001:db8:80::5` → `2001-db8-80--5`).
pub fn reservation_name(ip: IpAddr) -> String {
    ip.to_string().replace(':', "-")
}

/// whereabouts' IPPool name of a range (`network_name` unset): `192.0.2.0/24`
/// → `192.0.2.0-24`, `2001:db8::/64` → `2001-db8---64`.
pub fn pool_name(range: &str) -> String {
    range.replace([':', '/'], "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_names_and_ranges() {
        let v6: IpAddr = "2001:db8:80::5".parse().unwrap();
        assert_eq!(reservation_name(v6), "2001-db8-80--5");
        assert_eq!(reservation_name("192.0.2.7".parse().unwrap()), "192.0.2.7");
        assert!(contains("2001:db8:80::/64", v6) && !contains("2001:db8:81::/64", v6));
        assert!(contains("192.0.2.0/25", "192.0.2.127".parse().unwrap()));
        assert!(!contains("192.0.2.0/25", "192.0.2.128".parse().unwrap()));
        assert_eq!(pool_name("2001:db8:80::/64"), "2001-db8-80---64");
        assert_eq!(pool_name("192.0.2.0/24"), "192.0.2.0-24");
    }
}
