//! The node a CNI call runs on, for node slices: found as whereabouts finds it,
//! so a node keeps its slices when the plugins are swapped. `NODENAME` first,
//! then `<configuration_path>/nodename` (the installer writes it), then, when
//! `configuration_path` names the flat file itself rather than its directory,
//! `nodename` beside that file (whereabouts looks under the file and finds
//! nothing), then `/etc/hostname`; the first 1024 bytes, trimmed.

use std::io::Read;
use std::path::Path;

/// No way to tell which node this is.
#[derive(Debug, thiserror::Error)]
#[error("cannot tell which node this is (node_slice_size needs it): NODENAME is unset and neither {nodename_file} nor {hostname_file} holds a name")]
pub struct UnknownNode {
    nodename_file: String,
    hostname_file: String,
}

/// This node's name, from the process environment and files.
pub fn discover(configuration_path: Option<&str>) -> Result<String, UnknownNode> {
    discover_from(|key| std::env::var(key).ok(), configuration_path, Path::new("/etc/hostname"))
}

/// [`discover`] with the environment and the host-name file given.
pub fn discover_from(env: impl Fn(&str) -> Option<String>, configuration_path: Option<&str>, hostname_file: &Path) -> Result<String, UnknownNode> {
    if let Some(name) = env("NODENAME").map(|n| n.trim().to_string()).filter(|n| !n.is_empty()) {
        return Ok(name);
    }
    // whereabouts joins the two with a '/', an unset path included.
    let nodename_file = format!("{}/nodename", configuration_path.unwrap_or_default());
    let beside_flat_file = configuration_path.map(Path::new).filter(|p| p.is_file()).and_then(Path::parent).map(|dir| dir.join("nodename"));
    let found = [Some(Path::new(&nodename_file)), beside_flat_file.as_deref(), Some(hostname_file)]
        .into_iter()
        .flatten()
        .find_map(|path| first_kib(path).map(|text| text.trim().to_string()).filter(|n| !n.is_empty()));
    found.ok_or_else(|| UnknownNode { nodename_file, hostname_file: hostname_file.display().to_string() })
}

fn first_kib(path: &Path) -> Option<String> {
    let mut bytes = Vec::with_capacity(1024);
    std::fs::File::open(path).ok()?.take(1024).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodename_then_the_configuration_path_file_then_the_host_name() {
        let dir = std::env::temp_dir().join(format!("thereabouts-node-name-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hostname = dir.join("hostname");
        std::fs::write(&hostname, "host-from-file\n").unwrap();
        let conf = dir.to_str().unwrap();
        let none = |_: &str| None;
        assert_eq!(discover_from(|_| Some(" node-env \n".into()), Some(conf), &hostname).unwrap(), "node-env");
        assert_eq!(discover_from(none, Some(conf), &hostname).unwrap(), "host-from-file");
        std::fs::write(dir.join("nodename"), "node-from-installer\n").unwrap();
        assert_eq!(discover_from(none, Some(conf), &hostname).unwrap(), "node-from-installer");
        assert_eq!(discover_from(|_| Some(String::new()), Some(conf), &hostname).unwrap(), "node-from-installer");
        // configuration_path naming the flat file: the nodename beside it.
        let flat_file = dir.join("thereabouts.conf");
        std::fs::write(&flat_file, "{}").unwrap();
        assert_eq!(discover_from(none, flat_file.to_str(), &hostname).unwrap(), "node-from-installer");
        let err = discover_from(none, None, &dir.join("missing")).unwrap_err().to_string();
        assert!(err.contains("NODENAME is unset") && err.contains("/nodename"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
