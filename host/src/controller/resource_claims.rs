//! Which DRA ResourceClaims still own their devices' addresses (the profile
//! provider's allocations, `docs/claims.md`). DRANET's release is best
//! effort and never retried, so the controller frees a device's addresses
//! when its claim is gone (no ResourceClaim has that UID), or has been seen
//! without `status.reservedFor` (no pod uses it) for longer than a grace.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::api::{Api, ApiError};

/// Every ResourceClaim of the cluster (`resource.k8s.io/v1`, DRA's GA API).
pub const RESOURCE_CLAIMS: &str = "/apis/resource.k8s.io/v1/resourceclaims";
const CLAIMS_PAGE: u32 = 500;

/// How long a claim may be seen unreserved before its addresses go: longer
/// than a pod's teardown, during which the kubelet's unprepare (DRANET's
/// release) and the claim controller's clearing of `reservedFor` race.
pub const DEFAULT_UNRESERVED_GRACE: Duration = Duration::from_secs(120);

#[derive(Deserialize)]
struct ClaimJson {
    metadata: Meta,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    uid: String,
}

#[derive(Deserialize, Default)]
struct Status {
    #[serde(default, rename = "reservedFor")]
    reserved_for: Vec<serde_json::Value>,
}

/// When this replica first saw each claim (by UID) without a reservation.
/// Kept in memory: a replica that starts (or takes over) waits the whole
/// grace again, never less.
pub struct Unreserved {
    pub grace: Duration,
    first_seen: Mutex<HashMap<String, Instant>>,
}

impl Default for Unreserved {
    fn default() -> Self {
        Self::new(DEFAULT_UNRESERVED_GRACE)
    }
}

impl Unreserved {
    pub fn new(grace: Duration) -> Self {
        Self { grace, first_seen: Mutex::new(HashMap::new()) }
    }

    /// The UIDs of the claims whose addresses stay: reserved, or unreserved
    /// for less than the grace. `None` where they cannot be known (DRA not
    /// served, or the controller may not list claims): nothing is freed then.
    pub async fn read(&self, api: &Api) -> Result<Option<HashSet<String>>, ApiError> {
        let mut claims = Vec::new();
        match api.list_pages::<ClaimJson>(RESOURCE_CLAIMS, CLAIMS_PAGE, |c| claims.push((c.metadata.uid, !c.status.reserved_for.is_empty()))).await {
            Ok(()) => Ok(Some(self.observe(claims, Instant::now()))),
            Err(e) if e.code() == Some(404) => Ok(None),
            Err(e) if e.code() == Some(403) => {
                crate::logging::error(format!(
                    "controller: may not list ResourceClaims ({e}); their devices' addresses are kept until deploy/controller.yaml is applied"
                ));
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// From one full list (UID, reserved): the claims that keep their addresses.
    fn observe(&self, claims: Vec<(String, bool)>, now: Instant) -> HashSet<String> {
        let mut first_seen = self.first_seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = HashMap::new();
        let mut live = HashSet::new();
        for (uid, reserved) in claims {
            if reserved {
                live.insert(uid);
                continue;
            }
            let since = *first_seen.get(&uid).unwrap_or(&now);
            if now.duration_since(since) < self.grace {
                live.insert(uid.clone());
            }
            seen.insert(uid, since);
        }
        *first_seen = seen;
        live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreserved_claim_keeps_its_addresses_for_the_grace_only() {
        let unreserved = Unreserved::new(Duration::from_secs(120));
        let start = Instant::now();
        let list = || vec![("used".to_string(), true), ("idle".to_string(), false)];
        let live = |at: u64| {
            let mut uids: Vec<String> = unreserved.observe(list(), start + Duration::from_secs(at)).into_iter().collect();
            uids.sort();
            uids
        };
        assert_eq!(live(0), ["idle", "used"]);
        assert_eq!(live(119), ["idle", "used"]);
        assert_eq!(live(120), ["used"]);
        // Reserved again (a new pod), then unreserved: the grace starts over.
        unreserved.observe(vec![("idle".to_string(), true)], start + Duration::from_secs(130));
        assert_eq!(live(140), ["idle", "used"]);
    }
}
