//! A policy's answer as the engine checks it: whatever ranges and picks a
//! policy returns (out of bounds, repeated, preferring taken or foreign
//! addresses, refusing, vetoing), the plan either fails cleanly or hands out
//! only addresses the allocator's promise allows (`check_plan`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use thereabouts_allocator::plan_all;
use thereabouts_fuzz::{AnswerSpec, Scenario, check_plan};

fuzz_target!(|input: (Scenario, AnswerSpec)| {
    let (scenario, answer) = input;
    let Some(mut built) = scenario.build() else { return };
    built.request.guidance = Some(scenario.guidance(&answer));
    if let Ok(outcomes) = plan_all(&built.config, &built.pools, built.reservations, &built.request) {
        check_plan(&built, &outcomes);
    }
});
