#!/usr/bin/env bash
# build.sh DEST_DIR: builds the test control plane into DEST_DIR at the
# versions pinned in versions.env, from the committed wrapper modules:
#   etcd                      etcd/go.mod
#   kube-apiserver            this folder's go.mod
#   kubeparts                 this folder's go.mod, package ./cmd/kubeparts: one
#                             binary for the Kubernetes parts tests start beside
#                             kube-apiserver (`kubeparts kube-scheduler ...`,
#                             kube-controller-manager, hollow-kubelet with
#                             eventpipe's CRI)
#   agent-sandbox-controller  agentsandbox/go.mod, with its CRDs copied from the
#                             same module version into DEST_DIR/agent-sandbox-crds
#
# Idempotent and fast: a binary is rebuilt only when it is missing or its stamp
# file (DEST_DIR/.<name>.stamp: version + checksum of its go.mod/go.sum) does
# not match. Builds reuse the Go build cache and need only Go and the module
# proxy. Concurrent callers (several test packages at once) serialize on a lock.
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 DEST_DIR" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$1"
dest="$(cd "$1" && pwd)"
. "$here/versions.env"

export GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0
GO="${GO:-go}"

# stamp NAME VERSION MODDIR [SRCDIR...]: the text that identifies one build:
# the module's go.mod/go.sum and, for a binary built from this repository's
# own sources (kubeparts), those sources.
stamp() {
  local name=$1 version=$2 moddir=$3 sum
  shift 3
  sum=$( { cat "$moddir/go.mod" "$moddir/go.sum"; [ $# -eq 0 ] || find "$@" -name '*.go' ! -name '*_test.go' -type f | LC_ALL=C sort | xargs cat; } | sha256sum | cut -c1-16)
  echo "$name $version mod=$sum $("$GO" env GOOS GOARCH | tr '\n' ' ')"
}

# up_to_date NAME STAMP
up_to_date() {
  [ -x "$dest/$1" ] && [ -f "$dest/.$1.stamp" ] && [ "$(cat "$dest/.$1.stamp")" = "$2" ]
}

# build NAME VERSION MODDIR PKG LDFLAGS [SRCDIR...]
build() {
  local name=$1 version=$2 moddir=$3 pkg=$4 ldflags=$5 want start pid rc=0
  shift 5
  want=$(stamp "$name" "$version" "$moddir" "$@")
  if up_to_date "$name" "$want"; then
    echo "build.sh: $name $version up to date in $dest"
    return
  fi
  echo "build.sh: building $name $version into $dest (cold: minutes; a line a minute until done)"
  start=$(date +%s)
  (cd "$moddir" && exec "$GO" build -trimpath -ldflags "$ldflags" -o "$dest/.$name.tmp" "$pkg") &
  pid=$!
  while ! wait_for "$pid" 60; do
    echo "build.sh: still building $name ($(( $(date +%s) - start ))s, load $(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo ?))"
  done
  wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "build.sh: building $name failed (exit $rc)" >&2
    return "$rc"
  fi
  mv -f "$dest/.$name.tmp" "$dest/$name"
  echo "$want" > "$dest/.$name.stamp"
  echo "build.sh: built $name in $(( $(date +%s) - start ))s"
}

# wait_for PID SECONDS: true once PID has ended, false after SECONDS.
wait_for() {
  local i
  for (( i = 0; i < $2; i++ )); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 1
  done
  ! kill -0 "$1" 2>/dev/null
}

# crds MODDIR MODULE SUBDIR OUT: copies the CRD YAML files a module version
# ships under SUBDIR into DEST_DIR/OUT, so the CRDs installed are those of
# the controller built from the same module version.
crds() {
  local dir
  dir=$(cd "$1" && "$GO" mod download "$2" && "$GO" list -m -f '{{.Dir}}' "$2")
  [ -d "$dir/$3" ] || { echo "build.sh: $2 has no $3" >&2; exit 1; }
  rm -rf "$dest/.$4.tmp"
  mkdir -p "$dest/.$4.tmp"
  cp "$dir/$3"/*.yaml "$dest/.$4.tmp/"
  chmod u+w "$dest/.$4.tmp"/*.yaml
  rm -rf "$dest/$4"
  mv "$dest/.$4.tmp" "$dest/$4"
}

main() {
  # etcd first: it is quick, and a test run needs both anyway.
  build etcd "$ETCD_VERSION" "$here/etcd" go.etcd.io/etcd/server/v3 "-s -w"

  local minor=${KUBE_VERSION#v1.}
  minor=${minor%%.*}
  local kflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kflags+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    kflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  build kube-apiserver "$KUBE_VERSION" "$here" k8s.io/kubernetes/cmd/kube-apiserver "$kflags"
  # kubeparts: kube-scheduler, kube-controller-manager and the hollow kubelet
  # with eventpipe's CRI (cmd/kubeparts, cri): one binary, one link (linking
  # is most of a warm build).
  build kubeparts "$KUBE_VERSION" "$here" ./cmd/kubeparts "$kflags" "$here/cmd/kubeparts" "$here/cri"

  local aflags="-s -w"
  for v in gitVersion=$AGENT_SANDBOX_VERSION gitSHA=none buildDate=1970-01-01T00:00:00Z; do
    aflags+=" -X sigs.k8s.io/agent-sandbox/internal/version.$v"
  done
  build agent-sandbox-controller "$AGENT_SANDBOX_VERSION" "$here/agentsandbox" \
    sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller "$aflags"
  crds "$here/agentsandbox" sigs.k8s.io/agent-sandbox k8s/crds agent-sandbox-crds
}

if command -v flock >/dev/null 2>&1; then
  exec 9>"$dest/.build.lock"
  flock 9
fi
main
echo "build.sh: done in ${SECONDS}s"
