#!/usr/bin/env bash
# Builds the playground's engine from the current sources, so the page can never
# drift from the plugin: `cargo build -p thereabouts` compiles allocator-wasm into the
# engine component and embeds it; `thereabouts engine-component` writes those exact
# bytes; jco (pinned in package-lock.json) transpiles them into web-playground/engine/.
#
# It copies js-yaml's ES module to web-playground/vendor/ for lib/cluster.js.
# It also transpiles, with the same jco, every example policy (target/policies/*.wasm,
# built by scripts/build-policies.sh when missing) into web-playground/policies/<name>/
# plus policies/manifest.json, and bundles jco's own transpiler (js-component-bindgen,
# with rolldown, pinned too) into web-playground/transpiler/ so that the page can
# transpile a policy .wasm the user picks.
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
if [[ ! -x node_modules/.bin/jco || ! -f node_modules/js-yaml/dist/js-yaml.mjs ]]; then
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

# js-yaml (pinned in package-lock.json), served from vendor/: the page reads a
# pasted cluster's `kubectl get ... -o yaml` with it (lib/cluster.js). One ES
# module file, no dependencies.
mkdir -p "$here/vendor"
cp node_modules/js-yaml/dist/js-yaml.mjs "$here/vendor/js-yaml.mjs"
echo "playground engine: web-playground/engine/engine.js (component sha256 $sha…)"

# The example policies, transpiled as the page transpiles a picked file
# (lib/transpile-output.js holds the same options for jco's `generate`).
policy_dir="${CARGO_TARGET_DIR:-$root/target}/policies"
if ! compgen -G "$policy_dir/*.wasm" >/dev/null; then
  policy_dir="$(cd "$root" && bash scripts/build-policies.sh -q)"
fi
mkdir -p "$tmp/policies"
for wasm in "$policy_dir"/*.wasm; do
  node_modules/.bin/jco transpile "$wasm" -o "$tmp/policies/$(basename "$wasm" .wasm)" --name policy --instantiation async --no-typescript --quiet
done
# The manifest: which examples there are and which files each is made of.
node --input-type=module - "$tmp/policies" "$policy_dir" <<'JS'
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
const [out, from] = process.argv.slice(2);
const policies = readdirSync(out).sort().map((name) => ({
  name,
  file: `${name}.wasm`,
  dir: name,
  js: 'policy.js',
  cores: readdirSync(`${out}/${name}`).filter((f) => f.endsWith('.wasm')).sort(),
  sha256: createHash('sha256').update(readFileSync(`${from}/${name}.wasm`)).digest('hex').slice(0, 12),
}));
writeFileSync(`${out}/manifest.json`, JSON.stringify({ policies }, null, 1) + '\n');
JS
rm -rf "$here/policies"
mv "$tmp/policies" "$here/policies"
echo "playground policies: web-playground/policies/ (from $policy_dir)"

# jco's transpiler for the browser: its browser build imports WASI shims by
# bare name, which a page cannot resolve, hence one bundle; its core modules
# are fetched next to it.
bindgen="node_modules/@bytecodealliance/jco-transpile/vendor"
mkdir -p "$tmp/transpiler"
node_modules/.bin/rolldown lib/transpiler-entry.js --platform browser --format esm --no-codeSplitting \
  --external node:fs/promises --file "$tmp/transpiler/transpiler.js" --logLevel silent >/dev/null
cp "$bindgen"/js-component-bindgen-component.core*.wasm "$tmp/transpiler/"
rm -rf "$here/transpiler"
mv "$tmp/transpiler" "$here/transpiler"
echo "playground transpiler: web-playground/transpiler/transpiler.js"
