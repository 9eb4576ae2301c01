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

use crate::ip::{Family, format_ip, from_u128, parse_ip_sloppy, parse_ip_strict, to_u128};
use crate::model::{Allocation, Assignment, NormalizedConfig, NormalizedRange, PlanOutcome, PoolSnapshot, PreviewFailure, PreviewTable, Request};

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
    /// `want` is how many successive free addresses the caller may ask for.
    fn new(range: &NormalizedRange, pool: &PoolSnapshot, want: usize) -> Self {
        let candidates = Candidates::of(range);
        let window = (pool.occupied_count() as u128 + want as u128).min(candidates.total) as usize;
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
            for &offset in &pool.reserved {
                if let Some(rank) = candidates.rank(offset) {
                    bitmap.mark(rank);
                }
            }
        } else {
            for offset in pool.occupied() {
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

fn assignment(range: &NormalizedRange, offset: u128) -> Assignment {
    let ip = format_ip(from_u128(range.family, range.network + offset));
    Assignment { address: format!("{ip}/{}", range.prefix_len), ip, offset, gateway: range.gateway.clone() }
}

/// whereabouts' exhaustion message (allocate.go AssignmentError), kept verbatim
/// because operators grep for it.
pub fn exhausted_message(range: &NormalizedRange) -> String {
    format!(
        "Could not allocate IP in range: ip: {} / - {} / range: {} / excludeRanges: [{}]",
        range.first,
        range.last,
        range.cidr,
        range.excludes.join(" ")
    )
}

/// Does this held entry belong to the request? (pod-ref, ifname) like whereabouts;
/// without a pod-ref (a runtime that is not Kubernetes), (container ID, ifname).
fn is_same_attachment(entry: &Allocation, req: &Request) -> bool {
    entry.ifname == req.ifname
        && if req.pod_ref.is_empty() { entry.container_id == req.container_id } else { entry.pod_ref == req.pod_ref }
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

/// Plan one range. See `plan` in the WIT.
pub fn plan(range: &NormalizedRange, pool: &PoolSnapshot, req: &Request) -> PlanOutcome {
    // An address the attachment already holds is kept even when it is excluded or
    // the gateway (written before that was configured, or by whereabouts): moving
    // a running pod is worse, and nothing new is handed out.
    if let Some((index, entry)) = pool.held.iter().enumerate().find(|(_, e)| is_same_attachment(e, req)) {
        return PlanOutcome::Reuse { assignment: assignment(range, entry.offset), held_index: index as u32 };
    }
    if let Some(text) = &req.requested_ip {
        return plan_requested(range, pool.occupied(), text);
    }
    let window = spread_window(req.contention);
    let mut free = FreeRanks::new(range, pool, window);
    let chosen = if window == 1 {
        free.next_offset()
    } else {
        // The first `window` free addresses (fewer when the range has fewer).
        let candidates: Vec<u128> = std::iter::from_fn(|| free.next_offset()).take(window).collect();
        (!candidates.is_empty()).then(|| candidates[spread_index(req, candidates.len())])
    };
    match chosen {
        Some(offset) => PlanOutcome::Fresh { assignment: assignment(range, offset) },
        None => PlanOutcome::Exhausted { message: exhausted_message(range) },
    }
}

fn plan_requested(range: &NormalizedRange, mut taken: impl Iterator<Item = u128>, text: &str) -> PlanOutcome {
    let reject = |why: String| PlanOutcome::Rejected { message: format!("requested address {text}: {why}") };
    let bare = text.split_once('/').map_or(text, |(ip, _)| ip);
    let Some(ip) = parse_ip_sloppy(bare) else { return reject("not an IP address".into()) };
    let value = to_u128(ip);
    let network_end = range.network | crate::ip::host_mask(range.family, range.prefix_len);
    if Family::of(ip) != range.family || value < range.network || value > network_end {
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
    PlanOutcome::Fresh { assignment: assignment(range, offset) }
}

/// The absolute addresses chosen so far in a multi-range plan; later ranges treat
/// those inside their network as reserved, so one config never hands the same
/// address out twice (same pool listed twice, or overlapping ranges).
fn reserve_earlier_choices(range: &NormalizedRange, earlier: &[(Family, u128)], pool: &PoolSnapshot) -> PoolSnapshot {
    let network_end = range.network | crate::ip::host_mask(range.family, range.prefix_len);
    let mut pool = pool.clone();
    pool.reserved.extend(
        earlier
            .iter()
            .filter(|(f, v)| *f == range.family && *v >= range.network && *v <= network_end)
            .map(|(_, v)| v - range.network),
    );
    pool
}

/// Plan every range of a config. See `plan-all` in the WIT.
pub fn plan_all(config: &NormalizedConfig, pools: &[PoolSnapshot], req: &Request) -> Result<Vec<PlanOutcome>, PlanOutcome> {
    if pools.len() != config.ranges.len() {
        return Err(PlanOutcome::Rejected {
            message: format!("expected one pool snapshot per range ({}), got {}", config.ranges.len(), pools.len()),
        });
    }
    let mut outcomes = Vec::with_capacity(pools.len());
    let mut chosen: Vec<(Family, u128)> = Vec::with_capacity(pools.len());
    for (range, pool) in config.ranges.iter().zip(pools) {
        let request = Request { requested_ip: range.requested.clone(), ..req.clone() };
        let outcome = if chosen.is_empty() {
            plan(range, pool, &request)
        } else {
            plan(range, &reserve_earlier_choices(range, &chosen, pool), &request)
        };
        match outcome.assignment() {
            Some(a) => chosen.push((range.family, range.network + a.offset)),
            None => return Err(outcome),
        }
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
pub fn preview(config: &NormalizedConfig, pools: &[PoolSnapshot], pods: u32) -> Vec<Vec<PlanOutcome>> {
    let empty = PoolSnapshot::default();
    let pods = pods as usize;
    let ranges = &config.ranges;
    // Each range walks its own free addresses lowest first; an address another
    // range handed out in the meantime is skipped, as its reservation would be.
    let want = pods.saturating_mul(ranges.len().max(1));
    let mut free: Vec<FreeRanks> = ranges.iter().enumerate().map(|(i, r)| FreeRanks::new(r, pools.get(i).unwrap_or(&empty), want)).collect();
    let overlapping = ranges_overlap(ranges);
    let mut handed_out: std::collections::HashSet<(Family, u128)> = std::collections::HashSet::new();
    let mut out: Vec<Vec<PlanOutcome>> = Vec::with_capacity(pods);
    while out.len() < pods {
        let mut offsets = Vec::with_capacity(ranges.len());
        let mut failed_at = None;
        for (i, range) in ranges.iter().enumerate() {
            let next = loop {
                match free[i].next_offset() {
                    Some(o) if overlapping && handed_out.contains(&(range.family, range.network + o)) => continue,
                    other => break other,
                }
            };
            match next {
                Some(offset) => {
                    if overlapping {
                        handed_out.insert((range.family, range.network + offset));
                    }
                    offsets.push(offset);
                }
                None => {
                    failed_at = Some(i);
                    break;
                }
            }
        }
        if let Some(k) = failed_at {
            let failed = ranges
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    if i == k {
                        PlanOutcome::Exhausted { message: exhausted_message(r) }
                    } else {
                        PlanOutcome::Rejected { message: format!("not allocated: the ADD fails because range {} has no free address", ranges[k].cidr) }
                    }
                })
                .collect::<Vec<_>>();
            out.resize(pods, failed);
            break;
        }
        out.push(ranges.iter().zip(offsets).map(|(r, o)| PlanOutcome::Fresh { assignment: assignment(r, o) }).collect());
    }
    out
}

/// [`preview`] as a [`PreviewTable`].
pub fn preview_table(config: &NormalizedConfig, pools: &[PoolSnapshot], pods: u32) -> PreviewTable {
    let mut table = PreviewTable::default();
    for pod in preview(config, pools, pods) {
        if pod.iter().any(|o| o.assignment().is_none()) {
            // A failing pod: `exhausted` for the range that ran out, `rejected` elsewhere.
            let (mut range_index, mut exhausted, mut rejected) = (0, String::new(), String::new());
            for (i, outcome) in pod.iter().enumerate() {
                match outcome {
                    PlanOutcome::Exhausted { message } => (range_index, exhausted) = (i as u32, message.clone()),
                    PlanOutcome::Rejected { message } => rejected = message.clone(),
                    PlanOutcome::Fresh { .. } | PlanOutcome::Reuse { .. } => {}
                }
            }
            table.failure = Some(PreviewFailure { range_index, exhausted, rejected });
            break;
        }
        if table.served > 0 {
            table.addresses.push('\n');
        }
        for (i, outcome) in pod.iter().enumerate() {
            if let Some(a) = outcome.assignment() {
                if i > 0 {
                    table.addresses.push(' ');
                }
                table.addresses.push_str(&a.address);
                table.offsets.push(a.offset);
            }
        }
        table.served += 1;
    }
    table
}

/// Whether any two ranges' networks share an address (same pool listed twice,
/// or one range inside another).
fn ranges_overlap(ranges: &[NormalizedRange]) -> bool {
    let end = |r: &NormalizedRange| r.network | crate::ip::host_mask(r.family, r.prefix_len);
    ranges.iter().enumerate().any(|(i, a)| ranges[i + 1..].iter().any(|b| a.family == b.family && a.network <= end(b) && b.network <= end(a)))
}

/// Indices of the entries a DEL of (container ID, ifname) removes.
pub fn release(allocations: &[Allocation], container_id: &str, ifname: &str) -> Vec<u32> {
    allocations
        .iter()
        .enumerate()
        .filter(|(_, a)| a.container_id == container_id && a.ifname == ifname)
        .map(|(i, _)| i as u32)
        .collect()
}

/// The address at an offset of a range's network.
pub fn address_at(range: &NormalizedRange, offset: u128) -> Option<IpAddr> {
    (offset <= crate::ip::host_mask(range.family, range.prefix_len)).then(|| from_u128(range.family, range.network + offset))
}

/// The offset of an address inside a range's network.
pub fn offset_of(range: &NormalizedRange, ip: IpAddr) -> Option<u128> {
    let value = to_u128(ip);
    let end = range.network | crate::ip::host_mask(range.family, range.prefix_len);
    (Family::of(ip) == range.family && value >= range.network && value <= end).then(|| value - range.network)
}

#[cfg(test)]
#[path = "planner_tests.rs"]
mod tests;
