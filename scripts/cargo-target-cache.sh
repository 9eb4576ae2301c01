# shellcheck shell=bash
# Sourced by tests/run-all.sh. A clean clone's cargo builds were most of the
# test command's time (about 30 of 52 minutes on 2 cores): the registry crates
# (wasmtime, Cranelift, kube, tokio, ...) compiled again in every profile. When
# the clone has no target/ yet, target/ becomes a link to a target directory kept
# under ~/.cache/thereabouts/cargo/<toolchain>/, as the Go builds are kept.
#
# Cargo's own fingerprints decide what is stale: registry crates are reused; the
# workspace's crates are always rebuilt in a new clone (their files are newer
# than anything built before). The run holds an exclusive lock on the directory;
# a second run at the same time builds in a private target/ as before.
# THEREABOUTS_CARGO_CACHE=0 turns this off.
cargo_target_cache() {
  [[ "${THEREABOUTS_CARGO_CACHE:-1}" == 1 ]] || return 0
  # A tree that already has its target/ keeps it (a developer's checkout).
  [[ -e target || -L target ]] && return 0
  command -v rustc >/dev/null 2>&1 && command -v flock >/dev/null 2>&1 || return 0
  local root toolchain dir other kib
  root="${XDG_CACHE_HOME:-$HOME/.cache}/thereabouts/cargo"
  # Artifacts of another compiler are never reused; keyed by `rustc -vV`.
  toolchain=$(rustc -vV | sha256sum | cut -c1-16)
  dir="$root/$toolchain"
  mkdir -p "$dir"
  exec {CARGO_TARGET_CACHE_LOCK}>"$dir.lock"
  if ! flock -n "$CARGO_TARGET_CACHE_LOCK"; then
    echo "cargo target cache $dir is in use by another run: building in a private target/" >&2
    return 0
  fi
  # Bounded: other toolchains' directories go, and this one is emptied past 30 GiB
  # (stale versions of crates accumulate as Cargo.lock moves).
  for other in "$root"/*/; do
    other=${other%/}
    [[ "$other" == "$dir" ]] && continue
    if flock -n "$other.lock" true 2>/dev/null; then rm -rf "$other" "$other.lock"; fi
  done
  kib=$(du -sk "$dir" | cut -f1)
  if ((kib > 30 * 1024 * 1024)); then
    echo "cargo target cache $dir holds $((kib / 1024 / 1024)) GiB: emptied" >&2
    find "$dir" -mindepth 1 -delete
  fi
  ln -s "$dir" target
  echo "target/ -> $dir (cargo target cache, $((kib / 1024)) MiB)"
}
cargo_target_cache
