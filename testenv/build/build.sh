#!/usr/bin/env bash
# build.sh DEST_DIR: builds the test control plane into DEST_DIR at the
# versions pinned in versions.env, from the committed wrapper modules:
#   etcd                      etcd/go.mod
#   kube-apiserver            this folder's go.mod
#   kubeparts                 this folder's go.mod, package ./cmd/kubeparts: one
#                             binary for the Kubernetes parts tests start beside
#                             kube-apiserver (`kubeparts kube-scheduler ...`,
#                             kube-controller-manager, hollow-kubelet with
#                             eventpipe's CRI, kubectl; DEST_DIR/kubectl is a
#                             symlink to it)
#   agent-sandbox-controller  agentsandbox/go.mod, with its CRDs copied from the
#                             same module version into DEST_DIR/agent-sandbox-crds
#
# Idempotent and fast: a binary is rebuilt only when it is missing or its stamp
# file (DEST_DIR/.<name>.stamp: version + checksum of its go.mod/go.sum) does
# not match. Builds reuse the Go build cache and need only Go and the module
# proxy. Concurrent callers (several test packages at once) serialize on a lock.
# The compiler and linker run with GOGC=400 (through -toolexec, so the build
# cache stays shared with plain builds): about 10% less CPU for a cold build
# (bench/build.md).
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

# stamp NAME VERSION MODDIR: the text that identifies one build.
stamp() {
  local sum
  sum=$(cat "$3/go.mod" "$3/go.sum" | sha256sum | cut -c1-16)
  echo "$1 $2 mod=$sum $("$GO" env GOOS GOARCH | tr '\n' ' ')"
}

# up_to_date NAME STAMP
up_to_date() {
  [ -x "$dest/$1" ] && [ -f "$dest/.$1.stamp" ] && [ "$(cat "$dest/.$1.stamp")" = "$2" ]
}

# progress NAME START: reads `go build -v` output (one package path per line
# as each is compiled) and prints a line every 30 s with the count, so a
# build of several minutes is seen to move. Everything read is kept in
# DEST_DIR/.NAME.buildlog for the error report.
progress() {
  local name=$1 start=$2 n=0 last=$SECONDS line
  : > "$dest/.$name.buildlog"
  while IFS= read -r line; do
    echo "$line" >> "$dest/.$name.buildlog"
    n=$((n + 1))
    if (( SECONDS - last >= 30 )); then
      echo "build.sh:   $name: $n packages compiled, $(( $(date +%s) - start ))s"
      last=$SECONDS
    fi
  done
}

# srcsum: a checksum of the wrapper module's own Go files (cmd/kubeparts and
# the packages beside it; the etcd and agentsandbox modules have none).
srcsum() {
  (cd "$here" && find . -name '*.go' -not -path './etcd/*' -not -path './agentsandbox/*' | LC_ALL=C sort | xargs cat) |
    sha256sum | cut -c1-16
}

# build NAME VERSION MODDIR PKG LDFLAGS [own]: with "own", the wrapper
# module's own sources are part of the stamp.
build() {
  local name=$1 version=$2 moddir=$3 pkg=$4 ldflags=$5 own=${6:-} want start rc
  want=$(stamp "$name" "$version" "$moddir")
  if [ -n "$own" ]; then
    want+=" src=$(srcsum)"
  fi
  if up_to_date "$name" "$want"; then
    echo "build.sh: $name $version up to date in $dest"
    return
  fi
  echo "build.sh: building $name $version into $dest"
  start=$(date +%s)
  rc=0
  (cd "$moddir" && "$GO" build -v -trimpath -toolexec "env GOGC=400" -ldflags "$ldflags" -o "$dest/.$name.tmp" "$pkg" 2>&1) | progress "$name" "$start" || rc=$?
  if [ "$rc" -ne 0 ] || [ ! -x "$dest/.$name.tmp" ]; then
    echo "build.sh: building $name failed; the end of its output:" >&2
    grep -v '^[a-zA-Z0-9._/-]*$' "$dest/.$name.buildlog" | tail -n 40 >&2 || true
    exit 1
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
  build kubeparts "$KUBE_VERSION" "$here" ./cmd/kubeparts "$kflags" own
  # kubectl is a part of kubeparts: the docs test runs the README's and the
  # chart NOTES' kubectl lines as printed, so `kubectl` is a name on PATH.
  ln -sfn kubeparts "$dest/kubectl"

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
