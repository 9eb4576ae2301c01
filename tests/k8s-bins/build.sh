#!/usr/bin/env bash
# Builds kube-apiserver, kubelet, kube-controller-manager, kube-scheduler (one
# `go build` of the kubernetes/ module: they share most packages) and etcd
# (versions in versions.env) from the committed go.mod/go.sum through the Go module
# proxy, once per version, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/k8s-bins/<version>/
# and prints that directory on stdout (progress goes to stderr). Idempotent: when
# every binary is already cached it only prints the directory.
#
# Needs: Go (>= the go directive of the go.mod files, 1.26) and the Go module proxy.
# Cold build on 2 cores takes minutes; it runs under `nice` so it does not starve
# whatever else the machine is doing. Override the location with THEREABOUTS_K8S_BINS_CACHE.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

# shellcheck source=cache.sh
source "$here/cache.sh"
version="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}"
k8s_commands=(kube-apiserver kubelet kube-controller-manager kube-scheduler)
have() {
  local c
  for c in "${k8s_commands[@]}" etcd; do [[ -x "$out/$c" ]] || return 1; done
}
if ! command -v go >/dev/null 2>&1 && ! have; then
  echo "build.sh: Go is not installed; the Kubernetes tests need Go >= 1.26 to build kube-apiserver and etcd" >&2
  exit 1
fi
cache_begin "${THEREABOUTS_K8S_BINS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/k8s-bins}" "$version" have

export CGO_ENABLED=0
# The module directories live inside the project's git checkout; VCS stamping
# would make the build depend on git being installed and the tree's state.
goflags=(-mod=readonly -trimpath -buildvcs=false)
minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
k8s_ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"

start=$SECONDS
echo "build.sh: building etcd $ETCD_VERSION ..." >&2
(cd "$here/etcd" && nice -n 19 go build "${goflags[@]}" -ldflags "-s -w" -o "$stage/etcd" .)
echo "build.sh: etcd built in $((SECONDS - start)) s" >&2

start=$SECONDS
echo "build.sh: building ${k8s_commands[*]} $KUBERNETES_VERSION (cold: many minutes) ..." >&2
(cd "$here/kubernetes" && nice -n 19 go build "${goflags[@]}" -ldflags "$k8s_ldflags" -o "$stage/" "${k8s_commands[@]/#/./}")
echo "build.sh: ${k8s_commands[*]} built in $((SECONDS - start)) s" >&2

"$stage/etcd" --version >&2
for c in "${k8s_commands[@]}"; do "$stage/$c" --version >&2; done

cache_publish
