//! The wall-clock deadline of a policy call. Every policy store is created
//! with an epoch deadline one tick ahead, and only this watchdog ticks the
//! policy engine's epoch: when an armed deadline passes, it ticks once, and
//! the running guest traps (`Trap::Interrupt`) at its next loop header or
//! function entry. Disarming happens under the same lock before the next call
//! creates its store, and the tick is sent only for the deadline armed at
//! that moment, so a tick can never land on a later call.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    /// The deadline of the call running now, if one runs.
    armed: Option<Instant>,
    /// When the watchdog wakes by itself (`None`: it sleeps until told).
    wakes_at: Option<Instant>,
    /// How many deadlines passed (ticks sent).
    fired: u64,
}

/// One thread per process, started with the first policy call.
pub struct Watchdog {
    shared: Arc<(Mutex<State>, Condvar)>,
}

/// Disarms on drop.
pub struct Armed<'a> {
    watchdog: &'a Watchdog,
    fired_before: u64,
}

impl Watchdog {
    pub fn start(engine: wasmtime::EngineWeak) -> std::io::Result<Self> {
        let shared: Arc<(Mutex<State>, Condvar)> = Arc::default();
        let theirs = shared.clone();
        std::thread::Builder::new().name("policy-watchdog".into()).spawn(move || watch(&theirs, &engine))?;
        Ok(Watchdog { shared })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arms the deadline `budget` from now for the call about to start.
    pub fn arm(&self, budget: Duration) -> Armed<'_> {
        let deadline = Instant::now() + budget;
        let mut state = self.state();
        state.armed = Some(deadline);
        let fired_before = state.fired;
        // Calls take microseconds and deadlines milliseconds: the watchdog is
        // woken only when it would otherwise wake too late. Waking at an old
        // deadline, it finds the new one and sleeps on.
        let wake = state.wakes_at.is_none_or(|at| at > deadline);
        drop(state);
        if wake {
            self.shared.1.notify_one();
        }
        Armed { watchdog: self, fired_before }
    }
}

impl Armed<'_> {
    /// Whether this call's deadline passed (the tick was sent).
    pub fn expired(&self) -> bool {
        self.watchdog.state().fired > self.fired_before
    }
}

impl Drop for Armed<'_> {
    /// No wake-up: the watchdog, waking at that deadline, finds nothing armed.
    fn drop(&mut self) {
        self.watchdog.state().armed = None;
    }
}

fn watch(shared: &(Mutex<State>, Condvar), engine: &wasmtime::EngineWeak) {
    let (lock, wake) = shared;
    let mut state = lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        match state.armed {
            None => {
                state.wakes_at = None;
                state = wake.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            Some(deadline) => {
                let now = Instant::now();
                if now < deadline {
                    state.wakes_at = Some(deadline);
                    state = wake.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
                    continue;
                }
                let Some(engine) = engine.upgrade() else { return };
                engine.increment_epoch();
                state.fired += 1;
                state.armed = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watchdog() -> (wasmtime::Engine, Watchdog) {
        let engine = wasmtime::Engine::default();
        let w = Watchdog::start(engine.weak()).unwrap();
        (engine, w)
    }

    #[test]
    fn a_deadline_that_passes_ticks_once() {
        let (_engine, w) = watchdog();
        let armed = w.arm(Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(50));
        assert!(armed.expired());
        assert_eq!(w.state().fired, 1, "one tick for one deadline, however long it is left armed");
        drop(armed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(w.state().fired, 1, "nothing armed, nothing more fired");
    }

    #[test]
    fn a_call_that_ends_in_time_leaves_no_tick_for_the_next() {
        let (_engine, w) = watchdog();
        drop(w.arm(Duration::from_millis(20)));
        let next = w.arm(Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!next.expired(), "the first call's deadline ticked during the second");
    }
}
