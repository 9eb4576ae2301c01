//! wit-bindgen glue: WIT records in, the plain functions of the crate root
//! decide. Compiled only for wasm (the export names do not link natively).

wit_bindgen::generate!({ world: "policy-extension", path: "../../wit" });

use exports::thereabouts::ipam::policy::{AttachmentInput, Choice, Guest, Needs, Pick};

struct Component;

impl Guest for Component {
    fn validate_settings(settings: String) -> Result<Needs, String> {
        let settings = crate::Settings::parse(&settings)?;
        Ok(if settings.needs_labels() { Needs::POD_LABELS } else { Needs::empty() })
    }

    fn select_ranges(input: AttachmentInput) -> Result<Vec<u32>, String> {
        let settings = crate::Settings::parse(&input.settings)?;
        let labels = input.pod.as_ref().map_or(&[][..], |p| &p.labels[..]);
        crate::select(&settings, &input.pod_namespace, labels, input.config.ranges.len())
    }

    fn pick_address(_input: AttachmentInput, _range_index: u32, _candidates: Vec<String>) -> Pick {
        Pick { choice: Choice::BuiltIn, refused: Vec::new() }
    }
}

export!(Component);
