package gateway

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/gateway/driverwire"
	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

// BenchmarkUnary: GetCapabilities round trips, direct and through the
// proxy; all in this process: the difference is the proxy's cost.
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

// BenchmarkUnaryEdited: GetSandbox of a sandbox with an active pull
// failure (the answer edited), direct (unedited) and through the proxy.
func BenchmarkUnaryEdited(b *testing.B) {
	dir := shortDir(b)
	drv := startDriver(b, dir)
	drv.Put(testSandbox(failingID, "failing"))
	col := startCollector(b, dir, "")
	rp := startProxy(b, proxyConfig(dir, drv.Path, col.addr))
	col.ship(b, pullFailed(failingID, 2))
	waitFor(b, 10*time.Second, "the failure known to the proxy", func() (bool, string) {
		return rp.p.hub.anyBlocked(), ""
	})
	req := reqWithUnknown(failingID)
	for _, tc := range []struct {
		name   string
		path   string
		edited bool
	}{{"direct", drv.Path, false}, {"proxy", rp.p.cfg.Listen, true}} {
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

// BenchmarkPatchPath: the proxy's own work on one GetSandbox answer, without
// gRPC: the hub's patch lookup and driverwire's edit, for a sandbox with an
// active blocker (edited) and for one without (passed through).
func BenchmarkPatchPath(b *testing.B) {
	const clearID = "3c1d7e0a-8b2f-4e5d-9a6c-0f1e2d3c4b5a"
	m, err := newMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	h := newHub(NewDefaultConfig().Follow, m)
	h.apply(1, pullFailed(failingID, 3), false)
	h.apply(2, pulledAgent(clearID), false)
	for _, tc := range []struct {
		name   string
		id     string
		edited bool
	}{{"blocked", failingID, true}, {"clear", clearID, false}} {
		// A GetSandboxResponse: field 1, the DriverSandbox.
		resp := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), gatewaytest.EncodeSandbox(testSandbox(tc.id, "web")))
		b.Run(tc.name, func(b *testing.B) {
			out, err := driverwire.PatchGetSandboxResponse(resp, h.patchFor)
			if err != nil {
				b.Fatal(err)
			}
			if edited := len(out) != len(resp); edited != tc.edited {
				b.Fatalf("edited %v, want %v", edited, tc.edited)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := driverwire.PatchGetSandboxResponse(resp, h.patchFor); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkApply: one occurrence from the Follow stream into the hub (the
// blockers folded, the patch computed, the platform event encoded), for a
// sandbox whose pull keeps failing: the per-occurrence cost of the state
// the conditions come from.
func BenchmarkApply(b *testing.B) {
	m, err := newMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	h := newHub(NewDefaultConfig().Follow, m)
	occs := make([]*eventpipev1.Occurrence, 64)
	for i := range occs {
		occs[i] = pullFailed(failingID, uint32(i+1))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		h.apply(uint64(i), occs[i%len(occs)], false)
	}
}
