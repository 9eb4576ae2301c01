#!/usr/bin/env bash
# Kubernetes and etcd tests: builds (or reuses from the cache outside the clone) a
# real kube-apiserver and etcd from the Go module proxy, then runs the tests that
# start them through the Rust harness (tests/k8s-harness), the etcd datastore's
# included (tests/etcd_datastore.rs, tests/etcd_burst.rs), and the real whereabouts
# and toxiproxy (tests/k8s-bins/build-peers.sh, tests/peers.rs). Needs Go >= 1.26.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v go >/dev/null 2>&1 || {
  echo "tests/k8s.sh: Go >= 1.26 is required to build kube-apiserver and etcd (tests/k8s-bins)" >&2
  exit 1
}
bins=$(bash tests/k8s-bins/build.sh)
echo "kube-apiserver and etcd: $bins"
# The harness would run build.sh itself; pointing it at the directory skips that.
export THEREABOUTS_K8S_BINS="$bins"
# The peers of the comparison (issue 12): whereabouts and toxiproxy, also cached by
# version (tests/peers.rs runs them; the benchmarks too).
peers=$(bash tests/k8s-bins/build-peers.sh whereabouts toxiproxy)
whereabouts_dir=$(sed -n 1p <<<"$peers")
toxiproxy_dir=$(sed -n 2p <<<"$peers")
echo "whereabouts: $whereabouts_dir; toxiproxy: $toxiproxy_dir"
export THEREABOUTS_WHEREABOUTS_DIR="$whereabouts_dir" THEREABOUTS_TOXIPROXY_DIR="$toxiproxy_dir"
# The chart's registry round trip (tests/chart.rs): a loopback registry, skopeo, and
# the image's busybox.
need=()
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
command -v skopeo >/dev/null 2>&1 || need+=(skopeo)
dpkg-query -W busybox-static >/dev/null 2>&1 || need+=(busybox-static)
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
THEREABOUTS_TOOLS=$(bash tests/k8s-bins/build-tools.sh)
echo "helm, kubeconform, ct and schemas: $THEREABOUTS_TOOLS"
export THEREABOUTS_TOOLS THEREABOUTS_HELM="$THEREABOUTS_TOOLS/helm"
# The Rust target and the build's Debian packages (C toolchain, protoc), when missing.
source scripts/setup-rust.sh
# tests/datastore.rs, tests/burst.rs and the etcd tests run the shipped plugin binary
# (target/plugin/thereabouts, the static build) as a CNI process.
bash scripts/build-plugin.sh -q >/dev/null
# A control plane costs ~0.5 GB RSS and a few seconds of CPU (tests start their
# own, or share one per test file): keep the parallelism modest on small machines.
cargo test -p thereabouts-k8s-harness -- --test-threads="${K8S_TEST_THREADS:-2}"
