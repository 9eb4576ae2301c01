//! thereabouts-policy-compiler: checks an operator's policy component and
//! precompiles it into the plugin's cache. The plugin runs only what this
//! wrote (it carries no compiler, and deserialising runs bytes as machine
//! code), named `<sha256 of the .wasm file>-<compat>.cwasm`: the digest ties
//! the artifact to exactly the file a config names, `<compat>` to the
//! wasmtime version and engine settings (compat_hash.rs).
//!
//! - `componentize <core.wasm> -o <component.wasm>`: wraps a wit-bindgen
//!   core module into a component, as host/build.rs does for the engine;
//! - `compile <policy.wasm> [--cache DIR] [--fuel]`: checks and precompiles,
//!   prints the artifact's path;
//! - `compat-key [--fuel]`: prints the key this compiler names artifacts with
//!   (equal to the plugin's when both were built for the same target).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder};

use thereabouts_policy_compiler::bindings::PolicyExtensionPre;
use thereabouts_policy_compiler::bindings::exports::thereabouts::ipam::policy::{AttachmentInput, Needs, Pick};
use thereabouts_policy_compiler::{policy_engine_config, policy_fuel_engine_config};

include!("../../src/compat_hash.rs");

/// The plugin's cache (host/src/policy/artifact.rs has the same default and
/// the same environment override).
const DEFAULT_CACHE: &str = "/var/lib/thereabouts/policies";
/// The plugin refuses larger policy files; refuse them here first.
const MAX_POLICY_BYTES: u64 = 16 << 20;
/// The triple this binary was built for (build.rs): artifacts are compiled
/// for it, with a baseline CPU, like the plugin's own engine artifact.
const BUILD_TARGET: &str = env!("THEREABOUTS_BUILD_TARGET");
const POLICY_INTERFACE: &str = "thereabouts:ipam/policy@0.1.0";

#[derive(Parser)]
#[command(name = "thereabouts-policy-compiler", version, about = "Checks and precompiles thereabouts policy components")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Wrap a wit-bindgen core module (it carries its component type) into a component.
    Componentize {
        core: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Check a policy component (or wit-bindgen core module) and precompile it into the cache.
    Compile {
        policy: PathBuf,
        /// Must be owned by root and writable by no one else; created (0755) if absent.
        #[arg(long, env = "THEREABOUTS_POLICY_CACHE", default_value = DEFAULT_CACHE)]
        cache: PathBuf,
        /// Fuel metering instead of epochs (benchmarks only: the plugin loads epoch artifacts).
        #[arg(long)]
        fuel: bool,
        /// The plugin's target triple, when it differs from this compiler's (e.g. a musl plugin).
        #[arg(long, default_value = BUILD_TARGET)]
        target: String,
    },
    /// Print the compatibility key artifacts are named with.
    CompatKey {
        #[arg(long)]
        fuel: bool,
        #[arg(long, default_value = BUILD_TARGET)]
        target: String,
    },
}

fn main() {
    let result = match Cli::parse().command {
        Command::Componentize { core, output } => componentize_file(&core, &output),
        Command::Compile { policy, cache, fuel, target } => compile(&policy, &cache, fuel, &target).map(|artifact| println!("{}", artifact.display())),
        Command::CompatKey { fuel, target } => engine(fuel, &target).map(|engine| println!("{}", compat_key(&engine))),
    };
    if let Err(e) = result {
        eprintln!("thereabouts-policy-compiler: {e:#}");
        std::process::exit(1);
    }
}

fn componentize_file(core: &Path, output: &Path) -> Result<()> {
    let bytes = std::fs::read(core).with_context(|| format!("reading {}", core.display()))?;
    if wasm_kind(&bytes) != Some(Kind::Core) {
        bail!("{} is not a core WebAssembly module", core.display());
    }
    if !has_component_type(&bytes) {
        bail!("{} has no component type: build it with wit-bindgen's `generate!`", core.display());
    }
    let component = componentize(&bytes).with_context(|| format!("wrapping {}", core.display()))?;
    std::fs::write(output, component).with_context(|| format!("writing {}", output.display()))
}

/// A wit-bindgen core module's component: its `component-type` custom
/// section says what it exports, and wit-component wraps it (validated).
fn componentize(core: &[u8]) -> Result<Vec<u8>> {
    wit_component::ComponentEncoder::default()
        .module(core)
        .context("reading the core module's component-type section (was it built with wit-bindgen?)")?
        .validate(true)
        .encode()
        .context("encoding the component")
}

#[derive(PartialEq)]
enum Kind {
    Core,
    Component,
}

/// From the preamble: `\0asm`, then version 1 layer 0 (core) or the
/// component model's version 0x0d layer 1.
fn wasm_kind(bytes: &[u8]) -> Option<Kind> {
    match bytes.get(..8)? {
        [0, b'a', b's', b'm', 1, 0, 0, 0] => Some(Kind::Core),
        [0, b'a', b's', b'm', _, _, 1, 0] => Some(Kind::Component),
        _ => None,
    }
}

/// wit-bindgen's custom section (`component-type`, with a suffix per
/// crate); without one, wit-component would wrap the module into a
/// component that exports nothing. Unreadable modules say so when wrapped.
fn has_component_type(core: &[u8]) -> bool {
    wasmparser::Parser::new(0).parse_all(core).any(|payload| match payload {
        Ok(wasmparser::Payload::CustomSection(section)) => section.name().starts_with("component-type"),
        Err(_) => true,
        _ => false,
    })
}

fn engine(fuel: bool, target: &str) -> Result<Engine> {
    let mut config = if fuel { policy_fuel_engine_config() } else { policy_engine_config() };
    config.target(target).map_err(anyhow::Error::from).with_context(|| format!("setting the target {target}"))?;
    Engine::new(&config).map_err(anyhow::Error::from).context("creating the policy engine")
}

fn compile(policy: &Path, cache: &Path, fuel: bool, target: &str) -> Result<PathBuf> {
    let size = std::fs::metadata(policy).with_context(|| format!("reading {}", policy.display()))?.len();
    if size > MAX_POLICY_BYTES {
        bail!("{} has {size} bytes; the plugin takes policies up to {MAX_POLICY_BYTES}", policy.display());
    }
    let bytes = std::fs::read(policy).with_context(|| format!("reading {}", policy.display()))?;
    let digest: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    let component = match wasm_kind(&bytes) {
        Some(Kind::Component) => bytes,
        Some(Kind::Core) if !has_component_type(&bytes) => {
            bail!("{} is a core module without a component type: build it with wit-bindgen's `generate!` for the policy-extension world", policy.display())
        }
        Some(Kind::Core) => componentize(&bytes).with_context(|| format!("{} is a core module", policy.display()))?,
        None => bail!("{} is not a WebAssembly component or module", policy.display()),
    };
    // The cache first: no point compiling for a cache the plugin would not trust.
    prepare_cache(cache)?;
    let engine = engine(fuel, target)?;
    let cwasm = engine.precompile_component(&component).map_err(anyhow::Error::from).with_context(|| format!("compiling {}", policy.display()))?;
    check_world(&engine, &cwasm, fuel).with_context(|| format!("{} is not a thereabouts policy", policy.display()))?;
    let artifact = cache.join(format!("{digest}-{}.cwasm", compat_key(&engine)));
    write_atomically(&artifact, &cwasm)?;
    Ok(artifact)
}

/// The component imports nothing and exports the `policy` interface with
/// the world's function types (wit/ipam.wit), so the plugin can run it.
fn check_world(engine: &Engine, cwasm: &[u8], fuel: bool) -> Result<()> {
    // SAFETY: `cwasm` is what this engine produced a moment ago.
    let component = unsafe { Component::deserialize(engine, cwasm) }.map_err(anyhow::Error::from).context("loading the compiled component")?;
    let imports: Vec<String> = component.component_type().imports(engine).map(|(name, _)| name.to_string()).collect();
    if !imports.is_empty() {
        bail!("it imports {}; a policy must import nothing", imports.join(", "));
    }
    // Names: the policy interface first (what a wrong component lacks), then
    // bindgen's indices say which other export or function is missing.
    if component.get_export_index(None, POLICY_INTERFACE).is_none() {
        bail!("no exported instance named `{POLICY_INTERFACE}`");
    }
    let linker: Linker<StoreLimits> = Linker::new(engine);
    let pre = linker.instantiate_pre(&component).map_err(anyhow::Error::from)?;
    PolicyExtensionPre::new(pre.clone()).map_err(anyhow::Error::from)?;
    // Types are only checked against an instance: make one, bounded like the
    // plugin's (a component can run code when instantiated).
    let mut store = Store::new(engine, StoreLimitsBuilder::new().memory_size(64 << 20).trap_on_grow_failure(true).build());
    store.limiter(|limits| limits);
    if fuel {
        store.set_fuel(1 << 30).map_err(anyhow::Error::from)?;
    } else {
        store.set_epoch_deadline(1);
        let weak = engine.weak();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            if let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
            }
        });
    }
    let instance = pre.instantiate(&mut store).map_err(anyhow::Error::from).context("instantiating it")?;
    let iface = instance.get_export_index(&mut store, None, POLICY_INTERFACE).context("no policy interface")?;
    let index = |store: &mut Store<StoreLimits>, name: &str| instance.get_export_index(store, Some(&iface), name).with_context(|| format!("no `{name}`"));
    let mismatch = |name: &str| format!("export `{name}` of {POLICY_INTERFACE} does not have the type wit/ipam.wit gives it");
    let f = index(&mut store, "validate-settings")?;
    instance.get_typed_func::<(&str,), (Result<Needs, String>,)>(&mut store, &f).map_err(anyhow::Error::from).with_context(|| mismatch("validate-settings"))?;
    let f = index(&mut store, "select-ranges")?;
    instance
        .get_typed_func::<(&AttachmentInput,), (Result<Vec<u32>, String>,)>(&mut store, &f)
        .map_err(anyhow::Error::from)
        .with_context(|| mismatch("select-ranges"))?;
    let f = index(&mut store, "pick-address")?;
    instance
        .get_typed_func::<(&AttachmentInput, u32, &[String]), (Pick,)>(&mut store, &f)
        .map_err(anyhow::Error::from)
        .with_context(|| mismatch("pick-address"))?;
    Ok(())
}

/// Creates the cache (0755) if absent and checks the plugin would trust it:
/// it and every directory above it owned by root and writable by no one
/// else (sticky directories above it, like /tmp, aside), as
/// host/src/policy/artifact.rs checks before loading.
fn prepare_cache(cache: &Path) -> Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(cache).with_context(|| format!("creating the cache {}", cache.display()))?;
    let cache = std::fs::canonicalize(cache).with_context(|| format!("resolving {}", cache.display()))?;
    let mut dir = Some(cache.as_path());
    while let Some(d) = dir {
        let meta = std::fs::metadata(d).with_context(|| format!("reading {}", d.display()))?;
        let sticky = meta.mode() & 0o1000 != 0;
        let untrusted = if meta.uid() != 0 {
            Some(format!("owned by uid {}, not root", meta.uid()))
        } else if meta.mode() & 0o022 != 0 && !(sticky && d != cache) {
            Some(format!("mode {:o} lets group or others write it", meta.mode() & 0o7777))
        } else {
            None
        };
        if let Some(why) = untrusted {
            let what = if d == cache { "the cache".to_string() } else { format!("{}, above the cache", d.display()) };
            bail!("refusing the cache {}: {what} is {why}, and the plugin trusts only artifacts only root can write", cache.display());
        }
        dir = d.parent();
    }
    Ok(())
}

/// Temp file in the same directory, 0644, synced, renamed over the target:
/// a plugin reading concurrently sees the old artifact or the whole new one.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().context("artifact path has a file name")?.to_string_lossy();
    let temp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let written = (|| -> Result<()> {
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&temp)?;
        file.write_all(bytes)?;
        // The umask may have taken bits away; 0644 is what the plugin expects.
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(e.context(format!("writing {}", path.display())));
    }
    // Make the rename itself durable.
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("syncing {}", dir.display()))?;
    }
    Ok(())
}
