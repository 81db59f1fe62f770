package backbone

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	yaml "go.yaml.in/yaml/v2"

	"github.com/eventpipe/eventpipe/api/config"
	"github.com/eventpipe/eventpipe/sinks/kafka"
)

// Config is what a user writes under the collector's `backbone:` key when
// `log: kafka` is chosen (docs/kafka-backbone.md). Every collector replica
// of one deployment uses the same values: the topics and the consumer
// group prefix are what makes them one tier.
type Config struct {
	// Conn is how the collector reaches the brokers (brokers, client_id,
	// tls, sasl): the Kafka sink's type and keys, standing in this section
	// itself.
	Conn kafka.ConnConfig `yaml:",inline" json:"conn"`
	// Topic is the backbone topic: every ingested occurrence, keyed by
	// sandbox id (record.go). It takes the place of the local log.
	Topic string `yaml:"topic" json:"topic"`
	// CursorTopic holds each agent stream's resume cursor, keyed
	// "<cluster>/<stream>". It must be compacted (cleanup.policy=compact):
	// only the last value per key matters, and a deleted one would send an
	// agent back to a full relist.
	CursorTopic string `yaml:"cursor_topic" json:"cursor_topic"`
	// GroupPrefix starts the name of every consumer group the collectors
	// form ("<prefix>.sink.<sink name>", ...). Two deployments sharing a
	// Kafka cluster need different prefixes (or different topics).
	GroupPrefix string `yaml:"group_prefix" json:"group_prefix"`
	// CreateTopics creates the backbone and cursor topics at start-up when
	// they are missing, with Partitions, ReplicationFactor and
	// MinInsyncReplicas. When false, a missing topic is an error at
	// start-up and on /readyz.
	CreateTopics bool `yaml:"create_topics" json:"create_topics"`
	// Partitions of the backbone topic when it is created: the most
	// consumers one sink's group can spread over. The cursor topic is
	// created with one partition (it is small and read whole).
	Partitions int `yaml:"partitions" json:"partitions"`
	// ReplicationFactor of both topics when they are created.
	ReplicationFactor int `yaml:"replication_factor" json:"replication_factor"`
	// MinInsyncReplicas of both topics when they are created (0: derived
	// from ReplicationFactor, see MinInsync). With acks=all, a record is
	// acknowledged only once this many replicas hold it.
	MinInsyncReplicas int `yaml:"min_insync_replicas" json:"min_insync_replicas"`
	// ProduceTimeout bounds how long one ingest batch may wait for Kafka's
	// acknowledgement (and one cursor read). Past it the batch is not
	// acknowledged to the agent, which sends it again.
	ProduceTimeout time.Duration `yaml:"produce_timeout" json:"produce_timeout"`
	// SessionTimeout is how long a sink consumer group waits for a silent
	// member (a replica SIGKILLed or its node gone) before giving its
	// partitions to the other replicas: those sinks' delivery pauses that
	// long. Heartbeats go every third of it. A replica that stops cleanly
	// leaves its groups at once and does not wait for it.
	SessionTimeout time.Duration `yaml:"session_timeout" json:"session_timeout"`
	// MaxRecordBytes is the largest record the producer sends; keep it at
	// or below the topic's max.message.bytes. A larger occurrence fails its
	// batch (the agent already truncates messages well below this).
	MaxRecordBytes int `yaml:"max_record_bytes" json:"max_record_bytes"`
	// DedupeWindow is how many records each consumer remembers per
	// partition to drop a duplicate event_id (an agent resends a batch
	// whose acknowledgement was lost). It must cover the records that can
	// sit between an occurrence and its resent copy in one partition: one
	// agent's unacknowledged batches plus what other agents wrote
	// meanwhile (docs/kafka-backbone.md, "Duplicates").
	DedupeWindow int `yaml:"dedupe_window" json:"dedupe_window"`
	// Transactions make Kafka mode exactly once across a replica kill
	// (docs/kafka-backbone.md, "Exactly once").
	Transactions TransactionsConfig `yaml:"transactions" json:"transactions"`
}

// TransactionsConfig: with Enabled, an ingest batch and its stream's
// cursor are written in one Kafka transaction, every consumer reads only
// committed records, and a sink that writes to Kafka commits its consumer
// group offset inside its producer's transaction. Without, Kafka mode is
// at-least-once and consumers drop copies within the dedupe window.
type TransactionsConfig struct {
	Enabled bool `yaml:"enabled" json:"enabled"`
	// ID is this replica's slot: the ingest producer's transactional.id is
	// "<group_prefix>.ingest.<id>". A replica started with the ID of one
	// that is still running (a zombie cut off from its agents, or a
	// restarted pod) fences it: the old one can no longer write. Empty:
	// the collector uses "<host name>-<gRPC port>" (the pod name in
	// Kubernetes; the process id instead of an ephemeral port), and
	// TransactionalID the host name. Two live replicas must never share an
	// ID (they would fence each other).
	ID string `yaml:"id" json:"id"`
	// Timeout is the transaction timeout: a transaction its replica left
	// open (killed mid-write) is aborted by the brokers after it, and until
	// then holds back read_committed consumers of its partitions. A
	// replica restarted in the same slot aborts it at once.
	Timeout time.Duration `yaml:"timeout" json:"timeout"`
}

// Defaults.
const (
	// DefaultTransactionTimeout: long enough for a produce_timeout's
	// worth of waiting, short enough that a killed replica's open
	// transaction holds consumers back only briefly.
	DefaultTransactionTimeout = 10 * time.Second
	DefaultTopic              = "eventpipe.occurrences"
	DefaultCursorTopic        = "eventpipe.cursors"
	DefaultGroupPrefix        = "eventpipe"
	DefaultClientID           = "eventpipe-collector"
	DefaultPartitions         = 12
	DefaultReplicationFactor  = 3
	DefaultProduceTimeout     = 10 * time.Second
	// DefaultSessionTimeout: Kafka's consumer default was 10 s before 3.0
	// (45 s since); eventpipe's sinks prefer a quick takeover, and brokers
	// accept 6 s to 30 min by default (group.min/max.session.timeout.ms).
	DefaultSessionTimeout = 10 * time.Second
	DefaultMaxRecordBytes = 1_000_000 // Kafka's default max.message.bytes is 1048588
	// DefaultDedupeWindow: 65536 records per partition is about 6 MB of
	// remembered ids per partition and far more than one agent can have
	// unacknowledged (ingest_pipeline batches of at most a few thousand
	// occurrences) plus what other agents write to the same partition
	// during a failover of a few seconds at 50,000 occurrences/s spread
	// over the default 12 partitions.
	DefaultDedupeWindow = 65536
	minDedupeWindow     = 1024
	maxDedupeWindow     = 16 << 20
	minRecordBytes      = 16 << 10
)

// NewDefaultConfig returns the defaults; Brokers has none and must be set.
func NewDefaultConfig() Config {
	return Config{
		Conn:              kafka.ConnConfig{ClientID: DefaultClientID},
		Topic:             DefaultTopic,
		CursorTopic:       DefaultCursorTopic,
		GroupPrefix:       DefaultGroupPrefix,
		Partitions:        DefaultPartitions,
		ReplicationFactor: DefaultReplicationFactor,
		ProduceTimeout:    DefaultProduceTimeout,
		SessionTimeout:    DefaultSessionTimeout,
		MaxRecordBytes:    DefaultMaxRecordBytes,
		DedupeWindow:      DefaultDedupeWindow,
		Transactions:      TransactionsConfig{Enabled: true, Timeout: DefaultTransactionTimeout},
	}
}

// TransactionalID is the ingest producer's transactional.id (see
// TransactionsConfig.ID).
func (c Config) TransactionalID() (string, error) {
	id := c.Transactions.ID
	if id == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return "", fmt.Errorf("backbone.transactions.id is empty and the host name is unknown (%v): set it to this replica's slot", err)
		}
		id = h
	}
	return c.GroupPrefix + ".ingest." + id, nil
}

// UnmarshalYAML fills the defaults before the user's values, so a
// partial backbone: section (often just brokers) is complete.
func (c *Config) UnmarshalYAML(unmarshal func(any) error) error {
	type plain Config
	p := plain(NewDefaultConfig())
	if err := unmarshal(&p); err != nil {
		return err
	}
	*c = Config(p)
	return nil
}

// MinInsync is the min.insync.replicas topics are created with: the
// configured value, else one less than the replication factor (at least
// 1) and never more than a majority, so acks=all survives one broker down
// (3 replicas: 2; 5: 3; 2: 1; 1: 1).
func (c Config) MinInsync() int {
	if c.MinInsyncReplicas > 0 {
		return c.MinInsyncReplicas
	}
	n := min(c.ReplicationFactor-1, c.ReplicationFactor/2+1)
	return max(n, 1)
}

// Validate reports every problem with its YAML path relative to this
// section (brokers[0], cursor_topic, ...); the collector prefixes
// "backbone.".
func (c Config) Validate() error {
	var errs []error
	add := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	errs = append(errs, c.Conn.Validate())
	checkTopic := func(path, name string) {
		switch {
		case name == "":
			add(path, "must be set")
		case !validTopic(name):
			add(path, "%q is not a valid Kafka topic name (letters, digits, '.', '_', '-', at most 249)", name)
		}
	}
	checkTopic("topic", c.Topic)
	checkTopic("cursor_topic", c.CursorTopic)
	if c.Topic != "" && c.Topic == c.CursorTopic {
		add("cursor_topic", "must differ from topic (the cursor topic is compacted, the backbone topic must not be)")
	}
	if c.GroupPrefix == "" {
		add("group_prefix", "must be set")
	} else if !validTopic(c.GroupPrefix) {
		add("group_prefix", "%q: use letters, digits, '.', '_', '-' (it starts consumer group names)", c.GroupPrefix)
	}
	if c.Partitions < 1 || c.Partitions > 10_000 {
		add("partitions", "must be between 1 and 10000, got %d", c.Partitions)
	}
	if c.ReplicationFactor < 1 || c.ReplicationFactor > 32 {
		add("replication_factor", "must be between 1 and 32, got %d", c.ReplicationFactor)
	}
	if c.MinInsyncReplicas < 0 {
		add("min_insync_replicas", "must not be negative (0 = derived from replication_factor), got %d", c.MinInsyncReplicas)
	} else if c.MinInsyncReplicas > c.ReplicationFactor && c.ReplicationFactor >= 1 {
		add("min_insync_replicas", "%d exceeds replication_factor %d: no write could ever be acknowledged", c.MinInsyncReplicas, c.ReplicationFactor)
	}
	switch {
	case c.ProduceTimeout <= 0:
		add("produce_timeout", "must be positive, got %s", c.ProduceTimeout)
	case c.ProduceTimeout < time.Second:
		add("produce_timeout", "%s is too short for a produce with acks=all (at least 1s; was another unit meant?)", c.ProduceTimeout)
	}
	if c.SessionTimeout < 6*time.Second || c.SessionTimeout > 30*time.Minute {
		add("session_timeout", "must be between 6s and 30m (the brokers' default group.min/max.session.timeout.ms), got %s", c.SessionTimeout)
	}
	if c.MaxRecordBytes < minRecordBytes || c.MaxRecordBytes > 1<<30 {
		add("max_record_bytes", "must be between %d and %d, got %d", minRecordBytes, 1<<30, c.MaxRecordBytes)
	}
	if c.DedupeWindow < minDedupeWindow || c.DedupeWindow > maxDedupeWindow {
		add("dedupe_window", "must be between %d and %d records per partition, got %d", minDedupeWindow, maxDedupeWindow, c.DedupeWindow)
	}
	if tx := c.Transactions; tx.Enabled {
		if tx.Timeout < time.Second || tx.Timeout > 15*time.Minute {
			add("transactions.timeout", "must be between 1s and 15m (the brokers' default transaction.max.timeout.ms), got %s", tx.Timeout)
		}
		if tx.ID != "" && (!validTopic(tx.ID) || len(tx.ID) > 200) {
			add("transactions.id", "%q: use letters, digits, '.', '_', '-' (it names this replica's transactional.id)", tx.ID)
		}
	} else if c.Transactions.ID != "" {
		add("transactions.id", "set, but transactions.enabled is false")
	}
	return errors.Join(errs...)
}

func validTopic(name string) bool {
	return len(name) <= 249 && name != "." && name != ".." &&
		strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == ""
}

// GroupName is the consumer group of one collector part: "<prefix>.<part>"
// (part is e.g. "sink.loki").
func (c Config) GroupName(part string) string { return c.GroupPrefix + "." + part }

// ClientOptions are the franz-go options every backbone client shares:
// seed brokers, client id, TLS and SASL. Callers add their own (producer
// or consumer) options after these.
func (c Config) ClientOptions() ([]kgo.Opt, error) {
	opts, err := c.Conn.Options()
	if err != nil {
		return nil, fmt.Errorf("backbone %w", err)
	}
	// Every consumer reads only committed records: with transactions on,
	// a batch a killed or fenced replica left unfinished is never seen.
	return append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted())), nil
}

// ParseConfig parses the section's YAML over the defaults. Unknown keys
// are errors, and so is a duration without a unit (package api/config).
// It does not validate: call Validate.
func ParseConfig(data []byte) (Config, error) {
	c := NewDefaultConfig()
	data, err := config.NormalizeDurations(data, &c)
	if err != nil {
		return Config{}, fmt.Errorf("parse backbone config:\n%w", err)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return Config{}, fmt.Errorf("parse backbone config: %w", err)
	}
	return c, nil
}
