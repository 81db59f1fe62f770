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
	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/backbone"
	"github.com/eventpipe/eventpipe/collector/store"
	"github.com/eventpipe/eventpipe/sinks"
)

// DefaultStream is the stream name used when a batch or GetCursor names none.
const DefaultStream = "events"

// ingestLog is what ingest needs from the log: the local store
// (storeLog) or the Kafka backbone (backboneLog).
type ingestLog interface {
	// Append stores occs durably before it returns (see store.Append).
	Append(ctx context.Context, cluster, stream, resourceVersion string, occs []*eventpipev1.Occurrence) (store.AppendResult, error)
	// ClusterCursor is the stream's last recorded resourceVersion. An error
	// means the answer is unknown (GetCursor says Unavailable), never "no
	// cursor": an agent told "none" relists everything.
	ClusterCursor(ctx context.Context, cluster, stream string) (string, bool, error)
	// Read reads back stored records by offset; only called when Append
	// reported duplicates.
	Read(ctx context.Context, from uint64, max int) ([]sinks.Record, uint64, error)
}

// storeLog is the local store as ingest sees it.
type storeLog struct{ *store.Store }

func (l storeLog) ClusterCursor(_ context.Context, cluster, stream string) (string, bool, error) {
	rv, ok := l.Store.ClusterCursor(cluster, stream)
	return rv, ok, nil
}

// backboneLog is the Kafka backbone as ingest sees it. It never reports
// duplicates (consumers remove them), so Read is never needed.
type backboneLog struct{ *backbone.Writer }

func (backboneLog) Read(context.Context, uint64, int) ([]sinks.Record, uint64, error) {
	return nil, 0, errors.New("the Kafka backbone has no log offsets to read back")
}

// ingestServer implements eventpipe.v1.Ingest. A Batch is acknowledged only
// after store.Append returned, i.e. after it is durable and de-duplicated.
type ingestServer struct {
	eventpipev1.UnimplementedIngestServer
	log      ingestLog
	logger   *slog.Logger
	m        *metrics
	pipeline int
	// maxRecv is grpc.max_recv_bytes, for the log line of a batch over it.
	maxRecv int
	// maxOcc is the largest encoded occurrence the log takes (0:
	// maxOccurrenceBytes, the local store's limit).
	maxOcc int
	// drain is cancelled when the collector starts shutting down.
	drain context.Context
}

func (s *ingestServer) GetCursor(ctx context.Context, req *eventpipev1.GetCursorRequest) (*eventpipev1.GetCursorResponse, error) {
	if req.GetCluster() == "" {
		return nil, status.Error(codes.InvalidArgument, "cluster must not be empty")
	}
	stream := req.GetStream()
	if stream == "" {
		stream = DefaultStream
	}
	rv, ok, err := s.log.ClusterCursor(ctx, req.GetCluster(), stream)
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		s.logger.Warn("cursor lookup failed; the agent asks again", "cluster", req.GetCluster(), "stream", stream, "err", err)
		return nil, status.Errorf(codes.Unavailable, "cursor of %s/%s unknown for now (retry): %v", req.GetCluster(), stream, err)
	}
	return &eventpipev1.GetCursorResponse{ResourceVersion: rv, Found: ok}, nil
}

// pending is one received batch on its way to the log. done is closed when
// its append is over; ack or err is then set.
type pending struct {
	batch    *eventpipev1.Batch
	occs     []*eventpipev1.Occurrence // sanitized
	rejected []*eventpipev1.Rejection  // refused for good, reported in the ack
	received time.Time
	done     chan struct{}
	ack      *eventpipev1.Ack
	err      error
}

// Ship receives batches, appends them in arrival order and sends their acks
// in that order, each only after its batch is durable.
//
// Pipelining: up to s.pipeline batches of a stream are in flight. While one
// append (one group commit of the log) runs, the receiver keeps reading;
// the batches that arrived meanwhile go to the log together in the next
// Append call, in order, so they share one fsync and the log keeps the
// stream's order (and the cluster cursor never moves backwards).
// Backpressure: with s.pipeline batches in flight the receiver stops
// calling Recv, so gRPC flow control slows the agent; nothing is buffered
// beyond that bound.
func (s *ingestServer) Ship(stream eventpipev1.Ingest_ShipServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	who := principalName(ctx)

	inflight := make(chan *pending, s.pipeline) // ack order
	toAppend := make(chan *pending, s.pipeline)
	recvErr := make(chan error, 1)
	go func() {
		defer close(inflight)
		defer close(toAppend)
		recvErr <- s.receive(ctx, stream, inflight, toAppend)
	}()
	appenderDone := make(chan struct{})
	go func() {
		defer close(appenderDone)
		s.appender(ctx, toAppend)
	}()

	// On an error the handler returns at once: that ends the stream, which
	// unblocks the receiver's Recv; the receiver and the appender then stop
	// on their own (ctx is cancelled, nothing more is acknowledged).
	for {
		var pd *pending
		select {
		case p, ok := <-inflight:
			if !ok {
				<-appenderDone
				if rerr := <-recvErr; rerr != nil && !errors.Is(rerr, io.EOF) {
					return rerr
				}
				return nil
			}
			pd = p
		case <-s.drain.Done():
			return s.drainStream(stream, inflight, who)
		}
		<-pd.done
		if pd.err != nil {
			if c := status.Code(pd.err); c != codes.Canceled && c != codes.DeadlineExceeded {
				s.logger.Warn("ingest stream ended", "caller", who, "seq", pd.batch.GetSeq(), "err", pd.err)
			}
			return pd.err
		}
		if err := stream.Send(pd.ack); err != nil {
			return fmt.Errorf("send ack: %w", err)
		}
		s.m.ackLatency.Observe(time.Since(pd.received).Seconds())
	}
}

// drainStream runs at shutdown: it acknowledges the batches already
// received (their appends are under way) and ends the stream with
// Unavailable, so the agent reconnects (to this collector once restarted,
// or another) and re-sends whatever was not acknowledged.
func (s *ingestServer) drainStream(stream eventpipev1.Ingest_ShipServer, inflight <-chan *pending, who string) error {
	for {
		select {
		case pd, ok := <-inflight:
			if !ok {
				return status.Error(codes.Unavailable, "collector shutting down")
			}
			<-pd.done
			if pd.err != nil {
				return pd.err
			}
			if err := stream.Send(pd.ack); err != nil {
				return fmt.Errorf("send ack: %w", err)
			}
			s.m.ackLatency.Observe(time.Since(pd.received).Seconds())
		default:
			s.logger.Info("ingest stream closed for shutdown", "caller", who)
			return status.Error(codes.Unavailable, "collector shutting down: reconnect and re-send unacknowledged batches")
		}
	}
}

// receive reads batches until EOF or an error, validates them and queues
// them for the appender and, in the same order, for the ack sender.
func (s *ingestServer) receive(ctx context.Context, stream eventpipev1.Ingest_ShipServer, inflight, toAppend chan<- *pending) error {
	var lastSeq uint64
	first := true
	for {
		b, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.EOF
			}
			if status.Code(err) == codes.ResourceExhausted {
				// gRPC refused a message over grpc.max_recv_bytes before
				// decoding it: the batch never reaches us, so this is the
				// only place that can count and log it. The agent sees
				// the same status and dead-letters the batch.
				s.m.batches.Inc()
				s.m.rejectedBatches.WithLabelValues(batchTooLarge).Inc()
				s.logger.Warn("batch refused: larger than grpc.max_recv_bytes; the agent drops it", "caller", principalName(ctx),
					"after_seq", lastSeq, "max_recv_bytes", s.maxRecv, "err", err)
			}
			return err
		}
		now := time.Now()
		s.m.batches.Inc()
		if reason, verr := validateBatch(b, first, lastSeq); verr != nil {
			s.m.rejectedBatches.WithLabelValues(reason).Inc()
			s.logger.Warn("batch refused", "caller", principalName(ctx), "seq", b.GetSeq(), "reason", reason, "err", verr)
			return verr
		}
		first = false
		lastSeq = b.GetSeq()
		pd := &pending{batch: b, received: now, done: make(chan struct{})}
		pd.occs, pd.rejected = s.sanitize(b)
		// inflight has the same capacity as toAppend and is drained by the
		// sender only after appends finish, so it is the bound.
		select {
		case inflight <- pd:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case toAppend <- pd:
		case <-ctx.Done():
			pd.err = status.FromContextError(ctx.Err()).Err()
			close(pd.done)
			return ctx.Err()
		}
	}
}

// appender appends queued batches in order: whatever has queued up while
// the previous append ran goes to the log in one Append call.
func (s *ingestServer) appender(ctx context.Context, toAppend <-chan *pending) {
	var failed error
	for pd := range toAppend {
		group := []*pending{pd}
	drain:
		for len(group) < s.pipeline {
			select {
			case more, ok := <-toAppend:
				if !ok {
					break drain
				}
				group = append(group, more)
			default:
				break drain
			}
		}
		if failed == nil && ctx.Err() != nil {
			failed = status.FromContextError(ctx.Err()).Err()
		}
		if failed != nil {
			// After a failure nothing later in the stream may be stored
			// ahead of the failed batch: the agent re-sends from there.
			for _, g := range group {
				g.err = failed
				close(g.done)
			}
			continue
		}
		if err := s.appendGroup(ctx, group); err != nil {
			failed = err
		}
	}
}

// appendGroup stores the group's batches, one Append (one group commit)
// per run of batches naming the same (cluster, stream), and fills each
// batch's ack. After a failure the later batches fail too: nothing may be
// stored ahead of a batch the agent will re-send.
func (s *ingestServer) appendGroup(ctx context.Context, group []*pending) error {
	defer func() {
		for _, g := range group {
			close(g.done)
		}
	}()
	for i := 0; i < len(group); {
		cluster, stream := group[i].batch.GetCluster(), orDefault(group[i].batch.GetStream())
		j := i + 1
		for j < len(group) && group[j].batch.GetCluster() == cluster && orDefault(group[j].batch.GetStream()) == stream {
			j++
		}
		if err := s.appendRun(ctx, group[i:j], cluster, stream); err != nil {
			for _, g := range group[j:] {
				g.err = err
			}
			return err
		}
		i = j
	}
	return nil
}

func orDefault(stream string) string {
	if stream == "" {
		return DefaultStream
	}
	return stream
}

// appendRun appends batches of one (cluster, stream) in one call and sets
// their acks or errors. The cursor becomes the last non-empty
// resourceVersion of the run, as if the batches were appended one by one.
func (s *ingestServer) appendRun(ctx context.Context, group []*pending, cluster, stream string) error {
	var occs []*eventpipev1.Occurrence
	rv := ""
	for _, g := range group {
		occs = append(occs, g.occs...)
		if r := g.batch.GetResourceVersion(); r != "" {
			rv = r
		}
	}
	if len(group) == 1 {
		occs = group[0].occs
	}
	s.m.groupBatches.Observe(float64(len(group)))
	res, err := s.log.Append(ctx, cluster, stream, rv, occs)
	if err != nil && len(group) > 1 && errors.Is(err, store.ErrInvalid) {
		// Find the batch at fault: append one by one, in order.
		for i := range group {
			if err := s.appendRun(ctx, group[i:i+1], cluster, stream); err != nil {
				for _, rest := range group[i+1:] {
					rest.err = err
				}
				return err
			}
		}
		return nil
	}
	if err != nil && errors.Is(err, store.ErrInvalid) && ctx.Err() == nil {
		// One batch the log refused: refuse its bad occurrences one by one
		// and store the rest, or, when no single occurrence is at fault,
		// refuse the whole batch for good (named in a BatchRejection).
		return s.refuseInvalid(ctx, group[0], cluster, stream, err)
	}
	if err != nil {
		st := appendStatus(ctx, err)
		for _, g := range group {
			g.err = st
		}
		s.m.appendFailures.Add(float64(len(group)))
		s.logger.Warn("append refused; batches not acknowledged", "cluster", cluster, "first_seq", group[0].batch.GetSeq(), "batches", len(group), "err", err)
		return st
	}
	s.m.ingested.Add(float64(res.Stored))
	s.m.duplicates.Add(float64(res.Duplicates))
	if len(group) == 1 {
		group[0].ack = &eventpipev1.Ack{Seq: group[0].batch.GetSeq(), Stored: uint32(res.Stored), Duplicates: uint32(res.Duplicates), LastOffset: res.LastOffset, Rejected: group[0].rejected}
		return nil
	}
	if res.Duplicates == 0 && res.LastOffset == 0 {
		// A log without offsets (Kafka mode): counts only.
		for _, g := range group {
			g.ack = &eventpipev1.Ack{Seq: g.batch.GetSeq(), Stored: uint32(len(g.occs)), Rejected: g.rejected}
		}
		return nil
	}
	if res.Duplicates == 0 {
		// Everything stored, densely and in order: split by length.
		off := res.LastOffset - uint64(res.Stored)
		for _, g := range group {
			n := uint64(len(g.occs))
			g.ack = &eventpipev1.Ack{Seq: g.batch.GetSeq(), Stored: uint32(n), Rejected: g.rejected}
			if n > 0 {
				off += n
				g.ack.LastOffset = off
			}
		}
		return nil
	}
	return s.splitWithDuplicates(ctx, group, res)
}

// splitWithDuplicates attributes a merged append's outcome to its batches
// when some occurrences were duplicates: the records just stored are read
// back and matched by event_id (a repeat inside the group is a duplicate of
// its first occurrence, as it would be appended one batch at a time).
func (s *ingestServer) splitWithDuplicates(ctx context.Context, group []*pending, res store.AppendResult) error {
	storedAt := make(map[string]uint64, res.Stored)
	if res.Stored > 0 {
		from := res.LastOffset - uint64(res.Stored) + 1
		for from <= res.LastOffset {
			recs, _, err := s.log.Read(ctx, from, int(res.LastOffset-from+1))
			if err != nil || len(recs) == 0 {
				st := status.Errorf(codes.Unavailable, "read back stored records: %v", err)
				for _, g := range group {
					g.err = st
				}
				return st
			}
			for _, r := range recs {
				if r.Offset > res.LastOffset {
					break
				}
				storedAt[r.Occurrence.GetEventId()] = r.Offset
			}
			from = recs[len(recs)-1].Offset + 1
		}
	}
	for _, g := range group {
		a := &eventpipev1.Ack{Seq: g.batch.GetSeq(), Rejected: g.rejected}
		for _, o := range g.occs {
			if off, ok := storedAt[o.GetEventId()]; ok {
				delete(storedAt, o.GetEventId())
				a.Stored++
				a.LastOffset = max(a.LastOffset, off)
			} else {
				a.Duplicates++
			}
		}
		g.ack = a
	}
	return nil
}

// sanitize sets aside the occurrences the log cannot identify (nil, no
// event_id) or a sink cannot write (a timestamp outside protobuf's range,
// which no JSON encoder can render) as rejections for the ack, counted and
// logged, and stamps the batch's cluster on occurrences without one.
func (s *ingestServer) sanitize(b *eventpipev1.Batch) ([]*eventpipev1.Occurrence, []*eventpipev1.Rejection) {
	occs := b.GetOccurrences()
	out := occs[:0:0]
	var rejected []*eventpipev1.Rejection
	for i, o := range occs {
		if o == nil || o.GetEventId() == "" {
			rejected = append(rejected, s.reject(b, i, o, reasonMissingEventID, "occurrence has no event_id"))
			continue
		}
		if path, problem := badTimestamp(o); path != "" {
			rejected = append(rejected, s.reject(b, i, o, reasonInvalid, fmt.Sprintf("%s is outside the valid timestamp range (years 1 to 9999): %s", path, problem)))
			continue
		}
		if o.Cluster == "" {
			o.Cluster = b.GetCluster()
		}
		out = append(out, o)
	}
	return out, rejected
}

// Reasons an occurrence is refused for good (Rejection.reason and the
// reason label of eventpipe_collector_ingest_rejected_occurrences_total).
const (
	reasonMissingEventID = "missing_event_id"
	reasonTooLarge       = "too_large"
	reasonInvalid        = "invalid"
)

var rejectionReasons = []string{reasonMissingEventID, reasonTooLarge, reasonInvalid}

// maxOccurrenceBytes mirrors the log's limit on one encoded occurrence
// (collector/store refuses larger ones with ErrInvalid).
const maxOccurrenceBytes = 4 << 20

// reject counts, logs and describes the refusal of occurrence i of b.
func (s *ingestServer) reject(b *eventpipev1.Batch, i int, o *eventpipev1.Occurrence, reason, msg string) *eventpipev1.Rejection {
	s.m.rejectedOccurrences.WithLabelValues(reason).Inc()
	s.logger.Warn("occurrence refused for good; reported to the agent", "cluster", b.GetCluster(), "seq", b.GetSeq(),
		"index", i, "event_id", o.GetEventId(), "reason", reason, "detail", msg)
	return &eventpipev1.Rejection{Index: uint32(i), EventId: o.GetEventId(), Reason: reason, Message: msg}
}

// checkOccurrence says why the log would refuse o on its own ("" when it
// would not): the slow path, run only after the log refused a batch.
func checkOccurrence(o *eventpipev1.Occurrence, limit int) (reason, msg string) {
	if limit <= 0 {
		limit = maxOccurrenceBytes
	}
	if size := proto.Size(o); size > limit {
		return reasonTooLarge, fmt.Sprintf("encoded occurrence is %d bytes, limit %d", size, limit)
	}
	if _, err := proto.Marshal(o); err != nil {
		return reasonInvalid, fmt.Sprintf("cannot be encoded: %v", err)
	}
	return "", ""
}

// refuseInvalid handles a batch the log refused as invalid (cause): the
// occurrences at fault are refused one by one and the rest appended; when
// none is at fault on its own, the whole batch is refused for good with
// InvalidArgument carrying a BatchRejection that names it, so the agent
// drops exactly this batch instead of re-sending it for ever.
func (s *ingestServer) refuseInvalid(ctx context.Context, g *pending, cluster, stream string, cause error) error {
	b := g.batch
	index := make(map[*eventpipev1.Occurrence]int, len(b.GetOccurrences()))
	for i, o := range b.GetOccurrences() {
		index[o] = i
	}
	kept := g.occs[:0:0]
	for _, o := range g.occs {
		if reason, msg := checkOccurrence(o, s.maxOcc); reason != "" {
			g.rejected = append(g.rejected, s.reject(b, index[o], o, reason, msg))
			continue
		}
		kept = append(kept, o)
	}
	if len(kept) < len(g.occs) {
		g.occs = kept
		return s.appendRun(ctx, []*pending{g}, cluster, stream)
	}
	s.m.rejectedBatches.WithLabelValues(batchInvalid).Inc()
	rej := &eventpipev1.BatchRejection{Seq: b.GetSeq(), Reason: "invalid", Message: cause.Error()}
	for _, o := range g.occs {
		rej.Occurrences = append(rej.Occurrences, &eventpipev1.Rejection{Index: uint32(index[o]), EventId: o.GetEventId(), Reason: reasonInvalid, Message: cause.Error()})
	}
	s.logger.Warn("batch refused for good; the agent drops it", "cluster", cluster, "seq", b.GetSeq(), "occurrences", len(g.occs), "err", cause)
	st := batchRejected(codes.InvalidArgument, rej)
	g.err = st
	return st
}

// batchRejected is the status ending a stream that refuses batch rej.Seq
// for good, with rej attached so the agent knows which batch to drop.
func batchRejected(code codes.Code, rej *eventpipev1.BatchRejection) error {
	st := status.New(code, fmt.Sprintf("batch seq %d refused for good: %s", rej.GetSeq(), rej.GetMessage()))
	if withDetail, err := st.WithDetails(rej); err == nil {
		st = withDetail
	}
	return st.Err()
}

// Reasons a whole batch is refused (the reason label of
// eventpipe_collector_ingest_rejected_batches_total).
const (
	batchTooLarge   = "too_large"     // over grpc.max_recv_bytes
	batchNoCluster  = "invalid_batch" // no cluster
	batchOutOfOrder = "out_of_order"  // seq did not increase
	batchInvalid    = "invalid"       // the log refused it and no occurrence alone
)

var batchRejectionReasons = []string{batchTooLarge, batchNoCluster, batchOutOfOrder, batchInvalid}

// validateBatch returns the reason and status refusing b, or "", nil.
func validateBatch(b *eventpipev1.Batch, first bool, lastSeq uint64) (string, error) {
	if b.GetCluster() == "" {
		return batchNoCluster, batchRejected(codes.InvalidArgument, &eventpipev1.BatchRejection{Seq: b.GetSeq(), Reason: "invalid_batch",
			Message: fmt.Sprintf("batch seq %d: cluster must not be empty", b.GetSeq())})
	}
	if !first && b.GetSeq() <= lastSeq {
		// A protocol error, not this batch's content: no BatchRejection,
		// the agent re-sends on a new stream.
		return batchOutOfOrder, status.Errorf(codes.InvalidArgument, "batch seq %d: seq must increase within a stream (previous %d)", b.GetSeq(), lastSeq)
	}
	return "", nil
}

// principalName names the caller of ctx for logs.
func principalName(ctx context.Context) string {
	if p := principalFrom(ctx); p != nil {
		return p.Name
	}
	return "unknown"
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
	if errors.Is(err, store.ErrInvalid) {
		return status.Errorf(codes.InvalidArgument, "batch refused by the log: %v", err)
	}
	return status.Errorf(codes.Unavailable, "log append failed, batch not acknowledged (retry): %v", err)
}
