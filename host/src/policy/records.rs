//! Small records in the policy cache that spare an ADD work whose answer
//! cannot change: a policy file's digest by its identity (`artifact`), and
//! what a policy answered `validate-settings` for given settings (`decide`:
//! a policy imports nothing, so its answer is a function of its input, as
//! Kubewarden validates a policy's settings once, at load, not per request).
//!
//! A record is believed only if root wrote it into a directory only root
//! can write (the cache's own ancestors are checked with its artifacts).
//! The plugin runs as root and writes one when it did the work; a process
//! that cannot write (a user running the CLI) just does the work again.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use super::artifact::root_only;

/// Longest record read (a remembered verdict holds the policy's settings).
const MAX_RECORD: u64 = 1 << 20;

/// A record's text, if root wrote it and no one else could have.
pub fn read(record: &Path) -> Option<String> {
    let mut file = std::fs::File::open(record).ok()?;
    let meta = file.metadata().ok()?;
    let dir = std::fs::metadata(record.parent()?).ok()?;
    if !meta.is_file() || root_only(&meta).is_err() || root_only(&dir).is_err() {
        return None;
    }
    let mut text = String::with_capacity(meta.len().min(MAX_RECORD) as usize);
    file.by_ref().take(MAX_RECORD).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Writes a record (a temporary file, then a rename, so a reader sees all
/// of it or nothing), creating its directory; does nothing if it cannot.
pub fn write(record: &Path, text: &str) {
    let (Some(dir), Some(name)) = (record.parent(), record.file_name()) else { return };
    if std::fs::DirBuilder::new().mode(0o755).create(dir).is_err() && !dir.is_dir() {
        return;
    }
    let temporary = dir.join(format!(".{}.{}", std::process::id(), name.to_string_lossy()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&temporary)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
        .and_then(|()| std::fs::rename(&temporary, record));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
}
