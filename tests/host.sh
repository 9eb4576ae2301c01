#!/usr/bin/env bash
# Host tests: the thereabouts binary's unit tests, the CNI protocol tests (every
# command in every spec version, bad input, datastore guarantees) and the engine
# component contract, on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Rust target and the build's Debian packages (C toolchain, protoc), when missing.
source scripts/setup-rust.sh
cargo test -p thereabouts
# The policy compiler (it builds the example policies for wasm itself) and the
# example policies' own logic, natively.
cargo test -p thereabouts-policy-compiler
cargo test -p sticky-ordinal -p namespace-ranges -p keep-addresses -p hostile-fixtures
