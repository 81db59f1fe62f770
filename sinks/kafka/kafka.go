package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"
	kafkasnappy "github.com/segmentio/kafka-go/compress/snappy"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/internal/promreg"
)

// writerBatchSize is the kafka-go Writer's per-partition batch size.
const writerBatchSize = 1000

// fastSnappy sets kafka-go's process-wide snappy codec to the standard
// (fast) level once (see the package doc).
var fastSnappy sync.Once

// Sink produces batches to one topic. It implements sinks.Pusher; pushes
// are serialised.
type Sink struct {
	cfg       Config
	log       *slog.Logger
	m         *metrics
	transport *kafka.Transport
	w         *kafka.Writer

	mu         sync.Mutex
	enc        encoder
	topicReady bool
	missing    atomic.Bool // the last write found no topic
	closed     bool
}

type metrics struct {
	truncated, refused, bytes prometheus.Counter
	// topicMissing is 1 while the broker answers that the topic does not
	// exist (create_topic off, or created elsewhere later).
	topicMissing prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	var err error
	r := func(c prometheus.Counter) prometheus.Counter {
		got, e := promreg.Register(reg, c)
		if e != nil && err == nil {
			err = e
		}
		return got
	}
	rg := func(g prometheus.Gauge) prometheus.Gauge {
		got, e := promreg.Register(reg, g)
		if e != nil && err == nil {
			err = e
		}
		return got
	}
	return &metrics{
		truncated: r(prometheus.NewCounter(prometheus.CounterOpts{Name: "eventpipe_sink_kafka_truncated_records_total",
			Help: "Records whose message field was truncated to fit max_message_bytes."})),
		refused: r(prometheus.NewCounter(prometheus.CounterOpts{Name: "eventpipe_sink_kafka_refused_records_total",
			Help: "Records refused for good by the sink or the broker (also counted by the runner)."})),
		bytes: r(prometheus.NewCounter(prometheus.CounterOpts{Name: "eventpipe_sink_kafka_produced_bytes_total",
			Help: "Key, value and header bytes acknowledged by the brokers."})),
		topicMissing: rg(prometheus.NewGauge(prometheus.GaugeOpts{Name: "eventpipe_sink_kafka_topic_missing",
			Help: "1 while the brokers answer that the sink's topic does not exist; records wait in the log until it does."})),
	}, err
}

// New validates cfg and builds the producer. It does not contact the
// brokers: connection problems surface (retryably) on Push. logger and reg
// may be nil.
func New(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kafka sink config: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("kafka sink: register metrics: %w", err)
	}
	tr := &kafka.Transport{
		ClientID:    cfg.ClientID,
		DialTimeout: 10 * time.Second,
		IdleTimeout: 30 * time.Second,
		MetadataTTL: 30 * time.Second,
	}
	if cfg.TLS.Enabled {
		if tr.TLS, err = cfg.TLS.ClientConfig(); err != nil {
			return nil, fmt.Errorf("kafka sink: tls: %w", err)
		}
	}
	if cfg.SASL.Mechanism != "" {
		if tr.SASL, err = saslMechanism(cfg.SASL); err != nil {
			return nil, fmt.Errorf("kafka sink: sasl: %w", err)
		}
	}
	if cfg.Compression == CompressionSnappy {
		fastSnappy.Do(func() { compress.SnappyCodec.Compression = kafkasnappy.FasterCompression })
	}
	codec := map[string]kafka.Compression{
		CompressionNone: 0, CompressionSnappy: kafka.Snappy, CompressionLZ4: kafka.Lz4,
		CompressionZstd: kafka.Zstd, CompressionGzip: kafka.Gzip,
	}[cfg.Compression]
	log := logger.With("topic", cfg.Topic)
	w := &kafka.Writer{
		Addr:     kafka.TCP(cfg.Brokers...),
		Topic:    cfg.Topic,
		Balancer: &kafka.Murmur2Balancer{},
		// A couple of quick attempts for leader moves; the runner owns the
		// real retry policy.
		MaxAttempts:     3,
		WriteBackoffMin: 10 * time.Millisecond,
		WriteBackoffMax: 200 * time.Millisecond,
		// Push hands the writer a whole batch and waits: never hold a
		// partial batch back for long. kafka-go allocates BatchSize slots
		// per partition batch up front, so keep it moderate: a larger push
		// becomes several produce batches.
		BatchSize:  writerBatchSize,
		BatchBytes: int64(cfg.MaxMessageBytes),
		// Push is serialised and hands all its records to the writer under
		// the partition writer's lock, so a tiny timeout flushes each
		// partition batch as soon as the call has filled it, without
		// waiting.
		BatchTimeout: time.Microsecond,
		ReadTimeout:  cfg.WriteTimeout,
		WriteTimeout: cfg.WriteTimeout,
		RequiredAcks: kafka.RequireAll,
		Compression:  codec,
		Transport:    tr,
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) {
			log.Debug("kafka-go: " + fmt.Sprintf(msg, args...))
		}),
	}
	return &Sink{
		cfg: cfg, log: log, m: m, transport: tr, w: w,
		enc: encoder{format: cfg.ValueFormat, source: cfg.Source, maxBytes: cfg.MaxMessageBytes},
	}, nil
}

// ClientConfig is the crypto/tls client configuration these settings
// describe (CA file, client certificate, server name). The collector's
// Kafka backbone uses it too, so both speak TLS to brokers alike.
func (t TLSConfig) ClientConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // opt-in, documented as tests only
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s: no PEM certificate found", t.CAFile)
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

func saslMechanism(s SASLConfig) (sasl.Mechanism, error) {
	pass := s.Password
	if s.PasswordFile != "" {
		b, err := os.ReadFile(s.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("read password_file: %w", err)
		}
		pass = strings.TrimRight(string(b), "\r\n")
	}
	switch s.Mechanism {
	case MechanismPlain:
		return plain.Mechanism{Username: s.Username, Password: pass}, nil
	case MechanismSCRAMSHA256:
		return scram.Mechanism(scram.SHA256, s.Username, pass)
	case MechanismSCRAMSHA512:
		return scram.Mechanism(scram.SHA512, s.Username, pass)
	}
	return nil, fmt.Errorf("unknown mechanism %q", s.Mechanism)
}

// Push implements sinks.Pusher: nil means every record was acknowledged
// by all in-sync replicas.
func (s *Sink) Push(ctx context.Context, batch []sinks.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("kafka sink is closed") // retryable: never drop on shutdown
	}
	if s.cfg.CreateTopic.Enabled && !s.topicReady {
		if err := s.ensureTopic(ctx); err != nil {
			return err
		}
	}
	msgs := make([]kafka.Message, 0, len(batch))
	idx := make([]int, 0, len(batch)) // batch index of msgs[j]
	failed := map[int]error{}
	s.enc.start(len(batch))
	// WriteMessages returns before its batches are written only when ctx
	// ends: otherwise the push's arena is free again afterwards.
	defer func() { s.enc.finish(len(batch), ctx.Err() == nil) }()
	for i, r := range batch {
		if r.Occurrence == nil {
			failed[i] = fmt.Errorf("offset %d: no occurrence", r.Offset)
			continue
		}
		msg, truncated, fits, err := s.enc.encode(r.Occurrence)
		switch {
		case err != nil:
			failed[i] = fmt.Errorf("encode: %w", err)
			continue
		case !fits:
			failed[i] = fmt.Errorf("%d bytes even with an empty message field, over max_message_bytes %d",
				messageSize(&msg), s.cfg.MaxMessageBytes)
			continue
		case truncated:
			s.m.truncated.Inc()
			s.log.Warn("kafka sink truncated a message to fit max_message_bytes",
				"event_id", r.Occurrence.GetEventId(), "message_bytes", len(r.Occurrence.GetMessage()))
		}
		msgs = append(msgs, msg)
		idx = append(idx, i)
	}
	if len(msgs) > 0 {
		if err := s.write(ctx, msgs, idx, failed); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		s.m.refused.Add(float64(len(failed)))
		return &sinks.PartialError{Failed: failed}
	}
	return nil
}

// write produces msgs. Records refused for good are added to failed (by
// batch index); any other failure is returned, classified for the runner.
func (s *Sink) write(ctx context.Context, msgs []kafka.Message, idx []int, failed map[int]error) error {
	err := s.w.WriteMessages(ctx, msgs...)
	if err == nil {
		s.countBytes(msgs)
		s.topicFound()
		return nil
	}
	if errors.Is(err, kafka.UnknownTopicOrPartition) && allUnknownTopic(err) {
		return s.topicNotFound(len(msgs), err)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("produce: %w", err)
	}
	var tooLarge kafka.MessageTooLargeError
	if errors.As(err, &tooLarge) {
		return s.isolate(ctx, msgs, idx, failed)
	}
	var werrs kafka.WriteErrors
	if !errors.As(err, &werrs) || len(werrs) != len(msgs) {
		return classify(fmt.Errorf("produce %d records: %w", len(msgs), err))
	}
	var retry error
	var large []int
	for j, e := range werrs {
		switch {
		case e == nil:
		case errors.Is(e, kafka.MessageSizeTooLarge) || errors.Is(e, kafka.RecordListTooLarge):
			large = append(large, j)
		case permanent(e):
			failed[idx[j]] = fmt.Errorf("refused by the broker: %w", e)
		case retry == nil:
			retry = e
		}
	}
	if retry != nil {
		// Some records must be produced again; the ones already written
		// will be duplicates (at-least-once, same event_id).
		return classify(fmt.Errorf("produce: %d of %d records failed: %w", werrs.Count(), len(msgs), retry))
	}
	if len(large) == 1 {
		failed[idx[large[0]]] = fmt.Errorf("refused by the broker: %w", werrs[large[0]])
		return nil
	}
	if len(large) > 1 {
		// The broker refuses a whole record batch when it is over the
		// limit: find which records are too large on their own.
		sub := make([]kafka.Message, len(large))
		subIdx := make([]int, len(large))
		for k, j := range large {
			sub[k], subIdx[k] = msgs[j], idx[j]
		}
		return s.isolate(ctx, sub, subIdx, failed)
	}
	return nil
}

// isolate produces each message alone, so a size refusal names exactly
// one record.
func (s *Sink) isolate(ctx context.Context, msgs []kafka.Message, idx []int, failed map[int]error) error {
	for j := range msgs {
		err := s.w.WriteMessages(ctx, msgs[j])
		var werrs kafka.WriteErrors
		if errors.As(err, &werrs) && len(werrs) == 1 && werrs[0] != nil {
			err = werrs[0] // kafka.WriteErrors does not unwrap
		}
		if err == nil {
			s.countBytes(msgs[j : j+1])
			continue
		}
		var tooLarge kafka.MessageTooLargeError
		if errors.As(err, &tooLarge) || errors.Is(err, kafka.MessageSizeTooLarge) || errors.Is(err, kafka.RecordListTooLarge) || permanent(err) {
			failed[idx[j]] = fmt.Errorf("refused: %w", err)
			continue
		}
		return classify(fmt.Errorf("produce: %w", err))
	}
	return nil
}

func (s *Sink) countBytes(msgs []kafka.Message) {
	var n int
	for i := range msgs {
		n += messageSize(&msgs[i]) - overhead
	}
	s.m.bytes.Add(float64(n))
}

// permanent reports broker error codes that retrying the same record can
// never fix. Authorisation and authentication failures are not among them:
// an operator can fix those, and the data waits in the log meanwhile.
func permanent(err error) bool {
	for _, code := range []kafka.Error{kafka.InvalidRecord, kafka.InvalidTimestamp, kafka.UnsupportedForMessageFormat,
		kafka.MessageSizeTooLarge, kafka.RecordListTooLarge} {
		if errors.Is(err, code) {
			return true
		}
	}
	return false
}

// allUnknownTopic reports whether every write failed because the topic
// does not exist (a single partition missing after a shrink is something
// else and stays a plain retryable error).
func allUnknownTopic(err error) bool {
	var werrs kafka.WriteErrors
	if !errors.As(err, &werrs) {
		return true // a batch-level UnknownTopicOrPartition
	}
	for _, e := range werrs {
		if e != nil && !errors.Is(e, kafka.UnknownTopicOrPartition) {
			return false
		}
	}
	return true
}

// topicNotFound turns "unknown topic or partition" into an error that says
// what to do. It stays retryable: the records wait in the collector's log
// until the topic exists, and the runner's lag and failure alerts fire.
// The first failure after success is logged at ERROR; the runner logs the
// retries.
func (s *Sink) topicNotFound(n int, err error) error {
	if s.missing.CompareAndSwap(false, true) {
		s.m.topicMissing.Set(1)
		s.log.Error("kafka sink: the topic does not exist; records wait in the log until it does",
			"hint", "create the topic, or set create_topic.enabled: true")
	}
	return fmt.Errorf("produce %d records: topic %q does not exist on the brokers (create it, or set create_topic.enabled: true so the sink creates it): %w",
		n, s.cfg.Topic, err)
}

func (s *Sink) topicFound() {
	if s.missing.CompareAndSwap(true, false) {
		s.m.topicMissing.Set(0)
		s.log.Info("kafka sink: the topic exists now")
	}
}

// classify wraps a batch-level failure: throttling becomes a ThrottleError,
// everything else stays retryable.
func classify(err error) error {
	if errors.Is(err, kafka.ThrottlingQuotaExceeded) {
		return sinks.Throttle(err, 0)
	}
	return err
}

// ensureTopic creates the topic if create_topic.enabled; an existing topic
// is fine.
func (s *Sink) ensureTopic(ctx context.Context) error {
	c := &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Transport: s.transport, Timeout: s.cfg.WriteTimeout}
	resp, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic:             s.cfg.Topic,
		NumPartitions:     s.cfg.CreateTopic.Partitions,
		ReplicationFactor: s.cfg.CreateTopic.ReplicationFactor,
	}}})
	if err != nil {
		return fmt.Errorf("create topic %s: %w", s.cfg.Topic, err)
	}
	if e := resp.Errors[s.cfg.Topic]; e != nil && !errors.Is(e, kafka.TopicAlreadyExists) {
		if errors.Is(e, kafka.InvalidReplicationFactor) || errors.Is(e, kafka.InvalidPartitionNumber) {
			s.log.Error("kafka sink cannot create its topic: fix create_topic", "err", e)
		}
		return fmt.Errorf("create topic %s: %w", s.cfg.Topic, e)
	}
	s.topicReady = true
	s.log.Info("kafka topic ready", "partitions", s.cfg.CreateTopic.Partitions,
		"replication_factor", s.cfg.CreateTopic.ReplicationFactor, "created", resp.Errors[s.cfg.Topic] == nil)
	return nil
}

// Close flushes and closes the producer. Pushes after Close fail
// (retryably).
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.w.Close()
	s.transport.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("kafka sink: close: %w", err)
	}
	return nil
}
