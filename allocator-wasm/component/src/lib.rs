//! The component's export layer: wit-bindgen glue that converts between the WIT
//! records (`wit/ipam.wit`) and the engine's model. Compiled only for wasm (the
//! generated export names do not link on native targets); all logic lives in
//! `thereabouts-allocator` and is tested natively.
#![cfg(target_family = "wasm")]

wit_bindgen::generate!({ world: "allocator", path: "../../wit" });

use exports::thereabouts::ipam::engine::Guest;
use exports::thereabouts::ipam::types as wit;

use thereabouts_allocator::{error, ip, model, naming, planner};

struct Component;

fn to_offset(value: u128) -> wit::Offset {
    wit::Offset { high: (value >> 64) as u64, low: value as u64 }
}
fn from_offset(offset: wit::Offset) -> u128 {
    (u128::from(offset.high) << 64) | u128::from(offset.low)
}

impl From<error::ConfigError> for wit::ConfigError {
    fn from(e: error::ConfigError) -> Self {
        wit::ConfigError { code: e.code, field: e.field, message: e.message }
    }
}

fn family_from_number(n: u8) -> ip::Family {
    if n == 6 { ip::Family::V6 } else { ip::Family::V4 }
}

fn range_to_wit(r: model::NormalizedRange) -> wit::NormalizedRange {
    wit::NormalizedRange {
        cidr: r.cidr,
        prefix_len: r.prefix_len,
        family: r.family.number(),
        first: r.first,
        last: r.last,
        first_offset: to_offset(r.first_offset),
        last_offset: to_offset(r.last_offset),
        excludes: r.excludes,
        exclude_cidrs: r.exclude_cidrs,
        usable: r.usable.to_string(),
        gateway: r.gateway,
        pool_name: r.pool_name,
        requested: r.requested,
    }
}

fn range_from_wit(r: wit::NormalizedRange) -> Result<model::NormalizedRange, error::ConfigError> {
    let (first_offset, last_offset) = (from_offset(r.first_offset), from_offset(r.last_offset));
    let (network, excluded) = thereabouts_allocator::range::derived_parts(&r.cidr, first_offset, last_offset, &r.exclude_cidrs)?;
    Ok(model::NormalizedRange {
        usable: r.usable.parse().unwrap_or_default(),
        family: family_from_number(r.family),
        cidr: r.cidr,
        prefix_len: r.prefix_len,
        network,
        first: r.first,
        last: r.last,
        first_offset,
        last_offset,
        excludes: r.excludes,
        exclude_cidrs: r.exclude_cidrs,
        excluded,
        gateway: r.gateway,
        pool_name: r.pool_name,
        requested: r.requested,
    })
}

fn config_to_wit(c: model::NormalizedConfig) -> wit::NormalizedConfig {
    let d = c.datastore;
    wit::NormalizedConfig {
        name: c.name,
        cni_version: c.cni_version,
        network_name: c.network_name,
        enable_overlapping_ranges: c.enable_overlapping_ranges,
        ranges: c.ranges.into_iter().map(range_to_wit).collect(),
        addresses: c
            .addresses
            .into_iter()
            .map(|a| wit::StaticAddress { address: a.address, gateway: a.gateway, family: a.family.number() })
            .collect(),
        routes_json: c.routes_json,
        dns_json: c.dns_json,
        pod_ref: c.pod_ref,
        datastore: wit::DatastoreSettings {
            kind: d.kind,
            data_dir: d.data_dir,
            kubeconfig: d.kubeconfig,
            etcd_hosts: d.etcd_hosts,
            etcd_username: d.etcd_username,
            etcd_password: d.etcd_password,
            etcd_key_file: d.etcd_key_file,
            etcd_cert_file: d.etcd_cert_file,
            etcd_ca_cert_file: d.etcd_ca_cert_file,
            etcd_prefix: d.etcd_prefix,
        },
        log_file: c.log_file,
        log_level: c.log_level,
        configuration_path: c.configuration_path,
    }
}

/// Only the parts planning reads are rebuilt; the rest is carried over as is.
fn config_from_wit(c: wit::NormalizedConfig) -> Result<model::NormalizedConfig, error::ConfigError> {
    let d = c.datastore;
    Ok(model::NormalizedConfig {
        ranges: c.ranges.into_iter().map(range_from_wit).collect::<Result<_, _>>()?,
        addresses: c
            .addresses
            .into_iter()
            .map(|a| model::StaticAddress { address: a.address, gateway: a.gateway, family: family_from_number(a.family) })
            .collect(),
        name: c.name,
        cni_version: c.cni_version,
        network_name: c.network_name,
        enable_overlapping_ranges: c.enable_overlapping_ranges,
        routes_json: c.routes_json,
        dns_json: c.dns_json,
        pod_ref: c.pod_ref,
        datastore: model::DatastoreSettings {
            kind: d.kind,
            data_dir: d.data_dir,
            kubeconfig: d.kubeconfig,
            etcd_hosts: d.etcd_hosts,
            etcd_username: d.etcd_username,
            etcd_password: d.etcd_password,
            etcd_key_file: d.etcd_key_file,
            etcd_cert_file: d.etcd_cert_file,
            etcd_ca_cert_file: d.etcd_ca_cert_file,
            etcd_prefix: d.etcd_prefix,
        },
        log_file: c.log_file,
        log_level: c.log_level,
        configuration_path: c.configuration_path,
    })
}

fn allocation_from_wit(a: wit::Allocation) -> model::Allocation {
    model::Allocation { offset: from_offset(a.offset), container_id: a.container_id, pod_ref: a.pod_ref, ifname: a.ifname }
}

fn pool_from_wit(p: wit::PoolSnapshot) -> model::PoolSnapshot {
    model::PoolSnapshot {
        taken: p.taken,
        taken_wide: p.taken_wide.into_iter().map(from_offset).collect(),
        reserved: p.reserved.into_iter().map(from_offset).collect(),
        held: p.held.into_iter().map(allocation_from_wit).collect(),
    }
}

fn request_from_wit(r: wit::Request) -> model::Request {
    model::Request { container_id: r.container_id, pod_ref: r.pod_ref, ifname: r.ifname, requested_ip: r.requested_ip }
}

fn assignment_to_wit(a: model::Assignment) -> wit::Assignment {
    wit::Assignment { ip: a.ip, address: a.address, offset: to_offset(a.offset), gateway: a.gateway }
}

fn outcome_to_wit(o: model::PlanOutcome) -> wit::PlanOutcome {
    match o {
        model::PlanOutcome::Reuse { assignment, held_index } => {
            wit::PlanOutcome::Reuse(wit::Reused { assignment: assignment_to_wit(assignment), held_index })
        }
        model::PlanOutcome::Fresh { assignment } => wit::PlanOutcome::Fresh(assignment_to_wit(assignment)),
        model::PlanOutcome::Exhausted { message } => wit::PlanOutcome::Exhausted(message),
        model::PlanOutcome::Rejected { message } => wit::PlanOutcome::Rejected(message),
    }
}

impl Guest for Component {
    fn flat_file_paths(network_config: String) -> Result<Vec<String>, wit::ConfigError> {
        thereabouts_allocator::flat_file_paths(&network_config).map_err(Into::into)
    }

    fn normalize(network_config: String, flat_file: Option<String>, cni_args: String) -> Result<wit::NormalizedConfig, wit::ConfigError> {
        thereabouts_allocator::normalize(&network_config, flat_file.as_deref(), &cni_args).map(config_to_wit).map_err(Into::into)
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
        naming::pool_name(&cidr, &network_name).map_err(Into::into)
    }

    fn reservation_name(ip: String, network_name: String) -> Result<String, wit::ConfigError> {
        naming::reservation_name(&ip, &network_name).map_err(Into::into)
    }

    fn address_at(range: wit::NormalizedRange, offset: wit::Offset) -> Result<String, wit::ConfigError> {
        let range = range_from_wit(range)?;
        let offset = from_offset(offset);
        planner::address_at(&range, offset)
            .map(ip::format_ip)
            .ok_or_else(|| error::ConfigError::invalid("offset", format!("offset {offset} is outside {}", range.cidr)).into())
    }

    fn offset_of(range: wit::NormalizedRange, ip_text: String) -> Result<wit::Offset, wit::ConfigError> {
        let range = range_from_wit(range)?;
        let ip = ip::parse_ip_sloppy(&ip_text).ok_or_else(|| error::ConfigError::invalid("ip", format!("invalid IP address {ip_text:?}")))?;
        planner::offset_of(&range, ip)
            .map(to_offset)
            .ok_or_else(|| error::ConfigError::invalid("ip", format!("{ip_text} is outside {}", range.cidr)).into())
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
