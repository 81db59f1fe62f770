package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang/snappy"
	"google.golang.org/protobuf/encoding/protowire"
)

// lokiReceiver is a minimal Loki push endpoint in this process: it fully
// decodes every push (snappy, then every protobuf field of every stream,
// entry and metadata pair), checks that each stream has labels and each
// entry a timestamp and a line, counts the entries and answers 204. With it
// the Loki rows measure the sink's side (plus this decode, about what any
// server must spend to read the request) without a storage engine's
// indexing on the same cores.
type lokiReceiver struct {
	srv     *http.Server
	lis     net.Listener
	entries atomic.Int64
	bad     atomic.Int64
	bufs    sync.Pool // *[]byte
}

func startLokiReceiver() (*lokiReceiver, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &lokiReceiver{lis: l}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.push), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(l) }()
	return r, nil
}

func (r *lokiReceiver) url() string { return "http://" + r.lis.Addr().String() + "/loki/api/v1/push" }

func (r *lokiReceiver) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
}

// count is the number of entries received; malformed pushes fail the run.
func (r *lokiReceiver) count(context.Context) (int, error) {
	if n := r.bad.Load(); n > 0 {
		return 0, fmt.Errorf("%d malformed pushes", n)
	}
	return int(r.entries.Load()), nil
}

func (r *lokiReceiver) push(w http.ResponseWriter, req *http.Request) {
	bp, _ := r.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	defer r.bufs.Put(bp)
	buf := bytes.NewBuffer((*bp)[:0])
	_, err := io.Copy(buf, req.Body)
	*bp = buf.Bytes()
	var n int
	if err == nil {
		var raw []byte
		if raw, err = snappy.Decode(nil, buf.Bytes()); err == nil {
			n, err = decodePush(raw)
		}
	}
	if err != nil {
		r.bad.Add(1)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.entries.Add(int64(n))
	w.WriteHeader(http.StatusNoContent)
}

var errMalformed = errors.New("malformed push")

// each calls fn for every field of the message b; bytes fields get their
// value, varint fields their number.
func each(b []byte, fn func(num protowire.Number, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errMalformed
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			return errMalformed
		}
		if n < 0 {
			return errMalformed
		}
		b = b[n:]
		if err := fn(num, v, x); err != nil {
			return err
		}
	}
	return nil
}

// decodePush walks a PushRequest (streams{labels, entries{timestamp, line,
// structuredMetadata{name, value}}}) and returns the number of entries.
func decodePush(b []byte) (int, error) {
	entries := 0
	err := each(b, func(_ protowire.Number, stream []byte, _ uint64) error {
		labels := false
		err := each(stream, func(num protowire.Number, v []byte, _ uint64) error {
			switch num {
			case 1:
				labels = len(v) > 2
				return nil
			case 2:
				entries++
				return decodeEntry(v)
			}
			return nil
		})
		if err == nil && !labels {
			err = fmt.Errorf("%w: stream without labels", errMalformed)
		}
		return err
	})
	return entries, err
}

func decodeEntry(b []byte) error {
	var ts, line bool
	err := each(b, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1:
			ts = true
			return each(v, func(protowire.Number, []byte, uint64) error { return nil })
		case 2:
			line = len(v) > 0
		case 3:
			return each(v, func(protowire.Number, []byte, uint64) error { return nil })
		}
		return nil
	})
	if err == nil && (!ts || !line) {
		err = fmt.Errorf("%w: entry without timestamp or line", errMalformed)
	}
	return err
}
