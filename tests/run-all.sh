#!/usr/bin/env bash
# Every test of the project, on a fresh machine: installs what it needs, then runs
# the engine tests, the host (CNI plugin) tests and the playground's browser tests.
# This is the README's test command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
for suite in tests/engine.sh tests/host.sh tests/host-e2e.sh tests/playground.sh tests/k8s.sh; do
  if [[ -f "$suite" ]]; then
    echo "=== $suite"
    bash "$suite"
  fi
done
