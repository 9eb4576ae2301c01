//! Conversions between the engine's model and the WIT records of `wit/ipam.wit`,
//! written once for both sides of the component boundary. The guest (wit-bindgen)
//! and the host (wasmtime's bindgen) generate their own, field-for-field identical
//! record types; `wit_conversions!(path::to::types)` expands these functions
//! against either set, so the mapping cannot drift between the two.
//!
//! `*_to_wit` take references (the host keeps its values); `*_from_wit` take the
//! records by value.

/// Expands the conversion functions in the calling module. `$wit` is the path of
/// the generated `thereabouts:ipam/types` module.
#[macro_export]
macro_rules! wit_conversions {
    ($wit:path) => {
        #[allow(dead_code, reason = "each side uses the directions it needs")]
        mod wit_convert {
            use super::*;
            use $crate::{
                error::{ConfigError, ErrorCode},
                ip::Family,
                model,
            };
            use $wit as wit;

            pub fn to_offset(value: u128) -> wit::Offset {
                wit::Offset { high: (value >> 64) as u64, low: value as u64 }
            }

            pub fn from_offset(offset: wit::Offset) -> u128 {
                (u128::from(offset.high) << 64) | u128::from(offset.low)
            }

            pub fn family_to_wit(family: Family) -> wit::IpFamily {
                match family {
                    Family::V4 => wit::IpFamily::Ipv4,
                    Family::V6 => wit::IpFamily::Ipv6,
                }
            }

            pub fn family_from_wit(family: wit::IpFamily) -> Family {
                match family {
                    wit::IpFamily::Ipv4 => Family::V4,
                    wit::IpFamily::Ipv6 => Family::V6,
                }
            }

            pub fn error_to_wit(e: ConfigError) -> wit::ConfigError {
                // `ConfigError::new` and `::invalid` take an `ErrorCode`, so the number
                // is always one of the four; 7 is the general "invalid network config".
                let code = match ErrorCode::from_number(e.code).unwrap_or(ErrorCode::InvalidConfig) {
                    ErrorCode::IncompatibleVersion => wit::ErrorCode::IncompatibleCniVersion,
                    ErrorCode::InvalidEnv => wit::ErrorCode::InvalidEnvironmentVariables,
                    ErrorCode::Decode => wit::ErrorCode::UndecodableContent,
                    ErrorCode::InvalidConfig => wit::ErrorCode::InvalidNetworkConfig,
                };
                wit::ConfigError { code, field: e.field, message: e.message }
            }

            pub fn error_from_wit(e: wit::ConfigError) -> ConfigError {
                let code = match e.code {
                    wit::ErrorCode::IncompatibleCniVersion => ErrorCode::IncompatibleVersion,
                    wit::ErrorCode::InvalidEnvironmentVariables => ErrorCode::InvalidEnv,
                    wit::ErrorCode::UndecodableContent => ErrorCode::Decode,
                    wit::ErrorCode::InvalidNetworkConfig => ErrorCode::InvalidConfig,
                };
                ConfigError::new(code, e.field, e.message)
            }

            pub fn range_to_wit(r: &model::NormalizedRange) -> wit::NormalizedRange {
                wit::NormalizedRange {
                    cidr: r.cidr.clone(),
                    prefix_len: r.prefix_len,
                    family: family_to_wit(r.family),
                    first: r.first.clone(),
                    last: r.last.clone(),
                    first_offset: to_offset(r.first_offset),
                    last_offset: to_offset(r.last_offset),
                    excludes: r.excludes.clone(),
                    exclude_cidrs: r.exclude_cidrs.clone(),
                    usable: r.usable.to_string(),
                    gateway: r.gateway.clone(),
                    pool_name: r.pool_name.clone(),
                    requested: r.requested.clone(),
                    node_slicing: r.node_slicing.as_ref().map(|s| wit::NodeSlicing {
                        slice_pool: s.slice_pool.clone(),
                        prefix_len: s.prefix_len,
                        max_entries: s.max_entries,
                    }),
                }
            }

            /// Network and merged excludes are not in the record: they are derived
            /// again from the CIDR, the exclude CIDRs and the gateway (and so validated).
            pub fn range_from_wit(r: wit::NormalizedRange) -> Result<model::NormalizedRange, ConfigError> {
                let (first_offset, last_offset) = (from_offset(r.first_offset), from_offset(r.last_offset));
                let (parsed, excluded) = $crate::range::derived_parts(&r.cidr, first_offset, last_offset, &r.exclude_cidrs, r.gateway.as_deref())?;
                let usable = r.usable.parse().map_err(|_| ConfigError::invalid("range.usable", format!("not a count: {:?}", r.usable)))?;
                Ok(model::NormalizedRange {
                    usable,
                    family: family_from_wit(r.family),
                    cidr: r.cidr,
                    prefix_len: r.prefix_len,
                    network_prefix: parsed.prefix,
                    network: parsed.network(),
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
                    node_slicing: r.node_slicing.map(|s| model::NodeSlicing { slice_pool: s.slice_pool, prefix_len: s.prefix_len, max_entries: s.max_entries }),
                })
            }

            pub fn config_to_wit(c: &model::NormalizedConfig) -> wit::NormalizedConfig {
                let d = &c.datastore;
                wit::NormalizedConfig {
                    name: c.name.clone(),
                    cni_version: c.cni_version.clone(),
                    network_name: c.network_name.clone(),
                    enable_overlapping_ranges: c.enable_overlapping_ranges,
                    ranges: c.ranges.iter().map(range_to_wit).collect(),
                    ip_ranges_allocation: ranges_allocation_to_wit(c.ip_ranges_allocation),
                    preferred_ip_annotation: c.preferred_ip_annotation,
                    allow_persistent_ips: c.allow_persistent_ips,
                    ipam_claim_reference: c.ipam_claim_reference.clone(),
                    policies: c.policies.iter().map(policy_to_wit).collect(),
                    addresses: c
                        .addresses
                        .iter()
                        .map(|a| wit::StaticAddress { address: a.address.clone(), gateway: a.gateway.clone(), family: family_to_wit(a.family) })
                        .collect(),
                    routes_json: c.routes_json.clone(),
                    dns_json: c.dns_json.clone(),
                    pod_ref: c.pod_ref.clone(),
                    datastore: wit::DatastoreSettings {
                        kind: d.kind.clone(),
                        data_dir: d.data_dir.clone(),
                        kubeconfig: d.kubeconfig.clone(),
                        etcd_hosts: d.etcd_hosts.clone(),
                        etcd_username: d.etcd_username.clone(),
                        etcd_password: d.etcd_password.clone(),
                        etcd_key_file: d.etcd_key_file.clone(),
                        etcd_cert_file: d.etcd_cert_file.clone(),
                        etcd_ca_cert_file: d.etcd_ca_cert_file.clone(),
                        etcd_prefix: d.etcd_prefix.clone(),
                    },
                    log_file: c.log_file.clone(),
                    log_level: c.log_level.clone(),
                    configuration_path: c.configuration_path.clone(),
                }
            }

            pub fn config_from_wit(c: wit::NormalizedConfig) -> Result<model::NormalizedConfig, ConfigError> {
                let d = c.datastore;
                Ok(model::NormalizedConfig {
                    ranges: c.ranges.into_iter().map(range_from_wit).collect::<Result<_, _>>()?,
                    ip_ranges_allocation: ranges_allocation_from_wit(c.ip_ranges_allocation),
                    preferred_ip_annotation: c.preferred_ip_annotation,
                    allow_persistent_ips: c.allow_persistent_ips,
                    ipam_claim_reference: c.ipam_claim_reference,
                    policies: c.policies.into_iter().map(policy_from_wit).collect(),
                    addresses: c
                        .addresses
                        .into_iter()
                        .map(|a| model::StaticAddress { address: a.address, gateway: a.gateway, family: family_from_wit(a.family) })
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

            pub fn ranges_allocation_to_wit(a: model::RangesAllocation) -> wit::RangesAllocation {
                match a {
                    model::RangesAllocation::All => wit::RangesAllocation::All,
                    model::RangesAllocation::FirstAvailable => wit::RangesAllocation::FirstAvailable,
                }
            }

            pub fn ranges_allocation_from_wit(a: wit::RangesAllocation) -> model::RangesAllocation {
                match a {
                    wit::RangesAllocation::All => model::RangesAllocation::All,
                    wit::RangesAllocation::FirstAvailable => model::RangesAllocation::FirstAvailable,
                }
            }

            pub fn policy_to_wit(p: &model::PolicyConfig) -> wit::PolicyConfig {
                wit::PolicyConfig {
                    name: p.name.clone(),
                    path: p.path.clone(),
                    settings: p.settings.clone(),
                    timeout_ms: p.timeout_ms,
                    memory_mib: p.memory_mib,
                    on_error: match p.on_error {
                        model::PolicyOnError::Deny => wit::PolicyOnError::Deny,
                        model::PolicyOnError::Ignore => wit::PolicyOnError::Ignore,
                    },
                    mode: match p.mode {
                        model::PolicyMode::Enforce => wit::PolicyMode::Enforce,
                        model::PolicyMode::Monitor => wit::PolicyMode::Monitor,
                    },
                }
            }

            pub fn policy_from_wit(p: wit::PolicyConfig) -> model::PolicyConfig {
                model::PolicyConfig {
                    name: p.name,
                    path: p.path,
                    settings: p.settings,
                    timeout_ms: p.timeout_ms,
                    memory_mib: p.memory_mib,
                    on_error: match p.on_error {
                        wit::PolicyOnError::Deny => model::PolicyOnError::Deny,
                        wit::PolicyOnError::Ignore => model::PolicyOnError::Ignore,
                    },
                    mode: match p.mode {
                        wit::PolicyMode::Enforce => model::PolicyMode::Enforce,
                        wit::PolicyMode::Monitor => model::PolicyMode::Monitor,
                    },
                }
            }

            pub fn allocation_to_wit(a: &model::Allocation) -> wit::Allocation {
                wit::Allocation {
                    offset: to_offset(a.offset),
                    container_id: a.container_id.clone(),
                    pod_ref: a.pod_ref.clone(),
                    ifname: a.ifname.clone(),
                    claim: a.claim.as_ref().map(claim_to_wit),
                }
            }

            pub fn allocation_from_wit(a: wit::Allocation) -> model::Allocation {
                model::Allocation {
                    offset: from_offset(a.offset),
                    container_id: a.container_id,
                    pod_ref: a.pod_ref,
                    ifname: a.ifname,
                    claim: a.claim.map(claim_from_wit),
                }
            }

            pub fn claim_to_wit(c: &model::Claim) -> wit::Claim {
                match c {
                    model::Claim::IpamClaim(r) => wit::Claim::IpamClaim(r.clone()),
                    model::Claim::ResourceClaim(r) => wit::Claim::ResourceClaim(r.clone()),
                }
            }

            pub fn claim_from_wit(c: wit::Claim) -> model::Claim {
                match c {
                    wit::Claim::IpamClaim(r) => model::Claim::IpamClaim(r),
                    wit::Claim::ResourceClaim(r) => model::Claim::ResourceClaim(r),
                }
            }

            pub fn pool_to_wit(p: &model::PoolState) -> wit::PoolState {
                let s = &p.snapshot;
                wit::PoolState {
                    name: p.name.clone(),
                    taken: s.taken.clone(),
                    taken_wide: s.taken_wide.iter().map(|&o| to_offset(o)).collect(),
                    reserved: s.reserved.iter().map(|&o| to_offset(o)).collect(),
                    held: s.held.iter().map(allocation_to_wit).collect(),
                }
            }

            pub fn pool_from_wit(p: wit::PoolState) -> model::PoolState {
                model::PoolState {
                    name: p.name,
                    snapshot: model::PoolSnapshot {
                        taken: p.taken,
                        taken_wide: p.taken_wide.into_iter().map(from_offset).collect(),
                        reserved: p.reserved.into_iter().map(from_offset).collect(),
                        held: p.held.into_iter().map(allocation_from_wit).collect(),
                    },
                }
            }

            pub fn reservations_to_wit(r: model::Reservations) -> wit::Reservations {
                match r {
                    model::Reservations::AsRead => wit::Reservations::AsRead,
                    model::Reservations::FromPools => wit::Reservations::FromPools,
                }
            }

            pub fn reservations_from_wit(r: wit::Reservations) -> model::Reservations {
                match r {
                    wit::Reservations::AsRead => model::Reservations::AsRead,
                    wit::Reservations::FromPools => model::Reservations::FromPools,
                }
            }

            pub fn guidance_to_wit(g: &model::Guidance) -> wit::Guidance {
                wit::Guidance {
                    ranges: g.ranges.clone(),
                    picks: g
                        .picks
                        .iter()
                        .map(|p| wit::RangePick { range_index: p.range_index, prefer: p.prefer.clone(), refuse: p.refuse.clone(), veto: p.veto.clone() })
                        .collect(),
                }
            }

            pub fn guidance_from_wit(g: wit::Guidance) -> model::Guidance {
                model::Guidance {
                    ranges: g.ranges,
                    picks: g
                        .picks
                        .into_iter()
                        .map(|p| model::RangePick { range_index: p.range_index, prefer: p.prefer, refuse: p.refuse, veto: p.veto })
                        .collect(),
                }
            }

            pub fn request_to_wit(r: &model::Request) -> wit::Request {
                wit::Request {
                    container_id: r.container_id.clone(),
                    pod_ref: r.pod_ref.clone(),
                    ifname: r.ifname.clone(),
                    contention: r.contention,
                    guidance: r.guidance.as_ref().map(guidance_to_wit),
                    preferred: r.preferred.clone(),
                    claim: r.claim.as_ref().map(claim_to_wit),
                }
            }

            pub fn request_from_wit(r: wit::Request) -> model::Request {
                // `requested_ip` is the planner's own: `plan_all` sets it from each range's `requested`.
                model::Request {
                    container_id: r.container_id,
                    pod_ref: r.pod_ref,
                    ifname: r.ifname,
                    requested_ip: None,
                    contention: r.contention,
                    guidance: r.guidance.map(guidance_from_wit),
                    preferred: r.preferred,
                    claim: r.claim.map(claim_from_wit),
                }
            }

            pub fn assignment_to_wit(a: model::Assignment) -> wit::Assignment {
                wit::Assignment {
                    range_index: a.range_index,
                    ip: a.ip,
                    address: a.address,
                    offset: to_offset(a.offset),
                    gateway: a.gateway,
                    reservation: a.reservation,
                }
            }

            pub fn assignment_from_wit(a: wit::Assignment) -> model::Assignment {
                model::Assignment {
                    range_index: a.range_index,
                    ip: a.ip,
                    address: a.address,
                    offset: from_offset(a.offset),
                    gateway: a.gateway,
                    reservation: a.reservation,
                }
            }

            pub fn candidates_to_wit(c: model::RangeCandidates) -> wit::RangeCandidates {
                wit::RangeCandidates { range_index: c.range_index, free: c.free, held: c.held }
            }

            pub fn candidates_from_wit(c: wit::RangeCandidates) -> model::RangeCandidates {
                model::RangeCandidates { range_index: c.range_index, free: c.free, held: c.held }
            }

            pub fn outcome_to_wit(o: model::PlanOutcome) -> wit::PlanOutcome {
                match o {
                    model::PlanOutcome::Reuse { assignment, held_index } => {
                        wit::PlanOutcome::Reuse(wit::Reused { assignment: assignment_to_wit(assignment), held_index })
                    }
                    model::PlanOutcome::Fresh { assignment } => wit::PlanOutcome::Fresh(assignment_to_wit(assignment)),
                }
            }

            pub fn outcome_from_wit(o: wit::PlanOutcome) -> model::PlanOutcome {
                match o {
                    wit::PlanOutcome::Reuse(r) => model::PlanOutcome::Reuse { assignment: assignment_from_wit(r.assignment), held_index: r.held_index },
                    wit::PlanOutcome::Fresh(a) => model::PlanOutcome::Fresh { assignment: assignment_from_wit(a) },
                }
            }

            pub fn failure_to_wit(f: model::PlanFailure) -> wit::PlanFailure {
                match f {
                    model::PlanFailure::Exhausted { message } => wit::PlanFailure::Exhausted(message),
                    model::PlanFailure::Rejected { message } => wit::PlanFailure::Rejected(message),
                    model::PlanFailure::BadPick { range_index, message } => wit::PlanFailure::BadPick(wit::BadPick { range_index, message }),
                }
            }

            pub fn failure_from_wit(f: wit::PlanFailure) -> model::PlanFailure {
                match f {
                    wit::PlanFailure::Exhausted(message) => model::PlanFailure::Exhausted { message },
                    wit::PlanFailure::Rejected(message) => model::PlanFailure::Rejected { message },
                    wit::PlanFailure::BadPick(b) => model::PlanFailure::BadPick { range_index: b.range_index, message: b.message },
                }
            }

            pub fn attachment_to_wit(a: &model::Attachment) -> wit::Attachment {
                wit::Attachment { container_id: a.container_id.clone(), ifname: a.ifname.clone(), claim: a.claim.as_ref().map(claim_to_wit) }
            }

            pub fn attachment_from_wit(a: wit::Attachment) -> model::Attachment {
                model::Attachment { container_id: a.container_id, ifname: a.ifname, claim: a.claim.map(claim_from_wit) }
            }

            pub fn released_to_wit(r: model::Released) -> wit::Released {
                wit::Released { index: r.index, reservation: r.reservation }
            }

            pub fn released_from_wit(r: wit::Released) -> model::Released {
                model::Released { index: r.index, reservation: r.reservation }
            }

            /// `free` is a count of addresses (IPv6: beyond 64 bits), carried as decimal text.
            pub fn usage_to_wit(u: model::RangeUsage) -> wit::RangeUsage {
                wit::RangeUsage { allocated: u.allocated, free: u.free.to_string() }
            }

            pub fn usage_from_wit(u: wit::RangeUsage) -> Result<model::RangeUsage, ConfigError> {
                let free = u.free.parse().map_err(|_| ConfigError::invalid("range-usage.free", format!("not a count: {:?}", u.free)))?;
                Ok(model::RangeUsage { allocated: u.allocated, free })
            }

            pub fn warning_to_wit(w: model::ConfigWarning) -> wit::ConfigWarning {
                let kind = match w.kind {
                    model::WarningKind::Overlap => wit::WarningKind::Overlap,
                    model::WarningKind::Gateway => wit::WarningKind::Gateway,
                };
                wit::ConfigWarning { kind, text: w.text }
            }

            pub fn warning_from_wit(w: wit::ConfigWarning) -> model::ConfigWarning {
                let kind = match w.kind {
                    wit::WarningKind::Overlap => model::WarningKind::Overlap,
                    wit::WarningKind::Gateway => model::WarningKind::Gateway,
                };
                model::ConfigWarning { kind, text: w.text }
            }

            /// Offsets cross as two columns of 64-bit halves.
            pub fn table_to_wit(t: model::PreviewTable) -> wit::PodTable {
                wit::PodTable {
                    served: t.served,
                    addresses: t.addresses,
                    offsets_high: t.offsets.iter().map(|&o| (o >> 64) as u64).collect(),
                    offsets_low: t.offsets.iter().map(|&o| o as u64).collect(),
                    failure: t.failure.map(|f| wit::PreviewFailure { range_index: f.range_index, exhausted: f.exhausted, rejected: f.rejected }),
                }
            }

            pub fn table_from_wit(t: wit::PodTable) -> model::PreviewTable {
                model::PreviewTable {
                    served: t.served,
                    addresses: t.addresses,
                    offsets: t.offsets_high.iter().zip(&t.offsets_low).map(|(&h, &l)| (u128::from(h) << 64) | u128::from(l)).collect(),
                    failure: t.failure.map(|f| model::PreviewFailure { range_index: f.range_index, exhausted: f.exhausted, rejected: f.rejected }),
                }
            }

            pub fn cluster_to_wit(c: $crate::cluster::ClusterState) -> wit::ClusterState {
                use $crate::cluster as c_;
                wit::ClusterState {
                    pools: c.pools.iter().map(pool_to_wit).collect(),
                    entries: c
                        .entries
                        .into_iter()
                        .map(|e: c_::ClusterEntry| wit::ClusterEntry {
                            range_index: e.range_index,
                            pool_object: e.pool_object,
                            ip: e.ip,
                            allocation: allocation_to_wit(&e.allocation),
                        })
                        .collect(),
                    reserved: c
                        .reserved
                        .into_iter()
                        .map(|r: c_::ReservedAddress| wit::ReservedAddress {
                            range_index: r.range_index,
                            ip: r.ip,
                            name: r.name,
                            pod_ref: r.pod_ref,
                            claim: r.claim.as_ref().map(claim_to_wit),
                        })
                        .collect(),
                    ipam_claims: c
                        .ipam_claims
                        .into_iter()
                        .map(|i: c_::IpamClaimFound| wit::IpamClaimFound {
                            name: i.name,
                            network: i.network,
                            interface: i.interface,
                            ips: i.ips,
                            owner_pod: i.owner_pod,
                        })
                        .collect(),
                    ignored: c.ignored.into_iter().map(|i: c_::IgnoredObject| wit::IgnoredObject { kind: i.kind, name: i.name, reason: i.reason }).collect(),
                }
            }

            pub fn cluster_from_wit(c: wit::ClusterState) -> $crate::cluster::ClusterState {
                use $crate::cluster as c_;
                c_::ClusterState {
                    pools: c.pools.into_iter().map(pool_from_wit).collect(),
                    entries: c
                        .entries
                        .into_iter()
                        .map(|e| c_::ClusterEntry {
                            range_index: e.range_index,
                            pool_object: e.pool_object,
                            ip: e.ip,
                            allocation: allocation_from_wit(e.allocation),
                        })
                        .collect(),
                    reserved: c
                        .reserved
                        .into_iter()
                        .map(|r| c_::ReservedAddress {
                            range_index: r.range_index,
                            ip: r.ip,
                            name: r.name,
                            pod_ref: r.pod_ref,
                            claim: r.claim.map(claim_from_wit),
                        })
                        .collect(),
                    ipam_claims: c
                        .ipam_claims
                        .into_iter()
                        .map(|i| c_::IpamClaimFound { name: i.name, network: i.network, interface: i.interface, ips: i.ips, owner_pod: i.owner_pod })
                        .collect(),
                    ignored: c.ignored.into_iter().map(|i| c_::IgnoredObject { kind: i.kind, name: i.name, reason: i.reason }).collect(),
                }
            }
        }
    };
}
