//! Overlapping ranges on the file store (`enable_overlapping_ranges`): which
//! other pools of a data dir may hold the addresses of a pool, and at which of
//! the pool's offsets.
//!
//! The Kubernetes and etcd stores keep one reservation per address, named
//! `[<network_name>-]<address>` by the engine, so two ranges of the same
//! `network_name` that overlap never hand out one address twice. On one node
//! every pool is a file in one directory, so the file store keeps no second
//! record of that fact: the other pools of the same `network_name` whose ranges
//! overlap *are* the reservations. Nothing has to be kept in step with the
//! pools, so no crash can leave an entry without its reservation, or a
//! reservation without its entry.
//!
//! A pool file's name is the engine's pool name, `[<network_name>-]<range with
//! ':' and '/' as '-'>`. Read back under a given `network_name` it yields the
//! range, and a name of another scope yields none, except where the two
//! spellings coincide (`beef-2001-db8---64` is `2001:db8::/64` of network
//! `beef`, or `beef:2001:db8::/64` of no network): the range stored in the file
//! decides (see [`same_range`]).

use thereabouts_allocator::ip::{Cidr, offsets_in, parse_cidr};
use thereabouts_allocator::naming::pool_name_for_network;

use super::PoolId;

/// A pool's `network_name` scope and range, recovered from its name and CIDR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scoped {
    /// The `network_name` (empty when unset).
    pub scope: String,
    pub range: Cidr,
}

impl Scoped {
    /// `None` when the name is not the engine's name for the CIDR (never for
    /// pools the engine named).
    pub fn of(pool: &PoolId) -> Option<Scoped> {
        let range = parse_cidr(&pool.cidr, false)?;
        let bare = pool_name_for_network(&range.network_text(), "");
        let scope = if pool.name == bare { "" } else { pool.name.strip_suffix(&bare)?.strip_suffix('-')? };
        Some(Scoped { scope: scope.to_string(), range })
    }

    /// The range of the pool named `name` if that is a pool of this scope.
    pub fn peer_range(&self, name: &str) -> Option<Cidr> {
        let encoded = if self.scope.is_empty() { name } else { name.strip_prefix(&self.scope)?.strip_prefix('-')? };
        let (address, prefix) = encoded.rsplit_once('-')?;
        let range = parse_cidr(&format!("{}/{prefix}", address.replace('-', ":")), false)?;
        (pool_name_for_network(&range.network_text(), &self.scope) == name).then_some(range)
    }

    /// Whether `other` shares at least one address with this pool's range.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.range.overlaps(other)
    }

    /// This pool's offsets of the addresses that `offsets` of the pool `other`
    /// stand for (those inside this range).
    pub fn offsets_of<'a>(&'a self, other: &'a Cidr, offsets: impl Iterator<Item = u128> + 'a) -> impl Iterator<Item = u128> + 'a {
        offsets_in(other.network(), offsets, self.range.network(), self.range.broadcast())
    }
}

/// Whether the range text stored in a pool file is `range`.
pub fn same_range(stored: &str, range: &Cidr) -> bool {
    parse_cidr(stored, false).is_some_and(|s| s.network_text() == range.network_text())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scoped(name: &str, cidr: &str) -> Scoped {
        Scoped::of(&PoolId { name: name.into(), cidr: cidr.into(), node_local: false }).unwrap()
    }

    fn cidr(text: &str) -> Cidr {
        parse_cidr(text, false).unwrap()
    }

    #[test]
    fn a_pools_scope_comes_from_its_name() {
        assert_eq!(scoped("192.0.2.0-24", "192.0.2.0/24").scope, "");
        assert_eq!(scoped("blue-192.0.2.0-24", "192.0.2.0/24").scope, "blue");
        assert_eq!(scoped("my-net.1-2001-db8---64", "2001:db8::/64").scope, "my-net.1");
        assert_eq!(Scoped::of(&PoolId { name: "other-198.51.100.0-24".into(), cidr: "192.0.2.0/24".into(), node_local: false }), None);
    }

    #[test]
    fn peers_are_the_pools_of_the_same_scope() {
        let unscoped = scoped("192.0.2.0-24", "192.0.2.0/24");
        assert_eq!(unscoped.peer_range("192.0.2.0-28"), Some(cidr("192.0.2.0/28")));
        assert_eq!(unscoped.peer_range("2001-db8---124"), Some(cidr("2001:db8::/124")));
        assert_eq!(unscoped.peer_range("blue-192.0.2.0-28"), None);
        assert_eq!(unscoped.peer_range("192.0.2.0-33"), None);
        assert_eq!(unscoped.peer_range("192.0.2.5-28"), None, "not the engine's name for any range");
        let blue = scoped("blue-192.0.2.0-24", "192.0.2.0/24");
        assert_eq!(blue.peer_range("blue-192.0.2.0-28"), Some(cidr("192.0.2.0/28")));
        assert_eq!(blue.peer_range("blue-2001-db8--ff00-120"), Some(cidr("2001:db8::ff00/120")));
        assert_eq!(blue.peer_range("192.0.2.0-28"), None);
        assert_eq!(blue.peer_range("bluegreen-192.0.2.0-28"), None);
        // Two spellings of one name: only the stored range can tell them apart.
        assert_eq!(unscoped.peer_range("beef-2001-db8---64"), Some(cidr("beef:2001:db8::/64")));
        assert!(same_range("beef:2001:db8::/64", &cidr("beef:2001:db8::/64")));
        assert!(!same_range("2001:db8::/64", &cidr("beef:2001:db8::/64")));
    }

    #[test]
    fn overlapping_ranges_map_addresses_to_offsets() {
        let wide = scoped("192.0.2.0-24", "192.0.2.0/24");
        let narrow = cidr("192.0.2.16/28");
        assert!(wide.overlaps(&narrow) && wide.overlaps(&cidr("192.0.2.0/25")));
        assert!(!wide.overlaps(&cidr("198.51.100.0/24")) && !wide.overlaps(&cidr("2001:db8::/64")));
        assert_eq!(wide.offsets_of(&narrow, [1, 14].into_iter()).collect::<Vec<_>>(), [17, 30]);
        let inner = scoped("192.0.2.16-28", "192.0.2.16/28");
        assert_eq!(inner.offsets_of(&cidr("192.0.2.0/24"), [1, 17, 31, 32].into_iter()).collect::<Vec<_>>(), [1, 15]);
        let v6 = scoped("2001-db8---126", "2001:db8::/126");
        assert_eq!(v6.offsets_of(&cidr("2001:db8::/124"), [1, 3, 4].into_iter()).collect::<Vec<_>>(), [1, 3]);
    }
}
