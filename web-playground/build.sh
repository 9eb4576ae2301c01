#!/usr/bin/env bash
# Builds the playground's engine from the current sources, so the page can never
# drift from the plugin: `cargo build -p thereabouts` compiles allocator-wasm into the
# engine component and embeds it; `thereabouts engine-component` writes those exact
# bytes; jco (pinned in package-lock.json) transpiles them into web-playground/engine/.
#
#   bash web-playground/build.sh            # debug host (fast to build)
#   PROFILE=release bash web-playground/build.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
profile="${PROFILE:-debug}"

cd "$root"
source scripts/setup-rust.sh
if [[ "$profile" == release ]]; then
  cargo build -p thereabouts --release
else
  cargo build -p thereabouts
fi

cd "$here"
if [[ ! -x node_modules/.bin/jco ]]; then
  npm ci --no-audit --no-fund
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$root/target/$profile/thereabouts" engine-component --out "$tmp/engine.wasm"
rm -rf "$tmp/engine"
node_modules/.bin/jco transpile "$tmp/engine.wasm" -o "$tmp/engine" --name engine --quiet
# jco's output is an ES module; a package.json keeps Node (the tests) from reading it as CommonJS.
printf '{"type":"module"}\n' > "$tmp/engine/package.json"
# Record which component the page runs (shown in the footer).
sha="$(sha256sum "$tmp/engine.wasm" | cut -c1-12)"
printf '{"component_sha256": "%s", "bytes": %s}\n' "$sha" "$(stat -c %s "$tmp/engine.wasm")" > "$tmp/engine/build-info.json"
rm -rf "$here/engine"
mv "$tmp/engine" "$here/engine"
echo "playground engine: web-playground/engine/engine.js (component sha256 $sha…)"
