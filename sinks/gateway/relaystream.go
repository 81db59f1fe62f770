package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/eventpipe/eventpipe/sinks/gateway/driverwire"
)

// ownStream is a stream the frame relay answers itself (WatchSandboxes;
// Get and List until 2026-12-01, now edited on the frame path): it is a
// grpc.ServerStream over HTTP/2 frames, so Proxy.handle runs on it
// exactly as it runs under the gRPC server in grpc mode.
type ownStream struct {
	rc          *relayConn
	id          uint32
	unary       bool
	contentType string
	ctx         context.Context
	cancel      context.CancelFunc

	// Guarded by rc.mu.
	window     int64 // the gateway's window of this stream
	recvCredit int64
	done       bool // reset by the gateway or the connection closed

	reqMu   sync.Mutex
	reqBuf  []byte
	reqs    [][]byte
	reqEnd  bool
	reqErr  error
	reqWake chan struct{}

	// The handler's goroutine only (one sender, as under gRPC).
	hdr, trl   metadata.MD
	headerSent bool
}

type ownTransport struct {
	st     *ownStream
	method string
}

func (t ownTransport) Method() string                  { return t.method }
func (t ownTransport) SetHeader(md metadata.MD) error  { return t.st.SetHeader(md) }
func (t ownTransport) SendHeader(md metadata.MD) error { return t.st.SendHeader(md) }
func (t ownTransport) SetTrailer(md metadata.MD) error { t.st.SetTrailer(md); return nil }

// startOwn begins answering stream sid of an edited method.
func (rc *relayConn) startOwn(sid uint32, method string, fields []hpack.HeaderField, end bool) {
	md := metadata.MD{}
	var timeout time.Duration
	hasTimeout := false
	ct := "application/grpc"
	for _, f := range fields {
		switch {
		case f.Name == "content-type":
			ct = f.Value
		case f.Name == "grpc-timeout":
			timeout, hasTimeout = parseGrpcTimeout(f.Value)
		case f.Name == ":authority" || f.Name == "user-agent":
			md[f.Name] = append(md[f.Name], f.Value)
		case isReserved(f.Name):
		case strings.HasSuffix(f.Name, "-bin"):
			if b, err := decodeBin(f.Value); err == nil {
				md[f.Name] = append(md[f.Name], string(b))
			}
		default:
			md[f.Name] = append(md[f.Name], f.Value)
		}
	}
	ctx, cancel := rc.ctx, context.CancelFunc(func() {})
	if hasTimeout {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	ctx, cancel2 := context.WithCancel(ctx)
	st := &ownStream{
		rc: rc, id: sid, unary: method != driverwire.MethodWatchSandboxes, contentType: ct,
		reqWake: make(chan struct{}, 1),
	}
	st.cancel = func() { cancel2(); cancel() }
	ctx = metadata.NewIncomingContext(ctx, md)
	ctx = peer.NewContext(ctx, &peer.Peer{Addr: connAddr(rc.id)})
	ctx = grpc.NewContextWithServerTransportStream(ctx, ownTransport{st: st, method: method})
	st.ctx = ctx
	rc.mu.Lock()
	st.window = rc.gwInit
	rc.own[sid] = st
	rc.mu.Unlock()
	if end {
		st.addRequest(nil, true)
	}
	go func() {
		err := rc.p.handle(nil, st)
		st.finish(err)
	}()
}

func isReserved(name string) bool {
	if name != "" && name[0] == ':' {
		return true
	}
	switch name {
	case "content-type", "user-agent", "grpc-message-type", "grpc-encoding", "grpc-message",
		"grpc-status", "grpc-timeout", "grpc-status-details-bin", "te":
		return true
	}
	return false
}

func decodeBin(v string) ([]byte, error) {
	if len(v)%4 == 0 {
		return base64.StdEncoding.DecodeString(v)
	}
	return base64.RawStdEncoding.DecodeString(v)
}

// parseGrpcTimeout reads a grpc-timeout value (digits and a unit).
func parseGrpcTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	return time.Duration(n) * unit, true
}

// addRequest takes request bytes of the stream (gRPC length-prefixed
// messages, possibly split across frames).
func (st *ownStream) addRequest(data []byte, end bool) {
	st.reqMu.Lock()
	st.reqBuf = append(st.reqBuf, data...)
	for st.reqErr == nil && len(st.reqBuf) >= 5 {
		n := binary.BigEndian.Uint32(st.reqBuf[1:5])
		switch {
		case st.reqBuf[0] != 0:
			st.reqErr = status.Error(codes.Internal, "eventpipe driver-proxy: compressed message without grpc-encoding")
		case n > maxMsgBytes:
			st.reqErr = status.Errorf(codes.ResourceExhausted, "eventpipe driver-proxy: request of %d bytes is over the %d limit", n, maxMsgBytes)
		}
		if st.reqErr != nil || uint32(len(st.reqBuf)-5) < n {
			break
		}
		st.reqs = append(st.reqs, bytes.Clone(st.reqBuf[5:5+n]))
		st.reqBuf = st.reqBuf[5+n:]
	}
	if end {
		st.reqEnd = true
		if st.reqErr == nil && len(st.reqBuf) > 0 {
			st.reqErr = status.Error(codes.Internal, "eventpipe driver-proxy: request ended inside a message")
		}
	}
	st.reqMu.Unlock()
	select {
	case st.reqWake <- struct{}{}:
	default:
	}
}

// reset: the gateway reset the stream (or the connection ended).
func (st *ownStream) reset() {
	st.rc.mu.Lock()
	st.done = true
	delete(st.rc.own, st.id)
	st.rc.markOwnDone(st.id)
	st.rc.cond.Broadcast()
	st.rc.mu.Unlock()
	st.cancel()
}

func (st *ownStream) Context() context.Context { return st.ctx }

func (st *ownStream) RecvMsg(m any) error {
	f, ok := m.(*frame)
	if !ok {
		return fmt.Errorf("frame relay: cannot receive into %T", m)
	}
	for {
		st.reqMu.Lock()
		switch {
		case len(st.reqs) > 0:
			f.b, f.data = st.reqs[0], nil
			st.reqs = st.reqs[1:]
			st.reqMu.Unlock()
			return nil
		case st.reqErr != nil:
			err := st.reqErr
			st.reqMu.Unlock()
			return err
		case st.reqEnd:
			st.reqMu.Unlock()
			return io.EOF
		}
		st.reqMu.Unlock()
		select {
		case <-st.reqWake:
		case <-st.ctx.Done():
			return status.FromContextError(st.ctx.Err()).Err()
		}
	}
}

func (st *ownStream) SetHeader(md metadata.MD) error {
	if st.headerSent {
		return errors.New("frame relay: headers already sent")
	}
	st.hdr = metadata.Join(st.hdr, md)
	return nil
}

func (st *ownStream) SendHeader(md metadata.MD) error {
	if err := st.SetHeader(md); err != nil {
		return err
	}
	rc := st.rc
	rc.gmu.Lock()
	defer rc.gmu.Unlock()
	if err := st.writeHeaderLocked(); err != nil {
		return err
	}
	return rc.gw.Flush()
}

func (st *ownStream) SetTrailer(md metadata.MD) { st.trl = metadata.Join(st.trl, md) }

// writeHeaderLocked writes the response headers (rc.gmu held).
func (st *ownStream) writeHeaderLocked() error {
	if st.headerSent {
		return nil
	}
	st.headerSent = true
	f := []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: st.contentType}}
	return st.rc.writeOwnBlockLocked(st.id, appendMD(f, st.hdr), false)
}

func appendMD(f []hpack.HeaderField, md metadata.MD) []hpack.HeaderField {
	for k, vs := range md {
		if isReserved(k) {
			continue
		}
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				v = base64.RawStdEncoding.EncodeToString([]byte(v))
			}
			f = append(f, hpack.HeaderField{Name: k, Value: v})
		}
	}
	return f
}

// writeOwnBlockLocked encodes fields with the relay's encoder towards the
// gateway (the one driver blocks are re-encoded with), as literals never
// indexed, and writes them (rc.gmu held).
func (rc *relayConn) writeOwnBlockLocked(sid uint32, fields []hpack.HeaderField, end bool) error {
	rc.gEncStartLocked()
	for _, f := range fields {
		f.Sensitive = true
		if err := rc.gEnc.WriteField(f); err != nil {
			return err
		}
	}
	return writeBlock(rc.gfr, sid, rc.gEncBuf.Bytes(), end)
}

func (st *ownStream) SendMsg(m any) error {
	f, ok := m.(*frame)
	if !ok {
		return fmt.Errorf("frame relay: cannot send %T", m)
	}
	b := f.bytes()
	if len(b) > maxMsgBytes {
		return status.Errorf(codes.ResourceExhausted, "eventpipe driver-proxy: message of %d bytes is over the %d limit", len(b), maxMsgBytes)
	}
	msg := make([]byte, 5+len(b))
	binary.BigEndian.PutUint32(msg[1:5], uint32(len(b)))
	copy(msg[5:], b)
	rc := st.rc
	for len(msg) > 0 {
		n, err := rc.spendOwn(st, int64(min(len(msg), maxFramePayload)))
		if err != nil {
			return err
		}
		rc.gmu.Lock()
		err = st.writeHeaderLocked()
		if err == nil {
			err = rc.gfr.WriteData(st.id, false, msg[:n])
		}
		if err == nil && !st.unary {
			err = rc.gw.Flush()
		}
		rc.gmu.Unlock()
		if err != nil {
			return err
		}
		msg = msg[n:]
	}
	return nil
}

// spendOwn takes up to want bytes of the gateway's windows (connection
// and stream) for an intercepted stream, waiting while either is empty.
func (rc *relayConn) spendOwn(st *ownStream, want int64) (int64, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for {
		if rc.closed {
			return 0, status.Error(codes.Unavailable, "eventpipe driver-proxy: gateway connection closed")
		}
		if st.done {
			return 0, status.Error(codes.Canceled, "stream reset by the gateway")
		}
		if n := min(want, rc.gwConn, st.window); n > 0 {
			rc.gwConn -= n
			st.window -= n
			return n, nil
		}
		rc.mu.Unlock()
		rc.gmu.Lock()
		err := rc.gw.Flush()
		rc.gmu.Unlock()
		rc.mu.Lock()
		if err != nil {
			return 0, err
		}
		if min(want, rc.gwConn, st.window) > 0 {
			continue
		}
		rc.cond.Wait()
	}
}

// finish writes the call's status (unless the gateway reset the stream)
// and releases the stream.
func (st *ownStream) finish(err error) {
	rc := st.rc
	defer st.cancel()
	rc.mu.Lock()
	done := st.done || rc.closed
	rc.mu.Unlock()
	st.reqMu.Lock()
	reqEnd := st.reqEnd
	st.reqMu.Unlock()
	if !done {
		s, ok := status.FromError(err)
		if !ok {
			s = status.FromContextError(err)
		}
		rc.gmu.Lock()
		var f []hpack.HeaderField
		if !st.headerSent && len(st.hdr) == 0 {
			st.headerSent = true
			f = append(f, hpack.HeaderField{Name: ":status", Value: "200"}, hpack.HeaderField{Name: "content-type", Value: st.contentType})
		} else if werr := st.writeHeaderLocked(); werr != nil {
			rc.gmu.Unlock()
			return
		}
		f = append(f, hpack.HeaderField{Name: "grpc-status", Value: strconv.Itoa(int(s.Code()))})
		if msg := s.Message(); msg != "" {
			f = append(f, hpack.HeaderField{Name: "grpc-message", Value: encodeGrpcMessage(msg)})
		}
		if p := s.Proto(); p != nil && len(p.Details) > 0 {
			if b, merr := proto.Marshal(p); merr == nil {
				f = append(f, hpack.HeaderField{Name: "grpc-status-details-bin", Value: base64.RawStdEncoding.EncodeToString(b)})
			}
		}
		f = appendMD(f, st.trl)
		_ = rc.writeOwnBlockLocked(st.id, f, true)
		if !reqEnd {
			// The gateway may still be sending: tell it to stop, as a
			// gRPC server does.
			_ = rc.gfr.WriteRSTStream(st.id, http2.ErrCodeNo)
		}
		_ = rc.gw.Flush()
		rc.gmu.Unlock()
	}
	rc.mu.Lock()
	if rc.own[st.id] == st {
		delete(rc.own, st.id)
	}
	rc.markOwnDone(st.id)
	st.done = true
	rc.cond.Broadcast()
	rc.mu.Unlock()
}

// maxOwnDone bounds the intercepted streams whose late frames from the
// gateway are still recognised (and dropped) after their answer.
const maxOwnDone = 4096

// encodeGrpcMessage percent-encodes a grpc-message value (bytes outside
// printable ASCII, and '%').
func encodeGrpcMessage(msg string) string {
	clean := true
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < ' ' || c > '~' || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return msg
	}
	var sb strings.Builder
	for len(msg) > 0 {
		r, size := utf8.DecodeRuneInString(msg)
		for _, c := range []byte(string(r)) {
			if size == 1 && c >= ' ' && c <= '~' && c != '%' {
				sb.WriteByte(c)
			} else {
				fmt.Fprintf(&sb, "%%%02X", c)
			}
		}
		msg = msg[size:]
	}
	return sb.String()
}
