package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

// Tests of the proxy's HTTP/2 behaviour as a gateway and a driver see it:
// interleaved edited and forwarded calls with HPACK churn, large messages
// through the smallest windows, driver GOAWAYs, gateway resets, and raw
// frames grpc-go never sends. (Written for the frame relay removed on
// 2026-12-04; they hold for the gRPC legs as they did then.)

const (
	healthyID = "11111111-2222-4333-8444-555555555555"
	failingID = "7f7c2c8e-4a9b-4c1e-9e57-1f0b3a9d2c11"
)

// extraID is the id of the i-th extra sandbox of failingSetup.
func extraID(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }

// failingSetup starts a driver with a healthy and a failing sandbox, a
// collector that reports the failure, and a proxy that knows it (so Get
// and List answers are edited).
func failingSetup(t *testing.T, extra int, opts ...grpc.ServerOption) (*gatewaytest.Driver, *runningProxy) {
	t.Helper()
	dir := shortDir(t)
	drv, err := gatewaytest.StartDriver(dir+"/driver/driver.sock", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drv.Stop)
	drv.Put(testSandbox(healthyID, "healthy"))
	drv.Put(testSandbox(failingID, "failing"))
	for i := range extra {
		drv.Put(testSandbox(extraID(i), fmt.Sprintf("sb-%d-%s", i, strings.Repeat("n", 100))))
	}
	col := startCollector(t, dir, "")
	rp := startProxy(t, proxyConfig(dir, drv.Path, col.addr))
	col.ship(t, pullFailed(failingID, 2))
	waitFor(t, 10*time.Second, "the failure known to the proxy", func() (bool, string) {
		return rp.p.hub.anyBlocked(), ""
	})
	return drv, rp
}

type relayCall struct {
	name   string
	method string
	reqs   [][]byte
	check  func(t *testing.T, got gatewaytest.Response, err error) // nil: same as direct
}

func callMD(g, i int) metadata.MD {
	// Values that change per call and are long enough to evict entries
	// from a 4 KiB HPACK table: both directions' dynamic tables churn (the
	// driver echoes the metadata in its headers).
	return metadata.Pairs(
		"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"x-openshell-request-id", fmt.Sprintf("req-%d-%d", g, i),
		"x-pad", strings.Repeat(string(rune('a'+(g+i)%26)), 700),
		"x-trace-bin", string([]byte{0, byte(g), byte(i), 0xff}))
}

func sameAs(t *testing.T, want gatewaytest.Response, werr error, got gatewaytest.Response, gerr error) {
	t.Helper()
	if !proto.Equal(status.Convert(werr).Proto(), status.Convert(gerr).Proto()) {
		t.Errorf("status %v, direct %v", gerr, werr)
	}
	if len(got.Bodies) != len(want.Bodies) {
		t.Fatalf("%d responses, direct %d", len(got.Bodies), len(want.Bodies))
	}
	for i := range want.Bodies {
		if !bytes.Equal(got.Bodies[i], want.Bodies[i]) {
			t.Errorf("response %d differs (%d bytes, direct %d)", i, len(got.Bodies[i]), len(want.Bodies[i]))
		}
	}
}

// TestInterleavedStreams: edited (answered by the relay) and forwarded
// calls, unary and streaming, large and small, run concurrently on one
// gateway connection with a WatchSandboxes stream open, with metadata that
// churns both directions' HPACK dynamic tables: every answer is the
// direct one (forwarded) or the edited one (Get/List), the metadata the
// driver saw is the call's own, and the stream keeps delivering.
func TestInterleavedStreams(t *testing.T) {
	drv, rp := failingSetup(t, 0)
	direct := dialT(t, drv.Path)
	via := dialT(t, rp.p.cfg.Listen)
	w := watch(t, via)
	if err := drv.WaitWatchers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	failing := func(t *testing.T, got gatewaytest.Response, err error) {
		if err != nil {
			t.Fatalf("edited call: %v", err)
		}
		sbs, derr := gatewaytest.DecodeSandboxes(got.Bodies[0])
		if derr != nil {
			t.Fatal(derr)
		}
		for _, s := range sbs {
			checkFailing(t, "edited answer", s, s.ID == failingID)
		}
	}
	calls := []relayCall{
		{name: "caps", method: gatewaytest.MethodCaps, reqs: [][]byte{reqWithUnknown("c")}},
		{name: "get-healthy", method: gatewaytest.MethodGet, reqs: [][]byte{reqWithUnknown(healthyID)}},
		{name: "get-failing", method: gatewaytest.MethodGet, reqs: [][]byte{reqWithUnknown(failingID)}, check: failing},
		{name: "get-missing", method: gatewaytest.MethodGet, reqs: [][]byte{reqWithUnknown("no-such-id")}},
		{name: "list", method: gatewaytest.MethodList, reqs: [][]byte{reqWithUnknown()}, check: failing},
		{name: "unknown-stream", method: gatewaytest.MethodUnknown, reqs: [][]byte{reqWithUnknown("a"), reqWithUnknown("b", strings.Repeat("c", 40<<10))}},
		{name: "unknown-service", method: gatewaytest.MethodUnknownSv, reqs: [][]byte{reqWithUnknown("x"), {}}},
		{name: "echo-300k", method: gatewaytest.Prefix + "CreateSandbox", reqs: [][]byte{reqWithUnknown(strings.Repeat("e", 300<<10))}},
		{name: "stop", method: gatewaytest.MethodStop, reqs: [][]byte{reqWithUnknown("s")}},
	}
	type result struct {
		r   gatewaytest.Response
		err error
	}
	want := map[string]result{}
	for _, c := range calls {
		ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), callMD(0, 0)), 5*time.Second)
		r, err := direct.Call(ctx, c.method, c.reqs...)
		cancel()
		want[c.name] = result{r, err}
	}
	const goroutines, rounds = 6, 20
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				c := calls[(g*3+i)%len(calls)]
				md := callMD(g, i)
				ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), 10*time.Second)
				got, err := via.Call(ctx, c.method, c.reqs...)
				cancel()
				if c.check != nil {
					c.check(t, got, err)
				} else {
					sameAs(t, want[c.name].r, want[c.name].err, got, err)
				}
				for _, k := range []string{"x-openshell-request-id", "x-pad", "x-trace-bin"} {
					if g, w := got.Header.Get("x-echo-"+k), md.Get(k); len(g) != 1 || g[0] != w[0] {
						t.Errorf("%s: metadata %s at the driver %.40q, want %.40q", c.name, k, g, w)
					}
				}
			}
		}()
	}
	wg.Wait()
	drv.Put(testSandbox(failingID, "failing"))
	waitFor(t, 10*time.Second, "a snapshot on the open stream", func() (bool, string) {
		s, n := w.snapshot(failingID)
		if n == 0 {
			return false, "none"
		}
		_, has := s.Condition(ConditionImage)
		return has, "no condition"
	})
	if len(w.ours()) != 1 {
		t.Errorf("the open stream got %v, want the one failure", eventIDs(w.ours()))
	}
}

// TestLargeMessagesSmallWindows: a gateway with the smallest windows HTTP/2
// allows (64 KiB a stream and a connection, no window growth) gets edited
// ListSandboxes answers (relay-written) and forwarded 1 MiB echoes at the
// same time, each many times its windows, and edited calls with requests
// larger than the windows: nothing stalls, nothing is cut.
func TestLargeMessagesSmallWindows(t *testing.T) {
	const extra = 3000
	drv, rp := failingSetup(t, extra)
	c, err := gatewaytest.Dial(rp.p.cfg.Listen, grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(65535))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := reqWithUnknown(strings.Repeat("L", 1<<20))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	wantEcho, err := dialT(t, drv.Path).Call(ctx, gatewaytest.Prefix+"CreateSandbox", big)
	cancel()
	if err != nil || len(wantEcho.Bodies) != 1 || len(wantEcho.Bodies[0]) < 1<<20 {
		t.Fatalf("direct echo: %v", err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				if g%2 == 0 {
					r, err := c.Unary(ctx, gatewaytest.MethodList, nil)
					if err != nil {
						t.Errorf("ListSandboxes: %v", err)
					} else if sbs, err := gatewaytest.DecodeSandboxes(r.Bodies[0]); err != nil || len(sbs) != extra+2 {
						t.Errorf("ListSandboxes: %v, %d sandboxes, want %d (%d bytes)", err, len(sbs), extra+2, len(r.Bodies[0]))
					} else {
						for _, s := range sbs {
							if s.ID == failingID {
								checkFailing(t, "large List", s, true)
							}
						}
					}
				} else {
					r, err := c.Call(ctx, gatewaytest.Prefix+"CreateSandbox", big)
					if err != nil || len(r.Bodies) != 1 || !bytes.Equal(r.Bodies[0], wantEcho.Bodies[0]) {
						t.Errorf("1 MiB echo: %v, %d bodies", err, len(r.Bodies))
					}
				}
				cancel()
			}
		}()
	}
	// A Fatalf below must not end the test while the callers still run
	// (they report on t).
	defer wg.Wait()
	// Requests larger than the windows to an edited method: the
	// driver never sees their bytes, so the relay must credit the
	// gateway's connection and stream windows itself or the next
	// request stalls.
	bigGet := reqWithUnknown(failingID, "", strings.Repeat("g", 200<<10))
	for range 4 {
		// 20 s: it shares the connection with the 1 MiB calls above.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r, err := c.Unary(ctx, gatewaytest.MethodGet, bigGet)
		cancel()
		if err != nil {
			t.Fatalf("GetSandbox with a 200 KiB request: %v", err)
		}
		sbs, err := gatewaytest.DecodeSandboxes(r.Bodies[0])
		if err != nil || len(sbs) != 1 {
			t.Fatalf("GetSandbox answer: %v", err)
		}
		checkFailing(t, "GetSandbox with a large request", sbs[0], true)
	}
}

// TestDriverGoAway: a driver that ends its connections every 300 ms with
// GOAWAY (grpc-go's two-step GOAWAY with a PING between): every call
// through the proxy still succeeds.
func TestDriverGoAway(t *testing.T) {
	_, rp := failingSetup(t, 0, grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge: 300 * time.Millisecond, MaxConnectionAgeGrace: 5 * time.Second}))
	via := dialT(t, rp.p.cfg.Listen)
	end := time.Now().Add(2 * time.Second)
	n := 0
	for time.Now().Before(end) {
		for _, m := range []string{gatewaytest.MethodCaps, gatewaytest.MethodGet, gatewaytest.MethodUnknown} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := via.Call(ctx, m, reqWithUnknown(healthyID))
			cancel()
			if err != nil {
				t.Errorf("%s across driver GOAWAYs: %v", m, err)
			}
			n++
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n < 30 {
		t.Errorf("only %d calls in 2s", n)
	}
}

// TestClientResets: the gateway cancels streams mid-call (WatchSandboxes,
// answered by the relay; a forwarded stream; unary calls with deadlines
// that expire in flight): the connection keeps working, the driver's
// watch streams and the proxy's stream gauge go back to zero.
func TestClientResets(t *testing.T) {
	drv, rp := failingSetup(t, 0)
	via := dialT(t, rp.p.cfg.Listen)
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		w, err := via.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := w.Recv(); err != nil { // the tail's first event
				t.Fatal(err)
			}
		}
		cancel()
		sctx, scancel := context.WithCancel(context.Background())
		go func() { time.Sleep(time.Duration(i%3) * time.Millisecond); scancel() }()
		_, _ = via.Call(sctx, gatewaytest.MethodUnknown, reqWithUnknown(strings.Repeat("r", 200<<10)))
		ctx, cancel = context.WithTimeout(context.Background(), time.Duration(i*50)*time.Microsecond)
		_, _ = via.Call(ctx, gatewaytest.MethodGet, reqWithUnknown(failingID))
		cancel()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := drv.WaitWatchers(ctx, 0); err != nil {
		t.Error(err)
	}
	waitFor(t, 5*time.Second, "no watch stream left in the proxy", func() (bool, string) {
		return rp.metric(t, "eventpipe_driver_proxy_watch_streams") == 0, ""
	})
	checkFailing(t, "GetSandbox after resets", getSandbox(t, via, failingID), true)
	if _, err := via.Unary(ctx, gatewaytest.MethodCaps, nil); err != nil {
		t.Errorf("call after resets: %v", err)
	}
}

// TestRawFrames plays a gateway with a raw HTTP/2 framer, using what
// grpc-go never sends: header blocks split into CONTINUATION frames,
// padding and priority on HEADERS, padded DATA, a dynamic table size
// update and indexed fields from its own table. Both a forwarded and an
// edited call must answer as the driver does directly.
func TestRawFrames(t *testing.T) {
	drv, rp := failingSetup(t, 0)
	direct := dialT(t, drv.Path)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wantCaps, err := direct.Unary(ctx, gatewaytest.MethodCaps, reqWithUnknown("x"))
	if err != nil {
		t.Fatal(err)
	}

	c, err := net.Dial("unix", rp.p.cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	bw := bufio.NewWriter(c)
	fr := http2.NewFramer(bw, bufio.NewReader(c))
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	bw.WriteString(http2.ClientPreface)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	enc.SetMaxDynamicTableSize(2048) // a size update at the start of the first block
	send := func(sid uint32, method, arg string) {
		hb.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: method},
			{Name: ":authority", Value: "localhost"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
			{Name: "x-openshell-request-id", Value: "raw-" + arg}, {Name: "x-long", Value: strings.Repeat("l", 300)},
		} {
			_ = enc.WriteField(f)
		}
		b := hb.Bytes()
		// HEADERS (padded, with priority) with a third of the block,
		// then two CONTINUATIONs.
		i, j := len(b)/3, 2*len(b)/3
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: b[:i], PadLength: 7,
			Priority: http2.PriorityParam{StreamDep: 0, Weight: 15}}); err != nil {
			t.Fatal(err)
		}
		_ = fr.WriteContinuation(sid, false, b[i:j])
		_ = fr.WriteContinuation(sid, true, b[j:])
		body := reqWithUnknown(arg)
		msg := make([]byte, 5+len(body))
		binary.BigEndian.PutUint32(msg[1:], uint32(len(body)))
		copy(msg[5:], body)
		if err := fr.WriteDataPadded(sid, true, msg, make([]byte, 5)); err != nil {
			t.Fatal(err)
		}
	}
	// Stream 1 forwarded, 3 edited, 5 forwarded again (after a block
	// the driver never saw: its indexed fields must still resolve).
	send(1, gatewaytest.MethodCaps, "x")
	send(3, gatewaytest.MethodGet, failingID)
	send(5, gatewaytest.MethodCaps, "x")
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		status, grpcStatus string
		body               []byte
		ended              bool
	}
	answers := map[uint32]*answer{1: {}, 3: {}, 5: {}}
	for ended := 0; ended < 3; {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
				_ = bw.Flush()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
				_ = bw.Flush()
			}
		case *http2.MetaHeadersFrame:
			a := answers[f.StreamID]
			if s := f.PseudoValue("status"); s != "" {
				a.status = s
			}
			for _, hf := range f.RegularFields() {
				if hf.Name == "grpc-status" {
					a.grpcStatus = hf.Value
				}
			}
			if f.StreamEnded() {
				a.ended = true
				ended++
			}
		case *http2.DataFrame:
			a := answers[f.StreamID]
			a.body = append(a.body, f.Data()...)
			if len(f.Data()) > 0 {
				_ = fr.WriteWindowUpdate(0, uint32(len(f.Data())))
				_ = bw.Flush()
			}
			if f.StreamEnded() {
				a.ended = true
				ended++
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v", f.ErrCode)
		case *http2.RSTStreamFrame:
			t.Fatalf("RST_STREAM %d %v", f.StreamID, f.ErrCode)
		}
	}
	for _, sid := range []uint32{1, 5} {
		a := answers[sid]
		if a.status != "200" || a.grpcStatus != "0" || len(a.body) < 5 || !bytes.Equal(a.body[5:], wantCaps.Bodies[0]) {
			t.Errorf("stream %d: %+v, want the direct answer", sid, a)
		}
	}
	a := answers[3]
	if a.status != "200" || a.grpcStatus != "0" || len(a.body) < 5 {
		t.Fatalf("edited stream: %+v", a)
	}
	sbs, err := gatewaytest.DecodeSandboxes(a.body[5:])
	if err != nil || len(sbs) != 1 {
		t.Fatalf("edited answer: %v", err)
	}
	checkFailing(t, "raw GetSandbox", sbs[0], true)
	if md := drv.LastMetadata(gatewaytest.MethodCaps); len(md.Get("x-openshell-request-id")) != 1 || md.Get("x-long")[0] != strings.Repeat("l", 300) {
		t.Errorf("metadata at the driver: %v", md)
	}
}
