//! Named points where the plugin can be made to die as `kill -9` kills it, for
//! the fault trials (issue 26 §2; etcd does the same with gofail): a process
//! started with `THEREABOUTS_FAILPOINT=<name>` sends itself SIGKILL when it
//! reaches that point. A random kill lands wherever the process happens to
//! be; these land exactly between two writes whose order the datastores rely
//! on. Unset (always, outside the trials), a point costs one look at a value
//! read once.

use std::sync::OnceLock;

/// The variable that arms one point.
pub const ENV: &str = "THEREABOUTS_FAILPOINT";

/// Kubernetes: this attempt's reservations are created; its pool writes are not sent.
pub const KUBERNETES_RESERVED: &str = "kubernetes/reserved";
/// Kubernetes: the pools are written; the reservations of removed entries are not deleted.
pub const KUBERNETES_POOLS_WRITTEN: &str = "kubernetes/pools-written";
/// etcd: the commit's transaction is built; it is not sent.
pub const ETCD_BEFORE_COMMIT: &str = "etcd/before-commit";
/// etcd: the commit's transaction answered; nothing else is done.
pub const ETCD_AFTER_COMMIT: &str = "etcd/after-commit";
/// Any datastore: the ADD or DEL is committed; its answer is not written.
pub const BEFORE_ANSWER: &str = "cni/before-answer";

/// Dies here by SIGKILL when `point` is the one armed.
pub fn hit(point: &str) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    if ARMED.get_or_init(|| std::env::var(ENV).ok()).as_deref() == Some(point) {
        crate::logging::debug(format!("failpoint {point}: killing this process"));
        // SAFETY: kill(2) with this process' own id; no memory is involved.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
