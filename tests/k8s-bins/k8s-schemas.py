#!/usr/bin/env python3
"""Kubernetes' JSON schemas (as the PyPI package kubernetes-validate ships them) in
kubeconform's layout, resolvable offline: each file loses its `$id`, whose
https://kubernetes.io/ base would send kubeconform to the network for every
`$ref`, and its refs to the shared definitions become relative.

Usage: k8s-schemas.py SRC (kubernetes_validate/kubernetes-json-schema) OUT VERSION
The directories of VERSION (v1.36.0-local, v1.36.0-local-strict) are written under
OUT with the same names."""
import json
import os
import sys


def main(src, out, wanted):
    for version in sorted(v for v in os.listdir(src) if v.startswith(wanted + "-")):
        source, target = os.path.join(src, version), os.path.join(out, version)
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(source):
            with open(os.path.join(source, name)) as f:
                text = f.read().replace('"/api/_definitions.json#', '"_definitions.json#')
            schema = json.loads(text)
            schema.pop("$id", None)
            with open(os.path.join(target, name), "w") as f:
                json.dump(schema, f, separators=(",", ":"))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3])
