#!/usr/bin/env bash
# Builds the engine, then serves the static playground on http://127.0.0.1:${PORT:-8080}/
#   bash web-playground/serve.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/build.sh"
port="${PORT:-8080}"
echo "thereabouts playground: http://127.0.0.1:$port/"
cd "$here"
exec python3 -m http.server "$port" --bind 127.0.0.1
