//! The Event recorded on a pod's namespace for every address given back, as
//! whereabouts' pod controller records it (`IPAddressGarbageCollected`), by
//! the reconciler and by `thereabouts release`.

use http::Method;
use serde_json::json;

use super::api::{Api, ApiError};
use super::verdict::Reason;
use crate::datastore::kubernetes::crd::escape;

pub const REASON: &str = "IPAddressGarbageCollected";

/// `address` of `podref` (`namespace/name`) freed from `place` for `reason`,
/// reported by `identity`.
pub async fn record_freed(api: &Api, podref: &str, address: &str, place: &str, reason: Reason, identity: &str) -> Result<(), ApiError> {
    let Some((namespace, name)) = podref.split_once('/') else { return Ok(()) };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let time = super::reconcile::rfc3339(now);
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": format!("{name}."), "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name},
        "reason": REASON,
        "message": format!("successful cleanup of IP address {address} from {place}: {}", reason.describe()),
        "type": "Normal",
        "source": {"component": "thereabouts-controller"},
        "reportingComponent": "thereabouts-controller",
        "reportingInstance": identity,
        "firstTimestamp": time, "lastTimestamp": time, "count": 1,
    });
    let path = format!("/api/v1/namespaces/{}/events", escape(namespace));
    api.send(Method::POST, &path, Some(("application/json", &event))).await.map(|_| ())
}
