#!/usr/bin/env bash
# Formatting and lints, part of the README's test command: `cargo fmt --check`
# against the checked-in rustfmt.toml, and clippy on every crate and target with
# warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-rust.sh
for component in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
    rustup component add "$component"
  fi
done
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
