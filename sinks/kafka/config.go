package kafka

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/eventpipe/eventpipe/api/config"
)

// Config is the Kafka sink's YAML section.
type Config struct {
	// Conn is how the sink reaches the brokers (brokers, client_id, tls,
	// sasl): its keys stand in this section itself, as in the collector's
	// backbone: section, which reads the same type.
	Conn ConnConfig `yaml:",inline" json:"conn"`
	// Topic receives every occurrence.
	Topic string `yaml:"topic" json:"topic"`
	// Compression: none, snappy, lz4, zstd or gzip.
	Compression string `yaml:"compression" json:"compression"`
	// ValueFormat: json (the versioned JSON documented in README.md),
	// protobuf (the eventpipe.v1.Occurrence wire encoding) or ocsf (an OCSF
	// 1.8.0 Application Lifecycle event, docs/ocsf.md).
	ValueFormat string `yaml:"value_format" json:"value_format"`
	// MaxMessageBytes is the largest record the sink produces (key, value
	// and headers); keep it at or below the topic's max.message.bytes. A
	// larger occurrence has its message truncated and marked
	// (message_truncated).
	MaxMessageBytes int `yaml:"max_message_bytes" json:"max_message_bytes"`
	// Source is the CloudEvents ce_source prefix; the header is
	// "<source><cluster>/<reporting component>" (default
	// "eventpipe://kind-prod/kubelet").
	Source string `yaml:"source" json:"source"`
	// WriteTimeout bounds one produce request (the runner's push_timeout
	// bounds the whole push).
	WriteTimeout time.Duration     `yaml:"write_timeout" json:"write_timeout"`
	CreateTopic  CreateTopicConfig `yaml:"create_topic" json:"create_topic"`
}

// ConnConfig is how eventpipe reaches Kafka brokers: the Kafka sink and the
// collector's Kafka backbone (collector/backbone) both read it, inlined, so
// the two sections spell the connection alike and are checked alike.
type ConnConfig struct {
	// Brokers are the bootstrap addresses (host:port).
	Brokers []string `yaml:"brokers" json:"brokers"`
	// ClientID names this client to the brokers (quotas, broker logs).
	ClientID string     `yaml:"client_id" json:"client_id"`
	TLS      TLSConfig  `yaml:"tls" json:"tls"`
	SASL     SASLConfig `yaml:"sasl" json:"sasl"`
}

// TLSConfig enables TLS to the brokers.
type TLSConfig struct {
	Enabled bool `yaml:"enabled" json:"enabled"`
	// CAFile: PEM bundle of the CAs that sign the brokers' certificates
	// (empty: the system pool).
	CAFile string `yaml:"ca_file" json:"ca_file"`
	// CertFile and KeyFile: the client certificate, for mutual TLS.
	CertFile   string `yaml:"cert_file" json:"cert_file"`
	KeyFile    string `yaml:"key_file" json:"key_file"`
	ServerName string `yaml:"server_name" json:"server_name"`
	// InsecureSkipVerify disables certificate checks: tests only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify" json:"insecure_skip_verify"`
}

// SASLConfig authenticates to the brokers.
type SASLConfig struct {
	// Mechanism: empty (none), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism string `yaml:"mechanism" json:"mechanism"`
	Username  string `yaml:"username" json:"username"`
	// Password, or PasswordFile to read it from (one of them).
	Password     string `yaml:"password" json:"password"`
	PasswordFile string `yaml:"password_file" json:"password_file"`
}

// CreateTopicConfig creates the topic at start-up when it does not exist.
type CreateTopicConfig struct {
	Enabled           bool `yaml:"enabled" json:"enabled"`
	Partitions        int  `yaml:"partitions" json:"partitions"`
	ReplicationFactor int  `yaml:"replication_factor" json:"replication_factor"`
}

// Values of the enumerated options.
const (
	CompressionNone   = "none"
	CompressionSnappy = "snappy"
	CompressionLZ4    = "lz4"
	CompressionZstd   = "zstd"
	CompressionGzip   = "gzip"

	FormatJSON     = "json"
	FormatProtobuf = "protobuf"
	FormatOCSF     = "ocsf"

	MechanismPlain       = "PLAIN"
	MechanismSCRAMSHA256 = "SCRAM-SHA-256"
	MechanismSCRAMSHA512 = "SCRAM-SHA-512"
)

// Defaults.
const (
	DefaultTopic           = "eventpipe.occurrences"
	DefaultClientID        = "eventpipe"
	DefaultCompression     = CompressionSnappy
	DefaultValueFormat     = FormatJSON
	DefaultMaxMessageBytes = 1_000_000 // Kafka's default max.message.bytes is 1048588
	DefaultSource          = "eventpipe://"
	DefaultWriteTimeout    = 10 * time.Second
	DefaultPartitions      = 6
	DefaultReplication     = 3
	// MinMaxMessageBytes leaves room for the headers and a truncated value.
	MinMaxMessageBytes = 16 << 10
)

// NewDefaultConfig returns the defaults; Brokers has none and must be set.
func NewDefaultConfig() Config {
	return Config{
		Conn:            ConnConfig{ClientID: DefaultClientID},
		Topic:           DefaultTopic,
		Compression:     DefaultCompression,
		ValueFormat:     DefaultValueFormat,
		MaxMessageBytes: DefaultMaxMessageBytes,
		Source:          DefaultSource,
		WriteTimeout:    DefaultWriteTimeout,
		CreateTopic:     CreateTopicConfig{Partitions: DefaultPartitions, ReplicationFactor: DefaultReplication},
	}
}

// Validate reports every problem with its YAML path (brokers, tls.ca_file,
// ...). It checks that the files it names are readable.
func (c Config) Validate() error {
	var errs []error
	add := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	errs = append(errs, c.Conn.Validate())
	if c.Topic == "" {
		add("topic", "must be set")
	} else if len(c.Topic) > 249 || strings.Trim(c.Topic, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" || c.Topic == "." || c.Topic == ".." {
		add("topic", "%q is not a valid Kafka topic name (letters, digits, '.', '_', '-', at most 249)", c.Topic)
	}
	switch c.Compression {
	case CompressionNone, CompressionSnappy, CompressionLZ4, CompressionZstd, CompressionGzip:
	default:
		add("compression", "%q is not one of none, snappy, lz4, zstd, gzip", c.Compression)
	}
	switch c.ValueFormat {
	case FormatJSON, FormatProtobuf, FormatOCSF:
	default:
		add("value_format", "%q is not one of json, protobuf, ocsf", c.ValueFormat)
	}
	if c.MaxMessageBytes < MinMaxMessageBytes {
		add("max_message_bytes", "must be at least %d, got %d", MinMaxMessageBytes, c.MaxMessageBytes)
	}
	if c.Source == "" {
		add("source", "must be set")
	}
	if c.WriteTimeout <= 0 {
		add("write_timeout", "must be positive, got %s", c.WriteTimeout)
	}
	if c.CreateTopic.Enabled {
		if c.CreateTopic.Partitions < 1 {
			add("create_topic.partitions", "must be at least 1, got %d", c.CreateTopic.Partitions)
		}
		if c.CreateTopic.ReplicationFactor < 1 {
			add("create_topic.replication_factor", "must be at least 1, got %d", c.CreateTopic.ReplicationFactor)
		}
	}
	return errors.Join(errs...)
}

// Validate reports every problem of the connection settings with its YAML
// path relative to the section that inlines them (brokers[0], tls.ca_file,
// ...). It checks that the files they name are readable.
func (c ConnConfig) Validate() error {
	var errs []error
	add := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	if len(c.Brokers) == 0 {
		add("brokers", "at least one broker address is required")
	}
	for i, b := range c.Brokers {
		if err := config.DialAddr(b); err != nil {
			add(fmt.Sprintf("brokers[%d]", i), "%v", err)
		}
	}
	if c.ClientID == "" {
		add("client_id", "must be set")
	}
	readable := func(path, file string) {
		if err := config.CheckReadable(file); err != nil {
			add(path, "%v", err)
		}
	}
	t := c.TLS
	if !t.Enabled && (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify) {
		add("tls.enabled", "tls options are set but tls.enabled is false")
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		add("tls.cert_file", "cert_file and key_file go together")
	}
	readable("tls.ca_file", t.CAFile)
	readable("tls.cert_file", t.CertFile)
	readable("tls.key_file", t.KeyFile)
	s := c.SASL
	switch s.Mechanism {
	case "":
		if s.Username != "" || s.Password != "" || s.PasswordFile != "" {
			add("sasl.mechanism", "credentials are set but no mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
		}
	case MechanismPlain, MechanismSCRAMSHA256, MechanismSCRAMSHA512:
		if s.Username == "" {
			add("sasl.username", "must be set for %s", s.Mechanism)
		}
		if (s.Password == "") == (s.PasswordFile == "") {
			add("sasl.password", "set exactly one of password and password_file")
		}
		readable("sasl.password_file", s.PasswordFile)
	default:
		add("sasl.mechanism", "%q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", s.Mechanism)
	}
	return errors.Join(errs...)
}
