package collector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/store"
)

// DefaultStream is the stream name used when a batch or GetCursor names none.
const DefaultStream = "events"

// ingestLog is what ingest needs from the durable log (*store.Store).
type ingestLog interface {
	Append(ctx context.Context, cluster, stream, resourceVersion string, occs []*eventpipev1.Occurrence) (store.AppendResult, error)
	ClusterCursor(cluster, stream string) (string, bool)
}

// ingestServer implements eventpipe.v1.Ingest. A Batch is acknowledged only
// after store.Append returned, i.e. after it is durable and de-duplicated.
type ingestServer struct {
	eventpipev1.UnimplementedIngestServer
	log      ingestLog
	logger   *slog.Logger
	m        *metrics
	pipeline int
}

func (s *ingestServer) GetCursor(ctx context.Context, req *eventpipev1.GetCursorRequest) (*eventpipev1.GetCursorResponse, error) {
	if req.GetCluster() == "" {
		return nil, status.Error(codes.InvalidArgument, "cluster must not be empty")
	}
	stream := req.GetStream()
	if stream == "" {
		stream = DefaultStream
	}
	rv, ok := s.log.ClusterCursor(req.GetCluster(), stream)
	return &eventpipev1.GetCursorResponse{ResourceVersion: rv, Found: ok}, nil
}

// pending is one received batch on its way to the log. done is closed when
// Append returned; ack or err is then set.
type pending struct {
	batch    *eventpipev1.Batch
	received time.Time
	done     chan struct{}
	ack      *eventpipev1.Ack
	err      error
}

// Ship receives batches and appends up to s.pipeline of them concurrently
// (so their fsyncs group), and sends acks strictly in the order the batches
// arrived. Backpressure: when s.pipeline batches are in flight the receive
// loop stops calling Recv, so gRPC flow control slows the agent; nothing is
// buffered beyond that bound.
//
// Batches of one Ship stream enter the log in arrival order: each append
// waits until the previous batch of the stream was appended (see
// appendStarted), so the cluster cursor only moves forward.
func (s *ingestServer) Ship(stream eventpipev1.Ingest_ShipServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	p := principalFrom(ctx)
	who := "unknown"
	if p != nil {
		who = p.Name
	}

	inflight := make(chan *pending, s.pipeline)
	recvErr := make(chan error, 1)
	go func() {
		defer close(inflight)
		recvErr <- s.receive(ctx, stream, inflight)
	}()

	var sendErr error
	for pd := range inflight {
		if sendErr != nil {
			continue // drain: the receiver stops when ctx is cancelled
		}
		select {
		case <-pd.done:
		case <-ctx.Done():
			<-pd.done
		}
		if pd.err != nil {
			sendErr = pd.err
			cancel()
			continue
		}
		if err := stream.Send(pd.ack); err != nil {
			sendErr = fmt.Errorf("send ack: %w", err)
			cancel()
			continue
		}
		s.m.ackLatency.Observe(time.Since(pd.received).Seconds())
	}
	rerr := <-recvErr
	if sendErr != nil {
		if _, ok := status.FromError(sendErr); !ok || status.Code(sendErr) == codes.Unknown {
			s.logger.Warn("ingest stream ended", "caller", who, "err", sendErr)
		}
		return sendErr
	}
	if rerr != nil && !errors.Is(rerr, io.EOF) {
		return rerr
	}
	return nil
}

// receive reads batches until EOF or an error, validates them and starts
// their appends. The appends of one stream are chained: each waits for the
// previous one to be handed to the log before calling Append, and all run
// while receive goes on reading, so up to s.pipeline batches share fsyncs.
func (s *ingestServer) receive(ctx context.Context, stream eventpipev1.Ingest_ShipServer, inflight chan<- *pending) error {
	var lastSeq uint64
	var first = true
	// prevStarted is closed once the previous batch's append is over.
	prevStarted := closedChan()
	for {
		b, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.EOF
			}
			return err
		}
		now := time.Now()
		s.m.batches.Inc()
		if verr := validateBatch(b, first, lastSeq); verr != nil {
			s.m.rejectedBatches.Inc()
			return verr
		}
		first = false
		lastSeq = b.GetSeq()
		pd := &pending{batch: b, received: now, done: make(chan struct{})}
		started := make(chan struct{})
		select {
		case inflight <- pd:
		case <-ctx.Done():
			return ctx.Err()
		}
		go s.appendOrdered(ctx, pd, prevStarted, started)
		prevStarted = started
	}
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// appendOrdered waits until the previous batch of the stream has been handed
// to the log, then appends this one. The store takes batches in the order
// Append is entered, so "entered after the previous one entered" keeps the
// stream's order; the small delay between entering and writing is bounded
// by the handoff, not by the fsync.
func (s *ingestServer) appendOrdered(ctx context.Context, pd *pending, prev <-chan struct{}, started chan<- struct{}) {
	defer close(pd.done)
	select {
	case <-prev:
	case <-ctx.Done():
		close(started)
		pd.err = status.FromContextError(ctx.Err()).Err()
		return
	}
	b := pd.batch
	stream := b.GetStream()
	if stream == "" {
		stream = DefaultStream
	}
	occs := s.sanitize(b)
	res, err := s.appendStarted(ctx, b.GetCluster(), stream, b.GetResourceVersion(), occs, started)
	if err != nil {
		pd.err = appendStatus(ctx, err)
		s.m.appendFailures.Inc()
		s.logger.Warn("append refused; batch not acknowledged", "cluster", b.GetCluster(), "seq", b.GetSeq(), "err", err)
		return
	}
	s.m.ingested.Add(float64(res.Stored))
	s.m.duplicates.Add(float64(res.Duplicates))
	pd.ack = &eventpipev1.Ack{
		Seq:        b.GetSeq(),
		Stored:     uint32(res.Stored),
		Duplicates: uint32(res.Duplicates),
		LastOffset: res.LastOffset,
	}
}

// appendStarted calls Append and closes started when it returned. The
// store gives no "holds its place in the log" signal before the fsync, so
// the next batch of the same stream waits for this one: order first (the
// cluster cursor must never move backwards), pipelining of receive, append
// and ack send second. Batches of different streams (agents) still share
// group commits.
func (s *ingestServer) appendStarted(ctx context.Context, cluster, stream, rv string, occs []*eventpipev1.Occurrence, started chan<- struct{}) (store.AppendResult, error) {
	defer close(started)
	return s.log.Append(ctx, cluster, stream, rv, occs)
}

// sanitize drops occurrences the log cannot identify (no event_id), counted
// and logged, and stamps the batch's cluster on occurrences without one.
func (s *ingestServer) sanitize(b *eventpipev1.Batch) []*eventpipev1.Occurrence {
	occs := b.GetOccurrences()
	out := occs[:0:0]
	for _, o := range occs {
		if o == nil || o.GetEventId() == "" {
			s.m.rejectedOccurrences.WithLabelValues("missing_event_id").Inc()
			s.logger.Warn("dropping occurrence without event_id", "cluster", b.GetCluster(), "seq", b.GetSeq())
			continue
		}
		if o.Cluster == "" {
			o.Cluster = b.GetCluster()
		}
		out = append(out, o)
	}
	return out
}

func validateBatch(b *eventpipev1.Batch, first bool, lastSeq uint64) error {
	if b.GetCluster() == "" {
		return status.Errorf(codes.InvalidArgument, "batch seq %d: cluster must not be empty", b.GetSeq())
	}
	if !first && b.GetSeq() <= lastSeq {
		return status.Errorf(codes.InvalidArgument, "batch seq %d: seq must increase within a stream (previous %d)", b.GetSeq(), lastSeq)
	}
	return nil
}

// appendStatus maps a store error to a gRPC status the agent can act on:
// anything but the caller going away is retryable (Unavailable), so the
// agent reconnects and re-sends its unacknowledged batches.
func appendStatus(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return status.Errorf(codes.Unavailable, "store append failed, batch not acknowledged (retry): %v", err)
}
