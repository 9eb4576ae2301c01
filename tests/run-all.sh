#!/usr/bin/env bash
# Every test of the project, on a fresh machine: installs what it needs, then runs
# formatting and lints (cargo fmt --check, clippy -D warnings), the engine
# tests, the plugin's process tests, the end-to-end tests (concurrency, kill -9,
# network namespaces), a short run of every fuzz target, the playground's browser tests, the tests
# against a real kube-apiserver and etcd, and the real-node tests (kubelet,
# containerd, Multus). This is the README's test command;
# .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean clone's target/ reuses the crates compiled by earlier runs (and the
# plugin builds of the same sources are reused by scripts/build-plugin.sh).
# shellcheck source=scripts/cargo-target-cache.sh
source scripts/cargo-target-cache.sh
for suite in tests/lint.sh tests/engine.sh tests/host.sh tests/host-e2e.sh tests/fuzz.sh tests/playground.sh tests/k8s.sh tests/node.sh; do
  echo "=== $suite"
  bash "$suite"
done
