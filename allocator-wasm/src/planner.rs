//! Choosing addresses. Lowest free address first, like whereabouts, but without
//! walking the range: the cost is O(k log e) for k pool entries and e excluded
//! blocks, whatever the range's size (a /64 costs what a /24 costs).
//!
//! Under contention (a request that already lost `c` races for the pool) the
//! choice spreads over the lowest 8^c free addresses instead (at most 1024) (see
//! [`spread_window`]): always a free address of the range, but not necessarily
//! the lowest, so concurrent writers stop planning the same one.
//!
//! The idea: the addresses that may be handed out are [first, last] minus the
//! excluded blocks. Number them 0, 1, 2, … in address order ("ranks"). With k
//! entries taken, the lowest free rank is at most k, so a bitmap of k+1 ranks,
//! filled from the taken offsets, finds it; one binary search maps it back.

use std::net::IpAddr;

use crate::attachment::{Holder, Ifname, same_attachment};
use crate::ip::{Family, format_ip, from_u128, parse_ip_sloppy, parse_ip_strict, to_u128};
use crate::model::{
    Allocation, Assignment, Attachment, NormalizedConfig, NormalizedRange, PlanFailure, PlanOutcome, PoolSnapshot, PoolState, PreviewFailure, PreviewTable,
    Released, Request, Reservations,
};
use crate::naming::reservation_name_of;
use crate::pools;

/// The allowed (non-excluded) segments of a range, with their rank starts.
struct Candidates {
    /// (first offset, last offset, rank of first offset), ascending.
    segments: Vec<(u128, u128, u128)>,
    total: u128,
}

impl Candidates {
    fn of(range: &NormalizedRange) -> Self {
        let mut segments = Vec::with_capacity(range.excluded.len() + 1);
        let mut cursor = range.first_offset;
        let mut rank = 0u128;
        let mut push = |lo: u128, hi: u128, rank: &mut u128| {
            segments.push((lo, hi, *rank));
            *rank += hi - lo + 1;
        };
        for &(lo, hi) in &range.excluded {
            if lo > cursor {
                push(cursor, lo - 1, &mut rank);
            }
            // Blocks are clipped to [first, last] and last < 2^128 - 1: no overflow.
            cursor = hi + 1;
        }
        if cursor <= range.last_offset {
            push(cursor, range.last_offset, &mut rank);
        }
        Candidates { segments, total: rank }
    }

    /// Rank of an offset, or None when it is outside [first, last] or excluded.
    fn rank(&self, offset: u128) -> Option<u128> {
        let i = self.segments.partition_point(|s| s.1 < offset);
        let &(lo, hi, rank) = self.segments.get(i)?;
        (offset >= lo && offset <= hi).then(|| rank + (offset - lo))
    }

    /// Offset of a rank (< total).
    fn offset(&self, rank: u128) -> u128 {
        let i = self.segments.partition_point(|s| s.2 + (s.1 - s.0) < rank);
        let (lo, _, first_rank) = self.segments[i];
        lo + (rank - first_rank)
    }
}

/// A bitmap over ranks [0, len): which of the lowest ranks are taken.
struct RankBitmap {
    words: Vec<u64>,
    len: usize,
}

impl RankBitmap {
    fn new(len: usize) -> Self {
        Self { words: vec![0; len.div_ceil(64)], len }
    }
    fn mark(&mut self, rank: u128) {
        if rank < self.len as u128 {
            self.set(rank as usize);
        }
    }
    /// `rank` must be below `len`.
    fn set(&mut self, rank: usize) {
        self.words[rank / 64] |= 1 << (rank % 64);
    }
    /// The lowest unmarked rank at or after `from`, if below `len`.
    fn next_free(&self, from: usize) -> Option<usize> {
        let mut word_index = from / 64;
        let mut word = self.words.get(word_index)? | ((1u64 << (from % 64)) - 1);
        loop {
            if word != u64::MAX {
                let r = word_index * 64 + (!word).trailing_zeros() as usize;
                return (r < self.len).then_some(r);
            }
            word_index += 1;
            word = *self.words.get(word_index)?;
        }
    }
}

/// Free ranks of a range, lowest first, given everything taken. Used by `plan`
/// (first free) and `preview` (the first n free).
struct FreeRanks {
    candidates: Candidates,
    bitmap: RankBitmap,
    cursor: usize,
}

impl FreeRanks {
    /// `want` is how many successive free addresses the caller may ask for;
    /// `also_reserved` are offsets taken besides the pool's own.
    fn new(range: &NormalizedRange, pool: &PoolSnapshot, also_reserved: &[u128], want: usize) -> Self {
        let candidates = Candidates::of(range);
        let window = ((pool.occupied_count() + also_reserved.len()) as u128 + want as u128).min(candidates.total) as usize;
        let mut bitmap = RankBitmap::new(window);
        // The hot path (100 000-entry pools): when the window's ranks all lie in
        // the first allowed segment (always without excludes; also with the
        // gateway or another block at the start of the range), a rank is the
        // distance from that segment's start. Offsets before it wrap past the
        // window, those after it rank beyond it, and when every offset of the
        // window fits in 64 bits the wide entries cannot fall inside it.
        let fast_start = candidates
            .segments
            .first()
            .filter(|&&(lo, hi, _)| hi - lo + 1 >= window as u128 && lo + window as u128 <= u128::from(u64::MAX))
            .map(|&(lo, _, _)| lo as u64);
        if let Some(first) = fast_start {
            for &offset in &pool.taken {
                let rank = offset.wrapping_sub(first);
                if rank < window as u64 {
                    bitmap.set(rank as usize);
                }
            }
            for &offset in pool.reserved.iter().chain(also_reserved) {
                if let Some(rank) = candidates.rank(offset) {
                    bitmap.mark(rank);
                }
            }
        } else {
            for offset in pool.occupied().chain(also_reserved.iter().copied()) {
                if let Some(rank) = candidates.rank(offset) {
                    bitmap.mark(rank);
                }
            }
        }
        FreeRanks { candidates, bitmap, cursor: 0 }
    }

    fn next_offset(&mut self) -> Option<u128> {
        let rank = self.bitmap.next_free(self.cursor)?;
        self.cursor = rank + 1;
        Some(self.candidates.offset(rank as u128))
    }
}

/// The address at `offset` of the range's network: (`ip`, `ip/prefix`).
fn address_texts(range: &NormalizedRange, offset: u128) -> (String, String) {
    let ip = format_ip(from_u128(range.family, range.network + offset));
    let address = format!("{ip}/{}", range.prefix_len);
    (ip, address)
}

fn assignment(range: &NormalizedRange, offset: u128, network_name: &str) -> Assignment {
    let (ip, address) = address_texts(range, offset);
    Assignment { reservation: reservation_name_of(&ip, network_name), address, ip, offset, gateway: range.gateway.clone() }
}

/// whereabouts' exhaustion message (allocate.go AssignmentError), kept verbatim
/// because operators grep for it.
pub fn exhausted_message(range: &NormalizedRange) -> String {
    format!("Could not allocate IP in range: ip: {} / - {} / range: {} / excludeRanges: [{}]", range.first, range.last, range.cidr, range.excludes.join(" "))
}

/// Does this held entry belong to the request? See [`same_attachment`].
fn is_same_attachment(entry: &Allocation, req: &Request) -> bool {
    same_attachment(entry.holder(), Holder { container_id: &req.container_id, pod_ref: &req.pod_ref, ifname: &req.ifname }, Ifname::Required)
}

/// The window grows eightfold with every conflict, up to 2^`MAX_SPREAD_BITS` =
/// 1024 addresses: 8, 64, 512, 1024. Measured against a real apiserver, a
/// doubling window (2, 4, 8, ...) kept 200 simultaneous ADDs on one pool racing
/// for ~10 rounds each, and every lost round costs a reservation attempt; eight
/// times wider parts them in about three rounds. Two or three racing pods (the
/// common case) part at once among 8. A pool's addresses still stay packed
/// near its start: a contended pick is never past the first 1024 free.
pub const MAX_SPREAD_BITS: u32 = 10;
const SPREAD_BITS_PER_CONFLICT: u32 = 3;

/// How many of the lowest free addresses a request with `contention` conflicts
/// behind it chooses among: 1 (the lowest, whereabouts' rule) without contention,
/// else 2^min(3·contention, [`MAX_SPREAD_BITS`]). n requests that all planned the
/// same address and lost (one of them won) thus spread over 8, 64, 512, ...
/// candidates: about log8(n) conflicts each instead of one winner per round.
pub fn spread_window(contention: u32) -> usize {
    1 << contention.saturating_mul(SPREAD_BITS_PER_CONFLICT).min(MAX_SPREAD_BITS)
}

/// Which of `window` candidates a contended request takes: a hash (FNV-1a, then
/// the SplitMix64 finalizer) of its container ID, interface and contention, so
/// two contenders rarely pick the same one, a request picks anew after every
/// conflict, and the same request on the same pool always gets the same answer.
fn spread_index(req: &Request, window: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in req.container_id.bytes().chain([0xff]).chain(req.ifname.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= u64::from(req.contention).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    (h % window as u64) as usize
}

/// Plans one range on its own: what `plan-all` does for each range of a config.
/// Reservation names are not scoped by a network name (a range alone has none);
/// [`plan_all`] scopes them.
pub fn plan(range: &NormalizedRange, pool: &PoolSnapshot, req: &Request) -> Result<PlanOutcome, PlanFailure> {
    plan_range(range, pool, &[], req, "")
}

fn plan_range(range: &NormalizedRange, pool: &PoolSnapshot, also_reserved: &[u128], req: &Request, network_name: &str) -> Result<PlanOutcome, PlanFailure> {
    // An address the attachment already holds is kept even when it is excluded or
    // the gateway (written before that was configured, or by whereabouts): moving
    // a running pod is worse, and nothing new is handed out.
    if let Some((index, entry)) = pool.held.iter().enumerate().find(|(_, e)| is_same_attachment(e, req)) {
        return Ok(PlanOutcome::Reuse { assignment: assignment(range, entry.offset, network_name), held_index: index as u32 });
    }
    if let Some(text) = &req.requested_ip {
        return plan_requested(range, pool.occupied().chain(also_reserved.iter().copied()), text, network_name);
    }
    let window = spread_window(req.contention);
    let mut free = FreeRanks::new(range, pool, also_reserved, window);
    let chosen = if window == 1 {
        free.next_offset()
    } else {
        // The first `window` free addresses (fewer when the range has fewer).
        let candidates: Vec<u128> = std::iter::from_fn(|| free.next_offset()).take(window).collect();
        (!candidates.is_empty()).then(|| candidates[spread_index(req, candidates.len())])
    };
    match chosen {
        Some(offset) => Ok(PlanOutcome::Fresh { assignment: assignment(range, offset, network_name) }),
        None => Err(PlanFailure::Exhausted { message: exhausted_message(range) }),
    }
}

fn plan_requested(range: &NormalizedRange, mut taken: impl Iterator<Item = u128>, text: &str, network_name: &str) -> Result<PlanOutcome, PlanFailure> {
    let reject = |why: String| Err(PlanFailure::Rejected { message: format!("requested address {text}: {why}") });
    let bare = text.split_once('/').map_or(text, |(ip, _)| ip);
    let Some(ip) = parse_ip_sloppy(bare) else { return reject("not an IP address".into()) };
    let value = to_u128(ip);
    if !range.network_contains(Family::of(ip), value) {
        return reject(format!("outside range {}", range.cidr));
    }
    let offset = value - range.network;
    if offset < range.first_offset || offset > range.last_offset {
        return reject(format!("outside the allocatable span {} - {} of {}", range.first, range.last, range.cidr));
    }
    // host-local refuses a request for the gateway the same way ("requested ip
    // is subnet's gateway"); the gateway is never a pod's address.
    if range.gateway.as_deref().and_then(parse_ip_strict) == Some(ip) {
        return reject(format!("it is the gateway of {}", range.cidr));
    }
    if Candidates::of(range).rank(offset).is_none() {
        return reject(format!("excluded in {} (exclude: [{}])", range.cidr, range.excludes.join(" ")));
    }
    if taken.any(|t| t == offset) {
        return reject(format!("already allocated in {}", range.cidr));
    }
    Ok(PlanOutcome::Fresh { assignment: assignment(range, offset, network_name) })
}

/// The offsets of `range`'s network among the absolute addresses chosen so far
/// in a multi-range plan: later ranges treat them as reserved, so one config
/// never hands the same address out twice (same pool listed twice, or
/// overlapping ranges).
fn earlier_choices_in(range: &NormalizedRange, earlier: &[(Family, u128)]) -> impl Iterator<Item = u128> {
    earlier.iter().filter(move |(f, v)| range.network_contains(*f, *v)).map(move |(_, v)| v - range.network)
}

/// Plan every range of a config. See `plan-all` in the WIT.
pub fn plan_all(config: &NormalizedConfig, pools: &[PoolState], reservations: Reservations, req: &Request) -> Result<Vec<PlanOutcome>, PlanFailure> {
    let mut outcomes = Vec::with_capacity(config.ranges.len());
    let mut chosen: Vec<(Family, u128)> = Vec::with_capacity(config.ranges.len());
    for range in &config.ranges {
        let request = Request { requested_ip: range.requested.clone(), ..req.clone() };
        let mut also_reserved = match reservations {
            Reservations::FromPools if config.enable_overlapping_ranges => pools::held_by_other_pools(config, pools, range),
            _ => Vec::new(),
        };
        also_reserved.extend(earlier_choices_in(range, &chosen));
        let outcome = plan_range(range, pools::snapshot_of(pools, &range.pool_name), &also_reserved, &request, &config.network_name)?;
        chosen.push((range.family, range.network + outcome.assignment().offset));
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// What `pods` successive new pods would get. See `preview` in the WIT.
///
/// Exactly what `pods` successive ADDs would do: each pod is planned like
/// `plan_all` and committed before the next, so ranges that share a pool or
/// overlap never hand out one address twice, in the same order ADDs would.
/// Without releases a range that runs out stays out, so the first pod whose ADD
/// fails is followed only by failing pods.
pub fn preview(config: &NormalizedConfig, pools: &[PoolState], pods: u32) -> PreviewTable {
    let pods = pods as usize;
    let ranges = &config.ranges;
    // Each range walks its own free addresses lowest first; an address another
    // range handed out in the meantime is skipped, as its reservation would be.
    let want = pods.saturating_mul(ranges.len().max(1));
    let mut free: Vec<FreeRanks> = ranges.iter().map(|r| FreeRanks::new(r, pools::snapshot_of(pools, &r.pool_name), &[], want)).collect();
    let overlapping = ranges_overlap(ranges);
    let mut handed_out: std::collections::HashSet<(Family, u128)> = std::collections::HashSet::new();
    let mut table = PreviewTable::default();
    let mut offsets = Vec::with_capacity(ranges.len());
    while (table.served as usize) < pods {
        offsets.clear();
        for (i, range) in ranges.iter().enumerate() {
            let next = loop {
                match free[i].next_offset() {
                    Some(o) if overlapping && handed_out.contains(&(range.family, range.network + o)) => continue,
                    other => break other,
                }
            };
            let Some(offset) = next else {
                table.failure = Some(PreviewFailure {
                    range_index: i as u32,
                    exhausted: exhausted_message(range),
                    rejected: format!("not allocated: the ADD fails because range {} has no free address", range.cidr),
                });
                return table;
            };
            if overlapping {
                handed_out.insert((range.family, range.network + offset));
            }
            offsets.push(offset);
        }
        if table.served > 0 {
            table.addresses.push('\n');
        }
        for (i, (range, &offset)) in ranges.iter().zip(&offsets).enumerate() {
            if i > 0 {
                table.addresses.push(' ');
            }
            table.addresses.push_str(&address_texts(range, offset).1);
            table.offsets.push(offset);
        }
        table.served += 1;
    }
    table
}

/// Whether any two ranges' networks share an address (same pool listed twice,
/// or one range inside another).
fn ranges_overlap(ranges: &[NormalizedRange]) -> bool {
    ranges.iter().enumerate().any(|(i, a)| ranges[i + 1..].iter().any(|b| a.shares_network_with(b)))
}

/// The entries of pool `pool_name` a DEL of `attachments` removes: those whose
/// container ID and ifname both match one of them, with their reservation names.
pub fn release(range: &NormalizedRange, network_name: &str, allocations: &[Allocation], attachments: &[Attachment]) -> Vec<Released> {
    // DEL and CHECK ask about one attachment, GC about every stale one: a set then.
    let many: std::collections::HashSet<(&str, &str)> =
        if attachments.len() > 1 { attachments.iter().map(|who| (who.container_id.as_str(), who.ifname.as_str())).collect() } else { Default::default() };
    let wanted = |a: &Allocation| match attachments {
        [who] => a.container_id == who.container_id && a.ifname == who.ifname,
        _ => many.contains(&(a.container_id.as_str(), a.ifname.as_str())),
    };
    allocations
        .iter()
        .enumerate()
        .filter(|(_, a)| wanted(a))
        .map(|(i, a)| Released { index: i as u32, reservation: address_at(range, a.offset).map(|ip| reservation_name_of(&format_ip(ip), network_name)) })
        .collect()
}

/// The address at an offset of a range's network.
pub fn address_at(range: &NormalizedRange, offset: u128) -> Option<IpAddr> {
    (offset <= crate::ip::host_mask(range.family, range.network_prefix)).then(|| from_u128(range.family, range.network + offset))
}

/// The offset of an address inside a range's network.
pub fn offset_of(range: &NormalizedRange, ip: IpAddr) -> Option<u128> {
    let value = to_u128(ip);
    range.network_contains(Family::of(ip), value).then(|| value - range.network)
}

#[cfg(test)]
#[path = "planner_tests.rs"]
mod tests;
