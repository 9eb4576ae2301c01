//! Config normalization, as the plugin runs it on every call: the network
//! config from stdin (with its `runtimeConfig` and `args`), the flat file and
//! CNI_ARGS, given as one input split at NUL bytes. Any input normalizes or is
//! refused with a CNI config code and a message; what normalizes is a config
//! the planner can use (bounds in order, exclusions inside them).
#![no_main]

use libfuzzer_sys::fuzz_target;
use thereabouts_allocator::{flat_file_paths, normalize, planner, warnings};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\0');
    let stdin = parts.next().unwrap_or_default();
    let flat = parts.next();
    let args = parts.next().unwrap_or_default();
    let _ = flat_file_paths(stdin);
    match normalize(stdin, flat, args) {
        Ok(config) => {
            assert!(!config.ranges.is_empty() || !config.addresses.is_empty());
            for range in &config.ranges {
                assert!(range.first_offset <= range.last_offset, "{range:?}");
                assert!(range.usable <= range.last_offset - range.first_offset + 1, "{range:?}");
                for pair in range.excluded.windows(2) {
                    assert!(pair[0].1 < pair[1].0, "exclusions overlap or are out of order: {range:?}");
                }
                for &(lo, hi) in &range.excluded {
                    assert!(range.first_offset <= lo && lo <= hi && hi <= range.last_offset, "exclusion outside the bounds: {range:?}");
                }
                assert!(!range.pool_name.is_empty());
            }
            let _ = warnings(&config);
            let table = planner::preview(&config, &[], 2);
            let _ = table;
        }
        Err(e) => {
            assert!([1, 4, 6, 7].contains(&e.code), "unexpected code {}: {e:?}", e.code);
            assert!(!e.message.is_empty());
        }
    }
});
