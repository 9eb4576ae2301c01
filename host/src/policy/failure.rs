//! What can go wrong with a policy, as values. The CNI edge
//! (`cni::error`) decides their code and wire form; `on_error` decides
//! whether a failure fails the ADD.

use std::path::PathBuf;

/// The policy hooks of `wit/ipam.wit` (`interface policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    ValidateSettings,
    SelectRanges,
    PickAddress,
}

impl Hook {
    pub fn name(self) -> &'static str {
        match self {
            Hook::ValidateSettings => "validate-settings",
            Hook::SelectRanges => "select-ranges",
            Hook::PickAddress => "pick-address",
        }
    }
}

/// Why a policy could not be used at all: nothing of it ran.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {}: {source}", path.display())]
    Unreadable { path: PathBuf, source: std::io::Error },
    #[error("{} is larger than {limit} bytes", path.display())]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{} is not compiled for this thereabouts (no {}): run `thereabouts policy compile {}` as root", path.display(), artifact.display(), path.display())]
    NotCompiled { path: PathBuf, artifact: PathBuf },
    /// The cache or the artifact could have been written by someone else than
    /// root; its bytes would run as machine code, so it is never loaded.
    #[error("{} is not trusted: {why}", path.display())]
    Untrusted { path: PathBuf, why: String },
    #[error("cannot load {}: {detail}", artifact.display())]
    Unloadable { artifact: PathBuf, detail: String },
    #[error("cannot start the policy watchdog: {0}")]
    Watchdog(std::io::Error),
}

/// Why one call into a policy gave no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallFailure {
    #[error("timed out after {ms} ms")]
    Timeout { ms: u32 },
    #[error("went over its memory limit of {mib} MiB")]
    MemoryLimit { mib: u32 },
    #[error("overflowed its stack")]
    StackOverflow,
    #[error("trapped: {0}")]
    Trap(String),
    #[error("gave a bad answer: {0}")]
    BadAnswer(String),
    #[error("rejected its settings: {0}")]
    BadSettings(String),
}

/// A failed call, named: which policy, which hook, what happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy {policy:?}, {}: {failure}", hook.name())]
pub struct PolicyError {
    pub policy: String,
    pub hook: Hook,
    pub failure: CallFailure,
}

/// Why a policy stopped an ADD.
#[derive(Debug, thiserror::Error)]
pub enum PolicyStop {
    #[error("policy {policy:?}: {source}")]
    Load { policy: String, source: LoadError },
    /// The sandbox itself (the policy engine, its watchdog) cannot start:
    /// no policy is at fault.
    #[error("the policy sandbox cannot start: {0}")]
    Sandbox(LoadError),
    #[error(transparent)]
    Failed(#[from] PolicyError),
    /// A policy needs the Pod's labels or annotations, and they cannot be read.
    #[error("cannot read pod {pod} for its policies: {detail}")]
    PodUnreadable { pod: String, detail: String },
    /// The policy decided, it did not fail: no address for this attachment.
    #[error("policy {policy:?} refused the attachment: {reason}")]
    Vetoed { policy: String, reason: String },
}
