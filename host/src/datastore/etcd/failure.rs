//! What a failed etcd request means for the CNI caller: transient (code 11, "try
//! again later": unreachable, timed out, no leader), denied (credentials or
//! role permissions) or rejected (TLS trouble and anything else retrying will
//! not fix).

use tonic::Code;

use crate::causes::cause_chain;
use crate::datastore::failure::Class;

/// Texts etcd answers a bad user, password or token with (its auth errors are
/// `InvalidArgument`, `FailedPrecondition` or `PermissionDenied` gRPC statuses).
const AUTH_TEXTS: [&str; 6] =
    ["authentication failed", "invalid user id or password", "permission denied", "user name not found", "invalid auth token", "user name is empty"];

/// Texts of a TLS handshake that will not start succeeding by itself.
const TLS_TEXTS: [&str; 6] = ["certificate", "invalidcert", "unknownissuer", "tls handshake", "bad signature", "handshake failure"];

fn contains_any(text: &str, needles: &[&str]) -> bool {
    let lower = text.to_ascii_lowercase();
    needles.iter().any(|n| lower.contains(n))
}

/// The class of a gRPC status etcd (or the transport under it) answered with.
pub fn classify_status(code: Code, message: &str) -> Class {
    if matches!(code, Code::Unauthenticated | Code::PermissionDenied) || contains_any(message, &AUTH_TEXTS) {
        return Class::Denied;
    }
    if contains_any(message, &TLS_TEXTS) {
        return Class::Rejected;
    }
    match code {
        // "etcdserver: no leader", "leader changed", "request timed out", a
        // connection that broke: all heal by themselves.
        Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Aborted | Code::Cancelled | Code::Unknown => Class::Transient,
        _ => Class::Rejected,
    }
}

/// The class and a readable cause of a failed etcd client call.
pub fn classify(error: &etcd_client::Error) -> (Class, String) {
    let text = error_text(error);
    let class = match error {
        etcd_client::Error::GRpcStatus(status) => classify_status(status.code(), &text),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) if contains_any(&text, &TLS_TEXTS) => Class::Rejected,
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => Class::Transient,
        _ => Class::Rejected,
    };
    (class, text)
}

/// The error with its causes (`a: b: c`); a gRPC status as its message alone.
pub fn error_text(error: &etcd_client::Error) -> String {
    let head = match error {
        etcd_client::Error::GRpcStatus(status) => format!("{:?}: {}", status.code(), status.message()),
        other => other.to_string(),
    };
    cause_chain(head, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_classes() {
        assert_eq!(classify_status(Code::Unavailable, "etcdserver: no leader"), Class::Transient);
        assert_eq!(classify_status(Code::Unavailable, "etcdserver: request timed out"), Class::Transient);
        assert_eq!(classify_status(Code::DeadlineExceeded, "deadline"), Class::Transient);
        assert_eq!(classify_status(Code::InvalidArgument, "etcdserver: authentication failed, invalid user ID or password"), Class::Denied);
        assert_eq!(classify_status(Code::PermissionDenied, "etcdserver: permission denied"), Class::Denied);
        assert_eq!(classify_status(Code::Unknown, "invalid peer certificate: UnknownIssuer"), Class::Rejected);
        assert_eq!(classify_status(Code::InvalidArgument, "etcdserver: duplicate key given in txn request"), Class::Rejected);
    }

    #[test]
    fn client_errors_keep_their_cause() {
        let status =
            etcd_client::Error::GRpcStatus(tonic::Status::new(Code::InvalidArgument, "etcdserver: authentication failed, invalid user ID or password"));
        let (class, text) = classify(&status);
        assert_eq!(class, Class::Denied);
        assert!(text.contains("authentication failed"), "{text}");
        let io = etcd_client::Error::IoError(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"));
        assert_eq!(classify(&io).0, Class::Transient);
        assert_eq!(classify(&etcd_client::Error::InvalidArgs("empty endpoints".into())).0, Class::Rejected);
    }
}
