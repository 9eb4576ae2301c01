#!/usr/bin/env bash
# Coverage-guided fuzzing of thereabouts' inputs with libFuzzer (fuzz/).
#
#   bash scripts/fuzz.sh build                 # build every target
#   bash scripts/fuzz.sh smoke [SECONDS]       # each target: its corpus, then SECONDS (default 20) of new inputs
#   bash scripts/fuzz.sh run TARGET [RUNS]     # one target for RUNS executions (default 10 000 000)
#   bash scripts/fuzz.sh list
#
# Stable Rust: the targets are built with the instrumentation flags cargo-fuzz
# passes (SanitizerCoverage: inline 8-bit counters, PC table, comparison
# tracing), set for the host target only so that build scripts and the engine's
# nested wasm build stay uninstrumented. No sanitizer: the code under test is
# safe Rust; a panic, an overflow or a failed debug assertion is the finding.
#
# The corpora are fuzz/corpus/<target> (seeds from the test vectors, kept in
# the repository); what a run adds goes to fuzz/corpus-new/<target> (not kept).
# A crash is written to fuzz/artifacts/<target>/ and ends the run with its
# input's path; turn it into a regression test beside the code it broke.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

TARGETS=(config cni_args pool_file etcd_values k8s_objects policy_answer plan)
triple=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="${THEREABOUTS_FUZZ_TARGET:-${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/fuzz-target}"
flags=(
  -Cpasses=sancov-module
  -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
  -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares
  --cfg fuzzing
)
var="CARGO_TARGET_$(tr '[:lower:]-' '[:upper:]_' <<<"$triple")_RUSTFLAGS"
export "$var=${flags[*]}"

bin() { echo "$CARGO_TARGET_DIR/$triple/fuzz/$1"; }

build() {
  cargo build --locked --profile fuzz --target "$triple" -p thereabouts-fuzz --bins
}

# libFuzzer over one target: the kept corpus is read, new inputs go to corpus-new.
fuzz() {
  local target=$1
  shift
  mkdir -p "corpus-new/$target" "artifacts/$target"
  "$(bin "$target")" -artifact_prefix="artifacts/$target/" -print_final_stats=1 "$@" "corpus-new/$target" "corpus/$target"
}

case "${1:-}" in
  build) build ;;
  list) printf '%s\n' "${TARGETS[@]}" ;;
  smoke)
    seconds=${2:-20}
    build
    for t in "${TARGETS[@]}"; do
      echo "=== fuzz $t (${seconds}s)"
      log="artifacts/$t.smoke.log"
      mkdir -p artifacts
      if ! fuzz "$t" -max_total_time="$seconds" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "fuzz target $t failed: its input is in fuzz/artifacts/$t/" >&2
        exit 1
      fi
      grep -E '^(INFO: Loaded [0-9]+ module|#[0-9]+ +(INITED|DONE)|stat::number_of_executed_units)' "$log" || true
    done
    ;;
  run)
    target=${2:?target}
    runs=${3:-10000000}
    build
    # FUZZ_JOBS workers (default 1) share one corpus, each logging to
    # fuzz/fuzz-N.log; -runs counts each worker's executions.
    jobs=${FUZZ_JOBS:-1}
    if ((jobs > 1)); then
      fuzz "$target" -runs=$((runs / jobs)) -jobs="$jobs" -workers="$jobs"
    else
      fuzz "$target" -runs="$runs"
    fi
    ;;
  *)
    sed -n '2,7p' "$0" >&2
    exit 2
    ;;
esac
