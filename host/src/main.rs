//! `thereabouts`: placeholder entry point until the CNI host lands (issue 3).

use anyhow::{Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        // Writes the engine component (the exact bytes embedded in this binary) so the
        // playground can transpile the same engine the plugin runs.
        Some("engine-component") => {
            let out = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).context("usage: thereabouts engine-component --out FILE")?;
            std::fs::write(out, thereabouts::component::COMPONENT_WASM).with_context(|| format!("writing {out}"))?;
            Ok(())
        }
        _ => {
            let mut engine = thereabouts::component::EngineComponent::load()?;
            let config = std::io::read_to_string(std::io::stdin())?;
            let normalized = engine.normalize(&config, None, "")?;
            println!("{normalized:?}");
            Ok(())
        }
    }
}
