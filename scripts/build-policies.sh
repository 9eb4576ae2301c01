#!/usr/bin/env bash
# Builds the example policies (every crate under policies/) as policy-extension
# components: each crate for wasm32-unknown-unknown with `--profile wasm`, in
# target/wasm-guest (the target dir host/build.rs uses for wasm guests), then
# wrapped by the policy compiler's `componentize` into
# target/policies/<crate-name>.wasm (or under $CARGO_TARGET_DIR). Prints that
# directory. Compile one for the plugin with
# `thereabouts-policy-compiler compile target/policies/<name>.wasm` (as root).
# Extra arguments go to cargo (e.g. -q).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup-rust.sh
source scripts/setup-rust.sh
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"

packages=()
for manifest in policies/*/Cargo.toml; do
  packages+=("$(sed -n 's/^name = "\(.*\)"/\1/p' "$manifest" | head -n 1)")
done
package_args=()
for p in "${packages[@]}"; do package_args+=(-p "$p"); done

# As host/build.rs: the host's flags are not for wasm.
env -u CARGO_ENCODED_RUSTFLAGS -u RUSTFLAGS -u CARGO_BUILD_TARGET \
  cargo build --lib --target wasm32-unknown-unknown --profile wasm \
  --target-dir "$target_dir/wasm-guest" "${package_args[@]}" "$@" >&2
cargo build -p thereabouts-policy-compiler "$@" >&2

mkdir -p "$target_dir/policies"
for p in "${packages[@]}"; do
  "$target_dir/debug/thereabouts-policy-compiler" componentize \
    "$target_dir/wasm-guest/wasm32-unknown-unknown/wasm/${p//-/_}.wasm" \
    -o "$target_dir/policies/$p.wasm"
done
echo "$target_dir/policies"
