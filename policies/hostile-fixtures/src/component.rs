//! wit-bindgen glue: each hook misbehaves when the settings choose it, and
//! answers normally otherwise. Compiled only for wasm.

wit_bindgen::generate!({ world: "policy-extension", path: "../../wit" });

use std::cell::RefCell;

use exports::thereabouts::ipam::policy::{AttachmentInput, Choice, Guest, Needs, Pick, Refusal};
use exports::thereabouts::ipam::types::IpFamily;

use crate::{Hook, Misbehaviour, Settings};

struct Component;

thread_local! {
    /// Calls of this instance (`count-calls`): an instance's memory is its
    /// own, so this lives exactly as long as the host keeps the instance.
    static SEEN: RefCell<crate::Seen> = RefCell::default();
}

fn count(pod: Option<&str>) {
    SEEN.with(|s| s.borrow_mut().call(pod));
}

/// The misbehaviours that never return, whatever the hook.
fn diverge(action: Misbehaviour) {
    match action {
        Misbehaviour::Loop => crate::spin(),
        Misbehaviour::MemoryBomb => crate::hoard(),
        Misbehaviour::Recursion => {
            std::hint::black_box(crate::recurse(0));
            // Unreachable in practice (the stack runs out first).
            panic!("hostile-fixtures: recursion returned");
        }
        Misbehaviour::Trap => panic!("hostile-fixtures: trap on purpose"),
        _ => {}
    }
}

impl Guest for Component {
    fn validate_settings(settings: String) -> Result<Needs, String> {
        count(None);
        let settings = Settings::parse(&settings)?;
        match settings.on(Hook::ValidateSettings) {
            Some(Misbehaviour::HugeOutput) => Err(crate::huge_text()),
            Some(Misbehaviour::RejectSettings) => Err("hostile-fixtures: settings rejected on purpose".into()),
            Some(action) => {
                diverge(action);
                Ok(Needs::empty())
            }
            None => Ok(Needs::empty()),
        }
    }

    fn select_ranges(input: AttachmentInput) -> Result<Vec<u32>, String> {
        count(Some(&input.pod_name));
        let settings = Settings::parse(&input.settings)?;
        let count = input.config.ranges.len() as u32;
        match settings.on(Hook::SelectRanges) {
            Some(Misbehaviour::HugeOutput) => Err(crate::huge_text()),
            Some(Misbehaviour::OutOfRange) => Ok(vec![count]),
            Some(action) => {
                diverge(action);
                Ok((0..count).collect())
            }
            None => Ok((0..count).collect()),
        }
    }

    fn pick_address(input: AttachmentInput, range_index: u32, _candidates: Vec<String>) -> Pick {
        count(Some(&input.pod_name));
        let pick = |choice| Pick { choice, refused: Vec::new() };
        let settings = match Settings::parse(&input.settings) {
            Ok(s) => s,
            Err(e) => return pick(Choice::Veto(e)),
        };
        let Some(action) = settings.on(Hook::PickAddress) else { return pick(Choice::BuiltIn) };
        if action == Misbehaviour::CountCalls {
            let refused =
                input.config.ranges.get(range_index as usize).map(|r| Refusal { address: r.last.clone(), reason: SEEN.with(|s| s.borrow().reason()) });
            return Pick { choice: Choice::BuiltIn, refused: refused.into_iter().collect() };
        }
        diverge(action);
        let Some(r) = input.config.ranges.get(range_index as usize) else {
            return pick(Choice::Veto(format!("range index {range_index} is not in the config")));
        };
        let range = crate::Range {
            last: &r.last,
            first: &r.first,
            exclude_cidrs: &r.exclude_cidrs,
            gateway: r.gateway.as_deref(),
            v6: matches!(r.family, IpFamily::Ipv6),
        };
        match action {
            Misbehaviour::HugeOutput => pick(Choice::Prefer(crate::million_addresses(&r.first))),
            Misbehaviour::Taken | Misbehaviour::Excluded | Misbehaviour::OutOfRange | Misbehaviour::OtherFamily => {
                match crate::bad_address(action, &settings, &range) {
                    Ok(address) => pick(Choice::Prefer(vec![address])),
                    Err(why) => pick(Choice::Veto(why)),
                }
            }
            _ => pick(Choice::BuiltIn),
        }
    }
}

export!(Component);
