//! keep-addresses: addresses a range must not hand out because something
//! outside thereabouts uses them (a router, a VIP, a printer), without
//! editing every network's `exclude`; optionally only even offsets (e.g.
//! when odd ones are paired with the even ones by something else).
//!
//! Settings: `{"deny": ["192.0.2.10", "192.0.2.16/30", "2001:db8::5"], "only_even": false}`.
//!
//! The answer is the built-in choice minus refusals: every deny-listed bare
//! address inside the range, and the candidates inside a deny-listed CIDR (a
//! CIDR is expanded only where it meets the candidates: a /64 holds 2^64
//! addresses). With `only_even`, the even-offset candidates (offset from the
//! range's network address) are preferred and the odd ones refused; with no
//! even candidate left, the range vetoes.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;

#[cfg(target_family = "wasm")]
mod component;

/// Most refusals in one answer. The host accepts more (1024), but the
/// built-in choice picks among the candidates, so refusals beyond them
/// rarely matter, and a long deny list must not make every answer large.
/// Candidates are refused first, so these are the ones kept.
pub const MAX_REFUSALS: usize = 256;
/// Most preferred addresses in one answer (the host's own limit).
pub const MAX_PREFERRED: usize = 256;

pub const DENY_REASON: &str = "deny-listed by settings";
pub const ODD_REASON: &str = "odd offset from the network (only_even)";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    only_even: bool,
}

#[derive(Debug, Default)]
pub struct Settings {
    pub deny: Vec<Block>,
    pub only_even: bool,
}

/// A deny-list entry: `len` leading bits of `net` (a bare address is /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub v6: bool,
    pub net: u128,
    pub len: u32,
}

impl Block {
    fn parse(text: &str) -> Option<Block> {
        let (addr, len) = text.split_once('/').map_or((text, None), |(a, l)| (a, Some(l)));
        let (v6, bits) = to_bits(addr.parse().ok()?);
        let width = if v6 { 128 } else { 32 };
        let len = match len {
            None => width,
            Some(l) => l.parse().ok().filter(|&l| l <= width)?,
        };
        // Host bits are cleared, as whereabouts does for `exclude`.
        Some(Block { v6, net: bits & mask(v6, len), len })
    }

    fn contains(&self, v6: bool, bits: u128) -> bool {
        self.v6 == v6 && bits & mask(v6, self.len) == self.net
    }

    fn is_single(&self) -> bool {
        self.len == if self.v6 { 128 } else { 32 }
    }
}

impl Settings {
    /// Parses and checks the settings; the error is shown to the operator as is.
    pub fn parse(text: &str) -> Result<Settings, String> {
        let raw: RawSettings = serde_json::from_str(text).map_err(|e| format!("keep-addresses settings: {e}"))?;
        let deny = raw
            .deny
            .iter()
            .enumerate()
            .map(|(i, entry)| Block::parse(entry).ok_or_else(|| format!("keep-addresses settings: deny[{i}] {entry:?} is neither an IP address nor a CIDR")))
            .collect::<Result<_, _>>()?;
        Ok(Settings { deny, only_even: raw.only_even })
    }
}

/// What the policy reads of a range.
pub struct Range<'a> {
    /// The network in CIDR form (host bits cleared).
    pub cidr: &'a str,
    pub first: &'a str,
    pub last: &'a str,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Choice {
    BuiltIn,
    Prefer(Vec<String>),
    Veto(String),
}

#[derive(Debug, PartialEq, Eq)]
pub struct Pick {
    pub choice: Choice,
    /// (address, reason), in address order within each kind.
    pub refused: Vec<(String, &'static str)>,
}

pub fn pick(settings: &Settings, range: &Range, candidates: &[String]) -> Pick {
    let (Some(network), Some((v6, first)), Some((_, last))) = (Block::parse(range.cidr), parse(range.first), parse(range.last)) else {
        return Pick { choice: Choice::Veto(format!("keep-addresses: cannot read range {}", range.cidr)), refused: Vec::new() };
    };
    let denied = |bits: u128| settings.deny.iter().any(|b| b.contains(v6, bits));
    // Candidates of this range's family, by address (a BTreeMap: sorted, no repeats).
    let candidates: BTreeMap<u128, &str> = candidates.iter().filter_map(|c| parse(c).filter(|(f, _)| *f == v6).map(|(_, bits)| (bits, c.as_str()))).collect();

    let mut refused: BTreeMap<u128, &'static str> = BTreeMap::new();
    for &bits in candidates.keys().filter(|&&b| denied(b)) {
        refused.insert(bits, DENY_REASON);
    }
    for block in settings.deny.iter().filter(|b| b.v6 == v6 && b.is_single() && (first..=last).contains(&b.net)) {
        refused.insert(block.net, DENY_REASON);
    }
    let mut refused: Vec<(u128, &'static str)> = refused.into_iter().collect();

    let choice = if settings.only_even {
        let allowed = candidates.iter().filter(|(bits, _)| !denied(**bits));
        let (even, odd): (Vec<_>, Vec<_>) = allowed.partition(|(bits, _)| (**bits - network.net) % 2 == 0);
        refused.extend(odd.iter().map(|(bits, _)| (**bits, ODD_REASON)));
        if even.is_empty() {
            Choice::Veto(format!("keep-addresses: no even-offset address among the {} candidates of {} (only_even)", candidates.len(), range.cidr))
        } else {
            Choice::Prefer(even.iter().take(MAX_PREFERRED).map(|(_, text)| text.to_string()).collect())
        }
    } else {
        Choice::BuiltIn
    };
    // Candidates first (they are what the built-in choice picks from), then
    // the other bare addresses; keep the first MAX_REFUSALS.
    refused.sort_by_key(|(bits, _)| (!candidates.contains_key(bits), *bits));
    refused.truncate(MAX_REFUSALS);
    let refused = refused.into_iter().map(|(bits, reason)| (to_text(v6, bits), reason)).collect();
    Pick { choice, refused }
}

fn parse(text: &str) -> Option<(bool, u128)> {
    text.parse().ok().map(to_bits)
}

fn to_bits(ip: IpAddr) -> (bool, u128) {
    match ip {
        IpAddr::V4(v4) => (false, u128::from(u32::from(v4))),
        IpAddr::V6(v6) => (true, u128::from(v6)),
    }
}

fn to_text(v6: bool, bits: u128) -> String {
    if v6 { std::net::Ipv6Addr::from(bits).to_string() } else { std::net::Ipv4Addr::from(bits as u32).to_string() }
}

fn mask(v6: bool, len: u32) -> u128 {
    let host_bits = if v6 { 128 } else { 32 } - len;
    let all = if v6 { u128::MAX } else { u128::from(u32::MAX) };
    if host_bits >= 128 { 0 } else { all & (u128::MAX << host_bits) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: Range = Range { cidr: "192.0.2.0/24", first: "192.0.2.1", last: "192.0.2.254" };
    const V6: Range = Range { cidr: "2001:db8::/64", first: "2001:db8::1", last: "2001:db8::ffff:ffff:ffff:fffe" };

    fn v4_candidates(from: u32, count: u32) -> Vec<String> {
        (from..from + count).map(|n| format!("192.0.2.{n}")).collect()
    }

    fn refused(pick: &Pick) -> Vec<&str> {
        pick.refused.iter().map(|(a, _)| a.as_str()).collect()
    }

    #[test]
    fn deny_listed_addresses_in_the_range_are_refused() {
        let s = Settings::parse(r#"{"deny": ["192.0.2.10", "192.0.2.16/30", "2001:db8::5", "198.51.100.1"]}"#).unwrap();
        let p = pick(&s, &V4, &v4_candidates(1, 20));
        assert_eq!(p.choice, Choice::BuiltIn);
        assert_eq!(refused(&p), ["192.0.2.10", "192.0.2.16", "192.0.2.17", "192.0.2.18", "192.0.2.19"]);
        assert!(p.refused.iter().all(|(_, why)| *why == DENY_REASON));
        // A bare address is refused even beyond the candidates; a CIDR only where it meets them.
        let p = pick(&s, &V4, &v4_candidates(1, 5));
        assert_eq!(refused(&p), ["192.0.2.10"]);
        let p = pick(&s, &V6, &["2001:db8::1".into(), "2001:db8::2".into()]);
        assert_eq!(refused(&p), ["2001:db8::5"]);
    }

    #[test]
    fn a_wide_cidr_stays_bounded() {
        let s = Settings::parse(r#"{"deny": ["192.0.2.0/24"]}"#).unwrap();
        let p = pick(&s, &V4, &v4_candidates(1, 254));
        assert_eq!(p.refused.len(), MAX_REFUSALS.min(254));
        let s = Settings::parse(r#"{"deny": ["2001:db8::/48"]}"#).unwrap();
        let many: Vec<String> = (1..=1000).map(|n| format!("2001:db8::{n:x}")).collect();
        let p = pick(&s, &V6, &many);
        assert_eq!(p.refused.len(), MAX_REFUSALS);
        assert_eq!(p.refused[0].0, "2001:db8::1");
    }

    #[test]
    fn refusals_of_candidates_come_before_other_bare_addresses() {
        let deny: Vec<String> = (1..=254).rev().map(|n| format!("\"192.0.2.{n}\"")).collect();
        let s = Settings::parse(&format!(r#"{{"deny": [{}, "192.0.2.0/24"]}}"#, deny.join(","))).unwrap();
        let p = pick(&s, &V4, &v4_candidates(200, 10));
        assert_eq!(p.refused.len(), MAX_REFUSALS.min(254));
        assert_eq!(&refused(&p)[..10], &v4_candidates(200, 10).iter().map(String::as_str).collect::<Vec<_>>()[..]);
        assert_eq!(p.refused[10].0, "192.0.2.1");
    }

    #[test]
    fn only_even_prefers_even_offsets_and_refuses_odd_ones() {
        let s = Settings::parse(r#"{"deny": ["192.0.2.4"], "only_even": true}"#).unwrap();
        let p = pick(&s, &V4, &v4_candidates(1, 6));
        assert_eq!(p.choice, Choice::Prefer(vec!["192.0.2.2".into(), "192.0.2.6".into()]));
        assert_eq!(refused(&p), ["192.0.2.1", "192.0.2.3", "192.0.2.4", "192.0.2.5"]);
        assert_eq!(p.refused.iter().find(|(a, _)| a == "192.0.2.3").unwrap().1, ODD_REASON);
        assert_eq!(p.refused.iter().find(|(a, _)| a == "192.0.2.4").unwrap().1, DENY_REASON);
    }

    #[test]
    fn only_even_without_an_even_candidate_vetoes() {
        let s = Settings::parse(r#"{"only_even": true}"#).unwrap();
        let p = pick(&s, &V4, &["192.0.2.3".into(), "192.0.2.5".into()]);
        assert!(matches!(&p.choice, Choice::Veto(why) if why.contains("no even-offset address among the 2 candidates")), "{p:?}");
        let p = pick(&s, &V4, &[]);
        assert!(matches!(p.choice, Choice::Veto(_)));
    }

    #[test]
    fn offsets_count_from_the_network_address() {
        let s = Settings::parse(r#"{"only_even": true}"#).unwrap();
        let r = Range { cidr: "2001:db8::/120", first: "2001:db8::1", last: "2001:db8::fe" };
        let p = pick(&s, &r, &["2001:db8::9".into(), "2001:db8::a".into()]);
        assert_eq!(p.choice, Choice::Prefer(vec!["2001:db8::a".into()]));
    }

    #[test]
    fn bad_settings_are_named() {
        for (text, needle) in [
            (r#"{"deny": ["192.0.2.300"]}"#, r#"deny[0] "192.0.2.300" is neither"#),
            (r#"{"deny": ["192.0.2.0/33"]}"#, "is neither"),
            (r#"{"deny": ["2001:db8::/129"]}"#, "is neither"),
            (r#"{"deny": "192.0.2.1"}"#, "invalid type"),
            (r#"{"only_even": "yes"}"#, "invalid type"),
            (r#"{"onlyEven": true}"#, "unknown field `onlyEven`"),
        ] {
            let e = Settings::parse(text).unwrap_err();
            assert!(e.starts_with("keep-addresses settings: ") && e.contains(needle), "{text}: {e}");
        }
        assert_eq!(Settings::parse(r#"{"deny": ["192.0.2.17/30"]}"#).unwrap().deny[0], Block { v6: false, net: 0xc000_0210, len: 30 });
    }
}
