package diagnosis

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// positionFollow plays a collector in Kafka mode: each message carries a
// position; the first stream breaks after one message.
type positionFollow struct {
	eventpipev1.UnimplementedFollowServer
	reqs chan *eventpipev1.FollowRequest
	occ  *eventpipev1.Occurrence
}

func (s *positionFollow) Follow(req *eventpipev1.FollowRequest, st eventpipev1.Follow_FollowServer) error {
	n := len(s.reqs)
	s.reqs <- req
	st.SendHeader(metadata.Pairs(headerLostRecords, "0", headerLastCursor, "0", headerLastPosition, "\x01\x00\x01\x00\x07"))
	if n == 0 {
		if err := st.Send(&eventpipev1.FollowResponse{Cursor: 3, Occurrence: s.occ, Position: []byte{1, 0, 1, 0, 8}, Partition: 2}); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "replica killed")
	}
	<-st.Context().Done()
	return nil
}

// The Watcher resumes from the position a collector in Kafka mode sent,
// on whichever replica answers.
func TestWatcherResumesByPosition(t *testing.T) {
	s := newSandbox(14, "img-missing", imageMissing, supervisorGood)
	fx := newFixture(t, s)
	srv := &positionFollow{reqs: make(chan *eventpipev1.FollowRequest, 10), occ: fx.pullFailure(s, false, "workspace-init", imageMissing, 1)[0]}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	eventpipev1.RegisterFollowServer(gs, srv)
	go gs.Serve(lis)
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w, _ := NewWatcher(eventpipev1.NewFollowClient(conn), &eventpipev1.FollowRequest{Workspace: workspace, Tail: 100},
		WatchOptions{BackoffMin: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var second *eventpipev1.FollowRequest
	<-srv.reqs
	select {
	case second = <-srv.reqs:
	case <-time.After(10 * time.Second):
		t.Fatal("no resubscription")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(second.GetAfterPosition(), []byte{1, 0, 1, 0, 8}) || second.GetAfterCursor() != 3 || second.GetTail() != 0 {
		t.Errorf("resubscription: after_position %v after_cursor %d tail %d", second.GetAfterPosition(), second.GetAfterCursor(), second.GetTail())
	}
}
