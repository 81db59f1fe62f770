package collector

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/backbone"
)

// HeaderLastPosition is, in Kafka mode, the position at the end of every
// partition the subscription reads, at subscription time (binary gRPC
// metadata): what HeaderLastCursor is in local mode. A client that has
// received nothing yet, or whose no_follow replay ended, resumes from it.
const HeaderLastPosition = "eventpipe-last-position-bin"

// kafkaFollowServer implements eventpipe.v1.Follow over the backbone topic
// (log: kafka), so every collector replica serves any sandbox. A
// subscription reads only the partitions its selector can be in (a
// sandbox_id: its key's partition; the others: all), through a
// backbone.Reader, so duplicates (a batch an agent sent twice) are dropped
// by the same window every backbone consumer uses (holding only the ids
// of records the selector matches).
//
// Positions: a response carries, besides cursor (the record's partition
// offset + 1) and partition, a position: for every partition read, the
// offset of the next record to consider. A client resumes with it on any
// replica (after_position); the resume seeds its dedupe window from the
// records before the position, so a resend written after the position of
// a record delivered before it is not delivered again. after_cursor alone
// is accepted for a sandbox_id selector (one partition) only.
//
// Tail replay: the last `tail` matching occurrences, by the record
// timestamps, scanning each partition backwards at most max_tail_scan
// records (chunk by chunk, memory: one chunk plus `tail` records per
// partition). The live stream then starts at the end of each partition as
// it was at subscription time.
//
// Wiring (the integrator, in collector.New when log: kafka): build it with
// newKafkaFollowServer(cfg.Backbone, cfg.Follow, logger, c.m, reg, c.drain),
// register it with eventpipev1.RegisterFollowServer in place of
// followServer, and Close it after the gRPC server stopped.
type kafkaFollowServer struct {
	eventpipev1.UnimplementedFollowServer
	topic   string
	window  int
	opts    []kgo.Opt
	admin   *kgo.Client
	logger  *slog.Logger
	m       *metrics
	rm      *backbone.ReadMetrics
	chunk   int
	maxTail uint32
	maxScan uint64
	drain   context.Context
	// streams counts the Follow calls in progress: Close waits for them
	// (each closes its own backbone clients).
	streams sync.WaitGroup
}

// newKafkaFollowServer builds the Kafka-mode Follow service. bb must be
// valid (backbone.Config.Validate); reg may be nil.
func newKafkaFollowServer(bb backbone.Config, fc FollowConfig, logger *slog.Logger, m *metrics, reg prometheus.Registerer, drain context.Context) (*kafkaFollowServer, error) {
	opts, err := bb.ClientOptions()
	if err != nil {
		return nil, fmt.Errorf("follow: %w", err)
	}
	rm, err := backbone.NewReadMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("follow: %w", err)
	}
	admin, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("follow: backbone client: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &kafkaFollowServer{
		topic: bb.Topic, window: bb.DedupeWindow, opts: opts, admin: admin, logger: logger, m: m, rm: rm,
		chunk: fc.ReadChunk, maxTail: fc.MaxTail, maxScan: fc.MaxTailScan, drain: drain,
	}, nil
}

// Close waits for the streams in progress to end (stop the gRPC server, or
// cancel drain, first) and releases the backbone client.
func (f *kafkaFollowServer) Close() {
	f.streams.Wait()
	f.admin.Close()
}

func (f *kafkaFollowServer) Follow(req *eventpipev1.FollowRequest, stream eventpipev1.Follow_FollowServer) error {
	f.streams.Add(1)
	defer f.streams.Done()
	return serveFollow(f.drain, stream, func(ctx context.Context) error { return f.follow(ctx, req, stream) })
}

// kafkaMetaTimeout bounds the metadata and offset look-ups of one
// subscription.
const kafkaMetaTimeout = 10 * time.Second

func (f *kafkaFollowServer) follow(ctx context.Context, req *eventpipev1.FollowRequest, stream eventpipev1.Follow_FollowServer) error {
	sel, p, err := admitFollow(ctx, req, f.m, f.maxTail)
	if err != nil {
		return err
	}
	f.m.subscribers.Inc()
	defer f.m.subscribers.Dec()

	mctx, cancel := context.WithTimeout(ctx, kafkaMetaTimeout)
	parts, firsts, ends, err := f.bounds(mctx, sel)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		return status.Errorf(codes.Unavailable, "backbone: %v", err)
	}

	starts := map[int32]backbone.Start{}
	next := map[int32]int64{}
	var replay []tailRecord
	var scannedFrom uint64
	resuming := false
	switch {
	case len(req.GetAfterPosition()) > 0:
		pos, err := parsePosition(req.GetAfterPosition())
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "after_position: %v", err)
		}
		if pos.topic != f.topic {
			f.m.followCursorAhead.Inc()
			return status.Errorf(codes.OutOfRange, "after_position belongs to topic %q, this collector reads %q: resubscribe with tail", pos.topic, f.topic)
		}
		for _, q := range parts {
			n, ok := pos.next[q]
			if !ok {
				// A partition the position does not know (added since):
				// all of it is new to the subscriber.
				n = firsts[q]
			}
			next[q] = n
		}
		resuming = true
	case req.GetAfterCursor() > 0:
		if sel.sandboxID == "" {
			return status.Error(codes.OutOfRange, "this collector reads a partitioned Kafka log: after_cursor is an offset within one partition and needs a sandbox_id selector; resume with after_position (or resubscribe with tail)")
		}
		next[parts[0]] = int64(req.GetAfterCursor())
		resuming = true
	case req.GetTail() > 0:
		var windows map[int32]*backbone.Window
		replay, windows, scannedFrom, err = f.tail(ctx, sel, p, int(req.GetTail()), parts, firsts, ends)
		if err != nil {
			return err
		}
		for _, q := range parts {
			next[q] = ends[q]
			starts[q] = backbone.Start{Offset: ends[q], Window: windows[q]}
		}
	default:
		for _, q := range parts {
			next[q] = ends[q]
			// Nothing before the subscription was sent to it: nothing to
			// seed the window with.
			starts[q] = backbone.Start{Offset: ends[q], Window: backbone.NewWindow(f.window)}
		}
	}
	var lost uint64
	if resuming {
		for _, q := range parts {
			if next[q] > ends[q] {
				f.m.followCursorAhead.Inc()
				f.logger.Error("follow subscriber resumed from a position beyond the end of the backbone; refused",
					"caller", p.Name, "partition", q, "next", next[q], "end", ends[q])
				return status.Errorf(codes.OutOfRange, "the resume position is beyond the end of partition %d (%d > %d): the topic was recreated; resubscribe with tail", q, next[q], ends[q])
			}
			if next[q] < firsts[q] {
				lost += uint64(firsts[q] - next[q])
				next[q] = firsts[q]
			}
			starts[q] = backbone.Start{Offset: next[q]}
		}
	}
	if lost > 0 {
		f.m.followLost.Add(float64(lost))
		f.logger.Warn("follow subscriber resumed behind retention; records lost", "caller", p.Name, "lost_records", lost)
	}

	var first, last uint64 // cursors, for a one-partition subscription
	if len(parts) == 1 {
		q := parts[0]
		first, last = uint64(firsts[q])+1, uint64(ends[q])
		if ends[q] == firsts[q] {
			first = 0
		}
	}
	hdr := metadata.Pairs(HeaderLostRecords, strconv.FormatUint(lost, 10),
		HeaderFirstCursor, strconv.FormatUint(first, 10), HeaderLastCursor, strconv.FormatUint(last, 10),
		HeaderLastPosition, string(followPosition{topic: f.topic, next: ends}.marshal()))
	if scannedFrom > 0 {
		hdr.Append(HeaderTailScannedFrom, strconv.FormatUint(scannedFrom, 10))
	}
	if err := stream.SendHeader(hdr); err != nil {
		return fmt.Errorf("send header: %w", err)
	}
	if lost > 0 {
		stream.SetTrailer(metadata.Pairs(HeaderLostRecords, strconv.FormatUint(lost, 10)))
	}

	// Replay: after each record, its partition's position moves to its
	// next replayed record (or the end): a resume from there sends the
	// rest of the replay, then the live records.
	pos := followPosition{topic: f.topic, next: map[int32]int64{}}
	for _, q := range parts {
		pos.next[q] = ends[q]
	}
	following := make([]int64, len(replay))
	for i := len(replay) - 1; i >= 0; i-- {
		r := replay[i]
		following[i] = pos.next[r.partition]
		pos.next[r.partition] = r.offset
	}
	for i, r := range replay {
		pos.next[r.partition] = following[i]
		if err := f.send(stream, r.partition, r.offset, r.occ, pos); err != nil {
			return err
		}
	}
	return f.live(ctx, stream, sel, p, starts, next, ends, req.GetNoFollow())
}

// bounds returns the partitions sel can be in, their log starts and ends.
func (f *kafkaFollowServer) bounds(ctx context.Context, sel selector) (parts []int32, firsts, ends map[int32]int64, err error) {
	parts, err = backbone.Partitions(ctx, f.admin, f.topic)
	if err != nil {
		return nil, nil, nil, err
	}
	if len(parts) == 0 {
		return nil, nil, nil, fmt.Errorf("topic %s has no partitions", f.topic)
	}
	if sel.sandboxID != "" {
		// The backbone is keyed by sandbox id (backbone.Encode).
		parts = []int32{backbone.PartitionOf([]byte(sel.sandboxID), len(parts))}
	}
	if firsts, err = backbone.ListOffsets(ctx, f.admin, f.topic, parts, true); err != nil {
		return nil, nil, nil, err
	}
	if ends, err = backbone.ListOffsets(ctx, f.admin, f.topic, parts, false); err != nil {
		return nil, nil, nil, err
	}
	return parts, firsts, ends, nil
}

func (f *kafkaFollowServer) send(stream eventpipev1.Follow_FollowServer, partition int32, offset int64, o *eventpipev1.Occurrence, pos followPosition) error {
	if err := stream.Send(&eventpipev1.FollowResponse{Cursor: uint64(offset) + 1, Occurrence: o, Partition: partition, Position: pos.marshal()}); err != nil {
		return err
	}
	f.m.followSent.Inc()
	return nil
}

// live sends every matching record from starts on: up to ends and stop
// when noFollow, else for ever.
func (f *kafkaFollowServer) live(ctx context.Context, stream eventpipev1.Follow_FollowServer, sel selector, p *Principal,
	starts map[int32]backbone.Start, next, ends map[int32]int64, noFollow bool) error {
	done := func() bool {
		for q, n := range next {
			if n < ends[q] {
				return false
			}
		}
		return true
	}
	if noFollow && done() {
		return nil
	}
	rd, err := backbone.NewReaderAt(f.opts, f.topic, starts, f.window, backbone.ConsumerFollow, f.rm, f.logger)
	if err != nil {
		return status.Errorf(codes.Unavailable, "backbone: %v", err)
	}
	defer rd.Close()
	// Only what this subscriber may receive is remembered: its windows
	// stay as small as its selection.
	rd.SetFilter(func(o *eventpipev1.Occurrence) bool { return sel.match(p, o) })
	pos := followPosition{topic: f.topic, next: maps.Clone(next)}
	for {
		recs, err := rd.Poll(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			return status.Errorf(codes.Unavailable, "read backbone: %v", err)
		}
		for _, r := range recs {
			if noFollow && r.Offset >= ends[r.Partition] {
				continue
			}
			if r.Skipped > 0 {
				// Retention removed records of this partition before the
				// subscriber read them: say so, as the local mode does;
				// a resume from the last position reports the loss again
				// in its header and goes on from the oldest record kept.
				f.m.followLost.Add(float64(r.Skipped))
				f.logger.Warn("follow subscriber fell behind retention; records lost", "caller", p.Name, "partition", r.Partition, "lost_records", r.Skipped)
				return status.Errorf(codes.DataLoss, "%d log records after cursor %d of partition %d were removed by retention before they were read; resume with after_position set to the last position received (the loss is reported again in the %s header)",
					r.Skipped, pos.next[r.Partition], r.Partition, HeaderLostRecords)
			}
			pos.next[r.Partition] = r.Offset + 1
			if sel.match(p, r.Occurrence) {
				if err := f.send(stream, r.Partition, r.Offset, r.Occurrence, pos); err != nil {
					return err
				}
			}
		}
		for q := range pos.next {
			pr := rd.Progress(q)
			if noFollow {
				pr = min(pr, ends[q])
			}
			pos.next[q] = max(pos.next[q], pr)
		}
		if noFollow {
			next = pos.next
			if done() {
				return nil
			}
		}
	}
}

// tailRecord is one record of a tail replay.
type tailRecord struct {
	partition int32
	offset    int64
	ts        time.Time
	occ       *eventpipev1.Occurrence
}

// tail returns the last n matching records across parts, ordered by
// record timestamp (a merge that keeps each partition's offset order, so
// what it keeps of each partition is a suffix of its matches), and per
// partition a dedupe window holding the ids of the matches it found.
// scannedFrom is the lowest cursor at which a partition's scan stopped at
// max_tail_scan (0: every scan was complete).
func (f *kafkaFollowServer) tail(ctx context.Context, sel selector, p *Principal, n int, parts []int32, firsts, ends map[int32]int64) (
	[]tailRecord, map[int32]*backbone.Window, uint64, error) {
	lists := map[int32][]tailRecord{} // newest first
	windows := map[int32]*backbone.Window{}
	var scannedFrom uint64
	for _, q := range parts {
		recs, ids, stopped, err := f.tailPartition(ctx, sel, p, n, q, firsts[q], ends[q])
		if err != nil {
			return nil, nil, 0, err
		}
		lists[q] = recs
		w := backbone.NewWindow(f.window)
		for _, id := range ids {
			w.Remember(id)
		}
		windows[q] = w
		if stopped > 0 && (scannedFrom == 0 || uint64(stopped)+1 < scannedFrom) {
			scannedFrom = uint64(stopped) + 1
		}
	}
	idx := map[int32]int{}
	var out []tailRecord
	for len(out) < n {
		var best *tailRecord
		for _, q := range parts {
			l := lists[q]
			if idx[q] >= len(l) {
				continue
			}
			c := &l[idx[q]]
			if best == nil || c.ts.After(best.ts) || (c.ts.Equal(best.ts) && c.partition > best.partition) {
				best = c
			}
		}
		if best == nil {
			break
		}
		out = append(out, *best)
		idx[best.partition]++
	}
	slices.Reverse(out)
	return out, windows, scannedFrom, nil
}

// tailPartition scans partition q backwards from end, one chunk at a time,
// until it has n distinct matches, reaches the log start, or has scanned
// max_tail_scan records (stopped is then the lowest offset scanned). recs
// is newest first; ids are the event ids of every match found, oldest
// first (copies included), for the live stream's dedupe window.
func (f *kafkaFollowServer) tailPartition(ctx context.Context, sel selector, p *Principal, n int, q int32, first, end int64) (
	recs []tailRecord, ids []string, stopped int64, _ error) {
	if end <= first || n <= 0 {
		return nil, nil, 0, nil
	}
	chunk := int64(max(f.chunk, 1))
	lo := max(end-chunk, first)
	cl, err := kgo.NewClient(append(slices.Clip(f.opts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{f.topic: {q: kgo.NewOffset().At(lo)}}),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.KeepControlRecords())...)
	if err != nil {
		return nil, nil, 0, status.Errorf(codes.Unavailable, "backbone: %v", err)
	}
	defer cl.Close()
	seen := map[string]bool{}
	var chunks [][]string // matched ids per chunk, newest chunk first
	var scanned uint64
	hi := end
	for len(recs) < n && hi > first {
		if scanned >= f.maxScan {
			stopped = hi
			break
		}
		lo = max(hi-chunk, first)
		got, err := f.readRange(ctx, cl, q, lo, hi, hi != end)
		if err != nil {
			return nil, nil, 0, err
		}
		scanned += uint64(hi - lo)
		var chunkIDs []string
		for i := len(got) - 1; i >= 0; i-- {
			rec := got[i]
			if sel.sandboxID != "" && string(rec.Key) != sel.sandboxID {
				continue // another sandbox sharing the partition: no decode
			}
			o, err := backbone.Decode(rec)
			if err != nil || !sel.match(p, o) {
				continue
			}
			id := o.GetEventId()
			chunkIDs = append(chunkIDs, id)
			if id != "" && seen[id] {
				continue // an older copy of a record kept already
			}
			seen[id] = true
			if len(recs) < n {
				recs = append(recs, tailRecord{partition: q, offset: rec.Offset, ts: rec.Timestamp, occ: o})
			}
		}
		slices.Reverse(chunkIDs)
		chunks = append(chunks, chunkIDs)
		hi = lo
	}
	for i := len(chunks) - 1; i >= 0; i-- {
		ids = append(ids, chunks[i]...)
	}
	return recs, ids, stopped, nil
}

// readRangeTimeout bounds reading one chunk of a tail scan.
const readRangeTimeout = 30 * time.Second

// readRange reads offsets [lo, hi) of partition q with cl (a client
// consuming q, transaction markers kept), in offset order. The backbone is
// not compacted, but with transactions its read_committed view has holes
// (aborted records): the range is complete once the client returned an
// offset at or past hi-1 (a record, or a marker, which is not returned).
func (f *kafkaFollowServer) readRange(ctx context.Context, cl *kgo.Client, q int32, lo, hi int64, seek bool) ([]*kgo.Record, error) {
	if seek {
		cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{f.topic: {q: {Epoch: -1, Offset: lo}}})
	}
	rctx, cancel := context.WithTimeout(ctx, readRangeTimeout)
	defer cancel()
	var out []*kgo.Record
	for {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			if ctx.Err() != nil {
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			return nil, status.Errorf(codes.Unavailable, "read backbone partition %d [%d, %d): no record at %d within %s", q, lo, hi, hi-1, readRangeTimeout)
		}
		complete := false
		fs.EachRecord(func(r *kgo.Record) {
			if r.Partition != q || r.Offset < lo {
				return // buffered before the seek
			}
			complete = complete || r.Offset >= hi-1
			if r.Offset >= hi || r.Attrs.IsControl() {
				return
			}
			if len(out) > 0 && r.Offset <= out[len(out)-1].Offset {
				return
			}
			out = append(out, r)
		})
		if complete {
			return out, nil
		}
	}
}

// followPosition is the Follow resume position in Kafka mode: the topic,
// and per partition the offset of the next record to consider. Wire form
// (opaque to clients): version byte 1, uvarint topic length, topic,
// uvarint count, then count pairs of uvarint partition, uvarint offset, by
// partition.
type followPosition struct {
	topic string
	next  map[int32]int64
}

const positionVersion = 1

func (p followPosition) marshal() []byte {
	b := make([]byte, 0, 2+len(p.topic)+1+len(p.next)*6)
	b = append(b, positionVersion)
	b = binary.AppendUvarint(b, uint64(len(p.topic)))
	b = append(b, p.topic...)
	b = binary.AppendUvarint(b, uint64(len(p.next)))
	for _, q := range slices.Sorted(maps.Keys(p.next)) {
		b = binary.AppendUvarint(b, uint64(q))
		b = binary.AppendUvarint(b, uint64(max(p.next[q], 0)))
	}
	return b
}

// Bounds of a parsed position.
const (
	maxPositionTopic      = 249
	maxPositionPartitions = 100_000
)

var errPosition = errors.New("not a position this collector sent")

func parsePosition(b []byte) (followPosition, error) {
	if len(b) == 0 || b[0] != positionVersion {
		return followPosition{}, fmt.Errorf("%w (unknown version)", errPosition)
	}
	b = b[1:]
	uv := func(limit uint64) (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > limit {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	tl, ok := uv(maxPositionTopic)
	if !ok || uint64(len(b)) < tl {
		return followPosition{}, fmt.Errorf("%w (topic)", errPosition)
	}
	p := followPosition{topic: string(b[:tl]), next: map[int32]int64{}}
	b = b[tl:]
	count, ok := uv(maxPositionPartitions)
	if !ok {
		return followPosition{}, fmt.Errorf("%w (partition count)", errPosition)
	}
	for range count {
		q, ok1 := uv(1<<31 - 1)
		off, ok2 := uv(1<<63 - 1)
		if !ok1 || !ok2 {
			return followPosition{}, fmt.Errorf("%w (partition entry)", errPosition)
		}
		p.next[int32(q)] = int64(off)
	}
	if len(b) != 0 {
		return followPosition{}, fmt.Errorf("%w (trailing bytes)", errPosition)
	}
	return p, nil
}
