#!/usr/bin/env bash
# Host tests: the thereabouts binary's unit tests, the CNI protocol tests (every
# command in every spec version, bad input, datastore guarantees) and the engine
# component contract, on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests only need a C toolchain for the build (wasmtime's bits of C); install
# one quietly if this machine lacks it.
if ! command -v cc >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq build-essential >/dev/null
fi
source scripts/setup-rust.sh
cargo test -p thereabouts
