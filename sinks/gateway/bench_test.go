package gateway

import (
	"context"
	"testing"

	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

// BenchmarkUnary: GetCapabilities round trips, direct and through the
// proxy (all in this process: the difference is the proxy's cost).
func BenchmarkUnary(b *testing.B) {
	dir := shortDir(b)
	drv := startDriver(b, dir)
	rp := startProxy(b, proxyConfig(dir, drv.Path, "127.0.0.1:1"))
	for _, tc := range []struct {
		name string
		path string
	}{{"direct", drv.Path}, {"proxy", rp.p.cfg.Listen}} {
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
