//! Errors as CNI reports them: a code, the field at fault, and a message.

use std::fmt;

/// The CNI error codes the engine can produce (CNI spec "Error codes"): a closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// 1: incompatible CNI version.
    IncompatibleVersion,
    /// 4: invalid necessary environment variables (CNI_ARGS).
    InvalidEnv,
    /// 6: failed to decode content (malformed JSON).
    Decode,
    /// 7: invalid network config.
    InvalidConfig,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 4] = [ErrorCode::IncompatibleVersion, ErrorCode::InvalidEnv, ErrorCode::Decode, ErrorCode::InvalidConfig];

    /// The number CNI error documents carry.
    pub fn number(self) -> u32 {
        match self {
            ErrorCode::IncompatibleVersion => 1,
            ErrorCode::InvalidEnv => 4,
            ErrorCode::Decode => 6,
            ErrorCode::InvalidConfig => 7,
        }
    }

    pub fn from_number(number: u32) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.number() == number)
    }
}

/// The codes by their CNI spec names.
pub mod code {
    use super::ErrorCode;
    pub const INCOMPATIBLE_VERSION: ErrorCode = ErrorCode::IncompatibleVersion;
    pub const INVALID_ENV: ErrorCode = ErrorCode::InvalidEnv;
    pub const DECODE: ErrorCode = ErrorCode::Decode;
    pub const INVALID_CONFIG: ErrorCode = ErrorCode::InvalidConfig;
}

/// A problem with the input, carrying the CNI error code, the offending field
/// (a JSON path such as `ipam.ipRanges[1].range`, or a CNI_ARGS key) and a message
/// that names both the field and the value. `code` is the CNI number, as the
/// host's error document carries it; the constructors take an [`ErrorCode`], so
/// it is always one of those.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error("{message}")]
pub struct ConfigError {
    pub code: u32,
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(code: ErrorCode, field: impl Into<String>, message: impl fmt::Display) -> Self {
        Self { code: code.number(), field: field.into(), message: message.to_string() }
    }

    /// Invalid network config (code 7) for `field`; the message is prefixed with the field.
    pub fn invalid(field: impl Into<String>, detail: impl fmt::Display) -> Self {
        let field = field.into();
        let message = if field.is_empty() { detail.to_string() } else { format!("{field}: {detail}") };
        Self { code: code::INVALID_CONFIG.number(), field, message }
    }
}

pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_cni_numbers_both_ways() {
        assert_eq!(ErrorCode::ALL.map(ErrorCode::number), [1, 4, 6, 7]);
        assert!(ErrorCode::ALL.into_iter().all(|c| ErrorCode::from_number(c.number()) == Some(c)));
        assert_eq!(ErrorCode::from_number(999), None);
    }
}
