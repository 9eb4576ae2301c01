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
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$target_dir/$out"

# The release profile links with fat LTO: about 2 minutes a binary on 2 cores
# even when every crate is already compiled, 4 binaries for the two
# architectures. A build of exactly these sources (every file of the crates
# that go into the two binaries, Cargo.lock, the cargo config, this script),
# for this triple, with this toolchain and these flags, is kept in
# ~/.cache/thereabouts/plugin/<key>/ and reused. THEREABOUTS_BUILD_CACHE=0
# always builds; arguments other than -q/--quiet build without the cache.
build_key() {
  local arg file
  for arg in "$@"; do [[ "$arg" == -q || "$arg" == --quiet ]] || return 1; done
  git rev-parse --is-inside-work-tree >/dev/null 2>&1 || return 1
  {
    rustc -vV
    cargo -V
    echo "$triple"
    env | grep -E '^(RUSTFLAGS|CARGO_ENCODED_RUSTFLAGS|CARGO_BUILD_|CARGO_PROFILE_|CARGO_TARGET_[A-Z0-9_]+_(LINKER|RUSTFLAGS)|CC_|CFLAGS)' | sort
    git ls-files -z -co --exclude-standard -- Cargo.toml Cargo.lock .cargo rustfmt.toml allocator-wasm host wit scripts/build-plugin.sh |
      sort -z | while IFS= read -r -d '' file; do
        [[ -f "$file" ]] && sha256sum "$file"
      done
  } | sha256sum | cut -c1-32
}
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/plugin"
key=""
[[ "${THEREABOUTS_BUILD_CACHE:-1}" == 1 ]] && key=$(build_key "$@") || key=""
cached="$cache_root/$key"
if [[ -n "$key" && -x "$cached/thereabouts" && -x "$cached/thereabouts-policy-compiler" ]]; then
  echo "build-plugin.sh: $triple build of these sources reused from $cached" >&2
  touch "$cached"
  cp -f "$cached/thereabouts" "$cached/thereabouts-policy-compiler" "$target_dir/$out/"
  echo "$target_dir/$out/thereabouts"
  exit 0
fi

cargo build --release -p thereabouts --target "$triple" "$@" >&2
cargo build --release -p thereabouts-policy-compiler --target "$triple" "$@" >&2
cp -f "$target_dir/$triple/release/thereabouts" "$target_dir/$out/thereabouts"
cp -f "$target_dir/$triple/release/thereabouts-policy-compiler" "$target_dir/$out/thereabouts-policy-compiler"
if [[ -n "$key" ]]; then
  # Written aside and renamed, so a reader never sees half an entry; the 8
  # entries used last are kept.
  mkdir -p "$cache_root"
  staging=$(mktemp -d "$cache_root/.staging.XXXXXX")
  cp -f "$target_dir/$out/thereabouts" "$target_dir/$out/thereabouts-policy-compiler" "$staging/"
  if ! mv -T "$staging" "$cached" 2>/dev/null; then rm -rf "$staging"; fi
  # shellcheck disable=SC2012 # names are hex keys
  ls -1t "$cache_root" | tail -n +9 | while read -r stale; do rm -rf "${cache_root:?}/$stale"; done
fi
echo "$target_dir/$out/thereabouts"
