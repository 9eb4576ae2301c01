#!/usr/bin/env bash
# Real-node tests (tests/node): a one-node cluster from real parts on this
# machine (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a
# kubelet, containerd 2.x with Debian's runc, CNI plugins and Multus, all built
# from their Go modules and cached by version under ~/.cache/thereabouts), with
# thereabouts' image imported into containerd and its chart installed by helm.
# Needs root, cgroups and overlayfs; fails naming what this machine lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v go >/dev/null 2>&1 || {
  echo "tests/node.sh: Go >= 1.26 is required to build the node's binaries (tests/k8s-bins)" >&2
  exit 1
}
need=()
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
dpkg-query -W busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
THEREABOUTS_K8S_BINS=$(bash tests/k8s-bins/build.sh)
THEREABOUTS_NODE_BINS=$(bash tests/k8s-bins/build-node.sh)
THEREABOUTS_TOOLS=$(bash tests/k8s-bins/build-tools.sh)
# whereabouts v0.9.4, for the migration case (N11).
THEREABOUTS_WHEREABOUTS_DIR=$(bash tests/k8s-bins/build-peers.sh whereabouts)
export THEREABOUTS_K8S_BINS THEREABOUTS_NODE_BINS THEREABOUTS_WHEREABOUTS_DIR THEREABOUTS_HELM="$THEREABOUTS_TOOLS/helm"
echo "kubernetes: $THEREABOUTS_K8S_BINS; node: $THEREABOUTS_NODE_BINS"
# The image the chart installs (and the plugin it holds).
source scripts/setup-rust.sh
bash scripts/build-image.sh >/dev/null
# One node at a time: each test binary starts its own.
cargo test -p thereabouts-node-tests -- --test-threads=1
