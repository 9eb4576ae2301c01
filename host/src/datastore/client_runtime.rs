//! The private tokio runtime a shared store's client runs on (Kubernetes,
//! etcd): current-thread, so the datastore contract stays synchronous and no
//! tokio runs unless such a store is selected. One place for how a request
//! waits: to completion or until its limit.

use std::future::Future;
use std::time::Duration;

pub struct ClientRuntime(tokio::runtime::Runtime);

impl ClientRuntime {
    /// A runtime with the I/O and time drivers a client needs.
    pub fn start() -> std::io::Result<Self> {
        Ok(ClientRuntime(tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?))
    }

    /// Runs `work` to completion (setting a client up, connecting: bounded by the client's own timeouts).
    pub fn block_on<F: Future>(&self, work: F) -> F::Output {
        self.0.block_on(work)
    }

    /// Runs `request` to completion or until `limit`; `None` when no answer came in time.
    pub fn within<F: Future>(&self, limit: Duration, request: F) -> Option<F::Output> {
        // The timer must be made inside the runtime: it needs its time driver.
        self.0.block_on(async { tokio::time::timeout(limit, request).await }).ok()
    }

    /// Runs `task` in the background: it makes progress while the runtime runs
    /// any other work (a current-thread runtime runs only inside `block_on`).
    pub fn spawn<F: Future<Output = ()> + Send + 'static>(&self, task: F) -> tokio::task::JoinHandle<()> {
        self.0.spawn(task)
    }

    /// Inside the runtime (a client spawns its dispatcher task where it is made).
    #[cfg(test)]
    pub fn enter(&self) -> tokio::runtime::EnterGuard<'_> {
        self.0.enter()
    }
}
