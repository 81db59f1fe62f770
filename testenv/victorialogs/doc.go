// Package victorialogs runs a real Loki-protocol server for tests:
// VictoriaLogs (Apache-2.0), which accepts the Loki push API
// (/insert/loki/api/v1/push, protobuf+snappy and JSON, with structured
// metadata) and answers LogsQL queries at /select/logsql/query.
//
// Contract: Start(t) never skips. It finds victoria-logs in
// $EVENTPIPE_BIN_DIR, else in <repo root>/.bin, and builds it there with
// `go install` (Version, else FallbackVersion) when missing. The server
// listens on a free 127.0.0.1 port (picked, then retried on a clash), keeps
// its data in a t.TempDir(), and is stopped on test cleanup: no process
// outlives the test. Stop and Restart keep the address and the data, for
// outage drills.
package victorialogs
