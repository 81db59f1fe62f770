package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// shipper plays the agent's shipping side against the real collector: it
// generates numbered batches of occurrences at a steady rate, keeps up to
// window batches in flight on one Ship stream, and on any failure (stream
// error, no ack within ackTimeout) reconnects and re-sends every batch not
// yet acknowledged, in order, as the agent does. Each send stamps
// observed_at with the send time, so a record the collector stored twice
// (a failed dedupe) is told apart from a sink delivering one stored record
// twice.
type shipper struct {
	addr       string
	prefix     string // event ids are prefix-<batch>-<i>
	workspace  string
	perBatch   int
	window     int
	ackTimeout time.Duration

	mu         sync.Mutex
	cond       *sync.Cond
	batches    []*eventpipev1.Batch // batch seq n is batches[n-1]
	acked      int                  // batches acknowledged (acks come in order)
	sent       int                  // batches sent on the current stream
	sends      int                  // batch sends, re-sends included
	resentOccs int                  // occurrences sent more than once
	stored     int                  // acks' stored counts
	dups       int                  // acks' duplicates counts
	reconnects int
	lastErr    error
	oldestSent time.Time // when the oldest unacknowledged batch was sent
	highest    int       // highest batch seq ever sent
}

func newShipper(addr, prefix, workspace string, perBatch int) *shipper {
	s := &shipper{addr: addr, prefix: prefix, workspace: workspace, perBatch: perBatch, window: 8, ackTimeout: 10 * time.Second}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// add generates n batches.
func (s *shipper) add(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		seq := len(s.batches) + 1
		b := &eventpipev1.Batch{Seq: uint64(seq), Cluster: "drills", Stream: "events", ResourceVersion: fmt.Sprint(seq)}
		now := timestamppb.Now()
		for i := range s.perBatch {
			b.Occurrences = append(b.Occurrences, &eventpipev1.Occurrence{
				SchemaVersion: eventpipev1.SchemaVersion,
				EventId:       fmt.Sprintf("%s-%d-%d", s.prefix, seq, i),
				OccurredAt:    now,
				Namespace:     "openshell-openshell-" + s.workspace,
				Type:          "Warning",
				Reason:        "BackOff",
				Message:       "Back-off restarting failed container agent in pod sb",
				Count:         1,
				Attribution:   eventpipev1.AttributionPodAnnotation,
				Role:          eventpipev1.RoleWorkload,
				Sandbox:       &eventpipev1.Sandbox{Id: fmt.Sprintf("sb-%d", i%5), Name: fmt.Sprintf("sb%d", i%5), Workspace: s.workspace, GatewayId: "gw"},
			})
		}
		s.batches = append(s.batches, b)
	}
	s.cond.Broadcast()
}

// resendAcked queues, as a new batch, the occurrences of the last
// acknowledged batch with a fresh observed_at: what an agent sends when
// the stream broke after the collector stored a batch but before its ack
// arrived. Whether a SIGKILL lands in that window is luck; this makes the
// case certain. The collector must recognise every occurrence (counted in
// the ack's duplicates); a second stored copy shows as dup after dedupe.
func (s *shipper) resendAcked() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acked == 0 {
		return
	}
	src := s.batches[s.acked-1]
	b := &eventpipev1.Batch{Seq: uint64(len(s.batches) + 1), Cluster: src.Cluster, Stream: src.Stream}
	for _, o := range src.Occurrences {
		b.Occurrences = append(b.Occurrences, proto.Clone(o).(*eventpipev1.Occurrence))
	}
	s.batches = append(s.batches, b)
	s.cond.Broadcast()
}

// generate adds one batch every interval until ctx ends.
func (s *shipper) generate(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.add(1)
		}
	}
}

type shipStats struct {
	Created, Acked, Sends, Resent, Stored, Dups, Reconnects, InFlight int
}

func (s *shipper) stats() shipStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return shipStats{
		Created: len(s.batches) * s.perBatch, Acked: s.acked * s.perBatch, Sends: s.sends,
		Resent: s.resentOccs, Stored: s.stored, Dups: s.dups, Reconnects: s.reconnects,
		InFlight: s.sent - s.acked,
	}
}

// ackedIDs is every event id in an acknowledged batch.
func (s *shipper) ackedIDs() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, s.acked*s.perBatch)
	for _, b := range s.batches[:s.acked] {
		for _, o := range b.Occurrences {
			out[o.EventId] = true
		}
	}
	return out
}

// ackedIDsFrom is every event id in an acknowledged batch from seq on.
func (s *shipper) ackedIDsFrom(seq int) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for _, b := range s.batches[min(seq-1, s.acked):s.acked] {
		for _, o := range b.Occurrences {
			out[o.EventId] = true
		}
	}
	return out
}

// createdIDs is every event id generated.
func (s *shipper) createdIDs() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.batches)*s.perBatch)
	for _, b := range s.batches {
		for _, o := range b.Occurrences {
			out[o.EventId] = true
		}
	}
	return out
}

// waitAcked waits until every generated batch is acknowledged.
func (s *shipper) waitAcked(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		st := s.stats()
		if st.Acked == st.Created {
			return nil
		}
		if time.Now().After(deadline) {
			s.mu.Lock()
			err := s.lastErr
			s.mu.Unlock()
			return fmt.Errorf("%d of %d occurrences acknowledged after %s (last error: %v)", st.Acked, st.Created, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// run ships until ctx ends, reconnecting after every failure.
func (s *shipper) run(ctx context.Context) {
	wake := make(chan struct{})
	go func() { <-ctx.Done(); s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock(); close(wake) }()
	for ctx.Err() == nil {
		err := s.stream(ctx)
		s.mu.Lock()
		s.lastErr = err
		s.reconnects++
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	<-wake
}

// stream runs one Ship stream until it fails.
func (s *shipper) stream(parent context.Context) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()

	s.mu.Lock()
	s.sent = s.acked
	s.oldestSent = time.Now() // the stream must come up within ackTimeout
	s.mu.Unlock()

	var opened atomic.Bool
	// Watchdog: a stream that does not make progress (a black-holed
	// network, a hung collector) is abandoned after ackTimeout.
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.mu.Lock()
				stuck := (s.sent > s.acked || !opened.Load()) && time.Since(s.oldestSent) > s.ackTimeout
				s.mu.Unlock()
				if stuck {
					cancel()
					return
				}
			}
		}
	}()

	st, err := eventpipev1.NewIngestClient(conn).Ship(ctx)
	if err != nil {
		return fmt.Errorf("open stream: %w", err)
	}
	opened.Store(true)
	recvErr := make(chan error, 1)
	go func() {
		for {
			ack, err := st.Recv()
			if err != nil {
				recvErr <- err
				cancel()
				s.mu.Lock()
				s.cond.Broadcast()
				s.mu.Unlock()
				return
			}
			s.mu.Lock()
			if ack.GetSeq() != uint64(s.acked+1) {
				s.mu.Unlock()
				recvErr <- fmt.Errorf("ack %d, want %d: out of order", ack.GetSeq(), s.acked+1)
				cancel()
				return
			}
			s.acked++
			s.stored += int(ack.GetStored())
			s.dups += int(ack.GetDuplicates())
			s.oldestSent = time.Now()
			s.cond.Broadcast()
			s.mu.Unlock()
		}
	}()
	for {
		s.mu.Lock()
		for ctx.Err() == nil && !(s.sent < len(s.batches) && s.sent-s.acked < s.window) {
			s.cond.Wait()
		}
		if ctx.Err() != nil {
			s.mu.Unlock()
			break
		}
		b := s.batches[s.sent]
		resend := b.Seq <= uint64(s.sentEver())
		if s.sent == s.acked {
			s.oldestSent = time.Now()
		}
		s.sent++
		s.sends++
		if resend {
			s.resentOccs += len(b.Occurrences)
		}
		s.markSent(int(b.Seq))
		s.mu.Unlock()

		c := proto.Clone(b).(*eventpipev1.Batch)
		now := timestamppb.Now()
		for _, o := range c.Occurrences {
			o.ObservedAt = now
		}
		if err := st.Send(c); err != nil {
			break
		}
	}
	cancel()
	select {
	case err := <-recvErr:
		return err
	case <-time.After(5 * time.Second):
		return ctx.Err()
	}
}

// sentEver / markSent track the highest batch ever sent (to count
// re-sends). Called with mu held.
func (s *shipper) sentEver() int { return s.highest }

func (s *shipper) markSent(seq int) { s.highest = max(s.highest, seq) }
