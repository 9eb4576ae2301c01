//! The check before every write of a pass: does this replica still hold the
//! Lease, with time to spare? kube-lease-manager tells the loop when
//! leadership changes, but a replica that stalled (or lost the apiserver) can
//! believe it leads after another took over. So a write goes out only after a
//! fresh read of the Lease shows this replica as holder, renewed less than its
//! duration minus a margin ago, by this replica's own clock (it wrote
//! `renewTime`). Another replica takes the Lease only after a full duration
//! without a renewal, so two replicas never write at the same time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;

use super::api::{Api, ApiError};
use super::pods::unix_seconds;
use crate::datastore::kubernetes::crd::escape;

pub const LEASE_NAME: &str = "thereabouts-controller";

/// Why a pass stops before a write.
#[derive(Debug, thiserror::Error)]
pub enum NotLeading {
    #[error("the Lease is held by {0:?}")]
    HeldBy(String),
    #[error("the Lease was last renewed {0} ms ago, too long for a write to be safe")]
    Stale(u128),
    #[error("cannot read the Lease: {0}")]
    Unreadable(#[from] ApiError),
}

/// Who may write: the Lease's holder, or anyone (`--once`, the CLI).
#[derive(Clone)]
pub enum WriteGuard {
    Lease { api: Api, namespace: String, identity: String },
    Unguarded,
}

#[derive(Deserialize)]
struct LeaseJson {
    #[serde(default)]
    spec: LeaseSpec,
}

#[derive(Deserialize, Default)]
struct LeaseSpec {
    #[serde(default, rename = "holderIdentity")]
    holder: Option<String>,
    #[serde(default, rename = "renewTime")]
    renew_time: Option<String>,
    #[serde(default, rename = "leaseDurationSeconds")]
    duration: Option<u64>,
}

impl WriteGuard {
    /// Ok when this replica may write now. A renewal that is due (the Lease
    /// is still this replica's, but too old to write on) is waited for, up to
    /// a Lease duration; another holder ends the wait at once.
    pub async fn check(&self) -> Result<(), NotLeading> {
        let WriteGuard::Lease { api, namespace, identity } = self else { return Ok(()) };
        let path = format!("/apis/coordination.k8s.io/v1/namespaces/{}/leases/{LEASE_NAME}", escape(namespace));
        let started = std::time::Instant::now();
        loop {
            let lease: LeaseJson = api.get(&path).await?;
            let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
            match judge(&lease.spec, identity, now_ms) {
                Err(NotLeading::Stale(_)) if started.elapsed() < Duration::from_secs(lease.spec.duration.unwrap_or(0)) => {
                    tokio::time::sleep(Duration::from_millis(250)).await
                }
                outcome => return outcome,
            }
        }
    }
}

fn judge(spec: &LeaseSpec, identity: &str, now_ms: u128) -> Result<(), NotLeading> {
    let holder = spec.holder.clone().unwrap_or_default();
    if holder != identity {
        return Err(NotLeading::HeldBy(holder));
    }
    let renewed_ms = spec.renew_time.as_deref().and_then(renew_millis).unwrap_or(0);
    let duration = Duration::from_secs(spec.duration.unwrap_or(0));
    // A fifth of the duration left: the write reaches the apiserver within it.
    let usable = duration.saturating_sub(duration / 5).as_millis();
    let age = now_ms.saturating_sub(renewed_ms);
    if age >= usable {
        return Err(NotLeading::Stale(age));
    }
    Ok(())
}

/// A MicroTime (`2026-12-01T22:33:42.123456Z`) in Unix milliseconds.
fn renew_millis(text: &str) -> Option<u128> {
    let seconds = u128::try_from(unix_seconds(text)?).ok()?;
    let fraction = text.split_once('.').map(|(_, f)| f.trim_end_matches('Z')).unwrap_or("");
    let millis: String = fraction.chars().chain("000".chars()).take(3).collect();
    Some(seconds * 1000 + millis.parse::<u128>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renew: &str) -> LeaseSpec {
        LeaseSpec { holder: Some(holder.into()), renew_time: Some(renew.into()), duration: Some(15) }
    }

    #[test]
    fn only_a_fresh_holder_may_write() {
        let renewed = renew_millis("1970-01-01T00:01:40.250000Z").unwrap();
        assert_eq!(renewed, 100_250);
        assert!(judge(&spec("me", "1970-01-01T00:01:40.250000Z"), "me", renewed + 11_999).is_ok());
        assert!(matches!(judge(&spec("me", "1970-01-01T00:01:40.250000Z"), "me", renewed + 12_000), Err(NotLeading::Stale(12_000))));
        assert!(matches!(judge(&spec("other", "1970-01-01T00:01:40.250000Z"), "me", renewed), Err(NotLeading::HeldBy(h)) if h == "other"));
        assert!(judge(&LeaseSpec::default(), "me", 0).is_err());
    }
}
