#!/usr/bin/env bash
# Builds thereabouts' container image without a daemon: target/image/oci, an OCI
# image layout holding ghcr.io/thereabouts/thereabouts:<version> (the workspace
# version), and target/image/context/, the same tree as the Containerfile's
# build context. Prints the manifest digest.
#
# The image holds the static plugin, the policy compiler, the node installer
# and Debian's busybox-static (the installer's shell and tools, with its
# licence and source offer); the tree is defined in scripts/oci-image.py.
# Reproducible: SOURCE_DATE_EPOCH defaults to the last commit's time, and the
# same sources give the same digest.
#
# Environment: IMAGE_REPOSITORY [ghcr.io/thereabouts/thereabouts],
# IMAGE_DIR [target/image], SKIP_PLUGIN_BUILD=1 to ship target/plugin as it is,
# IMAGE_PLATFORMS: the architectures, e.g. "amd64 arm64" [this machine's]. With
# more than one the tag names a multi-architecture image index; the other
# architecture's binaries are cross-built (scripts/build-plugin.sh, PLUGIN_ARCH)
# and its busybox is Debian's busybox-static of that architecture, of the same
# source version (fetched once into ~/.cache/thereabouts/busybox/).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x /bin/busybox ]] || ! dpkg-query -W busybox-static >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq busybox-static >/dev/null
fi
case "$(uname -m)" in
  x86_64) native=amd64 ;;
  aarch64) native=arm64 ;;
  *) echo "build-image.sh: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac
platforms=${IMAGE_PLATFORMS:-$native}
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
export ARCH=$native ARCHES=$platforms
export PLUGIN="$target_dir/plugin/thereabouts" COMPILER="$target_dir/plugin/thereabouts-policy-compiler"
export INSTALLER=deploy/install-cni.sh BUSYBOX=/bin/busybox
export BUSYBOX_COPYRIGHT=/usr/share/doc/busybox-static/copyright
BUSYBOX_VERSION=$(dpkg-query -W -f='${source:Version}' busybox-static)
export BUSYBOX_VERSION

# foreign_busybox ARCH: the directory of Debian's busybox-static for ARCH, the
# same source version as this machine's (dpkg-deb -x of the package).
foreign_busybox() {
  local arch=$1 cache dir deb
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/busybox"
  dir="$cache/${BUSYBOX_VERSION//:/_}_$arch"
  if [[ ! -x "$dir/bin/busybox" ]]; then
    if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
      dpkg --add-architecture "$arch"
    fi
    apt-get update -qq >/dev/null
    mkdir -p "$cache"
    local work
    work=$(mktemp -d "$cache/.fetch.XXXXXX")
    (cd "$work" && apt-get download -qq -o APT::Sandbox::User=root "busybox-static:$arch" >/dev/null)
    deb=$(echo "$work"/busybox-static_*_"$arch".deb)
    local source
    source=$(dpkg-deb -f "$deb" Source | sed -n 's/.*(\(.*\)).*/\1/p')
    if [[ "$source" != "$BUSYBOX_VERSION" ]]; then
      echo "build-image.sh: busybox-static:$arch comes from busybox $source, this machine's from $BUSYBOX_VERSION" >&2
      exit 1
    fi
    dpkg-deb -x "$deb" "$work/root"
    rm -rf "$dir"
    mv "$work/root" "$dir"
    rm -rf "$work"
  fi
  echo "$dir"
}

for arch in $platforms; do
  if [[ "$arch" == "$native" ]]; then
    [[ "${SKIP_PLUGIN_BUILD:-}" == 1 ]] || bash scripts/build-plugin.sh -q >/dev/null
    continue
  fi
  [[ "${SKIP_PLUGIN_BUILD:-}" == 1 ]] || PLUGIN_ARCH=$arch bash scripts/build-plugin.sh -q >/dev/null
  export "PLUGIN_$arch=$target_dir/plugin-$arch/thereabouts" "COMPILER_$arch=$target_dir/plugin-$arch/thereabouts-policy-compiler"
  root=$(foreign_busybox "$arch")
  export "BUSYBOX_$arch=$root/bin/busybox" "BUSYBOX_COPYRIGHT_$arch=$root/usr/share/doc/busybox-static/copyright"
done

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
name="${IMAGE_REPOSITORY:-ghcr.io/thereabouts/thereabouts}:$version"
dir="${IMAGE_DIR:-target/image}"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"

rm -rf "$dir/oci" "$dir/context"
mkdir -p "$dir/oci" "$dir/context/rootfs"
python3 scripts/oci-image.py stage "$dir/context/rootfs"
cp deploy/image/Containerfile "$dir/context/Containerfile"
python3 scripts/oci-image.py build "$dir/oci" "$name"
