// Package gatewaytest holds the two real parts around the driver proxy for
// tests and benchmarks: Driver, a compute driver serving the
// openshell.compute.v1.ComputeDriver protocol on a Unix socket (with its
// own Ready rewrites, its own "kubernetes" platform events, unknown fields
// and an RPC no layout defines), and Client, a gateway-side client that
// calls any method with raw messages and decodes WatchSandboxes events.
//
// Its wire code is written separately from sinks/gateway/driverwire so a
// mistake in the proxy's encoder is not mirrored by the test's decoder.
package gatewaytest
