#!/usr/bin/env python3
"""thereabouts' container image: one layer, no base image, written as an OCI
image layout by the standard library alone (no daemon, no storage, no root).

The file tree is defined once, in tree() below, and used three ways:
  build OUT NAME   the OCI layout under OUT, the image named NAME (registry/repo:tag)
  stage DIR        the same tree as files under DIR, the context of the Containerfile
  list             the tree, one line per entry (path, kind, mode, size or target)
and, for the real-node tests' own images, small OUT NAME SPEC... (small_image()).

Reproducible: the entries are written in TREE's order with owner 0:0, the mode
TREE gives and mtime SOURCE_DATE_EPOCH; the layer is gzipped with mtime 0 and
no file name; every JSON document has sorted keys. The same inputs give the
same digest, byte for byte, whatever the umask, the checkout's modes or the
time of day.

Inputs come from the environment: PLUGIN, COMPILER, INSTALLER (the files to
ship), BUSYBOX (Debian's busybox-static), BUSYBOX_COPYRIGHT and
BUSYBOX_VERSION (its licence and the source package it was built from),
SOURCE_DATE_EPOCH, ARCH (an OCI architecture, default amd64).

Several architectures (build only): ARCHES="amd64 arm64", and for each the
architecture's files as PLUGIN_<arch>, COMPILER_<arch>, BUSYBOX_<arch> and
BUSYBOX_COPYRIGHT_<arch> (unsuffixed names are the fallback). NAME then
names an image index of one manifest per architecture, as registries serve
multi-architecture images; with one architecture, NAME names the manifest.
"""
import datetime
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

# The shell and the tools deploy/install-cni.sh runs (busybox applets), plus
# ls and env for whoever debugs a node with `kubectl exec`.
APPLETS = sorted(
    "sh cat cp mv rm chmod cmp mkdir dirname basename grep tr base64 date sleep sha256sum kill printf ls env".split()
)
PLUGIN_DIR = "opt/thereabouts"
ENTRYPOINT = "/opt/thereabouts/install-cni.sh"


def source_offer(version):
    return (
        "/bin/busybox is Debian's busybox-static, version {v}, unmodified; it is\n"
        "licensed under the GNU GPL version 2 (see /usr/share/doc/busybox/copyright).\n"
        "Its complete corresponding source is Debian's source package busybox {v},\n"
        "from https://snapshot.debian.org/package/busybox/ or `apt-get source busybox={v}`\n"
        "on Debian 12. On request, the thereabouts maintainers will provide the same\n"
        "source for at least three years after this image was published.\n"
    ).format(v=version).encode()


def tree(env):
    """Every entry of the image: (path, kind, mode, content or link target)."""
    read = lambda key: open(env[key], "rb").read()
    entries = [("bin", "dir", 0o755, None), ("bin/busybox", "file", 0o755, read("BUSYBOX"))]
    entries += [("bin/" + applet, "link", 0o777, "busybox") for applet in APPLETS]
    entries += [
        ("opt", "dir", 0o755, None),
        (PLUGIN_DIR, "dir", 0o755, None),
        (PLUGIN_DIR + "/install-cni.sh", "file", 0o755, read("INSTALLER")),
        (PLUGIN_DIR + "/thereabouts", "file", 0o755, read("PLUGIN")),
        (PLUGIN_DIR + "/thereabouts-policy-compiler", "file", 0o755, read("COMPILER")),
        ("tmp", "dir", 0o1777, None),
        ("usr", "dir", 0o755, None),
        ("usr/share", "dir", 0o755, None),
        ("usr/share/doc", "dir", 0o755, None),
        ("usr/share/doc/busybox", "dir", 0o755, None),
        ("usr/share/doc/busybox/SOURCE-OFFER", "file", 0o644, source_offer(env["BUSYBOX_VERSION"])),
        ("usr/share/doc/busybox/copyright", "file", 0o644, read("BUSYBOX_COPYRIGHT")),
    ]
    return entries


def layer_tar(entries, mtime):
    raw = io.BytesIO()
    # USTAR: no PAX headers, so no atime or ctime can slip in.
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for path, kind, mode, content in entries:
            info = tarfile.TarInfo(path)
            info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = mode, mtime, 0, 0, "", ""
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return raw.getvalue()


def canonical(document):
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def put_blob(out, data):
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(out, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def for_arch(env, arch):
    """env with ARCH set and the architecture's own files (NAME_<arch>) as NAME."""
    own = dict(env, ARCH=arch)
    for key in ("PLUGIN", "COMPILER", "BUSYBOX", "BUSYBOX_COPYRIGHT"):
        if key + "_" + arch in env:
            own[key] = env[key + "_" + arch]
    return own


def image_manifest(out, env, tag):
    """Writes one architecture's layer, config and manifest; returns the manifest's descriptor."""
    labels = {
        "org.opencontainers.image.title": "thereabouts",
        "org.opencontainers.image.description": "thereabouts CNI IPAM plugin, its policy compiler and its node installer",
        "org.opencontainers.image.version": tag,
        "org.opencontainers.image.source": "https://github.com/thereabouts/thereabouts",
    }
    return write_manifest(out, tree(env), env.get("ARCH", "amd64"), int(env.get("SOURCE_DATE_EPOCH", "0")), labels, [ENTRYPOINT])


def write_manifest(out, entries, arch, epoch, labels, cmd):
    """One image of `entries` (tree()'s shape) as layer, config and manifest
    blobs under out; returns the manifest's descriptor."""
    layer = layer_tar(entries, epoch)
    compressed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0, compresslevel=9) as gz:
        gz.write(layer)
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = dict(labels, **{"org.opencontainers.image.created": created})
    config = {
        "created": created,
        "architecture": arch,
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": cmd, "WorkingDir": "/", "Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created": created, "created_by": "scripts/oci-image.py"}],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **put_blob(out, canonical(config))},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **put_blob(out, compressed.getvalue())}],
        "annotations": labels,
    }
    return {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **put_blob(out, canonical(manifest)),
        "platform": {"architecture": arch, "os": "linux"},
    }


def write_layout(out, name, described):
    """index.json naming `described` by the tag (skopeo's and umoci's oci:
    references) and by the full name (containerd's import, which otherwise
    names it import-DATE), and oci-layout."""
    tag = name.rsplit(":", 1)[1]
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{**described, "annotations": {"org.opencontainers.image.ref.name": tag, "io.containerd.image.name": name}}],
    }
    with open(os.path.join(out, "index.json"), "wb") as f:
        f.write(canonical(index))
    with open(os.path.join(out, "oci-layout"), "wb") as f:
        f.write(canonical({"imageLayoutVersion": "1.0.0"}))


def small_image(out, name, specs):
    """A test image (tests/node.sh's pause and shell images): each spec is
    DEST=SRC (a file, 0755), DEST@TARGET (a symbolic link) or CMD:ARG,ARG (the
    command); directories are made for every parent."""
    entries, cmd, dirs = [], [], set()
    for spec in specs:
        if spec.startswith("CMD:"):
            cmd = spec[4:].split(",")
            continue
        dest = spec.split("=", 1)[0].split("@", 1)[0]
        parts = dest.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in dirs:
                dirs.add(d)
                entries.append((d, "dir", 0o755, None))
        if "=" in spec:
            entries.append((dest, "file", 0o755, open(spec.split("=", 1)[1], "rb").read()))
        else:
            entries.append((dest, "link", 0o777, spec.split("@", 1)[1]))
    os.makedirs(os.path.join(out, "blobs", "sha256"), exist_ok=True)
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    write_layout(out, name, write_manifest(out, entries, arch, 0, {}, cmd))


def build(out, name, env):
    tag = name.rsplit(":", 1)[1]
    os.makedirs(os.path.join(out, "blobs", "sha256"), exist_ok=True)
    arches = env.get("ARCHES", env.get("ARCH", "amd64")).split()
    manifests = [image_manifest(out, for_arch(env, arch), tag) for arch in arches]
    if len(manifests) == 1:
        described = manifests[0]
    else:
        # A nested index: the layout's index.json names one entry (the tag),
        # which is the multi-architecture index a registry serves under it.
        nested = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests}
        described = {"mediaType": "application/vnd.oci.image.index.v1+json", **put_blob(out, canonical(nested))}
    write_layout(out, name, described)
    print(described["digest"])


def stage(out, env):
    for path, kind, mode, content in tree(env):
        target = os.path.join(out, path)
        if kind == "dir":
            os.makedirs(target, exist_ok=True)
        elif kind == "link":
            os.symlink(content, target)
            continue
        else:
            with open(target, "wb") as f:
                f.write(content)
        os.chmod(target, mode)


def listing(env):
    for path, kind, mode, content in tree(env):
        detail = content if kind == "link" else (len(content) if kind == "file" else "")
        print("{} {} {:o} {}".format(path, kind, mode, detail).rstrip())


def main(argv):
    env = dict(os.environ)
    if len(argv) == 4 and argv[1] == "build":
        build(argv[2], argv[3], env)
    elif len(argv) == 3 and argv[1] == "stage":
        stage(argv[2], env)
    elif len(argv) == 2 and argv[1] == "list":
        listing(env)
    elif len(argv) >= 4 and argv[1] == "small":
        small_image(argv[2], argv[3], argv[4:])
    else:
        sys.exit("usage: oci-image.py build OUT NAME | stage DIR | list | small OUT NAME SPEC...")


if __name__ == "__main__":
    main(sys.argv)
