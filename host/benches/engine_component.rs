//! Engine cost, natively and through the component boundary (wasmtime, the
//! precompiled component embedded in the binary), side by side in one run:
//! - planning one allocation (`plan-all`, what an ADD calls) in a pool holding
//!   100 000 live allocations, in an IPv4 /15 and in an IPv6 /64;
//! - normalizing a dual-stack config with excludes.
//!
//! `cargo bench -p thereabouts --bench engine_component`

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use thereabouts::component::EngineComponent;
use thereabouts_allocator as native;

const LIVE: u128 = 100_000;

const DUAL_STACK: &str = r#"{"cniVersion":"1.0.0","name":"bench","ipam":{"type":"thereabouts","datastore":"file",
 "gateway":"192.0.2.1",
 "ipRanges":[{"range":"192.0.2.0/24","range_start":"192.0.2.10","exclude":["192.0.2.64/26","192.0.2.200"]},
             {"range":"2001:db8::/64","exclude":["2001:db8::/120","2001:db8::1:0/112"],"gateway":"2001:db8::1"}],
 "routes":[{"dst":"0.0.0.0/0"}],"dns":{"nameservers":["192.0.2.53"]}}}"#;

fn one_range(cidr: &str) -> native::NormalizedConfig {
    let text = format!(r#"{{"cniVersion":"1.0.0","name":"bench","ipam":{{"type":"thereabouts","ipRanges":[{{"range":"{cidr}"}}]}}}}"#);
    native::normalize(&text, None, "").expect("bench config is valid")
}

/// 100 000 live allocations: offsets 1..=100 010 minus ten holes spread through
/// the upper half, in a scrambled order as a datastore map would give them.
/// The lowest free address is the first hole, at offset 50 001.
fn busy_pool(name: &str) -> native::PoolState {
    let holes: Vec<u128> = (0..10).map(|i| 50_001 + i * 5_000).collect();
    let mut taken: Vec<u128> = (1..=LIVE + 10).filter(|o| !holes.contains(o)).collect();
    // Deterministic scramble (multiplicative hashing of the index).
    let n = taken.len();
    for i in 0..n {
        let j = (i.wrapping_mul(2_654_435_761)) % n;
        taken.swap(i, j);
    }
    assert_eq!(taken.len() as u128, LIVE);
    native::PoolState { name: name.into(), snapshot: native::PoolSnapshot::with_taken(taken) }
}

fn request() -> native::Request {
    native::Request {
        container_id: "f".repeat(64),
        pod_ref: "default/bench-pod".into(),
        ifname: "net1".into(),
        requested_ip: None,
        contention: 0,
        guidance: None,
        preferred: Vec::new(),
        claim: None,
    }
}

fn plan_benches(c: &mut Criterion) {
    let mut engine = EngineComponent::load().expect("component loads");
    let req = request();
    let as_read = native::Reservations::AsRead;
    let mut group = c.benchmark_group("plan_100k_live");
    for (label, cidr) in [("ipv4_slash15", "198.18.0.0/15"), ("ipv6_slash64", "2001:db8::/64")] {
        let config = one_range(cidr);
        let pools = [busy_pool(&config.ranges[0].pool_name)];
        let expected = native::plan_all(&config, &pools, as_read, &req);
        assert_eq!(expected.as_ref().map(|o| o[0].assignment().offset), Ok(50_001));
        assert_eq!(engine.plan_all(&config, &pools, as_read, &req).unwrap(), expected);
        group.bench_with_input(BenchmarkId::new("native", label), &config, |b, config| {
            b.iter(|| native::plan_all(black_box(config), black_box(&pools), as_read, &req))
        });
        group.bench_with_input(BenchmarkId::new("component", label), &config, |b, config| {
            b.iter(|| engine.plan_all(black_box(config), black_box(&pools), as_read, &req).unwrap())
        });
    }
    group.finish();
}

fn normalize_benches(c: &mut Criterion) {
    let mut engine = EngineComponent::load().expect("component loads");
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench-pod";
    let mut group = c.benchmark_group("normalize_dual_stack_with_excludes");
    group.bench_function("native", |b| b.iter(|| native::normalize(black_box(DUAL_STACK), None, args).unwrap()));
    group.bench_function("component", |b| b.iter(|| engine.normalize(black_box(DUAL_STACK), None, args).unwrap().unwrap()));
    group.finish();
}

fn load_bench(c: &mut Criterion) {
    // What every CNI process pays once: deserialize the embedded artifact + instantiate.
    c.bench_function("component_load_and_instantiate", |b| b.iter(|| EngineComponent::load().unwrap()));
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(40).measurement_time(std::time::Duration::from_secs(4)).warm_up_time(std::time::Duration::from_secs(1));
    targets = plan_benches, normalize_benches, load_bench
}
criterion_main!(benches);
