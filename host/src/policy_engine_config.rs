// The wasmtime configurations for operators' policy components, shared by the
// policy compiler (host/policy-compiler, which precompiles), host/build.rs
// (which computes the artifacts' compatibility key, see compat_hash.rs) and
// the plugin's policy sandbox (which runs them), all via `include!`. As with
// engine_config.rs, a `.cwasm` only loads into an engine whose effective
// settings match, so everything whose default could differ is pinned here.
//
// Unlike the engine, a policy is someone else's code: it is bounded in time
// (epochs), stack (here) and memory (the store's limiter, per call).
//
// This file is plain Rust without `use` items so it can be `include!`d.

/// Engine configuration for untrusted policy components: what the plugin runs.
pub fn policy_engine_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    // Pinned because their defaults follow wasmtime's cargo features.
    config.gc_support(false);
    config.concurrency_support(false);
    // Wall-clock bound: the generated code checks the engine's epoch at every
    // function entry and loop header, and the host's watchdog bumps it when a
    // call's `timeout_ms` is up, so even `loop {}` traps (`Trap::Interrupt`).
    // Epochs rather than fuel: cheaper (measured +4 % against +6-7 % per
    // hook call, +24-40 % against +37-56 % in compute; docs/benchmarks.md,
    // "Epochs or fuel"), and a policy's budget is time, which fuel is not.
    config.epoch_interruption(true);
    config.consume_fuel(false);
    // Half of wasmtime's 512 KiB default: a policy has no reason to recurse
    // deep, and unbounded recursion must trap (`Trap::StackOverflow`) well
    // before the plugin's own thread runs out of native stack.
    config.max_wasm_stack(256 << 10);
    // Unlike the engine (engine_config.rs), instantiated once per process, a
    // policy is instantiated for every call (four in a one-policy ADD): its
    // memory image is mapped copy-on-write from the artifact's file mapping
    // instead of its data segments being copied each time.
    config.memory_init_cow(true);
    // As for the engine: no unwinding ever crosses a policy's frames (it
    // imports nothing), and registering unwind tables costs every start-up.
    config.native_unwind_info(false);
    config
}

/// The same with deterministic fuel metering instead of epochs. Only the
/// benchmark comparing the two uses it (and `thereabouts-policy-compiler
/// compile --fuel`); fuel and epochs change the generated code, so its
/// artifacts have their own compatibility key. Kept beside the real one so
/// the two differ in exactly these two settings.
pub fn policy_fuel_engine_config() -> wasmtime::Config {
    let mut config = policy_engine_config();
    config.epoch_interruption(false);
    config.consume_fuel(true);
    config
}
