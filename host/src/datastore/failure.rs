//! What a failed request to a shared store (Kubernetes, etcd) means for the
//! caller, whichever store it was: one classification and one error per
//! class. Each backend only decides which class its
//! own answers fall in (`kubernetes::failure`, `etcd::failure`).

use super::DatastoreError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Unreachable, timed out, throttled, failing inside, no leader: may heal by itself.
    Transient,
    /// Our credentials or our identity's permissions were refused: the install needs fixing.
    Denied,
    /// Anything else retrying will not fix (TLS verification, a request the server rejects).
    Rejected,
}

impl Class {
    /// The datastore error of this class. `server` names the store and where it
    /// is (`Kubernetes API server https://…`, `etcd http://…`); `action` what
    /// the call was doing.
    pub fn error(self, server: String, action: impl Into<String>, detail: String) -> DatastoreError {
        let action = action.into();
        match self {
            Class::Transient => DatastoreError::Unavailable { server, action, detail },
            Class::Denied => DatastoreError::Denied { server, action, detail },
            Class::Rejected => DatastoreError::Rejected { server, action, detail },
        }
    }
}
