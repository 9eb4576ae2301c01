#!/usr/bin/env bash
# Builds the install tests' tools (versions in versions.env) once per version set, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/tools/<versions>/
# and prints that directory on stdout (progress on stderr). It holds:
#   helm, kubeconform,  one `go build` from the committed tools/go.mod (they share the
#   ct                  Kubernetes modules), through the Go module proxy
#   ct-etc/             chart-testing's chart_schema.yaml and lintconf.yaml, from its module
#   venv/               kubernetes-validate, yamllint and yamale
#   py-bin/             yamllint and yamale as ct lint runs them from PATH: wrappers
#                       that find the venv beside them (the venv's own scripts name
#                       the staging directory they were installed in)
#   schemas/            Kubernetes' JSON schemas for kubeconform, taken from the PyPI
#                       package kubernetes-validate (KUBERNETES_VALIDATE_VERSION) and
#                       made resolvable offline (k8s-schemas.py)
# Cold: a few minutes on 2 cores, under `nice`; instant once cached.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=cache.sh
source "$here/cache.sh"
# The schemas of the apiserver's minor version (the tests' kube-apiserver).
schemas_version="${KUBERNETES_VERSION%.*}.0"
key="helm-${HELM_VERSION}_kubeconform-${KUBECONFORM_VERSION}_ct-${CHART_TESTING_VERSION}_schemas-${KUBERNETES_VALIDATE_VERSION}-${schemas_version}"
have() { [[ -x "$out/helm" && -x "$out/kubeconform" && -x "$out/ct" && -f "$out/ct-etc/lintconf.yaml" && -d "$out/schemas" && -x "$out/py-bin/yamale" ]]; }
cache_begin "${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/tools" "$key" have
start=$SECONDS
echo "build-tools.sh: building helm $HELM_VERSION, kubeconform $KUBECONFORM_VERSION and ct $CHART_TESTING_VERSION ..." >&2
(cd "$here/tools" && CGO_ENABLED=0 nice -n 19 go build -mod=readonly -trimpath -buildvcs=false \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" -o "$stage/" \
  helm.sh/helm/v4/cmd/helm github.com/yannh/kubeconform/cmd/kubeconform github.com/helm/chart-testing/v3/ct)
ct_module=$(cd "$here/tools" && go list -mod=readonly -m -f '{{.Dir}}' github.com/helm/chart-testing/v3)
mkdir -p "$stage/ct-etc"
cp "$ct_module/etc/chart_schema.yaml" "$ct_module/etc/lintconf.yaml" "$stage/ct-etc/"
echo "build-tools.sh: built in $((SECONDS - start)) s; fetching kubernetes-validate $KUBERNETES_VALIDATE_VERSION ..." >&2
python3 -m venv "$stage/venv"
"$stage/venv/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" \
  "yamllint==$YAMLLINT_VERSION" "yamale==$YAMALE_VERSION" >&2
mkdir -p "$stage/py-bin"
for tool in yamllint:yamllint.cli:run yamale:yamale.command_line:main; do
  IFS=: read -r name module function <<<"$tool"
  printf '#!/bin/sh\nexec "$(dirname "$0")/../venv/bin/python" -c %s "$@"\n' \
    "'import sys; from $module import $function; sys.argv[0] = \"$name\"; sys.exit($function())'" >"$stage/py-bin/$name"
  chmod 0755 "$stage/py-bin/$name"
done
site=$("$stage/venv/bin/python" -c 'import kubernetes_validate, os; print(os.path.dirname(kubernetes_validate.__file__))')
python3 "$here/k8s-schemas.py" "$site/kubernetes-json-schema" "$stage/schemas" "$schemas_version"
# The venv stays: crd-schemas.py runs on its Python (PyYAML comes with kubernetes-validate).
cache_publish
