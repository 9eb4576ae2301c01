#!/bin/sh
# install-cni.sh: the installer run by thereabouts' DaemonSet on every node.
#
# 1. Copies the thereabouts plugin into the node's CNI bin dir (and, when asked,
#    under the name `whereabouts` as well, to replace whereabouts in place).
# 2. Writes the flat file thereabouts.d/thereabouts.conf into the node's CNI conf
#    dir: it selects the Kubernetes datastore and names the kubeconfig below, so
#    a network's `ipam` section needs nothing but its ranges.
# 3. Writes thereabouts.d/thereabouts.kubeconfig from this pod's ServiceAccount:
#    token, cluster CA, KUBERNETES_SERVICE_HOST/PORT, and the namespace that
#    holds the IPPools (the context namespace is where the plugin keeps them).
# 4. Policies (optional, docs/policies.md): each POLICY_DIR/*.wasm (from the
#    ConfigMap `thereabouts-policies`, or the image) is precompiled with the
#    policy compiler shipped beside the plugin into the host's policy cache
#    (/var/lib/thereabouts/policies, root-owned: the plugin loads nothing else),
#    then installed as thereabouts.d/policies/NAME.wasm in the CNI conf dir: a
#    network config's policy `path` names /etc/cni/net.d/thereabouts.d/policies/NAME.wasm.
#    Compiled first, so the file a config names always has its artifact; and
#    before the plugin, so a new plugin (another compatibility key) finds its
#    artifacts in place. Artifacts are named by the .wasm's SHA-256 and the
#    plugin's key: one that exists is not compiled again. Without POLICY_DIR
#    or *.wasm in it, this step does nothing.
# 5. Unless --once: checks again every RESYNC_SECONDS and rewrites whatever
#    changed (the kubelet rotates the projected token; a file removed on the
#    host comes back; a changed policy is compiled), until SIGTERM/SIGINT.
#
# Every write goes to a temporary file in the destination directory, then is
# renamed over the target, so the plugin (which may run at any moment) sees the
# old file or the new one, never a partial one; a running plugin keeps executing
# the old binary. Files whose content is already right are not touched.
#
# Usage: install-cni.sh [--once]
#
# Environment (the defaults are the DaemonSet's mounts; tests override them):
#   THEREABOUTS_BINARY       plugin to install          [/opt/thereabouts/thereabouts]
#   CNI_BIN_DIR              host CNI bin dir, as mounted here      [/host/opt/cni/bin]
#   CNI_CONF_DIR             host CNI conf dir, as mounted here   [/host/etc/cni/net.d]
#   HOST_CNI_CONF_DIR        the same dir as the plugin sees it on the host
#                            (written into the flat file)             [/etc/cni/net.d]
#   SERVICE_ACCOUNT_DIR      token, ca.crt, namespace
#                            [/var/run/secrets/kubernetes.io/serviceaccount]
#   THEREABOUTS_NAMESPACE    namespace of the pools [SERVICE_ACCOUNT_DIR/namespace,
#                            else kube-system]
#   KUBERNETES_SERVICE_HOST  apiserver address (required; an IPv6 address gets
#                            brackets); set by the kubelet in every pod
#   KUBERNETES_SERVICE_PORT  apiserver port                                   [443]
#   INSTALL_AS_WHEREABOUTS   true: also install the binary as `whereabouts` and
#                            write the same flat file as whereabouts.d/whereabouts.conf
#                            (searched before thereabouts.d, see deploy/README.md)
#                                                                        [false]
#   RESYNC_SECONDS           seconds between checks in the loop            [30]
#   POLICY_DIR               policies to install (*.wasm)  [/opt/thereabouts/policies]
#   POLICY_COMPILER          the policy compiler, beside the plugin in the image
#                            [/opt/thereabouts/thereabouts-policy-compiler]
#   POLICY_CACHE_DIR         the host's policy cache, as mounted here (the plugin's
#                            /var/lib/thereabouts/policies; must belong to root)
#                                             [/host/var/lib/thereabouts/policies]
#   NODENAME                 the Node's name (the DaemonSet passes spec.nodeName), written
#                            to thereabouts.d/nodename, where the plugin looks for it
#                            (node slices) when the runtime passes no NODENAME     []
#   FLAT_FILE                the flat file's content, a JSON object (the chart
#                            renders it from its flatFile values). Checked by the
#                            plugin (`thereabouts preview`) before it is written;
#                            refused, nothing is installed. Empty: the Kubernetes
#                            datastore with the kubeconfig of step 3          []
#   ETCD_TLS_DIR             etcd client certificates (ca.crt, tls.crt, tls.key,
#                            those present) to copy, 0600, into
#                            CNI_CONF_DIR/thereabouts.d/etcd/ for FLAT_FILE to name []
#
# Exit status: 0 after --once or on SIGTERM/SIGINT; 1 on a usage or install
# error (in the loop, a failed check is logged and retried instead).

set -eu

THEREABOUTS_BINARY=${THEREABOUTS_BINARY:-/opt/thereabouts/thereabouts}
CNI_BIN_DIR=${CNI_BIN_DIR:-/host/opt/cni/bin}
CNI_CONF_DIR=${CNI_CONF_DIR:-/host/etc/cni/net.d}
HOST_CNI_CONF_DIR=${HOST_CNI_CONF_DIR:-/etc/cni/net.d}
SERVICE_ACCOUNT_DIR=${SERVICE_ACCOUNT_DIR:-/var/run/secrets/kubernetes.io/serviceaccount}
THEREABOUTS_NAMESPACE=${THEREABOUTS_NAMESPACE:-}
KUBERNETES_SERVICE_HOST=${KUBERNETES_SERVICE_HOST:-}
KUBERNETES_SERVICE_PORT=${KUBERNETES_SERVICE_PORT:-443}
INSTALL_AS_WHEREABOUTS=${INSTALL_AS_WHEREABOUTS:-false}
RESYNC_SECONDS=${RESYNC_SECONDS:-30}
POLICY_DIR=${POLICY_DIR:-/opt/thereabouts/policies}
POLICY_COMPILER=${POLICY_COMPILER:-/opt/thereabouts/thereabouts-policy-compiler}
POLICY_CACHE_DIR=${POLICY_CACHE_DIR:-/host/var/lib/thereabouts/policies}
FLAT_FILE=${FLAT_FILE:-}
NODENAME=${NODENAME:-}
ETCD_TLS_DIR=${ETCD_TLS_DIR:-}

# Temporary file being written, removed if we stop half-way.
pending=

log() {
  printf '%s install-cni: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2
}

die() {
  log "error: $*"
  exit 1
}

cleanup() {
  if [ -n "$pending" ]; then
    rm -f "$pending"
    pending=
  fi
}

usage() {
  echo "usage: $0 [--once]" >&2
  exit 1
}

# is_true NAME VALUE: 0 for true/yes/1, 1 for false/no/0/empty, dies otherwise.
is_true() {
  case $2 in
    true | True | TRUE | yes | 1) return 0 ;;
    false | False | FALSE | no | 0 | '') return 1 ;;
    *) die "$1 must be true or false, not '$2'" ;;
  esac
}

# tmp_for DEST: a temporary name next to DEST (same file system, so mv is a rename).
tmp_for() {
  printf '%s/.%s.tmp.%s' "$(dirname "$1")" "$(basename "$1")" "$$"
}

# commit TMP DEST MODE: gives TMP the MODE, then renames it over DEST, unless DEST
# already has that content (then TMP is dropped and only DEST's mode is fixed).
# Logs what it replaced.
commit() {
  chmod "$3" "$1" || die "chmod $3 $1 failed"
  if [ -f "$2" ] && cmp -s "$1" "$2"; then
    rm -f "$1"
    pending=
    chmod "$3" "$2" || die "chmod $3 $2 failed"
    return 0
  fi
  mv -f "$1" "$2" || die "could not rename $1 to $2"
  pending=
  log "wrote $2"
}

# write_file DEST MODE: DEST gets stdin's content, atomically. The temporary file
# is created with umask 077, so a secret is never readable by others, not even
# for a moment.
write_file() {
  pending=$(tmp_for "$1")
  rm -f "$pending"
  (umask 077 && cat >"$pending") || die "could not write $pending"
  commit "$pending" "$1" "$2"
}

# install_binary NAME: CNI_BIN_DIR/NAME becomes a copy of THEREABOUTS_BINARY.
install_binary() {
  dest=$CNI_BIN_DIR/$1
  if [ -f "$dest" ] && cmp -s "$THEREABOUTS_BINARY" "$dest"; then
    chmod 0755 "$dest" || die "chmod 0755 $dest failed"
    return 0
  fi
  pending=$(tmp_for "$dest")
  rm -f "$pending"
  cp "$THEREABOUTS_BINARY" "$pending" || die "could not copy $THEREABOUTS_BINARY to $pending"
  commit "$pending" "$dest" 0755
}

# The apiserver URL. The host is checked so that it cannot break the YAML.
server_url() {
  host=$KUBERNETES_SERVICE_HOST
  port=$KUBERNETES_SERVICE_PORT
  [ -n "$host" ] || die "KUBERNETES_SERVICE_HOST is not set"
  case $host in
    \[*\]) # already bracketed
      bare=${host#?}
      bare=${bare%?}
      ;;
    *) bare=$host ;;
  esac
  case $bare in
    '' | *[!0-9A-Za-z.:-]*) die "KUBERNETES_SERVICE_HOST '$host' is not a host name or address" ;;
  esac
  case $port in
    '' | *[!0-9]*) die "KUBERNETES_SERVICE_PORT '$port' is not a port number" ;;
  esac
  case $bare in
    *:*) host="[$bare]" ;; # IPv6 address: brackets separate it from the port
    *) host=$bare ;;
  esac
  printf 'https://%s:%s' "$host" "$port"
}

namespace() {
  ns=$THEREABOUTS_NAMESPACE
  if [ -z "$ns" ] && [ -r "$SERVICE_ACCOUNT_DIR/namespace" ]; then
    ns=$(cat "$SERVICE_ACCOUNT_DIR/namespace") || die "could not read $SERVICE_ACCOUNT_DIR/namespace"
  fi
  ns=${ns:-kube-system}
  case $ns in
    *[!a-z0-9-]* | -* | *-) die "namespace '$ns' is not a valid namespace name" ;;
  esac
  printf '%s' "$ns"
}

# The token as a single line of token characters (JWTs and legacy tokens are
# base64url with dots); anything else is refused rather than quoted.
token() {
  [ -r "$SERVICE_ACCOUNT_DIR/token" ] || die "no ServiceAccount token at $SERVICE_ACCOUNT_DIR/token"
  t=$(cat "$SERVICE_ACCOUNT_DIR/token") || die "could not read $SERVICE_ACCOUNT_DIR/token"
  case $t in
    '') die "the ServiceAccount token at $SERVICE_ACCOUNT_DIR/token is empty" ;;
    *[!A-Za-z0-9._~+/=-]*) die "the ServiceAccount token at $SERVICE_ACCOUNT_DIR/token contains unexpected characters" ;;
  esac
  printf '%s' "$t"
}

ca_data() {
  ca=$SERVICE_ACCOUNT_DIR/ca.crt
  [ -r "$ca" ] || die "no cluster CA at $ca"
  grep -q -- '-----BEGIN CERTIFICATE-----' "$ca" || die "$ca holds no PEM certificate"
  data=$(base64 <"$ca" | tr -d '\n') || die "could not encode $ca"
  printf '%s' "$data"
}

write_kubeconfig() {
  # Computed first, so that an error leaves the current kubeconfig as it is.
  server=$(server_url) || exit 1
  ns=$(namespace) || exit 1
  tok=$(token) || exit 1
  ca=$(ca_data) || exit 1
  write_file "$CNI_CONF_DIR/thereabouts.d/thereabouts.kubeconfig" 0600 <<EOF
# Written by thereabouts' install-cni.sh (DaemonSet) from its ServiceAccount
# token; rewritten when the token rotates. Do not edit: changes are overwritten.
apiVersion: v1
kind: Config
clusters:
  - name: thereabouts
    cluster:
      server: "$server"
      certificate-authority-data: "$ca"
users:
  - name: thereabouts
    user:
      token: "$tok"
contexts:
  - name: thereabouts
    context:
      cluster: thereabouts
      user: thereabouts
      namespace: "$ns"
current-context: thereabouts
EOF
}

# write_flat_file DEST: the flat file (same keys as a network's `ipam` section):
# FLAT_FILE, or by default the Kubernetes datastore with step 3's kubeconfig.
write_flat_file() {
  if [ -n "$FLAT_FILE" ]; then
    printf '%s\n' "$FLAT_FILE" | write_file "$1" 0644
    return 0
  fi
  write_file "$1" 0644 <<EOF
{
  "datastore": "kubernetes",
  "configuration_path": "$HOST_CNI_CONF_DIR/thereabouts.d",
  "kubernetes": {
    "kubeconfig": "$HOST_CNI_CONF_DIR/thereabouts.d/thereabouts.kubeconfig"
  }
}
EOF
}

# check_flat_file: the plugin reads FLAT_FILE as it would on a CNI call (a
# network of one range naming it as configuration_path) and must accept it: a
# wrong type, an unknown datastore or a relative path is refused here, with the
# plugin's message, instead of failing every pod's ADD later. The two files go to
# the conf dir (the container's root is read-only) and are removed.
check_flat_file() {
  [ -n "$FLAT_FILE" ] || return 0
  case $FLAT_FILE in
    '{'*'}') ;;
    *) die "FLAT_FILE is not a JSON object: '$FLAT_FILE'" ;;
  esac
  [ -x "$THEREABOUTS_BINARY" ] || die "plugin binary $THEREABOUTS_BINARY not found (it checks FLAT_FILE)"
  check=$CNI_CONF_DIR/.thereabouts-flat-file-check.$$
  printf '%s\n' "$FLAT_FILE" >"$check.json" || die "could not write $check.json"
  printf '{"cniVersion":"1.0.0","name":"flat-file-check","type":"thereabouts","ipam":{"type":"thereabouts","range":"192.0.2.0/30","configuration_path":"%s.json"}}\n' "$check" >"$check.conf" ||
    die "could not write $check.conf"
  if verdict=$("$THEREABOUTS_BINARY" preview --config "$check.conf" 2>&1 >/dev/null); then status=0; else status=$?; fi
  rm -f "$check.json" "$check.conf"
  [ $status -eq 0 ] || die "the plugin refuses FLAT_FILE: ${verdict#*"$check.conf": }"
}

# install_etcd_tls: ETCD_TLS_DIR's certificates copied into thereabouts.d/etcd/.
install_etcd_tls() {
  [ -n "$ETCD_TLS_DIR" ] || return 0
  [ -d "$ETCD_TLS_DIR" ] || die "ETCD_TLS_DIR $ETCD_TLS_DIR is not a directory (is the Secret mounted?)"
  make_dir "$CNI_CONF_DIR/thereabouts.d/etcd"
  chmod 0700 "$CNI_CONF_DIR/thereabouts.d/etcd" || die "chmod 0700 $CNI_CONF_DIR/thereabouts.d/etcd failed"
  for f in ca.crt tls.crt tls.key; do
    [ -f "$ETCD_TLS_DIR/$f" ] || continue
    write_file "$CNI_CONF_DIR/thereabouts.d/etcd/$f" 0600 <"$ETCD_TLS_DIR/$f"
  done
}

# write_nodename: thereabouts.d/nodename from NODENAME (node slices key a node's
# slices by its Node name, which the host name need not be).
write_nodename() {
  [ -n "$NODENAME" ] || return 0
  case $NODENAME in
    *[!a-z0-9.-]* | [.-]* | *[.-]) die "NODENAME '$NODENAME' is not a Node name" ;;
  esac
  printf '%s\n' "$NODENAME" | write_file "$CNI_CONF_DIR/thereabouts.d/nodename" 0644
}

# make_dir DIR: DIR (and its parents) created if absent, mode 0755.
make_dir() {
  (umask 022 && mkdir -p "$1") || die "could not create $1"
  chmod 0755 "$1" || die "chmod 0755 $1 failed"
}

# sha256_of FILE: the hex SHA-256 of FILE's content (what artifacts are named by).
sha256_of() {
  sum=$(sha256sum <"$1") || die "could not hash $1"
  sum=${sum%% *}
  case $sum in
    *[!0-9a-f]*) die "sha256sum gave '$sum' for $1" ;;
  esac
  [ ${#sum} -eq 64 ] || die "sha256sum gave '$sum' for $1"
  printf '%s' "$sum"
}

# install_policy SRC KEY: SRC compiled into POLICY_CACHE_DIR (unless its
# artifact, SHA-256-KEY.cwasm, is there already), then installed as
# thereabouts.d/policies/NAME.wasm. The copy is what gets compiled and renamed
# into place, so the installed bytes are the compiled ones even if SRC changes
# meanwhile (a ConfigMap update).
install_policy() {
  name=$(basename "$1")
  case $name in
    .* | *[!A-Za-z0-9._-]*) die "policy file name '$name' in $POLICY_DIR: only letters, digits, '.', '_' and '-', not leading '.'" ;;
  esac
  dest=$CNI_CONF_DIR/thereabouts.d/policies/$name
  if [ -f "$dest" ] && cmp -s "$1" "$dest"; then
    artifact=$POLICY_CACHE_DIR/$(sha256_of "$dest")-$2.cwasm
    if [ -f "$artifact" ]; then
      chmod 0644 "$dest" "$artifact" || die "chmod 0644 $dest $artifact failed"
      return 0
    fi
  fi
  pending=$(tmp_for "$dest")
  rm -f "$pending"
  cp "$1" "$pending" || die "could not copy $1 to $pending"
  artifact=$POLICY_CACHE_DIR/$(sha256_of "$pending")-$2.cwasm
  if [ -f "$artifact" ]; then
    chmod 0644 "$artifact" || die "chmod 0644 $artifact failed"
  else
    # The compiler checks the component, writes the artifact (0644) to a
    # temporary file in the cache and renames it; it prints the artifact's path.
    out=$("$POLICY_COMPILER" compile "$pending" --cache "$POLICY_CACHE_DIR") || die "$POLICY_COMPILER could not compile $1 (above); nothing of it installed"
    [ "$(basename "$out")" = "$(basename "$artifact")" ] || die "$POLICY_COMPILER wrote '$out', not $artifact: is it the plugin's compiler?"
    log "compiled $1 into $artifact"
  fi
  commit "$pending" "$dest" 0644
}

# install_policies: every POLICY_DIR/*.wasm, compiled and installed (step 4).
install_policies() {
  [ -d "$POLICY_DIR" ] || return 0
  set -- "$POLICY_DIR"/*.wasm
  [ -e "$1" ] || return 0
  [ -x "$POLICY_COMPILER" ] || die "policy compiler $POLICY_COMPILER not found: it ships beside the plugin, and $POLICY_DIR holds policies"
  # The key of the plugin's engine settings: the compiler beside the plugin
  # is built with it, and names artifacts with it.
  key=$("$POLICY_COMPILER" compat-key) || die "$POLICY_COMPILER compat-key failed"
  case $key in
    '' | *[!0-9A-Za-z_-]*) die "$POLICY_COMPILER compat-key gave '$key'" ;;
  esac
  make_dir "$POLICY_CACHE_DIR"
  make_dir "$CNI_CONF_DIR/thereabouts.d/policies"
  for src in "$@"; do
    [ -f "$src" ] || die "$src is not a file"
    install_policy "$src" "$key"
  done
}

install_all() {
  [ -f "$THEREABOUTS_BINARY" ] || die "plugin binary $THEREABOUTS_BINARY not found"
  for d in "$CNI_BIN_DIR" "$CNI_CONF_DIR"; do
    [ -d "$d" ] || die "$d is not a directory (is the host path mounted?)"
  done
  mkdir -p "$CNI_CONF_DIR/thereabouts.d" || die "could not create $CNI_CONF_DIR/thereabouts.d"

  check_flat_file
  install_policies
  install_binary thereabouts
  install_etcd_tls
  write_kubeconfig
  write_nodename
  write_flat_file "$CNI_CONF_DIR/thereabouts.d/thereabouts.conf"
  if is_true INSTALL_AS_WHEREABOUTS "$INSTALL_AS_WHEREABOUTS"; then
    install_binary whereabouts
    mkdir -p "$CNI_CONF_DIR/whereabouts.d" || die "could not create $CNI_CONF_DIR/whereabouts.d"
    write_flat_file "$CNI_CONF_DIR/whereabouts.d/whereabouts.conf"
  fi
}

once=false
case $# in
  0) ;;
  1)
    if [ "$1" = --once ]; then once=true; else usage; fi
    ;;
  *) usage ;;
esac

# Paths end up in JSON and YAML strings: refuse characters that would need escaping.
for v in "$CNI_CONF_DIR" "$HOST_CNI_CONF_DIR" "$CNI_BIN_DIR"; do
  case $v in
    *[\"\\]* | *"
"*) die "path '$v' contains a quote, backslash or newline" ;;
  esac
done
case $RESYNC_SECONDS in
  '' | *[!0-9]* | 0) die "RESYNC_SECONDS must be a positive number of seconds, not '$RESYNC_SECONDS'" ;;
esac
is_true INSTALL_AS_WHEREABOUTS "$INSTALL_AS_WHEREABOUTS" || true

trap cleanup EXIT
install_all
if $once; then
  exit 0
fi

log "installed; checking every ${RESYNC_SECONDS}s for a rotated token"
sleeper=
# `wait` returns as soon as a trapped signal arrives, so the pod stops at once.
trap 'log "stopping"; [ -z "$sleeper" ] || kill "$sleeper" 2>/dev/null; cleanup; exit 0' TERM INT
while :; do
  sleep "$RESYNC_SECONDS" &
  sleeper=$!
  wait "$sleeper" || true
  sleeper=
  # A subshell: a failed check (die) is logged and retried at the next round.
  # (Subshells start without traps: the temp-file cleanup is set again.)
  (trap cleanup EXIT && install_all) || log "check failed; retrying in ${RESYNC_SECONDS}s"
done
