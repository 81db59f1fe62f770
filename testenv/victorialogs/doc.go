// Package victorialogs runs a real Loki-protocol server for tests:
// VictoriaLogs (Apache-2.0), which accepts the Loki push API
// (/insert/loki/api/v1/push, protobuf+snappy and JSON, with structured
// metadata) and answers LogsQL queries at /select/logsql/query.
//
// Contract: Start(t) never skips. It finds victoria-logs in
// $EVENTPIPE_BIN_DIR, else in <repo root>/.bin, and builds it there with
// `go install` (Version, else FallbackVersion) when missing. The server
// binds a 127.0.0.1 port of its choosing (the address is read from its
// log), keeps its data in a t.TempDir(), and is stopped on test cleanup: no
// process outlives the test. Stop and Restart keep the address and the
// data, for outage drills; a restarted server counts as up only once it has
// logged serving that address (another server may hold the port meanwhile).
package victorialogs
