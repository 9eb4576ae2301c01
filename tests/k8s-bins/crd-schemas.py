#!/usr/bin/env python3
"""The JSON schemas of this project's CRDs (deploy/crds) for kubeconform, strict:
every object schema that lists its properties refuses others (as the apiserver
prunes them, kubeconform then names a misspelt field), unless it preserves
unknown fields. Files are named {group}_{kind}_{version}.json, lowercase.

Usage: crd-schemas.py OUT CRD.yaml...   (needs PyYAML: python3 -m pip, or Debian's python3-yaml)"""
import json
import os
import sys

import yaml


def strict(schema):
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
        for value in schema.values():
            strict(value)
    elif isinstance(schema, list):
        for value in schema:
            strict(value)
    return schema


def main(out, files):
    os.makedirs(out, exist_ok=True)
    for path in files:
        with open(path) as f:
            for crd in yaml.safe_load_all(f):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
                for version in crd["spec"]["versions"]:
                    schema = strict(version["schema"]["openAPIV3Schema"])
                    # apiVersion, kind and metadata are the apiserver's to check.
                    schema.setdefault("properties", {}).setdefault("metadata", {"type": "object"})
                    name = "{}_{}_{}.json".format(group, kind, version["name"]).lower()
                    with open(os.path.join(out, name), "w") as f:
                        json.dump(schema, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
