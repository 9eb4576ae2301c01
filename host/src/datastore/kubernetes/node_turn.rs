//! A node's turn on its slice pools (`node_slice_size`). Only the node's own
//! calls write a pool of one of its slices, so they can take turns through a
//! lock on the node itself (`flock`, no API request) instead of racing in the
//! apiserver and queueing on Lease tickets (`turn.rs`). The lock file also
//! carries the `resourceVersion` the last holder left the pool at: the next
//! holder reads the pool from the watch cache once the cache has seen that
//! version (`resourceVersionMatch=NotOlderThan`), so it never plans on a read
//! older than its predecessor's write.
//!
//! Beside each lock, a note of what the pool held after the last holder
//! read or wrote it (`pool_note.rs`), which an ADD reads without the lock to
//! leave out the pools that cannot take it.
//!
//! Never what safety rests on: the entry tests of every write stay, and a call
//! that cannot take the lock (no `/run/thereabouts`, another namespace's
//! permissions) goes on as every call did before.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::Instant;

use crate::datastore::PoolId;
use crate::datastore::flock;
use crate::datastore::pool_note::PoolNote;
use crate::logging;

/// Where the locks live: a tmpfs the plugin (root, on the node) may write,
/// empty after a reboot, as the versions it holds are then stale anyway.
pub const LOCK_DIR: &str = "/run/thereabouts/slice-turns";

/// The locks of a call's node-local pools, held until dropped.
pub struct NodeTurn {
    /// (pool name, its lock file), in name order.
    locks: Vec<(String, File)>,
    dir: PathBuf,
    scope: String,
}

/// Where `pool`'s note lies.
fn note_path(dir: &std::path::Path, scope: &str, pool: &str) -> PathBuf {
    dir.join(format!("{scope}_{pool}.note"))
}

/// What the last holders noted of `pools` (none where a note is missing or cut).
pub fn notes(scope: &str, pools: &[PoolId]) -> Vec<Option<PoolNote>> {
    notes_in(std::path::Path::new(LOCK_DIR), scope, pools)
}

fn notes_in(dir: &std::path::Path, scope: &str, pools: &[PoolId]) -> Vec<Option<PoolNote>> {
    pools.iter().map(|p| std::fs::read_to_string(note_path(dir, scope, &p.name)).ok().and_then(|t| PoolNote::from_text(&t))).collect()
}

impl NodeTurn {
    /// Takes the lock of every pool (in name order, so two calls never wait
    /// on each other crosswise) by `deadline`; `None` when one cannot be had.
    /// `scope` names the apiserver and the namespace: a version is only
    /// meaningful to the cluster that gave it.
    pub fn take(scope: &str, pools: &[PoolId], deadline: Instant) -> Option<NodeTurn> {
        Self::take_in(PathBuf::from(LOCK_DIR), scope, pools, deadline)
    }

    fn take_in(dir: PathBuf, scope: &str, pools: &[PoolId], deadline: Instant) -> Option<NodeTurn> {
        if let Err(e) = std::fs::create_dir_all(&dir) {
            logging::debug(format!("node turn: cannot use {}: {e}; going on without", dir.display()));
            return None;
        }
        let mut names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let mut locks = Vec::with_capacity(names.len());
        for name in names {
            match flock::lock(dir.join(format!("{scope}_{name}.lock")), &format!("the node's turn on IPPool {name} ({scope})"), deadline) {
                Ok(file) => locks.push((name.to_string(), file)),
                Err(e) => {
                    logging::debug(format!("node turn: {e}; going on without"));
                    return None;
                }
            }
        }
        Some(NodeTurn { locks, dir, scope: scope.to_string() })
    }

    /// The node's turn to claim a slice of NodeSlicePool `slice_pool`, held
    /// until dropped; `None` when it cannot be had (going on without is
    /// safe: a claim's patch tests its slot). Calls of one node that need a
    /// slice at once (a burst past `node_slice_max_entries`) then send one
    /// claim between them, and the others find its slice when their turn
    /// comes, instead of each sending a patch of the whole layout that all
    /// but one lose.
    pub fn claim_turn(scope: &str, slice_pool: &str, deadline: Instant) -> Option<File> {
        Self::claim_turn_in(PathBuf::from(LOCK_DIR), scope, slice_pool, deadline)
    }

    fn claim_turn_in(dir: PathBuf, scope: &str, slice_pool: &str, deadline: Instant) -> Option<File> {
        std::fs::create_dir_all(&dir).map_err(|e| logging::debug(format!("claim turn: cannot use {}: {e}; going on without", dir.display()))).ok()?;
        let what = format!("the node's turn to claim a slice of NodeSlicePool {slice_pool} ({scope})");
        flock::lock(dir.join(format!("{scope}_claim_{slice_pool}.lock")), &what, deadline)
            .map_err(|e| logging::debug(format!("claim turn: {e}; going on without")))
            .ok()
    }

    /// The `resourceVersion` the last holder left `pool` at, if it said.
    pub fn last_version(&self, pool: &str) -> Option<String> {
        let (_, file) = self.locks.iter().find(|(name, _)| name == pool)?;
        let mut text = String::new();
        let mut reader: &File = file;
        reader.seek(SeekFrom::Start(0)).ok()?;
        reader.read_to_string(&mut text).ok()?;
        let version = text.trim();
        (!version.is_empty() && version.bytes().all(|b| b.is_ascii_digit())).then(|| version.to_string())
    }

    /// Notes what `pool` holds now, as this holder read or wrote it (best
    /// effort: written whole, then renamed into place, as readers take no lock).
    pub fn note(&self, pool: &str, note: &PoolNote) {
        if !self.locks.iter().any(|(name, _)| name == pool) {
            return;
        }
        let path = note_path(&self.dir, &self.scope, pool);
        let partial = path.with_extension(format!("note.{}", std::process::id()));
        if let Err(e) = std::fs::write(&partial, note.to_text()).and_then(|()| std::fs::rename(&partial, &path)) {
            logging::debug(format!("node turn: cannot note what pool {pool} holds: {e}"));
            let _ = std::fs::remove_file(&partial);
        }
    }

    /// Leaves `version` for the next holder of `pool` (best effort).
    pub fn record(&self, pool: &str, version: &str) {
        let Some((_, file)) = self.locks.iter().find(|(name, _)| name == pool) else { return };
        let mut writer: &File = file;
        let written = file.set_len(0).and_then(|()| writer.seek(SeekFrom::Start(0))).and_then(|_| writer.write_all(version.as_bytes()));
        if let Err(e) = written {
            logging::debug(format!("node turn: cannot record version {version} of pool {pool}: {e}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str) -> PoolId {
        PoolId { name: name.into(), cidr: "192.0.2.0/26".into(), node_local: true }
    }

    #[test]
    fn a_turn_is_one_holder_at_a_time_and_passes_the_version_on() {
        let dir = std::env::temp_dir().join(format!("thereabouts-node-turn-{}", std::process::id()));
        let soon = || Instant::now() + std::time::Duration::from_millis(200);
        let first = NodeTurn::take_in(dir.clone(), "ns", &[pool("b"), pool("a")], soon()).unwrap();
        assert_eq!(first.last_version("a"), None);
        first.record("a", "41");
        assert!(NodeTurn::take_in(dir.clone(), "ns", &[pool("a")], soon()).is_none(), "held");
        drop(first);
        let next = NodeTurn::take_in(dir.clone(), "ns", &[pool("a")], soon()).unwrap();
        assert_eq!(next.last_version("a").as_deref(), Some("41"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_holder_notes_what_its_pool_holds_for_calls_that_take_no_turn() {
        let dir = std::env::temp_dir().join(format!("thereabouts-pool-note-{}", std::process::id()));
        let soon = Instant::now() + std::time::Duration::from_millis(200);
        assert_eq!(notes_in(&dir, "ns", &[pool("a")]), [None]);
        let turn = NodeTurn::take_in(dir.clone(), "ns", &[pool("a")], soon).unwrap();
        let note = PoolNote::of(&[]);
        turn.note("a", &note);
        turn.note("b", &note);
        assert_eq!(notes_in(&dir, "ns", &[pool("a"), pool("b")]), [Some(note), None], "only a pool it holds the turn of");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_claim_turn_is_one_call_of_the_node_at_a_time_per_node_slice_pool() {
        let dir = std::env::temp_dir().join(format!("thereabouts-claim-turn-{}", std::process::id()));
        let soon = || Instant::now() + std::time::Duration::from_millis(200);
        let first = NodeTurn::claim_turn_in(dir.clone(), "ns", "blue", soon()).unwrap();
        assert!(NodeTurn::claim_turn_in(dir.clone(), "ns", "blue", soon()).is_none(), "held");
        assert!(NodeTurn::claim_turn_in(dir.clone(), "ns", "green", soon()).is_some(), "another layout's turn");
        drop(first);
        assert!(NodeTurn::claim_turn_in(dir.clone(), "ns", "blue", soon()).is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
