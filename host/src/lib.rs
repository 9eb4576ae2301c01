//! The `thereabouts` host: everything that does I/O around the engine component.
//!
//! - [`cni`]: the CNI plugin protocol (environment, stdin, results, errors);
//! - [`network_config`]: flat-file discovery and normalization through the engine;
//! - [`ipam`]: the read → plan → compare-and-swap cycle shared by all commands;
//! - [`datastore`]: where allocations live (one trait; the file store today);
//! - [`policy`]: operators' sandboxed policy extensions (WebAssembly components);
//! - [`profile_provider`]: DRANET's profile-provider webhook (addresses for DRA devices);
//! - [`cli`]: `preview`, `pools` and `engine-component` beside CNI mode;
//! - [`failpoint`]: named points where the fault trials kill the plugin;
//! - [`logging`]: whereabouts-style log lines, never on stdout;
//! - [`json`]: the one JSON printer (a leaf: CNI documents, CLI reports, pool files).

pub mod causes;
pub mod cli;
pub mod cni;
pub mod component;
pub mod controller;
pub mod datastore;
pub mod failpoint;
pub mod http_reply;
pub mod ipam;
pub mod json;
pub mod logging;
pub mod network_config;
pub mod node_name;
pub mod placement;
pub mod policy;
pub mod profile_provider;
