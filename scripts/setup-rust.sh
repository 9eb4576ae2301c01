# Sourced by the test and quick-start scripts: makes sure the Rust toolchain can
# build the engine component (wasm32-unknown-unknown) on a fresh machine.
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown
fi
# ...and the system packages the build needs (C toolchain, protoc).
# shellcheck source=scripts/build-deps.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-deps.sh"
