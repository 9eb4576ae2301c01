//! wit-bindgen glue: WIT records in, the plain functions of the crate root
//! decide. Compiled only for wasm (the export names do not link natively).

wit_bindgen::generate!({ world: "policy-extension", path: "../../wit" });

use exports::thereabouts::ipam::policy::{AttachmentInput, Choice, Guest, Needs, Pick, Refusal};

struct Component;

impl Guest for Component {
    fn validate_settings(settings: String) -> Result<Needs, String> {
        crate::Settings::parse(&settings).map(|_| Needs::empty())
    }

    fn select_ranges(input: AttachmentInput) -> Result<Vec<u32>, String> {
        Ok((0..input.config.ranges.len() as u32).collect())
    }

    fn pick_address(input: AttachmentInput, range_index: u32, candidates: Vec<String>) -> Pick {
        // Validated at load; failing here vetoes, since handing out a
        // deny-listed address is what this policy exists to prevent.
        let settings = match crate::Settings::parse(&input.settings) {
            Ok(s) => s,
            Err(e) => return Pick { choice: Choice::Veto(e), refused: Vec::new() },
        };
        let Some(r) = input.config.ranges.get(range_index as usize) else {
            return Pick { choice: Choice::Veto(format!("range index {range_index} is not in the config")), refused: Vec::new() };
        };
        let pick = crate::pick(&settings, &crate::Range { cidr: &r.cidr, first: &r.first, last: &r.last }, &candidates);
        let choice = match pick.choice {
            crate::Choice::BuiltIn => Choice::BuiltIn,
            crate::Choice::Prefer(list) => Choice::Prefer(list),
            crate::Choice::Veto(why) => Choice::Veto(why),
        };
        Pick { choice, refused: pick.refused.into_iter().map(|(address, reason)| Refusal { address, reason: reason.to_string() }).collect() }
    }
}

export!(Component);
