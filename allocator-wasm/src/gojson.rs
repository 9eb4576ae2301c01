//! Reading JSON the way Go's `encoding/json` fills a struct, which is what
//! whereabouts configs are written against: object keys match field names
//! case-insensitively (an exact match wins), the last matching key in document
//! order wins, `null` leaves a field unset, unknown keys are ignored, and a value
//! of the wrong JSON type is an error.

use serde_json::{Map, Value};

use crate::error::{ConfigError, Result};

/// The value of field `name` in `object`, resolved like Go's decoder: every key
/// that equals the name ignoring ASCII case is decoded into the same field, so the
/// last such key in document order wins. `null` counts as absent.
pub fn field<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.iter().filter(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value).next_back().filter(|value| !value.is_null())
}

/// Describes a JSON value's type for error messages.
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong_type(path: &str, expected: &str, value: &Value) -> ConfigError {
    ConfigError::invalid(path, format!("expected {expected}, got {} ({value})", kind(value)))
}

/// A string field; absent, null and "" all mean "not set".
pub fn string(object: &Map<String, Value>, name: &str, path: &str) -> Result<Option<String>> {
    match field(object, name) {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(wrong_type(path, "a string", other)),
    }
}

pub fn boolean(object: &Map<String, Value>, name: &str, path: &str) -> Result<Option<bool>> {
    match field(object, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(path, "a boolean", other)),
    }
}

pub fn object<'a>(object: &'a Map<String, Value>, name: &str, path: &str) -> Result<Option<&'a Map<String, Value>>> {
    match field(object, name) {
        None => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(other) => Err(wrong_type(path, "an object", other)),
    }
}

pub fn array<'a>(object: &'a Map<String, Value>, name: &str, path: &str) -> Result<Option<&'a Vec<Value>>> {
    match field(object, name) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(other) => Err(wrong_type(path, "an array", other)),
    }
}

/// An array of strings (e.g. `exclude`).
pub fn strings(object: &Map<String, Value>, name: &str, path: &str) -> Result<Vec<String>> {
    let Some(items) = array(object, name, path)? else { return Ok(Vec::new()) };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.clone()),
            other => Err(wrong_type(&format!("{path}[{i}]"), "a string", other)),
        })
        .collect()
}

/// Go's zero-value test, used by the flat-file merge ("fill only empty fields").
pub fn is_empty(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::Bool(b)) => !b,
        Some(Value::Object(o)) => o.values().all(|v| is_empty(Some(v))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn keys_match_case_insensitively() {
        let o = obj(json!({"Range": "192.0.2.0/24", "IPRANGES": []}));
        assert_eq!(string(&o, "range", "ipam.range").unwrap().as_deref(), Some("192.0.2.0/24"));
        assert!(array(&o, "ipRanges", "ipam.ipRanges").unwrap().is_some());
    }

    #[test]
    fn last_matching_key_wins() {
        let o: Map<String, Value> = serde_json::from_str(r#"{"range":"a","RANGE":"b"}"#).unwrap();
        assert_eq!(string(&o, "range", "r").unwrap().as_deref(), Some("b"));
        let o: Map<String, Value> = serde_json::from_str(r#"{"range":"a","range":"c"}"#).unwrap();
        assert_eq!(string(&o, "range", "r").unwrap().as_deref(), Some("c"));
    }

    #[test]
    fn null_and_empty_mean_unset_and_wrong_types_are_errors() {
        let o = obj(json!({"range": null, "gateway": "", "exclude": 5}));
        assert_eq!(string(&o, "range", "ipam.range").unwrap(), None);
        assert_eq!(string(&o, "gateway", "ipam.gateway").unwrap(), None);
        let err = strings(&o, "exclude", "ipam.exclude").unwrap_err();
        assert_eq!(err.code, 7);
        assert_eq!(err.field, "ipam.exclude");
        assert!(err.message.contains("expected an array"), "{}", err.message);
    }
}
