package gateway

import (
	"context"
	"path/filepath"
	"testing"
	"time"

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

// BenchmarkUnaryEdited: GetSandbox of a sandbox with an active pull
// failure (the answer edited), direct (unedited), through the gRPC legs
// ("proxy") and through the frame relay ("frame", edited on the frame
// path: relayedit.go).
func BenchmarkUnaryEdited(b *testing.B) {
	dir := shortDir(b)
	drv := startDriver(b, dir)
	drv.Put(testSandbox(failingID, "failing"))
	col := startCollector(b, dir, "")
	grpcProxy := startProxy(b, proxyConfig(RelayGRPC, dir, drv.Path, col.addr))
	fcfg := proxyConfig(RelayFrame, dir, drv.Path, col.addr)
	fcfg.Listen = filepath.Join(dir, "frame", "proxy.sock")
	frameProxy := startProxy(b, fcfg)
	col.ship(b, pullFailed(failingID, 2))
	for _, rp := range []*runningProxy{grpcProxy, frameProxy} {
		waitFor(b, 10*time.Second, "the failure known to the proxy", func() (bool, string) {
			return rp.p.hub.anyFailures(), ""
		})
	}
	req := reqWithUnknown(failingID)
	for _, tc := range []struct {
		name   string
		path   string
		edited bool
	}{{"direct", drv.Path, false}, {"proxy", grpcProxy.p.cfg.Listen, true}, {"frame", frameProxy.p.cfg.Listen, true}} {
		b.Run(tc.name, func(b *testing.B) {
			c := dialT(b, tc.path)
			ctx := context.Background()
			r, err := c.Unary(ctx, gatewaytest.MethodGet, req)
			if err != nil {
				b.Fatal(err)
			}
			if sbs, err := gatewaytest.DecodeSandboxes(r.Bodies[0]); err != nil || len(sbs) != 1 {
				b.Fatalf("GetSandbox: %v", err)
			} else if _, ok := sbs[0].Condition(ConditionImage); ok != tc.edited {
				b.Fatalf("GetSandbox answer edited: %v, want %v", ok, tc.edited)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Unary(ctx, gatewaytest.MethodGet, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
