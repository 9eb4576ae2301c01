//! From the plugin's stdin (plus the flat file and CNI_ARGS) to the engine's
//! normalized config. The engine says where flat files may be; the host reads.
//!
//! Difference from whereabouts: a missing flat file is not an error (whereabouts
//! fails every call with "config file not found" since v0.6.2). A configuration
//! that is complete inline needs none; one that is incomplete still fails, with
//! the engine naming the missing field.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use thereabouts_allocator::model::NormalizedConfig;

use crate::cni::error::{CniError, code};
use crate::component::EngineComponent;

/// Names looked up inside a flat-file path that is a directory (the whereabouts
/// installer writes a directory into `configuration_path`).
const NAMES_IN_DIRECTORY: [&str; 2] = ["whereabouts.conf", "thereabouts.conf"];

/// A flat file that was found and read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatFile {
    pub path: PathBuf,
    pub text: String,
}

/// Wraps a wasmtime failure (not an answer of the engine) as an internal error.
pub fn engine_failure(e: anyhow::Error) -> CniError {
    CniError::new(code::INTERNAL, format!("engine component failed: {e:#}"))
}

/// Normalizes `network_config` the way every command sees it.
pub fn load(engine: &mut EngineComponent, network_config: &str, cni_args: &str) -> Result<(NormalizedConfig, Option<FlatFile>), CniError> {
    let paths = engine.flat_file_paths(network_config).map_err(engine_failure)??;
    let flat = find_flat_file(&paths)?;
    let config = engine.normalize(network_config, flat.as_ref().map(|f| f.text.as_str()), cni_args).map_err(engine_failure)??;
    Ok((config, flat))
}

/// Reads the first existing flat file among `paths`; `None` when there is none.
pub fn find_flat_file(paths: &[String]) -> Result<Option<FlatFile>, CniError> {
    for path in paths.iter().filter(|p| !p.is_empty()).map(PathBuf::from) {
        let Some(is_dir) = probe(&path)? else { continue };
        if !is_dir {
            return read(&path).map(Some);
        }
        for name in NAMES_IN_DIRECTORY {
            let candidate = path.join(name);
            if probe(&candidate)?.is_some() {
                return read(&candidate).map(Some);
            }
        }
    }
    Ok(None)
}

/// `Some(is_directory)` if the path exists, `None` if it does not.
fn probe(path: &Path) -> Result<Option<bool>, CniError> {
    match fs::metadata(path) {
        Ok(meta) => Ok(Some(meta.is_dir())),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(unreadable(path, &e)),
    }
}

fn read(path: &Path) -> Result<FlatFile, CniError> {
    fs::read_to_string(path).map(|text| FlatFile { path: path.to_path_buf(), text }).map_err(|e| unreadable(path, &e))
}

fn unreadable(path: &Path, e: &std::io::Error) -> CniError {
    CniError::new(code::INVALID_CONFIG, format!("cannot read flat configuration file {}: {e}", path.display())).with_details(path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_existing_path_wins_and_directories_are_searched() {
        let dir = std::env::temp_dir().join(format!("thereabouts-flat-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("d")).unwrap();
        fs::write(dir.join("d/thereabouts.conf"), "{\"a\":1}").unwrap();
        fs::write(dir.join("plain.conf"), "{\"b\":2}").unwrap();
        let s = |p: &str| dir.join(p).display().to_string();
        assert_eq!(find_flat_file(&[s("missing"), s("d"), s("plain.conf")]).unwrap().unwrap().text, "{\"a\":1}");
        assert_eq!(find_flat_file(&[s("plain.conf/x"), s("plain.conf")]).unwrap().unwrap().path, dir.join("plain.conf"));
        assert_eq!(find_flat_file(&[s("missing")]).unwrap(), None);
        // A directory with neither name does not count as a flat file.
        fs::create_dir_all(dir.join("empty")).unwrap();
        assert_eq!(find_flat_file(&[s("empty")]).unwrap(), None);
        // Found but unreadable (here: a directory where the file should be) is code 7.
        fs::create_dir_all(dir.join("bad/whereabouts.conf")).unwrap();
        let e = find_flat_file(&[s("bad")]).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("bad/whereabouts.conf"), "{}", e.msg);
        fs::remove_dir_all(dir).unwrap();
    }
}
