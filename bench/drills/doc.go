// Package drills is eventpipe's fault-drill suite for the agent side: each
// drill runs the real pieces (kube-apiserver and etcd from testenv/kube, the
// collector with its durable log in process, the `eventpipe agent` binary as
// a child process, a TCP proxy from testenv/netproxy between agent and
// collector), writes Events under load, injects one fault, and reports per
// destination (here the collector's log, which every sink reads):
// created, acknowledged, delivered, duplicated after de-duplication, lost,
// what the collector de-duplicated (what was sent again), and the time to
// recover (from the end of the fault until every created Event is stored).
//
// The drills are tests. `go test ./bench/drills` (part of `make test`) runs
// the short form: small load, short faults, asserting 0 lost and 0
// duplicated after de-duplication. `make drills` runs the full form
// (-drills.full: load at 400 Events/s, a one-minute black hole) and writes
// the table to bench/drills.md (-drills.out).
package drills
