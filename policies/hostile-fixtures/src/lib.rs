//! hostile-fixtures: a policy that misbehaves on purpose, for the host's
//! tests of its bounds (time, memory, stack, traps, answer sizes, answers
//! the engine must refuse). Never deploy it.
//!
//! Settings: `{"hook": "validate-settings"|"select-ranges"|"pick-address", "do": <misbehaviour>, "address": "<ip>"}`;
//! `{}` behaves everywhere. The chosen hook misbehaves; the others answer
//! normally (no needs, every range, built-in choice). Misbehaviours:
//! - `loop`: spins forever (the epoch deadline must stop it);
//! - `memory-bomb`: allocates and touches 1 MiB after 1 MiB (the memory limit);
//! - `recursion`: recurses without end (the stack limit);
//! - `trap`: panics, which is `unreachable` under panic=abort;
//! - `huge-output`: a 16 MiB error text, or (pick-address) a million
//!   preferred addresses;
//! - `taken`: prefers settings' `address`, else the range's first address
//!   (the test makes it taken);
//! - `excluded`: prefers the range's first exclude, else `address`, else its gateway;
//! - `out-of-range`: prefers the address after the range's last one
//!   (select-ranges: a range index past the config's);
//! - `other-family`: prefers an address of the other family;
//! - `reject-settings`: validate-settings answers an error;
//! - `count-calls` (pick-address): not a misbehaviour but a probe of the
//!   host's instances. Every hook counts the calls this instance answered
//!   and the pods it was asked about; pick-address answers the built-in
//!   choice and refuses the range's last address with the reason
//!   `call <n> of this instance, pods <names>` (`thereabouts preview` shows it).

use std::hint::black_box;
use std::net::IpAddr;

use serde::Deserialize;

#[cfg(target_family = "wasm")]
mod component;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hook {
    ValidateSettings,
    SelectRanges,
    PickAddress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Misbehaviour {
    Loop,
    MemoryBomb,
    Recursion,
    Trap,
    HugeOutput,
    Taken,
    Excluded,
    OutOfRange,
    OtherFamily,
    RejectSettings,
    CountCalls,
}

/// What this instance answered so far (`count-calls`): calls, and the pods
/// of its attachment calls in order, each once.
#[derive(Debug, Default)]
pub struct Seen {
    pub calls: u32,
    pub pods: Vec<String>,
}

impl Seen {
    /// One more call, for `pod` if it is an attachment's.
    pub fn call(&mut self, pod: Option<&str>) {
        self.calls += 1;
        if let Some(pod) = pod.filter(|p| !self.pods.iter().any(|seen| seen == p)) {
            self.pods.push(pod.to_string());
        }
    }

    pub fn reason(&self) -> String {
        format!("call {} of this instance, pods {}", self.calls, self.pods.join(","))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub hook: Option<Hook>,
    #[serde(rename = "do")]
    pub action: Option<Misbehaviour>,
    pub address: Option<IpAddr>,
}

impl Settings {
    pub fn parse(text: &str) -> Result<Settings, String> {
        let s: Settings = serde_json::from_str(text).map_err(|e| format!("hostile-fixtures settings: {e}"))?;
        if s.hook.is_some() != s.action.is_some() {
            return Err("hostile-fixtures settings: give both `hook` and `do`, or neither".into());
        }
        Ok(s)
    }

    /// The misbehaviour chosen for `hook`, if it is the chosen hook.
    pub fn on(&self, hook: Hook) -> Option<Misbehaviour> {
        self.action.filter(|_| self.hook == Some(hook))
    }
}

/// What the misbehaviours read of a range.
pub struct Range<'a> {
    pub last: &'a str,
    pub first: &'a str,
    pub exclude_cidrs: &'a [String],
    pub gateway: Option<&'a str>,
    pub v6: bool,
}

/// The address a `taken` / `excluded` / `out-of-range` / `other-family`
/// pick prefers; `Err` when the range offers none of that kind.
pub fn bad_address(action: Misbehaviour, settings: &Settings, range: &Range) -> Result<String, String> {
    let from_settings = settings.address.map(|a| a.to_string());
    match action {
        Misbehaviour::Taken => Ok(from_settings.unwrap_or_else(|| range.first.to_string())),
        Misbehaviour::Excluded => range
            .exclude_cidrs
            .first()
            .map(|c| c.split('/').next().unwrap_or(c).to_string())
            .or(from_settings)
            .or_else(|| range.gateway.map(str::to_string))
            .ok_or_else(|| "hostile-fixtures: the range has no exclude or gateway, and settings no address".to_string()),
        Misbehaviour::OutOfRange => {
            // One past `last`: the broadcast address, or past `range_end`;
            // never handed out. Wraps at the top of the family.
            let last: IpAddr = range.last.parse().map_err(|_| format!("hostile-fixtures: cannot read {}", range.last))?;
            Ok(match last {
                IpAddr::V4(v4) => IpAddr::from(u32::from(v4).wrapping_add(1).to_be_bytes()),
                IpAddr::V6(v6) => IpAddr::from(u128::from(v6).wrapping_add(1).to_be_bytes()),
            }
            .to_string())
        }
        Misbehaviour::OtherFamily => Ok(if range.v6 { "192.0.2.1" } else { "2001:db8::1" }.to_string()),
        other => Err(format!("hostile-fixtures: {other:?} is not an address")),
    }
}

/// Spins forever. The counter goes through `black_box` so the optimizer can
/// neither prove the loop does nothing nor fold it.
pub fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

/// Allocates 1 MiB chunks and writes one byte per 4 KiB page of each (so
/// the pages are really used), keeping them all, until the host stops it.
pub fn hoard() -> ! {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0u8; 1 << 20];
        for page in chunk.chunks_mut(4096) {
            // SAFETY: a valid, exclusive pointer to the page's first byte.
            unsafe { std::ptr::write_volatile(page.as_mut_ptr(), 1) };
        }
        chunks.push(chunk);
        black_box(&chunks);
    }
}

/// Recurses without end. The result of the inner call is combined after it
/// returns (and hidden from the optimizer), so this cannot become a loop.
#[inline(never)]
pub fn recurse(depth: u64) -> u64 {
    if black_box(depth) == u64::MAX {
        return 0;
    }
    let below = recurse(black_box(depth + 1));
    black_box(below).rotate_left(1) ^ depth
}

/// A 16 MiB error text.
pub fn huge_text() -> String {
    "x".repeat(16 << 20)
}

/// A million preferred addresses.
pub fn million_addresses(address: &str) -> Vec<String> {
    vec![address.to_string(); 1_000_000]
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: Range = Range { last: "192.0.2.254", first: "192.0.2.1", exclude_cidrs: &[], gateway: None, v6: false };

    #[test]
    fn settings_choose_one_hook() {
        let s = Settings::parse(r#"{"hook": "pick-address", "do": "memory-bomb"}"#).unwrap();
        assert_eq!(s.on(Hook::PickAddress), Some(Misbehaviour::MemoryBomb));
        assert_eq!(s.on(Hook::SelectRanges), None);
        assert_eq!(Settings::parse("{}").unwrap().on(Hook::ValidateSettings), None);
        for text in [r#"{"hook": "pick-address"}"#, r#"{"hook": "pick", "do": "loop"}"#, r#"{"hook": "pick-address", "do": "sleep"}"#, r#"{"x": 1}"#] {
            assert!(Settings::parse(text).unwrap_err().starts_with("hostile-fixtures settings: "), "{text}");
        }
    }

    #[test]
    fn bad_addresses_come_from_the_range() {
        let none = Settings::default();
        let with = Settings::parse(r#"{"address": "192.0.2.77"}"#).unwrap();
        assert_eq!(bad_address(Misbehaviour::Taken, &none, &V4).unwrap(), "192.0.2.1");
        assert_eq!(bad_address(Misbehaviour::Taken, &with, &V4).unwrap(), "192.0.2.77");
        assert_eq!(bad_address(Misbehaviour::OutOfRange, &none, &V4).unwrap(), "192.0.2.255");
        assert_eq!(bad_address(Misbehaviour::OtherFamily, &none, &V4).unwrap(), "2001:db8::1");
        let excludes = ["192.0.2.16/30".to_string()];
        assert_eq!(bad_address(Misbehaviour::Excluded, &with, &Range { exclude_cidrs: &excludes, ..V4 }).unwrap(), "192.0.2.16");
        assert_eq!(bad_address(Misbehaviour::Excluded, &with, &V4).unwrap(), "192.0.2.77");
        assert_eq!(bad_address(Misbehaviour::Excluded, &none, &Range { gateway: Some("192.0.2.1"), ..V4 }).unwrap(), "192.0.2.1");
        assert!(bad_address(Misbehaviour::Excluded, &none, &V4).is_err());
        let v6 = Range { last: "2001:db8::ffff:ffff:ffff:fffe", first: "2001:db8::1", exclude_cidrs: &[], gateway: None, v6: true };
        assert_eq!(bad_address(Misbehaviour::OutOfRange, &none, &v6).unwrap(), "2001:db8::ffff:ffff:ffff:ffff");
        assert_eq!(bad_address(Misbehaviour::OtherFamily, &none, &v6).unwrap(), "192.0.2.1");
    }

    #[test]
    fn huge_outputs_are_huge() {
        assert_eq!(huge_text().len(), 16 << 20);
        assert_eq!(million_addresses("192.0.2.1").len(), 1_000_000);
    }
}
