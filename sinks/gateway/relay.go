package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"

	"github.com/eventpipe/eventpipe/sinks/gateway/driverwire"
)

// The frame relay (relay: frame) is the intercepting design of
// bench/gateway.md: every gateway connection gets its own driver
// connection, and two goroutines copy HTTP/2 frames between them, one per
// direction, so a forwarded call costs one wake-up per hop. Only
// WatchSandboxes is not forwarded (intercepted): the relay answers it
// itself through the proxy's gRPC client leg (Proxy.handle, as in grpc
// mode). GetSandbox and ListSandboxes are forwarded, and their answers
// edited on the frame path while a pull failure is active (relayedit.go:
// for those streams the relay is the flow-control endpoint towards both
// sides).
//
// What that takes, and where it is done:
//
//   - Gateway -> driver header blocks are decoded (the gateway's HPACK
//     state) and re-encoded with the relay's own encoder (the driver's
//     state), because the blocks of intercepted streams never reach the
//     driver. Driver -> gateway blocks are decoded too (grpc-status for the
//     metrics) and re-encoded with the relay's encoder towards the gateway,
//     which also writes the relay's own blocks: a driver block may be held
//     behind its stream's DATA (next point) while later ones go out.
//   - Stream flow control of forwarded streams stays end to end (except
//     for answers edited on the frame path, relayedit.go). At the
//     connection level the relay is the endpoint towards the driver: it
//     grants the driver its own window, spends the gateway's window (its
//     SETTINGS and WINDOW_UPDATEs on stream 0) for the driver's DATA and its
//     own alike, and credits the gateway for request DATA of intercepted
//     streams, which the driver never sees. Driver DATA the gateway's
//     window cannot take yet is held with the rest of its stream, never
//     holding up other streams' frames (see fromDriver).
//   - A reader never waits for the other direction's write lock: frames it
//     sends back to its own peer go through ctlQueue and ctlWriter.
//   - SETTINGS, PING, PRIORITY, GOAWAY (last stream id raised over open
//     intercepted streams), RST_STREAM, WINDOW_UPDATE and unknown frames
//     pass through; frames on intercepted streams stop at the relay.
const (
	relayBufBytes   = 64 << 10
	maxFramePayload = 16384 // what the relay writes; every peer accepts it
	creditEvery     = 8192  // request bytes of intercepted streams credited in batches
	driverConnGrant = connWindow
)

// Settings identifiers the relay reads.
const (
	settingHeaderTableSize   = 0x1
	settingInitialWindowSize = 0x4
)

// relayConn is one gateway connection and its driver connection.
type relayConn struct {
	p      *Proxy
	id     uint64
	g, d   net.Conn
	gr, dr *bufio.Reader

	gmu sync.Mutex // guards gw, gfr (writes to the gateway)
	gw  *bufio.Writer
	gfr *http2.Framer
	dmu sync.Mutex // guards dw, dfr (writes to the driver)
	dw  *bufio.Writer
	dfr *http2.Framer
	// Frames a reader sends back to its own peer (credits, PING acks,
	// refusals, held-frame drains) go through these queues and their
	// writer goroutines (ctlWriter), never through the other direction's
	// write lock: that lock may be held by the other reader, stuck writing
	// to a peer that stopped reading because its own writes are stuck
	// (h2 does), and the reader waiting for it would stop reading that
	// peer: a deadlock (testenv/h2peer, 3 MiB both ways at once).
	gq, dq  *ctlQueue
	writers sync.WaitGroup
	editors sync.WaitGroup // editAsync goroutines

	// Owned by the gateway reader.
	decG   *hpack.Decoder
	encD   *hpack.Encoder
	encBuf bytes.Buffer
	fields []hpack.HeaderField
	// Owned by the driver reader.
	decD        *hpack.Decoder
	endStatus   string
	dfields     []hpack.HeaderField
	dfieldsHeld bool
	// Driver frames held for the gateway's connection window (rc.gmu
	// held; see fromDriver), and how many (rc.mu).
	pend      map[uint32][]pendFrame
	pendOrder []uint32
	// The relay's own header blocks to the gateway (rc.gmu held).
	gEnc    *hpack.Encoder
	gEncBuf bytes.Buffer

	ctx    context.Context
	cancel context.CancelFunc

	mu   sync.Mutex
	cond *sync.Cond
	// gwConn is the gateway's connection window left for bytes towards
	// it; gwInit its SETTINGS_INITIAL_WINDOW_SIZE (intercepted streams).
	gwConn, gwInit int64
	owed           int64 // driver DATA forwarded, not yet granted back to it
	ownCredit      int64 // intercepted request bytes not yet credited to the gateway
	own            map[uint32]*ownStream
	ownDone        map[uint32]struct{} // answered intercepted streams (see lateOwn)
	ownDoneOrder   []uint32
	fwd            map[uint32]fwdStream
	edits          map[uint32]*editStream // answers edited on the frame path (relayedit.go)
	maxStream      uint32                 // highest stream id the gateway opened
	goaway         bool                   // a GOAWAY went to the gateway
	goawayLast     uint32
	closed         bool
	pendFrames     int
	// Table sizes announced by one side, applied by the other side's
	// reader before its next header block.
	driverTable, gatewayTable uint32
	driverTableSet            bool
	gatewayTableSet           bool
	// The gateway's table size for the relay's encoder towards it.
	gwEncTable    uint32
	gwEncTableSet bool
}

// fwdStream is a forwarded call, for rpcs_total and rpc_duration_seconds.
type fwdStream struct {
	method string
	start  time.Time
	wu     int64 // Get/List: stream WINDOW_UPDATEs of the gateway passed to the driver
}

// serveFrames relays one accepted gateway connection until either side
// closes or ctx ends (then gracefully: GOAWAY, open calls finish within
// the shutdown grace).
func (p *Proxy) serveFrames(ctx context.Context, g net.Conn) {
	id := uint64(0)
	if a, ok := g.RemoteAddr().(connAddr); ok {
		id = uint64(a)
	}
	id = p.handoffs.take(id)
	d, err := net.DialTimeout("unix", p.cfg.Driver, time.Second)
	if err != nil {
		p.handoffs.put(id)
		p.refuseConn(g, fmt.Errorf("driver %s: %w", p.cfg.Driver, err))
		return
	}
	rc := newRelayConn(p, id, g, d)
	defer rc.cancel()
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			rc.shutdown()
		case <-done:
		}
	}()
	rc.writers.Add(2)
	go rc.ctlWriter(rc.gq, &rc.gmu, rc.gw, true)
	go rc.ctlWriter(rc.dq, &rc.dmu, rc.dw, false)
	errc := make(chan error, 2)
	driverEnded := make(chan struct{})
	go func() { errc <- rc.fromGateway() }()
	go func() { errc <- rc.fromDriver(); close(driverEnded) }()
	err = <-errc
	select {
	case <-driverEnded:
		// The driver side ended first: the gateway will redial, and is
		// the same gateway.
		if ctx.Err() == nil {
			p.handoffs.put(id)
		}
	default:
	}
	rc.close()
	<-errc
	rc.writers.Wait()
	rc.editors.Wait()
	close(done)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		p.log.Debug("frame relay connection ended", "conn", id, "err", err)
	}
}

// handoffs carry a gateway connection's identity (Proxy.hub's per-connection
// dedupe) to the gateway's next connection when the relay, not the
// gateway, ended the first one because the driver went away: in frame
// mode the gateway's connection follows the driver's, and a redial after a
// driver restart is the same gateway, which must not get the tail again.
// An identity not taken within handoffTTL lapses (a gateway that
// restarted in that moment is taken for the old one and misses the tail,
// as after a proxy restart).
type handoffs struct {
	mu  sync.Mutex
	ids []handoff
}

type handoff struct {
	id    uint64
	until time.Time
}

const handoffTTL = 30 * time.Second

func (h *handoffs) put(id uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ids = append(h.ids, handoff{id, time.Now().Add(handoffTTL)})
}

// take returns the oldest live handed-off identity, or id.
func (h *handoffs) take(id uint64) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	for len(h.ids) > 0 {
		o := h.ids[0]
		h.ids = h.ids[1:]
		if time.Now().Before(o.until) {
			return o.id
		}
	}
	return id
}

func newRelayConn(p *Proxy, id uint64, g, d net.Conn) *relayConn {
	rc := &relayConn{
		p: p, id: id, g: g, d: d,
		gr: bufio.NewReaderSize(g, relayBufBytes), dr: bufio.NewReaderSize(d, relayBufBytes),
		gw: bufio.NewWriterSize(g, relayBufBytes), dw: bufio.NewWriterSize(d, relayBufBytes),
		gwConn: 65535, gwInit: 65535,
		own: map[uint32]*ownStream{}, ownDone: map[uint32]struct{}{}, fwd: map[uint32]fwdStream{},
		edits: map[uint32]*editStream{},
		pend:  map[uint32][]pendFrame{},
	}
	rc.cond = sync.NewCond(&rc.mu)
	rc.gq, rc.dq = newCtlQueue(), newCtlQueue()
	rc.gfr = http2.NewFramer(rc.gw, nil)
	rc.dfr = http2.NewFramer(rc.dw, nil)
	rc.decG = hpack.NewDecoder(4096, func(f hpack.HeaderField) { rc.fields = append(rc.fields, f) })
	rc.encD = hpack.NewEncoder(&rc.encBuf)
	rc.gEnc = hpack.NewEncoder(&rc.gEncBuf)
	rc.decD = hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == "grpc-status" {
			rc.endStatus = f.Value
		}
		rc.dfields = append(rc.dfields, f)
	})
	rc.ctx, rc.cancel = context.WithCancel(context.Background())
	return rc
}

// close ends both connections and every intercepted stream.
func (rc *relayConn) close() {
	rc.mu.Lock()
	if rc.closed {
		rc.mu.Unlock()
		return
	}
	rc.closed = true
	for sid, f := range rc.fwd {
		rc.p.metrics.rpcs.WithLabelValues(rpcLabel(f.method), codes.Unavailable.String()).Inc()
		delete(rc.fwd, sid)
	}
	rc.cond.Broadcast()
	rc.mu.Unlock()
	rc.cancel()
	rc.g.Close()
	rc.d.Close()
}

// shutdown tells the gateway to open no more streams here, lets open
// calls finish (intercepted WatchSandboxes streams end at once with
// UNAVAILABLE through Proxy.stopping), and closes the connection after
// the shutdown grace at the latest.
func (rc *relayConn) shutdown() {
	rc.mu.Lock()
	last := rc.maxStream
	if rc.goaway {
		last = min(last, rc.goawayLast)
	}
	rc.goaway, rc.goawayLast = true, last
	rc.mu.Unlock()
	rc.gmu.Lock()
	_ = rc.gfr.WriteGoAway(last, http2.ErrCodeNo, []byte("eventpipe driver-proxy shutting down"))
	_ = rc.gw.Flush()
	rc.gmu.Unlock()
	deadline := time.Now().Add(rc.p.cfg.ShutdownGrace)
	for time.Now().Before(deadline) {
		rc.mu.Lock()
		open := len(rc.fwd) + len(rc.own)
		closed := rc.closed
		rc.mu.Unlock()
		if open == 0 || closed {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	rc.close()
}

// frameHeader is a raw 9-byte frame header.
type frameHeader [9]byte

func (h *frameHeader) length() uint32       { return uint32(h[0])<<16 | uint32(h[1])<<8 | uint32(h[2]) }
func (h *frameHeader) typ() http2.FrameType { return http2.FrameType(h[3]) }
func (h *frameHeader) flags() http2.Flags   { return http2.Flags(h[4]) }
func (h *frameHeader) stream() uint32       { return binary.BigEndian.Uint32(h[5:9]) & 0x7fffffff }

// readFrame reads one frame into buf (grown as needed).
func readFrame(r *bufio.Reader, h *frameHeader, buf []byte) ([]byte, error) {
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return buf, err
	}
	n := int(h.length())
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	_, err := io.ReadFull(r, buf)
	return buf, err
}

// headerFragment is the header block fragment of a HEADERS payload.
func headerFragment(h *frameHeader, p []byte) ([]byte, error) {
	if h.flags().Has(http2.FlagHeadersPadded) {
		if len(p) < 1 || int(p[0]) > len(p)-1 {
			return nil, errors.New("HEADERS: bad padding")
		}
		pad := int(p[0])
		p = p[1 : len(p)-pad]
	}
	if h.flags().Has(http2.FlagHeadersPriority) {
		if len(p) < 5 {
			return nil, errors.New("HEADERS: short priority")
		}
		p = p[5:]
	}
	return p, nil
}

// dataPayload strips DATA padding.
func dataPayload(h *frameHeader, p []byte) ([]byte, error) {
	if h.flags().Has(http2.FlagDataPadded) {
		if len(p) < 1 || int(p[0]) > len(p)-1 {
			return nil, errors.New("DATA: bad padding")
		}
		return p[1 : len(p)-int(p[0])], nil
	}
	return p, nil
}

// readBlock reads a header block: the HEADERS frame h/p and its
// CONTINUATIONs. raw gets every frame verbatim (when non-nil).
func readBlock(r *bufio.Reader, h *frameHeader, p []byte, block, raw *bytes.Buffer) error {
	frag, err := headerFragment(h, p)
	if err != nil {
		return err
	}
	block.Write(frag)
	if raw != nil {
		raw.Write(h[:])
		raw.Write(p)
	}
	end := h.flags().Has(http2.FlagHeadersEndHeaders)
	var ch frameHeader
	var cp []byte
	for !end {
		if cp, err = readFrame(r, &ch, cp); err != nil {
			return err
		}
		if ch.typ() != http2.FrameContinuation || ch.stream() != h.stream() {
			return fmt.Errorf("header block of stream %d interrupted by a %s frame", h.stream(), ch.typ())
		}
		block.Write(cp)
		if raw != nil {
			raw.Write(ch[:])
			raw.Write(cp)
		}
		end = ch.flags().Has(http2.FlagContinuationEndHeaders)
	}
	return nil
}

// settings calls fn for each (id, value) of a SETTINGS payload.
func settings(p []byte, fn func(id uint16, v uint32)) {
	for ; len(p) >= 6; p = p[6:] {
		fn(binary.BigEndian.Uint16(p), binary.BigEndian.Uint32(p[2:]))
	}
}

// intercepted: the method the relay answers through the gRPC client leg.
// Get and List are forwarded and their answers edited on the frame path
// (relayedit.go).
func (rc *relayConn) intercepted(method string) bool {
	return method == driverwire.MethodWatchSandboxes
}

// fromGateway reads the gateway's frames and forwards them to the driver.
func (rc *relayConn) fromGateway() error {
	pre := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(rc.gr, pre); err != nil {
		return err
	}
	if string(pre) != http2.ClientPreface {
		return errors.New("gateway did not send the HTTP/2 client preface")
	}
	rc.dmu.Lock()
	rc.dw.Write(pre)
	rc.dmu.Unlock()
	granted := false

	var h frameHeader
	var buf []byte
	var block bytes.Buffer
	var err error
	for {
		if rc.gr.Buffered() == 0 {
			if err := rc.flushBoth(); err != nil {
				return err
			}
		}
		if buf, err = readFrame(rc.gr, &h, buf); err != nil {
			return err
		}
		sid := h.stream()
		if sid != 0 && h.typ() != http2.FrameHeaders && rc.lateOwn(&h) {
			continue
		}
		switch h.typ() {
		case http2.FrameHeaders:
			block.Reset()
			if err := readBlock(rc.gr, &h, buf, &block, nil); err != nil {
				return err
			}
			if err := rc.gatewayHeaders(&h, block.Bytes()); err != nil {
				return err
			}
		case http2.FrameContinuation:
			return errors.New("gateway sent a CONTINUATION without HEADERS")
		case http2.FrameData:
			rc.mu.Lock()
			st := rc.own[sid]
			rc.mu.Unlock()
			if st == nil {
				rc.forwardRaw(&rc.dmu, rc.dw, &h, buf)
				continue
			}
			data, err := dataPayload(&h, buf)
			if err != nil {
				return err
			}
			end := h.flags().Has(http2.FlagDataEndStream)
			st.addRequest(data, end)
			rc.creditGateway(sid, int64(h.length()), end)
		case http2.FrameWindowUpdate:
			if len(buf) != 4 {
				return errors.New("WINDOW_UPDATE: bad length")
			}
			inc := int64(binary.BigEndian.Uint32(buf) & 0x7fffffff)
			rc.mu.Lock()
			if sid == 0 {
				rc.gwConn += inc
				rc.cond.Broadcast()
				held := rc.pendFrames > 0
				rc.mu.Unlock()
				if held {
					rc.gq.drainHeld()
				}
				continue
			}
			if st := rc.own[sid]; st != nil {
				st.window += inc
				rc.cond.Broadcast()
				rc.mu.Unlock()
				continue
			}
			if es := rc.edits[sid]; es != nil {
				// Not the driver's: the relay writes the stream's DATA.
				es.window += inc
				rc.mu.Unlock()
				rc.gq.drainHeld()
				continue
			}
			if f, ok := rc.fwd[sid]; ok && editedMethod(f.method) {
				f.wu += inc // the window an edit would start from
				rc.fwd[sid] = f
			}
			rc.mu.Unlock()
			rc.forwardRaw(&rc.dmu, rc.dw, &h, buf)
		case http2.FrameRSTStream:
			rc.mu.Lock()
			st := rc.own[sid]
			if f, ok := rc.fwd[sid]; ok {
				rc.endForwarded(sid, f, codes.Canceled.String())
			}
			if es := rc.edits[sid]; es != nil {
				es.dropped = true
				delete(rc.edits, sid)
			}
			rc.mu.Unlock()
			if st != nil {
				st.reset()
				continue
			}
			rc.gq.dropHeld(sid)
			rc.forwardRaw(&rc.dmu, rc.dw, &h, buf)
		case http2.FramePriority:
			rc.mu.Lock()
			st := rc.own[sid]
			rc.mu.Unlock()
			if st == nil {
				rc.forwardRaw(&rc.dmu, rc.dw, &h, buf)
			}
		case http2.FrameSettings:
			if !h.flags().Has(http2.FlagSettingsAck) {
				rc.mu.Lock()
				settings(buf, func(id uint16, v uint32) {
					switch id {
					case settingInitialWindowSize:
						delta := int64(v) - rc.gwInit
						rc.gwInit = int64(v)
						for _, st := range rc.own {
							st.window += delta
						}
						for _, es := range rc.edits {
							es.window += delta
						}
					case settingHeaderTableSize:
						rc.gatewayTable, rc.gatewayTableSet = v, true
						rc.gwEncTable, rc.gwEncTableSet = v, true
					}
				})
				rc.cond.Broadcast()
				edits := len(rc.edits) > 0
				rc.mu.Unlock()
				if edits {
					rc.gq.drainHeld() // their windows may have grown
				}
			}
			rc.forwardRaw(&rc.dmu, rc.dw, &h, buf)
			if !granted {
				// The relay is the driver's connection-level flow-control
				// peer; the first frame after the preface must be SETTINGS.
				granted = true
				rc.dmu.Lock()
				_ = rc.dfr.WriteWindowUpdate(0, driverConnGrant-65535)
				rc.dmu.Unlock()
			}
		case http2.FramePing:
			if h.flags().Has(http2.FlagPingAck) {
				rc.forwardRaw(&rc.dmu, rc.dw, &h, buf) // the driver's PING
				continue
			}
			// The relay is the gateway's connection-level peer (flow
			// control above), so it answers the gateway's PINGs itself: a
			// PING the gateway sends because of bytes the relay wrote (its
			// bandwidth probe) must not count against the driver's PING
			// policy (grpc-go servers answer too many with GOAWAY).
			if len(buf) == 8 {
				var d [8]byte
				copy(d[:], buf)
				rc.gq.put(func(fr *http2.Framer) { _ = fr.WritePing(true, d) })
			}
		default: // GOAWAY, extension frames
			rc.forwardRaw(&rc.dmu, rc.dw, &h, buf)
		}
	}
}

// lateOwn drops a frame on an intercepted stream that was already
// answered (crediting DATA to the gateway) and reports whether it did.
// Such a frame must never reach the driver: to it the stream id may be
// idle, and a WINDOW_UPDATE or RST_STREAM on an idle stream is a
// connection error.
func (rc *relayConn) lateOwn(h *frameHeader) bool {
	sid := h.stream()
	rc.mu.Lock()
	_, ok := rc.ownDone[sid]
	rc.mu.Unlock()
	if ok && h.typ() == http2.FrameData {
		rc.creditGateway(sid, int64(h.length()), true)
	}
	return ok
}

// markOwnDone remembers an answered intercepted stream (rc.mu held),
// forgetting the oldest beyond maxOwnDone.
func (rc *relayConn) markOwnDone(sid uint32) {
	if _, ok := rc.ownDone[sid]; ok {
		return
	}
	rc.ownDone[sid] = struct{}{}
	rc.ownDoneOrder = append(rc.ownDoneOrder, sid)
	if len(rc.ownDoneOrder) > maxOwnDone {
		delete(rc.ownDone, rc.ownDoneOrder[0])
		rc.ownDoneOrder = rc.ownDoneOrder[1:]
	}
}

// gatewayHeaders handles one decoded gateway header block: a new stream
// (forwarded re-encoded, or intercepted), or trailers of a stream.
func (rc *relayConn) gatewayHeaders(h *frameHeader, block []byte) error {
	rc.mu.Lock()
	if rc.driverTableSet {
		rc.decG.SetAllowedMaxDynamicTableSize(max(rc.driverTable, 4096))
		rc.encD.SetMaxDynamicTableSizeLimit(rc.driverTable)
		rc.driverTableSet = false
	}
	rc.mu.Unlock()
	rc.fields = rc.fields[:0]
	if _, err := rc.decG.Write(block); err != nil {
		return fmt.Errorf("gateway header block: %w", err)
	}
	if err := rc.decG.Close(); err != nil {
		return fmt.Errorf("gateway header block: %w", err)
	}
	sid := h.stream()
	end := h.flags().Has(http2.FlagHeadersEndStream)
	rc.mu.Lock()
	st := rc.own[sid]
	_, known := rc.fwd[sid]
	if _, late := rc.ownDone[sid]; late {
		rc.mu.Unlock()
		return nil
	}
	isNew := st == nil && !known && sid > rc.maxStream
	refused := isNew && rc.goaway && sid > rc.goawayLast
	if isNew {
		rc.maxStream = sid
	}
	rc.mu.Unlock()
	switch {
	case st != nil: // trailers from the gateway on an intercepted stream
		if end {
			st.addRequest(nil, true)
		}
		return nil
	case refused:
		rc.gq.put(func(fr *http2.Framer) { _ = fr.WriteRSTStream(sid, http2.ErrCodeRefusedStream) })
		return nil
	case isNew:
		method, enc := "", ""
		for _, f := range rc.fields {
			switch f.Name {
			case ":path":
				method = f.Value
			case "grpc-encoding":
				enc = f.Value
			}
		}
		if (enc == "" || enc == "identity") && rc.intercepted(method) {
			rc.startOwn(sid, method, rc.fields, end)
			return nil
		}
		rc.mu.Lock()
		rc.fwd[sid] = fwdStream{method: method, start: time.Now()}
		rc.mu.Unlock()
	}
	// Re-encode for the driver: the gateway's table holds entries from
	// blocks the driver never saw.
	rc.encBuf.Reset()
	for _, f := range rc.fields {
		if err := rc.encD.WriteField(f); err != nil {
			return err
		}
	}
	rc.dmu.Lock()
	defer rc.dmu.Unlock()
	return writeBlock(rc.dfr, sid, rc.encBuf.Bytes(), end)
}

// writeBlock writes a header block as HEADERS and CONTINUATION frames.
func writeBlock(fr *http2.Framer, sid uint32, b []byte, end bool) error {
	first := b
	if len(first) > maxFramePayload {
		first = first[:maxFramePayload]
	}
	b = b[len(first):]
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: first, EndStream: end, EndHeaders: len(b) == 0}); err != nil {
		return err
	}
	for len(b) > 0 {
		n := min(len(b), maxFramePayload)
		if err := fr.WriteContinuation(sid, n == len(b), b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func (rc *relayConn) forwardRaw(mu *sync.Mutex, w *bufio.Writer, h *frameHeader, p []byte) {
	mu.Lock()
	w.Write(h[:])
	w.Write(p)
	mu.Unlock()
}

// flushBoth flushes what the gateway reader wrote to the driver (what it
// sends the gateway goes through rc.gq).
func (rc *relayConn) flushBoth() error {
	rc.dmu.Lock()
	err := rc.dw.Flush()
	rc.dmu.Unlock()
	return err
}

// creditGateway returns the window the gateway spent on request DATA of
// an intercepted stream (the driver, which never saw it, will not).
func (rc *relayConn) creditGateway(sid uint32, n int64, end bool) {
	if n == 0 {
		return
	}
	rc.mu.Lock()
	rc.ownCredit += n
	conn := int64(0)
	if rc.ownCredit >= creditEvery {
		conn, rc.ownCredit = rc.ownCredit, 0
	}
	var stream int64
	if st := rc.own[sid]; st != nil && !end {
		st.recvCredit += n
		if st.recvCredit >= creditEvery {
			stream, st.recvCredit = st.recvCredit, 0
		}
	}
	rc.mu.Unlock()
	if conn == 0 && stream == 0 {
		return
	}
	rc.gq.put(func(fr *http2.Framer) {
		if conn > 0 {
			_ = fr.WriteWindowUpdate(0, uint32(conn))
		}
		if stream > 0 {
			_ = fr.WriteWindowUpdate(sid, uint32(stream))
		}
	})
}

// endForwarded records a forwarded call's end (rc.mu held).
func (rc *relayConn) endForwarded(sid uint32, f fwdStream, code string) {
	delete(rc.fwd, sid)
	rc.p.metrics.rpcs.WithLabelValues(rpcLabel(f.method), code).Inc()
	rc.p.metrics.rpcSeconds.WithLabelValues(rpcLabel(f.method)).Observe(time.Since(f.start).Seconds())
}

// fromDriver reads the driver's frames and forwards them to the gateway.
//
// It never waits for the gateway's connection window: a DATA frame that
// does not fit is held (with whatever follows on its stream) and sent
// when the gateway grants more (ctlWriter, drainLocked), while the frames of other
// streams and of the connection go on. Waiting here instead would hold
// the driver's WINDOW_UPDATEs and header blocks behind that DATA, which on
// a direct connection are not flow-controlled: a gateway that uploads
// while it leaves answers unread would stall (testenv/h2peer hol). What
// is held is bounded by the connection window the relay grants the
// driver (driverConnGrant), which it grants back only as DATA is sent on.
// Header blocks are re-encoded for the gateway with the relay's encoder,
// since held blocks no longer go out in the driver's encoding order.
func (rc *relayConn) fromDriver() error {
	var h frameHeader
	var buf []byte
	var block bytes.Buffer
	var err error
	for {
		if rc.dr.Buffered() == 0 {
			rc.gmu.Lock()
			err := rc.gw.Flush()
			rc.gmu.Unlock()
			if err != nil {
				return err
			}
		}
		if buf, err = readFrame(rc.dr, &h, buf); err != nil {
			rc.waitPending()
			return err
		}
		sid := h.stream()
		switch h.typ() {
		case http2.FrameHeaders:
			block.Reset()
			if err := readBlock(rc.dr, &h, buf, &block, nil); err != nil {
				return err
			}
			rc.mu.Lock()
			if rc.gatewayTableSet {
				rc.decD.SetAllowedMaxDynamicTableSize(max(rc.gatewayTable, 4096))
				rc.gatewayTableSet = false
			}
			rc.mu.Unlock()
			rc.endStatus = ""
			if rc.dfieldsHeld { // the last block's fields are held: a fresh slice
				rc.dfields, rc.dfieldsHeld = nil, false
			}
			rc.dfields = rc.dfields[:0]
			if _, err := rc.decD.Write(block.Bytes()); err != nil {
				return fmt.Errorf("driver header block: %w", err)
			}
			if err := rc.decD.Close(); err != nil {
				return fmt.Errorf("driver header block: %w", err)
			}
			end := h.flags().Has(http2.FlagHeadersEndStream)
			es := rc.editOf(sid)
			if es == nil && !end {
				es = rc.startEdit(sid) // response headers of a Get/List call
			} else if es != nil && end {
				// Trailers: the driver ended inside a message (if it did):
				// pass on what came, then the trailers.
				var out []pendFrame
				if es.msg != nil || len(es.hdr) > 0 {
					out = appendDataFrames(nil, es, append(es.hdr, es.msg...), 0)
					es.msg, es.hdr = nil, nil
				}
				if err := rc.emitEdited(es, out, true); err != nil {
					return err
				}
			}
			if end {
				code := codes.Unknown.String()
				if rc.endStatus != "" {
					code = statusLabel(rc.endStatus)
				}
				rc.mu.Lock()
				if f, ok := rc.fwd[sid]; ok {
					rc.endForwarded(sid, f, code)
				}
				rc.mu.Unlock()
			}
			rc.gmu.Lock()
			if rc.holdBehindLocked(sid, es, pendFrame{fields: rc.dfields, end: end}) {
				rc.dfieldsHeld = true
				if es != nil {
					rc.endEditLocked(es)
				}
				rc.gmu.Unlock()
				continue
			}
			err := rc.writeDriverBlockLocked(sid, rc.dfields, end)
			if es != nil {
				rc.endEditLocked(es)
			}
			rc.gmu.Unlock()
			if err != nil {
				return err
			}
		case http2.FrameData:
			rc.mu.Lock()
			if h.flags().Has(http2.FlagDataEndStream) {
				if f, ok := rc.fwd[sid]; ok {
					rc.endForwarded(sid, f, codes.Internal.String()) // no trailers
				}
			}
			es := rc.edits[sid]
			rc.mu.Unlock()
			if es != nil {
				if err := rc.editData(es, &h, buf); err != nil {
					return err
				}
				continue
			}
			n := int64(h.length())
			rc.gmu.Lock()
			// Decided and counted in one step under rc.mu: a gateway
			// WINDOW_UPDATE read meanwhile either comes first (and the
			// frame is sent) or sees the frame held (and drains it).
			rc.mu.Lock()
			sent := len(rc.pend[sid]) == 0 && rc.gwConn >= n
			if sent {
				rc.gwConn -= n
			} else {
				rc.pendFrames++
			}
			rc.mu.Unlock()
			done := int64(0)
			if sent {
				rc.gw.Write(h[:])
				rc.gw.Write(buf)
				done = n
			} else {
				rc.queueLocked(sid, pendFrame{data: true, h: h, p: bytes.Clone(buf), credit: n})
				// What the window has left goes now (a part of the frame).
				done, err = rc.drainLocked()
			}
			rc.gmu.Unlock()
			if err != nil {
				return err
			}
			if err := rc.grantDriver(done); err != nil {
				return err
			}
		case http2.FrameRSTStream:
			rc.mu.Lock()
			if f, ok := rc.fwd[sid]; ok && len(buf) == 4 {
				rc.endForwarded(sid, f, rstLabel(http2.ErrCode(binary.BigEndian.Uint32(buf))))
			}
			rc.mu.Unlock()
			es := rc.editOf(sid)
			if es != nil {
				// What was reassembled of a message dies with the stream.
				es.msg, es.hdr, es.pass = nil, nil, 0
				rc.mu.Lock()
				es.ended = true
				rc.mu.Unlock()
			}
			// Behind what is held for the stream, as on a direct
			// connection: a driver that answered before the request ended
			// resets it with NO_ERROR after a complete answer.
			rc.gmu.Lock()
			if !rc.holdBehindLocked(sid, es, pendFrame{h: h, p: bytes.Clone(buf), raw: true}) {
				rc.gw.Write(h[:])
				rc.gw.Write(buf)
			}
			if es != nil {
				rc.endEditLocked(es)
			}
			rc.gmu.Unlock()
		case http2.FrameGoAway:
			if len(buf) < 8 {
				return errors.New("GOAWAY: short")
			}
			last := binary.BigEndian.Uint32(buf) & 0x7fffffff
			rc.mu.Lock()
			for sid := range rc.own {
				last = max(last, sid)
			}
			if rc.goaway {
				last = min(last, rc.goawayLast)
			}
			rc.goaway, rc.goawayLast = true, last
			rc.mu.Unlock()
			binary.BigEndian.PutUint32(buf, last)
			rc.forwardRaw(&rc.gmu, rc.gw, &h, buf)
		case http2.FrameSettings:
			if !h.flags().Has(http2.FlagSettingsAck) {
				rc.mu.Lock()
				settings(buf, func(id uint16, v uint32) {
					if id == settingHeaderTableSize {
						rc.driverTable, rc.driverTableSet = v, true
					}
				})
				rc.mu.Unlock()
			}
			rc.forwardRaw(&rc.gmu, rc.gw, &h, buf)
		case http2.FrameContinuation:
			return errors.New("driver sent a CONTINUATION without HEADERS")
		case http2.FramePushPromise:
			// gRPC servers do not push, and its header block would have to
			// be re-encoded too.
			return errors.New("driver sent a PUSH_PROMISE")
		case http2.FramePing:
			if !h.flags().Has(http2.FlagPingAck) { // acks: the relay sends the driver no PINGs
				rc.forwardRaw(&rc.gmu, rc.gw, &h, buf)
			}
		default: // WINDOW_UPDATE, PRIORITY, extension frames
			rc.forwardRaw(&rc.gmu, rc.gw, &h, buf)
		}
	}
}

// pendFrame is a driver frame held for the gateway: DATA (h, p), a
// decoded header block (fields, end) or a RST_STREAM (raw).
type pendFrame struct {
	data   bool
	raw    bool // RST_STREAM, sent as it came
	h      frameHeader
	p      []byte
	credit int64 // the driver's connection window the frame took
	fields []hpack.HeaderField
	end    bool
	// DATA of an edited answer (relayedit.go): it also spends es.window,
	// and scredit is the driver's stream window granted back once sent.
	es      *editStream
	scredit int64
}

// holdLocked appends f to what is held for stream sid (rc.gmu held).
func (rc *relayConn) holdLocked(sid uint32, f pendFrame) {
	rc.mu.Lock()
	rc.pendFrames++
	rc.mu.Unlock()
	rc.queueLocked(sid, f)
}

// queueLocked appends f, already counted in rc.pendFrames, to what is
// held for stream sid (rc.gmu held).
func (rc *relayConn) queueLocked(sid uint32, f pendFrame) {
	if len(rc.pend[sid]) == 0 {
		rc.pendOrder = append(rc.pendOrder, sid)
	}
	rc.pend[sid] = append(rc.pend[sid], f)
}

// writeDriverBlockLocked re-encodes a driver header block for the gateway
// and writes it (rc.gmu held).
func (rc *relayConn) writeDriverBlockLocked(sid uint32, fields []hpack.HeaderField, end bool) error {
	rc.gEncStartLocked()
	for _, f := range fields {
		if err := rc.gEnc.WriteField(f); err != nil {
			return err
		}
	}
	return writeBlock(rc.gfr, sid, rc.gEncBuf.Bytes(), end)
}

// gEncStartLocked starts a header block of the relay's encoder towards
// the gateway, applying a table size the gateway announced (rc.gmu held).
func (rc *relayConn) gEncStartLocked() {
	rc.mu.Lock()
	if rc.gwEncTableSet {
		rc.gEnc.SetMaxDynamicTableSizeLimit(rc.gwEncTable)
		rc.gwEncTableSet = false
	}
	rc.mu.Unlock()
	rc.gEncBuf.Reset()
}

// drainLocked sends what is held, stream by stream in the order they were
// held, as far as the gateway's connection window allows, and returns the
// driver DATA bytes done with (rc.gmu held). A DATA frame larger than
// what is left of the window is split (without its padding): with whole
// frames only, a gateway that reads one stream first could wait for a
// frame that never fits while the window sits with a stream it reads
// later, where a direct connection would have sent part of it.
func (rc *relayConn) drainLocked() (int64, error) {
	var sent int64
	kept := rc.pendOrder[:0]
	var werr error
	for _, sid := range rc.pendOrder {
		q := rc.pend[sid]
		i := 0
		for ; i < len(q) && werr == nil; i++ {
			f := &q[i]
			if f.raw {
				rc.gw.Write(f.h[:])
				rc.gw.Write(f.p)
				continue
			}
			if !f.data {
				werr = rc.writeDriverBlockLocked(sid, f.fields, f.end)
				continue
			}
			n := int64(len(f.p))
			rc.mu.Lock()
			avail := rc.gwConn
			if f.es != nil {
				avail = min(avail, f.es.window)
			}
			whole := avail >= n
			if whole {
				rc.gwConn -= n
				if f.es != nil {
					f.es.window -= n
				}
			}
			rc.mu.Unlock()
			if whole {
				rc.gw.Write(f.h[:])
				rc.gw.Write(f.p)
				sent += f.credit
				rc.creditStreamLocked(f)
				continue
			}
			data, err := dataPayload(&f.h, f.p)
			if err != nil {
				werr = err
				continue
			}
			end := f.h.flags().Has(http2.FlagDataEndStream)
			k := min(avail, int64(len(data)))
			if k <= 0 && len(data) > 0 {
				break
			}
			rc.mu.Lock()
			rc.gwConn -= k
			if f.es != nil {
				f.es.window -= k
			}
			rc.mu.Unlock()
			last := k == int64(len(data))
			werr = rc.gfr.WriteData(sid, last && end, data[:k])
			if last {
				sent += f.credit
				rc.creditStreamLocked(f)
				continue
			}
			// The rest stays held as an unpadded frame.
			rest := data[k:]
			var flags http2.Flags
			if end {
				flags = http2.FlagDataEndStream
			}
			f.h = frameHeader{byte(len(rest) >> 16), byte(len(rest) >> 8), byte(len(rest)), byte(http2.FrameData), byte(flags)}
			binary.BigEndian.PutUint32(f.h[5:], sid)
			f.p = rest
			break
		}
		rc.mu.Lock()
		rc.pendFrames -= i
		rc.cond.Broadcast()
		rc.mu.Unlock()
		if i == len(q) {
			delete(rc.pend, sid)
			rc.mu.Lock()
			es := rc.edits[sid]
			rc.mu.Unlock()
			if es != nil {
				rc.endEditLocked(es)
			}
			continue
		}
		rc.pend[sid] = q[i:]
		kept = append(kept, sid)
	}
	rc.pendOrder = kept
	return sent, werr
}

// creditStreamLocked grants the driver's stream window back for an
// unedited part of an edited answer, now sent (rc.gmu held).
func (rc *relayConn) creditStreamLocked(f *pendFrame) {
	if f.scredit > 0 {
		sid, n := f.h.stream(), uint32(f.scredit)
		rc.dq.put(func(fr *http2.Framer) { _ = fr.WriteWindowUpdate(sid, n) })
	}
}

// dropLocked forgets what is held for a stream the gateway reset and
// returns the driver DATA bytes it had taken (rc.gmu held).
func (rc *relayConn) dropLocked(sid uint32) int64 {
	q := rc.pend[sid]
	if len(q) == 0 {
		return 0
	}
	delete(rc.pend, sid)
	rc.pendOrder = slices.DeleteFunc(rc.pendOrder, func(s uint32) bool { return s == sid })
	var n int64
	for _, f := range q {
		n += f.credit
	}
	rc.mu.Lock()
	rc.pendFrames -= len(q)
	rc.cond.Broadcast()
	rc.mu.Unlock()
	return n
}

// waitPending waits until what is held has gone to the gateway or the
// connection closed: a driver that ended its connection has still had its
// last answers delivered.
func (rc *relayConn) waitPending() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for rc.pendFrames > 0 && !rc.closed {
		rc.cond.Wait()
	}
}

// grantDriver records n bytes of driver DATA sent on (or dropped) and
// grants the driver its connection window back in batches.
func (rc *relayConn) grantDriver(n int64) error {
	if n == 0 {
		return nil
	}
	rc.mu.Lock()
	rc.owed += n
	grant := int64(0)
	if rc.owed >= driverConnGrant/4 {
		grant, rc.owed = rc.owed, 0
	}
	rc.mu.Unlock()
	if grant == 0 {
		return nil
	}
	rc.dq.put(func(fr *http2.Framer) { _ = fr.WriteWindowUpdate(0, uint32(grant)) })
	return nil
}

// ctlQueue holds frames for one peer written by the other direction's
// reader, and held-frame work for the gateway side; ctlWriter sends them.
type ctlQueue struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	fr    *http2.Framer
	drain bool
	drops []uint32
	kick  chan struct{}
}

func newCtlQueue() *ctlQueue {
	q := &ctlQueue{kick: make(chan struct{}, 1)}
	q.fr = http2.NewFramer(&q.buf, nil)
	return q
}

func (q *ctlQueue) wake() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// put writes frames with fn into the queue.
func (q *ctlQueue) put(fn func(fr *http2.Framer)) {
	q.mu.Lock()
	fn(q.fr)
	q.mu.Unlock()
	q.wake()
}

// drainHeld asks for held driver frames to be sent (the gateway's window
// grew).
func (q *ctlQueue) drainHeld() {
	q.mu.Lock()
	q.drain = true
	q.mu.Unlock()
	q.wake()
}

// dropHeld asks for what is held for a stream the gateway reset to be
// forgotten.
func (q *ctlQueue) dropHeld(sid uint32) {
	q.mu.Lock()
	q.drops = append(q.drops, sid)
	q.mu.Unlock()
	q.wake()
}

// ctlWriter sends what q holds to its peer (under mu, into w) until the
// connection ends; the gateway side's writer (gateway) also drops and
// drains held driver frames.
func (rc *relayConn) ctlWriter(q *ctlQueue, mu *sync.Mutex, w *bufio.Writer, gateway bool) {
	defer rc.writers.Done()
	var b []byte
	for {
		select {
		case <-q.kick:
		case <-rc.ctx.Done():
			return
		}
		q.mu.Lock()
		b = append(b[:0], q.buf.Bytes()...)
		q.buf.Reset()
		drain, drops := q.drain, q.drops
		q.drain, q.drops = false, nil
		q.mu.Unlock()
		var credit int64
		mu.Lock()
		w.Write(b)
		var err error
		if gateway {
			for _, sid := range drops {
				credit += rc.dropLocked(sid)
			}
			if drain {
				var sent int64
				sent, err = rc.drainLocked()
				credit += sent
			}
		}
		if err == nil {
			err = w.Flush()
		}
		mu.Unlock()
		if err != nil {
			rc.close()
			return
		}
		if credit > 0 {
			_ = rc.grantDriver(credit)
		}
	}
}

func statusLabel(v string) string {
	var n uint32
	for _, c := range v {
		if c < '0' || c > '9' {
			return codes.Unknown.String()
		}
		n = n*10 + uint32(c-'0')
	}
	return codes.Code(n).String()
}

// rstLabel is the status gRPC clients give a stream reset with code c.
func rstLabel(c http2.ErrCode) string {
	switch c {
	case http2.ErrCodeCancel:
		return codes.Canceled.String()
	case http2.ErrCodeRefusedStream:
		return codes.Unavailable.String()
	case http2.ErrCodeEnhanceYourCalm:
		return codes.ResourceExhausted.String()
	case http2.ErrCodeInadequateSecurity:
		return codes.PermissionDenied.String()
	}
	return codes.Internal.String()
}

// refuseConn answers a gateway connection whose driver cannot be reached:
// every stream gets UNAVAILABLE at once, then GOAWAY, so the gateway
// retries on a new connection (which dials the driver again) without
// backing off.
func (p *Proxy) refuseConn(g net.Conn, derr error) {
	defer g.Close()
	_ = g.SetDeadline(time.Now().Add(2 * time.Second))
	br, bw := bufio.NewReader(g), bufio.NewWriter(g)
	pre := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(br, pre); err != nil || string(pre) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(bw, br)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	_ = fr.WriteSettings()
	_ = bw.Flush()
	var enc bytes.Buffer
	henc := hpack.NewEncoder(&enc)
	msg := encodeGrpcMessage("eventpipe driver-proxy: driver unavailable: " + derr.Error())
	goaway := false
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
		case *http2.MetaHeadersFrame:
			p.metrics.rpcs.WithLabelValues(rpcLabel(f.PseudoValue("path")), "dial_error").Inc()
			enc.Reset()
			for _, hf := range []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"},
				{Name: "grpc-status", Value: fmt.Sprint(int(codes.Unavailable))}, {Name: "grpc-message", Value: msg}} {
				_ = henc.WriteField(hf)
			}
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: enc.Bytes(), EndStream: true, EndHeaders: true})
			if !goaway {
				_ = fr.WriteGoAway(f.StreamID, http2.ErrCodeNo, nil)
				goaway = true
			}
		case *http2.GoAwayFrame:
			return
		}
		if br.Buffered() == 0 {
			if bw.Flush() != nil {
				return
			}
		}
	}
}
