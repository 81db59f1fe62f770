package gateway

import (
	"bytes"
	"encoding/binary"

	"golang.org/x/net/http2"

	"github.com/eventpipe/eventpipe/sinks/gateway/driverwire"
)

// Edited answers on the frame path. A GetSandbox or ListSandboxes call is
// forwarded like any other (its request frames reach the driver as they
// came, on the relay's driver connection); when the driver's response
// headers arrive while a pull failure is active, the relay becomes the
// flow-control endpoint of that one stream in both directions:
//
//   - It reads the driver's DATA of the stream at once and credits the
//     driver for it (connection window through grantDriver, stream window
//     with its own WINDOW_UPDATEs), so an answer being reassembled never
//     holds up the driver's other streams, and its memory is the message
//     itself (bounded by relay_edit_max_bytes).
//   - It reassembles each gRPC message, edits it with the same driverwire
//     call as grpc mode (Proxy.edit: the answers are byte-identical), and
//     writes the result as its own DATA, within the gateway's connection
//     window and its stream window (tracked in editStream.window). The
//     frames go through the held-frame queue (pend), so the driver's
//     trailers and RST_STREAM follow the edited DATA, never overtake it.
//   - The gateway's stream WINDOW_UPDATEs of the stream stop at the relay
//     (they open editStream.window); forwarding them would grant the driver
//     window for bytes the relay wrote. At the connection level nothing
//     changes: the relay is already the endpoint towards both sides, the
//     edited bytes spend the gateway's window like the driver's, and the
//     driver is credited for what it sent, not for what the relay wrote.
//
// A message that is compressed (its flag set: the driver compresses only
// when the gateway offered an encoding, which OpenShell's does not) or
// larger than the limit passes unedited, counted in
// unedited_answers_total: its bytes go on as they arrive and are credited
// to the driver (stream and connection) only once sent to the gateway, so
// it is held at most to the driver's windows, as a forwarded answer. A
// message above asyncEditBytes is edited on a goroutine of its own (a
// ListSandboxes answer of 10,000 failing sandboxes takes about 0.4 s),
// while the driver reader goes on with other streams; the stream's later
// frames wait behind it (editStream.after).

// asyncEditBytes: messages larger than this are edited off the driver
// reader (about 3 ms of editing at this size).
const asyncEditBytes = 64 << 10

// editStream is a GetSandbox or ListSandboxes answer the relay edits.
type editStream struct {
	sid    uint32
	method string

	// Guarded by rc.mu.
	window  int64 // the gateway's window of this stream
	ended   bool  // the driver ended the stream (trailers, END_STREAM, RST_STREAM)
	dropped bool  // the gateway reset it

	// Guarded by rc.gmu.
	editing bool        // a large message is being edited (editAsync)
	after   []pendFrame // the stream's frames that came meanwhile, in order

	// Owned by the driver reader.
	hdr    []byte // prefix of the next message while it has fewer than 5 bytes
	msg    []byte // the message being reassembled, prefix included (cap: all of it)
	pass   int64  // bytes of an unedited message still to pass on as they come
	credit int64  // read, not yet credited to the driver's stream window
}

func editedMethod(method string) bool {
	return method == driverwire.MethodGetSandbox || method == driverwire.MethodListSandboxes
}

// startEdit makes stream sid an edited answer if it is a forwarded Get or
// List call and a pull failure is active; called by the driver reader on
// the stream's response headers.
func (rc *relayConn) startEdit(sid uint32) *editStream {
	rc.mu.Lock()
	f, ok := rc.fwd[sid]
	rc.mu.Unlock()
	if !ok || !editedMethod(f.method) || !rc.p.hub.anyFailures() {
		return nil
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	f, ok = rc.fwd[sid]
	if !ok || rc.closed {
		return nil
	}
	// The gateway's window for the stream: nothing of the answer was sent
	// yet, and the stream WINDOW_UPDATEs it sent so far went to the driver.
	es := &editStream{sid: sid, method: f.method, window: rc.gwInit + f.wu}
	rc.edits[sid] = es
	return es
}

// editOf returns the edited answer of stream sid, if any.
func (rc *relayConn) editOf(sid uint32) *editStream {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.edits[sid]
}

// editData takes one driver DATA frame of an edited stream (driver reader).
func (rc *relayConn) editData(es *editStream, h *frameHeader, p []byte) error {
	data, err := dataPayload(h, p)
	if err != nil {
		return err
	}
	end := h.flags().Has(http2.FlagDataEndStream)
	var out []pendFrame
	var passed int64 // bytes credited to the driver when sent, not now
	for len(data) > 0 {
		if es.pass > 0 {
			k := min(es.pass, int64(len(data)))
			out = appendDataFrames(out, es, bytes.Clone(data[:k]), k)
			passed += k
			es.pass -= k
			data = data[k:]
			continue
		}
		if es.msg == nil {
			k := min(5-len(es.hdr), len(data))
			es.hdr = append(es.hdr, data[:k]...)
			data = data[k:]
			if len(es.hdr) < 5 {
				continue
			}
			size := int64(binary.BigEndian.Uint32(es.hdr[1:]))
			reason := ""
			switch {
			case es.hdr[0] != 0:
				reason = "compressed"
			case size > int64(rc.p.cfg.RelayEditMaxBytes):
				reason = "over_limit"
			}
			if reason != "" {
				rc.p.metrics.unedited.WithLabelValues(reason).Inc()
				out = appendDataFrames(out, es, bytes.Clone(es.hdr), 0)
				es.hdr = es.hdr[:0]
				es.pass = size
				continue
			}
			es.msg = make([]byte, 5, 5+size)
			copy(es.msg, es.hdr)
			es.hdr = es.hdr[:0]
		}
		k := min(cap(es.msg)-len(es.msg), len(data))
		es.msg = append(es.msg, data[:k]...)
		data = data[k:]
		if len(es.msg) < cap(es.msg) {
			continue
		}
		msg := es.msg
		es.msg = nil
		if len(msg) > asyncEditBytes && !rc.editingOf(es) {
			if err := rc.emitEdited(es, out, false); err != nil {
				return err
			}
			out = nil
			rc.editAsync(es, msg)
			continue
		}
		out = appendDataFrames(out, es, rc.editMsg(es, msg), 0)
	}
	if end {
		if es.msg != nil || len(es.hdr) > 0 {
			// The driver ended inside a message: pass on what came.
			out = appendDataFrames(out, es, append(es.hdr, es.msg...), 0)
			es.msg, es.hdr = nil, nil
		}
		if len(out) == 0 {
			out = appendDataFrames(out, es, nil, 0)
		}
		out[len(out)-1].h[4] |= byte(http2.FlagDataEndStream)
	}
	if err := rc.emitEdited(es, out, end); err != nil {
		return err
	}
	// What was read is credited now; what passes on, once sent.
	read := int64(h.length()) - passed
	if read > 0 && !end {
		rc.mu.Lock()
		every := min(creditEvery, max(rc.gwInit/2, 1))
		rc.mu.Unlock()
		if es.credit += read; es.credit >= every {
			n := es.credit
			es.credit = 0
			rc.dq.put(func(fr *http2.Framer) { _ = fr.WriteWindowUpdate(es.sid, uint32(n)) })
		}
	}
	return rc.grantDriver(read)
}

func (rc *relayConn) editingOf(es *editStream) bool {
	rc.gmu.Lock()
	defer rc.gmu.Unlock()
	return es.editing
}

// appendDataFrames appends b as DATA frames of at most maxFramePayload
// bytes (one empty frame for empty b). credit is the driver's connection
// and stream window the bytes took that is granted back once they are
// sent (bytes that pass unedited); bytes the relay wrote take none.
func appendDataFrames(out []pendFrame, es *editStream, b []byte, credit int64) []pendFrame {
	for first := true; first || len(b) > 0; first = false {
		n := min(len(b), maxFramePayload)
		f := pendFrame{data: true, es: es, p: b[:n:n]}
		f.h = frameHeader{byte(n >> 16), byte(n >> 8), byte(n), byte(http2.FrameData), 0}
		binary.BigEndian.PutUint32(f.h[5:], es.sid)
		if len(b) == n {
			f.credit, f.scredit = credit, credit
		}
		out = append(out, f)
		b = b[n:]
	}
	return out
}

// editMsg edits one complete message (prefix included) with the code grpc
// mode uses, and returns it prefixed again; unchanged, it is msg itself.
func (rc *relayConn) editMsg(es *editStream, msg []byte) []byte {
	fn := driverwire.PatchGetSandboxResponse
	if es.method == driverwire.MethodListSandboxes {
		fn = driverwire.PatchListSandboxesResponse
	}
	b := rc.p.edit(msg[5:], fn)
	if len(b) == len(msg)-5 && (len(b) == 0 || &b[0] == &msg[5]) {
		return msg
	}
	out := make([]byte, 5+len(b))
	binary.BigEndian.PutUint32(out[1:5], uint32(len(b)))
	copy(out[5:], b)
	return out
}

// emitEdited queues frames of an edited stream for the gateway (behind a
// running edit, or what is held for the stream) and sends what the
// windows allow; end: the driver ended the stream.
func (rc *relayConn) emitEdited(es *editStream, out []pendFrame, end bool) error {
	rc.gmu.Lock()
	rc.mu.Lock()
	es.ended = es.ended || end
	dropped := es.dropped
	rc.mu.Unlock()
	if dropped {
		// The gateway reset the stream: its dropHeld may have run
		// already, and frames held now would wait for a stream window
		// that never opens again.
		rc.gmu.Unlock()
		var credit int64
		for _, f := range out {
			credit += f.credit
		}
		return rc.grantDriver(credit)
	}
	if es.editing {
		es.after = append(es.after, out...)
		rc.gmu.Unlock()
		return nil
	}
	for _, f := range out {
		rc.holdLocked(es.sid, f)
	}
	sent, err := rc.drainLocked()
	rc.endEditLocked(es)
	rc.gmu.Unlock()
	if err != nil {
		return err
	}
	return rc.grantDriver(sent)
}

// editAsync edits msg on a goroutine of its own; the stream's later
// frames wait in es.after. It counts as a held frame meanwhile, so a
// driver that ends its connection still has the answer delivered.
func (rc *relayConn) editAsync(es *editStream, msg []byte) {
	rc.gmu.Lock()
	es.editing = true
	rc.gmu.Unlock()
	rc.mu.Lock()
	rc.pendFrames++
	rc.mu.Unlock()
	rc.editors.Add(1)
	go func() {
		defer rc.editors.Done()
		out := appendDataFrames(nil, es, rc.editMsg(es, msg), 0)
		rc.gmu.Lock()
		out = append(out, es.after...)
		es.editing, es.after = false, nil
		rc.mu.Lock()
		rc.pendFrames--
		dropped := es.dropped
		rc.cond.Broadcast()
		rc.mu.Unlock()
		var sent int64
		var err error
		if !dropped {
			for _, f := range out {
				rc.holdLocked(es.sid, f)
			}
			sent, err = rc.drainLocked()
			if err == nil {
				err = rc.gw.Flush()
			}
		} else {
			for _, f := range out {
				sent += f.credit
			}
		}
		rc.endEditLocked(es)
		rc.gmu.Unlock()
		if err != nil {
			rc.close()
			return
		}
		_ = rc.grantDriver(sent)
	}()
}

// endEditLocked forgets an edited stream once the driver has ended it and
// all of it went to the gateway (rc.gmu held): from then on a stream
// WINDOW_UPDATE of the gateway passes to the driver, which ignores it on
// a closed stream.
func (rc *relayConn) endEditLocked(es *editStream) {
	if es.editing || len(rc.pend[es.sid]) > 0 {
		return
	}
	rc.mu.Lock()
	if es.ended && rc.edits[es.sid] == es {
		delete(rc.edits, es.sid)
	}
	rc.mu.Unlock()
}

// holdBehindLocked holds a driver frame of stream sid (trailers,
// RST_STREAM) behind what is held or being edited for it, and reports
// whether it did (rc.gmu held).
func (rc *relayConn) holdBehindLocked(sid uint32, es *editStream, f pendFrame) bool {
	if es != nil && es.editing {
		es.after = append(es.after, f)
		return true
	}
	if len(rc.pend[sid]) > 0 {
		rc.holdLocked(sid, f)
		return true
	}
	return false
}
