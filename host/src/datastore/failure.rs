//! What a failed request to a shared store (Kubernetes, etcd) means for the
//! caller, whichever store it was: one classification, one error per class, and
//! one printer of an error's causes. Each backend only decides which class its
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

/// `error: cause: cause …`, without repeating a cause whose text is already
/// there (many errors print their source as part of their own message).
pub fn cause_chain(head: String, error: &dyn std::error::Error) -> String {
    let mut text = head;
    let mut source = error.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Hides(#[source] std::io::Error);

    #[test]
    fn causes_are_appended_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let repeats = Repeats(io());
        assert_eq!(cause_chain(repeats.to_string(), &repeats), "outer: connection refused");
        let hides = Hides(io());
        assert_eq!(cause_chain(hides.to_string(), &hides), "outer: connection refused");
    }
}
