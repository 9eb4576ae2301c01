//! From the pools a datastore holds to what each range of a config sees: ranges
//! with the same pool name share one pool, and (when asked) an address one pool
//! holds is reserved in every other range whose network contains it. Also the
//! usage of each range, counted the way planning counts.

use crate::model::{NormalizedConfig, NormalizedRange, PoolSnapshot, PoolState, RangeUsage};

static EMPTY: PoolSnapshot = PoolSnapshot { taken: Vec::new(), taken_wide: Vec::new(), reserved: Vec::new(), held: Vec::new() };

/// The pool named `name`; a pool the list does not hold is empty (not created yet).
pub fn snapshot_of<'a>(pools: &'a [PoolState], name: &str) -> &'a PoolSnapshot {
    pools.iter().find(|p| p.name == name).map_or(&EMPTY, |p| &p.snapshot)
}

/// Offsets of `range`'s network that entries of the config's other pools hold:
/// what their overlapping-range reservations would make taken in `range`.
pub fn held_by_other_pools(config: &NormalizedConfig, pools: &[PoolState], range: &NormalizedRange) -> Vec<u128> {
    let mut held = Vec::new();
    for pool in pools.iter().filter(|p| p.name != range.pool_name) {
        // A pool's network is that of the ranges it serves; one not in the config is ignored.
        let Some(owner) = config.range_of_pool(&pool.name) else { continue };
        if owner.family != range.family {
            continue;
        }
        held.extend(crate::ip::offsets_in(owner.network, pool.snapshot.entries(), range.network, range.network_end()));
    }
    held
}

/// Whether this range would hand out `offset` (inside [first, last], not excluded).
fn allocatable(range: &NormalizedRange, offset: u128) -> bool {
    offset >= range.first_offset && offset <= range.last_offset && !range.excluded.iter().any(|&(lo, hi)| offset >= lo && offset <= hi)
}

/// How full each range is, in range order. See `usage` in the WIT.
pub fn usage(config: &NormalizedConfig, pools: &[PoolState]) -> Vec<RangeUsage> {
    config
        .ranges
        .iter()
        .map(|range| {
            let allocated = snapshot_of(pools, &range.pool_name).entries().filter(|&o| allocatable(range, o)).count() as u64;
            RangeUsage { allocated, free: range.usable.saturating_sub(u128::from(allocated)) }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(ipam: &str) -> NormalizedConfig {
        crate::normalize(&format!(r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"type":"thereabouts",{ipam}}}}}"#), None, "").unwrap()
    }

    fn pool(name: &str, offsets: &[u128]) -> PoolState {
        PoolState { name: name.into(), snapshot: PoolSnapshot::with_taken(offsets.iter().copied()) }
    }

    #[test]
    fn usage_counts_only_addresses_the_range_hands_out() {
        let c = config(r#""range":"192.0.2.0/24","range_start":"192.0.2.10","exclude":["192.0.2.20/30"]"#);
        let r = &c.ranges[0];
        assert!(!allocatable(r, 9) && allocatable(r, 10) && !allocatable(r, 21) && allocatable(r, 24) && !allocatable(r, 255));
        let used = usage(&c, &[pool("192.0.2.0-24", &[1, 10, 11, 21, 300])]);
        assert_eq!(used, [RangeUsage { allocated: 2, free: 245 - 4 - 2 }]);
        // A pool not given is empty.
        assert_eq!(usage(&c, &[])[0].allocated, 0);
    }

    #[test]
    fn ranges_of_one_pool_count_each_others_entries() {
        let c = config(r#""ipRanges":[{"range":"192.0.2.0/30"},{"range":"192.0.2.0/30"}]"#);
        let used = usage(&c, &[pool("192.0.2.0-30", &[1, 2])]);
        assert_eq!(used.iter().map(|u| (u.allocated, u.free)).collect::<Vec<_>>(), [(2, 0), (2, 0)]);
    }

    #[test]
    fn other_pools_entries_inside_a_range_are_reserved_there() {
        // A /28 inside a /24 (two pools) and an IPv6 range whose numbers must not mix with IPv4.
        let c = config(r#""ipRanges":[{"range":"192.0.2.0/24"},{"range":"192.0.2.16/28"},{"range":"2001:db8::/120"}]"#);
        let pools = [pool("192.0.2.0-24", &[1, 17, 40]), pool("192.0.2.16-28", &[2]), pool("2001-db8---120", &[17]), pool("elsewhere", &[5])];
        assert_eq!(held_by_other_pools(&c, &pools, &c.ranges[0]), [18]);
        assert_eq!(held_by_other_pools(&c, &pools, &c.ranges[1]), [1]);
        assert!(held_by_other_pools(&c, &pools, &c.ranges[2]).is_empty());
    }
}
