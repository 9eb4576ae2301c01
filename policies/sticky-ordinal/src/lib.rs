//! sticky-ordinal: a StatefulSet pod `name-N` gets the same address every
//! time it is created, so a re-created `web-0` comes back where its peers and
//! clients knew it: in every range, `first + base + N`.
//!
//! Settings (JSON, every key optional):
//! - `base`: added to the ordinal (default 0), to keep the range's first
//!   addresses for other pods;
//! - `statefulsets`: the StatefulSet names (pod name prefixes) it applies to;
//!   without it every pod whose name ends in `-<digits>` counts, which also
//!   catches a Deployment pod whose random suffix happens to be all digits;
//! - `addresses`: explicit addresses by pod name, e.g.
//!   `{"web-0": ["192.0.2.50", "2001:db8::50"]}`: in each range, the entries
//!   inside the range's network are preferred over the ordinal rule.
//!
//! Every other pod, and an ordinal address the range does not hand out
//! (beyond `last`, excluded, the gateway), gets the built-in choice. An
//! ordinal address held by another pod is not given up: the answer names it
//! and the host fails the pick (or, with `on_error: ignore`, uses the
//! built-in choice), since handing out another address would break the
//! stickiness silently.
//!
//! The decisions are plain functions tested natively; `component` is the
//! wit-bindgen glue, compiled for wasm only.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;

#[cfg(target_family = "wasm")]
mod component;

/// Most explicit addresses for one pod: the host takes at most 256 preferred
/// addresses in one answer.
const MAX_EXPLICIT: usize = 256;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    #[serde(default)]
    pub base: u64,
    pub statefulsets: Option<Vec<String>>,
    #[serde(default)]
    pub addresses: BTreeMap<String, Vec<IpAddr>>,
}

impl Settings {
    /// Parses and checks the settings; the error is shown to the operator as is.
    pub fn parse(text: &str) -> Result<Settings, String> {
        let settings: Settings = serde_json::from_str(text).map_err(|e| format!("sticky-ordinal settings: {e}"))?;
        if let Some((pod, list)) = settings.addresses.iter().find(|(_, list)| list.len() > MAX_EXPLICIT) {
            return Err(format!("sticky-ordinal settings: addresses.{pod} lists {} addresses, at most {MAX_EXPLICIT}", list.len()));
        }
        Ok(settings)
    }
}

/// What the policy needs to know of a range (the WIT record's fields it reads).
pub struct Range<'a> {
    /// The network in CIDR form.
    pub cidr: &'a str,
    pub first: &'a str,
    pub last: &'a str,
    pub exclude_cidrs: &'a [String],
    pub gateway: Option<&'a str>,
}

/// The addresses to prefer for `pod_name` in `range`, or `None` for the
/// built-in choice.
pub fn preferred(settings: &Settings, pod_name: &str, range: &Range) -> Option<Vec<String>> {
    // Explicit entries first: the operator's own word, passed on unchecked
    // (an excluded one is the operator's mistake, and the host says so).
    if let Some(list) = settings.addresses.get(pod_name) {
        let here: Vec<String> = list.iter().filter(|ip| cidr_contains(range.cidr, **ip)).map(IpAddr::to_string).collect();
        if !here.is_empty() {
            return Some(here);
        }
    }
    let (set, ordinal) = ordinal(pod_name)?;
    if settings.statefulsets.as_ref().is_some_and(|names| !names.iter().any(|n| n == set)) {
        return None;
    }
    let first: IpAddr = range.first.parse().ok()?;
    let last: IpAddr = range.last.parse().ok()?;
    let wanted = to_bits(first).checked_add(u128::from(settings.base))?.checked_add(u128::from(ordinal))?;
    let wanted = from_bits(first, wanted)?;
    // Computed addresses are checked, so that a too-small range or an exclude
    // means the built-in choice rather than a bad answer.
    let handed_out = to_bits(wanted) <= to_bits(last)
        && range.gateway.and_then(|g| g.parse::<IpAddr>().ok()) != Some(wanted)
        && !range.exclude_cidrs.iter().any(|c| cidr_contains(c, wanted));
    handed_out.then(|| vec![wanted.to_string()])
}

/// `web-12` -> `("web", 12)`. A StatefulSet's ordinals have no leading zeros,
/// so `job-007` is not one of its pods.
pub fn ordinal(pod_name: &str) -> Option<(&str, u64)> {
    let (set, digits) = pod_name.rsplit_once('-')?;
    if set.is_empty() || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    Some((set, digits.parse().ok()?))
}

fn to_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// `bits` as an address of `like`'s family, if it fits.
fn from_bits(like: IpAddr, bits: u128) -> Option<IpAddr> {
    match like {
        IpAddr::V4(_) => Some(IpAddr::V4(u32::try_from(bits).ok()?.into())),
        IpAddr::V6(_) => Some(IpAddr::V6(bits.into())),
    }
}

/// Whether `ip` lies in `cidr` (`a/len`; a bare address is itself); false
/// across families and for text that does not parse.
fn cidr_contains(cidr: &str, ip: IpAddr) -> bool {
    let (net, len) = cidr.split_once('/').unwrap_or((cidr, ""));
    let Ok(net) = net.parse::<IpAddr>() else { return false };
    let width = if net.is_ipv4() { 32 } else { 128 };
    let len: u32 = if len.is_empty() { width } else { len.parse().unwrap_or(u32::MAX) };
    if net.is_ipv4() != ip.is_ipv4() || len > width {
        return false;
    }
    let host_bits = width - len;
    let mask = if host_bits >= 128 { 0 } else { !0u128 << host_bits };
    to_bits(net) & mask == to_bits(ip) & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: Range = Range { cidr: "192.0.2.0/24", first: "192.0.2.1", last: "192.0.2.254", exclude_cidrs: &[], gateway: None };
    const V6: Range = Range { cidr: "2001:db8::/64", first: "2001:db8::1", last: "2001:db8::ffff:ffff:ffff:fffe", exclude_cidrs: &[], gateway: None };

    fn settings(text: &str) -> Settings {
        Settings::parse(text).unwrap()
    }

    #[test]
    fn an_ordinal_maps_to_first_plus_base_plus_n_in_each_family() {
        assert_eq!(preferred(&settings("{}"), "web-0", &V4), Some(vec!["192.0.2.1".into()]));
        assert_eq!(preferred(&settings("{}"), "web-3", &V6), Some(vec!["2001:db8::4".into()]));
        assert_eq!(preferred(&settings(r#"{"base": 10}"#), "web-3", &V4), Some(vec!["192.0.2.14".into()]));
    }

    #[test]
    fn pods_without_an_ordinal_get_the_built_in_choice() {
        for name in ["web", "web-", "-3", "web-x1", "job-007", ""] {
            assert_eq!(preferred(&settings("{}"), name, &V4), None, "{name}");
        }
        assert_eq!(ordinal("my-web-12"), Some(("my-web", 12)));
    }

    #[test]
    fn statefulsets_limit_the_prefixes() {
        let s = settings(r#"{"statefulsets": ["db"]}"#);
        assert_eq!(preferred(&s, "web-1", &V4), None);
        assert_eq!(preferred(&s, "db-1", &V4), Some(vec!["192.0.2.2".into()]));
    }

    #[test]
    fn an_address_the_range_does_not_hand_out_falls_back_to_built_in() {
        assert_eq!(preferred(&settings("{}"), "web-254", &V4), None, "beyond last");
        assert_eq!(preferred(&settings("{}"), "web-4294967295", &V4), None, "beyond the family");
        let excludes = ["192.0.2.0/30".to_string()];
        let excluded = Range { exclude_cidrs: &excludes, ..V4 };
        assert_eq!(preferred(&settings("{}"), "web-2", &excluded), None);
        assert_eq!(preferred(&settings("{}"), "web-3", &excluded), Some(vec!["192.0.2.4".into()]));
        let gateway = Range { gateway: Some("192.0.2.1"), ..V4 };
        assert_eq!(preferred(&settings("{}"), "web-0", &gateway), None);
    }

    #[test]
    fn explicit_addresses_win_in_the_range_of_their_family() {
        let s = settings(r#"{"addresses": {"web-0": ["192.0.2.50", "2001:db8::50"], "cache": ["198.51.100.7"]}}"#);
        assert_eq!(preferred(&s, "web-0", &V4), Some(vec!["192.0.2.50".into()]));
        assert_eq!(preferred(&s, "web-0", &V6), Some(vec!["2001:db8::50".into()]));
        // Not in this range: the ordinal rule, or nothing for a name without one.
        assert_eq!(preferred(&s, "cache", &V4), None);
    }

    #[test]
    fn bad_settings_are_named() {
        for (text, needle) in [
            (r#"{"bsae": 1}"#, "unknown field `bsae`"),
            (r#"{"base": -1}"#, "invalid value"),
            (r#"{"base": "1"}"#, "invalid type"),
            (r#"{"statefulsets": "web"}"#, "invalid type"),
            (r#"{"addresses": {"web-0": ["192.0.2.300"]}}"#, "invalid IP address"),
            ("7", "invalid type"),
        ] {
            let e = Settings::parse(text).unwrap_err();
            assert!(e.starts_with("sticky-ordinal settings: ") && e.contains(needle), "{text}: {e}");
        }
        let many = format!(r#"{{"addresses": {{"web-0": [{}]}}}}"#, vec![r#""192.0.2.9""#; 257].join(","));
        assert!(Settings::parse(&many).unwrap_err().contains("at most 256"));
    }

    #[test]
    fn cidr_containment() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(cidr_contains("192.0.2.0/24", ip("192.0.2.255")));
        assert!(!cidr_contains("192.0.2.0/24", ip("192.0.3.0")));
        assert!(cidr_contains("0.0.0.0/0", ip("203.0.113.1")));
        assert!(!cidr_contains("192.0.2.0/24", ip("2001:db8::1")));
        assert!(cidr_contains("2001:db8::5", ip("2001:db8::5")));
        assert!(cidr_contains("::/0", ip("2001:db8::5")));
    }
}
