//! The CNI error result: `{"cniVersion", "code", "msg", "details"}` printed on
//! stdout with a non-zero exit (CNI spec "Error"), the codes we use, and the one
//! place where the other layers' errors get a code. Like libcni's skel, the
//! layers below keep typed errors; what has no better code becomes 999.

use serde_json::{Map, Value};
use thereabouts_allocator::ConfigError;

use crate::component::EngineFailure;
use crate::datastore::DatastoreError;
use crate::ipam::IpamError;
use crate::network_config::ConfigLoadError;
use crate::policy::failure::{CallFailure, PolicyStop};

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
        crate::json::pretty(&Value::Object(doc))
    }
}

/// The field a config error names goes to `details`, so tools can point at it
/// without parsing the message.
fn field_details(field: &str) -> String {
    if field.is_empty() { String::new() } else { format!("field: {field}") }
}

impl From<ConfigError> for CniError {
    /// The engine already chose the CNI code (1, 4, 6 or 7); the field goes to details
    /// so tools can point at it without parsing the message.
    fn from(e: ConfigError) -> Self {
        Self { code: e.code, details: field_details(&e.field), msg: e.message }
    }
}

impl From<EngineFailure> for CniError {
    fn from(e: EngineFailure) -> Self {
        CniError::new(code::INTERNAL, e.to_string())
    }
}

impl From<ConfigLoadError> for CniError {
    fn from(e: ConfigLoadError) -> Self {
        match e {
            ConfigLoadError::Invalid(e) => e.into(),
            ConfigLoadError::Engine(e) => e.into(),
            ConfigLoadError::FlatFile { ref path, .. } => CniError::new(code::INVALID_CONFIG, e.to_string()).with_details(path.display().to_string()),
        }
    }
}

/// 11 ("try again later") for what may heal by itself, 7 for a datastore that is
/// wrong in the config, 999 otherwise.
fn datastore_code(e: &DatastoreError) -> u32 {
    match e {
        DatastoreError::Timeout { .. } | DatastoreError::Io { .. } | DatastoreError::Unavailable { .. } | DatastoreError::NoSlice { .. } => {
            code::TRY_AGAIN_LATER
        }
        DatastoreError::NotADirectory { .. } | DatastoreError::Unconfigured { .. } | DatastoreError::Kubeconfig { .. } | DatastoreError::EtcdConfig { .. } => {
            code::INVALID_CONFIG
        }
        DatastoreError::Corrupt { .. }
        | DatastoreError::Inconsistent { .. }
        | DatastoreError::Denied { .. }
        | DatastoreError::Rejected { .. }
        | DatastoreError::Malformed { .. }
        | DatastoreError::PoolTooLarge { .. } => code::INTERNAL,
    }
}

impl From<DatastoreError> for CniError {
    fn from(e: DatastoreError) -> Self {
        let details = match &e {
            DatastoreError::Unconfigured { field, .. } => field_details(field),
            _ => String::new(),
        };
        CniError::new(datastore_code(&e), e.to_string()).with_details(details)
    }
}

impl From<IpamError> for CniError {
    fn from(e: IpamError) -> Self {
        match e {
            IpamError::Datastore(e) => e.into(),
            IpamError::Engine(e) => e.into(),
            IpamError::Policy(stop) => stop.into(),
            IpamError::Unplaceable { .. } | IpamError::EngineAnswer { .. } | IpamError::SlicesFull { .. } => CniError::new(code::INTERNAL, e.to_string()),
        }
    }
}

/// A policy that cannot be used as configured (not compiled, untrusted,
/// settings it rejects) is a config problem (7); one that failed or refused
/// during the ADD is not (999). The message names the policy, the hook and
/// what happened.
impl From<PolicyStop> for CniError {
    fn from(stop: PolicyStop) -> Self {
        let config_problem = match &stop {
            PolicyStop::Load { .. } => true,
            PolicyStop::Failed(e) => matches!(e.failure, CallFailure::BadSettings(_)),
            PolicyStop::Vetoed { .. } | PolicyStop::PodUnreadable { .. } | PolicyStop::Sandbox(_) => false,
        };
        CniError::new(if config_problem { code::INVALID_CONFIG } else { code::INTERNAL }, stop.to_string())
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
    fn datastore_errors_get_the_code_of_what_the_runtime_should_do() {
        let busy = DatastoreError::Timeout { what: "ADD".into() };
        assert_eq!(CniError::from(busy).code, code::TRY_AGAIN_LATER);
        let unset = CniError::from(DatastoreError::Unconfigured { field: "ipam.datastore", message: "ipam.datastore is not set".into() });
        assert_eq!((unset.code, unset.msg.as_str(), unset.details.as_str()), (7, "ipam.datastore is not set", "field: ipam.datastore"));
        let denied = DatastoreError::Denied { server: "s".into(), action: "a".into(), detail: "d".into() };
        assert_eq!(CniError::from(IpamError::from(denied)).code, code::INTERNAL);
    }

    #[test]
    fn config_errors_keep_their_code() {
        let e: CniError = ConfigError::new(thereabouts_allocator::error::code::INCOMPATIBLE_VERSION, "cniVersion", "incompatible").into();
        assert_eq!((e.code, e.msg.as_str(), e.details.as_str()), (1, "incompatible", "field: cniVersion"));
    }
}
