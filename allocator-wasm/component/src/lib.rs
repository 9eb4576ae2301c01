//! The component's export layer: wit-bindgen glue that converts between the WIT
//! records (`wit/ipam.wit`) and the engine's model. Compiled only for wasm (the
//! generated export names do not link on native targets); all logic lives in
//! `thereabouts-allocator` and is tested natively.
#![cfg(target_family = "wasm")]

wit_bindgen::generate!({ world: "allocator", path: "../../wit" });

use exports::thereabouts::ipam::engine::Guest;
use exports::thereabouts::ipam::types as wit;

use thereabouts_allocator::{error, ip, naming, planner};

struct Component;

thereabouts_allocator::wit_conversions!(crate::exports::thereabouts::ipam::types);
use wit_convert::*;

impl Guest for Component {
    fn flat_file_paths(network_config: String) -> Result<Vec<String>, wit::ConfigError> {
        thereabouts_allocator::flat_file_paths(&network_config).map_err(error_to_wit)
    }

    fn normalize(network_config: String, flat_file: Option<String>, cni_args: String) -> Result<wit::NormalizedConfig, wit::ConfigError> {
        thereabouts_allocator::normalize(&network_config, flat_file.as_deref(), &cni_args).map(|c| config_to_wit(&c)).map_err(error_to_wit)
    }

    fn plan(range: wit::NormalizedRange, pool: wit::PoolSnapshot, req: wit::Request) -> wit::PlanOutcome {
        match range_from_wit(range) {
            Ok(range) => outcome_to_wit(planner::plan(&range, &pool_from_wit(pool), &request_from_wit(req))),
            Err(e) => wit::PlanOutcome::Rejected(e.message),
        }
    }

    fn plan_all(config: wit::NormalizedConfig, pools: Vec<wit::PoolSnapshot>, req: wit::Request) -> Result<Vec<wit::PlanOutcome>, wit::PlanOutcome> {
        let config = config_from_wit(config).map_err(|e| wit::PlanOutcome::Rejected(e.message))?;
        let pools: Vec<_> = pools.into_iter().map(pool_from_wit).collect();
        planner::plan_all(&config, &pools, &request_from_wit(req))
            .map(|outcomes| outcomes.into_iter().map(outcome_to_wit).collect())
            .map_err(outcome_to_wit)
    }

    fn release(allocations: Vec<wit::Allocation>, container_id: String, ifname: String) -> Vec<u32> {
        let allocations: Vec<_> = allocations.into_iter().map(allocation_from_wit).collect();
        planner::release(&allocations, &container_id, &ifname)
    }

    fn pool_name(cidr: String, network_name: String) -> Result<String, wit::ConfigError> {
        naming::pool_name(&cidr, &network_name).map_err(error_to_wit)
    }

    fn reservation_name(ip: String, network_name: String) -> Result<String, wit::ConfigError> {
        naming::reservation_name(&ip, &network_name).map_err(error_to_wit)
    }

    fn address_at(range: wit::NormalizedRange, offset: wit::Offset) -> Result<String, wit::ConfigError> {
        let range = range_from_wit(range).map_err(error_to_wit)?;
        let offset = from_offset(offset);
        planner::address_at(&range, offset)
            .map(ip::format_ip)
            .ok_or_else(|| error_to_wit(error::ConfigError::invalid("offset", format!("offset {offset} is outside {}", range.cidr))))
    }

    fn offset_of(range: wit::NormalizedRange, ip_text: String) -> Result<wit::Offset, wit::ConfigError> {
        let range = range_from_wit(range).map_err(error_to_wit)?;
        let ip = ip::parse_ip_sloppy(&ip_text).ok_or_else(|| error_to_wit(error::ConfigError::invalid("ip", format!("invalid IP address {ip_text:?}"))))?;
        planner::offset_of(&range, ip)
            .map(to_offset)
            .ok_or_else(|| error_to_wit(error::ConfigError::invalid("ip", format!("{ip_text} is outside {}", range.cidr))))
    }

    fn preview_table(config: wit::NormalizedConfig, pools: Vec<wit::PoolSnapshot>, pods: u32) -> wit::PodTable {
        let failed = |message: String| wit::PodTable {
            served: 0,
            addresses: String::new(),
            offsets_high: Vec::new(),
            offsets_low: Vec::new(),
            failure: Some(wit::PreviewFailure { range_index: 0, exhausted: message.clone(), rejected: message }),
        };
        let config = match config_from_wit(config) {
            Ok(config) => config,
            Err(e) => return failed(e.message),
        };
        let pools: Vec<_> = pools.into_iter().map(pool_from_wit).collect();
        let table = planner::preview_table(&config, &pools, pods);
        wit::PodTable {
            served: table.served,
            addresses: table.addresses,
            offsets_high: table.offsets.iter().map(|&o| (o >> 64) as u64).collect(),
            offsets_low: table.offsets.iter().map(|&o| o as u64).collect(),
            failure: table.failure.map(|f| wit::PreviewFailure { range_index: f.range_index, exhausted: f.exhausted, rejected: f.rejected }),
        }
    }

    fn preview(config: wit::NormalizedConfig, pools: Vec<wit::PoolSnapshot>, pods: u32) -> Vec<Vec<wit::PlanOutcome>> {
        let config = match config_from_wit(config) {
            Ok(config) => config,
            Err(e) => return vec![vec![wit::PlanOutcome::Rejected(e.message)]],
        };
        let pools: Vec<_> = pools.into_iter().map(pool_from_wit).collect();
        planner::preview(&config, &pools, pods).into_iter().map(|pod| pod.into_iter().map(outcome_to_wit).collect()).collect()
    }
}

export!(Component);
