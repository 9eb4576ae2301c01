//! Time budgets and jittered exponential backoff for optimistic concurrency:
//! many plugins racing for one pool must not retry in lockstep.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Overrides every command's budget, in milliseconds (tests use short ones).
pub const TIMEOUT_ENV: &str = "THEREABOUTS_TIMEOUT_MS";

/// whereabouts gives ADD two minutes and DEL one.
pub const ADD_BUDGET: Duration = Duration::from_secs(120);
pub const OTHER_BUDGET: Duration = Duration::from_secs(60);

/// The budget for a command: `THEREABOUTS_TIMEOUT_MS` when set and numeric, else `default`.
pub fn budget(default: Duration) -> Duration {
    std::env::var(TIMEOUT_ENV).ok().and_then(|v| v.trim().parse::<u64>().ok()).map(Duration::from_millis).unwrap_or(default)
}

/// Exponential backoff from 2 ms to 250 ms, each pause scaled by a random factor
/// in [0.5, 1.5).
pub struct Backoff {
    next: Duration,
    max: Duration,
    rng: XorShift,
}

const FIRST_PAUSE: Duration = Duration::from_millis(2);
const MAX_PAUSE: Duration = Duration::from_millis(250);
/// [`Backoff::new`]'s pauses: first and longest.
pub const DEFAULT_PAUSES: (Duration, Duration) = (FIRST_PAUSE, MAX_PAUSE);

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    pub fn new() -> Self {
        Self::between(FIRST_PAUSE, MAX_PAUSE)
    }

    /// Pauses from `first` doubling up to `max` (each still jittered).
    pub fn between(first: Duration, max: Duration) -> Self {
        Self { next: first, max, rng: XorShift::seeded() }
    }

    /// Sleeps before the next attempt; false (without sleeping) when the pause
    /// would end past `deadline`.
    pub fn pause(&mut self, deadline: Instant) -> bool {
        match self.next_pause(deadline) {
            Some(pause) => {
                std::thread::sleep(pause);
                true
            }
            None => false,
        }
    }

    /// The next jittered pause, for a caller that sleeps itself (an async
    /// one); `None` when it would end at or after `deadline`.
    pub fn next_pause(&mut self, deadline: Instant) -> Option<Duration> {
        let factor = 0.5 + self.rng.unit();
        let pause = self.next.mul_f64(factor);
        self.next = (self.next * 2).min(self.max);
        (Instant::now() + pause < deadline).then_some(pause)
    }
}

/// A tiny PRNG: jitter needs spread between processes, not quality.
struct XorShift(u64);

impl XorShift {
    fn seeded() -> Self {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        let seed = nanos ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15;
        XorShift(seed | 1)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stops_at_the_deadline() {
        let mut backoff = Backoff::new();
        assert!(!backoff.pause(Instant::now()));
        let deadline = Instant::now() + Duration::from_millis(200);
        let mut pauses = 0;
        while backoff.pause(deadline) {
            pauses += 1;
        }
        assert!(pauses >= 1 && Instant::now() < deadline + Duration::from_millis(50));
    }

    #[test]
    fn jitter_stays_in_range() {
        let mut rng = XorShift::seeded();
        for _ in 0..1000 {
            let u = rng.unit();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
