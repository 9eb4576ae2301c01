//! Where a policy's precompiled artifact lives, and why it may be loaded.
//!
//! Deserialising an artifact runs its bytes as machine code, so the plugin
//! loads only what `thereabouts policy compile` (the compiler binary, which
//! has Cranelift; the plugin has not) wrote: `<cache>/<sha256 of the .wasm>-<compat>.cwasm`.
//! The digest ties it to exactly the file the config names; `<compat>` to
//! this build's wasmtime and engine settings (host/build.rs computes it with
//! the compiler's own function). The cache and the artifact must belong to
//! root and be writable by no one else, and so must every directory above
//! them (sticky ones like /tmp aside): otherwise anyone could swap the code.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::failure::LoadError;
use super::records;

/// The compiled policies' root-owned cache.
pub const DEFAULT_CACHE: &str = "/var/lib/thereabouts/policies";
/// Overrides [`DEFAULT_CACHE`] (tests; hosts with another layout).
pub const CACHE_ENV: &str = "THEREABOUTS_POLICY_CACHE";
/// A policy component larger than this is not one (the examples are ~100 KB).
pub const MAX_POLICY_BYTES: u64 = 16 << 20;
/// The compatibility key of this build's policy engine (host/build.rs).
pub const COMPAT: &str = include_str!(concat!(env!("OUT_DIR"), "/policy_compat.txt"));

pub fn cache_dir() -> PathBuf {
    std::env::var_os(CACHE_ENV).map_or_else(|| PathBuf::from(DEFAULT_CACHE), PathBuf::from)
}

/// Hex SHA-256 of the policy file, read whole (bounded).
pub fn digest_of(path: &Path) -> Result<String, LoadError> {
    let unreadable = |source| LoadError::Unreadable { path: path.to_path_buf(), source };
    let size = std::fs::metadata(path).map_err(unreadable)?.len();
    if size > MAX_POLICY_BYTES {
        return Err(LoadError::TooLarge { path: path.to_path_buf(), limit: MAX_POLICY_BYTES });
    }
    let bytes = std::fs::read(path).map_err(unreadable)?;
    Ok(hex(&Sha256::digest(&bytes)))
}

/// Where digests are remembered by file identity (see [`remembered_digest`]).
const BY_FILE: &str = "by-file";

/// The name a file's digest is remembered under: everything that changes
/// when its bytes do. A write sets `ctime` to the kernel's clock (no one can
/// set it back without root), and a file put in its place has another inode
/// or another `ctime`, as git's index and ccache rely on.
fn identity(meta: &std::fs::Metadata) -> String {
    format!("{}-{}-{}-{}.{}-{}.{}", meta.dev(), meta.ino(), meta.len(), meta.mtime(), meta.mtime_nsec(), meta.ctime(), meta.ctime_nsec())
}

/// The policy file's digest, from its record in the cache when the file is
/// the one recorded, else hashed (and recorded, when this process may write
/// the cache: the plugin as root). Hashing a 100 KB policy is most of what
/// finding its artifact costs an ADD; a record costs a `stat` and a read.
/// A record is believed only if root wrote it, in a cache only root can
/// write; at worst a stale record names an artifact root compiled from an
/// earlier version of the file, never code from anyone else.
pub fn remembered_digest(path: &Path, cache: &Path) -> Result<String, LoadError> {
    let meta = std::fs::metadata(path).map_err(|source| LoadError::Unreadable { path: path.to_path_buf(), source })?;
    let record = cache.join(BY_FILE).join(identity(&meta));
    if let Some(digest) = records::read(&record).filter(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit())) {
        return Ok(digest);
    }
    let digest = digest_of(path)?;
    records::write(&record, &digest);
    Ok(digest)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The artifact for `policy` in `cache`, checked to be trusted.
pub fn trusted_artifact(policy: &Path, cache: &Path) -> Result<PathBuf, LoadError> {
    let artifact = cache.join(format!("{}-{}.cwasm", remembered_digest(policy, cache)?, COMPAT.trim()));
    let meta = match std::fs::symlink_metadata(&artifact) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(LoadError::NotCompiled { path: policy.to_path_buf(), artifact }),
        Err(source) => return Err(LoadError::Unreadable { path: artifact, source }),
    };
    let untrusted = |why: String| LoadError::Untrusted { path: artifact.clone(), why };
    if !meta.file_type().is_file() {
        return Err(untrusted("not a regular file".into()));
    }
    root_only(&meta).map_err(untrusted)?;
    let mut dir = Some(cache);
    while let Some(d) = dir {
        let meta = std::fs::metadata(d).map_err(|source| LoadError::Unreadable { path: d.to_path_buf(), source })?;
        let sticky = meta.mode() & 0o1000 != 0;
        if !(sticky && d != cache) {
            root_only(&meta).map_err(|why| LoadError::Untrusted { path: d.to_path_buf(), why })?;
        }
        dir = d.parent();
    }
    Ok(artifact)
}

/// Owned by root and writable by no one else.
pub(super) fn root_only(meta: &std::fs::Metadata) -> Result<(), String> {
    if meta.uid() != 0 {
        return Err(format!("owned by uid {}, not root", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!("mode {:o} lets others write it", meta.mode() & 0o7777));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn cache_with(artifact_mode: u32) -> (tempdir::Dir, PathBuf) {
        let dir = tempdir::Dir::new();
        let policy = dir.path().join("p.wasm");
        std::fs::write(&policy, b"\0asm policy").unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
        let artifact = cache.join(format!("{}-{}.cwasm", digest_of(&policy).unwrap(), COMPAT.trim()));
        std::fs::write(&artifact, b"artifact").unwrap();
        std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(artifact_mode)).unwrap();
        (dir, policy)
    }

    #[test]
    fn a_root_owned_artifact_named_by_digest_and_compat_is_trusted() {
        let (dir, policy) = cache_with(0o644);
        assert!(trusted_artifact(&policy, &dir.path().join("cache")).is_ok());
    }

    #[test]
    fn a_group_writable_artifact_is_refused() {
        let (dir, policy) = cache_with(0o664);
        let refused = trusted_artifact(&policy, &dir.path().join("cache"));
        assert!(
            matches!(&refused, Err(LoadError::Untrusted { path, why }) if path.extension().is_some_and(|e| e == "cwasm") && why == "mode 664 lets others write it"),
            "{refused:?}"
        );
    }

    #[test]
    fn a_digest_is_remembered_by_the_file_identity() {
        let (dir, policy) = cache_with(0o644);
        let cache = dir.path().join("cache");
        let first = remembered_digest(&policy, &cache).unwrap();
        let records: Vec<_> = std::fs::read_dir(cache.join(BY_FILE)).unwrap().collect();
        assert_eq!(records.len(), 1, "one record, no temporary left");
        // A record that lies is believed (root wrote it): proof it is read.
        let record = records[0].as_ref().unwrap().path();
        std::fs::write(&record, "0".repeat(64)).unwrap();
        assert_eq!(remembered_digest(&policy, &cache).unwrap(), "0".repeat(64));
        assert_ne!(first, "0".repeat(64));
    }

    #[test]
    fn a_record_others_could_write_is_not_believed() {
        let (dir, policy) = cache_with(0o644);
        let cache = dir.path().join("cache");
        let digest = remembered_digest(&policy, &cache).unwrap();
        let record = std::fs::read_dir(cache.join(BY_FILE)).unwrap().next().unwrap().unwrap().path();
        std::fs::write(&record, "0".repeat(64)).unwrap();
        std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(remembered_digest(&policy, &cache).unwrap(), digest);
    }

    #[test]
    fn a_changed_policy_file_is_not_compiled() {
        let (dir, policy) = cache_with(0o644);
        std::fs::write(&policy, b"\0asm other").unwrap();
        assert!(matches!(trusted_artifact(&policy, &dir.path().join("cache")), Err(LoadError::NotCompiled { .. })));
    }

    /// A private directory under the system temp dir, removed on drop.
    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let p = std::env::temp_dir().join(format!("thab-artifact-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
