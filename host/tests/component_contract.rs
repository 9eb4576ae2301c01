//! The engine component's contract: it imports nothing, exports the WIT package's
//! interfaces, and answers exactly what the native engine answers (same code,
//! two builds), including errors.

use std::sync::{LazyLock, Mutex, MutexGuard};

use thereabouts::component::{COMPONENT_WASM, EngineComponent};
use thereabouts_allocator as native;
use wasmparser::{Parser, Payload};

/// One engine for every test: it runs its code in place, from the binary's own
/// pages, and wasmtime registers code by address, so two engines loaded at once
/// (tests run in parallel) would register the same code twice.
fn engine() -> MutexGuard<'static, EngineComponent> {
    static ENGINE: LazyLock<Mutex<EngineComponent>> = LazyLock::new(|| Mutex::new(EngineComponent::load().expect("component loads")));
    ENGINE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn component_has_zero_imports_and_exports_the_engine() {
    // Walk the binary: imports of the outermost component, and of every core module
    // nested in it. (Nested components that wit-component emits to type the exports
    // have "imports" of their own that are not imports of the component.)
    let mut imports = Vec::new();
    let mut exports = Vec::new();
    let mut core_imports = 0;
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(COMPONENT_WASM) {
        match payload.expect("component parses") {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(section) if depth == 0 => {
                for import in section {
                    imports.push(import.expect("import entry").name.name.to_string());
                }
            }
            Payload::ComponentExportSection(section) if depth == 0 => {
                for export in section {
                    exports.push(export.expect("export entry").name.name.to_string());
                }
            }
            Payload::ImportSection(section) => core_imports += section.count(),
            _ => {}
        }
    }
    assert!(imports.is_empty(), "the engine component must import nothing, found {imports:?}");
    assert_eq!(core_imports, 0, "the core module inside must import nothing");
    assert!(exports.contains(&"thereabouts:ipam/engine@0.1.0".to_string()), "exports: {exports:?}");
    assert!(exports.contains(&"thereabouts:ipam/types@0.1.0".to_string()), "exports: {exports:?}");
    wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all()).validate_all(COMPONENT_WASM).expect("component validates");

    // The same question asked the way `wasm-tools component wit` answers it: the
    // component's world, decoded, has no imports.
    let decoded = wit_component::decode(COMPONENT_WASM).expect("component decodes");
    let (resolve, world) = match decoded {
        wit_component::DecodedWasm::Component(resolve, world) => (resolve, world),
        other => panic!("expected a component, got {:?}", other.package()),
    };
    let world = &resolve.worlds[world];
    assert!(world.imports.is_empty(), "world imports: {:?}", world.imports.keys().collect::<Vec<_>>());
    assert_eq!(world.exports.len(), 2);
}

const CONFIGS: [&str; 6] = [
    r#"{"cniVersion":"1.0.0","name":"dual","ipam":{"type":"thereabouts","ipRanges":[{"range":"192.0.2.0/24","exclude":["192.0.2.0/29"]},{"range":"2001:db8::/64","gateway":"2001:db8::1"}],"gateway":"192.0.2.254"}}"#,
    r#"{"cniVersion":"0.3.1","name":"legacy","ipam":{"type":"whereabouts","range":"198.51.100.10-198.51.100.20/24","ipRanges":[{"range":"203.0.113.0/28"}],"network_name":"blue"}}"#,
    r#"{"cniVersion":"1.1.0","name":"big","ipam":{"type":"thereabouts","ipRanges":[{"range":"2001:db8::/32","range_start":"2001:db8:1::1"}]}}"#,
    r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"thereabouts","ipRanges":[{"range":"192.0.2.0/31"}]}}"#,
    r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"host-local"}}"#,
    r#"{"cniVersion":"1.0.0","name":"bad", nope}"#,
];

/// Each pool of the config once, all holding the same entries.
fn pools_of(config: &native::NormalizedConfig, snapshot: &native::PoolSnapshot) -> Vec<native::PoolState> {
    let mut names: Vec<&str> = config.ranges.iter().map(|r| r.pool_name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    names.into_iter().map(|name| native::PoolState { name: name.into(), snapshot: snapshot.clone() }).collect()
}

#[test]
fn component_answers_exactly_like_the_native_engine() {
    let mut engine = engine();
    let args = "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p";
    for text in CONFIGS {
        let via_component = engine.normalize(text, None, args).expect("call succeeds");
        let via_native = native::normalize(text, None, args);
        assert_eq!(via_component, via_native, "normalize differs for {text}");
        let Ok(config) = via_native else { continue };
        let mut pool = native::PoolSnapshot::with_taken([8, 9, 11, (1u128 << 80) + 1]);
        pool.reserved = vec![12];
        let pools = pools_of(&config, &pool);
        let request = native::Request {
            container_id: "c1".into(),
            pod_ref: "ns/p".into(),
            ifname: "eth0".into(),
            requested_ip: None,
            contention: 0,
            guidance: None,
            preferred: Vec::new(),
            claim: None,
        };
        for reservations in [native::Reservations::AsRead, native::Reservations::FromPools] {
            assert_eq!(engine.plan_all(&config, &pools, reservations, &request).unwrap(), native::plan_all(&config, &pools, reservations, &request));
        }
        assert_eq!(engine.preview(&config, &pools, 50).unwrap(), native::preview(&config, &pools, 50));
        assert_eq!(engine.usage(&config, &pools).unwrap(), native::usage(&config, &pools));
        assert_eq!(engine.warnings(&config).unwrap(), native::warnings(&config));
        // Under contention the spread pick (a hash) crosses the boundary unchanged.
        for contention in [1, 3, 8, 40] {
            let contended = native::Request { contention, ..request.clone() };
            let reservations = native::Reservations::AsRead;
            assert_eq!(
                engine.plan_all(&config, &pools, reservations, &contended).unwrap(),
                native::plan_all(&config, &pools, reservations, &contended),
                "contention {contention}"
            );
        }
    }
}

#[test]
fn guidance_and_candidates_cross_the_boundary_unchanged() {
    let mut engine = engine();
    for allocation in ["all", "first_available"] {
        let text = format!(
            r#"{{"cniVersion":"1.0.0","name":"g","ipam":{{"type":"thereabouts","ipRangesAllocation":"{allocation}","policies":[{{"name":"p","path":"/p.wasm","settings":{{"a":[1]}},"mode":"monitor"}}],"ipRanges":[{{"range":"192.0.2.0/24"}},{{"range":"198.51.100.0/24"}},{{"range":"2001:db8::/64"}}]}}}}"#
        );
        let config = native::normalize(&text, None, "").unwrap();
        assert_eq!(engine.normalize(&text, None, "").unwrap(), Ok(config.clone()));
        let pools = pools_of(&config, &native::PoolSnapshot::with_taken([1, 2, 5]));
        let pick = |range_index, prefer: &[&str], refuse: &[&str], veto: Option<&str>| native::RangePick {
            range_index,
            prefer: prefer.iter().map(|a| a.to_string()).collect(),
            refuse: refuse.iter().map(|a| a.to_string()).collect(),
            veto: veto.map(str::to_string),
        };
        let guidances = [
            native::Guidance { ranges: Some(vec![2, 0]), picks: vec![pick(0, &["192.0.2.9"], &[], None)] },
            native::Guidance { ranges: None, picks: vec![pick(0, &[], &[], Some("no")), pick(1, &[], &["198.51.100.3"], None)] },
            native::Guidance { ranges: Some(vec![7]), picks: vec![] },
            native::Guidance { ranges: None, picks: vec![pick(1, &["192.0.2.300"], &[], None)] },
        ];
        for guidance in guidances {
            let request = native::Request {
                container_id: "c1".into(),
                pod_ref: "ns/p".into(),
                ifname: "eth0".into(),
                requested_ip: None,
                contention: 0,
                guidance: Some(guidance),
                preferred: Vec::new(),
                claim: None,
            };
            let reservations = native::Reservations::AsRead;
            assert_eq!(engine.plan_all(&config, &pools, reservations, &request).unwrap(), native::plan_all(&config, &pools, reservations, &request));
            for ranges in [&[2, 0, 1][..], &[3]] {
                assert_eq!(
                    engine.candidates(&config, &pools, reservations, &request, ranges, 4).unwrap(),
                    native::candidates(&config, &pools, reservations, &request, ranges, 4)
                );
            }
        }
        assert_eq!(engine.preview(&config, &pools, 5).unwrap(), native::preview(&config, &pools, 5));
    }
}

#[test]
fn release_through_the_component_names_the_reservations() {
    let mut engine = engine();
    let config = native::normalize(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","network_name":"net","ipRanges":[{"range":"2001:db8:480:603d:304:403::/96"}]}}"#,
        None,
        "",
    )
    .unwrap();
    let (range, net) = (&config.ranges[0], config.network_name.as_str());
    let entry = |offset, container_id: &str| native::Allocation {
        offset,
        container_id: container_id.into(),
        pod_ref: "ns/p".into(),
        ifname: "eth0".into(),
        claim: None,
    };
    let entries = vec![entry(1, "a"), entry(0, "b"), entry(1 << 40, "b")];
    let who = |container_id: &str| native::Attachment { container_id: container_id.into(), ifname: "eth0".into(), claim: None };
    let released = engine.release(range, net, &entries, &[who("b")]).unwrap();
    assert_eq!(released, native::release(range, net, &entries, &[who("b")]));
    // The network's own address gets the trailing `0`; an offset outside the /96 has no name.
    assert_eq!(
        released,
        [native::Released { index: 1, reservation: Some("net-2001-db8-480-603d-304-403--0".into()) }, native::Released { index: 2, reservation: None }]
    );
    assert_eq!(engine.release(range, net, &entries, &[who("a"), who("b")]).unwrap().len(), 3);
    assert!(engine.release(range, net, &entries, &[who("zzz")]).unwrap().is_empty());
}

#[test]
fn a_config_the_engine_did_not_produce_is_a_config_error() {
    let mut engine = engine();
    let mut config = native::normalize(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","range":"192.0.2.0/24"}}"#, None, "").unwrap();
    config.ranges[0].cidr = "nonsense".into();
    let err = engine.usage(&config, &[]).unwrap_err();
    assert!(format!("{err:#}").contains("nonsense"), "{err:#}");
}

/// `cluster-pools` crosses the boundary whole: the component's answer (pools,
/// entries with their claims, reservations, IPAMClaims, what it ignored) is
/// the native engine's, and so is its error on a pool that is no map.
#[test]
fn cluster_pools_through_the_component_are_the_native_engines() {
    let mut engine = engine();
    let config =
        native::normalize(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"thereabouts","range":"2001:db8::/64","network_name":"blue"}}"#, None, "")
            .unwrap();
    let objects = serde_json::json!({"kind": "List", "items": [
        {"kind": "IPPool", "metadata": {"name": "blue-2001-db8---64"}, "spec": {"range": "2001:db8::/64", "allocations": {
            "1": {"id": "a", "podref": "ns/a", "ifname": "net1"},
            "-1": {"id": "vm", "podref": "ns/launcher", "ifname": "net1", "ipamclaimref": "ns/vm"},
            "2": {"id": "dev", "podref": "ns/b", "ifname": "eth1", "resourceclaimref": "0f1e"}}}},
        {"kind": "OverlappingRangeIPReservation", "metadata": {"name": "blue-2001-db8--9"}, "spec": {"podref": "ns/x"}},
        {"kind": "IPAMClaim", "metadata": {"name": "vm", "namespace": "ns"}, "spec": {"network": "blue", "interface": "net1"}},
        {"kind": "Pod", "metadata": {"name": "p"}}]})
    .to_string();
    let through = engine.cluster_pools(&config, &objects).unwrap().unwrap();
    assert_eq!(through, native::cluster_pools(&config, &objects).unwrap());
    assert_eq!((through.entries.len(), through.reserved.len(), through.ipam_claims.len(), through.ignored.len()), (3, 1, 1, 1));
    let bad = r#"{"kind": "IPPool", "metadata": {"name": "blue-2001-db8---64"}, "spec": {"allocations": 1}}"#;
    assert_eq!(engine.cluster_pools(&config, bad).unwrap().unwrap_err(), native::cluster_pools(&config, bad).unwrap_err());
}
