#!/usr/bin/env bash
# Browser tests of the web playground, on a fresh machine: installs Debian's
# chromium and the pinned npm packages, builds the engine component and transpiles
# it, serves web-playground/ on a free loopback port and drives it headless.
# Artifacts (screenshots, the 10 000-pod timing) go to tests/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

if [[ ! -x /usr/bin/chromium ]]; then
  echo "=== installing chromium (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi

echo "=== npm ci (web-playground)"
(cd web-playground && npm ci --no-audit --no-fund --loglevel=error)

echo "=== building the engine and transpiling it"
bash web-playground/build.sh

mkdir -p tests/artifacts
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
python3 -m http.server "$port" --bind 127.0.0.1 --directory web-playground >tests/artifacts/http-server.log 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/index.html', timeout=1)" 2>/dev/null; then break; fi
  sleep 0.2
done

echo "=== Node unit tests of lib/*.js (on the transpiled engine)"
node --test web-playground/tests/nad.test.mjs web-playground/tests/model.test.mjs web-playground/tests/cluster.test.mjs web-playground/tests/policies.test.mjs

echo "=== browser tests (http://127.0.0.1:$port/)"
PLAYGROUND_URL="http://127.0.0.1:$port/" \
THEREABOUTS_BIN="$root/target/debug/thereabouts" \
CHROMIUM=/usr/bin/chromium \
  node --test --test-concurrency=1 web-playground/tests/playground.test.mjs
