//! The CNI error result: `{"cniVersion", "code", "msg", "details"}` printed on
//! stdout with a non-zero exit (CNI spec "Error"), and the codes we use.

use serde_json::{Map, Value};
use thereabouts_allocator::ConfigError;

/// Well-known CNI error codes (spec "Error codes") and libcni's internal code.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const INTERNAL: u32 = 999;
}

/// An error as the runtime will see it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    /// Extra context (the offending value, the underlying OS error); may be empty.
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self { code, msg: msg.into(), details: String::new() }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The error document. `cni_version` is the config's version when it is known;
    /// skel omits the field, the spec shows it, so it is included only when known.
    pub fn to_json(&self, cni_version: Option<&str>) -> String {
        let mut doc = Map::new();
        if let Some(version) = cni_version {
            doc.insert("cniVersion".into(), Value::from(version));
        }
        doc.insert("code".into(), Value::from(self.code));
        doc.insert("msg".into(), Value::from(self.msg.as_str()));
        if !self.details.is_empty() {
            doc.insert("details".into(), Value::from(self.details.as_str()));
        }
        crate::cni::result::pretty(&Value::Object(doc))
    }
}

impl From<ConfigError> for CniError {
    /// The engine already chose the CNI code (1, 4, 6 or 7); the field goes to details
    /// so tools can point at it without parsing the message.
    fn from(e: ConfigError) -> Self {
        let details = if e.field.is_empty() { String::new() } else { format!("field: {}", e.field) };
        Self { code: e.code, msg: e.message, details }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_code_msg_and_optional_fields() {
        let e = CniError::new(code::INVALID_CONFIG, "bad range").with_details("ipam.range");
        let v: Value = serde_json::from_str(&e.to_json(Some("1.0.0"))).unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["code"], 7);
        assert_eq!(v["msg"], "bad range");
        assert_eq!(v["details"], "ipam.range");
        let v: Value = serde_json::from_str(&CniError::new(4, "x").to_json(None)).unwrap();
        assert!(v.get("cniVersion").is_none() && v.get("details").is_none());
    }

    #[test]
    fn config_errors_keep_their_code() {
        let e: CniError = ConfigError::new(thereabouts_allocator::error::code::INCOMPATIBLE_VERSION, "cniVersion", "incompatible").into();
        assert_eq!((e.code, e.msg.as_str(), e.details.as_str()), (1, "incompatible", "field: cniVersion"));
    }
}
