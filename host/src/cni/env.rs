//! The `CNI_*` environment: which command, and the variables each command needs,
//! checked the way the reference skel library checks them so runtimes get the
//! same codes and messages from us as from any Go plugin.

use std::fmt;

use super::error::{CniError, code};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Gc,
    Status,
}

impl Command {
    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            _ => return None,
        })
    }

    /// Variables that must be present and non-empty (skel's table; the spec lets DEL
    /// run without CNI_NETNS, and GC/STATUS get empty container fields from libcni).
    fn required(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
            Command::Gc | Command::Status => &["CNI_PATH"],
            Command::Version => &[],
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Gc => "GC",
            Command::Status => "STATUS",
        })
    }
}

/// The environment of one CNI call, validated for its command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    pub command: Command,
    /// Empty for GC and STATUS.
    pub container_id: String,
    pub netns: String,
    /// Empty for GC and STATUS.
    pub ifname: String,
    /// The raw `CNI_ARGS` string; the engine parses it.
    pub args: String,
}

/// Reads and validates the environment. `lookup` is `std::env::var` in production;
/// tests pass a map.
pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<CniEnv, CniError> {
    let get = |name: &str| lookup(name).unwrap_or_default();
    let command_text = get("CNI_COMMAND");
    if command_text.is_empty() {
        return Err(missing(&["CNI_COMMAND"]));
    }
    let command = Command::parse(&command_text).ok_or_else(|| CniError::new(code::INVALID_ENV, format!("unknown CNI_COMMAND: {command_text}")))?;
    let missing_names: Vec<&str> = command.required().iter().copied().filter(|name| get(name).is_empty()).collect();
    if !missing_names.is_empty() {
        return Err(missing(&missing_names));
    }
    let env = CniEnv { command, container_id: get("CNI_CONTAINERID"), netns: get("CNI_NETNS"), ifname: get("CNI_IFNAME"), args: get("CNI_ARGS") };
    // Only what the command uses is validated: libcni sends empty values for GC/STATUS.
    if command.required().contains(&"CNI_CONTAINERID") {
        validate_container_id(&env.container_id)?;
    }
    if command.required().contains(&"CNI_IFNAME") {
        validate_ifname(&env.ifname)?;
    }
    Ok(env)
}

fn missing(names: &[&str]) -> CniError {
    CniError::new(code::INVALID_ENV, format!("required env variables [{}] missing", names.join(",")))
}

/// Container IDs: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (CNI's ValidateContainerID).
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    if id.is_empty() {
        return Err(CniError::new(code::UNKNOWN_CONTAINER, "missing containerID"));
    }
    let mut bytes = id.bytes();
    let valid = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric()) && bytes.all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if !valid {
        return Err(CniError::new(code::INVALID_ENV, "invalid characters in containerID").with_details(id));
    }
    Ok(())
}

/// Interface names as Linux accepts them (CNI's ValidateInterfaceName).
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let invalid = |msg: &str| Err(CniError::new(code::INVALID_ENV, msg).with_details(name));
    if name.is_empty() {
        return invalid("interface name is empty");
    }
    if name.len() > 15 {
        return Err(CniError::new(code::INVALID_ENV, "interface name is too long").with_details("interface name should be less than 16 characters"));
    }
    if name == "." || name == ".." {
        return invalid("interface name is . or ..");
    }
    if name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        return invalid("interface name contains / or : or whitespace characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<CniEnv, CniError> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn lists_every_missing_variable_like_skel() {
        let e = env(&[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "c1")]).unwrap_err();
        assert_eq!(e.code, 4);
        assert_eq!(e.msg, "required env variables [CNI_NETNS,CNI_IFNAME,CNI_PATH] missing");
        assert_eq!(env(&[]).unwrap_err().msg, "required env variables [CNI_COMMAND] missing");
    }

    #[test]
    fn del_needs_no_netns_and_gc_needs_only_path() {
        assert!(env(&[("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c"), ("CNI_IFNAME", "eth0"), ("CNI_PATH", "/opt/cni/bin")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/x"), ("CNI_CONTAINERID", ""), ("CNI_IFNAME", "")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
    }

    #[test]
    fn rejects_unknown_commands_and_bad_identifiers() {
        assert_eq!(env(&[("CNI_COMMAND", "FOO")]).unwrap_err().msg, "unknown CNI_COMMAND: FOO");
        let base = [("CNI_COMMAND", "ADD"), ("CNI_NETNS", "/n"), ("CNI_PATH", "/p")];
        let with = |id: &str, ifname: &str| {
            let mut pairs = base.to_vec();
            pairs.push(("CNI_CONTAINERID", id));
            pairs.push(("CNI_IFNAME", ifname));
            env(&pairs)
        };
        assert_eq!(with("-bad", "eth0").unwrap_err().msg, "invalid characters in containerID");
        assert_eq!(with("ok", "a/b").unwrap_err().msg, "interface name contains / or : or whitespace characters");
        assert_eq!(with("ok", "0123456789abcdef").unwrap_err().msg, "interface name is too long");
        assert_eq!(with("ok", "..").unwrap_err().code, 4);
        assert!(with("abc_1.2-3", "eth0").is_ok());
    }
}
