//! Host bindings of the `policy-extension` world, generated from `wit/`.
wasmtime::component::bindgen!({ world: "policy-extension", path: "../wit" });
