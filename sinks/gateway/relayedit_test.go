package gateway

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

// Tests of edited answers on the frame path (relayedit.go).

// extraID is the id of the i-th extra sandbox of editSetup.
func extraID(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }

// editSetup starts a driver with the healthy and failing sandboxes and
// extra more (the first failingExtra of them failing too), a collector
// that reports the failures, and one proxy per relay mode that knows
// them. The frame proxy's gRPC client leg is closed: an edited answer it
// gives can only have come through the frame path.
func editSetup(t *testing.T, extra, failingExtra int, frameCfg func(*Config)) (drv *gatewaytest.Driver, grpcP, frameP *runningProxy) {
	t.Helper()
	dir := shortDir(t)
	drv, err := gatewaytest.StartDriver(dir + "/driver/driver.sock")
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
	grpcP = startProxy(t, proxyConfig(RelayGRPC, dir, drv.Path, col.addr))
	fcfg := proxyConfig(RelayFrame, dir, drv.Path, col.addr)
	fcfg.Listen = filepath.Join(dir, "frame", "proxy.sock")
	if frameCfg != nil {
		frameCfg(&fcfg)
	}
	frameP = startProxy(t, fcfg)
	occs := []*eventpipev1.Occurrence{pullFailed(failingID, 2)}
	for i := range failingExtra {
		occs = append(occs, pullFailed(extraID(i), 3))
	}
	col.ship(t, occs...)
	for _, rp := range []*runningProxy{grpcP, frameP} {
		waitFor(t, 10*time.Second, "the failures known to the proxy", func() (bool, string) {
			n := rp.metric(t, "eventpipe_driver_proxy_pull_failures_active")
			return int(n) == 1+failingExtra, fmt.Sprint(n)
		})
	}
	if err := frameP.p.driver.Close(); err != nil {
		t.Fatal(err)
	}
	return drv, grpcP, frameP
}

// smallWindows: the smallest windows HTTP/2 allows and no window growth,
// so a large answer needs many WINDOW_UPDATEs of both kinds.
func smallWindows(t *testing.T, path string) *gatewaytest.Client {
	t.Helper()
	c, err := gatewaytest.Dial(path, grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(65535))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestEditedFramePathSameAsGRPC: with pull failures active, GetSandbox and
// a ListSandboxes answer of about 440 KB (7 connection windows of the
// gateway, 300 sandboxes failing) come through the frame path byte for
// byte as the gRPC legs edit them, status and driver metadata included;
// the answers of a sandbox that is not failing and of a missing one are
// the driver's own.
func TestEditedFramePathSameAsGRPC(t *testing.T) {
	const extra, failing = 3000, 300
	drv, grpcP, frameP := editSetup(t, extra, failing, nil)
	direct := dialT(t, drv.Path)
	viaGRPC := smallWindows(t, grpcP.p.cfg.Listen)
	viaFrame := smallWindows(t, frameP.p.cfg.Listen)
	calls := []struct {
		name   string
		method string
		req    []byte
		edited bool
	}{
		{"get-failing", gatewaytest.MethodGet, reqWithUnknown(failingID), true},
		{"get-failing-extra", gatewaytest.MethodGet, reqWithUnknown(extraID(7)), true},
		{"get-healthy", gatewaytest.MethodGet, reqWithUnknown(healthyID), false},
		{"get-missing", gatewaytest.MethodGet, reqWithUnknown("no-such-id"), false},
		{"list", gatewaytest.MethodList, reqWithUnknown(), true},
	}
	for round := range 3 {
		for _, c := range calls {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			d, derr := direct.Call(ctx, c.method, c.req)
			g, gerr := viaGRPC.Call(ctx, c.method, c.req)
			f, ferr := viaFrame.Call(ctx, c.method, c.req)
			cancel()
			if !proto.Equal(status.Convert(gerr).Proto(), status.Convert(ferr).Proto()) {
				t.Errorf("%s: status %v through the frame path, %v through the gRPC legs", c.name, ferr, gerr)
			}
			if len(f.Bodies) != len(g.Bodies) {
				t.Fatalf("%s: %d answers through the frame path, %d through the gRPC legs", c.name, len(f.Bodies), len(g.Bodies))
			}
			for i := range g.Bodies {
				if !bytes.Equal(f.Bodies[i], g.Bodies[i]) {
					t.Errorf("%s: answer %d through the frame path (%d bytes) differs from the gRPC legs' (%d bytes)",
						c.name, i, len(f.Bodies[i]), len(g.Bodies[i]))
				}
				if edited := !bytes.Equal(f.Bodies[i], d.Bodies[i]); edited != c.edited {
					t.Errorf("%s: edited %v, want %v", c.name, edited, c.edited)
				}
			}
			if derr == nil && !proto.Equal(status.Convert(derr).Proto(), status.Convert(ferr).Proto()) {
				t.Errorf("%s: status %v, direct %v", c.name, ferr, derr)
			}
			if c.name == "list" && round == 0 {
				sbs, err := gatewaytest.DecodeSandboxes(f.Bodies[0])
				if err != nil || len(sbs) != extra+2 {
					t.Fatalf("list: %d sandboxes (%v), want %d", len(sbs), err, extra+2)
				}
				n := 0
				for _, s := range sbs {
					if _, ok := s.Condition(ConditionImage); ok {
						n++
					}
				}
				if n != failing+1 || len(f.Bodies[0]) < 7*65535 {
					t.Errorf("list: %d sandboxes with %s in %d bytes, want %d in over %d", n, ConditionImage, len(f.Bodies[0]), failing+1, 7*65535)
				}
			}
		}
	}
	if n := frameP.metric(t, "eventpipe_driver_proxy_unedited_answers_total"); n != 0 {
		t.Errorf("unedited_answers_total %v, want 0", n)
	}
}

// TestEditedFramePathOverLimit: an answer larger than
// relay_edit_max_bytes passes unedited, as the driver sent it (and is
// counted); its bytes are credited to the driver only as the gateway
// takes them, with windows far smaller than the answer. A GetSandbox
// answer under the limit is still edited.
func TestEditedFramePathOverLimit(t *testing.T) {
	drv, _, frameP := editSetup(t, 2000, 50, func(c *Config) { c.RelayEditMaxBytes = 100 << 10 })
	direct := dialT(t, drv.Path)
	via := smallWindows(t, frameP.p.cfg.Listen)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	want, err := direct.Unary(ctx, gatewaytest.MethodList, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		got, err := via.Unary(ctx, gatewaytest.MethodList, nil)
		if err != nil {
			t.Fatalf("ListSandboxes: %v", err)
		}
		if len(want.Bodies[0]) < 200<<10 || !bytes.Equal(got.Bodies[0], want.Bodies[0]) {
			t.Errorf("ListSandboxes over the limit: %d bytes, want the driver's %d unedited", len(got.Bodies[0]), len(want.Bodies[0]))
		}
		g, err := via.Unary(ctx, gatewaytest.MethodGet, reqWithUnknown(failingID))
		if err != nil {
			t.Fatalf("GetSandbox: %v", err)
		}
		sbs, err := gatewaytest.DecodeSandboxes(g.Bodies[0])
		if err != nil || len(sbs) != 1 {
			t.Fatalf("GetSandbox answer: %v", err)
		}
		checkFailing(t, "GetSandbox under the limit", sbs[0], true)
	}
	if n := frameP.metric(t, "eventpipe_driver_proxy_unedited_answers_total"); n != 3 {
		t.Errorf("unedited_answers_total %v, want 3", n)
	}
}

// TestEditedFramePathFlowControl: on one connection of a gateway that
// keeps its receive windows strictly (rawGateway), 300 edited GetSandbox
// and 4 edited ListSandboxes calls (about 2 MB the relay writes itself),
// then 1 MiB forwarded answers the gateway reads only in part: the relay
// must never send beyond the windows the gateway granted (the bytes it
// wrote for edited streams spent them), must send all the windows allow
// (no stall), and the answers must end complete once granted.
func TestEditedFramePathFlowControl(t *testing.T) {
	forRelays(t, func(t *testing.T, relay string) {
		_, rp := failingSetup(t, relay, 2000)
		g := dialRawGateway(t, rp.p.cfg.Listen)
		sid := uint32(1)
		next := func() uint32 { s := sid; sid += 2; return s }
		var listIDs []uint32
		for i := range 304 {
			s := next()
			g.mu.Lock()
			g.auto[s] = true
			g.mu.Unlock()
			if i%76 == 75 {
				listIDs = append(listIDs, s)
				g.call(s, gatewaytest.MethodList, nil)
			} else {
				g.call(s, gatewaytest.MethodGet, reqWithUnknown(failingID))
			}
			if i%8 == 7 || i%76 == 75 {
				// A few calls in flight at a time, like a gateway's
				// reconcile loop.
				if !g.waitFor(10*time.Second, func() bool { return g.status[s] != "" }) {
					t.Fatalf("edited call %d (stream %d) did not end: %v", i, s, g.err)
				}
			}
		}
		if !g.waitFor(10*time.Second, func() bool { return g.status[sid-2] != "" }) {
			t.Fatalf("the edited calls did not end: %v", g.err)
		}
		g.mu.Lock()
		for s, st := range g.status {
			if st != "0" {
				t.Errorf("edited stream %d: grpc-status %q", s, st)
			}
		}
		for _, s := range listIDs {
			sbs, err := gatewaytest.DecodeSandboxes(g.got[s][5:])
			if err != nil || len(sbs) != 2002 {
				t.Errorf("ListSandboxes on stream %d: %d sandboxes (%v)", s, len(sbs), err)
			}
		}
		if sbs, err := gatewaytest.DecodeSandboxes(g.got[1][5:]); err != nil || len(sbs) != 1 {
			t.Errorf("GetSandbox: %v", err)
		} else {
			checkFailing(t, "GetSandbox", sbs[0], true)
		}
		before := g.recv
		g.mu.Unlock()

		// Two 1 MiB answers the gateway does not read yet: exactly its
		// connection window (64 KiB, all granted back so far) may come.
		big := []uint32{next(), next()}
		for _, s := range big {
			g.call(s, gatewaytest.MethodUnknownSv, bytes.Repeat([]byte("x"), 1<<20))
		}
		if !g.waitFor(5*time.Second, func() bool { return g.recv-before >= 65535 || g.flowErr != nil }) {
			t.Fatalf("the forwarded answers stalled: %d bytes of the 65535 window (%v)", g.recv-before, g.err)
		}
		time.Sleep(300 * time.Millisecond) // whatever else the relay would send
		g.mu.Lock()
		if g.flowErr != nil {
			t.Errorf("after the edited calls: %v", g.flowErr)
		}
		if n := g.recv - before; n != 65535 {
			t.Errorf("%d bytes of the forwarded answers arrived, want exactly the 65535 window", n)
		}
		g.mu.Unlock()
		for _, s := range big {
			g.grant(s, 2<<20)
		}
		g.grant(0, 4<<20)
		if !g.waitFor(10*time.Second, func() bool { return g.status[big[0]] != "" && g.status[big[1]] != "" }) {
			t.Fatalf("the forwarded answers did not end once granted: %v", g.err)
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, s := range big {
			if b := g.got[s]; g.status[s] != "0" || len(b) < 5+1<<20 || !bytes.Contains(b, bytes.Repeat([]byte("x"), 1<<20)) {
				t.Errorf("forwarded answer on stream %d: status %q, %d bytes", s, g.status[s], len(b))
			}
		}
		if g.flowErr != nil {
			t.Errorf("%v", g.flowErr)
		}
	})
}

// TestEditedStreamDoesNotBlock: an edited ListSandboxes answer the gateway
// does not read (its stream window stays at 64 KiB; the connection's is
// open) takes exactly its stream window, while a GetSandbox (edited) and
// a forwarded 300 KB call on the same connection are answered in full;
// once the gateway reads it, the List answer ends complete and edited.
func TestEditedStreamDoesNotBlock(t *testing.T) {
	forRelays(t, func(t *testing.T, relay string) {
		_, rp := failingSetup(t, relay, 3000)
		g := dialRawGateway(t, rp.p.cfg.Listen)
		g.grant(0, 64<<20)
		g.call(1, gatewaytest.MethodList, nil)
		if !g.waitFor(5*time.Second, func() bool { return len(g.got[1]) >= 65535 || g.flowErr != nil }) {
			t.Fatalf("the List answer did not fill its window: %d bytes (%v)", len(g.got[1]), g.err)
		}
		g.mu.Lock()
		g.auto[3], g.auto[5] = true, true
		g.mu.Unlock()
		g.call(3, gatewaytest.MethodGet, reqWithUnknown(failingID))
		body := bytes.Repeat([]byte("c"), 300000)
		g.call(5, gatewaytest.MethodUnknownSv, body)
		if !g.waitFor(5*time.Second, func() bool { return g.status[3] != "" && g.status[5] != "" }) {
			g.mu.Lock()
			st, err := fmt.Sprint(g.status), g.err
			g.mu.Unlock()
			t.Fatalf("calls behind the unread edited answer: %v (%v)", st, err)
		}
		time.Sleep(100 * time.Millisecond)
		g.mu.Lock()
		if g.status[3] != "0" || g.status[5] != "0" || !bytes.Contains(g.got[5], body) {
			t.Errorf("calls behind the unread edited answer: %v, %d bytes", g.status, len(g.got[5]))
		}
		if sbs, err := gatewaytest.DecodeSandboxes(g.got[3][5:]); err != nil || len(sbs) != 1 {
			t.Errorf("GetSandbox: %v", err)
		} else {
			checkFailing(t, "GetSandbox", sbs[0], true)
		}
		if n := len(g.got[1]); n != 65535 || g.status[1] != "" || g.flowErr != nil {
			t.Errorf("the unread List answer: %d bytes, status %q, %v; want its 65535 window and no end", n, g.status[1], g.flowErr)
		}
		g.mu.Unlock()
		g.grant(1, 8<<20)
		if !g.waitFor(10*time.Second, func() bool { return g.status[1] != "" }) {
			t.Fatalf("the List answer did not end once read: %v", g.err)
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		sbs, err := gatewaytest.DecodeSandboxes(g.got[1][5:])
		if g.status[1] != "0" || err != nil || len(sbs) != 3002 {
			t.Fatalf("List: status %q, %d sandboxes (%v)", g.status[1], len(sbs), err)
		}
		for _, s := range sbs {
			if s.ID == failingID {
				checkFailing(t, "List", s, true)
			}
		}
		if g.flowErr != nil {
			t.Error(g.flowErr)
		}
	})
}

// TestLongEditDoesNotStallOtherStreams: a ListSandboxes answer of 6,000
// failing sandboxes takes the relay a long time to edit (hundreds of
// milliseconds); GetCapabilities calls on the same gateway connection
// made meanwhile are answered at their usual pace, not after the edit
// (the frame relay edits large messages off the driver reader; the gRPC
// legs edit in the call's own handler).
func TestLongEditDoesNotStallOtherStreams(t *testing.T) {
	const n = 6000
	forRelays(t, func(t *testing.T, relay string) {
		dir := shortDir(t)
		drv := startDriver(t, dir)
		occs := make([]*eventpipev1.Occurrence, 0, n)
		for i := range n {
			drv.Put(testSandbox(extraID(i), fmt.Sprintf("sb-%d", i)))
			occs = append(occs, pullFailed(extraID(i), 2))
		}
		col := startCollector(t, dir, "")
		cfg := proxyConfig(relay, dir, drv.Path, col.addr)
		cfg.Follow.MaxSandboxes = 2 * n
		rp := startProxy(t, cfg)
		col.ship(t, occs...)
		waitFor(t, 30*time.Second, "the failures known to the proxy", func() (bool, string) {
			v := rp.metric(t, "eventpipe_driver_proxy_pull_failures_active")
			return int(v) == n, fmt.Sprint(v)
		})
		c := dialT(t, rp.p.cfg.Listen)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		type result struct {
			r   gatewaytest.Response
			err error
			d   time.Duration
		}
		done := make(chan result, 1)
		start := time.Now()
		go func() {
			r, err := c.Unary(ctx, gatewaytest.MethodList, nil)
			done <- result{r, err, time.Since(start)}
		}()
		var calls int
		var slowest time.Duration
		var list result
	loop:
		for {
			select {
			case list = <-done:
				break loop
			default:
			}
			s := time.Now()
			if _, err := c.Unary(ctx, gatewaytest.MethodCaps, nil); err != nil {
				t.Fatalf("GetCapabilities: %v", err)
			}
			calls++
			slowest = max(slowest, time.Since(s))
		}
		if list.err != nil {
			t.Fatalf("ListSandboxes: %v", list.err)
		}
		sbs, err := gatewaytest.DecodeSandboxes(list.r.Bodies[0])
		if err != nil || len(sbs) != n {
			t.Fatalf("ListSandboxes: %d sandboxes (%v)", len(sbs), err)
		}
		checkFailing(t, "ListSandboxes", sbs[n-1], true)
		t.Logf("ListSandboxes of %d failing sandboxes (%d bytes): %s; %d GetCapabilities calls meanwhile, the slowest %s",
			n, len(list.r.Bodies[0]), list.d, calls, slowest)
		if calls < 10 || slowest > list.d/3 {
			t.Errorf("GetCapabilities during the edit: %d calls, the slowest %s, against %s for the List: stalled behind the edit",
				calls, slowest, list.d)
		}
	})
}

// TestEditedStreamResets: the gateway resets edited ListSandboxes streams
// at every point of their answers (before the edit, during it, with edited
// DATA held for the stream's window). Nothing of them may stay held in the
// relay: a GetSandbox afterwards is answered, and when the driver goes
// away the relay delivers what it holds and ends the gateway's connection
// at once (it would wait forever for frames of a reset stream).
func TestEditedStreamResets(t *testing.T) {
	drv, rp := failingSetup(t, RelayFrame, 500)
	g := dialRawGateway(t, rp.p.cfg.Listen)
	g.grant(0, 64<<20)
	sid := uint32(1)
	for i := range 60 {
		s := sid
		g.call(s, gatewaytest.MethodList, nil)
		// Reset when the answer's headers came (reassembly or edit under
		// way), a little later, or once edited DATA came (the rest held
		// for the stream's window).
		var ok bool
		switch i % 3 {
		case 0, 1:
			ok = g.waitFor(5*time.Second, func() bool { return g.headers[s] })
			if i%3 == 1 {
				time.Sleep(time.Duration(i%5) * 200 * time.Microsecond)
			}
		case 2:
			ok = g.waitFor(5*time.Second, func() bool { return len(g.got[s]) > 0 })
		}
		if !ok {
			t.Fatalf("List %d: no answer (%v)", i, g.err)
		}
		g.write(func() { _ = g.fr.WriteRSTStream(s, http2.ErrCodeCancel) })
		sid += 2
	}
	g.mu.Lock()
	g.auto[sid] = true
	g.mu.Unlock()
	g.call(sid, gatewaytest.MethodGet, reqWithUnknown(failingID))
	if !g.waitFor(5*time.Second, func() bool { return g.status[sid] != "" }) {
		t.Fatalf("GetSandbox after the resets: no answer (%v)", g.err)
	}
	g.mu.Lock()
	st := g.status[sid]
	g.mu.Unlock()
	if st != "0" {
		t.Fatalf("GetSandbox after the resets: grpc-status %q", st)
	}
	drv.Stop()
	if !g.waitFor(3*time.Second, func() bool { return g.err != nil }) {
		t.Errorf("the driver went away, but the relay kept the gateway's connection open: frames of reset streams still held")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.flowErr != nil {
		t.Error(g.flowErr)
	}
}

// TestEditedFramePathCompressed: a driver that answers GetSandbox with a
// compressed message (grpc-encoding gzip, compressed flag set: a driver
// does so when the gateway offered gzip) gets it to the gateway through
// the frame relay byte for byte, unedited (the relay does not decompress),
// counted in unedited_answers_total{reason="compressed"}. The driver here
// is net/http's HTTP/2 server: registering a gRPC compressor in this test
// binary would change what every grpc-go peer of the other tests announces.
func TestEditedFramePathCompressed(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "driver", "driver.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, _ = zw.Write(gatewaytest.EncodeSandbox(testSandbox(failingID, "failing")))
	_ = zw.Close()
	msg := append([]byte{1, 0, 0, 0, 0}, zb.Bytes()...)
	binary.BigEndian.PutUint32(msg[1:5], uint32(zb.Len()))
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http2.Server{}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() }) // after the proxy's (cleanups run last first)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				srv.ServeConn(c, &http2.ServeConnOpts{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "application/grpc")
					w.Header().Set("Grpc-Encoding", "gzip")
					w.WriteHeader(http.StatusOK)
					_, _ = w.Write(msg)
					w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
				})})
			}()
		}
	}()
	col := startCollector(t, dir, "")
	rp := startProxy(t, proxyConfig(RelayFrame, dir, sock, col.addr))
	col.ship(t, pullFailed(failingID, 2))
	waitFor(t, 10*time.Second, "the failure known to the proxy", func() (bool, string) {
		return rp.p.hub.anyFailures(), ""
	})
	g := dialRawGateway(t, rp.p.cfg.Listen)
	g.call(1, gatewaytest.MethodGet, reqWithUnknown(failingID))
	if !g.waitFor(5*time.Second, func() bool { return g.status[1] != "" }) {
		t.Fatalf("no answer (%v)", g.err)
	}
	g.mu.Lock()
	got, st := g.got[1], g.status[1]
	g.mu.Unlock()
	g.c.Close()
	if st != "0" || !bytes.Equal(got, msg) {
		t.Errorf("compressed answer: status %q, %d bytes, want the driver's %d bytes unedited", st, len(got), len(msg))
	}
	if n := rp.metric(t, "eventpipe_driver_proxy_unedited_answers_total"); n != 1 {
		t.Errorf("unedited_answers_total %v, want 1", n)
	}
}
