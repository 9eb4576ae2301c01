//! Errors as CNI reports them: a code, the field at fault, and a message.

use std::fmt;

/// CNI error codes the engine can produce (CNI spec "Error codes").
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Invalid necessary environment variables (CNI_ARGS).
    pub const INVALID_ENV: u32 = 4;
    /// Failed to decode content (malformed JSON).
    pub const DECODE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_CONFIG: u32 = 7;
}

/// A problem with the input, carrying the CNI error code, the offending field
/// (a JSON path such as `ipam.ipRanges[1].range`, or a CNI_ARGS key) and a message
/// that names both the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error("{message}")]
pub struct ConfigError {
    pub code: u32,
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(code: u32, field: impl Into<String>, message: impl fmt::Display) -> Self {
        Self { code, field: field.into(), message: message.to_string() }
    }

    /// Invalid network config (code 7) for `field`; the message is prefixed with the field.
    pub fn invalid(field: impl Into<String>, detail: impl fmt::Display) -> Self {
        let field = field.into();
        let message = if field.is_empty() { detail.to_string() } else { format!("{field}: {detail}") };
        Self { code: code::INVALID_CONFIG, field, message }
    }
}

pub type Result<T, E = ConfigError> = std::result::Result<T, E>;
