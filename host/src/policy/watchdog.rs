//! The wall-clock deadline of a policy call, kept by a kernel timer rather
//! than a thread. Every policy store is given an epoch deadline one tick
//! ahead before each call, and only this watchdog ticks the policy engine's
//! epoch: arming a call creates a POSIX timer (`CLOCK_MONOTONIC`) that sends
//! a signal to the calling thread alone (`SIGEV_THREAD_ID`) when the call's
//! budget is up; the handler ticks the epoch of the engine armed on that
//! thread, and the running guest traps (`Trap::Interrupt`) at its next loop
//! header or function entry. Disarming deletes the timer: a signal still
//! pending for the thread is delivered as that syscall returns, while the
//! call is still armed, and a signal that finds nothing armed ticks
//! nothing, so a tick can never land on a later call.
//!
//! Why no thread: starting one was most of the 31 µs a policy engine cost
//! an ADD, a process that runs one attachment. A timer costs three system
//! calls a call (create, arm, delete) and nothing when no policy runs.

use std::cell::Cell;
use std::sync::Once;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::Duration;

/// Ticks one engine's epoch when a call's deadline passes.
pub struct Watchdog {
    inner: Inner,
}

struct Inner {
    engine: wasmtime::Engine,
    /// How many deadlines passed (ticks sent).
    fired: AtomicU64,
}

thread_local! {
    /// The watchdog of the call this thread runs now (null: none). Read by
    /// the signal handler: a const-initialised `Cell` of a pointer is a
    /// plain thread-local load, with no lazy initialisation or destructor.
    static ARMED: Cell<*const Inner> = const { Cell::new(std::ptr::null()) };
}

/// Disarms on drop.
pub struct Armed<'a> {
    watchdog: &'a Watchdog,
    timer: libc::c_int,
    fired_before: u64,
}

/// The signal a deadline sends: the first real-time signal the C library
/// leaves to programs (nothing else in the plugin uses one).
fn signal() -> libc::c_int {
    libc::SIGRTMIN()
}

extern "C" fn on_deadline(_signal: libc::c_int) {
    // Async-signal-safe: a thread-local load, a relaxed atomic add in
    // `increment_epoch` (documented signal-safe), another atomic add.
    let armed = ARMED.with(Cell::get);
    // SAFETY: `ARMED` points at the `Inner` of a watchdog borrowed by a live
    // `Armed` of this very thread (cleared before that borrow ends).
    if let Some(inner) = unsafe { armed.as_ref() } {
        inner.engine.increment_epoch();
        inner.fired.fetch_add(1, Ordering::Relaxed);
    }
}

/// Installs the handler once per process.
fn install() -> std::io::Result<()> {
    static INSTALL: Once = Once::new();
    static FAILED: AtomicI32 = AtomicI32::new(0);
    INSTALL.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid one; the handler is
        // async-signal-safe (above). SA_RESTART: a system call the signal
        // interrupts is restarted; SA_ONSTACK: on wasmtime's alternate
        // signal stack when the thread has one.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_deadline as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(signal(), &action, std::ptr::null_mut()) != 0 {
                FAILED.store(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL), Ordering::Relaxed);
            }
        }
    });
    // Written only inside `call_once`, which this read follows.
    match FAILED.load(Ordering::Relaxed) {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

/// The kernel's `struct sigevent` for `SIGEV_THREAD_ID` (the C libraries'
/// own `timer_create` differ in what they pass on, so the system call is
/// made directly).
#[repr(C)]
struct KernelSigevent {
    value: usize,
    signo: libc::c_int,
    notify: libc::c_int,
    thread_id: libc::c_int,
    _pad: [libc::c_int; 11],
}

impl Watchdog {
    /// The watchdog of `engine`'s policy calls (installs the signal handler
    /// the first time in a process).
    pub fn start(engine: &wasmtime::Engine) -> std::io::Result<Self> {
        install()?;
        Ok(Watchdog { inner: Inner { engine: engine.clone(), fired: AtomicU64::new(0) } })
    }

    /// Arms the deadline `budget` from now for the call about to start on
    /// this thread.
    pub fn arm(&self, budget: Duration) -> std::io::Result<Armed<'_>> {
        let fired_before = self.inner.fired.load(Ordering::Relaxed);
        // SAFETY: plain system calls on values of this frame.
        let timer = unsafe {
            let event = KernelSigevent {
                value: 0,
                signo: signal(),
                notify: libc::SIGEV_THREAD_ID,
                // The system call, not the C library's `gettid` (a musl
                // static build may lack it).
                thread_id: libc::syscall(libc::SYS_gettid) as libc::c_int,
                _pad: [0; 11],
            };
            let mut timer: libc::c_int = 0;
            if libc::syscall(libc::SYS_timer_create, libc::CLOCK_MONOTONIC, &event as *const KernelSigevent, &mut timer as *mut libc::c_int) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            timer
        };
        ARMED.with(|a| a.set(&self.inner));
        let armed = Armed { watchdog: self, timer, fired_before };
        // A zero `it_value` would disarm: the shortest budget is 1 ns.
        let budget = budget.max(Duration::from_nanos(1));
        let at = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec { tv_sec: budget.as_secs().try_into().unwrap_or(1 << 30), tv_nsec: budget.subsec_nanos() as libc::c_long },
        };
        // SAFETY: the timer just created; `at` lives through the call.
        if unsafe { libc::syscall(libc::SYS_timer_settime, timer, 0, &at as *const libc::itimerspec, std::ptr::null_mut::<libc::itimerspec>()) } != 0 {
            return Err(std::io::Error::last_os_error()); // `armed` drops: timer deleted
        }
        Ok(armed)
    }

    /// How many deadlines passed so far.
    pub fn fired(&self) -> u64 {
        self.inner.fired.load(Ordering::Relaxed)
    }
}

impl Armed<'_> {
    /// Whether this call's deadline passed (the tick was sent).
    pub fn expired(&self) -> bool {
        self.watchdog.fired() > self.fired_before
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        // SAFETY: our timer, deleted once. A signal it left pending for this
        // thread is delivered as the call returns, while still armed.
        unsafe { libc::syscall(libc::SYS_timer_delete, self.timer) };
        ARMED.with(|a| a.set(std::ptr::null()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watchdog() -> (wasmtime::Engine, Watchdog) {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let engine = wasmtime::Engine::new(&config).unwrap();
        let w = Watchdog::start(&engine).unwrap();
        (engine, w)
    }

    #[test]
    fn a_deadline_that_passes_ticks_once() {
        let (_engine, w) = watchdog();
        let armed = w.arm(Duration::from_millis(5)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(armed.expired());
        assert_eq!(w.fired(), 1, "one tick for one deadline, however long it is left armed");
        drop(armed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(w.fired(), 1, "nothing armed, nothing more fired");
    }

    #[test]
    fn a_deadline_fires_within_a_millisecond() {
        let (_engine, w) = watchdog();
        let started = std::time::Instant::now();
        let armed = w.arm(Duration::from_millis(10)).unwrap();
        while !armed.expired() {
            std::hint::spin_loop();
            assert!(started.elapsed() < Duration::from_secs(5), "the deadline never fired");
        }
        let late = started.elapsed().saturating_sub(Duration::from_millis(10));
        assert!(started.elapsed() >= Duration::from_millis(10), "fired early");
        // Generous: the machine may be shared; the benches measure it closely.
        assert!(late < Duration::from_millis(50), "fired {late:?} late");
    }

    #[test]
    fn a_call_that_ends_in_time_leaves_no_tick_for_the_next() {
        let (_engine, w) = watchdog();
        drop(w.arm(Duration::from_millis(20)).unwrap());
        let next = w.arm(Duration::from_secs(10)).unwrap();
        std::thread::sleep(Duration::from_millis(60));
        assert!(!next.expired(), "the first call's deadline ticked during the second");
        assert_eq!(w.fired(), 0);
    }

    #[test]
    fn a_deadline_ticks_only_the_thread_that_armed_it() {
        let (_engine, w) = watchdog();
        let (_other_engine, other) = watchdog();
        std::thread::scope(|s| {
            s.spawn(|| {
                let armed = other.arm(Duration::from_secs(10)).unwrap();
                std::thread::sleep(Duration::from_millis(60));
                assert!(!armed.expired());
            });
            let armed = w.arm(Duration::from_millis(5)).unwrap();
            std::thread::sleep(Duration::from_millis(40));
            assert!(armed.expired());
        });
        assert_eq!((w.fired(), other.fired()), (1, 0));
    }
}
