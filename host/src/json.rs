//! The one JSON printer of the binary: 4-space indent and a final newline, as the
//! CNI reference library prints results. A leaf module, so the CNI documents, the
//! CLI's reports and the file store's pool documents can share it without
//! depending on each other.

use serde::Serialize;

pub fn pretty(value: &impl Serialize) -> String {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(b"    "));
    // Serializing a Value or a derive(Serialize) type into a Vec cannot fail.
    if value.serialize(&mut serializer).is_err() {
        return "{}\n".into();
    }
    let mut text = String::from_utf8_lossy(&out).into_owned();
    text.push('\n');
    text
}
