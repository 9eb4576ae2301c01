//! What this node last found it holds of a layout of slice objects, kept on
//! the node (next to the node-turn locks), so that an ADD reads its slices by
//! name (one GET each from the watch cache) instead of listing them by label:
//! the apiserver's cache has no index by label, so a LIST by label costs it a
//! walk over every slice object of the namespace, and at 5 000 nodes a burst
//! of 1 000 ADDs timed out on those LISTs first.
//!
//! Never what correctness rests on: each slice remembered is read and must
//! still name this node; a DEL reads the remembered slices first and lists
//! every slice of the node when it did not find all its entries there; a
//! CHECK always lists; and a node whose remembered slices are all gone lists.

use std::path::{Path, PathBuf};

use crate::logging;

use super::node_turn::LOCK_DIR;

/// The file of `node`'s slices of `layout` under `scope` (apiserver and namespace).
fn file(dir: &Path, scope: &str, layout: &str, node: &str) -> PathBuf {
    dir.join(format!("{scope}_held_{layout}_{node}"))
}

/// The slices remembered (none when nothing is, or the file is unreadable).
pub fn recall(scope: &str, layout: &str, node: &str) -> Vec<String> {
    recall_in(Path::new(LOCK_DIR), scope, layout, node)
}

/// Remembers `slices`, best effort (written whole, then renamed into place).
pub fn remember(scope: &str, layout: &str, node: &str, slices: &[String]) {
    remember_in(Path::new(LOCK_DIR), scope, layout, node, slices)
}

fn recall_in(dir: &Path, scope: &str, layout: &str, node: &str) -> Vec<String> {
    std::fs::read_to_string(file(dir, scope, layout, node)).map(|t| t.lines().filter(|l| !l.is_empty()).map(str::to_string).collect()).unwrap_or_default()
}

fn remember_in(dir: &Path, scope: &str, layout: &str, node: &str, slices: &[String]) {
    let path = file(dir, scope, layout, node);
    let partial = path.with_extension(format!("{}.partial", std::process::id()));
    let written = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&partial, slices.join("\n"))).and_then(|()| std::fs::rename(&partial, &path));
    if let Err(e) = written {
        logging::debug(format!("cannot remember the slices of {layout} at {}: {e}", path.display()));
        let _ = std::fs::remove_file(&partial);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_node_remembers_it_recalls_per_layout() {
        let dir = std::env::temp_dir().join(format!("thereabouts-held-{}", std::process::id()));
        assert!(recall_in(&dir, "ns", "blue", "a").is_empty());
        remember_in(&dir, "ns", "blue", "a", &["192.0.2.0/28".into(), "192.0.2.32/28".into()]);
        assert_eq!(recall_in(&dir, "ns", "blue", "a"), ["192.0.2.0/28", "192.0.2.32/28"]);
        assert!(recall_in(&dir, "ns", "green", "a").is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
