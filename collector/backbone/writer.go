package backbone

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/store"
)

// Writer is the ingest side of Kafka mode: it takes the local log's place
// behind Ingest. Append returns only once Kafka acknowledged every record
// of the batch (acks=all, idempotent producer) and then the batch's
// cursor; ClusterCursor answers from the compacted cursor topic, so every
// replica gives the same answer. Safe for concurrent use.
//
// The Writer does not remove duplicates: an agent that re-sends a batch
// whose acknowledgement was lost writes it twice, and consumers drop the
// second copy by event_id (docs/kafka-backbone.md). AppendResult.Duplicates
// is therefore always 0.
type Writer struct {
	cfg  Config
	log  *slog.Logger
	m    *writerMetrics
	prod *kgo.Client
	adm  *kadm.Client
	// maxOcc is the largest encoded occurrence a record may carry: the
	// record limit less room for the key and headers.
	maxOcc int
	// txnID is the producer's transactional.id ("" without transactions).
	// A producer runs one transaction at a time: txnMu serialises the
	// appends of concurrent streams, from BeginTransaction to its end.
	txnID string
	txnMu sync.Mutex

	cursorMu   sync.Mutex // serialises cursor-topic reads
	cursorCons *kgo.Client
	cursorNext map[int32]int64   // next offset to read per partition
	cursors    map[string]string // "<cluster>/<stream>" → resourceVersion
}

// recordOverhead is the room a record's key, headers and framing take
// beside the occurrence: ids and names the agent bounds well below this.
const recordOverhead = 8 << 10

// ErrTopicMissing is wrapped by CheckTopics and Writable when a topic
// does not exist and create_topics is off.
var ErrTopicMissing = errors.New("topic does not exist")

// NewWriter validates cfg and builds the Kafka clients. It does not
// contact the brokers: call CheckTopics before serving ingest. logger and
// reg may be nil.
func NewWriter(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("backbone config:\n%w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := newWriterMetrics(reg)
	if err != nil {
		return nil, err
	}
	base, err := cfg.ClientOptions()
	if err != nil {
		return nil, err
	}
	w := &Writer{
		cfg: cfg, log: logger, m: m,
		maxOcc:     cfg.MaxRecordBytes - recordOverhead,
		cursorNext: map[int32]int64{},
		cursors:    map[string]string{},
	}
	prodOpts := append(base[:len(base):len(base)],
		// Idempotence is franz-go's default and requires acks=all; both
		// are spelled out because the ingest guarantee rests on them.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxRecordBytes)),
		// Ingest already batches; a short linger only gathers what
		// concurrent streams produce at the same moment.
		kgo.ProducerLinger(time.Millisecond),
		kgo.RecordDeliveryTimeout(cfg.ProduceTimeout),
		// A topic deleted under a running collector fails the batch
		// quickly (and /readyz says why) instead of retrying for ever.
		kgo.UnknownTopicRetries(2),
		// Retries of a refused produce (too few in-sync replicas, a
		// leader moving) come quickly: an agent waits for the answer.
		kgo.RetryBackoffFn(func(tries int) time.Duration {
			return min(50*time.Millisecond<<min(tries, 5), time.Second)
		}),
		// The offset lookups of ClusterCursor use cached metadata; keep
		// it fresh enough that a topic another replica created a moment
		// ago is found.
		kgo.MetadataMinAge(500*time.Millisecond),
	)
	if cfg.Transactions.Enabled {
		id, err := cfg.TransactionalID()
		if err != nil {
			return nil, err
		}
		w.txnID = id
		prodOpts = append(prodOpts, kgo.TransactionalID(id), kgo.TransactionTimeout(cfg.Transactions.Timeout))
	} else {
		// A produce must end within produce_timeout even when a broker
		// vanished after receiving a request: the batch then fails, the
		// agent re-sends it, and a copy Kafka did store is a duplicate the
		// consumers drop. Without this the client waits for an outcome
		// that may never come, and the agent's stream stalls. (A
		// transaction needs no such thing: its abort removes the copy.)
		prodOpts = append(prodOpts, kgo.AllowIdempotentProduceCancellation())
	}
	if w.prod, err = kgo.NewClient(prodOpts...); err != nil {
		return nil, fmt.Errorf("backbone producer: %w", err)
	}
	w.adm = kadm.NewClient(w.prod)
	consOpts := append(base[:len(base):len(base)],
		kgo.ConsumeTopics(cfg.CursorTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Transaction markers take offsets too: returned, they tell the
		// reader it is past the end offset (they are not cursors).
		kgo.KeepControlRecords(),
		// The reader long-polls the cursor topic in the background (a
		// broker answers a waiting fetch as soon as a record arrives), so
		// ClusterCursor usually finds what it needs already fetched.
	)
	if w.cursorCons, err = kgo.NewClient(consOpts...); err != nil {
		w.prod.Close()
		return nil, fmt.Errorf("backbone cursor reader: %w", err)
	}
	return w, nil
}

// Close releases the Kafka clients. Appends still running fail.
func (w *Writer) Close() {
	w.cursorCons.Close()
	w.prod.Close()
}

// CheckTopics makes sure the backbone and cursor topics exist: it creates
// the missing ones when create_topics is set (with cleanup.policy=compact
// for the cursor topic and min.insync.replicas from MinInsync), and
// otherwise fails naming them. Replicas starting together may race to
// create a topic; the loser accepts the winner's topic.
func (w *Writer) CheckTopics(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.ProduceTimeout)
	defer cancel()
	missing, err := w.missingTopics(ctx)
	if err != nil {
		return err
	}
	if len(missing) > 0 && !w.cfg.CreateTopics {
		return fmt.Errorf("backbone: %w: %v (create them, or set backbone.create_topics: true)", ErrTopicMissing, missing)
	}
	minISR := fmt.Sprint(w.cfg.MinInsync())
	for _, t := range missing {
		parts, configs := int32(w.cfg.Partitions), map[string]*string{"min.insync.replicas": &minISR}
		if t == w.cfg.CursorTopic {
			compact := "compact"
			parts, configs["cleanup.policy"] = 1, &compact
		}
		resp, err := w.adm.CreateTopic(ctx, parts, int16(w.cfg.ReplicationFactor), configs, t)
		if err == nil {
			err = resp.Err
		}
		if errors.Is(err, kerr.TopicAlreadyExists) {
			continue
		}
		if err != nil {
			return fmt.Errorf("backbone: create topic %s (%d partitions, replication %d, min.insync.replicas %s): %w", t, parts, w.cfg.ReplicationFactor, minISR, err)
		}
		w.log.Info("created backbone topic", "topic", t, "partitions", parts, "replication_factor", w.cfg.ReplicationFactor, "min_insync_replicas", minISR)
	}
	w.warnCursorPolicy(ctx)
	return nil
}

// topicState is what the brokers say about one topic right now.
type topicState struct {
	exists bool
	err    error // a topic-level error other than "unknown topic"
	// leaderless names a partition without a leader (-1: none).
	leaderless int32
	leaderErr  error
}

// topics asks the brokers about the backbone and cursor topics, bypassing
// the client's metadata cache (kadm's helpers answer from a cache up to
// several seconds old, which would report a topic created by another
// replica a moment ago as missing).
func (w *Writer) topics(ctx context.Context) (map[string]topicState, error) {
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range []string{w.cfg.Topic, w.cfg.CursorTopic} {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, w.prod)
	if err != nil {
		return nil, fmt.Errorf("kafka brokers %v unreachable: %w", w.cfg.Conn.Brokers, err)
	}
	out := map[string]topicState{}
	for _, t := range resp.Topics {
		if t.Topic == nil {
			continue
		}
		st := topicState{exists: true, leaderless: -1}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			if errors.Is(err, kerr.UnknownTopicOrPartition) {
				st.exists = false
			} else {
				st.err = err
			}
		}
		for _, p := range t.Partitions {
			if p.Leader < 0 || p.ErrorCode != 0 {
				st.leaderless, st.leaderErr = p.Partition, kerr.ErrorForCode(p.ErrorCode)
				break
			}
		}
		out[*t.Topic] = st
	}
	return out, nil
}

// missingTopics lists the backbone and cursor topics the brokers do not
// know. It fails when the brokers cannot be asked.
func (w *Writer) missingTopics(ctx context.Context) ([]string, error) {
	md, err := w.topics(ctx)
	if err != nil {
		return nil, fmt.Errorf("backbone: %w", err)
	}
	var missing []string
	for _, t := range []string{w.cfg.Topic, w.cfg.CursorTopic} {
		switch d := md[t]; {
		case !d.exists:
			missing = append(missing, t)
		case d.err != nil:
			return nil, fmt.Errorf("backbone: topic %s: %w", t, d.err)
		}
	}
	return missing, nil
}

// warnCursorPolicy logs when the cursor topic is not compacted: with the
// delete policy an idle cluster's cursor expires and its agent relists
// everything after its next restart.
func (w *Writer) warnCursorPolicy(ctx context.Context) {
	rc, err := w.adm.DescribeTopicConfigs(ctx, w.cfg.CursorTopic)
	if err != nil {
		return
	}
	for _, r := range rc {
		for _, c := range r.Configs {
			if c.Key == "cleanup.policy" && c.Value != nil && *c.Value != "compact" {
				w.log.Warn("the cursor topic is not compacted: a cursor older than its retention is lost and that cluster's agent relists after a restart; set cleanup.policy=compact",
					"topic", w.cfg.CursorTopic, "cleanup_policy", *c.Value)
			}
		}
	}
}

// Writable reports whether the Writer can acknowledge ingest now: the
// brokers answer, both topics exist, and every backbone partition has a
// leader. It is what /readyz asks in Kafka mode.
func (w *Writer) Writable() error {
	ctx, cancel := context.WithTimeout(context.Background(), min(w.cfg.ProduceTimeout, 3*time.Second))
	defer cancel()
	md, err := w.topics(ctx)
	if err != nil {
		return err
	}
	for _, t := range []string{w.cfg.Topic, w.cfg.CursorTopic} {
		switch d := md[t]; {
		case !d.exists:
			return fmt.Errorf("kafka %w: %s", ErrTopicMissing, t)
		case d.err != nil:
			return fmt.Errorf("kafka topic %s: %w", t, d.err)
		case d.leaderless >= 0:
			return fmt.Errorf("kafka topic %s partition %d has no leader (%v)", t, d.leaderless, d.leaderErr)
		}
	}
	return nil
}

// MaxOccurrenceBytes is the largest encoded occurrence Append accepts;
// a larger one makes Append fail with store.ErrInvalid.
func (w *Writer) MaxOccurrenceBytes() int { return w.maxOcc }

// Append produces occs (ingested on cluster's stream) to the backbone
// topic and returns once Kafka acknowledged all of them; then, when
// resourceVersion is set, it writes the stream's cursor and waits for that
// too. Any failure returns an error and the batch must not be
// acknowledged: some of its records may be in the topic already, and the
// agent's re-send adds duplicates that consumers drop. An occurrence too
// large for a record fails the call with store.ErrInvalid before anything
// is produced. Records of one key keep their order within a call, and
// calls made one after another keep theirs.
func (w *Writer) Append(ctx context.Context, cluster, stream, resourceVersion string, occs []*eventpipev1.Occurrence) (store.AppendResult, error) {
	var res store.AppendResult
	if resourceVersion != "" && (cluster == "" || stream == "") {
		return res, fmt.Errorf("%w: cluster and stream are required with a resourceVersion", store.ErrInvalid)
	}
	recs := make([]*kgo.Record, len(occs))
	for i, o := range occs {
		if o == nil {
			return res, fmt.Errorf("%w: occurrence %d is nil", store.ErrInvalid, i)
		}
		if size := proto.Size(o); size > w.maxOcc {
			return res, fmt.Errorf("%w: occurrence %d (%s) is %d bytes, limit %d (backbone.max_record_bytes less %d)", store.ErrInvalid, i, o.GetEventId(), size, w.maxOcc, recordOverhead)
		}
		r, err := Encode(o, stream)
		if err != nil {
			return res, fmt.Errorf("%w: occurrence %d: %v", store.ErrInvalid, i, err)
		}
		r.Topic = w.cfg.Topic
		recs[i] = r
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, w.cfg.ProduceTimeout)
	defer cancel()
	if w.txnID != "" {
		if resourceVersion != "" {
			recs = append(recs, &kgo.Record{Topic: w.cfg.CursorTopic, Key: []byte(cursorKey(cluster, stream)), Value: []byte(resourceVersion)})
		}
		if len(recs) == 0 {
			return res, nil
		}
		if err := w.produceTxn(parent, ctx, recs); err != nil {
			return res, fmt.Errorf("write %d occurrences to %s and cursor %s=%s to %s in one transaction: %w",
				len(occs), w.cfg.Topic, cursorKey(cluster, stream), resourceVersion, w.cfg.CursorTopic, err)
		}
		res.Stored = len(occs)
		return res, nil
	}
	if len(recs) > 0 {
		if err := w.produce(parent, ctx, topicBackbone, recs); err != nil {
			return res, fmt.Errorf("produce %d occurrences to %s: %w", len(recs), w.cfg.Topic, err)
		}
	}
	if resourceVersion != "" {
		// Only now: a cursor must never name a resourceVersion whose
		// occurrences Kafka does not hold.
		cur := &kgo.Record{Topic: w.cfg.CursorTopic, Key: []byte(cursorKey(cluster, stream)), Value: []byte(resourceVersion)}
		if err := w.produce(parent, ctx, topicCursor, []*kgo.Record{cur}); err != nil {
			return res, fmt.Errorf("write cursor %s=%s to %s (the batch itself is in %s and will be re-sent): %w", cur.Key, resourceVersion, w.cfg.CursorTopic, w.cfg.Topic, err)
		}
	}
	res.Stored = len(recs)
	return res, nil
}

// ErrProduceTimeout is wrapped by Append's error when Kafka did not
// acknowledge within backbone.produce_timeout (the caller's own context
// still running): a Kafka problem to retry, not a caller that went away.
var ErrProduceTimeout = errors.New("no acknowledgement from kafka within backbone.produce_timeout")

// produce sends recs and waits for Kafka's acknowledgement under ctx,
// which is parent bounded by produce_timeout.
func (w *Writer) produce(parent, ctx context.Context, topic string, recs []*kgo.Record) error {
	start := time.Now()
	// The client checks a cancelled context only between produce
	// attempts, which can be seconds apart while a partition has too few
	// in-sync replicas; the batch's answer is due at the deadline. The
	// records stay queued until the client gives up on them (or Kafka
	// takes them: then the agent's re-send is a duplicate).
	done := make(chan error, 1)
	go func() { done <- w.prod.ProduceSync(ctx, recs...).FirstErr() }()
	err := w.await(parent, ctx, done)
	w.m.produceSeconds.WithLabelValues(topic).Observe(time.Since(start).Seconds())
	if err != nil {
		w.m.produceErrors.WithLabelValues(topic).Inc()
		return err
	}
	w.m.produced.WithLabelValues(topic).Add(float64(len(recs)))
	return nil
}

// produceTxn writes recs (a batch and its cursor) in one transaction and
// waits for its commit under ctx, which is parent bounded by
// produce_timeout. Either every record becomes visible to read_committed
// consumers or none does: a failed or timed-out append is aborted, so the
// agent's re-send is not a duplicate. The transaction is finished (and the
// next append may begin) only once the client has every record's outcome,
// which may come after this call returned on a timeout.
func (w *Writer) produceTxn(parent, ctx context.Context, recs []*kgo.Record) error {
	start := time.Now()
	w.txnMu.Lock()
	if err := w.prod.BeginTransaction(); err != nil {
		w.txnMu.Unlock()
		return fmt.Errorf("begin transaction: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		defer w.txnMu.Unlock()
		err := w.prod.ProduceSync(ctx, recs...).FirstErr()
		end := kgo.TryCommit
		if err != nil || ctx.Err() != nil {
			// The caller gave up or Kafka refused: nothing of the batch may
			// become visible, since the agent sends it again.
			end = kgo.TryAbort
			if aerr := w.prod.AbortBufferedRecords(context.Background()); aerr != nil && err == nil {
				err = aerr
			}
		}
		ectx, cancel := context.WithTimeout(context.Background(), w.cfg.ProduceTimeout)
		defer cancel()
		if eerr := w.prod.EndTransaction(ectx, end); eerr != nil {
			w.log.Warn("backbone transaction did not end cleanly; the brokers abort it after transactions.timeout", "commit", bool(end), "err", eerr)
			if err == nil {
				err = fmt.Errorf("end transaction: %w", eerr)
			}
		} else if end == kgo.TryAbort && err == nil {
			err = ctx.Err()
		}
		done <- err
	}()
	err := w.await(parent, ctx, done)
	w.m.produceSeconds.WithLabelValues(topicBackbone).Observe(time.Since(start).Seconds())
	if err != nil {
		w.m.produceErrors.WithLabelValues(topicBackbone).Inc()
		return err
	}
	for _, r := range recs {
		if r.Topic == w.cfg.CursorTopic {
			w.m.produced.WithLabelValues(topicCursor).Inc()
		} else {
			w.m.produced.WithLabelValues(topicBackbone).Inc()
		}
	}
	return nil
}

// await waits for a produce's outcome on done, or for ctx (parent bounded
// by produce_timeout) to end; a timeout of the bound, not of the caller, is
// ErrProduceTimeout.
func (w *Writer) await(parent, ctx context.Context, done <-chan error) error {
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil && parent.Err() == nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%s): %v", ErrProduceTimeout, w.cfg.ProduceTimeout, err)
	}
	return err
}

func cursorKey(cluster, stream string) string { return cluster + "/" + stream }

// ClusterCursor returns the last resourceVersion any replica recorded for
// (cluster, stream). It first reads the cursor topic up to the end offsets
// the brokers report now, so a cursor written by another replica just
// before is seen; what was read stays cached, and the next call reads only
// what is new. An error means the answer is unknown, never "no cursor":
// an agent told "none" would relist everything.
func (w *Writer) ClusterCursor(ctx context.Context, cluster, stream string) (string, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.ProduceTimeout)
	defer cancel()
	w.cursorMu.Lock()
	defer w.cursorMu.Unlock()
	if err := w.catchUpCursors(ctx); err != nil {
		w.m.cursorReadErrors.Inc()
		return "", false, fmt.Errorf("read cursor topic %s: %w", w.cfg.CursorTopic, err)
	}
	rv, ok := w.cursors[cursorKey(cluster, stream)]
	return rv, ok, nil
}

// catchUpCursors consumes the cursor topic until every partition is read
// up to the end offset listed at the start. Called with cursorMu held.
func (w *Writer) catchUpCursors(ctx context.Context) error {
	ends, err := w.adm.ListEndOffsets(ctx, w.cfg.CursorTopic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	starts, err := w.adm.ListStartOffsets(ctx, w.cfg.CursorTopic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("list start offsets: %w", err)
	}
	behind := func() bool {
		lag := false
		ends.Each(func(o kadm.ListedOffset) {
			next := w.cursorNext[o.Partition]
			if s, ok := starts.Lookup(o.Topic, o.Partition); ok && s.Offset > next {
				next = s.Offset // compacted or deleted below: nothing to read there
			}
			if next < o.Offset {
				lag = true
			}
		})
		return lag
	}
	for behind() {
		fs := w.cursorCons.PollFetches(ctx)
		// Keep what the fetch returned even when ctx ended meanwhile: the
		// client has moved past these records and will not return them
		// again, so dropping them would leave a stale cursor.
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() {
				w.cursors[string(r.Key)] = string(r.Value)
			}
			w.cursorNext[r.Partition] = r.Offset + 1
		})
		if err := ctx.Err(); err != nil {
			return err
		}
		if fs.IsClientClosed() {
			return errors.New("cursor reader closed")
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				ferr = fmt.Errorf("fetch %s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
	}
	return nil
}

// Topic label values of the writer's metrics.
const (
	topicBackbone = "backbone"
	topicCursor   = "cursor"
)

type writerMetrics struct {
	produceSeconds   *prometheus.HistogramVec
	produceErrors    *prometheus.CounterVec
	produced         *prometheus.CounterVec
	cursorReadErrors prometheus.Counter
}

func newWriterMetrics(reg prometheus.Registerer) (*writerMetrics, error) {
	m := &writerMetrics{
		produceSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "eventpipe_collector_backbone_produce_duration_seconds",
			Help:    "Time one ingest append (topic=backbone) or its cursor write (topic=cursor) waited for Kafka's acknowledgement, failures included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"topic"}),
		produceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_backbone_produce_errors_total",
			Help: "Produce calls Kafka did not acknowledge; their batch was not acknowledged to the agent, which re-sends it.",
		}, []string{"topic"}),
		produced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_backbone_produced_records_total",
			Help: "Records Kafka acknowledged (acks=all): occurrences (topic=backbone) and cursors (topic=cursor).",
		}, []string{"topic"}),
		cursorReadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_backbone_cursor_read_errors_total",
			Help: "GetCursor calls that could not read the cursor topic (answered Unavailable; the agent retries).",
		}),
	}
	for _, t := range []string{topicBackbone, topicCursor} {
		m.produceSeconds.WithLabelValues(t)
		m.produceErrors.WithLabelValues(t)
		m.produced.WithLabelValues(t)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.produceSeconds, m.produceErrors, m.produced, m.cursorReadErrors} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register backbone writer metrics: %w", err)
			}
		}
	}
	return m, nil
}
