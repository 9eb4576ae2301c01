//! What a failed Kubernetes request means for the CNI caller: transient (code 11,
//! "try again later"), denied (credentials or RBAC) or rejected (anything else
//! that retrying will not fix).

use kube::core::Status;

use crate::causes::cause_chain;
use crate::datastore::failure::Class;

/// The class of an HTTP status an API call answered with: 401 and 403 are
/// denied; 408, 429 and 5xx transient; any other answer (400, 404 of a resource
/// type, 422 of a schema, ...) rejected.
pub fn classify(code: u16) -> Class {
    match code {
        401 | 403 => Class::Denied,
        408 | 429 | 500..=599 => Class::Transient,
        _ => Class::Rejected,
    }
}

/// Whether `status` is the 404 of the object `name` (rather than of a resource
/// type the apiserver does not serve: CRDs not installed).
pub fn is_object_not_found(status: &Status, name: &str) -> bool {
    status.code == 404 && status.details.as_ref().is_some_and(|d| d.name == name)
}

/// Whether a 422 is a JSON patch that could not be applied — a `test` that did
/// not hold because someone wrote the object since it was read — rather than a
/// schema violation of the patched object.
///
/// kube-apiserver (1.36) answers an inapplicable patch with only the generic
/// message "the server rejected our request due to an error in our request":
/// no object name, no causes. A schema violation names the object and lists the
/// offending fields as causes. Our patches only touch keys of the version they
/// test, so once the `resourceVersion` test holds the rest applies: an
/// inapplicable patch means the version moved (whereabouts retries every 422).
pub fn is_failed_test(status: &Status) -> bool {
    let is_test = |text: &str| {
        let text = text.to_ascii_lowercase();
        text.contains("test operation") || text.contains("testing value") || text.contains("test failed")
    };
    let anonymous = status.details.as_ref().is_none_or(|d| d.name.is_empty() && d.causes.is_empty());
    status.code == 422 && (anonymous || is_test(&status.message) || causes(status).any(is_test))
}

fn causes(status: &Status) -> impl Iterator<Item = &str> {
    status.details.iter().flat_map(|d| d.causes.iter()).map(|c| c.message.as_str())
}

/// Whether the apiserver refused a write because the object would be larger than
/// etcd keeps (its answer: 500 with etcd's own message).
pub fn is_too_large(status: &Status) -> bool {
    status.code == 413 || (status.code == 500 && status.message.contains("request is too large"))
}

/// `403 Forbidden: <the apiserver's message>`, with a hint for a resource type
/// that is not served at all.
pub fn describe_status(status: &Status) -> String {
    let mut text = status.code.to_string();
    if !status.reason.is_empty() {
        text.push(' ');
        text.push_str(&status.reason);
    }
    if !status.message.is_empty() {
        text.push_str(": ");
        text.push_str(status.message.trim());
    }
    for cause in causes(status).filter(|c| !c.is_empty() && !status.message.contains(*c)) {
        text.push_str(": ");
        text.push_str(cause.trim());
    }
    if status.code == 404 && status.details.as_ref().is_none_or(|d| d.name.is_empty()) {
        text.push_str(" (the whereabouts.cni.cncf.io CRDs are not installed: apply deploy/crds/)");
    }
    text
}

/// A failure before any HTTP answer: the class and a readable cause.
pub fn transport(error: &kube::Error) -> (Class, String) {
    let text = cause_chain(error.to_string(), error);
    let lower = text.to_ascii_lowercase();
    let class = match error {
        kube::Error::Auth(_) => Class::Denied,
        kube::Error::RustlsTls(_) => Class::Rejected,
        // A server whose certificate we do not trust will not start being trusted.
        _ if lower.contains("certificate") || lower.contains("invalidcert") || lower.contains("unknownissuer") => Class::Rejected,
        _ => Class::Transient,
    };
    (class, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str, message: &str, name: Option<&str>) -> Status {
        let mut s = Status::failure(message, reason).with_code(code);
        s.details = name.map(|n| serde_json::from_value(serde_json::json!({"name": n, "kind": "ippools"})).unwrap());
        s
    }

    #[test]
    fn codes_map_to_classes() {
        assert_eq!(classify(401), Class::Denied);
        assert_eq!(classify(403), Class::Denied);
        for code in [408, 429, 500, 502, 503, 504] {
            assert_eq!(classify(code), Class::Transient, "{code}");
        }
        for code in [400, 404, 405, 409, 415, 422] {
            assert_eq!(classify(code), Class::Rejected, "{code}");
        }
    }

    #[test]
    fn object_not_found_is_told_from_a_missing_crd() {
        let object = status(404, "NotFound", "ippools.whereabouts.cni.cncf.io \"192.0.2.0-24\" not found", Some("192.0.2.0-24"));
        assert!(is_object_not_found(&object, "192.0.2.0-24"));
        assert!(!is_object_not_found(&object, "other"));
        let crd = status(404, "NotFound", "404 page not found", None);
        assert!(!is_object_not_found(&crd, "192.0.2.0-24"));
        assert!(describe_status(&crd).contains("CRDs are not installed"), "{}", describe_status(&crd));
    }

    #[test]
    fn an_inapplicable_patch_is_a_conflict() {
        // Exactly what kube-apiserver 1.36 answered to a stale `resourceVersion` test.
        let s: Status = serde_json::from_value(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 422, "reason": "Invalid",
            "message": "the server rejected our request due to an error in our request", "details": {}
        }))
        .unwrap();
        assert!(is_failed_test(&s));
    }

    #[test]
    fn failed_tests_are_found_in_the_causes() {
        // The shape kube-apiserver 1.36 answers a JSON patch whose `test` fails with.
        let s: Status = serde_json::from_value(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422, "reason": "Invalid",
            "message": "the server rejected our request due to an error in our request",
            "details": {"causes": [{"reason": "UnexpectedServerResponse", "message": "testing value /metadata/resourceVersion failed: test failed"}]}
        }))
        .unwrap();
        assert!(is_failed_test(&s));
        assert!(describe_status(&s).ends_with("our request: testing value /metadata/resourceVersion failed: test failed"), "{}", describe_status(&s));
    }

    #[test]
    fn failed_tests_are_conflicts_but_schema_errors_are_not() {
        assert!(is_failed_test(&status(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request: testing value /metadata/resourceVersion failed: test failed",
            None
        )));
        assert!(is_failed_test(&status(422, "Invalid", "test operation does not apply: doc is missing path: /spec/allocations/4", None)));
        let mut schema = status(422, "Invalid", "IPPool.whereabouts.cni.cncf.io \"x\" is invalid: spec.allocations.1.podref: Required value", Some("x"));
        schema.details.as_mut().unwrap().causes =
            serde_json::from_value(serde_json::json!([{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.allocations.1.podref"}]))
                .unwrap();
        assert!(!is_failed_test(&schema));
        assert!(!is_failed_test(&status(409, "Conflict", "testing value", None)));
    }

    #[test]
    fn forbidden_keeps_the_apiservers_reason() {
        let s = status(
            403,
            "Forbidden",
            "ippools.whereabouts.cni.cncf.io \"x\" is forbidden: User \"system:serviceaccount:kube-system:thereabouts\" cannot patch resource \"ippools\" in API group \"whereabouts.cni.cncf.io\" in the namespace \"other\"",
            Some("x"),
        );
        let text = describe_status(&s);
        assert!(text.starts_with("403 Forbidden: ") && text.contains("cannot patch resource \"ippools\"") && text.contains("namespace \"other\""), "{text}");
    }
}
