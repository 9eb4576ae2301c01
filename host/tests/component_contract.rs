//! The engine component's contract: it imports nothing, exports the WIT package's
//! interfaces, and answers exactly what the native engine answers (same code,
//! two builds), including errors.

use thereabouts::component::{COMPONENT_WASM, EngineComponent};
use thereabouts_allocator as native;
use wasmparser::{Parser, Payload};

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
    wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
        .validate_all(COMPONENT_WASM)
        .expect("component validates");

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

#[test]
fn component_answers_exactly_like_the_native_engine() {
    let mut engine = EngineComponent::load().expect("component loads");
    let args = "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p";
    for text in CONFIGS {
        let via_component = engine.normalize(text, None, args).expect("call succeeds");
        let via_native = native::normalize(text, None, args);
        assert_eq!(via_component, via_native, "normalize differs for {text}");
        let Ok(config) = via_native else { continue };
        let mut pool = native::PoolSnapshot::with_taken([8, 9, 11, (1u128 << 80) + 1]);
        pool.reserved = vec![12];
        let pools = vec![pool; config.ranges.len()];
        let request = native::Request { container_id: "c1".into(), pod_ref: "ns/p".into(), ifname: "eth0".into(), requested_ip: None, contention: 0 };
        assert_eq!(engine.plan_all(&config, &pools, &request).unwrap(), native::plan_all(&config, &pools, &request));
        assert_eq!(engine.preview(&config, &pools, 50).unwrap(), native::preview(&config, &pools, 50));
        assert_eq!(engine.preview_table(&config, &pools, 50).unwrap(), native::preview_table(&config, &pools, 50));
        // Under contention the spread pick (a hash) crosses the boundary unchanged.
        for contention in [1, 3, 8, 40] {
            let contended = native::Request { contention, ..request.clone() };
            assert_eq!(engine.plan_all(&config, &pools, &contended).unwrap(), native::plan_all(&config, &pools, &contended), "contention {contention}");
        }
        for range in &config.ranges {
            assert_eq!(engine.plan(range, &pools[0], &request).unwrap(), native::plan(range, &pools[0], &request));
            assert_eq!(engine.pool_name(&range.cidr, &config.network_name).unwrap().unwrap(), range.pool_name);
        }
    }
}

#[test]
fn naming_and_release_through_the_component() {
    let mut engine = EngineComponent::load().expect("component loads");
    assert_eq!(engine.reservation_name("2001:db8:480:603d:304:403::", "").unwrap().unwrap(), "2001-db8-480-603d-304-403--0");
    assert_eq!(engine.pool_name("fd00:0:0:10::/64", "net").unwrap().unwrap(), "net-fd00-0-0-10---64");
    let entries = vec![
        native::Allocation { offset: 1, container_id: "a".into(), pod_ref: "ns/p".into(), ifname: "eth0".into() },
        native::Allocation { offset: 2, container_id: "b".into(), pod_ref: "ns/q".into(), ifname: "eth0".into() },
    ];
    assert_eq!(engine.release(&entries, "b", "eth0").unwrap(), vec![1]);
    let err = engine.pool_name("nonsense", "").unwrap().unwrap_err();
    assert_eq!(err.code, 7);
}
