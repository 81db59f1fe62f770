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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

// rawGateway is a gateway on a raw HTTP/2 framer that keeps to the
// driver's flow control when it sends and grants its own receive windows
// only when told (grpc-go grants on receipt, so it cannot leave answers
// unread the way an h2/hyper gateway does).
type rawGateway struct {
	t  *testing.T
	c  net.Conn
	bw *bufio.Writer
	fr *http2.Framer

	wmu sync.Mutex // writes

	mu      sync.Mutex
	cond    *sync.Cond
	conn    int64            // send window towards the driver (connection)
	init    int64            // the driver's SETTINGS_INITIAL_WINDOW_SIZE
	streams map[uint32]int64 // send windows per stream
	got     map[uint32][]byte
	status  map[uint32]string // grpc-status of ended streams
	headers map[uint32]bool   // streams whose response headers came
	tonly   map[uint32]bool   // streams answered trailers-only (first header block ended the stream)
	recv    int64             // DATA bytes received in all
	auto    map[uint32]bool   // streams whose DATA is granted back at once
	err     error
	// Receive windows (connection, per stream) the gateway granted, as a
	// strict HTTP/2 peer keeps them: DATA beyond them sets flowErr (an h2
	// gateway would end the connection with FLOW_CONTROL_ERROR).
	rconn    int64
	rstreams map[uint32]int64
	flowErr  error
	enc      *hpack.Encoder
	hb       bytes.Buffer
}

func dialRawGateway(t *testing.T, path string) *rawGateway {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	g := &rawGateway{t: t, c: c, bw: bufio.NewWriter(c), conn: 65535, init: 65535,
		streams: map[uint32]int64{}, got: map[uint32][]byte{}, status: map[uint32]string{}, auto: map[uint32]bool{},
		headers: map[uint32]bool{}, tonly: map[uint32]bool{}, rconn: 65535, rstreams: map[uint32]int64{}}
	g.cond = sync.NewCond(&g.mu)
	g.fr = http2.NewFramer(g.bw, bufio.NewReader(c))
	g.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	g.enc = hpack.NewEncoder(&g.hb)
	g.bw.WriteString(http2.ClientPreface)
	_ = g.fr.WriteSettings()
	_ = g.bw.Flush()
	go g.read()
	return g
}

func (g *rawGateway) read() {
	for {
		f, err := g.fr.ReadFrame()
		g.mu.Lock()
		if err != nil {
			g.err = err
			g.cond.Broadcast()
			g.mu.Unlock()
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
					for sid := range g.streams {
						g.streams[sid] += int64(v) - g.init
					}
					g.init = int64(v)
				}
				g.write(func() { _ = g.fr.WriteSettingsAck() })
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				g.write(func() { _ = g.fr.WritePing(true, f.Data) })
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				g.conn += int64(f.Increment)
			} else {
				g.streams[f.StreamID] += int64(f.Increment)
			}
		case *http2.DataFrame:
			g.got[f.StreamID] = append(g.got[f.StreamID], f.Data()...)
			g.recv += int64(f.Length)
			g.rconn -= int64(f.Length)
			g.rstreams[f.StreamID] -= int64(f.Length)
			if g.flowErr == nil && (g.rconn < 0 || g.rstreams[f.StreamID] < 0) {
				g.flowErr = fmt.Errorf("DATA of %d bytes on stream %d beyond the windows: connection %d, stream %d after it",
					f.Length, f.StreamID, g.rconn, g.rstreams[f.StreamID])
			}
			if n := f.Length; g.auto[f.StreamID] && n > 0 {
				g.rconn += int64(n)
				g.rstreams[f.StreamID] += int64(n)
				g.write(func() {
					_ = g.fr.WriteWindowUpdate(0, n)
					_ = g.fr.WriteWindowUpdate(f.StreamID, n)
				})
			}
		case *http2.MetaHeadersFrame:
			if !g.headers[f.StreamID] && f.StreamEnded() {
				g.tonly[f.StreamID] = true
			}
			g.headers[f.StreamID] = true
			for _, hf := range f.RegularFields() {
				if hf.Name == "grpc-status" {
					g.status[f.StreamID] = hf.Value
				}
			}
		case *http2.RSTStreamFrame:
			if _, ok := g.status[f.StreamID]; !ok { // a reset after the answer keeps its status
				g.status[f.StreamID] = "rst:" + f.ErrCode.String()
			}
		case *http2.GoAwayFrame:
			g.err = errGoAway
		}
		g.cond.Broadcast()
		g.mu.Unlock()
	}
}

var errGoAway = net.ErrClosed

// write runs fn under the write lock and flushes (g.mu may be held: the
// reader answers SETTINGS and PINGs).
func (g *rawGateway) write(fn func()) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	fn()
	_ = g.bw.Flush()
}

// grant opens the gateway's receive window of stream sid (0: the
// connection) by n.
func (g *rawGateway) grant(sid uint32, n uint32) {
	g.mu.Lock()
	if sid == 0 {
		g.rconn += int64(n)
	} else {
		g.rstreams[sid] += int64(n)
	}
	g.mu.Unlock()
	g.write(func() { _ = g.fr.WriteWindowUpdate(sid, n) })
}

// call opens stream sid on method and sends one message, keeping to the
// driver's windows; it waits for them without holding up the reader.
func (g *rawGateway) call(sid uint32, method string, body []byte) { g.callEnd(sid, method, body, true) }

// callEnd is call, ending the request stream or leaving it open.
func (g *rawGateway) callEnd(sid uint32, method string, body []byte, end bool) {
	g.mu.Lock()
	g.streams[sid] += g.init
	g.rstreams[sid] += 65535 // the gateway's SETTINGS: HTTP/2's default window
	g.mu.Unlock()
	g.write(func() {
		g.hb.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: method},
			{Name: ":authority", Value: "localhost"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		} {
			_ = g.enc.WriteField(f)
		}
		_ = g.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: g.hb.Bytes(), EndHeaders: true})
	})
	msg := make([]byte, 5+len(body))
	binary.BigEndian.PutUint32(msg[1:], uint32(len(body)))
	copy(msg[5:], body)
	for len(msg) > 0 {
		g.mu.Lock()
		for g.err == nil && (g.conn <= 0 || g.streams[sid] <= 0) {
			g.cond.Wait()
		}
		if g.err != nil {
			g.mu.Unlock()
			return
		}
		n := min(int64(len(msg)), g.conn, g.streams[sid], 16384)
		g.conn -= n
		g.streams[sid] -= n
		g.mu.Unlock()
		part := msg[:n]
		msg = msg[n:]
		g.write(func() { _ = g.fr.WriteData(sid, end && len(msg) == 0, part) })
	}
}

// waitFor waits up to d for cond (g.mu held while it runs).
func (g *rawGateway) waitFor(d time.Duration, cond func() bool) bool {
	timer := time.AfterFunc(d, func() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer timer.Stop()
	deadline := time.Now().Add(d)
	g.mu.Lock()
	defer g.mu.Unlock()
	for !cond() {
		if g.err != nil || time.Now().After(deadline) {
			return false
		}
		g.cond.Wait()
	}
	return true
}

// TestHeldAnswersDoNotBlock: the gateway leaves two streaming answers
// unread until its connection window is spent, then uploads 300 KB on a
// third call that the driver answers without DATA (FailedPrecondition).
// Directly, the driver's WINDOW_UPDATEs and that answer are not
// flow-controlled and arrive; through the proxy they must too (the frame
// relay once waited for the gateway's window before the next DATA frame,
// holding everything behind it). Then the held answers are read in full.
// testenv/h2peer's hol is the same with the Rust h2 crate.
func TestHeldAnswersDoNotBlock(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	col := startCollector(t, dir, "")
	rp := startProxy(t, proxyConfig(dir, drv.Path, col.addr))
	for _, path := range []string{drv.Path, rp.p.cfg.Listen} {
		via := map[bool]string{true: "direct", false: "through the proxy"}[path == drv.Path]
		g := dialRawGateway(t, path)
		held := [][]byte{bytes.Repeat([]byte("a"), 60000), bytes.Repeat([]byte("b"), 60000)}
		g.call(1, gatewaytest.MethodUnknownSv, held[0])
		g.call(3, gatewaytest.MethodUnknownSv, held[1])
		// 120 KB of answers against a 64 KiB window: the first fills
		// most of it, the rest waits.
		if !g.waitFor(5*time.Second, func() bool { return g.recv >= 60000 }) {
			t.Fatalf("%s: the held answers did not arrive (%d bytes, %v)", via, g.recv, g.err)
		}
		time.Sleep(200 * time.Millisecond) // the driver has sent all it may
		done := make(chan struct{})
		go func() { g.call(5, gatewaytest.MethodStop, bytes.Repeat([]byte("u"), 300000)); close(done) }()
		ok := g.waitFor(5*time.Second, func() bool { _, ok := g.status[5]; return ok })
		g.mu.Lock()
		st := g.status[5]
		g.mu.Unlock()
		if !ok || st != "9" {
			t.Errorf("%s: the upload call: grpc-status %q (answered: %v), want 9 while answers are held", via, st, ok)
		}
		// Read the held answers: grant the windows back.
		for _, sid := range []uint32{0, 1, 3} {
			g.grant(sid, 1<<20)
		}
		if !g.waitFor(5*time.Second, func() bool { return g.status[1] != "" && g.status[3] != "" }) {
			t.Fatalf("%s: held answers did not end: %v (%v)", via, g.status, g.err)
		}
		g.mu.Lock()
		for i, sid := range []uint32{1, 3} {
			b := g.got[sid]
			if g.status[sid] != "0" || len(b) < 5 || !bytes.HasPrefix(b[5:], held[i]) || !strings.Contains(string(b), "echo:") {
				t.Errorf("%s: held stream %d: status %q, %d bytes", via, sid, g.status[sid], len(b))
			}
		}
		g.mu.Unlock()
		g.c.Close()
		<-done
	}
}

// TestHeldAnswerWindowSplit: one answer the gateway leaves unread takes
// all but about 5 KB of its 64 KiB connection window; the gateway then
// reads another call's 40 KB answer as it comes. Directly the driver sends
// what fits and the reads free the rest; through the proxy a DATA frame
// larger than the window left must be split the same way, not wait whole
// for a window that only this stream's reads would free.
func TestHeldAnswerWindowSplit(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	col := startCollector(t, dir, "")
	rp := startProxy(t, proxyConfig(dir, drv.Path, col.addr))
	for _, path := range []string{drv.Path, rp.p.cfg.Listen} {
		via := map[bool]string{true: "direct", false: "through the proxy"}[path == drv.Path]
		g := dialRawGateway(t, path)
		g.call(1, gatewaytest.MethodUnknownSv, bytes.Repeat([]byte("a"), 60000))
		if !g.waitFor(5*time.Second, func() bool { return g.recv >= 60000 }) {
			t.Fatalf("%s: the held answer did not arrive (%d bytes, %v)", via, g.recv, g.err)
		}
		g.mu.Lock()
		g.auto[3] = true
		g.mu.Unlock()
		body := bytes.Repeat([]byte("c"), 40000)
		g.call(3, gatewaytest.MethodUnknownSv, body)
		if !g.waitFor(5*time.Second, func() bool { return g.status[3] != "" }) {
			g.mu.Lock()
			t.Errorf("%s: the read answer did not end: %d of %d bytes (%v)", via, len(g.got[3]), len(body), g.err)
			g.mu.Unlock()
		} else {
			g.mu.Lock()
			if b := g.got[3]; g.status[3] != "0" || len(b) < 5 || !bytes.HasPrefix(b[5:], body) {
				t.Errorf("%s: the read answer: status %q, %d bytes", via, g.status[3], len(b))
			}
			g.mu.Unlock()
		}
		g.c.Close()
	}
}

// TestHeldAnswerThenReset: with the gateway's connection window spent by
// two unread answers, a unary call whose request stream the gateway has
// not ended is answered by the driver and then reset with NO_ERROR (what
// grpc-go does, RFC 9113 8.1). Directly the reset comes after the answer;
// through the proxy the held answer must not be dropped for the reset.
func TestHeldAnswerThenReset(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	col := startCollector(t, dir, "")
	rp := startProxy(t, proxyConfig(dir, drv.Path, col.addr))
	direct := dialT(t, drv.Path)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	want, err := direct.Unary(ctx, gatewaytest.MethodCaps, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{drv.Path, rp.p.cfg.Listen} {
		via := map[bool]string{true: "direct", false: "through the proxy"}[path == drv.Path]
		g := dialRawGateway(t, path)
		g.call(1, gatewaytest.MethodUnknownSv, bytes.Repeat([]byte("a"), 60000))
		g.call(3, gatewaytest.MethodUnknownSv, bytes.Repeat([]byte("b"), 60000))
		if !g.waitFor(5*time.Second, func() bool { return g.recv >= 65535 }) {
			t.Fatalf("%s: the held answers did not arrive (%d bytes, %v)", via, g.recv, g.err)
		}
		time.Sleep(200 * time.Millisecond)
		g.callEnd(5, gatewaytest.MethodCaps, nil, false)
		time.Sleep(300 * time.Millisecond) // answered and reset by now
		g.grant(0, 1<<20)
		if !g.waitFor(5*time.Second, func() bool { return g.status[5] != "" }) {
			t.Fatalf("%s: no answer on stream 5: %v (%v)", via, g.status, g.err)
		}
		g.mu.Lock()
		b := g.got[5]
		if g.status[5] != "0" || len(b) < 5 || !bytes.Equal(b[5:], want.Bodies[0]) {
			t.Errorf("%s: stream 5 got %d bytes (status %q), want the driver's answer (%d bytes)", via, len(b), g.status[5], 5+len(want.Bodies[0]))
		}
		g.mu.Unlock()
		g.c.Close()
	}
}

// TestGatewayWritesWhileNotReading: a gateway that sends 8 MiB on a stream
// without reading meanwhile (h2, under tonic, stops reading its socket
// while its writes are blocked), to a driver that echoes as it reads, with
// windows big enough for all of it. Directly the driver keeps reading
// while its answers wait in the socket, so the upload completes and the
// answers are read after. Through the proxy the same (the removed frame
// relay once deadlocked here: its gateway reader waited for the gateway
// write lock while the driver reader held it, stuck writing to the
// gateway).
func TestGatewayWritesWhileNotReading(t *testing.T) {
	dir := shortDir(t)
	drv, err := gatewaytest.StartDriver(dir+"/driver/driver.sock", grpc.InitialWindowSize(16<<20), grpc.InitialConnWindowSize(16<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drv.Stop)
	col := startCollector(t, dir, "")
	rp := startProxy(t, proxyConfig(dir, drv.Path, col.addr))
	for _, path := range []string{drv.Path, rp.p.cfg.Listen} {
		via := map[bool]string{true: "direct", false: "through the proxy"}[path == drv.Path]
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		// A stall detector, not a speed check: 8 MiB each way takes under
		// a second when idle, and one run at load 40 needed more than 15 s.
		_ = c.SetDeadline(time.Now().Add(90 * time.Second))
		bw := bufio.NewWriterSize(c, 64<<10)
		fr := http2.NewFramer(bw, bufio.NewReader(c))
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		bw.WriteString(http2.ClientPreface)
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 16 << 20})
		_ = fr.WriteWindowUpdate(0, 16<<20)
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: gatewaytest.MethodUnknownSv},
			{Name: ":authority", Value: "localhost"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		} {
			_ = enc.WriteField(f)
		}
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
		const msgs, size = 16, 512 << 10
		var werr error
		for i := 0; i < msgs && werr == nil; i++ {
			msg := make([]byte, 5+size)
			binary.BigEndian.PutUint32(msg[1:], size)
			for j := 0; len(msg) > 0 && werr == nil; j++ {
				n := min(len(msg), 16384)
				werr = fr.WriteData(1, i == msgs-1 && n == len(msg), msg[:n])
				msg = msg[n:]
				if j%16 == 15 && werr == nil {
					// Pauses, so the relay's gateway reader runs dry
					// (and flushes) while the answers pile up.
					werr = bw.Flush()
					time.Sleep(time.Millisecond)
				}
			}
		}
		if werr == nil {
			werr = bw.Flush()
		}
		if werr != nil {
			t.Fatalf("%s: writing 8 MiB without reading: %v", via, werr)
		}
		got, status := 0, ""
		for status == "" {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("%s: reading the answers: %v (%d bytes so far)", via, err, got)
			}
			switch f := f.(type) {
			case *http2.DataFrame:
				got += len(f.Data())
			case *http2.MetaHeadersFrame:
				for _, hf := range f.RegularFields() {
					if hf.Name == "grpc-status" {
						status = hf.Value
					}
				}
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
			}
		}
		if status != "0" || got < msgs*(5+size) {
			t.Errorf("%s: status %q, %d answer bytes, want OK and %d+", via, status, got, msgs*(5+size))
		}
		c.Close()
	}
}

// TestHeadersThenStatusKept: a driver that answers with response headers
// (empty: no metadata) and then a status, while the gateway is still
// sending its request, gives the gateway the same two header blocks
// through the proxy, on the stream path and the unary path. A
// trailers-only answer here would be followed by grpc-go's
// RST_STREAM(NO_ERROR), which a client must survive
// (TestH2TrailersOnlyResetNoError) but which changes what the gateway
// sees. Checked while looking for the cause of seed 1796412189666667297 of
// TestRelaySoakH2: the proxy already kept the two blocks (it fails when the
// proxy sends the status alone).
func TestHeadersThenStatusKept(t *testing.T) {
	dir := shortDir(t)
	early := func(method string, ss grpc.ServerStream) (bool, error) {
		if !strings.HasSuffix(method, "/EarlyStatus") && !strings.HasSuffix(method, "/CreateSandbox") {
			return false, nil
		}
		if err := ss.SendHeader(metadata.MD{}); err != nil {
			return true, err
		}
		return true, status.Error(codes.FailedPrecondition, "answered before the request ended")
	}
	drv, err := gatewaytest.StartDriverHook(dir+"/driver/driver.sock", early)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drv.Stop)
	rp := startProxy(t, proxyConfig(dir, drv.Path, "127.0.0.1:1"))
	for _, path := range []string{drv.Path, rp.p.cfg.Listen} {
		via := map[bool]string{true: "direct", false: "through the proxy"}[path == drv.Path]
		g := dialRawGateway(t, path)
		for i, method := range []string{gatewaytest.Prefix + "EarlyStatus", gatewaytest.Prefix + "CreateSandbox"} {
			sid := uint32(2*i + 1)
			g.callEnd(sid, method, []byte("request, not ended"), false)
			if !g.waitFor(5*time.Second, func() bool { return g.status[sid] != "" }) {
				t.Fatalf("%s %s: no status (%v)", via, method, g.err)
			}
			g.mu.Lock()
			st, tonly := g.status[sid], g.tonly[sid]
			g.mu.Unlock()
			if st != "9" {
				t.Errorf("%s %s: grpc-status %q, want 9 (FailedPrecondition)", via, method, st)
			}
			if tonly {
				t.Errorf("%s %s: a trailers-only answer; the driver sent headers, then the status", via, method)
			}
		}
	}
}
