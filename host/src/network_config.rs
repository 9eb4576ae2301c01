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

use thereabouts_allocator::ConfigError;

use crate::component::{EngineComponent, EngineFailure};

/// Names looked up inside a flat-file path that is a directory (the whereabouts
/// installer writes a directory into `configuration_path`).
const NAMES_IN_DIRECTORY: [&str; 2] = ["whereabouts.conf", "thereabouts.conf"];

/// A flat file that was found and read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatFile {
    pub path: PathBuf,
    pub text: String,
}

/// Why a network config could not be turned into the engine's config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigLoadError {
    /// The engine's verdict on the config: it chose the CNI code and names the field.
    #[error("{}", .0.message)]
    Invalid(#[from] ConfigError),
    /// A flat file that exists could not be read.
    #[error("cannot read flat configuration file {}: {source}", path.display())]
    FlatFile { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Engine(#[from] EngineFailure),
}

/// Normalizes `network_config` the way every command sees it.
pub fn load(engine: &mut EngineComponent, network_config: &str, cni_args: &str) -> Result<(NormalizedConfig, Option<FlatFile>), ConfigLoadError> {
    let paths = engine.flat_file_paths(network_config).map_err(EngineFailure)??;
    let flat = find_flat_file(&paths)?;
    let config = engine.normalize(network_config, flat.as_ref().map(|f| f.text.as_str()), cni_args).map_err(EngineFailure)??;
    Ok((config, flat))
}

/// Reads the first existing flat file among `paths`; `None` when there is none.
pub fn find_flat_file(paths: &[String]) -> Result<Option<FlatFile>, ConfigLoadError> {
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
fn probe(path: &Path) -> Result<Option<bool>, ConfigLoadError> {
    match fs::metadata(path) {
        Ok(meta) => Ok(Some(meta.is_dir())),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(unreadable(path, e)),
    }
}

fn read(path: &Path) -> Result<FlatFile, ConfigLoadError> {
    fs::read_to_string(path).map(|text| FlatFile { path: path.to_path_buf(), text }).map_err(|e| unreadable(path, e))
}

fn unreadable(path: &Path, e: std::io::Error) -> ConfigLoadError {
    ConfigLoadError::FlatFile { path: path.to_path_buf(), source: e }
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
        // Found but unreadable (here: a directory where the file should be) names the file.
        fs::create_dir_all(dir.join("bad/whereabouts.conf")).unwrap();
        let e = find_flat_file(&[s("bad")]).unwrap_err();
        assert!(matches!(&e, ConfigLoadError::FlatFile { path, .. } if path.ends_with("bad/whereabouts.conf")), "{e:?}");
        fs::remove_dir_all(dir).unwrap();
    }
}
