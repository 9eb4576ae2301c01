#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/) from the
project's own test vectors: the JSON literals of the engine's and the host's
tests (configs, pool documents, objects), the examples, and a pool file built
the way the file store writes one. Run it again when the vectors change; the
seeds are kept in the repository, named by their content's digest.

    python3 fuzz/seeds.py
"""

import hashlib
import json
import os
import re
import struct
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")

# Where the test vectors are: the tests that build configs, pools and objects.
SOURCES = [
    "allocator-wasm/src/config_tests.rs",
    "allocator-wasm/src/range.rs",
    "allocator-wasm/src/slices.rs",
    "allocator-wasm/src/objects.rs",
    "allocator-wasm/src/cluster_tests.rs",
    "allocator-wasm/src/planner_tests.rs",
    "allocator-wasm/tests/properties.rs",
    "host/src/datastore/pool_document.rs",
    "host/src/datastore/etcd/layout.rs",
    "host/src/datastore/kubernetes/crd.rs",
    "host/src/datastore/kubernetes/slices.rs",
    "host/src/datastore/kubernetes/ipam_claims.rs",
    "host/src/controller/reconcile_tests.rs",
    "tests/k8s-harness/tests/cross_store.rs",
    "tests/k8s-harness/tests/reconciler_interop.rs",
]


def balanced(text, start):
    """The `{...}` that opens at `start`, minding strings."""
    depth, i, quote = 0, start, False
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == '"':
                quote = False
        elif c == '"':
            quote = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        i += 1
    return None


def literals(path):
    """JSON objects written in a Rust file: `json!({...})` bodies and raw strings."""
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    found = []
    for m in re.finditer(r"json!\(\{", text):
        body = balanced(text, m.end() - 1)
        if body:
            found.append(body)
    for m in re.finditer(r'r#*"(\{.*?\})"#*', text, re.S):
        found.append(m.group(1))
    out = []
    for body in found:
        try:
            out.append(json.loads(body))
        except ValueError:
            pass  # a json! with Rust expressions in it
    return out


def write(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def pool_file(version, payload):
    """A pool file as host/src/datastore/pool_file.rs writes one."""
    crc = zlib.crc32(struct.pack("<Q", version) + payload)
    header = b"TPOOL1 %020d %012d %08x\n" % (version, len(payload), crc)
    slot = 4096
    while slot < 2 * (len(header) + len(payload)):
        slot *= 2
    return (header + payload).ljust(2 * slot, b"\0")


def main():
    objects = [o for src in SOURCES if os.path.exists(os.path.join(ROOT, src)) for o in literals(src)]
    for name in sorted(os.listdir(os.path.join(ROOT, "examples"))):
        path = os.path.join(ROOT, "examples", name)
        if name.endswith((".conf", ".conflist")):
            objects.append(json.load(open(path)))
    flat = json.load(open(os.path.join(ROOT, "examples", "whereabouts.d", "whereabouts.conf")))

    configs, ipams, pools, k8s = [], [], [], []
    for o in objects:
        if not isinstance(o, dict):
            continue
        if "ipam" in o or "plugins" in o:
            configs.append(o)
        elif o.get("type") in ("whereabouts", "thereabouts") or "ipRanges" in o or "range" in o and "allocations" not in o:
            ipams.append(o)
        if "allocations" in o and "range" in o:
            pools.append(o)
        if "kind" in o or "metadata" in o or "spec" in o:
            k8s.append(o)
    for ipam in ipams:
        configs.append({"cniVersion": "1.0.0", "name": "seed", "type": "macvlan", "ipam": ipam})
    args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod;K8S_POD_INFRA_CONTAINER_ID=c1"
    for i, c in enumerate(configs):
        text = json.dumps(c)
        write("config", text)
        if i % 3 == 0:
            write("config", text + "\0" + json.dumps(flat) + "\0" + args)
    write("config", json.dumps(configs[0] if configs else {}) + "\0\0IP=192.0.2.7/24;GATEWAY=192.0.2.1;" + args)
    runtime = {"cniVersion": "1.0.0", "name": "seed", "type": "bridge", "runtimeConfig": {"ips": ["192.0.2.9/24", "2001:db8::9/64"]},
               "args": {"cni": {"ips": ["192.0.2.9"], "ipam-claim-reference": "vm-a"}},
               "ipam": {"type": "thereabouts", "ipRanges": [{"range": "192.0.2.0/24"}, {"range": "2001:db8::/64"}], "allowPersistentIPs": True}}
    write("config", json.dumps(runtime))

    for a in [args, "IP=192.0.2.7/24,2001:db8::7/64;GATEWAY=192.0.2.1", "K8S_POD_NAME=a;K8S_POD_NAME=b", "IgnoreUnknown=true;X=1", "=;;", "IgnoreUnknown=maybe"]:
        write("cni_args", a)

    entry = {"id": "c1", "podref": "ns/pod", "ifname": "net1"}
    pools.append({"range": "192.0.2.0/24", "network": "blue", "allocations": {"5": entry, "6": dict(entry, id="c2", unreserved=True)}})
    pools.append({"range": "2001:db8::/64", "allocations": {"18446744073709551621": dict(entry, ipamclaimref="ns/vm"), "9": dict(entry, resourceclaimref="uid-1", podref="")}})
    for p in pools:
        text = json.dumps(p).encode()
        write("pool_file", b"\x02" + text)
        write("pool_file", b"\x01" + pool_file(7, text))
        write("etcd_values", text)
    for value in [{"containerid": "c1", "podref": "ns/pod", "ifname": "net1"}, {"containerid": "c1", "podref": "ns/pod", "ifname": "net1", "ipamclaimref": "ns/vm"}, {"containerid": "uid", "resourceclaimref": "uid"}]:
        write("etcd_values", json.dumps(value))

    meta = {"name": "192.0.2.0-24", "namespace": "kube-system", "resourceVersion": "12", "uid": "u1"}
    k8s.append({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool", "metadata": meta,
                "spec": {"range": "192.0.2.0/24", "allocations": {"9": entry, "10": dict(entry, ipamclaimref="ns/vm"), "x": entry}}})
    k8s.append({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "OverlappingRangeIPReservation",
                "metadata": dict(meta, name="192.0.2.9"), "spec": {"containerid": "c1", "podref": "ns/pod", "ifname": "net1"}})
    k8s.append({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "NodeSlicePool", "metadata": dict(meta, name="blue"),
                "spec": {"range": "198.51.100.0/24", "sliceSize": "/28"},
                "status": {"allocations": [{"nodeName": "node-a", "sliceRange": "198.51.100.0/28"}, {"nodeName": "", "sliceRange": "198.51.100.16/28"}]}})
    k8s.append({"apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim", "metadata": dict(meta, name="vm", namespace="ns"),
                "spec": {"network": "blue", "interface": "net1"}, "status": {"ips": ["192.0.2.10/24"], "ownerPod": {"name": "launcher"}}})
    for o in k8s:
        write("k8s_objects", json.dumps(o))
    write("k8s_objects", json.dumps({"apiVersion": "v1", "kind": "List", "items": k8s}))

    # The planning targets read bytes as a structure (arbitrary): a few seeds
    # of different lengths start them off.
    for n in (16, 64, 256, 1024):
        seed = hashlib.sha256(str(n).encode()).digest() * (n // 32 + 1)
        write("plan", seed[:n])
        write("policy_answer", seed[:n])


if __name__ == "__main__":
    main()
