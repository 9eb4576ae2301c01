//! One function per CNI command. Each takes the validated environment and the
//! raw stdin, and returns what goes to stdout on success (nothing for DEL, GC,
//! STATUS) or a [`CniError`].

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Instant;

use serde_json::{Map, Value};
use thereabouts_allocator::attachment::Holder;
use thereabouts_allocator::config::SUPPORTED_CNI_VERSIONS;
use thereabouts_allocator::model::{Assignment, Claim, NormalizedConfig, RangesAllocation};

use super::claims;
use super::env::{CniEnv, Command};
use super::error::{CniError, code};
use super::result::{IpConfig, IpamResult};
use crate::component::{EngineComponent, EngineFailure};
use crate::datastore::kubernetes::PodMetadata;
use crate::datastore::{self, Datastore, DatastoreError, retry};
use crate::failpoint;
use crate::ipam::{self, Attachment};
use crate::json::pretty;
use crate::logging;
use crate::network_config;
use crate::placement::{Claims, Placement};
use crate::policy::decide::{Guide, Policies, Subject};
use crate::policy::failure::PolicyStop;
use crate::policy::hooks::redacted;
use crate::policy::sandbox::PolicyEngine;

/// The newest spec version we speak; VERSION answers with it when stdin names none.
pub const LATEST_VERSION: &str = "1.1.0";

pub fn execute(env: &CniEnv, stdin: &str) -> Result<Option<String>, CniError> {
    if env.command == Command::Version {
        return Ok(Some(version(stdin)));
    }
    let started = Instant::now();
    let mut engine = EngineComponent::load().map_err(EngineFailure)?;
    let engine_loaded = Instant::now();
    let (config, flat) = network_config::load(&mut engine, stdin, &env.args)?;
    let configured = Instant::now();
    logging::configure(config.log_level.as_deref(), config.log_file.as_deref());
    logging::debug(format!(
        "{} container={} ifname={} network={} cniVersion={} flat file={}",
        env.command,
        env.container_id,
        env.ifname,
        config.name,
        config.cni_version,
        flat.as_ref().map_or("none".to_string(), |f| f.path.display().to_string())
    ));
    let store = datastore::open(&config.datastore, &config.name)?;
    let who = Attachment { container_id: &env.container_id, ifname: &env.ifname, claim: None };
    let outcome = match env.command {
        Command::Add => add(&mut engine, store.as_ref(), &config, who, &env.args).inspect(|_| failpoint::hit(failpoint::BEFORE_ANSWER)).map(Some),
        Command::Del => del(&mut engine, store.as_ref(), &config, who).inspect(|()| failpoint::hit(failpoint::BEFORE_ANSWER)).map(|()| None),
        Command::Check => check(&mut engine, store.as_ref(), &config, who, stdin).map(|()| None),
        Command::Gc => gc(&mut engine, store.as_ref(), &config, stdin).map(|()| None),
        Command::Status => status(&mut engine, store.as_ref(), &config).map(|()| None),
        Command::Version => Ok(Some(version(stdin))),
    };
    // Where a call's time goes, for operators chasing slow pod starts.
    let micros = |from: Instant, to: Instant| to.duration_since(from).as_micros();
    logging::debug(format!(
        "{}: engine component loaded in {} µs, config in {} µs, datastore work in {} µs",
        env.command,
        micros(started, engine_loaded),
        micros(engine_loaded, configured),
        micros(configured, Instant::now())
    ));
    // The process ends right after the result is written: tearing the engine
    // down (unmapping its memory, re-protecting its code, freeing its tables)
    // would only delay that, by ~0.2 ms of a ~1.2 ms call (measured).
    std::mem::forget(engine);
    outcome
}

/// `{"cniVersion": <the config's, if we speak it, else ours>, "supportedVersions": [...]}`.
/// stdin is optional: libcni sends `{"cniVersion": "1.1.0"}`, others send nothing.
pub fn version(stdin: &str) -> String {
    let asked = cni_version_of(stdin).filter(|v| SUPPORTED_CNI_VERSIONS.contains(&v.as_str()));
    let mut doc = Map::new();
    doc.insert("cniVersion".into(), Value::from(asked.unwrap_or_else(|| LATEST_VERSION.to_string())));
    doc.insert("supportedVersions".into(), Value::from(SUPPORTED_CNI_VERSIONS.to_vec()));
    pretty(&Value::Object(doc))
}

/// The `cniVersion` string of a JSON document, if it has one (for error output).
pub fn cni_version_of(stdin: &str) -> Option<String> {
    serde_json::from_str::<Value>(stdin).ok()?.get("cniVersion")?.as_str().map(str::to_string)
}

/// Numeric comparison of `major.minor.patch` versions.
fn at_least(version: &str, minimum: &str) -> bool {
    let parse = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(version) >= parse(minimum)
}

fn require_version(config: &NormalizedConfig, command: Command, minimum: &str) -> Result<(), CniError> {
    if at_least(&config.cni_version, minimum) {
        return Ok(());
    }
    Err(CniError::new(code::INCOMPATIBLE_VERSION, format!("config version does not allow {command}"))
        .with_details(format!("cniVersion {} is older than {minimum}", config.cni_version)))
}

fn deadline(default: std::time::Duration) -> Instant {
    Instant::now() + retry::budget(default)
}

fn add(engine: &mut EngineComponent, store: &dyn Datastore, config: &NormalizedConfig, who: Attachment, cni_args: &str) -> Result<String, CniError> {
    let deadline = deadline(retry::ADD_BUDGET);
    // Policies first: loaded, settings checked and ranges chosen before any
    // pool is read. Without policies none of this runs.
    let started = Instant::now();
    let policy_engine = if config.policies.is_empty() { None } else { Some(PolicyEngine::new().map_err(|e| ipam::IpamError::Policy(PolicyStop::Sandbox(e)))?) };
    let engine_made = Instant::now();
    let mut policies = match &policy_engine {
        Some(pe) => Some(Policies::load(pe, &config.policies).map_err(ipam::IpamError::Policy)?),
        None => None,
    };
    let loaded = Instant::now();
    let args = arg_pairs(cni_args);
    let (namespace, name) = config.pod_ref.split_once('/').unwrap_or(("", ""));
    let needs = policies.as_ref().map(Policies::needs).unwrap_or_default();
    let policies_read_pod = policies.is_some() && (needs.labels || needs.annotations);
    // A claim named in stdin needs no pod read; one in the pod's networks does.
    let claim_in_pod = config.allow_persistent_ips && config.ipam_claim_reference.is_none();
    let reads_pod = policies_read_pod || config.preferred_ip_annotation || claim_in_pod;
    // Opened once for the pod and the claim; `None`: the config names no kubeconfig.
    let api = (reads_pod || config.allow_persistent_ips).then(|| kubernetes_api(config)).flatten();
    // One GET of the pod, only when a policy, `preferred_ip_annotation` or a claim asks.
    let pod = if reads_pod {
        match pod_metadata(api.as_ref(), config, namespace, name, deadline) {
            Ok(pod) => pod,
            Err(stop) => {
                match &mut policies {
                    Some(p) if policies_read_pod => p.without_pod(stop).map_err(ipam::IpamError::Policy)?,
                    // Without its claim, a VM's address would be the pod's, lost on the next restart.
                    _ if claim_in_pod => return Err(CniError::new(code::TRY_AGAIN_LATER, format!("allowPersistentIPs: {stop}"))),
                    // A preference never fails an ADD: without it, the configured choice.
                    _ => logging::error(format!("ADD: no preferred-ip for {}: {stop}", config.pod_ref)),
                }
                PodMetadata::default()
            }
        }
    } else {
        PodMetadata::default()
    };
    let preferred = if config.preferred_ip_annotation { preferred_ips(&pod.annotations) } else { Vec::new() };
    let guide = match &policies {
        Some(p) if !p.is_empty() => {
            let subject = Subject {
                pod_namespace: namespace,
                pod_name: name,
                container_id: who.container_id,
                ifname: who.ifname,
                cni_args: &args,
                labels: &pod.labels,
                annotations: &pod.annotations,
            };
            let seen = redacted(config);
            let selection = p.select(&subject, &seen).map_err(ipam::IpamError::Policy)?;
            // Where a policy's cost goes, for operators weighing one.
            let micros = |from: Instant, to: Instant| to.duration_since(from).as_micros();
            logging::debug(format!(
                "ADD: policy engine in {} µs, {} policies loaded and their settings checked in {} µs, ranges selected in {} µs",
                micros(started, engine_made),
                config.policies.len(),
                micros(engine_made, loaded),
                micros(loaded, Instant::now())
            ));
            Some(Guide { policies: p, subject, seen, selection })
        }
        _ => None,
    };
    let claim_api = match api {
        _ if !config.allow_persistent_ips => None,
        Some(opened) => Some(opened?),
        None => {
            return Err(CniError::new(
                code::INVALID_CONFIG,
                "allowPersistentIPs needs the Kubernetes API to read IPAMClaims, and the config names no kubeconfig",
            )
            .with_details("field: kubernetes.kubeconfig"));
        }
    };
    let claimed = match &claim_api {
        Some(api) => claims::read(api, config, who.ifname, &pod.annotations, deadline)?,
        None => None,
    };
    let with_claim_ips = claimed.as_ref().map(|c| claims::with_claim_ips(config, c)).transpose()?;
    let config = with_claim_ips.as_ref().unwrap_or(config);
    let owner = claimed.as_ref().map(claims::ClaimedAdd::claim);
    let kept = claimed.as_ref().map(claims::ClaimedAdd::addresses).unwrap_or_default();
    let wishes = ipam::Wishes { guide: guide.as_ref(), preferred: &preferred, claim: owner.as_ref() };
    let allocated = allocate_placed(engine, store, config, who, wishes, &kept, deadline);
    if let (Some(api), Some(c)) = (&claim_api, &claimed) {
        match &allocated {
            Ok(result) => claims::record(api, c, Ok(&result.ips.iter().map(|ip| ip.address.clone()).collect::<Vec<_>>()), deadline)?,
            // The ADD's own error is what the runtime must see; the claim's condition is a courtesy.
            Err(e) => {
                if let Err(write) = claims::record(api, c, Err(&e.msg), deadline) {
                    logging::error(format!("ADD: could not record the failure on IPAMClaim {}/{}: {}", c.namespace, c.name, write.msg));
                }
            }
        }
    }
    let result = allocated?;
    logging::verbose(format!("ADD {}/{}: {}", who.container_id, who.ifname, result.ips.iter().map(|ip| ip.address.as_str()).collect::<Vec<_>>().join(", ")));
    result.to_json(&config.cni_version)
}

/// An ADD for a ResourceClaim's device (the profile provider's
/// GetProfileConfig): the same placement and allocation as a pod's, owned by
/// the claim, so that a repeat finds the device's addresses again.
pub fn allocate_for_claim(
    engine: &mut EngineComponent,
    store: &dyn Datastore,
    config: &NormalizedConfig,
    who: Attachment,
    claim: &Claim,
) -> Result<IpamResult, CniError> {
    let wishes = ipam::Wishes { guide: None, preferred: &[], claim: Some(claim) };
    allocate_placed(engine, store, config, who, wishes, &[], deadline(retry::ADD_BUDGET))
}

/// A DEL by another name (the profile provider's ReleaseProfileConfig: `who`
/// speaks for its ResourceClaim).
pub fn release_attachment(engine: &mut EngineComponent, store: &dyn Datastore, config: &NormalizedConfig, who: Attachment) -> Result<(), CniError> {
    del(engine, store, config, who)
}

/// The Kubernetes API of the config's kubeconfig (its datastore's, or
/// `kubernetes.kubeconfig`), for what an ADD reads besides pools; `None`
/// when the config names none.
fn kubernetes_api(config: &NormalizedConfig) -> Option<Result<datastore::kubernetes::KubernetesStore, DatastoreError>> {
    let kubeconfig = config.datastore.kubeconfig.as_deref()?;
    Some(datastore::kubernetes::KubernetesStore::open(std::path::Path::new(kubeconfig)))
}

/// Places and allocates: the node's slices (claiming another when they are
/// full; for addresses an IPAMClaim keeps, the slice that holds them), then
/// one address from each range.
fn allocate_placed(
    engine: &mut EngineComponent,
    store: &dyn Datastore,
    config: &NormalizedConfig,
    who: Attachment,
    wishes: ipam::Wishes,
    kept: &[IpAddr],
    deadline: Instant,
) -> Result<IpamResult, CniError> {
    let mut placement = Placement::resolve(engine, store, config, Claims::Allowed, deadline)?;
    let asking = Holder { container_id: who.container_id, pod_ref: &config.pod_ref, ifname: who.ifname };
    placement.leave_out_full(config, asking, &|pools| store.pool_notes(pools));
    if !kept.is_empty() && placement.is_sliced() {
        placement.hold_claim(engine, store, config, kept, deadline)?;
    }
    let assignments = loop {
        match ipam::allocate(engine, store, config, &placement, who, wishes, deadline) {
            // The pools it read are full, and it left out those its node
            // noted at the bound: another slice, else all of them past it.
            Err(ipam::IpamError::SlicesFull { range_index, .. }) if placement.left_out_some(range_index) => {
                placement.claim_past_bound(engine, store, config, range_index, deadline)?
            }
            // The node's slices are full: it claims another and tries again.
            Err(ipam::IpamError::SlicesFull { range_index, at_bound: false, .. }) => placement.claim(engine, store, config, range_index, deadline)?,
            // Its slices hold `node_slice_max_entries`: another if one is free.
            Err(ipam::IpamError::SlicesFull { range_index, at_bound: true, .. }) => placement.claim_past_bound(engine, store, config, range_index, deadline)?,
            other => break other?,
        }
    };
    build_result(config, &assignments)
}

/// CNI_ARGS as key-value pairs, in order, by the engine's own parser (the
/// engine's normalize has already refused a string it cannot parse).
fn arg_pairs(cni_args: &str) -> Vec<(String, String)> {
    thereabouts_allocator::cni_args::pairs(cni_args).unwrap_or_default().into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The pod annotation whereabouts PR #681 reads: one address (or, here, a
/// comma-separated list, one per family) the pod would rather have.
pub const PREFERRED_IP_ANNOTATION: &str = "whereabouts.cni.cncf.io/preferred-ip";

/// The addresses of the preferred-ip annotation, in order; the engine decides
/// which, if any, a range can give.
fn preferred_ips(annotations: &[(String, String)]) -> Vec<String> {
    let value = annotations.iter().find(|(k, _)| k == PREFERRED_IP_ANNOTATION).map_or("", |(_, v)| v.as_str());
    value.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_string).collect()
}

/// The Pod's labels and annotations for a policy that needs them: one GET
/// with `api` ([`kubernetes_api`]).
fn pod_metadata(
    api: Option<&Result<datastore::kubernetes::KubernetesStore, DatastoreError>>,
    config: &NormalizedConfig,
    namespace: &str,
    name: &str,
    deadline: Instant,
) -> Result<PodMetadata, PolicyStop> {
    let unreadable = |detail: String| PolicyStop::PodUnreadable { pod: config.pod_ref.clone(), detail };
    if name.is_empty() {
        return Err(unreadable("CNI_ARGS name no pod (K8S_POD_NAMESPACE, K8S_POD_NAME)".into()));
    }
    let Some(opened) = api else {
        return Err(unreadable("a policy needs its labels or annotations, and the config names no kubeconfig (`kubernetes.kubeconfig`)".into()));
    };
    let store = opened.as_ref().map_err(|e| unreadable(e.to_string()))?;
    store.pod_metadata(namespace, name, deadline).map_err(|e| unreadable(e.to_string()))
}

/// Allocated addresses in the order served, then static addresses; routes and DNS as configured.
pub fn build_result(config: &NormalizedConfig, assignments: &[Assignment]) -> Result<IpamResult, CniError> {
    let mut ips: Vec<IpConfig> = assignments
        .iter()
        .map(|a| match config.ranges.get(a.range_index as usize) {
            Some(range) => Ok(IpConfig { address: a.address.clone(), gateway: a.gateway.clone(), family: range.family }),
            None => Err(CniError::new(code::INTERNAL, format!("engine returned an address for range {}, which the config does not have", a.range_index))),
        })
        .collect::<Result<_, _>>()?;
    ips.extend(config.addresses.iter().map(|s| IpConfig { address: s.address.clone(), gateway: s.gateway.clone(), family: s.family }));
    let routes = match &config.routes_json {
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Array(routes)) => routes,
            _ => return Err(CniError::new(code::INTERNAL, "engine returned routes that are not a JSON array")),
        },
        None => Vec::new(),
    };
    let dns = match &config.dns_json {
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(dns)) => Some(dns),
            _ => return Err(CniError::new(code::INTERNAL, "engine returned dns that is not a JSON object")),
        },
        None => None,
    };
    Ok(IpamResult { ips, routes, dns })
}

fn del(engine: &mut EngineComponent, store: &dyn Datastore, config: &NormalizedConfig, who: Attachment) -> Result<(), CniError> {
    let deadline = deadline(retry::OTHER_BUDGET);
    // The slices the node remembers first: at thousands of nodes a LIST of a
    // node's slice objects walks all of them, and a scale-down sends a
    // thousand DELs at once. Only a DEL that finds less than its ADD gave (a
    // repeated DEL, a failed ADD, a node that forgot) looks in every slice.
    let placement = Placement::resolve(engine, store, config, Claims::Remembered, deadline)?;
    let mut released = ipam::release(engine, store, config, &placement, who, deadline)?;
    if !released.found_all && placement.some_slices() {
        let placement = Placement::resolve(engine, store, config, Claims::None, deadline)?;
        released.removed += ipam::release(engine, store, config, &placement, who, deadline)?.removed;
    }
    logging::verbose(format!("DEL {}/{}: released {} allocation(s)", who.container_id, who.ifname, released.removed));
    Ok(())
}

/// CHECK: every range (with `first_available`: one) holds an entry for this attachment, and `prevResult` lists
/// exactly our addresses among those that fall inside our ranges.
fn check(engine: &mut EngineComponent, store: &dyn Datastore, config: &NormalizedConfig, who: Attachment, stdin: &str) -> Result<(), CniError> {
    require_version(config, Command::Check, "0.4.0")?;
    let previous = prev_result_addresses(stdin)?;
    let deadline = deadline(retry::OTHER_BUDGET);
    let placement = Placement::resolve(engine, store, config, Claims::None, deadline)?;
    let found = ipam::find(store, config, &placement, who, deadline)?;
    // With `first_available` the attachment holds an address in one range, not all.
    let first_available = config.ip_ranges_allocation == RangesAllocation::FirstAvailable;
    let mut ours = Vec::new();
    for (range, found) in config.ranges.iter().zip(found) {
        let (range, entry) = match found {
            Some(found) => found,
            None if first_available => continue,
            None => {
                return Err(CniError::new(
                    code::INTERNAL,
                    format!("no allocation in range {} for container {} interface {}", range.cidr, who.container_id, who.ifname),
                ));
            }
        };
        ours.push(
            ipam::address_of(&range, entry.offset)
                .ok_or_else(|| CniError::new(code::INTERNAL, format!("stored offset {} is outside {}", entry.offset, range.cidr)))?,
        );
    }
    if first_available && ours.is_empty() && !config.ranges.is_empty() {
        return Err(CniError::new(code::INTERNAL, format!("no allocation in any range for container {} interface {}", who.container_id, who.ifname)));
    }
    ours.extend(config.addresses.iter().map(|s| s.address.clone()));
    for address in &ours {
        if !previous.iter().any(|p| same_address(p, address)) {
            return Err(CniError::new(code::INTERNAL, format!("address {address} is allocated to container {} but missing from prevResult", who.container_id)));
        }
    }
    for address in &previous {
        let Some(ip) = address.split('/').next().and_then(|ip| ip.parse::<IpAddr>().ok()) else { continue };
        let inside_ours = config.ranges.iter().any(|r| thereabouts_allocator::planner::offset_of(r, ip).is_some());
        if inside_ours && !ours.iter().any(|o| same_address(o, address)) {
            return Err(CniError::new(
                code::INTERNAL,
                format!("prevResult address {address} is not allocated to container {} interface {}", who.container_id, who.ifname),
            ));
        }
    }
    logging::verbose(format!("CHECK {}/{}: {} address(es) match", who.container_id, who.ifname, ours.len()));
    Ok(())
}

/// `ip/prefix` equality on parsed addresses (so `2001:DB8::1/64` equals `2001:db8::1/64`).
fn same_address(a: &str, b: &str) -> bool {
    let parse = |s: &str| -> Option<(IpAddr, String)> {
        let (ip, prefix) = s.split_once('/').unwrap_or((s, ""));
        Some((ip.parse().ok()?, prefix.to_string()))
    };
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The `address` of every `prevResult.ips[]` entry (CHECK configs are ≥ 0.4.0, so
/// the result has the `ips` layout).
fn prev_result_addresses(stdin: &str) -> Result<Vec<String>, CniError> {
    let doc: Value = serde_json::from_str(stdin).map_err(|e| CniError::new(code::DECODE, format!("network config: JSON parsing error: {e}")))?;
    let prev =
        doc.get("prevResult").filter(|v| !v.is_null()).ok_or_else(|| CniError::new(code::INVALID_CONFIG, "CHECK requires prevResult in the network config"))?;
    let ips = match prev.get("ips") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(ips)) => ips,
        Some(_) => return Err(CniError::new(code::DECODE, "prevResult.ips is not an array")),
    };
    ips.iter()
        .enumerate()
        .map(|(i, ip)| {
            ip.get("address")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| CniError::new(code::DECODE, format!("prevResult.ips[{i}].address is missing")))
        })
        .collect()
}

fn gc(engine: &mut EngineComponent, store: &dyn Datastore, config: &NormalizedConfig, stdin: &str) -> Result<(), CniError> {
    require_version(config, Command::Gc, "1.1.0")?;
    let valid = valid_attachments(stdin)?;
    let deadline = deadline(retry::OTHER_BUDGET);
    let claims_gone = ipam_claims_gone(store, config, deadline);
    let removed = ipam::collect_garbage(engine, store, config, &valid, &claims_gone, deadline)?;
    for (pool, entry) in &removed {
        logging::verbose(format!("GC: freed offset {} in pool {} (container {} interface {})", entry.offset, pool.name, entry.container_id, entry.ifname));
    }
    Ok(())
}

/// The IPAMClaims of this node's pools that are gone: on a datastore only
/// this node writes (the file one) no controller frees a deleted claim's
/// addresses, so its GC does. Claims it cannot read (the API unreachable, no
/// kubeconfig) are not gone: their addresses wait for the next GC.
fn ipam_claims_gone(store: &dyn Datastore, config: &NormalizedConfig, deadline: Instant) -> HashSet<Claim> {
    if !config.allow_persistent_ips || store.capabilities().shared_by_nodes {
        return HashSet::new();
    }
    let named: HashSet<Claim> = match ipam::claims_held(store, config, deadline) {
        Ok(claims) => claims.into_iter().filter(|c| matches!(c, Claim::IpamClaim(_))).collect(),
        Err(e) => {
            logging::error(format!("GC: reading the pools for their claims: {e}"));
            return HashSet::new();
        }
    };
    if named.is_empty() {
        return named;
    }
    let api = match kubernetes_api(config) {
        Some(Ok(api)) => api,
        Some(Err(e)) => {
            logging::error(format!("GC: IPAMClaims not read, their addresses kept: {e}"));
            return HashSet::new();
        }
        None => return HashSet::new(),
    };
    named
        .into_iter()
        .filter(|claim| {
            let (namespace, name) = claim.reference().split_once('/').unwrap_or(("", claim.reference()));
            match api.ipam_claim(namespace, name, deadline) {
                Ok(found) => found.is_none(),
                Err(e) => {
                    logging::error(format!("GC: IPAMClaim {namespace}/{name} not read, its addresses kept: {e}"));
                    false
                }
            }
        })
        .collect()
}

/// `cni.dev/valid-attachments` (the spec's key since 1.1.0 was tagged) together with
/// `cni.dev/attachments` (the key in the tagged text); absent means none is valid.
pub fn valid_attachments(stdin: &str) -> Result<HashSet<(String, String)>, CniError> {
    let doc: Value = serde_json::from_str(stdin).map_err(|e| CniError::new(code::DECODE, format!("network config: JSON parsing error: {e}")))?;
    let mut valid = HashSet::new();
    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        let list = match doc.get(key) {
            None | Some(Value::Null) => continue,
            Some(Value::Array(list)) => list,
            Some(_) => return Err(CniError::new(code::DECODE, format!("{key} is not a list"))),
        };
        for (i, item) in list.iter().enumerate() {
            let field = |name: &str| item.get(name).and_then(Value::as_str).map(str::to_string);
            match (field("containerID"), field("ifname")) {
                (Some(id), Some(ifname)) => {
                    valid.insert((id, ifname));
                }
                _ => return Err(CniError::new(code::DECODE, format!("{key}[{i}] needs string fields containerID and ifname"))),
            }
        }
    }
    Ok(valid)
}

/// STATUS: code 50 when the datastore cannot take writes or a range is full.
fn status(engine: &mut EngineComponent, store: &dyn Datastore, config: &NormalizedConfig) -> Result<(), CniError> {
    require_version(config, Command::Status, "1.1.0")?;
    let unavailable = |msg: String| CniError::new(code::NOT_AVAILABLE, msg);
    let deadline = deadline(retry::OTHER_BUDGET);
    store.check_usable(deadline).map_err(|e| unavailable(format!("datastore unusable: {e}")))?;
    if config.ranges.iter().any(|r| r.node_slicing.is_some()) {
        // A node whose slices are full claims another on its next ADD.
        return Ok(());
    }
    let pools = ipam::pool_states(store, config, deadline).map_err(|e| unavailable(format!("datastore unusable: {e}")))?;
    let next = engine.preview(config, &pools, 1).map_err(EngineFailure)?;
    match next.failure.and_then(|f| config.ranges.get(f.range_index as usize)) {
        Some(range) => Err(unavailable(format!("no free address in range {} (pool {})", range.cidr, range.pool_name))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preferred_ip_annotation_is_a_list_of_addresses() {
        let of = |value: &str| preferred_ips(&[("app".into(), "x".into()), (PREFERRED_IP_ANNOTATION.into(), value.into())]);
        assert_eq!(of("192.0.2.5"), ["192.0.2.5"]);
        assert_eq!(of(" 192.0.2.5 , 2001:db8::5,"), ["192.0.2.5", "2001:db8::5"]);
        assert!(of("").is_empty() && preferred_ips(&[]).is_empty());
    }

    #[test]
    fn version_echoes_a_supported_config_version() {
        let v: Value = serde_json::from_str(&version("{\"cniVersion\":\"0.3.1\"}")).unwrap();
        assert_eq!(v["cniVersion"], "0.3.1");
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 7);
        let v: Value = serde_json::from_str(&version("")).unwrap();
        assert_eq!(v["cniVersion"], LATEST_VERSION);
        let v: Value = serde_json::from_str(&version("{\"cniVersion\":\"9.9.9\"}")).unwrap();
        assert_eq!(v["cniVersion"], LATEST_VERSION);
    }

    #[test]
    fn version_order_is_numeric() {
        assert!(at_least("1.1.0", "1.1.0") && at_least("1.0.0", "0.4.0") && !at_least("0.3.1", "0.4.0") && at_least("0.10.0", "0.4.0"));
    }

    #[test]
    fn both_attachment_keys_are_read() {
        let stdin = r#"{"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}],"cni.dev/attachments":[{"containerID":"b","ifname":"net1"}]}"#;
        let valid = valid_attachments(stdin).unwrap();
        assert!(valid.contains(&("a".into(), "eth0".into())) && valid.contains(&("b".into(), "net1".into())));
        assert!(valid_attachments("{}").unwrap().is_empty());
        assert_eq!(valid_attachments(r#"{"cni.dev/valid-attachments":[{"containerID":1}]}"#).unwrap_err().code, 6);
    }

    #[test]
    fn addresses_compare_by_value() {
        assert!(same_address("2001:DB8::1/64", "2001:db8::1/64"));
        assert!(!same_address("192.0.2.1/24", "192.0.2.1/25"));
    }
}
