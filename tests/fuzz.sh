#!/usr/bin/env bash
# The fuzz targets (fuzz/, scripts/fuzz.sh): formatting and lints of their
# crate (a workspace of its own, which tests/lint.sh does not reach), then a
# short run of every target over its kept corpus and fresh inputs. A crash
# fails the run and leaves its input in fuzz/artifacts/<target>/. The long runs
# behind docs/reliability.md are `bash scripts/fuzz.sh run TARGET`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-rust.sh
cargo fmt --manifest-path fuzz/Cargo.toml --check
# Checked in the main target directory: the registry crates' check builds of
# tests/lint.sh are reused.
CARGO_TARGET_DIR="$PWD/target" cargo clippy --locked --manifest-path fuzz/Cargo.toml --all-targets -- -D warnings
bash scripts/fuzz.sh smoke "${FUZZ_SMOKE_SECONDS:-10}"
