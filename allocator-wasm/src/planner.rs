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

use crate::attachment::{Holder, owns};
use crate::error::ConfigError;
use crate::guidance;
use crate::ip::{Family, format_ip, from_u128, parse_ip_sloppy, parse_ip_strict, to_u128};
use crate::model::{
    Allocation, Assignment, Attachment, Claim, NormalizedConfig, NormalizedRange, PlanFailure, PlanOutcome, PoolSnapshot, PoolState, PreviewFailure,
    PreviewTable, RangeCandidates, RangePick, RangesAllocation, Released, Request, Reservations,
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

fn assignment(at: &RangeAt, offset: u128, network_name: &str) -> Assignment {
    let (ip, address) = address_texts(at.range, offset);
    Assignment { range_index: at.index, reservation: reservation_name_of(&ip, network_name), address, ip, offset, gateway: at.range.gateway.clone() }
}

/// whereabouts' exhaustion message (allocate.go AssignmentError), kept verbatim
/// because operators grep for it.
pub fn exhausted_message(range: &NormalizedRange) -> String {
    format!("Could not allocate IP in range: ip: {} / - {} / range: {} / excludeRanges: [{}]", range.first, range.last, range.cidr, range.excludes.join(" "))
}

/// Does this held entry belong to the request? See [`owns`]: the same pod
/// attachment, or the same claim.
fn is_same_attachment(entry: &Allocation, req: &Request) -> bool {
    owns(entry.holder(), entry.claim.as_ref(), Holder { container_id: &req.container_id, pod_ref: &req.pod_ref, ifname: &req.ifname }, req.claim.as_ref())
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
    plan_range(&RangeAt { range, index: 0, pick: None }, pool, Vec::new(), req, "").map_err(|miss| miss.failure)
}

/// A range as one plan sees it: its index in the config and the policies' pick.
struct RangeAt<'a> {
    range: &'a NormalizedRange,
    index: u32,
    pick: Option<&'a RangePick>,
}

/// Why one range did not serve a request. `skippable`: the range has no room
/// for it (exhausted, or a policy vetoed it), so `first-available` tries the
/// next; anything else (a bad answer, a requested address that cannot be had)
/// fails the request.
struct Miss {
    failure: PlanFailure,
    skippable: bool,
}

impl Miss {
    fn fatal(failure: PlanFailure) -> Self {
        Miss { failure, skippable: false }
    }
}

/// The pod's own entry in a pool, if it holds one.
fn held_by<'p>(pool: &'p PoolSnapshot, req: &Request) -> Option<(usize, &'p Allocation)> {
    pool.held.iter().enumerate().find(|(_, e)| is_same_attachment(e, req))
}

fn plan_range(at: &RangeAt, pool: &PoolSnapshot, mut also_reserved: Vec<u128>, req: &Request, network_name: &str) -> Result<PlanOutcome, Miss> {
    let range = at.range;
    // An address the attachment already holds is kept even when it is excluded or
    // the gateway (written before that was configured, or by whereabouts): moving
    // a running pod is worse, and nothing new is handed out. It beats a policy's
    // pick too: a policy is never asked to move a running pod.
    if let Some((index, entry)) = held_by(pool, req) {
        return Ok(PlanOutcome::Reuse { assignment: assignment(at, entry.offset, network_name), held_index: index as u32 });
    }
    if let Some(reason) = at.pick.and_then(|p| p.veto.as_ref()) {
        let message = format!("range {} vetoed by a policy: {reason}", range.cidr);
        return Err(Miss { failure: PlanFailure::Rejected { message }, skippable: true });
    }
    let refused = guidance::refused_offsets(range, at.pick);
    if let Some(text) = &req.requested_ip {
        return plan_requested(at, pool.occupied().chain(also_reserved.iter().copied()), &refused, text, network_name).map_err(Miss::fatal);
    }
    if let Some(prefer) = at.pick.map(|p| &p.prefer).filter(|p| !p.is_empty()) {
        return plan_preferred(at, pool, &also_reserved, &refused, prefer, network_name).map_err(Miss::fatal);
    }
    // Refused addresses are skipped as if excluded, under contention too.
    also_reserved.extend(refused);
    if let Some(offset) = free_preferred(range, pool, &also_reserved, &req.preferred) {
        return Ok(PlanOutcome::Fresh { assignment: assignment(at, offset, network_name) });
    }
    let window = spread_window(req.contention);
    let mut free = FreeRanks::new(range, pool, &also_reserved, window);
    let chosen = if window == 1 {
        free.next_offset()
    } else {
        // The first `window` free addresses (fewer when the range has fewer).
        let candidates: Vec<u128> = std::iter::from_fn(|| free.next_offset()).take(window).collect();
        (!candidates.is_empty()).then(|| candidates[spread_index(req, candidates.len())])
    };
    match chosen {
        Some(offset) => Ok(PlanOutcome::Fresh { assignment: assignment(at, offset, network_name) }),
        None => Err(Miss { failure: PlanFailure::Exhausted { message: exhausted_message(range) }, skippable: true }),
    }
}

/// A policy's `prefer` list: every entry must be an address the range hands
/// out (else the answer is bad), and the first that is free is taken.
fn plan_preferred(
    at: &RangeAt,
    pool: &PoolSnapshot,
    also_reserved: &[u128],
    refused: &[u128],
    prefer: &[String],
    network_name: &str,
) -> Result<PlanOutcome, PlanFailure> {
    let cidr = &at.range.cidr;
    let offsets = prefer
        .iter()
        .map(|text| guidance::preferred_offset(at.range, text))
        .collect::<Result<Vec<u128>, String>>()
        .map_err(|why| PlanFailure::BadPick { range_index: at.index, message: format!("policy preference in range {cidr}: {why}") })?;
    // A preference list is short: a scan of the pool per entry costs less than indexing it.
    let taken = |o: u128| refused.contains(&o) || also_reserved.contains(&o) || pool.occupied().any(|t| t == o);
    match offsets.into_iter().find(|&o| !taken(o)) {
        Some(offset) => Ok(PlanOutcome::Fresh { assignment: assignment(at, offset, network_name) }),
        None => Err(PlanFailure::BadPick {
            range_index: at.index,
            message: format!("policy preference in range {cidr}: every preferred address is taken: {}", prefer.join(", ")),
        }),
    }
}

/// The first of the pod's preferred addresses that this range hands out and
/// that is free, if any. Unlike a requested address or a policy's preference,
/// one that cannot be had here is no error: it may be another range's (the
/// other family), and a preference yields to the configured choice
/// (whereabouts PR #681's `preferred-ip`).
fn free_preferred(range: &NormalizedRange, pool: &PoolSnapshot, also_reserved: &[u128], preferred: &[String]) -> Option<u128> {
    preferred.iter().filter_map(|text| guidance::preferred_offset(range, text).ok()).find(|&o| !also_reserved.contains(&o) && !pool.occupied().any(|t| t == o))
}

fn plan_requested(at: &RangeAt, mut taken: impl Iterator<Item = u128>, refused: &[u128], text: &str, network_name: &str) -> Result<PlanOutcome, PlanFailure> {
    let range = at.range;
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
    if refused.contains(&offset) {
        return reject(format!("refused by a policy in {}", range.cidr));
    }
    if taken.any(|t| t == offset) {
        return reject(format!("already allocated in {}", range.cidr));
    }
    Ok(PlanOutcome::Fresh { assignment: assignment(at, offset, network_name) })
}

/// The offsets of `range`'s network among absolute addresses of a multi-range
/// plan (those chosen so far, those the attachment keeps): a range treats them
/// as reserved, so one config never hands the same address out twice (same
/// pool listed twice, or overlapping ranges).
fn plan_offsets_in(range: &NormalizedRange, addresses: &[(Family, u128)]) -> impl Iterator<Item = u128> {
    addresses.iter().filter(move |(f, v)| range.network_contains(*f, *v)).map(move |(_, v)| v - range.network)
}

/// Plan the ranges of a config a request is served from. See `plan-all` in the WIT.
///
/// The ranges are those of `req.guidance` (else all), in its order. With
/// `ip-ranges-allocation` `all` each is planned and the first failure fails
/// the request; with `first-available` the first that serves it is the only
/// one, a range the pod already holds an address in first (an ADD is
/// idempotent: a retried or repeated ADD keeps the pod where it is, even when
/// an earlier range has room again). An exhausted or vetoed range is skipped
/// there; when none serves, the last one's failure is the answer.
pub fn plan_all(config: &NormalizedConfig, pools: &[PoolState], reservations: Reservations, req: &Request) -> Result<Vec<PlanOutcome>, PlanFailure> {
    let guided = guidance::resolve(config.ranges.len(), req.guidance.as_ref())?;
    let first_available = config.ip_ranges_allocation == RangesAllocation::FirstAvailable;
    let mut order = guided.order.clone();
    if first_available && let Some(held) = order.iter().position(|&i| held_by(pools::snapshot_of(pools, &config.ranges[i].pool_name), req).is_some()) {
        order = vec![order[held]];
    }
    let mut outcomes = Vec::with_capacity(order.len());
    let mut chosen: Vec<(Family, u128)> = Vec::with_capacity(order.len());
    // What the attachment keeps in any range of the order: a range planned
    // before the one that keeps it must not give that address again.
    let kept: Vec<(Family, u128)> = order
        .iter()
        .filter_map(|&i| {
            let range = &config.ranges[i];
            held_by(pools::snapshot_of(pools, &range.pool_name), req).map(|(_, e)| (range.family, range.network + e.offset))
        })
        .collect();
    let mut last_miss = None;
    for index in order {
        let range = &config.ranges[index];
        // The guidance is applied here, through `at`: the per-range request does not carry it.
        let request = Request {
            container_id: req.container_id.clone(),
            pod_ref: req.pod_ref.clone(),
            ifname: req.ifname.clone(),
            requested_ip: range.requested.clone(),
            contention: req.contention,
            guidance: None,
            preferred: req.preferred.clone(),
            claim: req.claim.clone(),
        };
        let mut also_reserved = match reservations {
            Reservations::FromPools if config.enable_overlapping_ranges => pools::held_by_other_pools(config, pools, range),
            _ => Vec::new(),
        };
        also_reserved.extend(plan_offsets_in(range, &chosen));
        also_reserved.extend(plan_offsets_in(range, &kept));
        let at = RangeAt { range, index: index as u32, pick: guided.pick(index) };
        match plan_range(&at, pools::snapshot_of(pools, &range.pool_name), also_reserved, &request, &config.network_name) {
            Ok(outcome) => {
                chosen.push((range.family, range.network + outcome.assignment().offset));
                outcomes.push(outcome);
                if first_available {
                    return Ok(outcomes);
                }
            }
            Err(miss) if first_available && miss.skippable => last_miss = Some(miss.failure),
            Err(miss) => return Err(miss.failure),
        }
    }
    match last_miss {
        Some(failure) => Err(failure),
        None => Ok(outcomes),
    }
}

/// The most free addresses [`candidates`] lists per range, whatever it is asked
/// for: the list crosses to a policy, and its bitmap is sized by it.
pub const MAX_CANDIDATES: u32 = 65_536;

/// What a policy is offered in each of `ranges`. See `candidates` in the WIT.
///
/// The lowest `limit` (at most [`MAX_CANDIDATES`]) free addresses, on
/// `plan_all`'s rules minus the request's own choices (none is made yet): the
/// pool's entries, its reservations (and, with [`Reservations::FromPools`],
/// the other pools' entries) and the pick's `refuse` list are skipped. A range
/// the pod already holds an address in offers just that one (`held`). With k
/// such offsets the lowest free ranks are among the first k + limit, so the
/// cost is O(k log e + limit) whatever the range's size.
pub fn candidates(
    config: &NormalizedConfig,
    pools: &[PoolState],
    reservations: Reservations,
    req: &Request,
    ranges: &[u32],
    limit: u32,
) -> Result<Vec<RangeCandidates>, ConfigError> {
    let picks = req.guidance.as_ref().map(|g| g.picks.as_slice()).unwrap_or_default();
    let limit = limit.min(MAX_CANDIDATES) as usize;
    let mut out = Vec::with_capacity(ranges.len());
    for (i, &range_index) in ranges.iter().enumerate() {
        let range = usize::try_from(range_index).ok().and_then(|index| config.ranges.get(index)).ok_or_else(|| {
            ConfigError::invalid("ranges", format!("ranges[{i}] is {range_index}, but the config has {} range(s) (indexes from 0)", config.ranges.len()))
        })?;
        let pool = pools::snapshot_of(pools, &range.pool_name);
        if let Some((_, entry)) = held_by(pool, req) {
            out.push(RangeCandidates { range_index, free: Vec::new(), held: address_at(range, entry.offset).map(format_ip) });
            continue;
        }
        let mut also_reserved = match reservations {
            Reservations::FromPools if config.enable_overlapping_ranges => pools::held_by_other_pools(config, pools, range),
            _ => Vec::new(),
        };
        also_reserved.extend(guidance::refused_offsets(range, picks.iter().find(|p| p.range_index == range_index)));
        let mut free = FreeRanks::new(range, pool, &also_reserved, limit);
        let free = std::iter::from_fn(|| free.next_offset()).take(limit).map(|offset| address_texts(range, offset).0).collect();
        out.push(RangeCandidates { range_index, free, held: None });
    }
    Ok(out)
}

/// What `pods` successive new pods would get. See `preview` in the WIT.
///
/// Exactly what `pods` successive ADDs would do: each pod is planned like
/// `plan_all` and committed before the next, so ranges that share a pool or
/// overlap never hand out one address twice, in the same order ADDs would.
/// Without releases a range that runs out stays out, so the first pod whose ADD
/// fails is followed only by failing pods.
///
/// With `first-available` a pod gets one address, from the first range with
/// room; its line still has one entry per range, in range order, `-` for each
/// range it gets nothing from (its offset 0), so every consumer reads the
/// table by the same rule. A pod fails only when every range is out; the
/// failure names the last range.
pub fn preview(config: &NormalizedConfig, pools: &[PoolState], pods: u32) -> PreviewTable {
    let pods = pods as usize;
    let ranges = &config.ranges;
    let first_available = config.ip_ranges_allocation == RangesAllocation::FirstAvailable;
    // Each range walks its own free addresses lowest first; an address another
    // range handed out in the meantime is skipped, as its reservation would be.
    let want = pods.saturating_mul(ranges.len().max(1));
    let mut free: Vec<FreeRanks> = ranges.iter().map(|r| FreeRanks::new(r, pools::snapshot_of(pools, &r.pool_name), &[], want)).collect();
    let overlapping = ranges_overlap(ranges);
    let mut handed_out: std::collections::HashSet<(Family, u128)> = std::collections::HashSet::new();
    let mut table = PreviewTable::default();
    // One slot per range; `None`: the pod gets nothing there (first-available).
    let mut offsets: Vec<Option<u128>> = Vec::with_capacity(ranges.len());
    while (table.served as usize) < pods {
        offsets.clear();
        for (i, range) in ranges.iter().enumerate() {
            if first_available && offsets.iter().any(Option::is_some) {
                offsets.push(None);
                continue;
            }
            let next = loop {
                match free[i].next_offset() {
                    Some(o) if overlapping && handed_out.contains(&(range.family, range.network + o)) => continue,
                    other => break other,
                }
            };
            let Some(offset) = next else {
                if first_available && i + 1 < ranges.len() {
                    offsets.push(None);
                    continue;
                }
                let rejected = if first_available {
                    "not allocated: the ADD fails because no range has a free address".to_string()
                } else {
                    format!("not allocated: the ADD fails because range {} has no free address", range.cidr)
                };
                table.failure = Some(PreviewFailure { range_index: i as u32, exhausted: exhausted_message(range), rejected });
                return table;
            };
            if overlapping {
                handed_out.insert((range.family, range.network + offset));
            }
            offsets.push(Some(offset));
        }
        if table.served > 0 {
            table.addresses.push('\n');
        }
        for (i, (range, offset)) in ranges.iter().zip(&offsets).enumerate() {
            if i > 0 {
                table.addresses.push(' ');
            }
            match offset {
                Some(offset) => {
                    table.addresses.push_str(&address_texts(range, *offset).1);
                    table.offsets.push(*offset);
                }
                None => {
                    table.addresses.push('-');
                    table.offsets.push(0);
                }
            }
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
/// container ID and ifname both match one of them, with their reservation
/// names. Never an entry a claim owns: its holder's DEL leaves it to the claim
/// (a VM's launcher pod stops, the VM keeps its address).
pub fn release(range: &NormalizedRange, network_name: &str, allocations: &[Allocation], attachments: &[Attachment]) -> Vec<Released> {
    // DEL and CHECK ask about one attachment, GC about every stale one: a set then.
    let many: std::collections::HashSet<(&str, &str, Option<&Claim>)> = if attachments.len() > 1 {
        attachments.iter().map(|who| (who.container_id.as_str(), who.ifname.as_str(), who.claim.as_ref())).collect()
    } else {
        Default::default()
    };
    // A release ends the entries of its attachment that belong to the owner it
    // speaks for: a pod's DEL or GC (no claim) a pod's entry; a device's
    // release, or a GC that found an IPAMClaim gone, that claim's.
    let wanted = |a: &Allocation| match attachments {
        [who] => a.container_id == who.container_id && a.ifname == who.ifname && a.claim == who.claim,
        _ => many.contains(&(a.container_id.as_str(), a.ifname.as_str(), a.claim.as_ref())),
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

#[cfg(test)]
#[path = "planner_guided_tests.rs"]
mod guided_tests;
