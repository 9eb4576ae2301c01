//! whereabouts v0.9.4's configuration rules (`pkg/config/config.go`, `pkg/types/types.go`)
//! as tests, plus thereabouts' documented differences.

use super::*;
use serde_json::json;

const ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod-a";

fn conf(ipam: Value) -> String {
    json!({"cniVersion": "1.0.0", "name": "net1", "type": "macvlan", "ipam": ipam}).to_string()
}

fn ok(ipam: Value) -> NormalizedConfig {
    normalize(&conf(ipam), None, ARGS).expect("config should normalize")
}

fn err(ipam: Value) -> ConfigError {
    normalize(&conf(ipam), None, ARGS).expect_err("config should be rejected")
}

fn cidrs(c: &NormalizedConfig) -> Vec<&str> {
    c.ranges.iter().map(|r| r.cidr.as_str()).collect()
}

#[test]
fn missing_ipam_and_wrong_type_are_invalid_config() {
    let e = normalize(r#"{"cniVersion":"1.0.0","name":"n"}"#, None, "").unwrap_err();
    assert_eq!((e.code, e.field.as_str()), (7, "ipam"));
    assert!(e.message.contains("IPAM config missing 'ipam' key"));
    let e = err(json!({"type": "host-local", "range": "192.0.2.0/24"}));
    assert_eq!((e.code, e.field.as_str()), (7, "ipam.type"));
    assert!(e.message.contains("This one was: \"host-local\""), "{}", e.message);
    assert!(normalize(&conf(json!({"type": "whereabouts", "range": "192.0.2.0/24"})), None, "").is_ok());
    assert!(normalize(&conf(json!({"type": "thereabouts", "range": "192.0.2.0/24"})), None, "").is_ok());
}

#[test]
fn malformed_json_is_a_decode_error_and_names_missing() {
    let e = normalize("{\"name\": \"n\", aa}", None, "").unwrap_err();
    assert_eq!(e.code, 6);
    assert!(e.message.contains("JSON parsing error"), "{}", e.message);
    let e = normalize("[1,2]", None, "").unwrap_err();
    assert_eq!(e.code, 6);
    let e = normalize(r#"{"cniVersion":"1.0.0","ipam":{"type":"whereabouts","range":"192.0.2.0/24"}}"#, None, "").unwrap_err();
    assert_eq!((e.code, e.field.as_str()), (7, "name"));
}

#[test]
fn unsupported_cni_version_is_code_1() {
    let text = json!({"cniVersion": "9.9.9", "name": "n", "ipam": {"type": "whereabouts", "range": "192.0.2.0/24"}}).to_string();
    let e = normalize(&text, None, "").unwrap_err();
    assert_eq!((e.code, e.field.as_str()), (1, "cniVersion"));
    for v in SUPPORTED_CNI_VERSIONS {
        let text = json!({"cniVersion": v, "name": "n", "ipam": {"type": "whereabouts", "range": "192.0.2.0/24"}}).to_string();
        assert_eq!(normalize(&text, None, "").unwrap().cni_version, v);
    }
    // No cniVersion: the CNI library reads it as 0.1.0.
    let text = json!({"name": "n", "ipam": {"type": "whereabouts", "range": "192.0.2.0/24"}}).to_string();
    assert_eq!(normalize(&text, None, "").unwrap().cni_version, "0.1.0");
}

#[test]
fn conflist_uses_the_plugin_that_carries_ipam() {
    let text = json!({
        "cniVersion": "1.1.0", "name": "list",
        "plugins": [{"type": "bridge", "ipam": {"type": "thereabouts", "range": "192.0.2.0/24"}}, {"type": "portmap"}]
    })
    .to_string();
    let c = normalize(&text, None, ARGS).unwrap();
    assert_eq!((c.name.as_str(), c.cni_version.as_str()), ("list", "1.1.0"));
    assert_eq!(cidrs(&c), ["192.0.2.0/24"]);
}

#[test]
fn legacy_range_comes_first_then_ip_ranges_in_order() {
    let c = ok(json!({
        "type": "whereabouts", "range": "abcd::1/64",
        "ipRanges": [{"range": "192.168.10.1/24"}, {"range": "198.51.100.0/24"}]
    }));
    assert_eq!(cidrs(&c), ["abcd::/64", "192.168.10.0/24", "198.51.100.0/24"]);
}

#[test]
fn legacy_fields_apply_only_to_the_legacy_range() {
    let c = ok(json!({
        "type": "whereabouts", "range": "192.0.2.0/24", "range_start": "192.0.2.10", "range_end": "192.0.2.20",
        "exclude": ["192.0.2.12/32"], "ipRanges": [{"range": "198.51.100.0/24"}]
    }));
    assert_eq!((c.ranges[0].first.as_str(), c.ranges[0].last.as_str()), ("192.0.2.10", "192.0.2.20"));
    assert_eq!(c.ranges[0].exclude_cidrs, ["192.0.2.12/32"]);
    assert_eq!((c.ranges[1].first.as_str(), c.ranges[1].last.as_str()), ("198.51.100.1", "198.51.100.254"));
    assert!(c.ranges[1].excludes.is_empty());
}

#[test]
fn top_level_bounds_are_sloppy_and_ip_ranges_bounds_are_strict() {
    let c = ok(json!({"type": "whereabouts", "range": "192.168.1.0/24", "range_start": "00192.00168.1.44"}));
    assert_eq!(c.ranges[0].first, "192.168.1.44");
    let e = err(json!({"type": "whereabouts", "ipRanges": [{"range": "192.168.1.0/24", "range_start": "00192.00168.1.44"}]}));
    assert_eq!(e.field, "ipam.ipRanges[0].range_start");
    assert!(e.message.contains("invalid IP address: 00192.00168.1.44"));
    // thereabouts difference: an unparsable top-level bound is an error, not silently dropped.
    let e = err(json!({"type": "whereabouts", "range": "192.168.1.0/24", "range_end": "nope"}));
    assert_eq!(e.field, "ipam.range_end");
}

#[test]
fn keys_are_case_insensitive_like_go() {
    let c = ok(json!({"Type": "whereabouts", "IPRANGES": [{"Range": "192.0.2.0/24", "RANGE_START": "192.0.2.5"}], "Network_Name": "blue"}));
    assert_eq!(cidrs(&c), ["192.0.2.0/24"]);
    assert_eq!(c.ranges[0].first, "192.0.2.5");
    assert_eq!(c.ranges[0].pool_name, "blue-192.0.2.0-24");
}

#[test]
fn wrong_json_types_name_the_field() {
    let e = err(json!({"type": "whereabouts", "range": 5}));
    assert_eq!((e.code, e.field.as_str()), (7, "ipam.range"));
    let e = err(json!({"type": "whereabouts", "ipRanges": {"range": "192.0.2.0/24"}}));
    assert_eq!(e.field, "ipam.ipRanges");
    let e = err(json!({"type": "whereabouts", "ipRanges": [{"range": "192.0.2.0/24", "exclude": "192.0.2.1"}]}));
    assert_eq!(e.field, "ipam.ipRanges[0].exclude");
    let e = err(json!({"type": "whereabouts", "range": "192.0.2.0/24", "enable_overlapping_ranges": "yes"}));
    assert_eq!(e.field, "ipam.enable_overlapping_ranges");
}

#[test]
fn bad_ranges_name_the_entry() {
    let e = err(json!({"type": "whereabouts", "ipRanges": [{"range": "192.0.2.0/24"}, {"range": "10.0.0/24"}]}));
    assert_eq!((e.code, e.field.as_str()), (7, "ipam.ipRanges[1].range"));
    let e = err(json!({"type": "whereabouts", "ipRanges": [{"range": "2001:db8::/127"}]}));
    assert!(e.message.contains("no usable address"));
    let e = err(json!({"type": "whereabouts", "ipRanges": [{"range": "192.0.2.0/24", "exclude": ["192.0.2.300"]}]}));
    assert_eq!(e.field, "ipam.ipRanges[0].exclude[0]");
    let e = err(json!({"type": "whereabouts", "ipRanges": [{}]}));
    assert_eq!(e.field, "ipam.ipRanges[0].range");
    let e = err(json!({"type": "whereabouts"}));
    assert_eq!(e.field, "ipam.ipRanges");
}

#[test]
fn flat_file_fills_only_empty_fields_and_cannot_change_overlapping() {
    let flat = json!({
        "datastore": "kubernetes", "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"},
        "range": "198.51.100.0/24", "gateway": "192.0.2.1", "network_name": "flat", "enable_overlapping_ranges": false,
        "log_level": "error"
    })
    .to_string();
    let inline = conf(json!({"type": "whereabouts", "range": "192.0.2.0/24", "log_level": "debug", "kubernetes": {}}));
    let c = normalize(&inline, Some(&flat), ARGS).unwrap();
    assert_eq!(cidrs(&c), ["192.0.2.0/24"], "inline range wins");
    assert_eq!(c.log_level.as_deref(), Some("debug"), "inline string wins");
    assert_eq!(c.network_name, "flat", "empty inline field filled");
    assert_eq!(c.ranges[0].gateway.as_deref(), Some("192.0.2.1"));
    assert_eq!(c.datastore.kind.as_deref(), Some("kubernetes"));
    assert_eq!(c.datastore.kubeconfig.as_deref(), Some("/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"), "nested object merged");
    assert!(c.enable_overlapping_ranges, "flat file cannot change enable_overlapping_ranges");
    let inline_off = conf(json!({"type": "whereabouts", "range": "192.0.2.0/24", "enable_overlapping_ranges": false}));
    assert!(!normalize(&inline_off, Some(&flat), ARGS).unwrap().enable_overlapping_ranges);
    // The flat file may supply the ranges themselves.
    let c = normalize(&conf(json!({"type": "whereabouts"})), Some(&flat), ARGS).unwrap();
    assert_eq!(cidrs(&c), ["198.51.100.0/24"]);
    let e = normalize(&inline, Some("{not json"), ARGS).unwrap_err();
    assert_eq!((e.code, e.field.as_str()), (7, "flat file"));
}

#[test]
fn overlapping_defaults_to_true() {
    assert!(ok(json!({"type": "whereabouts", "range": "192.0.2.0/24"})).enable_overlapping_ranges);
}

#[test]
fn flat_file_paths_put_configuration_path_first() {
    let paths = flat_file_paths(&conf(json!({"type": "whereabouts", "configuration_path": "/tmp/x.conf"}))).unwrap();
    assert_eq!(paths[0], "/tmp/x.conf");
    assert_eq!(paths[1..], FLAT_FILE_PATHS.map(String::from));
    assert_eq!(flat_file_paths(&conf(json!({"type": "whereabouts"}))).unwrap().len(), 4);
}

#[test]
fn relative_paths_the_plugin_opens_are_refused_naming_the_field() {
    let base = || json!({"type": "whereabouts", "range": "192.0.2.0/24"});
    for (key, field) in [
        ("data_dir", "ipam.data_dir"),
        ("etcd_key_file", "ipam.etcd_key_file"),
        ("etcd_cert_file", "ipam.etcd_cert_file"),
        ("etcd_ca_cert_file", "ipam.etcd_ca_cert_file"),
        ("configuration_path", "ipam.configuration_path"),
    ] {
        let mut ipam = base();
        ipam[key] = json!("some/where");
        let e = err(ipam);
        assert_eq!((e.code, e.field.as_str()), (7, field), "{}", e.message);
        assert!(e.message.contains("\"some/where\" is not absolute"), "{}", e.message);
    }
    let mut ipam = base();
    ipam["kubernetes"] = json!({"kubeconfig": "kc"});
    assert_eq!(err(ipam).field, "ipam.kubernetes.kubeconfig");
    assert_eq!(flat_file_paths(&conf(json!({"type": "whereabouts", "configuration_path": "x.conf"}))).unwrap_err().field, "ipam.configuration_path");
    // Absolute and empty paths stand; log_file is the host's to judge (it is never a reason to fail).
    let mut ipam = base();
    ipam["data_dir"] = json!("/var/lib/x");
    ipam["etcd_key_file"] = json!("");
    ipam["log_file"] = json!("relative.log");
    assert_eq!(ok(ipam).datastore.data_dir.as_deref(), Some("/var/lib/x"));
}

#[test]
fn pod_ref_comes_from_cni_args_and_unknown_args_fail() {
    assert_eq!(ok(json!({"type": "whereabouts", "range": "192.0.2.0/24"})).pod_ref, "default/pod-a");
    let e = normalize(&conf(json!({"type": "whereabouts", "range": "192.0.2.0/24"})), None, "BOGUS=1").unwrap_err();
    assert_eq!((e.code, e.field.as_str()), (4, "CNI_ARGS"));
}

#[test]
fn gateway_goes_to_its_family_only_and_bad_gateway_is_rejected() {
    let c = ok(
        json!({"type": "whereabouts", "gateway": "192.0.2.1", "ipRanges": [{"range": "192.0.2.0/24"}, {"range": "2001:db8::/64", "gateway": "2001:db8::1"}]}),
    );
    assert_eq!(c.ranges[0].gateway.as_deref(), Some("192.0.2.1"));
    assert_eq!(c.ranges[1].gateway.as_deref(), Some("2001:db8::1"));
    let e = err(json!({"type": "whereabouts", "gateway": "192.0.2", "range": "192.0.2.0/24"}));
    assert_eq!(e.field, "ipam.gateway");
    assert!(e.message.contains("couldn't parse gateway IP"));
}

#[test]
fn routes_come_back_as_whereabouts_prints_them_and_dns_passes_through() {
    let c = ok(json!({"type": "whereabouts", "range": "192.0.2.0/24",
        "routes": [{"dst": "0.0.0.0/0", "gw": "192.0.2.1"}, {"dst": "3ffe:ffff:0:01ff::1/64", "gw": "3ffe:ffff:0:01ff::0001", "mtu": 1400, "x": 1}],
        "dns": {"nameservers": ["192.0.2.53"], "search": ["example.test"]}}));
    assert_eq!(
        c.routes_json.as_deref(),
        Some(r#"[{"dst":"0.0.0.0/0","gw":"192.0.2.1"},{"dst":"3ffe:ffff:0:1ff::1/64","gw":"3ffe:ffff:0:1ff::1","mtu":1400}]"#)
    );
    assert_eq!(c.dns_json.as_deref(), Some(r#"{"nameservers":["192.0.2.53"],"search":["example.test"]}"#));
    let e = err(json!({"type": "whereabouts", "range": "192.0.2.0/24", "routes": [{"dst": "bogus"}]}));
    assert_eq!(e.field, "ipam.routes[0].dst");
    // whereabouts fails its load on IPv4 leading zeros (Go's net.ParseIP).
    let e = err(json!({"type": "whereabouts", "range": "192.0.2.0/24", "routes": [{"dst": "0.0.0.0/0"}, {"dst": "198.51.100.0/24", "gw": "192.0.2.001"}]}));
    assert_eq!((e.code, e.field.as_str()), (7, "ipam.routes[1].gw"));
}

#[test]
fn the_gateway_is_excluded_per_range_and_from_the_top_level() {
    let per_range = ok(json!({"type": "whereabouts", "ipRanges": [{"range": "192.0.2.0/29", "gateway": "192.0.2.1"}]}));
    let top_level = ok(json!({"type": "whereabouts", "gateway": "192.0.2.1", "ipRanges": [{"range": "192.0.2.0/29"}, {"range": "2001:db8::/126"}]}));
    for r in [&per_range.ranges[0], &top_level.ranges[0]] {
        assert_eq!((r.excluded.clone(), r.usable), (vec![(1, 1)], 5));
    }
    assert_eq!(top_level.ranges[1].usable, 2, "an IPv4 gateway excludes nothing from an IPv6 range");
}

#[test]
fn static_addresses_print_in_go_text_and_may_equal_a_gateway() {
    let c = ok(json!({"type": "whereabouts", "gateway": "192.0.2.1", "range": "192.0.2.0/29",
        "addresses": [{"address": "192.0.2.1/29"}, {"address": "::ffff:198.51.100.7/120", "gateway": "::ffff:198.51.100.1"}]}));
    let got: Vec<_> = c.addresses.iter().map(|a| (a.address.as_str(), a.gateway.as_deref(), a.family)).collect();
    assert_eq!(got, [("192.0.2.1/29", None, Family::V4), ("198.51.100.7/24", Some("198.51.100.1"), Family::V4)]);
}

#[test]
fn static_addresses_from_config_and_cni_args() {
    let text = conf(json!({"type": "whereabouts", "range": "192.0.2.0/24",
        "addresses": [{"address": "198.51.100.7/24", "gateway": "198.51.100.1"}]}));
    let c = normalize(&text, None, "IP=203.0.113.9/24,2001:db8::9/64;GATEWAY=203.0.113.1").unwrap();
    let got: Vec<_> = c.addresses.iter().map(|a| (a.address.as_str(), a.gateway.as_deref())).collect();
    assert_eq!(got, [("198.51.100.7/24", Some("198.51.100.1")), ("203.0.113.9/24", Some("203.0.113.1")), ("2001:db8::9/64", None)]);
    let e = normalize(&text, None, "IP=203.0.113.9").unwrap_err();
    assert_eq!((e.code, e.field.as_str()), (4, "CNI_ARGS.IP"));
}

#[test]
fn versions_before_0_3_allow_one_address_per_family() {
    let two_v4 =
        json!({"cniVersion": "0.2.0", "name": "n", "ipam": {"type": "whereabouts", "ipRanges": [{"range": "192.0.2.0/24"}, {"range": "198.51.100.0/24"}]}})
            .to_string();
    let e = normalize(&two_v4, None, "").unwrap_err();
    assert_eq!((e.code, e.field.as_str()), (1, "cniVersion"));
    let dual =
        json!({"cniVersion": "0.2.0", "name": "n", "ipam": {"type": "whereabouts", "ipRanges": [{"range": "192.0.2.0/24"}, {"range": "2001:db8::/64"}]}})
            .to_string();
    assert!(normalize(&dual, None, "").is_ok());
}

#[test]
fn requested_ips_land_in_the_range_that_holds_them() {
    let text = json!({"cniVersion": "1.0.0", "name": "n", "runtimeConfig": {"ips": ["2001:db8::99/64", "192.0.2.77/24"]},
        "ipam": {"type": "whereabouts", "ipRanges": [{"range": "192.0.2.0/24"}, {"range": "2001:db8::/64"}]}})
    .to_string();
    let c = normalize(&text, None, "").unwrap();
    assert_eq!(c.ranges[0].requested.as_deref(), Some("192.0.2.77"));
    assert_eq!(c.ranges[1].requested.as_deref(), Some("2001:db8::99"));
    let text = json!({"cniVersion": "1.0.0", "name": "n", "args": {"cni": {"ips": ["203.0.113.5"]}},
        "ipam": {"type": "whereabouts", "ipRanges": [{"range": "192.0.2.0/24"}]}})
    .to_string();
    let e = normalize(&text, None, "").unwrap_err();
    assert_eq!(e.field, "args.cni.ips[0]");
}

#[test]
fn datastore_settings_are_passed_as_given() {
    let c = ok(json!({"type": "whereabouts", "range": "192.0.2.0/24", "datastore": "etcd",
        "etcd_host": "https://127.0.0.1:2379, https://127.0.0.2:2379", "etcd_username": "u", "etcd_password": "p"}));
    assert_eq!(c.datastore.kind.as_deref(), Some("etcd"));
    assert_eq!(c.datastore.etcd_hosts, ["https://127.0.0.1:2379", "https://127.0.0.2:2379"]);
    let e = err(json!({"type": "whereabouts", "range": "192.0.2.0/24", "datastore": "consul"}));
    assert_eq!(e.field, "ipam.datastore");
    assert!(e.message.contains("file") && e.message.contains("kubernetes") && e.message.contains("etcd"));
}

#[test]
fn network_name_must_make_valid_object_names() {
    let e = err(json!({"type": "whereabouts", "range": "192.0.2.0/24", "network_name": "Bad_Name"}));
    assert_eq!(e.field, "ipam.network_name");
}

#[test]
fn ip_ranges_allocation_defaults_to_all_and_reads_first_available() {
    let with = |v: Value| ok(json!({"type": "whereabouts", "range": "192.0.2.0/24", "ipRangesAllocation": v})).ip_ranges_allocation;
    assert_eq!(ok(json!({"type": "whereabouts", "range": "192.0.2.0/24"})).ip_ranges_allocation, RangesAllocation::All);
    assert_eq!(with(json!("all")), RangesAllocation::All);
    assert_eq!(with(json!("first_available")), RangesAllocation::FirstAvailable);
    // Keys match like Go's; the values are exact.
    let c = ok(json!({"type": "whereabouts", "range": "192.0.2.0/24", "iprangesallocation": "first_available"}));
    assert_eq!(c.ip_ranges_allocation, RangesAllocation::FirstAvailable);
}

#[test]
fn a_bad_ip_ranges_allocation_names_the_value_and_the_choices() {
    let e = err(json!({"type": "whereabouts", "range": "192.0.2.0/24", "ipRangesAllocation": "first-available"}));
    assert_eq!((e.code, e.field.as_str()), (7, "ipam.ipRangesAllocation"));
    assert!(e.message.contains("\"first-available\"") && e.message.contains("\"all\"") && e.message.contains("\"first_available\""), "{}", e.message);
    let e = err(json!({"type": "whereabouts", "range": "192.0.2.0/24", "ipRangesAllocation": 1}));
    assert_eq!((e.code, e.field.as_str()), (7, "ipam.ipRangesAllocation"));
}

#[test]
fn ip_ranges_allocation_and_policies_come_from_the_flat_file_unless_inline() {
    let flat = json!({"ipRangesAllocation": "first_available", "policies": [{"name": "flat", "path": "/flat.wasm"}]}).to_string();
    let c = normalize(&conf(json!({"type": "whereabouts", "range": "192.0.2.0/24"})), Some(&flat), ARGS).unwrap();
    assert_eq!(c.ip_ranges_allocation, RangesAllocation::FirstAvailable);
    assert_eq!(c.policies.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["flat"]);
    let inline =
        conf(json!({"type": "whereabouts", "range": "192.0.2.0/24", "ipRangesAllocation": "all", "policies": [{"name": "inline", "path": "/i.wasm"}]}));
    let c = normalize(&inline, Some(&flat), ARGS).unwrap();
    assert_eq!(c.ip_ranges_allocation, RangesAllocation::All);
    assert_eq!(c.policies.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["inline"]);
}

#[test]
fn policies_are_read_from_ipam_and_their_errors_name_the_field() {
    let c = ok(json!({"type": "whereabouts", "range": "192.0.2.0/24", "policies": [{"name": "zone", "path": "/opt/zone.wasm", "timeout_ms": 50}]}));
    assert_eq!((c.policies[0].name.as_str(), c.policies[0].timeout_ms, c.policies[0].memory_mib), ("zone", 50, 4));
    assert!(ok(json!({"type": "whereabouts", "range": "192.0.2.0/24"})).policies.is_empty());
    let e = err(json!({"type": "whereabouts", "range": "192.0.2.0/24", "policies": [{"name": "zone", "path": "/z.wasm", "timeout_ms": 0}]}));
    assert_eq!((e.code, e.field.as_str()), (7, "ipam.policies[0].timeout_ms"));
    let e = err(json!({"type": "whereabouts", "range": "192.0.2.0/24", "policies": "zone"}));
    assert_eq!((e.code, e.field.as_str()), (7, "ipam.policies"));
}

#[test]
fn whereabouts_pr_681_keys_are_accepted_and_type_checked() {
    let with = |extra: &str| {
        normalize(&format!(r#"{{"cniVersion": "1.0.0", "name": "n", "ipam": {{"type": "whereabouts", "range": "192.0.2.0/24"{extra}}}}}"#), None, "")
    };
    assert!(!with("").unwrap().preferred_ip_annotation);
    let c = with(r#", "preferred_ip_annotation": true, "exclude_gateway": true, "optimistic_ipam": false"#).unwrap();
    assert!(c.preferred_ip_annotation);
    for key in ["preferred_ip_annotation", "exclude_gateway", "optimistic_ipam"] {
        let e = with(&format!(r#", "{key}": "yes""#)).unwrap_err();
        assert_eq!(e.field, format!("ipam.{key}"), "{}", e.message);
    }
}
