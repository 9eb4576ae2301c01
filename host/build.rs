//! Builds the engine component and precompiles it, so that one `cargo build`
//! yields a self-contained `thereabouts` binary that never compiles wasm at run time:
//!
//! 1. `cargo build -p thereabouts-allocator-component --target wasm32-unknown-unknown --profile wasm`
//!    in a separate target dir (the outer build holds the main one's lock);
//! 2. wrap the core module into a component with `wit-component` (zero imports);
//! 3. precompile it with the same `engine_config()` the runtime uses, for a
//!    baseline x86_64/aarch64 CPU so the artifact loads on any node.
//!
//! Outputs in OUT_DIR: `thereabouts_allocator.wasm` (the component, also used by
//! the playground via `thereabouts engine-component`) and `thereabouts_allocator.cwasm`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

include!("src/engine_config.rs");
include!("src/policy_engine_config.rs");
include!("src/compat_hash.rs");

fn main() -> Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir.parent().context("host/ has a parent")?.to_path_buf();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    for watched in [
        "Cargo.toml",
        "allocator-wasm/src",
        "allocator-wasm/Cargo.toml",
        "allocator-wasm/component",
        "wit",
        "host/src/engine_config.rs",
        "host/src/policy_engine_config.rs",
        "host/src/compat_hash.rs",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(watched).display());
    }

    let core = build_core_module(&workspace)?;
    let core_bytes = std::fs::read(&core).with_context(|| format!("reading {}", core.display()))?;
    let component = wit_component::ComponentEncoder::default()
        .module(&core_bytes)
        .context("reading the core module's component-type section")?
        .validate(true)
        .encode()
        .context("encoding the engine component")?;
    std::fs::write(out_dir.join("thereabouts_allocator.wasm"), &component)?;

    let mut config = engine_config();
    let target = std::env::var("TARGET")?;
    config.target(&target).map_err(anyhow::Error::from).with_context(|| format!("setting precompile target {target}"))?;
    let engine = wasmtime::Engine::new(&config)?;
    let cwasm = engine.precompile_component(&component).map_err(anyhow::Error::from).context("precompiling the engine component")?;
    std::fs::write(out_dir.join("thereabouts_allocator.cwasm"), cwasm)?;

    // The compatibility keys of policy artifacts (compat_hash.rs): the plugin
    // has no Cranelift and cannot compute them, so it learns them here, from
    // the same configs and target the policy compiler uses. No newline.
    for (file, mut config) in [("policy_compat.txt", policy_engine_config()), ("policy_fuel_compat.txt", policy_fuel_engine_config())] {
        config.target(&target).map_err(anyhow::Error::from).with_context(|| format!("setting policy target {target}"))?;
        let engine = wasmtime::Engine::new(&config).map_err(anyhow::Error::from).context("creating the policy engine")?;
        std::fs::write(out_dir.join(file), compat_key(&engine))?;
    }
    Ok(())
}

fn build_core_module(workspace: &Path) -> Result<PathBuf> {
    let target_dir = workspace.join("target").join("wasm-guest");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace)
        .args(["build", "-p", "thereabouts-allocator-component", "--lib", "--target", "wasm32-unknown-unknown", "--profile", "wasm"])
        .arg("--target-dir")
        .arg(&target_dir)
        // The outer build's flags are for the host target, not for wasm.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .status()
        .context("running cargo for the wasm32-unknown-unknown engine build (is the target installed? `rustup target add wasm32-unknown-unknown`)")?;
    if !status.success() {
        bail!("building the engine for wasm32-unknown-unknown failed ({status}); run `rustup target add wasm32-unknown-unknown` if the target is missing");
    }
    Ok(target_dir.join("wasm32-unknown-unknown").join("wasm").join("thereabouts_allocator_component.wasm"))
}
