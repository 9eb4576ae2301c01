//! The engine's plan against a random pool state: every address it hands out
//! is in its range, free, neither excluded nor the gateway (`check_plan`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use thereabouts_allocator::plan_all;
use thereabouts_fuzz::{Scenario, check_plan};

fuzz_target!(|scenario: Scenario| {
    let Some(built) = scenario.build() else { return };
    if let Ok(outcomes) = plan_all(&built.config, &built.pools, built.reservations, &built.request) {
        check_plan(&built, &outcomes);
    }
});
