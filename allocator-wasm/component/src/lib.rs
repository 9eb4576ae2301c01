//! The component's export layer: wit-bindgen glue that converts between the WIT
//! records (`wit/ipam.wit`) and the engine's model. Compiled only for wasm (the
//! generated export names do not link on native targets); all logic lives in
//! `thereabouts-allocator` and is tested natively.
#![cfg(target_family = "wasm")]

wit_bindgen::generate!({ world: "allocator", path: "../../wit" });

use exports::thereabouts::ipam::engine::Guest;
use exports::thereabouts::ipam::types as wit;

use thereabouts_allocator::{planner, pools, warnings};

struct Component;

thereabouts_allocator::wit_conversions!(crate::exports::thereabouts::ipam::types);
use wit_convert::*;

fn pools_from_wit(pools: Vec<wit::PoolState>) -> Vec<thereabouts_allocator::PoolState> {
    pools.into_iter().map(pool_from_wit).collect()
}

impl Guest for Component {
    fn flat_file_paths(network_config: String) -> Result<Vec<String>, wit::ConfigError> {
        thereabouts_allocator::flat_file_paths(&network_config).map_err(error_to_wit)
    }

    fn normalize(network_config: String, flat_file: Option<String>, cni_args: String) -> Result<wit::NormalizedConfig, wit::ConfigError> {
        thereabouts_allocator::normalize(&network_config, flat_file.as_deref(), &cni_args).map(|c| config_to_wit(&c)).map_err(error_to_wit)
    }

    // `config` comes back from the host: one the engine did not produce can fail
    // to convert (its ranges do not validate), answered in each function's own
    // failure shape.

    fn warnings(config: wit::NormalizedConfig) -> Result<Vec<wit::ConfigWarning>, wit::ConfigError> {
        let config = config_from_wit(config).map_err(error_to_wit)?;
        Ok(warnings::warnings(&config).into_iter().map(warning_to_wit).collect())
    }

    fn plan_all(
        config: wit::NormalizedConfig,
        pools: Vec<wit::PoolState>,
        reservations: wit::Reservations,
        req: wit::Request,
    ) -> Result<Vec<wit::PlanOutcome>, wit::PlanFailure> {
        let config = config_from_wit(config).map_err(|e| wit::PlanFailure::Rejected(e.message))?;
        planner::plan_all(&config, &pools_from_wit(pools), reservations_from_wit(reservations), &request_from_wit(req))
            .map(|outcomes| outcomes.into_iter().map(outcome_to_wit).collect())
            .map_err(failure_to_wit)
    }

    fn candidates(
        config: wit::NormalizedConfig,
        pools: Vec<wit::PoolState>,
        reservations: wit::Reservations,
        req: wit::Request,
        ranges: Vec<u32>,
        limit: u32,
    ) -> Result<Vec<wit::RangeCandidates>, wit::ConfigError> {
        let config = config_from_wit(config).map_err(error_to_wit)?;
        planner::candidates(&config, &pools_from_wit(pools), reservations_from_wit(reservations), &request_from_wit(req), &ranges, limit)
            .map(|listed| listed.into_iter().map(candidates_to_wit).collect())
            .map_err(error_to_wit)
    }

    fn release(
        range: wit::NormalizedRange,
        network_name: String,
        allocations: Vec<wit::Allocation>,
        attachments: Vec<wit::Attachment>,
    ) -> Result<Vec<wit::Released>, wit::ConfigError> {
        let range = range_from_wit(range).map_err(error_to_wit)?;
        let allocations: Vec<_> = allocations.into_iter().map(allocation_from_wit).collect();
        let attachments: Vec<_> = attachments.into_iter().map(attachment_from_wit).collect();
        Ok(planner::release(&range, &network_name, &allocations, &attachments).into_iter().map(released_to_wit).collect())
    }

    fn node_slices(range: wit::NormalizedRange) -> Result<Vec<String>, wit::ConfigError> {
        thereabouts_allocator::slices::layout(&range_from_wit(range).map_err(error_to_wit)?).map_err(error_to_wit)
    }

    fn slice_of_range(range: wit::NormalizedRange, network_name: String, node: String, slice: String) -> Result<wit::NormalizedRange, wit::ConfigError> {
        let range = range_from_wit(range).map_err(error_to_wit)?;
        thereabouts_allocator::slices::in_slice(&range, &network_name, &node, &slice).map(|r| range_to_wit(&r)).map_err(error_to_wit)
    }

    fn usage(config: wit::NormalizedConfig, pools: Vec<wit::PoolState>) -> Result<Vec<wit::RangeUsage>, wit::ConfigError> {
        let config = config_from_wit(config).map_err(error_to_wit)?;
        Ok(pools::usage(&config, &pools_from_wit(pools)).into_iter().map(usage_to_wit).collect())
    }

    fn preview(config: wit::NormalizedConfig, pools: Vec<wit::PoolState>, pods: u32) -> wit::PodTable {
        match config_from_wit(config) {
            Ok(config) => table_to_wit(planner::preview(&config, &pools_from_wit(pools), pods)),
            Err(e) => wit::PodTable {
                served: 0,
                addresses: String::new(),
                offsets_high: Vec::new(),
                offsets_low: Vec::new(),
                failure: Some(wit::PreviewFailure { range_index: 0, exhausted: e.message.clone(), rejected: e.message }),
            },
        }
    }

    fn cluster_pools(config: wit::NormalizedConfig, objects: String) -> Result<wit::ClusterState, wit::ConfigError> {
        let config = config_from_wit(config).map_err(error_to_wit)?;
        thereabouts_allocator::cluster_pools(&config, &objects).map(cluster_to_wit).map_err(error_to_wit)
    }
}

export!(Component);
