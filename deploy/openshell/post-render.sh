#!/usr/bin/env bash
# Helm post-renderer: the OpenShell chart's rendered manifests on stdin, the
# same with the gateway pod running gateway + eventpipe driver-proxy +
# openshell-driver-kubernetes on stdout. Arguments are the Go post-renderer's
# flags (--collector is required; see README.md):
#
#   helm upgrade --install openshell <chart> -n openshell -f values.yaml \
#     --post-renderer ./deploy/openshell/post-render.sh \
#     --post-renderer-args --collector=eventpipe-collector.eventpipe.svc:7070
#
# It runs the Go post-renderer of this directory (needs Go, or a binary built
# with `go build -o openshell-post-render ./deploy/openshell` on PATH).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if command -v openshell-post-render >/dev/null 2>&1; then
  exec openshell-post-render "$@"
fi
cd "$here"
exec go run . "$@"
