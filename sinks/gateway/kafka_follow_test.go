package gateway

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

func TestStateFile(t *testing.T) {
	cases := []struct {
		name, file string
		want       delivered
		err        string
	}{
		{name: "local mode (one cursor, as before Kafka mode)", file: "42\n", want: delivered{0: 42}},
		{name: "kafka mode", file: "7\n3 19\n11 2\n", want: delivered{0: 7, 3: 19, 11: 2}},
		{name: "kafka mode without partition 0", file: "0\n5 9\n", want: delivered{5: 9}},
		{name: "empty", file: "0\n", want: nil},
		{name: "not a cursor", file: "x\n", err: "line 1: not a cursor"},
		{name: "bad partition line", file: "1\n2\n", err: "line 2: not a cursor"},
	}
	dir := t.TempDir()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, "state")
			if err := os.WriteFile(path, []byte(c.file), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := readState(path)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("readState = %v, %v; want error %q", got, err, c.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("readState = %v, %v; want %v", got, err, c.want)
			}
			if len(got) == 0 {
				return
			}
			if err := writeState(path, got); err != nil {
				t.Fatal(err)
			}
			again, err := readState(path)
			if err != nil || !reflect.DeepEqual(again, c.want) {
				t.Errorf("round trip = %v, %v; want %v", again, err, c.want)
			}
		})
	}
}

func TestDeliveredAdvance(t *testing.T) {
	d := delivered{0: 5, 2: 10}
	got, moved := d.advance([]*entry{{partition: 2, cursor: 8}, {partition: 2, cursor: 12}, {partition: 1, cursor: 3}, {partition: 2, cursor: 11}})
	if !moved || !reflect.DeepEqual(got, delivered{0: 5, 1: 3, 2: 12}) {
		t.Errorf("advance = %v, %v", got, moved)
	}
	if !reflect.DeepEqual(d, delivered{0: 5, 2: 10}) {
		t.Errorf("advance modified its receiver: %v", d)
	}
	if _, moved := d.advance([]*entry{{partition: 2, cursor: 9}}); moved {
		t.Error("an older cursor moved the state")
	}
	if !d.covers(2, 10) || d.covers(2, 11) || d.covers(1, 1) || d.covers(0, 0) {
		t.Error("covers")
	}
}

// scriptedKafkaFollow plays a collector in Kafka mode for the follower:
// the first stream sends two occurrences from two partitions and breaks.
type scriptedKafkaFollow struct {
	eventpipev1.UnimplementedFollowServer
	reqs  chan *eventpipev1.FollowRequest
	calls atomic.Int32 // streams opened; only the first sends and breaks
}

func (s *scriptedKafkaFollow) Follow(req *eventpipev1.FollowRequest, st eventpipev1.Follow_FollowServer) error {
	// Count streams, not the requests still queued: the test may have read
	// the first request already when the follower resubscribes (at once
	// since the probe), and the second stream must not replay the script.
	n := s.calls.Add(1) - 1
	s.reqs <- req
	st.SendHeader(metadata.Pairs("eventpipe-lost-records", "0", headerLastCursor, "0", "eventpipe-last-position-bin", "\x01\x00\x00"))
	if n > 0 {
		<-st.Context().Done()
		return nil
	}
	for _, m := range []*eventpipev1.FollowResponse{
		{Cursor: 9, Partition: 3, Position: []byte{1, 0, 1, 3, 9}, Occurrence: pullFailed("00000000-0000-4000-8000-000000000003", 1)},
		{Cursor: 9, Partition: 1, Position: []byte{1, 0, 2, 1, 9, 3, 9}, Occurrence: pullFailed("00000000-0000-4000-8000-000000000001", 1)},
	} {
		m.Occurrence.EventId += "/" + string(rune('a'+m.Partition))
		if err := st.Send(m); err != nil {
			return err
		}
	}
	return status.Error(codes.Unavailable, "replica killed")
}

// The follower resumes from the position a collector in Kafka mode sent
// (beside the cursor), and after a restart tells delivered events apart
// per partition: cursor 9 of partition 3 was delivered, cursor 9 of
// partition 1 was not.
func TestFollowerKafkaPositionAndRestore(t *testing.T) {
	srv := &scriptedKafkaFollow{reqs: make(chan *eventpipev1.FollowRequest, 10)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	eventpipev1.RegisterFollowServer(gs, srv)
	go gs.Serve(lis)
	defer gs.Stop()

	cfg := proxyConfig(t.TempDir(), "unused", lis.Addr().String())
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	h := newHub(cfg.Follow, m)
	h.restoreDelivered(delivered{3: 10, 1: 4})
	f := newFollower(cfg, testLogger(t), m, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.run(ctx); close(done) }()
	<-srv.reqs
	var second *eventpipev1.FollowRequest
	select {
	case second = <-srv.reqs:
	case <-time.After(10 * time.Second):
		t.Fatal("no resubscription")
	}
	cancel()
	<-done
	if !bytes.Equal(second.GetAfterPosition(), []byte{1, 0, 2, 1, 9, 3, 9}) || second.GetAfterCursor() != 9 || second.GetTail() != 0 {
		t.Errorf("resume: after_position %v after_cursor %d tail %d", second.GetAfterPosition(), second.GetAfterCursor(), second.GetTail())
	}
	restored := map[int32]bool{}
	h.mu.RLock()
	for _, s := range h.sandboxes {
		for _, e := range s.tail {
			restored[e.partition] = e.restored
		}
	}
	h.mu.RUnlock()
	if !reflect.DeepEqual(restored, map[int32]bool{3: true, 1: false}) {
		t.Errorf("restored by partition = %v, want partition 3 delivered before the restart, partition 1 not", restored)
	}
}
