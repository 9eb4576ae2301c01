//! The IPAM result in the shape each CNI spec version defines:
//! - 0.1.0 / 0.2.0: one `ip4` and one `ip6` object, routes split by family, `dns` always;
//! - 0.3.0 / 0.3.1 / 0.4.0: `ips[]` with `"version": "4" | "6"`, `dns` always;
//! - 1.0.0 / 1.1.0: `ips[]` without `version`, `dns` only when it says something.
//!
//! IPAM plugins return no `interfaces` and no `ips[].interface`. The output is
//! pretty-printed with a 4-space indent, as the reference library prints it.

use serde_json::{Map, Value};
use thereabouts_allocator::ip::Family;

use super::error::{CniError, code};
use crate::json::pretty;

/// One address of the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// `ip/prefix`.
    pub address: String,
    pub gateway: Option<String>,
    pub family: Family,
}

/// What an ADD hands back, independent of the spec version.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IpamResult {
    /// Allocated addresses in range order, then static addresses.
    pub ips: Vec<IpConfig>,
    /// `ipam.routes` as the engine canonicalized them.
    pub routes: Vec<Value>,
    /// `ipam.dns` as configured.
    pub dns: Option<Map<String, Value>>,
}

/// The three result layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// 0.1.0, 0.2.0.
    PerFamily,
    /// 0.3.0, 0.3.1, 0.4.0.
    VersionedIps,
    /// 1.0.0 and later.
    Ips,
}

fn layout(cni_version: &str) -> Layout {
    match cni_version {
        "0.1.0" | "0.2.0" | "" => Layout::PerFamily,
        "0.3.0" | "0.3.1" | "0.4.0" => Layout::VersionedIps,
        _ => Layout::Ips,
    }
}

/// A route as whereabouts' result carries it in `layout`. The engine already
/// reduced each route to the fields of CNI's `types.Route` in canonical text;
/// libcni v1.3.0 (whereabouts v0.9.4's) then keeps all of them for 0.3.0 to 1.1.0
/// (`Route.Copy` in `convertTo04x`, and `convertFrom100` for 1.0.0, in
/// `pkg/types/100/types.go`), and only `dst` and `gw` for 0.1.0/0.2.0
/// (`convertTo02x` in `pkg/types/040/types.go`).
fn route_for(route: &Value, layout: Layout) -> Value {
    match route {
        Value::Object(fields) if layout == Layout::PerFamily => {
            Value::Object(fields.iter().filter(|(k, _)| *k == "dst" || *k == "gw").map(|(k, v)| (k.clone(), v.clone())).collect())
        }
        other => other.clone(),
    }
}

/// The family of a route's destination (`dst` is validated as a CIDR by the engine).
fn route_family(route: &Value) -> Family {
    let dst = route.get("dst").and_then(Value::as_str).unwrap_or_default();
    if dst.contains(':') { Family::V6 } else { Family::V4 }
}

/// Whether a DNS object carries anything (1.x omits an empty one).
fn dns_has_content(dns: &Map<String, Value>) -> bool {
    dns.values().any(|v| match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    })
}

impl IpamResult {
    /// The result document for `cni_version` (the config's version, echoed).
    pub fn to_value(&self, cni_version: &str) -> Result<Value, CniError> {
        let mut doc = Map::new();
        doc.insert("cniVersion".into(), Value::from(cni_version));
        let routes: Vec<Value> = self.routes.iter().map(|r| route_for(r, layout(cni_version))).collect();
        let dns = self.dns.clone().unwrap_or_default();
        match layout(cni_version) {
            Layout::PerFamily => {
                // Like the reference down-conversion: first address of each family,
                // each route in the object of its destination's family.
                let mut any = false;
                for (family, key) in [(Family::V4, "ip4"), (Family::V6, "ip6")] {
                    let Some(ip) = self.ips.iter().find(|ip| ip.family == family) else { continue };
                    any = true;
                    let mut object = Map::new();
                    object.insert("ip".into(), Value::from(ip.address.as_str()));
                    if let Some(gw) = &ip.gateway {
                        object.insert("gateway".into(), Value::from(gw.as_str()));
                    }
                    let family_routes: Vec<Value> = routes.iter().filter(|r| route_family(r) == family).cloned().collect();
                    if !family_routes.is_empty() {
                        object.insert("routes".into(), Value::Array(family_routes));
                    }
                    doc.insert(key.into(), Value::Object(object));
                }
                if !any {
                    return Err(CniError::new(code::INTERNAL, "cannot convert: no valid IP addresses"));
                }
                doc.insert("dns".into(), Value::Object(dns));
            }
            Layout::VersionedIps | Layout::Ips => {
                let versioned = layout(cni_version) == Layout::VersionedIps;
                let ips = self
                    .ips
                    .iter()
                    .map(|ip| {
                        let mut object = Map::new();
                        if versioned {
                            object.insert("version".into(), Value::from(ip.family.number().to_string()));
                        }
                        object.insert("address".into(), Value::from(ip.address.as_str()));
                        if let Some(gw) = &ip.gateway {
                            object.insert("gateway".into(), Value::from(gw.as_str()));
                        }
                        Value::Object(object)
                    })
                    .collect();
                doc.insert("ips".into(), Value::Array(ips));
                if !routes.is_empty() {
                    doc.insert("routes".into(), Value::Array(routes));
                }
                if versioned || dns_has_content(&dns) {
                    doc.insert("dns".into(), Value::Object(dns));
                }
            }
        }
        Ok(Value::Object(doc))
    }

    pub fn to_json(&self, cni_version: &str) -> Result<String, CniError> {
        Ok(pretty(&self.to_value(cni_version)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dual_stack() -> IpamResult {
        IpamResult {
            ips: vec![
                IpConfig { address: "192.0.2.1/24".into(), gateway: Some("192.0.2.254".into()), family: Family::V4 },
                IpConfig { address: "2001:db8::1/64".into(), gateway: None, family: Family::V6 },
                IpConfig { address: "198.51.100.7/24".into(), gateway: None, family: Family::V4 },
            ],
            routes: vec![json!({"dst": "0.0.0.0/0", "gw": "192.0.2.254", "mtu": 1400}), json!({"dst": "::/0"})],
            dns: None,
        }
    }

    #[test]
    fn legacy_versions_use_one_object_per_family() {
        for version in ["0.1.0", "0.2.0"] {
            let v = dual_stack().to_value(version).unwrap();
            assert_eq!(
                v,
                json!({
                    "cniVersion": version,
                    "ip4": {"ip": "192.0.2.1/24", "gateway": "192.0.2.254", "routes": [{"dst": "0.0.0.0/0", "gw": "192.0.2.254"}]},
                    "ip6": {"ip": "2001:db8::1/64", "routes": [{"dst": "::/0"}]},
                    "dns": {}
                })
            );
        }
    }

    #[test]
    fn versions_0_3_and_0_4_tag_each_ip_and_always_carry_dns() {
        for version in ["0.3.0", "0.3.1", "0.4.0"] {
            let v = dual_stack().to_value(version).unwrap();
            assert_eq!(v["cniVersion"], version);
            assert_eq!(v["ips"][0], json!({"version": "4", "address": "192.0.2.1/24", "gateway": "192.0.2.254"}));
            assert_eq!(v["ips"][1], json!({"version": "6", "address": "2001:db8::1/64"}));
            assert_eq!(v["ips"].as_array().unwrap().len(), 3);
            assert_eq!(v["routes"][0], json!({"dst": "0.0.0.0/0", "gw": "192.0.2.254", "mtu": 1400}), "libcni keeps every route field");
            assert_eq!(v["dns"], json!({}));
            assert!(v.get("interfaces").is_none());
        }
    }

    #[test]
    fn version_1_drops_version_field_and_empty_dns() {
        let v = dual_stack().to_value("1.0.0").unwrap();
        assert_eq!(v["ips"][1], json!({"address": "2001:db8::1/64"}));
        assert!(v.get("dns").is_none());
        // The 1.1.0 route fields survive in 1.0.0 and 1.1.0 output, as in whereabouts'.
        assert_eq!(v["routes"][0], json!({"dst": "0.0.0.0/0", "gw": "192.0.2.254", "mtu": 1400}));
        let v = dual_stack().to_value("1.1.0").unwrap();
        assert_eq!(v["routes"][0]["mtu"], 1400);
        let mut with_dns = dual_stack();
        with_dns.dns = Some(json!({"nameservers": ["192.0.2.53"]}).as_object().unwrap().clone());
        assert_eq!(with_dns.to_value("1.1.0").unwrap()["dns"], json!({"nameservers": ["192.0.2.53"]}));
        with_dns.dns = Some(json!({"nameservers": []}).as_object().unwrap().clone());
        assert!(with_dns.to_value("1.1.0").unwrap().get("dns").is_none());
    }

    #[test]
    fn routes_are_omitted_when_empty_and_output_is_indented() {
        let mut r = dual_stack();
        r.routes.clear();
        let text = r.to_json("0.4.0").unwrap();
        assert!(!text.contains("routes"));
        assert!(text.starts_with("{\n    \"cniVersion\": \"0.4.0\""));
        assert!(text.ends_with("}\n"));
        let v = r.to_value("0.2.0").unwrap();
        assert!(v["ip4"].get("routes").is_none());
    }

    #[test]
    fn a_legacy_result_needs_an_address() {
        let e = IpamResult::default().to_value("0.2.0").unwrap_err();
        assert_eq!(e.msg, "cannot convert: no valid IP addresses");
    }
}
