//! wit-bindgen glue: WIT records in, the plain functions of the crate root
//! decide. Compiled only for wasm (the export names do not link natively).

wit_bindgen::generate!({ world: "policy-extension", path: "../../wit" });

use exports::thereabouts::ipam::policy::{AttachmentInput, Choice, Guest, Needs, Pick};

struct Component;

impl Guest for Component {
    fn validate_settings(settings: String) -> Result<Needs, String> {
        crate::Settings::parse(&settings).map(|_| Needs::empty())
    }

    fn select_ranges(input: AttachmentInput) -> Result<Vec<u32>, String> {
        // Every range: stickiness is about addresses, not ranges.
        Ok((0..input.config.ranges.len() as u32).collect())
    }

    fn pick_address(input: AttachmentInput, range_index: u32, _candidates: Vec<String>) -> Pick {
        // The host validated the settings at load; a failure here still
        // vetoes (visible) rather than silently giving up stickiness.
        let settings = match crate::Settings::parse(&input.settings) {
            Ok(s) => s,
            Err(e) => return Pick { choice: Choice::Veto(e), refused: Vec::new() },
        };
        let Some(r) = input.config.ranges.get(range_index as usize) else {
            return Pick { choice: Choice::Veto(format!("range index {range_index} is not in the config")), refused: Vec::new() };
        };
        let range = crate::Range { cidr: &r.cidr, first: &r.first, last: &r.last, exclude_cidrs: &r.exclude_cidrs, gateway: r.gateway.as_deref() };
        let choice = crate::preferred(&settings, &input.pod_name, &range).map_or(Choice::BuiltIn, Choice::Prefer);
        Pick { choice, refused: Vec::new() }
    }
}

export!(Component);
