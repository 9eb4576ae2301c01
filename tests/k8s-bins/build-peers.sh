#!/usr/bin/env bash
# Builds the peers of the side-by-side comparison (versions in versions.env) from the
# committed go.mod/go.sum of whereabouts/ and toxiproxy/ through the Go module proxy,
# once per version, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/peers/whereabouts-<v>/
#     whereabouts              the CNI plugin (cmd/)
#     ip-control-loop          its pod controller (cmd/controlloop)
#     ip-reconciler            its cron reconciler Deployment (cmd/reconciler)
#     node-slice-controller    its node-slice controller (cmd/nodeslicecontroller)
#     manifests/               doc/crds/ of the same module: its CRDs, RBAC, Deployments
#     script/                  script/ of the same module: its image's install-cni.sh,
#                              lib.sh and token-watcher.sh (the real-node migration test)
#   ${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/peers/toxiproxy-<v>/toxiproxy-server
#
#   build-peers.sh [whereabouts|toxiproxy]...   (no argument: both)
#
# prints the directory of each named peer on stdout, one per line, in the order named
# (progress goes to stderr). Idempotent: a cached peer only costs the print. Parallel
# runs build each peer once (a lock per peer and version). Override the location with
# THEREABOUTS_PEERS_CACHE. Needs Go (>= the go directive of the go.mod files, 1.26).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache_root=${THEREABOUTS_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/peers}

export CGO_ENABLED=0
# The module directories live inside the project's git checkout; VCS stamping would
# make the build depend on git being installed and the tree's state.
goflags=(-mod=readonly -trimpath -buildvcs=false)

wb=github.com/k8snetworkplumbingwg/whereabouts
# The binary names of whereabouts' own image (hack/build-go.sh, Dockerfile).
wb_cmds=("whereabouts=$wb/cmd" "ip-control-loop=$wb/cmd/controlloop"
  "ip-reconciler=$wb/cmd/reconciler" "node-slice-controller=$wb/cmd/nodeslicecontroller")

# build_whereabouts <stage>
build_whereabouts() {
  local stage=$1 info sha entry
  info=$(cd "$here/whereabouts" && go mod download -json "$wb@$WHEREABOUTS_VERSION")
  sha=$(jq -r '.Origin.Hash // "" | .[0:8]' <<<"$info")
  # What upstream's hack/build-go.sh stamps into pkg/version for a released tag.
  local ldflags="-s -w -X $wb/pkg/version.Version=$WHEREABOUTS_VERSION -X $wb/pkg/version.GitSHA=$sha \
 -X $wb/pkg/version.GitTreeState=clean -X $wb/pkg/version.ReleaseStatus=released"
  for entry in "${wb_cmds[@]}"; do
    (cd "$here/whereabouts" && nice -n 19 go build "${goflags[@]}" -ldflags "$ldflags" -o "$stage/${entry%%=*}" "${entry#*=}")
  done
  # Its own manifests, so the tests install what a whereabouts user installs.
  cp -R "$(jq -r .Dir <<<"$info")/doc/crds" "$stage/manifests"
  cp -R "$(jq -r .Dir <<<"$info")/script" "$stage/script"
  chmod -R u+w,go-w "$stage/manifests" "$stage/script"
  "$stage/whereabouts" --version >&2 || true
}

# build_toxiproxy <stage>
build_toxiproxy() {
  local stage=$1
  (cd "$here/toxiproxy" && nice -n 19 go build "${goflags[@]}" \
    -ldflags "-s -w -X github.com/Shopify/toxiproxy/v2.Version=$TOXIPROXY_VERSION" \
    -o "$stage/toxiproxy-server" github.com/Shopify/toxiproxy/v2/cmd/server)
  "$stage/toxiproxy-server" -version >&2
}

# have <peer> <dir>: the published directory holds everything (it is only ever
# published whole, so one file per kind is enough).
have() {
  case $1 in
    whereabouts) [[ -x "$2/whereabouts" && -x "$2/node-slice-controller" && -d "$2/manifests" && -d "$2/script" ]] ;;
    toxiproxy) [[ -x "$2/toxiproxy-server" ]] ;;
  esac
}

# peer <name>: builds <name> unless cached; prints its directory.
peer() {
  local name=$1 version
  case $name in
    whereabouts) version=$WHEREABOUTS_VERSION ;;
    toxiproxy) version=$TOXIPROXY_VERSION ;;
    *) echo "build-peers.sh: unknown peer '$name' (whereabouts, toxiproxy)" >&2; return 2 ;;
  esac
  local key="$name-$version" out="$cache_root/$name-$version"
  if have "$name" "$out"; then
    echo "$out"
    return 0
  fi
  command -v go >/dev/null 2>&1 || {
    echo "build-peers.sh: Go is not installed; building $name $version needs Go >= 1.26" >&2
    return 1
  }
  mkdir -p "$cache_root"
  # One builder at a time per peer and version (parallel test runs on one machine);
  # the subshell holds the lock until the directory is published.
  (
    exec 9>"$cache_root/.$key.lock"
    if command -v flock >/dev/null 2>&1; then flock 9; fi
    have "$name" "$out" && exit 0
    stage=$(mktemp -d "$cache_root/.$key.XXXXXX")
    trap 'rm -rf "$stage"' EXIT
    start=$SECONDS
    echo "build-peers.sh: building $name $version ..." >&2
    "build_$name" "$stage"
    echo "build-peers.sh: $name $version built in $((SECONDS - start)) s" >&2
    # Publish atomically: a half-built directory is never seen as a cache hit.
    chmod 755 "$stage"
    rm -rf "$out"
    mv "$stage" "$out"
    trap - EXIT
  )
  echo "$out"
}

[[ $# -gt 0 ]] || set -- whereabouts toxiproxy
for p in "$@"; do peer "$p"; done
