# shellcheck shell=bash
# Sourced by scripts/setup-rust.sh: the Debian packages building the plugin needs,
# installed quietly when this machine lacks them:
# - a C toolchain (wasmtime's bits of C);
# - protoc and protobuf's well-known .proto files (etcd-client's build script
#   compiles etcd's gRPC API for the etcd datastore; protoc alone fails with
#   "google/protobuf/descriptor.proto: File not found");
# - musl-gcc, which compiles the C parts (ring's) of the static musl build that
#   ships (scripts/build-plugin.sh).
build_deps_missing=()
command -v cc >/dev/null 2>&1 || build_deps_missing+=(build-essential)
command -v protoc >/dev/null 2>&1 || build_deps_missing+=(protobuf-compiler)
[[ -f /usr/include/google/protobuf/descriptor.proto ]] || build_deps_missing+=(libprotobuf-dev)
command -v musl-gcc >/dev/null 2>&1 || build_deps_missing+=(musl-tools)
if ((${#build_deps_missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${build_deps_missing[@]}" >/dev/null
fi
unset build_deps_missing
