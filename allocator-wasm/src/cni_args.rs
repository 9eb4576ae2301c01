//! CNI_ARGS: `KEY=VALUE` pairs separated by `;`, as the CNI library's `LoadArgs`
//! reads them for whereabouts' argument struct.

use crate::error::{ConfigError, Result, code};

/// The keys whereabouts' argument struct (plus kubelet's `K8S_POD_UID`) knows.
const KNOWN_KEYS: [&str; 7] = ["IgnoreUnknown", "IP", "GATEWAY", "K8S_POD_NAME", "K8S_POD_NAMESPACE", "K8S_POD_INFRA_CONTAINER_ID", "K8S_POD_UID"];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    /// `IP=`: comma-separated static addresses (CIDRs).
    pub ip: Option<String>,
    /// `GATEWAY=`: comma-separated gateways for the static addresses.
    pub gateway: Option<String>,
}

impl CniArgs {
    /// `namespace/name`, or empty when no pod name was given.
    pub fn pod_ref(&self) -> String {
        if self.pod_name.is_empty() { String::new() } else { format!("{}/{}", self.pod_namespace, self.pod_name) }
    }
}

/// Go's `strconv.ParseBool`, which the CNI library uses for `IgnoreUnknown`.
fn parse_go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

fn invalid(detail: String) -> ConfigError {
    ConfigError::new(code::INVALID_ENV, "CNI_ARGS", format!("CNI_ARGS: {detail}"))
}

/// Every `KEY=VALUE` pair, in order (what a policy is shown of CNI_ARGS).
pub fn pairs(text: &str) -> Result<Vec<(&str, &str)>> {
    text.split(';')
        .filter(|p| !p.is_empty())
        .map(|pair| pair.split_once('=').ok_or_else(|| invalid(format!("invalid pair {pair:?} (expected KEY=VALUE)"))))
        .collect()
}

pub fn parse(text: &str) -> Result<CniArgs> {
    let pairs = pairs(text)?;
    let ignore_unknown = match pairs.iter().rev().find(|(k, _)| *k == "IgnoreUnknown") {
        Some((_, v)) => parse_go_bool(v).ok_or_else(|| invalid(format!("IgnoreUnknown={v:?} is not a boolean")))?,
        None => false,
    };
    let mut args = CniArgs::default();
    for (key, value) in pairs {
        match key {
            "K8S_POD_NAME" => args.pod_name = value.to_string(),
            "K8S_POD_NAMESPACE" => args.pod_namespace = value.to_string(),
            "IP" => args.ip = Some(value.to_string()).filter(|v| !v.is_empty()),
            "GATEWAY" => args.gateway = Some(value.to_string()).filter(|v| !v.is_empty()),
            k if KNOWN_KEYS.contains(&k) => {}
            k if ignore_unknown => {
                let _ = k;
            }
            k => return Err(invalid(format!("unknown key {k:?} (set IgnoreUnknown=1 to allow it)"))),
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_identity_from_args() {
        let a = parse("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u").unwrap();
        assert_eq!(a.pod_ref(), "default/web-0");
        assert_eq!(parse("").unwrap().pod_ref(), "");
    }

    #[test]
    fn unknown_keys_fail_unless_ignored() {
        let err = parse("FOO=bar").unwrap_err();
        assert_eq!((err.code, err.field.as_str()), (4, "CNI_ARGS"));
        assert!(err.message.contains("FOO"));
        assert!(parse("FOO=bar;IgnoreUnknown=true").is_ok());
        assert!(parse("IgnoreUnknown=0;FOO=bar").is_err());
        assert!(parse("novalue").is_err());
    }

    #[test]
    fn static_ip_and_gateway() {
        let a = parse("IP=192.0.2.9/24,2001:db8::9/64;GATEWAY=192.0.2.1").unwrap();
        assert_eq!(a.ip.as_deref(), Some("192.0.2.9/24,2001:db8::9/64"));
        assert_eq!(a.gateway.as_deref(), Some("192.0.2.1"));
    }
}
