//! What the compiler binary and the interruption benchmark
//! (benches/interruption.rs) share: the policy engines' configurations and
//! the host bindings of the `policy-extension` world.

include!("../../src/policy_engine_config.rs");

/// Host bindings of the `policy-extension` world (wit/ipam.wit).
pub mod bindings {
    wasmtime::component::bindgen!({ world: "policy-extension", path: "../../wit" });
}
