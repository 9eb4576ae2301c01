#!/usr/bin/env bash
# Builds the plugin as it ships: a static, non-PIE executable for
# <arch>-unknown-linux-musl, copied to target/plugin/thereabouts (or
# $CARGO_TARGET_DIR/plugin/thereabouts). Prints that path. Extra arguments go to
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
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$target_dir/plugin"
cp -f "$target_dir/$triple/release/thereabouts" "$target_dir/plugin/thereabouts"
echo "$target_dir/plugin/thereabouts"
