//! `flock` with a deadline: the file store's pool locks, and a node's turn on
//! its slice pools (`kubernetes/node_turn.rs`).

use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use super::DatastoreError;

/// Takes the `flock` of the lock file at `path` (created if missing), waiting
/// until `deadline` at the latest; `what` names what it guards, for the timeout.
pub fn lock(path: PathBuf, what: &str, deadline: Instant) -> Result<File, DatastoreError> {
    let file = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path).map_err(|e| DatastoreError::io(&path, e))?;
    match file.try_lock() {
        Ok(()) => return Ok(file),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(e)) => return Err(DatastoreError::io(&path, e)),
    }
    // Wait in the kernel's queue (a blocking flock) rather than polling: a
    // poller loses every race to luckier processes and can starve for seconds
    // under a burst. The wait happens on a helper thread so the deadline holds;
    // a thread still waiting at the deadline dies with the process.
    let waiter = file.try_clone().map_err(|e| DatastoreError::io(&path, e))?;
    let (done, outcome) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(waiter.lock());
    });
    let timeout = || DatastoreError::Timeout { what: format!("locking {what} ({})", path.display()) };
    match outcome.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        // The lock belongs to the open file description, shared with `file`.
        Ok(Ok(())) => Ok(file),
        Ok(Err(e)) => Err(DatastoreError::io(&path, e)),
        Err(_) => Err(timeout()),
    }
}
