//! Operators' policy extensions: WebAssembly components of the
//! `policy-extension` world (`wit/ipam.wit`) that choose which ranges an
//! attachment gets and which addresses, run sandboxed and bounded.
//!
//! - [`artifact`]: the root-owned cache of precompiled policies, and why an
//!   artifact may be loaded (the plugin never compiles);
//! - [`records`]: what the cache remembers so an ADD need not redo it;
//! - [`sandbox`]: the policy engine, a loaded policy, one bounded call;
//! - [`watchdog`]: the wall-clock deadline of a call;
//! - [`decide`]: the config's policies for one ADD, `on_error` and `mode` applied;
//! - [`hooks`]: the three hooks with the host's types, answers size-checked;
//! - [`preview`]: `thereabouts preview` with policies, pod after pod;
//! - [`tools`]: `thereabouts policy compile|check|run|bench`;
//! - [`failure`]: what can go wrong, as values.

pub mod artifact;
mod bindings;
pub mod decide;
pub mod failure;
pub mod hooks;
pub mod preview;
mod records;
pub mod sandbox;
pub mod tools;
pub mod watchdog;
