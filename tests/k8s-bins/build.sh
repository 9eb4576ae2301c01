#!/usr/bin/env bash
# Builds kube-apiserver and etcd (versions in versions.env) from the committed
# go.mod/go.sum through the Go module proxy, once per version, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/k8s-bins/<version>/
# and prints that directory on stdout (progress goes to stderr). Idempotent: when
# both binaries are already cached it only prints the directory.
#
# Needs: Go (>= the go directive of the go.mod files, 1.26) and the Go module proxy.
# Cold build on 2 cores takes minutes; it runs under `nice` so it does not starve
# whatever else the machine is doing. Override the location with THEREABOUTS_K8S_BINS_CACHE.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

version="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}"
cache_root=${THEREABOUTS_K8S_BINS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/k8s-bins}
out="$cache_root/$version"

have() { [[ -x "$out/kube-apiserver" && -x "$out/etcd" ]]; }
if have; then
  echo "$out"
  exit 0
fi

command -v go >/dev/null 2>&1 || {
  echo "build.sh: Go is not installed; the Kubernetes tests need Go >= 1.26 to build kube-apiserver and etcd" >&2
  exit 1
}

mkdir -p "$cache_root"
# One builder at a time per version (parallel test runs on one machine).
exec 9>"$cache_root/.$version.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi
if have; then
  echo "$out"
  exit 0
fi

stage=$(mktemp -d "$cache_root/.$version.XXXXXX")
trap 'rm -rf "$stage"' EXIT

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
echo "build.sh: building kube-apiserver $KUBERNETES_VERSION (cold: many minutes) ..." >&2
(cd "$here/apiserver" && nice -n 19 go build "${goflags[@]}" -ldflags "$k8s_ldflags" -o "$stage/kube-apiserver" .)
echo "build.sh: kube-apiserver built in $((SECONDS - start)) s" >&2

"$stage/etcd" --version >&2
"$stage/kube-apiserver" --version >&2

# Publish atomically: a half-built directory is never seen as a cache hit.
chmod 755 "$stage"
rm -rf "$out"
mv "$stage" "$out"
trap - EXIT
echo "$out"
