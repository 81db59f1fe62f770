package collector

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/store"
	"github.com/eventpipe/eventpipe/sinks"
)

// failingLog is a stand-in for the store in this unit test of Ship's
// failure path: Append fails (as the store does after a failed fsync) for
// any batch holding the poisoned event id.
type failingLog struct {
	mu     sync.Mutex
	poison string
	stored []string
}

func (f *failingLog) Append(_ context.Context, _, _, _ string, occs []*eventpipev1.Occurrence) (store.AppendResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range occs {
		if o.GetEventId() == f.poison {
			return store.AppendResult{}, errors.Join(store.ErrNotWritable, errors.New("fsync: input/output error"))
		}
	}
	for _, o := range occs {
		f.stored = append(f.stored, o.GetEventId())
	}
	return store.AppendResult{Stored: len(occs), LastOffset: uint64(len(f.stored))}, nil
}
func (f *failingLog) ClusterCursor(context.Context, string, string) (string, bool, error) {
	return "", false, nil
}
func (f *failingLog) Read(context.Context, uint64, int) ([]sinks.Record, uint64, error) {
	return nil, 0, errors.New("not used")
}

// A batch the log refuses is not acknowledged: the stream ends with
// Unavailable right away (even though the agent keeps it open), the
// batches before it are acknowledged, none after it.
func TestIngestAppendFailureIsNotAcknowledged(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	log := &failingLog{poison: "bad/1"}
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(func(s any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(s, &authedStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), principalKey{}, &Principal{Name: "test", Role: RoleAgent})})
	}))
	eventpipev1.RegisterIngestServer(srv, &ingestServer{log: log, logger: testLogger(t), m: m, pipeline: 4, drain: context.Background()})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := eventpipev1.NewIngestClient(dial(t, lis.Addr().String(), "")).Ship(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"ok/1", "ok/2", "bad/1", "ok/3"} {
		if err := st.Send(batch(uint64(i+1), "prod", "1", occ(id, "sb", "ws1", "n", "gw"))); err != nil {
			t.Fatal(err)
		}
	}
	// The stream stays open from the agent's side (no CloseSend).
	var acked []uint64
	for {
		a, err := st.Recv()
		if err != nil {
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "not acknowledged") {
				t.Fatalf("stream ended with %v, want Unavailable naming the refused batch", err)
			}
			break
		}
		acked = append(acked, a.GetSeq())
	}
	if len(acked) > 2 || (len(acked) > 0 && acked[0] != 1) {
		t.Fatalf("acked %v: only batches before the failure may be acknowledged", acked)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, id := range log.stored {
		if id == "ok/3" {
			t.Fatal("a batch after the refused one was stored ahead of it")
		}
	}
}
