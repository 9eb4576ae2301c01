# shellcheck shell=bash
# Sourced by the build scripts here: a directory of built binaries in the cache,
# built once per version key, by one builder at a time, published atomically.
#
#   cache_begin ROOT KEY HAVE   sets `out` to ROOT/KEY; when the command HAVE
#                               succeeds there (already built), prints it and exits
#                               0; otherwise takes the key's lock (parallel runs on
#                               one machine), checks again, and makes `stage`, a
#                               temporary directory to build into (removed on exit)
#   cache_publish               moves `stage` to `out` (a half-built directory is
#                               never seen as a cache hit) and prints `out`

cache_begin() {
  local root=$1 key=$2 have=$3
  out="$root/$key"
  if "$have"; then
    echo "$out"
    exit 0
  fi
  mkdir -p "$root"
  exec 9>"$root/.$key.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  if "$have"; then
    echo "$out"
    exit 0
  fi
  stage=$(mktemp -d "$root/.$key.XXXXXX")
  trap 'rm -rf "$stage"' EXIT
}

cache_publish() {
  chmod 755 "$stage"
  rm -rf "$out"
  mv "$stage" "$out"
  trap - EXIT
  echo "$out"
}
