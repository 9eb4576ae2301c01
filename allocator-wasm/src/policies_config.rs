//! `ipam.policies`: the list of policy extensions a network runs, validated and
//! with defaults filled in (see `policy-config` in the WIT). Keys match the way
//! every other `ipam` key does (Go-like, case-insensitive, see [`crate::gojson`]),
//! but an unknown key inside an entry is an error: a misspelt `timeout_ms` would
//! otherwise silently run the policy with the default budget.

use serde_json::{Map, Value};

use crate::error::{ConfigError, Result};
use crate::gojson;
use crate::model::{PolicyConfig, PolicyMode, PolicyOnError};

/// The keys of one entry, as the docs spell them.
const KEYS: [&str; 7] = ["name", "path", "settings", "timeout_ms", "memory_mib", "on_error", "mode"];

const DEFAULT_TIMEOUT_MS: u32 = 10;
const TIMEOUT_MS: (u32, u32) = (1, 1000);
const DEFAULT_MEMORY_MIB: u32 = 4;
const MEMORY_MIB: (u32, u32) = (1, 64);

/// `policies` of the merged `ipam` section (the flat file's when the inline one
/// has none), in order; empty without.
pub fn policies(ipam: &Map<String, Value>) -> Result<Vec<PolicyConfig>> {
    let Some(entries) = gojson::array(ipam, "policies", "ipam.policies")? else { return Ok(Vec::new()) };
    let mut out: Vec<PolicyConfig> = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let path = format!("ipam.policies[{i}]");
        let Value::Object(entry) = entry else {
            return Err(ConfigError::invalid(&path, format!("expected an object, got {}", gojson::kind(entry))));
        };
        let policy = policy(entry, &path)?;
        if let Some(earlier) = out.iter().position(|p| p.name == policy.name) {
            return Err(ConfigError::invalid(
                format!("{path}.name"),
                format!("duplicate policy name {:?} (also ipam.policies[{earlier}].name): names must be unique", policy.name),
            ));
        }
        out.push(policy);
    }
    Ok(out)
}

fn policy(entry: &Map<String, Value>, path: &str) -> Result<PolicyConfig> {
    if let Some(unknown) = entry.keys().find(|k| !KEYS.iter().any(|known| k.eq_ignore_ascii_case(known))) {
        return Err(ConfigError::invalid(format!("{path}.{unknown}"), format!("unknown field {unknown:?}; a policy has {}", KEYS.join(", "))));
    }
    let field = |key: &str| format!("{path}.{key}");
    let name = gojson::string(entry, "name", &field("name"))?.ok_or_else(|| ConfigError::invalid(field("name"), "missing policy name"))?;
    let file = gojson::string(entry, "path", &field("path"))?.ok_or_else(|| {
        ConfigError::invalid(field("path"), format!("missing path of policy {name:?} (the policy component, e.g. \"/opt/cni/policies/zone.wasm\")"))
    })?;
    // Relative paths would resolve against the runtime's working directory, which
    // nobody controls: the precompiled artifact must be found by the same name.
    if !file.starts_with('/') {
        return Err(ConfigError::invalid(field("path"), format!("policy path {file:?} is not absolute")));
    }
    Ok(PolicyConfig {
        settings: gojson::field(entry, "settings").map_or_else(|| "{}".to_string(), Value::to_string),
        timeout_ms: bounded(entry, "timeout_ms", &field("timeout_ms"), DEFAULT_TIMEOUT_MS, TIMEOUT_MS)?,
        memory_mib: bounded(entry, "memory_mib", &field("memory_mib"), DEFAULT_MEMORY_MIB, MEMORY_MIB)?,
        on_error: match choice(entry, "on_error", &field("on_error"), &["deny", "ignore"])? {
            Some("ignore") => PolicyOnError::Ignore,
            _ => PolicyOnError::Deny,
        },
        mode: match choice(entry, "mode", &field("mode"), &["enforce", "monitor"])? {
            Some("monitor") => PolicyMode::Monitor,
            _ => PolicyMode::Enforce,
        },
        name,
        path: file,
    })
}

/// An integer in `lo..=hi`, `default` when absent.
fn bounded(entry: &Map<String, Value>, key: &str, path: &str, default: u32, (lo, hi): (u32, u32)) -> Result<u32> {
    match gojson::field(entry, key) {
        None => Ok(default),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .filter(|v| (lo..=hi).contains(v))
            .ok_or_else(|| ConfigError::invalid(path, format!("must be an integer from {lo} to {hi}, got {n}"))),
        Some(other) => Err(ConfigError::invalid(path, format!("expected a number, got {} ({other})", gojson::kind(other)))),
    }
}

/// One of `allowed` (exactly), or `None` when absent or "".
fn choice<'a>(entry: &Map<String, Value>, key: &str, path: &str, allowed: &[&'a str]) -> Result<Option<&'a str>> {
    let Some(value) = gojson::string(entry, key, path)? else { return Ok(None) };
    match allowed.iter().find(|a| **a == value) {
        Some(found) => Ok(Some(*found)),
        None => Err(ConfigError::invalid(path, format!("unknown value {value:?}; choose one of {allowed:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(list: Value) -> Result<Vec<PolicyConfig>> {
        policies(json!({ "policies": list }).as_object().expect("an object"))
    }

    /// The error's field and message for one bad `policies` value.
    fn fails(list: Value) -> (String, String) {
        let e = parse(list).expect_err("should be rejected");
        assert_eq!(e.code, 7, "{e:?}");
        (e.field, e.message)
    }

    #[test]
    fn defaults_fill_everything_but_name_and_path() {
        let got = parse(json!([{"name": "zone", "path": "/opt/zone.wasm"}])).unwrap();
        let want = PolicyConfig {
            name: "zone".into(),
            path: "/opt/zone.wasm".into(),
            settings: "{}".into(),
            timeout_ms: 10,
            memory_mib: 4,
            on_error: PolicyOnError::Deny,
            mode: PolicyMode::Enforce,
        };
        assert_eq!(got, [want]);
        assert!(policies(&Map::new()).unwrap().is_empty());
    }

    #[test]
    fn every_field_is_read_and_settings_kept_as_compact_json() {
        let got = parse(json!([{
            "name": "a", "path": "/p/a.wasm", "settings": {"zones": ["x", "y"], "n": 1},
            "timeout_ms": 1000, "memory_mib": 64, "on_error": "ignore", "mode": "monitor"
        }, {"NAME": "b", "Path": "/p/b.wasm", "settings": 5}]))
        .unwrap();
        assert_eq!(got[0].settings, r#"{"zones":["x","y"],"n":1}"#);
        assert_eq!((got[0].timeout_ms, got[0].memory_mib, got[0].on_error, got[0].mode), (1000, 64, PolicyOnError::Ignore, PolicyMode::Monitor));
        assert_eq!((got[1].name.as_str(), got[1].settings.as_str()), ("b", "5"));
    }

    #[test]
    fn the_list_and_its_entries_must_have_the_right_json_types() {
        let e = parse(json!({"name": "a"})).unwrap_err();
        assert_eq!((e.field.as_str(), e.message.contains("expected an array")), ("ipam.policies", true), "{}", e.message);
        assert_eq!(fails(json!(["zone"])), ("ipam.policies[0]".into(), "ipam.policies[0]: expected an object, got a string".into()));
        let (field, message) = fails(json!([{"name": 5, "path": "/a"}]));
        assert_eq!(field, "ipam.policies[0].name");
        assert!(message.contains("expected a string"), "{message}");
    }

    #[test]
    fn name_is_required_and_unique() {
        assert_eq!(fails(json!([{"path": "/a"}])).0, "ipam.policies[0].name");
        assert_eq!(fails(json!([{"name": "", "path": "/a"}])).0, "ipam.policies[0].name");
        let (field, message) = fails(json!([{"name": "a", "path": "/a"}, {"name": "a", "path": "/b"}]));
        assert_eq!(field, "ipam.policies[1].name");
        assert!(message.contains("duplicate policy name \"a\" (also ipam.policies[0].name)"), "{message}");
    }

    #[test]
    fn path_is_required_and_absolute() {
        assert_eq!(fails(json!([{"name": "a"}])).0, "ipam.policies[0].path");
        let (field, message) = fails(json!([{"name": "a", "path": "policies/a.wasm"}]));
        assert_eq!(field, "ipam.policies[0].path");
        assert!(message.contains("\"policies/a.wasm\" is not absolute"), "{message}");
    }

    #[test]
    fn limits_must_be_integers_in_range() {
        let entry = |key: &str, value: Value| json!([{"name": "a", "path": "/a", key: value}]);
        for (key, bad, want) in [
            ("timeout_ms", json!(0), "from 1 to 1000, got 0"),
            ("timeout_ms", json!(1001), "got 1001"),
            ("timeout_ms", json!(2.5), "got 2.5"),
            ("timeout_ms", json!(-1), "got -1"),
            ("memory_mib", json!(65), "from 1 to 64, got 65"),
            ("memory_mib", json!("4"), "expected a number, got a string"),
        ] {
            let (field, message) = fails(entry(key, bad));
            assert_eq!(field, format!("ipam.policies[0].{key}"));
            assert!(message.contains(want), "{key}: {message}");
        }
    }

    #[test]
    fn on_error_and_mode_take_only_their_values() {
        let (field, message) = fails(json!([{"name": "a", "path": "/a", "on_error": "allow"}]));
        assert_eq!(field, "ipam.policies[0].on_error");
        assert!(message.contains("unknown value \"allow\"") && message.contains("\"deny\", \"ignore\""), "{message}");
        let (field, message) = fails(json!([{"name": "a", "path": "/a", "mode": "Monitor"}]));
        assert_eq!(field, "ipam.policies[0].mode");
        assert!(message.contains("\"Monitor\""), "{message}");
    }

    #[test]
    fn an_unknown_key_is_named() {
        let (field, message) = fails(json!([{"name": "a", "path": "/a"}, {"name": "b", "path": "/b", "timeoutms": 5}]));
        assert_eq!(field, "ipam.policies[1].timeoutms");
        assert!(message.contains("unknown field \"timeoutms\""), "{message}");
    }
}
