#!/usr/bin/env bash
# Builds the real node's runtime and network plugins (versions in versions.env) from
# the committed go.mod/go.sum of containerd/, cni/ and multus/ through the Go module
# proxy, once per version set, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/node/<versions>/
# and prints that directory on stdout (progress on stderr):
#   bin/      containerd, containerd-shim-runc-v2, ctr
#   cni/      bridge, loopback, macvlan, host-local, multus (the CNI bin dir of the
#             node, without thereabouts: the installer DaemonSet puts it there)
#   cnitool   libcni's command line (the only sender of CNI GC)
#   multus-daemonset.yml  Multus' own manifest (its NetworkAttachmentDefinition CRD)
#   pause     the sandbox's process: a static C program that sleeps until
#             SIGTERM/SIGINT and reaps children (what the pause image runs)
# kubelet, kube-controller-manager and kube-scheduler come from build.sh.
# Cold: about 8 minutes on 2 cores, under `nice`; instant once cached.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=cache.sh
source "$here/cache.sh"
key="containerd-${CONTAINERD_VERSION}_plugins-${CNI_PLUGINS_VERSION}_cnitool-${CNITOOL_VERSION}_multus-${MULTUS_VERSION}"
cni_plugins=(bridge loopback macvlan host-local multus)
have() {
  local p
  for p in bin/containerd bin/containerd-shim-runc-v2 bin/ctr cnitool pause multus-daemonset.yml "${cni_plugins[@]/#/cni/}"; do
    [[ -f "$out/$p" ]] || return 1
  done
}
cache_begin "${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/node" "$key" have

export CGO_ENABLED=0
goflags=(-mod=readonly -trimpath -buildvcs=false -ldflags "-s -w")
mkdir -p "$stage/bin" "$stage/cni"
start=$SECONDS
ctrd=github.com/containerd/containerd/v2
echo "build-node.sh: building containerd $CONTAINERD_VERSION ..." >&2
# btrfs and devmapper need cgo, zfs is not here: the overlayfs snapshotter is used.
(cd "$here/containerd" && nice -n 19 go build "${goflags[@]}" -tags "no_btrfs no_devmapper no_zfs" -o "$stage/bin/" \
  "$ctrd/cmd/containerd" "$ctrd/cmd/containerd-shim-runc-v2" "$ctrd/cmd/ctr")
echo "build-node.sh: containerd built in $((SECONDS - start)) s; building the CNI plugins $CNI_PLUGINS_VERSION and cnitool $CNITOOL_VERSION ..." >&2
plugins=github.com/containernetworking/plugins/plugins
(cd "$here/cni" && nice -n 19 go build "${goflags[@]}" -o "$stage/cni/" \
  "$plugins/main/bridge" "$plugins/main/loopback" "$plugins/main/macvlan" "$plugins/ipam/host-local")
(cd "$here/cni" && nice -n 19 go build "${goflags[@]}" -o "$stage/cnitool" github.com/containernetworking/cni/cnitool)
echo "build-node.sh: building multus $MULTUS_VERSION ..." >&2
(cd "$here/multus" && nice -n 19 go build "${goflags[@]}" -o "$stage/cni/multus" gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus)
multus_module=$(cd "$here/multus" && go list -mod=readonly -m -f '{{.Dir}}' gopkg.in/k8snetworkplumbingwg/multus-cni.v4)
cp "$multus_module/deployments/multus-daemonset.yml" "$stage/"
chmod 0644 "$stage/multus-daemonset.yml"
cc -static -Os -s -o "$stage/pause" "$here/pause.c"
echo "build-node.sh: built in $((SECONDS - start)) s" >&2
"$stage/bin/containerd" --version >&2
cache_publish
