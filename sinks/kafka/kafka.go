package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/eventpipe/eventpipe/api/buildinfo"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/internal/promreg"
)

// Sink produces batches to one topic. It implements sinks.Pusher; pushes
// are serialised.
type Sink struct {
	cfg  Config
	log  *slog.Logger
	m    *metrics
	opts []kgo.Opt // connection options, shared by the transactional producers
	cl   *kgo.Client

	mu     sync.Mutex // serialises Push (it owns enc)
	enc    encoder
	closed bool

	topicMu    sync.Mutex
	topicReady bool
	missing    atomic.Bool // the last write found no topic
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

// Options are the franz-go options for reaching the brokers as c says:
// seed brokers, client id, TLS and SASL, and the software name and
// version the client reports to the brokers (KIP-511: "eventpipe" and the
// build's version, so a broker's client metrics tell which eventpipe
// builds are connected). The sink and the collector's
// Kafka backbone both start from them, so they speak to brokers alike.
func (c ConnConfig) Options() ([]kgo.Opt, error) {
	t, s := c.TLS, c.SASL
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...), kgo.ClientID(c.ClientID),
		kgo.SoftwareNameAndVersion(SoftwareName, SoftwareVersion(buildinfo.Version()))}
	if t.Enabled {
		tc, err := t.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if s.Mechanism != "" {
		m, err := s.mechanism()
		if err != nil {
			return nil, fmt.Errorf("sasl: %w", err)
		}
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// SoftwareName is the client software name eventpipe reports to brokers.
const SoftwareName = "eventpipe"

// SoftwareVersion is v as a KIP-511 client software version: brokers
// refuse an ApiVersions request whose version has characters other than
// letters, digits, '-' and '.', or that does not start and end with a
// letter or digit. A module version such as "v1.2.3+dirty" becomes
// "v1.2.3-dirty".
func SoftwareVersion(v string) string {
	b := []byte(v)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			b[i] = '-'
		}
	}
	out := strings.Trim(string(b), "-.")
	if out == "" {
		return "unknown"
	}
	return out
}

// producerOptions are the options of every producer of the sink, plain or
// transactional: acks=all from an idempotent producer, the configured
// compression, batches up to max_message_bytes, the key partitioner that
// matches Kafka's Java client (murmur2), and quick retries: the runner owns
// the real retry policy.
func (c Config) producerOptions() []kgo.Opt {
	codec := map[string]kgo.CompressionCodec{
		CompressionNone: kgo.NoCompression(), CompressionSnappy: kgo.SnappyCompression(), CompressionLZ4: kgo.Lz4Compression(),
		CompressionZstd: kgo.ZstdCompression(), CompressionGzip: kgo.GzipCompression(),
	}[c.Compression]
	return []kgo.Opt{
		kgo.DefaultProduceTopic(c.Topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchCompression(codec),
		kgo.ProducerBatchMaxBytes(int32(c.MaxMessageBytes)),
		kgo.MaxBufferedRecords(1 << 16),
		// Push hands the client a whole batch and waits: never hold a
		// partial batch back.
		kgo.ProducerLinger(0),
		kgo.ProduceRequestTimeout(c.WriteTimeout),
		kgo.RecordRetries(3),
		kgo.RetryBackoffFn(func(tries int) time.Duration { return min(10*time.Millisecond<<min(tries, 5), 200*time.Millisecond) }),
		// A missing topic fails the push quickly with a message that says
		// what to do, instead of waiting for it for ever.
		kgo.UnknownTopicRetries(1),
		kgo.MetadataMinAge(time.Second),
		kgo.MetadataMaxAge(30 * time.Second),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	}
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
	conn, err := cfg.Conn.Options()
	if err != nil {
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	log := logger.With("topic", cfg.Topic)
	opts := append(slices.Clip(conn), cfg.producerOptions()...)
	opts = append(opts,
		// A push must end within its deadline (push_timeout) even when a
		// broker vanished after receiving a request; the runner then pushes
		// the batch again, and a copy Kafka did store is a duplicate with the
		// same event_id (at-least-once).
		kgo.AllowIdempotentProduceCancellation(),
		kgo.WithLogger(kgoLogger{log}),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka sink: producer: %w", err)
	}
	return &Sink{
		cfg: cfg, log: log, m: m, opts: conn, cl: cl,
		enc: encoder{format: cfg.ValueFormat, source: cfg.Source, maxBytes: cfg.MaxMessageBytes},
	}, nil
}

// kgoLogger passes franz-go's own log lines on at debug level.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }
func (k kgoLogger) Log(_ kgo.LogLevel, msg string, kv ...any) {
	k.l.Debug("franz-go: "+msg, kv...)
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

// mechanism is the franz-go SASL mechanism these settings name.
func (s SASLConfig) mechanism() (sasl.Mechanism, error) {
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
		return plain.Auth{User: s.Username, Pass: pass}.AsMechanism(), nil
	case MechanismSCRAMSHA256:
		return scram.Auth{User: s.Username, Pass: pass}.AsSha256Mechanism(), nil
	case MechanismSCRAMSHA512:
		return scram.Auth{User: s.Username, Pass: pass}.AsSha512Mechanism(), nil
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
	return s.push(ctx, s.cl, &s.enc, batch, nil)
}

// push encodes batch with enc and produces it with cl. Records refused for
// good are reported through a PartialError; any other failure is returned,
// classified for the runner. The caller owns enc for the call. inTxn,
// when set, runs after the encoding with the records to produce (the
// transactional pusher's produce-and-commit); nil produces them plainly.
func (s *Sink) push(ctx context.Context, cl *kgo.Client, enc *encoder, batch []sinks.Record, inTxn func([]*kgo.Record, []int, map[int]error) error) error {
	if err := s.ensureTopic(ctx, cl); err != nil {
		return err
	}
	recs := make([]kgo.Record, 0, len(batch))
	idx := make([]int, 0, len(batch)) // batch index of recs[j]
	failed := map[int]error{}
	enc.start(len(batch))
	// ProduceSync returns only once every record has its outcome, so the
	// arena is free again afterwards.
	defer func() { enc.finish(len(batch), true) }()
	for i, r := range batch {
		if r.Occurrence == nil {
			failed[i] = fmt.Errorf("offset %d: no occurrence", r.Offset)
			continue
		}
		msg, truncated, fits, err := enc.encode(r.Occurrence)
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
		recs = append(recs, msg)
		idx = append(idx, i)
	}
	ptrs := make([]*kgo.Record, len(recs))
	for j := range recs {
		ptrs[j] = &recs[j]
	}
	var err error
	if inTxn != nil {
		err = inTxn(ptrs, idx, failed)
	} else if len(ptrs) > 0 {
		err = s.write(ctx, cl, ptrs, idx, failed)
	}
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		s.m.refused.Add(float64(len(failed)))
		return &sinks.PartialError{Failed: failed}
	}
	return nil
}

// write produces recs. Records refused for good are added to failed (by
// batch index); any other failure is returned, classified for the runner.
func (s *Sink) write(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, idx []int, failed map[int]error) error {
	res := cl.ProduceSync(ctx, recs...)
	if err := res.FirstErr(); err == nil {
		s.countBytes(recs)
		s.topicFound()
		return nil
	}
	var retry error
	var large []int
	nfail, unknownTopic := 0, 0
	for j, r := range res {
		switch e := r.Err; {
		case e == nil:
		case errors.Is(e, kerr.MessageTooLarge) || errors.Is(e, kerr.RecordListTooLarge):
			nfail++
			large = append(large, j)
		case permanent(e):
			nfail++
			failed[idx[j]] = fmt.Errorf("refused by the broker: %w", e)
		default:
			nfail++
			if errors.Is(e, kerr.UnknownTopicOrPartition) {
				unknownTopic++
			}
			if retry == nil {
				retry = e
			}
		}
	}
	if unknownTopic == nfail {
		return s.topicNotFound(len(recs), retry)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("produce: %w", retry)
	}
	if retry != nil {
		// Some records must be produced again; the ones already written
		// will be duplicates (at-least-once, same event_id).
		return classify(fmt.Errorf("produce: %d of %d records failed: %w", nfail, len(recs), retry))
	}
	if len(large) == 1 {
		failed[idx[large[0]]] = fmt.Errorf("refused by the broker: %w", res[large[0]].Err)
		return nil
	}
	if len(large) > 1 {
		// The broker refuses a whole record batch when it is over the
		// limit: find which records are too large on their own.
		for _, j := range large {
			one := res[j].Record
			err := cl.ProduceSync(ctx, one).FirstErr()
			switch {
			case err == nil:
				s.countBytes([]*kgo.Record{one})
			case errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) || permanent(err):
				failed[idx[j]] = fmt.Errorf("refused: %w", err)
			default:
				return classify(fmt.Errorf("produce: %w", err))
			}
		}
	}
	return nil
}

func (s *Sink) countBytes(recs []*kgo.Record) {
	var n int
	for _, r := range recs {
		n += messageSize(r) - overhead
	}
	s.m.bytes.Add(float64(n))
}

// permanent reports broker error codes that retrying the same record can
// never fix. Authorisation and authentication failures are not among them:
// an operator can fix those, and the data waits in the log meanwhile.
func permanent(err error) bool {
	for _, code := range []*kerr.Error{kerr.InvalidRecord, kerr.InvalidTimestamp, kerr.UnsupportedForMessageFormat,
		kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.CorruptMessage} {
		if errors.Is(err, code) {
			return true
		}
	}
	return false
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
	if errors.Is(err, kerr.ThrottlingQuotaExceeded) {
		return sinks.Throttle(err, 0)
	}
	return err
}

// ensureTopic creates the topic if create_topic.enabled, once; an
// existing topic is fine.
func (s *Sink) ensureTopic(ctx context.Context, cl *kgo.Client) error {
	if !s.cfg.CreateTopic.Enabled {
		return nil
	}
	s.topicMu.Lock()
	defer s.topicMu.Unlock()
	if s.topicReady {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, int32(s.cfg.CreateTopic.Partitions), int16(s.cfg.CreateTopic.ReplicationFactor), nil, s.cfg.Topic)
	if err == nil {
		err = resp.Err
	}
	created := err == nil
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		if errors.Is(err, kerr.InvalidReplicationFactor) || errors.Is(err, kerr.InvalidPartitions) {
			s.log.Error("kafka sink cannot create its topic: fix create_topic", "err", err)
		}
		return fmt.Errorf("create topic %s: %w", s.cfg.Topic, err)
	}
	s.topicReady = true
	s.log.Info("kafka topic ready", "partitions", s.cfg.CreateTopic.Partitions,
		"replication_factor", s.cfg.CreateTopic.ReplicationFactor, "created", created)
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
	s.cl.Close()
	return nil
}
