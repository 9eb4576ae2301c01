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
# PLUGIN_ARCH (amd64 or arm64, default this machine's) cross-builds the other
# architecture into target/plugin-<arch>/ instead: rustup's musl target, ring's C
# compiled by Debian's cross gcc (its few headers are freestanding ones), linked
# by rust-lld with Rust's own musl start files; the engine component is
# precompiled for that architecture (host/build.rs follows TARGET).
machine=$(uname -m)
arch=${PLUGIN_ARCH:-}
case "$arch" in
  '') triple="$machine-unknown-linux-musl" ;;
  amd64) triple=x86_64-unknown-linux-musl ;;
  arm64) triple=aarch64-unknown-linux-musl ;;
  *) echo "build-plugin.sh: PLUGIN_ARCH must be amd64 or arm64, not $arch" >&2; exit 1 ;;
esac
cpu=${triple%%-*}
if ! rustup target list --installed 2>/dev/null | grep -qx "$triple"; then
  rustup target add "$triple" >&2
fi
out=plugin
if [[ "$cpu" != "$machine" ]]; then
  out=plugin-$arch
  if ! command -v "$cpu-linux-gnu-gcc" >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "gcc-${cpu//_/-}-linux-gnu" >/dev/null
  fi
  upper=${triple^^}
  upper=${upper//-/_}
  export "CC_${triple//-/_}=$cpu-linux-gnu-gcc" "CARGO_TARGET_${upper}_LINKER=rust-lld"
  # The flags of .cargo/config.toml's musl section too: these replace them.
  export "CARGO_TARGET_${upper}_RUSTFLAGS=-C linker-flavor=ld.lld -C link-self-contained=yes -C relocation-model=static -C target-feature=+crt-static"
fi
cargo build --release -p thereabouts --target "$triple" "$@" >&2
cargo build --release -p thereabouts-policy-compiler --target "$triple" "$@" >&2
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$target_dir/$out"
cp -f "$target_dir/$triple/release/thereabouts" "$target_dir/$out/thereabouts"
cp -f "$target_dir/$triple/release/thereabouts-policy-compiler" "$target_dir/$out/thereabouts-policy-compiler"
echo "$target_dir/$out/thereabouts"
