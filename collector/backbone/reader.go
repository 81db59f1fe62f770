package backbone

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Record is one decoded backbone record.
type Record struct {
	Partition  int32
	Offset     int64
	Occurrence *eventpipev1.Occurrence
	// Skipped counts the offsets of this partition that were never read
	// between the previous record handled and this one and lie below the
	// partition's log start: removed by retention while the consumer was
	// behind. The consumer reports them as lost; 0 normally. Other offsets
	// a read_committed consumer never sees (transaction markers, records of
	// aborted transactions) are not losses and are not counted.
	Skipped int64
}

// Reader reads some partitions of the backbone topic from a start offset
// each, decoded, with duplicates removed by one dedupe Window per
// partition. It is what every eventpipe consumer of the backbone uses (a
// sink's partition runner, a Follow subscriber), so they all drop the same
// resends.
//
// Seeding: a consumer that starts at offset X (a restart, a rebalance that
// moved the partition here, a Follow resume) first reads back up to
// window records before X into the window, without delivering them. A
// resend that lands at or after X of a record written before X is then
// still recognised; without seeding it would be delivered again after every
// restart.
//
// Records are returned in offset order within a partition; partitions are
// interleaved. Undecodable records are counted, logged and skipped: a
// foreign record never stops a consumer.
type Reader struct {
	cl     *kgo.Client
	topic  string
	parts  map[int32]*partState
	m      consumerMetrics
	logger *slog.Logger

	mu  sync.Mutex
	hwm map[int32]int64 // high watermarks seen in fetches

	filter func(*eventpipev1.Occurrence) bool
	// poll is the client's PollFetches (a test stands in for it).
	poll func(context.Context) kgo.Fetches
}

// SetFilter makes the Reader consider only the occurrences filter keeps
// (a Follow's selector): the others are neither delivered nor remembered
// in the window, so its memory holds only what the consumer could receive.
// Records are then decoded before the window check. Call it before the
// first Poll.
func (r *Reader) SetFilter(filter func(*eventpipev1.Occurrence) bool) { r.filter = filter }

type partState struct {
	start    int64 // first offset delivered; before it the window is seeded
	w        *Window
	progress int64 // offset after the last record handled at or after start
	gap      int64 // offsets skipped, not yet reported with a delivered record
	logStart int64 // the partition's log start, as the last fetch said
}

// Start is where a Reader begins in one partition.
type Start struct {
	// Offset is the first offset delivered. It must not be below the
	// partition's log start (the caller accounts for what retention
	// removed before it): the first record read after it must be at
	// Offset, and any offset not read from there on is reported as
	// Record.Skipped.
	Offset int64
	// Window, when set, is the partition's dedupe window already filled by
	// the caller (a Follow tail replay fills it with what it sent): the
	// Reader then reads from Offset without seeding. When nil, the Reader
	// seeds a new window from up to its size records before Offset.
	Window *Window
}

// NewReader opens a client (opts: the backbone's ClientOptions) that reads
// topic's partitions from starts (partition -> first offset to deliver),
// seeding each partition's window of size window from up to window records
// before its start. consumer labels the metrics (SinkConsumer(name) or
// ConsumerFollow). m and logger may be nil.
func NewReader(opts []kgo.Opt, topic string, starts map[int32]int64, window int, consumer string, m *ReadMetrics, logger *slog.Logger) (*Reader, error) {
	at := make(map[int32]Start, len(starts))
	for p, o := range starts {
		at[p] = Start{Offset: o}
	}
	return NewReaderAt(opts, topic, at, window, consumer, m, logger)
}

// NewReaderAt is NewReader with a Start per partition.
func NewReaderAt(opts []kgo.Opt, topic string, starts map[int32]Start, window int, consumer string, m *ReadMetrics, logger *slog.Logger) (*Reader, error) {
	if len(starts) == 0 {
		return nil, errors.New("backbone reader: no partitions")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Reader{topic: topic, parts: map[int32]*partState{}, m: m.forConsumer(consumer),
		logger: logger.With("consumer", consumer, "topic", topic), hwm: map[int32]int64{}}
	at := map[int32]kgo.Offset{}
	for p, st := range starts {
		start := max(st.Offset, 0)
		ps := &partState{start: start, w: st.Window, progress: start}
		from := start
		if ps.w == nil {
			ps.w = NewWindow(window)
			// Below the log start the client resets to the earliest
			// offset (ConsumeResetOffset): the seed is then what
			// retention kept.
			from = max(start-int64(window), 0)
		}
		r.parts[p] = ps
		at[p] = kgo.NewOffset().At(from)
	}
	all := append(slices.Clip(opts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: at}),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(500*time.Millisecond),
		// Transaction markers are returned (and skipped by accept), so
		// Progress moves past them like past any record handled.
		kgo.KeepControlRecords(),
	)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("backbone reader: %w", err)
	}
	r.cl, r.poll = cl, cl.PollFetches
	return r, nil
}

// Close releases the client.
func (r *Reader) Close() { r.cl.Close() }

// Poll blocks until it has handled at least one record at or after a
// partition's start, or ctx ends (ctx's error), and returns the records to
// deliver: possibly none, when every record fetched was a duplicate or
// undecodable (Progress then moved). Fetch errors the client retries by
// itself are logged and waited out.
//
// Records a fetch returned are always handed over, even when ctx ended
// while it returned (a caller's batch deadline): the client has moved
// past them, and dropping them would skip them silently.
func (r *Reader) Poll(ctx context.Context) ([]Record, error) {
	for {
		fs := r.poll(ctx)
		if fs.IsClientClosed() {
			return nil, kgo.ErrClientClosed
		}
		if out, handled := r.take(fs); handled {
			return out, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// take runs a poll's records through the windows; handled reports whether
// any record at or after a start was handled.
func (r *Reader) take(fs kgo.Fetches) (out []Record, handled bool) {
	fs.EachError(func(t string, p int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return
		}
		r.logger.Warn("backbone fetch failed; retrying", "partition", p, "err", err)
	})
	r.mu.Lock()
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if p.Err == nil && p.HighWatermark > r.hwm[p.Partition] {
			r.hwm[p.Partition] = p.HighWatermark
		}
		if ps := r.parts[p.Partition]; ps != nil && p.Err == nil && p.LogStartOffset > ps.logStart {
			ps.logStart = p.LogStartOffset
		}
	})
	r.mu.Unlock()
	fs.EachRecord(func(rec *kgo.Record) {
		o, ok, h := r.accept(rec)
		handled = handled || h
		if ok {
			ps := r.parts[rec.Partition]
			out = append(out, Record{Partition: rec.Partition, Offset: rec.Offset, Occurrence: o, Skipped: ps.gap})
			ps.gap = 0
		}
	})
	return out, handled
}

// HighWatermark is the highest high watermark (the offset the next record
// of p will get) seen in a fetch of p, 0 before the first fetch. Safe for
// concurrent use.
func (r *Reader) HighWatermark(p int32) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hwm[p]
}

// Progress is the offset after the last record of p the Reader handled
// (delivered, dropped as a duplicate or skipped as undecodable), the start
// offset before any. Poll's goroutine only.
func (r *Reader) Progress(p int32) int64 {
	if ps := r.parts[p]; ps != nil {
		return ps.progress
	}
	return 0
}

// accept runs one fetched record through its partition's window; handled
// is false for a seeding record (before the start).
func (r *Reader) accept(rec *kgo.Record) (_ *eventpipev1.Occurrence, deliver, handled bool) {
	ps := r.parts[rec.Partition]
	if ps == nil {
		return nil, false, false
	}
	ev := ps.w.Evictions()
	defer func() {
		if d := ps.w.Evictions() - ev; d > 0 {
			r.m.evictions.Add(float64(d))
		}
	}()
	if rec.Attrs.IsControl() {
		// A transaction's commit or abort marker: handled, never delivered
		// nor remembered.
		if rec.Offset >= ps.progress && rec.Offset >= ps.start {
			ps.progress = rec.Offset + 1
			return nil, false, true
		}
		return nil, false, false
	}
	id := EventID(rec)
	var o *eventpipev1.Occurrence
	if rec.Offset >= ps.start {
		if rec.Offset < ps.progress {
			return nil, false, false // read again (the client went back): handled already
		}
		// Only offsets below the log start were removed: a gap above it
		// is a transaction's marker or its aborted records.
		if gap := min(rec.Offset, ps.logStart) - ps.progress; gap > 0 {
			ps.gap += gap
			r.m.skipped.Add(float64(gap))
			r.logger.Error("backbone records removed by retention before this consumer read them",
				"partition", rec.Partition, "from_offset", ps.progress, "to_offset", ps.progress+gap-1, "records", gap)
		}
		ps.progress = rec.Offset + 1
	}
	if r.filter != nil {
		var err error
		if o, err = Decode(rec); err == nil && !r.filter(o) {
			return nil, false, rec.Offset >= ps.start
		}
	}
	if rec.Offset < ps.start {
		ps.w.Remember(id)
		r.m.seeded.Inc()
		return nil, false, false
	}
	if ps.w.Check(id) {
		r.m.duplicates.Inc()
		r.logger.Debug("duplicate backbone record dropped", "partition", rec.Partition, "offset", rec.Offset, "event_id", id)
		return nil, false, true
	}
	if o != nil {
		return o, true, true
	}
	o, err := Decode(rec)
	if err != nil {
		r.m.undecodable.Inc()
		r.logger.Warn("undecodable backbone record skipped", "partition", rec.Partition, "offset", rec.Offset, "err", err)
		return nil, false, true
	}
	return o, true, true
}

// Partitions returns the partition ids of topic.
func Partitions(ctx context.Context, cl *kgo.Client, topic string) ([]int32, error) {
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	for _, rt := range resp.Topics {
		if rt.Topic == nil || *rt.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil {
			return nil, fmt.Errorf("metadata of %s: %w", topic, err)
		}
		ps := make([]int32, 0, len(rt.Partitions))
		for _, p := range rt.Partitions {
			ps = append(ps, p.Partition)
		}
		slices.Sort(ps)
		return ps, nil
	}
	return nil, fmt.Errorf("metadata of %s: topic not returned", topic)
}

// Offset kinds for ListOffsets.
const (
	offsetEnd   = -1 // the high watermark: the next offset to be written
	offsetStart = -2 // the log start offset
)

// ListOffsets returns, per partition, the log start (start=true) or the
// end a read_committed consumer sees: the last stable offset (the first
// offset of a transaction still open), which is the high watermark (the
// offset the next record will get) when no transaction is open.
func ListOffsets(ctx context.Context, cl *kgo.Client, topic string, parts []int32, start bool) (map[int32]int64, error) {
	ts := int64(offsetEnd)
	if start {
		ts = offsetStart
	}
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	req.IsolationLevel = 1 // read_committed
	t := kmsg.NewListOffsetsRequestTopic()
	t.Topic = topic
	for _, p := range parts {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = p
		rp.CurrentLeaderEpoch = -1
		rp.Timestamp = ts
		t.Partitions = append(t.Partitions, rp)
	}
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("list offsets of %s: %w", topic, err)
	}
	out := make(map[int32]int64, len(parts))
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, rp.Partition, err)
			}
			out[rp.Partition] = rp.Offset
		}
	}
	for _, p := range parts {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("list offsets of %s/%d: partition not returned", topic, p)
		}
	}
	return out, nil
}

// CommittedOffsets returns the offsets group has committed on topic
// (partition -> next offset to read); a partition without a commit is
// absent.
func CommittedOffsets(ctx context.Context, cl *kgo.Client, group, topic string) (map[int32]int64, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	req.RequireStable = true
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("fetch offsets of group %s: %w", group, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("fetch offsets of group %s: %w", group, err)
	}
	out := map[int32]int64{}
	add := func(p int32, off int64, code int16) error {
		if err := kerr.ErrorForCode(code); err != nil {
			return fmt.Errorf("fetch offsets of group %s, %s/%d: %w", group, topic, p, err)
		}
		if off >= 0 {
			out[p] = off
		}
		return nil
	}
	for _, g := range resp.Groups {
		if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
			return nil, fmt.Errorf("fetch offsets of group %s: %w", group, err)
		}
		for _, t := range g.Topics {
			if t.Topic != topic {
				continue
			}
			for _, p := range t.Partitions {
				if err := add(p.Partition, p.Offset, p.ErrorCode); err != nil {
					return nil, err
				}
			}
		}
	}
	for _, t := range resp.Topics {
		if t.Topic != topic {
			continue
		}
		for _, p := range t.Partitions {
			if err := add(p.Partition, p.Offset, p.ErrorCode); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// PartitionOf is the partition a record with key lands in on a topic of n
// partitions when the producer uses franz-go's default partitioner (keyed
// records: murmur2 of the key, as Kafka's Java client does). A Follow for
// one sandbox reads only this partition; the backbone producer must keep
// the default partitioner.
func PartitionOf(key []byte, n int) int32 {
	if n <= 0 {
		return 0
	}
	p := kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: key}, n)
	return int32(p)
}
