package gateway

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

// BenchmarkUnary: GetCapabilities round trips, direct, through the proxy
// in grpc mode ("proxy") and in frame mode ("frame"); all in this
// process: the difference is the proxy's cost.
func BenchmarkUnary(b *testing.B) {
	dir := shortDir(b)
	drv := startDriver(b, dir)
	grpcProxy := startProxy(b, proxyConfig(RelayGRPC, dir, drv.Path, "127.0.0.1:1"))
	fcfg := proxyConfig(RelayFrame, dir, drv.Path, "127.0.0.1:1")
	fcfg.Listen = filepath.Join(dir, "frame", "proxy.sock")
	frameProxy := startProxy(b, fcfg)
	for _, tc := range []struct {
		name string
		path string
	}{{"direct", drv.Path}, {"proxy", grpcProxy.p.cfg.Listen}, {"frame", frameProxy.p.cfg.Listen}} {
		b.Run(tc.name, func(b *testing.B) {
			c := dialT(b, tc.path)
			ctx := context.Background()
			if _, err := c.Unary(ctx, gatewaytest.MethodCaps, nil); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Unary(ctx, gatewaytest.MethodCaps, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
