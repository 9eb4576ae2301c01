//! `normalize`: a CNI network config (plus the optional flat file and CNI_ARGS)
//! → a [`NormalizedConfig`], following whereabouts v0.9.4's load order:
//! JSON → `ipam` present → `type` → CNI_ARGS → flat-file merge → legacy range
//! first, then `ipRanges` → gateway → static addresses → version checks.

use std::net::IpAddr;

use serde_json::{Map, Value};

use crate::cni_args::{self, CniArgs};
use crate::error::{ConfigError, Result, code};
use crate::gojson;
use crate::ip::{self, Family, format_ip, to_u128};
use crate::model::{DatastoreSettings, NormalizedConfig, NormalizedRange, RangesAllocation, StaticAddress};
use crate::range::{RangeSpec, normalize_range};
use crate::routes;

/// CNI spec versions this plugin speaks, oldest first.
pub const SUPPORTED_CNI_VERSIONS: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// `ipam.type` values we answer to: our own, and whereabouts' (drop-in).
pub const IPAM_TYPES: [&str; 2] = ["whereabouts", "thereabouts"];

/// Datastores the host implements.
pub const DATASTORES: [&str; 3] = ["file", "kubernetes", "etcd"];

/// whereabouts' flat-file search paths, then ours. An inline
/// `ipam.configuration_path` is searched before all of them.
pub const FLAT_FILE_PATHS: [&str; 4] = [
    "/etc/kubernetes/cni/net.d/whereabouts.d/whereabouts.conf",
    "/etc/cni/net.d/whereabouts.d/whereabouts.conf",
    "/host/etc/cni/net.d/whereabouts.d/whereabouts.conf",
    "/etc/cni/net.d/thereabouts.d/thereabouts.conf",
];

/// `ipam` keys merged from the flat file when the inline config leaves them empty.
/// `enable_overlapping_ranges` is deliberately absent: the flat file cannot change it.
const MERGED_KEYS: [&str; 36] = [
    "range",
    "range_start",
    "range_end",
    "exclude",
    "ipRanges",
    "gateway",
    "routes",
    "dns",
    "addresses",
    "network_name",
    "datastore",
    "data_dir",
    "kubernetes",
    "etcd_host",
    "etcd_username",
    "etcd_password",
    "etcd_key_file",
    "etcd_cert_file",
    "etcd_ca_cert_file",
    "etcd_prefix",
    "log_file",
    "log_level",
    "configuration_path",
    "reconciler_cron_expression",
    "sleep_for_race",
    "leader_lease_duration",
    "leader_renew_deadline",
    "leader_retry_period",
    "node_slice_size",
    "node_slice_max_entries",
    "ipRangesAllocation",
    "policies",
    "preferred_ip_annotation",
    "exclude_gateway",
    "optimistic_ipam",
    "allowPersistentIPs",
];

/// Nested objects merged field by field (mergo's deep merge through structs).
const NESTED_KEYS: [(&str, &[&str]); 2] = [("kubernetes", &["kubeconfig", "k8s_api_root"]), ("dns", &["nameservers", "domain", "search", "options"])];

/// The parts of stdin that matter, whether it was a plain config or a conflist.
struct NetworkConfig<'a> {
    name: String,
    cni_version: String,
    ipam: &'a Map<String, Value>,
    /// The plugin object that carries `ipam` (holds `runtimeConfig` and `args`).
    plugin: &'a Map<String, Value>,
}

fn parse_document(text: &str, what: &str) -> Result<Map<String, Value>> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ConfigError::new(code::DECODE, "", format!("{what}: expected a JSON object, got {}", gojson::kind(&other)))),
        Err(e) => Err(ConfigError::new(code::DECODE, "", format!("{what}: JSON parsing error: {e}"))),
    }
}

fn locate<'a>(doc: &'a Map<String, Value>) -> Result<NetworkConfig<'a>> {
    let cni_version = gojson::string(doc, "cniVersion", "cniVersion")?.unwrap_or_else(|| "0.1.0".to_string());
    if !SUPPORTED_CNI_VERSIONS.contains(&cni_version.as_str()) {
        return Err(ConfigError::new(
            code::INCOMPATIBLE_VERSION,
            "cniVersion",
            format!("incompatible CNI versions: config is {cni_version:?}, plugin supports {SUPPORTED_CNI_VERSIONS:?}"),
        ));
    }
    let name = gojson::string(doc, "name", "name")?.ok_or_else(|| ConfigError::invalid("name", "missing network name"))?;
    if !is_valid_network_name(&name) {
        return Err(ConfigError::invalid(
            "name",
            format!("invalid network name {name:?}: must start with a letter or digit and hold only letters, digits, '_', '.' and '-'"),
        ));
    }
    let (plugin, ipam) = match gojson::array(doc, "plugins", "plugins")? {
        Some(plugins) => plugins
            .iter()
            .filter_map(Value::as_object)
            .find_map(|p| match gojson::field(p, "ipam") {
                Some(Value::Object(ipam)) => Some((p, ipam)),
                _ => None,
            })
            .ok_or_else(|| ConfigError::invalid("plugins", "IPAM config missing 'ipam' key in every plugin of the list"))?,
        None => (doc, gojson::object(doc, "ipam", "ipam")?.ok_or_else(|| ConfigError::invalid("ipam", "IPAM config missing 'ipam' key"))?),
    };
    Ok(NetworkConfig { name, cni_version, ipam, plugin })
}

/// CNI network names: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
fn is_valid_network_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric()) && bytes.all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Search order for the flat file. See `flat-file-paths` in the WIT.
pub fn flat_file_paths(network_config: &str) -> Result<Vec<String>> {
    let doc = parse_document(network_config, "network config")?;
    let net = locate(&doc)?;
    let mut paths = Vec::with_capacity(FLAT_FILE_PATHS.len() + 1);
    if let Some(inline) = absolute_path(gojson::string(net.ipam, "configuration_path", "ipam.configuration_path")?, "ipam.configuration_path")? {
        paths.push(inline);
    }
    paths.extend(FLAT_FILE_PATHS.iter().map(|p| p.to_string()));
    Ok(paths)
}

/// Fill the inline `ipam`'s empty fields from the flat file (whereabouts' mergo
/// merge), under canonical key names.
fn merge_flat_file(inline: &Map<String, Value>, flat: Option<&Map<String, Value>>) -> Map<String, Value> {
    let mut merged = Map::new();
    let pick =
        |inline: Option<&Value>, flat: Option<&Value>| -> Option<Value> { if gojson::is_empty(inline) { flat.or(inline).cloned() } else { inline.cloned() } };
    for key in MERGED_KEYS {
        let inline_value = gojson::field(inline, key);
        let flat_value = flat.and_then(|f| gojson::field(f, key));
        let nested = NESTED_KEYS.iter().find(|(k, _)| *k == key);
        let value = match (nested, inline_value, flat_value) {
            (Some((_, fields)), Some(Value::Object(i)), Some(Value::Object(f))) => {
                let mut object = Map::new();
                for field in *fields {
                    if let Some(v) = pick(gojson::field(i, field), gojson::field(f, field)) {
                        object.insert(field.to_string(), v);
                    }
                }
                Some(Value::Object(object))
            }
            _ => pick(inline_value, flat_value),
        };
        if let Some(value) = value {
            merged.insert(key.to_string(), value);
        }
    }
    // Not merged: the inline value or the default (true) stands.
    if let Some(v) = gojson::field(inline, "enable_overlapping_ranges") {
        merged.insert("enable_overlapping_ranges".into(), v.clone());
    }
    merged
}

fn sloppy_ip(map: &Map<String, Value>, key: &str, path: &str, what: &str) -> Result<Option<IpAddr>> {
    match gojson::string(map, key, path)? {
        None => Ok(None),
        Some(text) => {
            ip::parse_ip_sloppy(&text).map(Some).ok_or_else(|| ConfigError::invalid(path, format!("couldn't parse {what} {text:?}: not an IP address")))
        }
    }
}

fn strict_ip(map: &Map<String, Value>, key: &str, path: &str) -> Result<Option<IpAddr>> {
    match gojson::string(map, key, path)? {
        None => Ok(None),
        Some(text) => ip::parse_ip_strict(&text).map(Some).ok_or_else(|| ConfigError::invalid(path, format!("invalid IP address: {text}"))),
    }
}

/// Range entries in allocation order: the legacy top-level range first.
fn range_specs(ipam: &Map<String, Value>) -> Result<Vec<RangeSpec>> {
    let mut specs = Vec::new();
    if let Some(range) = gojson::string(ipam, "range", "ipam.range")? {
        specs.push(RangeSpec {
            path: "ipam".into(),
            range,
            // whereabouts parses these sloppily and silently drops bad values; we
            // reject them, since a dropped bound hands out addresses the user excluded.
            range_start: sloppy_ip(ipam, "range_start", "ipam.range_start", "range_start")?,
            range_end: sloppy_ip(ipam, "range_end", "ipam.range_end", "range_end")?,
            exclude: gojson::strings(ipam, "exclude", "ipam.exclude")?,
            gateway: None,
            node_slice_size: None,
            node_slice_max_entries: None,
        });
    }
    for (i, entry) in gojson::array(ipam, "ipRanges", "ipam.ipRanges")?.into_iter().flatten().enumerate() {
        let path = format!("ipam.ipRanges[{i}]");
        let Value::Object(entry) = entry else {
            return Err(ConfigError::invalid(&path, format!("expected an object, got {}", gojson::kind(entry))));
        };
        let range = gojson::string(entry, "range", &format!("{path}.range"))?
            .ok_or_else(|| ConfigError::invalid(format!("{path}.range"), "missing range (e.g. \"192.0.2.0/24\")"))?;
        specs.push(RangeSpec {
            range_start: strict_ip(entry, "range_start", &format!("{path}.range_start"))?,
            range_end: strict_ip(entry, "range_end", &format!("{path}.range_end"))?,
            exclude: gojson::strings(entry, "exclude", &format!("{path}.exclude"))?,
            gateway: strict_ip(entry, "gateway", &format!("{path}.gateway"))?,
            node_slice_size: gojson::string(entry, "node_slice_size", &format!("{path}.node_slice_size"))?,
            node_slice_max_entries: max_entries(entry, &format!("{path}.node_slice_max_entries"))?,
            range,
            path,
        });
    }
    Ok(specs)
}

/// `ipam.addresses`, then CNI_ARGS `IP=` with `GATEWAY=`.
///
/// These are the user's explicit choice, not allocations: they go into the result
/// as written (in Go's canonical text), even when one equals a range's gateway.
/// Only what the engine hands out from a range skips the gateway.
fn static_addresses(ipam: &Map<String, Value>, args: &CniArgs) -> Result<Vec<StaticAddress>> {
    let mut out = Vec::new();
    for (i, entry) in gojson::array(ipam, "addresses", "ipam.addresses")?.into_iter().flatten().enumerate() {
        let path = format!("ipam.addresses[{i}]");
        let Value::Object(entry) = entry else {
            return Err(ConfigError::invalid(&path, format!("expected an object, got {}", gojson::kind(entry))));
        };
        let text =
            gojson::string(entry, "address", &format!("{path}.address"))?.ok_or_else(|| ConfigError::invalid(format!("{path}.address"), "missing address"))?;
        let cidr = ip::parse_cidr(&text, true)
            .ok_or_else(|| ConfigError::invalid(format!("{path}.address"), format!("invalid CIDR in addresses {text:?}")))?
            .unmapped();
        let gateway = sloppy_ip(entry, "gateway", &format!("{path}.gateway"), "gateway")?;
        out.push(StaticAddress { address: cidr.text(), gateway: gateway.map(format_ip), family: cidr.family() });
    }
    if let Some(list) = &args.ip {
        let mut from_args = Vec::new();
        for text in list.split(',').map(str::trim) {
            let cidr = ip::parse_cidr(text, true)
                .ok_or_else(|| ConfigError::new(code::INVALID_ENV, "CNI_ARGS.IP", format!("CNI_ARGS IP: invalid CIDR {text:?}")))?
                .unmapped();
            from_args.push((cidr, None::<IpAddr>));
        }
        for text in args.gateway.iter().flat_map(|g| g.split(',')).map(str::trim) {
            let gw = ip::parse_ip_sloppy(text)
                .ok_or_else(|| ConfigError::new(code::INVALID_ENV, "CNI_ARGS.GATEWAY", format!("CNI_ARGS GATEWAY: invalid gateway address {text:?}")))?
                .to_canonical();
            for (cidr, slot) in from_args.iter_mut() {
                if cidr.contains(Family::of(gw), to_u128(gw)) {
                    *slot = Some(gw);
                }
            }
        }
        out.extend(from_args.into_iter().map(|(cidr, gw)| StaticAddress { address: cidr.text(), gateway: gw.map(format_ip), family: cidr.family() }));
    }
    Ok(out)
}

/// `runtimeConfig.ips` (capability `ips`) or `args.cni.ips`: each address goes to
/// the first range of its family whose network holds it and has no request yet.
fn assign_requested_ips(plugin: &Map<String, Value>, ranges: &mut [NormalizedRange]) -> Result<()> {
    let mut requests: Vec<(String, String)> = Vec::new();
    if let Some(rc) = gojson::object(plugin, "runtimeConfig", "runtimeConfig")? {
        for (i, ip) in gojson::strings(rc, "ips", "runtimeConfig.ips")?.into_iter().enumerate() {
            requests.push((format!("runtimeConfig.ips[{i}]"), ip));
        }
    }
    if let Some(cni) = gojson::object(plugin, "args", "args")?.map(|a| gojson::object(a, "cni", "args.cni")).transpose()?.flatten() {
        for (i, ip) in gojson::strings(cni, "ips", "args.cni.ips")?.into_iter().enumerate() {
            requests.push((format!("args.cni.ips[{i}]"), ip));
        }
    }
    for (field, text) in requests {
        request_address(ranges, &field, &text)?;
    }
    Ok(())
}

/// Makes `text` (an address; a prefix is ignored) the request of the first
/// range whose network holds it and that has no request yet. The one rule
/// for every requested address: `runtimeConfig.ips`, `args.cni.ips`, and the
/// host's IPAMClaim `status.ips`; `field` names where it came from.
pub fn request_address(ranges: &mut [NormalizedRange], field: &str, text: &str) -> Result<()> {
    let bare = text.split_once('/').map_or(text, |(ip, _)| ip);
    let ip = ip::parse_ip_strict(bare).ok_or_else(|| ConfigError::invalid(field, format!("invalid IP address {text:?}")))?;
    let slot = ranges
        .iter_mut()
        .find(|r| r.requested.is_none() && crate::planner::offset_of(r, ip).is_some())
        .ok_or_else(|| ConfigError::invalid(field, format!("requested address {text} is not inside any configured range without a request")))?;
    slot.requested = Some(format_ip(ip));
    Ok(())
}

/// A path the plugin opens, refused unless absolute: a CNI plugin runs in the
/// runtime's working directory, which nobody chose, so a relative path names
/// a file in a place that depends on who called. "" counts as unset.
fn absolute_path(value: Option<String>, field: &str) -> Result<Option<String>> {
    match value {
        Some(path) if !path.is_empty() && !path.starts_with('/') => Err(ConfigError::invalid(
            field,
            format!("path {path:?} is not absolute (a CNI plugin runs in the runtime's working directory, which is no place to resolve it from)"),
        )),
        value => Ok(value),
    }
}

fn datastore_settings(ipam: &Map<String, Value>) -> Result<DatastoreSettings> {
    let s = |key: &str| gojson::string(ipam, key, &format!("ipam.{key}"));
    let path = |key: &str| absolute_path(s(key)?, &format!("ipam.{key}"));
    let kind = s("datastore")?;
    if let Some(kind) = kind.as_ref().filter(|k| !DATASTORES.contains(&k.as_str())) {
        return Err(ConfigError::invalid("ipam.datastore", format!("unknown datastore {kind:?}; choose one of {DATASTORES:?}")));
    }
    let kubeconfig = match gojson::object(ipam, "kubernetes", "ipam.kubernetes")? {
        Some(k) => absolute_path(gojson::string(k, "kubeconfig", "ipam.kubernetes.kubeconfig")?, "ipam.kubernetes.kubeconfig")?,
        None => None,
    };
    let etcd_hosts = match gojson::field(ipam, "etcd_host") {
        Some(Value::Array(_)) => gojson::strings(ipam, "etcd_host", "ipam.etcd_host")?,
        _ => s("etcd_host")?.map(|h| h.split(',').map(|e| e.trim().to_string()).filter(|e| !e.is_empty()).collect()).unwrap_or_default(),
    };
    Ok(DatastoreSettings {
        kind,
        data_dir: path("data_dir")?,
        kubeconfig,
        etcd_hosts,
        etcd_username: s("etcd_username")?,
        etcd_password: s("etcd_password")?,
        etcd_key_file: path("etcd_key_file")?,
        etcd_cert_file: path("etcd_cert_file")?,
        etcd_ca_cert_file: path("etcd_ca_cert_file")?,
        etcd_prefix: s("etcd_prefix")?,
    })
}

/// `ipRangesAllocation`: the spelling of whereabouts' proposal (PR #738), exactly.
fn ranges_allocation(ipam: &Map<String, Value>) -> Result<RangesAllocation> {
    match gojson::string(ipam, "ipRangesAllocation", "ipam.ipRangesAllocation")?.as_deref() {
        None | Some("all") => Ok(RangesAllocation::All),
        Some("first_available") => Ok(RangesAllocation::FirstAvailable),
        Some(other) => {
            Err(ConfigError::invalid("ipam.ipRangesAllocation", format!("unknown value {other:?}; choose \"all\" (the default) or \"first_available\"")))
        }
    }
}

/// `preferred_ip_annotation`, and the keys whereabouts PR #681 (open) adds
/// that mean nothing new here, checked as what they are and accepted:
/// `exclude_gateway` (thereabouts never hands out a gateway) and
/// `optimistic_ipam` (thereabouts takes no lease: every write is a
/// compare-and-swap).
fn pr681_keys(ipam: &Map<String, Value>) -> Result<bool> {
    gojson::boolean(ipam, "exclude_gateway", "ipam.exclude_gateway")?;
    gojson::boolean(ipam, "optimistic_ipam", "ipam.optimistic_ipam")?;
    Ok(gojson::boolean(ipam, "preferred_ip_annotation", "ipam.preferred_ip_annotation")?.unwrap_or(false))
}

/// `allowPersistentIPs` (on the plugin object, where KubeVirt's
/// ipam-extensions reads it, or in `ipam`) and the IPAMClaim stdin names:
/// `args.cni["ipam-claim-reference"]`, else a top-level
/// `ipam-claim-reference` (never the flat file's: a node-wide file naming one
/// VM's claim would be stale for every other).
fn persistent_ips(plugin: &Map<String, Value>, ipam: &Map<String, Value>) -> Result<(bool, Option<String>)> {
    let allowed = gojson::boolean(plugin, "allowPersistentIPs", "allowPersistentIPs")?.unwrap_or(false)
        || gojson::boolean(ipam, "allowPersistentIPs", "ipam.allowPersistentIPs")?.unwrap_or(false);
    const KEY: &str = "ipam-claim-reference";
    let from_args = match gojson::object(plugin, "args", "args")?.map(|a| gojson::object(a, "cni", "args.cni")).transpose()?.flatten() {
        Some(cni) => gojson::string(cni, KEY, "args.cni.ipam-claim-reference")?,
        None => None,
    };
    let reference = match from_args {
        Some(r) => Some(r),
        None => gojson::string(plugin, KEY, KEY)?,
    }
    .filter(|r| !r.is_empty());
    if let Some(r) = &reference {
        let (namespace, name) = r.split_once('/').unwrap_or(("", r));
        if name.is_empty() || name.contains('/') || (r.contains('/') && namespace.is_empty()) {
            return Err(ConfigError::invalid(KEY, format!("invalid IPAMClaim reference {r:?}: expected a name or namespace/name")));
        }
    }
    Ok((allowed, reference))
}

/// Versions before 0.3.0 carry one `ip4` and one `ip6` in a result.
fn check_addresses_fit_version(cni_version: &str, ranges: &[NormalizedRange], statics: &[StaticAddress]) -> Result<()> {
    if !matches!(cni_version, "0.1.0" | "0.2.0") {
        return Ok(());
    }
    for family in [Family::V4, Family::V6] {
        let count = ranges.iter().filter(|r| r.family == family).count() + statics.iter().filter(|s| s.family == family).count();
        if count > 1 {
            return Err(ConfigError::new(
                code::INCOMPATIBLE_VERSION,
                "cniVersion",
                format!(
                    "CNI version {cni_version} does not support more than 1 address per family ({count} IPv{} addresses configured); use cniVersion 0.3.0 or later",
                    family.number()
                ),
            ));
        }
    }
    Ok(())
}

/// `node_slice_max_entries` of `object`: a whole number of entries, at least 1.
fn max_entries(object: &Map<String, Value>, path: &str) -> Result<Option<u32>> {
    match gojson::field(object, "node_slice_max_entries") {
        None => Ok(None),
        Some(Value::Number(n)) => n.as_u64().filter(|n| *n >= 1).and_then(|n| u32::try_from(n).ok()).map(Some).ok_or_else(|| {
            ConfigError::invalid(path, format!("invalid node_slice_max_entries {n}: expected a whole number of entries per node pool, at least 1"))
        }),
        Some(other) => Err(ConfigError::invalid(path, format!("expected a number, got {} ({other})", gojson::kind(other)))),
    }
}

/// Applies `node_slice_size` and `node_slice_max_entries` (top-level, or an
/// `ipRanges` entry's own) to the ranges.
fn slice_ranges(ipam: &Map<String, Value>, specs: &[RangeSpec], ranges: &mut [NormalizedRange], base: &str) -> Result<()> {
    let top = gojson::string(ipam, "node_slice_size", "ipam.node_slice_size")?.filter(|s| !s.is_empty());
    let top_max_entries = max_entries(ipam, "ipam.node_slice_max_entries")?;
    let Some(first_cidr) = ranges.first().map(|r| r.cidr.clone()) else { return Ok(()) };
    for (spec, range) in specs.iter().zip(ranges.iter_mut()) {
        let (size, field) = match (&spec.node_slice_size, &top) {
            (Some(own), _) if !own.is_empty() => (own, format!("{}.node_slice_size", spec.path)),
            (_, Some(top)) => (top, if spec.path == "ipam" { "ipam.node_slice_size".to_string() } else { format!("{}.node_slice_size", spec.path) }),
            _ => continue,
        };
        if !crate::naming::is_object_name_part(base) {
            return Err(ConfigError::invalid(
                field,
                format!(
                    "node slices are recorded in a NodeSlicePool named after the network ({base:?}), which is not a valid object name; set ipam.network_name"
                ),
            ));
        }
        let mut slicing = crate::slices::slicing(range, size, &field, crate::slices::slice_pool_name(base, &first_cidr, range))?;
        slicing.max_entries = spec.node_slice_max_entries.or(top_max_entries);
        range.node_slicing = Some(slicing);
    }
    // Ranges of one network share its pools, and so must share its slices.
    for (i, range) in ranges.iter().enumerate() {
        if let Some(other) = ranges[..i].iter().find(|o| o.cidr == range.cidr && o.node_slicing != range.node_slicing) {
            return Err(ConfigError::invalid(
                format!("{}.node_slice_size", specs[i].path),
                format!(
                    "range {} is sliced differently from an earlier entry on the same network ({:?} against {:?})",
                    range.cidr,
                    range.node_slicing.as_ref().map(|s| s.prefix_len),
                    other.node_slicing.as_ref().map(|s| s.prefix_len)
                ),
            ));
        }
    }
    Ok(())
}

/// See `normalize` in the WIT.
pub fn normalize(network_config: &str, flat_file: Option<&str>, cni_args: &str) -> Result<NormalizedConfig> {
    let doc = parse_document(network_config, "network config")?;
    let net = locate(&doc)?;
    let ipam_type = gojson::string(net.ipam, "type", "ipam.type")?.unwrap_or_default();
    if !IPAM_TYPES.contains(&ipam_type.as_str()) {
        return Err(ConfigError::invalid(
            "ipam.type",
            format!("only interested in networks whose IPAM type is 'whereabouts' or 'thereabouts'. This one was: {ipam_type:?}"),
        ));
    }
    let args = cni_args::parse(cni_args)?;
    let flat = match flat_file {
        Some(text) => Some(parse_document(text, "flat-file config").map_err(|e| ConfigError::invalid("flat file", e.message))?),
        None => None,
    };
    let ipam = merge_flat_file(net.ipam, flat.as_ref());

    let network_name = gojson::string(&ipam, "network_name", "ipam.network_name")?.unwrap_or_default();
    if !network_name.is_empty() && !crate::naming::is_object_name_part(&network_name) {
        return Err(ConfigError::invalid(
            "ipam.network_name",
            format!("invalid network_name {network_name:?}: use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"),
        ));
    }
    let gateway = sloppy_ip(&ipam, "gateway", "ipam.gateway", "gateway IP")?;
    let specs = range_specs(&ipam)?;
    let mut ranges = specs.iter().map(|spec| normalize_range(spec, gateway, &network_name)).collect::<Result<Vec<_>>>()?;
    let slice_pool_base = if network_name.is_empty() { &net.name } else { &network_name };
    slice_ranges(&ipam, &specs, &mut ranges, slice_pool_base)?;
    let addresses = static_addresses(&ipam, &args)?;
    if ranges.is_empty() && addresses.is_empty() {
        return Err(ConfigError::invalid("ipam.ipRanges", "no address range configured: set ipam.ipRanges (or the legacy ipam.range)"));
    }
    assign_requested_ips(net.plugin, &mut ranges)?;
    check_addresses_fit_version(&net.cni_version, &ranges, &addresses)?;

    let (allow_persistent_ips, ipam_claim_reference) = persistent_ips(net.plugin, &ipam)?;
    let routes_json = routes::canonical_routes(&ipam)?;
    let dns_json = gojson::object(&ipam, "dns", "ipam.dns")?.map(|d| Value::Object(d.clone()).to_string());

    Ok(NormalizedConfig {
        name: net.name,
        cni_version: net.cni_version,
        enable_overlapping_ranges: gojson::boolean(&ipam, "enable_overlapping_ranges", "ipam.enable_overlapping_ranges")?.unwrap_or(true),
        network_name,
        ranges,
        ip_ranges_allocation: ranges_allocation(&ipam)?,
        preferred_ip_annotation: pr681_keys(&ipam)?,
        allow_persistent_ips,
        ipam_claim_reference,
        policies: crate::policies_config::policies(&ipam)?,
        addresses,
        routes_json,
        dns_json,
        pod_ref: args.pod_ref(),
        datastore: datastore_settings(&ipam)?,
        log_file: gojson::string(&ipam, "log_file", "ipam.log_file")?,
        log_level: gojson::string(&ipam, "log_level", "ipam.log_level")?,
        configuration_path: absolute_path(gojson::string(&ipam, "configuration_path", "ipam.configuration_path")?, "ipam.configuration_path")?,
    })
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
