#!/usr/bin/env bash
# Engine tests: unit + property tests natively, then the component build and the
# zero-import check through the host crate.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-rust.sh
cargo test -p thereabouts-allocator
cargo test -p thereabouts --test component_contract
