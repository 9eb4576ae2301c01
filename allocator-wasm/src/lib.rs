//! thereabouts' engine: CNI network config normalization and multi-range address
//! planning, compatible with whereabouts v0.9.4. Pure functions, no I/O: the same
//! code runs natively (tests, benches, the host's comparison path) and as a
//! WebAssembly component with zero imports (see `wit/ipam.wit`; the export layer
//! is the `thereabouts-allocator-component` crate in `component/`).

pub mod attachment;
pub mod cluster;
pub mod cni_args;
pub mod config;
pub mod error;
pub mod gojson;
pub mod guidance;
pub mod ip;
pub mod model;
pub mod naming;
pub mod objects;
pub mod planner;
pub mod policies_config;
pub mod pools;
pub mod range;
pub mod routes;
pub mod slices;
pub mod warnings;
mod wit_convert;

pub use cluster::cluster_pools;
pub use config::{flat_file_paths, normalize};
pub use error::ConfigError;
pub use model::*;
pub use naming::{pool_name, reservation_name};
pub use planner::{candidates, plan, plan_all, preview, release};
pub use pools::usage;
pub use warnings::warnings;
