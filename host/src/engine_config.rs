// The one wasmtime configuration shared by the precompiler (build.rs, via
// `include!`) and the runtime (src/component.rs). A precompiled `.cwasm` only
// loads into an engine whose effective configuration matches the one it was
// compiled with, and some defaults depend on which wasmtime cargo features the
// build happened to unify, so every setting that could differ is pinned here.
//
// This file is plain Rust without `use` items so it can be `include!`d.

/// Engine configuration for the engine component.
pub fn engine_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    // Pinned because their defaults follow wasmtime's cargo features.
    config.gc_support(false);
    config.concurrency_support(false);
    // No fuel or epochs: the engine is our own code, and both change the
    // generated machine code (and the call cost).
    config.consume_fuel(false);
    config.epoch_interruption(false);
    // Copy the data segments (~20 KB) into the fresh linear memory instead of
    // mapping a copy-on-write image: building that image (a memfd written at
    // every start) costs a one-shot CNI process more than the copy it avoids.
    config.memory_init_cow(false);
    // No system unwind tables for the engine's code: registering them with the
    // unwinder is a per-process start-up cost, and nothing ever unwinds through
    // the engine's frames (it imports no host functions, so no host panic can
    // cross it; traps and backtraces use wasmtime's own frame walking).
    config.native_unwind_info(false);
    config
}
