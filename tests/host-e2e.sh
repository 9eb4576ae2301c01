#!/usr/bin/env bash
# End-to-end tests of the release `thereabouts` binary through the standard CNI interface
# (tests/e2e): concurrency (16 processes x 100 dual-stack ADDs, then DELs), kill -9 crash
# safety with GC, GC semantics, and the data plane in real network namespaces with Debian's
# bridge plugin; and the DaemonSet's installer (deploy/install-cni.sh, plus shellcheck).
# Needs root (network namespaces). Quiet on success apart from the measured
# figures and cargo's result lines; prints the whole log and exits non-zero on failure.
# The benchmark against host-local is separate (not a test):
#   bash scripts/build-plugin.sh && cargo build --release -p thereabouts-e2e && target/release/bench_host_local
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || need+=(containernetworking-plugins)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)
# The image (tests/e2e/tests/image.rs): its busybox, and the tools that check and run it.
dpkg-query -W busybox-static >/dev/null 2>&1 || need+=(busybox-static)
for tool in skopeo umoci runc oci-image-tool; do
  command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
# The arm64 image's binaries run under user-mode emulation (no binfmt needed).
command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static)
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The plugin as it ships (static musl build) at target/plugin/thereabouts, and
# cross-built for arm64 at target/plugin-arm64/ (the multi-architecture image).
bash scripts/build-plugin.sh -q >/dev/null
PLUGIN_ARCH=arm64 bash scripts/build-plugin.sh -q >/dev/null

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! cargo test -q -p thereabouts-e2e -- --test-threads=1 --nocapture >"$log" 2>&1; then
  cat "$log"
  echo "tests/host-e2e.sh: FAILED" >&2
  exit 1
fi
# The measured figures, and cargo's result lines of the suites that ran tests.
grep -oE '(concurrency|exhaustion|crash): .*' "$log" || true
grep -E '^test result:' "$log" | grep -v ' 0 passed; 0 failed' || true
