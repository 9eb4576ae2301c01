#!/usr/bin/env bash
# thereabouts quick start: build the plugin, then drive it exactly as a container
# runtime would (CNI_* environment + network config on stdin, result on stdout)
# on the embedded file datastore in a throw-away directory.
# Needs no root and no network namespace: it calls the IPAM plugin directly,
# the way the bridge plugin delegates to it.
set -euo pipefail
cd "$(dirname "$0")/.."

# The plugin as it ships: a static executable (scripts/build-plugin.sh).
plugin="$(bash scripts/build-plugin.sh)"

work="$(mktemp -d -t thereabouts-quickstart.XXXXXX)"
trap 'rm -rf "$work"' EXIT
# The dual-stack example, with its data_dir moved into the scratch directory.
sed "s|/var/lib/cni/thereabouts|$work/data|" examples/dual-stack.conf > "$work/net.conf"

# One CNI call: $1 = command, $2 = container ID, $3 = pod name.
cni() {
  local command=$1 container=$2 pod=$3
  echo "\$ CNI_COMMAND=$command CNI_CONTAINERID=$container CNI_IFNAME=eth0 CNI_ARGS='K8S_POD_NAMESPACE=default;K8S_POD_NAME=$pod' thereabouts < net.conf"
  local status=0
  CNI_COMMAND=$command CNI_CONTAINERID=$container CNI_NETNS=/var/run/netns/$pod CNI_IFNAME=eth0 \
    CNI_PATH=/opt/cni/bin CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=$pod" \
    "$plugin" < "$work/net.conf" || status=$?
  echo "(exit status $status)"
  echo
}

echo "== network config (examples/dual-stack.conf, data_dir in $work/data)"
cat "$work/net.conf"
echo
echo "== ADD pod-1: one address from each range"
cni ADD 6f1a0c2b9d3e pod-1
echo "== ADD pod-2: the next free addresses"
cni ADD 8c2d4e6f0a1b pod-2
echo "== DEL pod-1: prints nothing on success"
cni DEL 6f1a0c2b9d3e pod-1
echo "== pool usage after the DEL"
"$plugin" pools --config "$work/net.conf"
echo
echo "== what the next three pods would get (nothing is written)"
"$plugin" preview --config "$work/net.conf" --pods 3 --from-datastore
