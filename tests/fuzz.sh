#!/usr/bin/env bash
# The fuzz targets (fuzz/, scripts/fuzz.sh): a short run of every target over
# its kept corpus and fresh inputs (their formatting and lints are
# tests/lint.sh's: fuzz/ is a workspace member). A crash fails the run and
# leaves its input in fuzz/artifacts/<target>/. The long runs behind
# docs/reliability.md are `bash scripts/fuzz.sh run TARGET`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-rust.sh
bash scripts/fuzz.sh smoke "${FUZZ_SMOKE_SECONDS:-10}"
