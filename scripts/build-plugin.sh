#!/usr/bin/env bash
# Builds the plugin as it ships: a static, non-PIE executable for
# <arch>-unknown-linux-musl, copied to target/plugin/thereabouts (or
# $CARGO_TARGET_DIR/plugin/thereabouts), with the policy compiler beside it
# (target/plugin/thereabouts-policy-compiler). Prints the plugin's path. Extra arguments go to
# cargo (e.g. -q). Why static and non-PIE: .cargo/config.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup-rust.sh
source scripts/setup-rust.sh
triple="$(uname -m)-unknown-linux-musl"
if ! rustup target list --installed 2>/dev/null | grep -qx "$triple"; then
  rustup target add "$triple" >&2
fi
cargo build --release -p thereabouts --target "$triple" "$@" >&2
# The policy compiler ships beside it (`thereabouts policy compile` runs it).
# A cargo run of its own: built together, the plugin's wasmtime would get
# the compiler's Cranelift through feature unification.
cargo build --release -p thereabouts-policy-compiler --target "$triple" "$@" >&2
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$target_dir/plugin"
cp -f "$target_dir/$triple/release/thereabouts" "$target_dir/plugin/thereabouts"
cp -f "$target_dir/$triple/release/thereabouts-policy-compiler" "$target_dir/plugin/thereabouts-policy-compiler"
echo "$target_dir/plugin/thereabouts"
