#!/usr/bin/env bash
# Renders the plain manifests of deploy/ from the chart (charts/thereabouts), the
# one source of truth: `kubectl apply -f deploy/X.yaml` installs what
# `helm install` would, piece by piece. Run it after changing the chart, and
# commit the result; tests/k8s-harness/tests/chart.rs fails when they drift.
#
# Usage: render-manifests.sh [OUT_DIR (default deploy)]. HELM names the helm
# binary (default: tests/k8s-bins/build-tools.sh builds and caches it).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-deploy}
helm=${HELM:-$(bash tests/k8s-bins/build-tools.sh)/helm}

# render FILE [helm values...]: templates/FILE with the chart's defaults (plus
# the values that turn an optional piece on), in kube-system.
render() {
  local file=$1
  shift
  {
    printf '# Generated from charts/thereabouts/templates/%s by scripts/render-manifests.sh;\n' "$file"
    printf '# edit the chart, then run the script.\n'
    "$helm" template thereabouts charts/thereabouts --namespace kube-system "$@" --show-only "templates/$file" 2> >(grep -v "found symbolic link" >&2) |
      sed -e '/^# Source: /d' -e '1{/^---$/d}' | cat -s
  } >"$out/$file"
}

mkdir -p "$out"
render rbac.yaml
render rbac-pod-labels.yaml --set podLabelsRbac.enabled=true
render rbac-persistent-ips.yaml --set persistentIPsRbac.enabled=true
render flowcontrol.yaml
render daemonset.yaml
render controller.yaml
render admission.yaml
