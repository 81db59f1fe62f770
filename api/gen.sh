#!/usr/bin/env bash
# Regenerates the Go code for api/eventpipe/v1 (make proto). Needs protoc,
# protoc-gen-go and protoc-gen-go-grpc on PATH (make proto-tools installs them).
set -euo pipefail
cd "$(dirname "$0")"
protoc -I . \
  --go_out=. --go_opt=paths=source_relative \
  --go-grpc_out=. --go-grpc_opt=paths=source_relative \
  eventpipe/v1/*.proto
