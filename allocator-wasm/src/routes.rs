//! `ipam.routes` → the routes of the result, exactly as whereabouts v0.9.4 prints
//! them for the same config.
//!
//! whereabouts decodes `routes` into `[]*types.Route` of containernetworking/cni
//! v1.3.0 when it loads the config (`IPAMConfig.Routes` in whereabouts'
//! `pkg/types/types.go`), and its result prints those decoded values. What that
//! means is fixed by cni's `pkg/types/types.go` (`Route`, its JSON twin `route`,
//! `IPNet`, `ParseCIDR`), which this module matches:
//! - the known keys are `dst`, `gw`, `mtu`, `advmss`, `priority`, `table` and
//!   `scope` (matched case-insensitively, the last duplicate winning, like every
//!   Go struct field), printed in that order; any other key is dropped;
//! - `dst` is parsed by `types.ParseCIDR` (`net.ParseCIDR` with the host bits
//!   put back) and printed by `net.IPNet.String()`: `3ffe:ffff:0:01ff::1/64`
//!   comes back as `3ffe:ffff:0:1ff::1/64`;
//! - `gw` is a `net.IP`: `net.ParseIP` (no IPv4 leading zeros, no zone), printed
//!   by `net.IP.String()` (`::ffff:192.0.2.1` is `192.0.2.1`); empty means none;
//! - `mtu`, `advmss` and `priority` are Go `int`s with `omitempty` (0 is not
//!   printed); `table` and `scope` are `*int` (printed whenever set, 0 too);
//! - a value Go cannot decode (bad text, a string for a number, a fraction) fails
//!   whereabouts' load, so it is a config error here (code 7) naming the field.
//!
//! Which of these fields each result version carries is the host's business
//! (`host/src/cni/result.rs`). Two deliberate differences: a route without `dst`
//! (whereabouts prints `"dst": "<nil>"`) and a `null` route (printed as `null`,
//! on which libcni's 0.2.0 conversion dereferences nil) are refused.

use serde_json::{Map, Value};

use crate::error::{ConfigError, Result};
use crate::gojson;
use crate::ip::{self, format_ip};

/// `int` fields with `omitempty`: printed unless 0.
const INT_FIELDS: [&str; 3] = ["mtu", "advmss", "priority"];
/// `*int` fields: printed whenever set.
const OPTIONAL_INT_FIELDS: [&str; 2] = ["table", "scope"];

/// The routes of `ipam` (absent: `None`) as the canonical JSON array text.
pub fn canonical_routes(ipam: &Map<String, Value>) -> Result<Option<String>> {
    let Some(items) = gojson::array(ipam, "routes", "ipam.routes")? else { return Ok(None) };
    let routes = items.iter().enumerate().map(|(i, route)| canonical_route(route, &format!("ipam.routes[{i}]"))).collect::<Result<Vec<_>>>()?;
    Ok(Some(Value::Array(routes).to_string()))
}

fn canonical_route(route: &Value, path: &str) -> Result<Value> {
    let Value::Object(route) = route else {
        return Err(ConfigError::invalid(path, format!("expected an object with \"dst\", got {}", gojson::kind(route))));
    };
    let mut out = Map::new();
    let dst_path = format!("{path}.dst");
    let dst = gojson::string(route, "dst", &dst_path)?.ok_or_else(|| ConfigError::invalid(&dst_path, "missing dst"))?;
    let cidr = ip::parse_cidr(&dst, false).ok_or_else(|| ConfigError::invalid(&dst_path, format!("invalid CIDR {dst:?}")))?;
    out.insert("dst".into(), Value::from(cidr.text()));
    let gw_path = format!("{path}.gw");
    if let Some(gw) = gojson::string(route, "gw", &gw_path)? {
        let parsed = ip::parse_ip_strict(&gw).ok_or_else(|| ConfigError::invalid(&gw_path, format!("invalid IP address {gw:?}")))?;
        out.insert("gw".into(), Value::from(format_ip(parsed)));
    }
    for key in INT_FIELDS {
        if let Some(n) = go_int(route, key, path)?.filter(|n| *n != 0) {
            out.insert(key.into(), Value::from(n));
        }
    }
    for key in OPTIONAL_INT_FIELDS {
        if let Some(n) = go_int(route, key, path)? {
            out.insert(key.into(), Value::from(n));
        }
    }
    Ok(Value::Object(out))
}

/// A Go `int` field (64-bit): an integer literal that fits; `null` is unset.
fn go_int(route: &Map<String, Value>, key: &str, path: &str) -> Result<Option<i64>> {
    match gojson::field(route, key) {
        None => Ok(None),
        Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64()),
        Some(other) => Err(ConfigError::invalid(format!("{path}.{key}"), format!("expected an integer, got {} ({other})", gojson::kind(other)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn routes(value: Value) -> Result<Option<String>> {
        canonical_routes(json!({ "routes": value }).as_object().unwrap())
    }

    #[test]
    fn dst_and_gw_come_back_in_go_canonical_text() {
        let got = routes(json!([
            {"dst": "3ffe:ffff:0:01ff::1/64", "gw": "3ffe:ffff:0:01ff::fffe"},
            {"dst": "2001:DB8::/32"},
            {"dst": "198.51.100.7/24", "gw": "::ffff:192.0.2.1"},
            {"dst": "::ffff:203.0.113.0/120"}
        ]));
        let want = json!([
            {"dst": "3ffe:ffff:0:1ff::1/64", "gw": "3ffe:ffff:0:1ff::fffe"},
            {"dst": "2001:db8::/32"},
            {"dst": "198.51.100.7/24", "gw": "192.0.2.1"},
            {"dst": "203.0.113.0/24"}
        ]);
        assert_eq!(got.unwrap().as_deref(), Some(want.to_string().as_str()));
    }

    #[test]
    fn known_fields_are_kept_in_order_and_unknown_keys_dropped() {
        let got = routes(json!([{"Scope": 0, "table": 100, "priority": 0, "advmss": null, "MTU": 1400, "gw": "", "note": "x", "dst": "0.0.0.0/0"}]));
        assert_eq!(got.unwrap().as_deref(), Some(r#"[{"dst":"0.0.0.0/0","mtu":1400,"table":100,"scope":0}]"#));
        assert_eq!(routes(json!([])).unwrap().as_deref(), Some("[]"));
        assert_eq!(canonical_routes(&Map::new()).unwrap(), None);
    }

    #[test]
    fn what_go_cannot_decode_is_a_config_error_naming_the_field() {
        for (route, field) in [
            (json!({"dst": "0.0.0.0/0", "gw": "192.0.2.001"}), "ipam.routes[0].gw"),
            (json!({"dst": "192.0.2.0/24", "gw": "fe80::1%eth0"}), "ipam.routes[0].gw"),
            (json!({"dst": "192.0.2.010/24"}), "ipam.routes[0].dst"),
            (json!({"dst": "192.0.2.0"}), "ipam.routes[0].dst"),
            (json!({"dst": 5}), "ipam.routes[0].dst"),
            (json!({"gw": "192.0.2.1"}), "ipam.routes[0].dst"),
            (json!({"dst": "0.0.0.0/0", "mtu": "1400"}), "ipam.routes[0].mtu"),
            (json!({"dst": "0.0.0.0/0", "table": 1.5}), "ipam.routes[0].table"),
            (json!({"dst": "0.0.0.0/0", "priority": 1e3}), "ipam.routes[0].priority"),
            (json!({"dst": "0.0.0.0/0", "advmss": 18446744073709551615u64}), "ipam.routes[0].advmss"),
            (Value::Null, "ipam.routes[0]"),
        ] {
            let e = routes(json!([route])).unwrap_err();
            assert_eq!((e.code, e.field.as_str()), (7, field), "{route}: {}", e.message);
        }
        assert_eq!(routes(json!({"dst": "0.0.0.0/0"})).unwrap_err().field, "ipam.routes");
    }
}
