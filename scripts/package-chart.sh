#!/usr/bin/env bash
# Packages charts/thereabouts into OUT_DIR (default target/chart) as
# thereabouts-<version>.tgz, reproducibly: Helm writes each file's own mtime
# into the archive, so a copy of the chart (its crds/ link resolved) has every
# mtime set to SOURCE_DATE_EPOCH (the last commit's time) first; the .tgz gets
# that mtime too, since `helm push` stamps it into the OCI manifest. Prints the
# package's path. HELM names the helm binary (default: build-tools.sh's).
#
# Publishing: helm push target/chart/thereabouts-<version>.tgz oci://ghcr.io/thereabouts/charts
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/chart}
helm=${HELM:-$(bash tests/k8s-bins/build-tools.sh)/helm}
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -rL charts/thereabouts "$stage/thereabouts"
chmod -R u=rwX,go=rX "$stage/thereabouts"
find "$stage/thereabouts" -exec touch -h -d "@$epoch" {} +
mkdir -p "$out"
"$helm" package "$stage/thereabouts" --destination "$out" >/dev/null
package="$out/thereabouts-$(sed -n 's/^version: *//p' charts/thereabouts/Chart.yaml).tgz"
touch -d "@$epoch" "$package"
echo "$package"
