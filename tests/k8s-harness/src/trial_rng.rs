//! A small seeded random number generator (SplitMix64) for the fault trials:
//! every choice of a run (which fault, when, for how long, which processes)
//! comes from one seed, printed, so a trial can be replayed. Not for anything
//! that needs unpredictability.

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct TrialRng(u64);

impl TrialRng {
    pub fn new(seed: u64) -> TrialRng {
        TrialRng(seed)
    }

    /// A seed from the clock, for runs not told one.
    pub fn clock_seed() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// A whole number of milliseconds in `lo..=hi`.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next_u64() % (hi - lo + 1))
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// A seed for a sub-generator (one per trial), so a trial replays alone.
    pub fn fork(&mut self) -> u64 {
        self.next_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_choices_and_bounds_hold() {
        let (mut a, mut b) = (TrialRng::new(7), TrialRng::new(7));
        let picks = |r: &mut TrialRng| (0..100).map(|_| r.between(3, 5)).collect::<Vec<_>>();
        let (x, y) = (picks(&mut a), picks(&mut b));
        assert_eq!(x, y);
        assert!(x.iter().all(|v| (3..=5).contains(v)) && x.contains(&3) && x.contains(&5));
        assert_ne!(picks(&mut TrialRng::new(8)), x);
    }
}
