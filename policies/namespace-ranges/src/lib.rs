//! namespace-ranges: which of a config's ranges an attachment gets, by pod
//! label or namespace, so that one network can keep, say, a database tier or
//! a team in ranges of its own.
//!
//! Settings (JSON, every key optional):
//! `{"namespaces": {"team-a": [0, 1]}, "labels": [{"key": "tier", "value": "db", "ranges": [2]}], "default": [0]}`.
//! Label rules are tried first, in order (the first match wins), then the
//! namespace, then `default`; without `default`, all ranges. Indexes are
//! into the config's ranges; an empty list refuses the attachment. The pod's
//! labels are asked for (`pod-labels`, one Pod read by the host) only when
//! there are label rules. Addresses are the built-in choice.

use std::collections::BTreeMap;

use serde::Deserialize;

#[cfg(target_family = "wasm")]
mod component;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    #[serde(default)]
    pub namespaces: BTreeMap<String, Vec<u32>>,
    #[serde(default)]
    pub labels: Vec<LabelRule>,
    pub default: Option<Vec<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelRule {
    pub key: String,
    pub value: String,
    pub ranges: Vec<u32>,
}

impl Settings {
    /// Parses and checks the settings; the error is shown to the operator as is.
    pub fn parse(text: &str) -> Result<Settings, String> {
        let settings: Settings = serde_json::from_str(text).map_err(|e| format!("namespace-ranges settings: {e}"))?;
        // The host refuses an answer that repeats a range; say so at load
        // rather than at the first ADD that hits the rule.
        let mut lists: Vec<(String, &[u32])> = settings.labels.iter().enumerate().map(|(i, r)| (format!("labels[{i}].ranges"), &r.ranges[..])).collect();
        lists.extend(settings.namespaces.iter().map(|(ns, l)| (format!("namespaces.{ns}"), &l[..])));
        lists.extend(settings.default.iter().map(|l| ("default".to_string(), &l[..])));
        for (at, list) in lists {
            if let Some(i) = list.iter().enumerate().find_map(|(i, r)| list[..i].contains(r).then_some(*r)) {
                return Err(format!("namespace-ranges settings: {at} lists range {i} twice"));
            }
        }
        Ok(settings)
    }

    /// Whether the pod's labels are needed (there are label rules).
    pub fn needs_labels(&self) -> bool {
        !self.labels.is_empty()
    }
}

/// The ranges for a pod of `namespace` with `labels` (none when not read),
/// among `range_count` ranges; `Err` refuses the attachment with that reason.
pub fn select(settings: &Settings, namespace: &str, labels: &[(String, String)], range_count: usize) -> Result<Vec<u32>, String> {
    let label_rule = settings
        .labels
        .iter()
        .enumerate()
        .find(|(_, rule)| labels.iter().any(|(k, v)| *k == rule.key && *v == rule.value))
        .map(|(i, rule)| (format!("label rule {i} ({}={})", rule.key, rule.value), &rule.ranges));
    let chosen = label_rule
        .or_else(|| settings.namespaces.get(namespace).map(|l| (format!("namespace {namespace:?}"), l)))
        .or_else(|| settings.default.as_ref().map(|l| ("default".to_string(), l)));
    let Some((rule, ranges)) = chosen else {
        return Ok((0..range_count as u32).collect());
    };
    if ranges.is_empty() {
        return Err(format!("namespace-ranges: {rule} gives this pod no range"));
    }
    // The config can have fewer ranges than the settings assume; the host
    // checks too, but this message names the rule.
    if let Some(r) = ranges.iter().find(|&&r| r as usize >= range_count) {
        return Err(format!("namespace-ranges: {rule} names range {r}, but the config has {range_count} (indexes 0 to {})", range_count as i64 - 1));
    }
    Ok(ranges.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{"namespaces": {"team-a": [0, 1]}, "labels": [{"key": "tier", "value": "db", "ranges": [2]}, {"key": "tier", "value": "none", "ranges": []}], "default": [0]}"#;

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn labels_then_namespace_then_default() {
        let s = Settings::parse(EXAMPLE).unwrap();
        assert_eq!(select(&s, "team-a", &labels(&[("tier", "db")]), 3), Ok(vec![2]));
        assert_eq!(select(&s, "team-a", &labels(&[("tier", "web")]), 3), Ok(vec![0, 1]));
        assert_eq!(select(&s, "team-b", &[], 3), Ok(vec![0]));
    }

    #[test]
    fn without_default_every_range() {
        let s = Settings::parse(r#"{"namespaces": {"team-a": [1]}}"#).unwrap();
        assert_eq!(select(&s, "other", &[], 3), Ok(vec![0, 1, 2]));
        assert_eq!(select(&Settings::parse("{}").unwrap(), "x", &[], 2), Ok(vec![0, 1]));
    }

    #[test]
    fn the_first_matching_label_rule_wins() {
        let s = Settings::parse(r#"{"labels": [{"key": "a", "value": "1", "ranges": [1]}, {"key": "b", "value": "2", "ranges": [0]}]}"#).unwrap();
        assert_eq!(select(&s, "ns", &labels(&[("b", "2"), ("a", "1")]), 2), Ok(vec![1]));
    }

    #[test]
    fn an_empty_list_refuses_and_an_index_beyond_the_config_is_named() {
        let s = Settings::parse(EXAMPLE).unwrap();
        let refused = select(&s, "team-a", &labels(&[("tier", "none")]), 3).unwrap_err();
        assert!(refused.contains("label rule 1 (tier=none) gives this pod no range"), "{refused}");
        let beyond = select(&s, "team-a", &labels(&[("tier", "db")]), 2).unwrap_err();
        assert!(beyond.contains("label rule 0 (tier=db) names range 2, but the config has 2"), "{beyond}");
    }

    #[test]
    fn labels_are_needed_only_with_label_rules() {
        assert!(Settings::parse(EXAMPLE).unwrap().needs_labels());
        assert!(!Settings::parse(r#"{"namespaces": {"a": [0]}, "labels": []}"#).unwrap().needs_labels());
    }

    #[test]
    fn bad_settings_are_named() {
        for (text, needle) in [
            (r#"{"namespace": {}}"#, "unknown field `namespace`"),
            (r#"{"labels": [{"key": "tier", "ranges": [0]}]}"#, "missing field `value`"),
            (r#"{"labels": [{"key": "tier", "value": "db", "ranges": [0], "op": "in"}]}"#, "unknown field `op`"),
            (r#"{"default": [-1]}"#, "invalid value"),
            (r#"{"namespaces": {"a": "0"}}"#, "invalid type"),
            (r#"{"default": [0, 1, 0]}"#, "default lists range 0 twice"),
            (r#"{"labels": [{"key": "k", "value": "v", "ranges": [3, 3]}]}"#, "labels[0].ranges lists range 3 twice"),
        ] {
            let e = Settings::parse(text).unwrap_err();
            assert!(e.starts_with("namespace-ranges settings: ") && e.contains(needle), "{text}: {e}");
        }
    }
}
