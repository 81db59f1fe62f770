package collector

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v2"

	"github.com/eventpipe/eventpipe/api/config"
	"github.com/eventpipe/eventpipe/collector/backbone"
	"github.com/eventpipe/eventpipe/collector/store"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/file"
	"github.com/eventpipe/eventpipe/sinks/kafka"
	"github.com/eventpipe/eventpipe/sinks/loki"
)

// Config is what a user writes in the collector's YAML file.
type Config struct {
	// Log chooses where ingested occurrences are kept: "local" (the
	// default, also when empty) is the embedded durable log configured
	// under store:, one replica; "kafka" is the backbone topic configured
	// under backbone:, any number of replicas (docs/kafka-backbone.md).
	Log string `yaml:"log"`
	// Backbone configures log: kafka; it must be absent otherwise.
	Backbone  *backbone.Config `yaml:"backbone,omitempty"`
	GRPC      GRPCConfig       `yaml:"grpc"`
	Auth      AuthConfig       `yaml:"auth"`
	HTTP      HTTPConfig       `yaml:"http"`
	Store     store.Config     `yaml:"store"`
	Follow    FollowConfig     `yaml:"follow"`
	Readiness ReadinessConfig  `yaml:"readiness"`
	Sinks     []SinkConfig     `yaml:"sinks"`
}

// GRPCConfig is the gRPC listener (Ingest and Follow).
type GRPCConfig struct {
	Listen string    `yaml:"listen"`
	TLS    TLSConfig `yaml:"tls"`
	// MaxRecvBytes bounds one received message (a Batch, a FollowRequest).
	MaxRecvBytes int `yaml:"max_recv_bytes"`
	// MaxSendBytes bounds one sent message (a FollowResponse).
	MaxSendBytes int `yaml:"max_send_bytes"`
	// IngestPipeline is how many batches of one Ship stream may be in
	// flight (received, not yet acknowledged). Past it the collector stops
	// reading the stream and gRPC flow control slows the agent.
	IngestPipeline int `yaml:"ingest_pipeline"`
	// ShutdownGrace bounds the graceful stop on SIGTERM; open streams are
	// then closed.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
}

// TLSConfig enables TLS (cert_file + key_file) and mTLS (client_ca_file).
type TLSConfig struct {
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// Enabled reports whether TLS is configured.
func (t TLSConfig) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// AuthConfig says who may call what.
type AuthConfig struct {
	// TokensFile holds bearer tokens (YAML list or CSV), reloaded on change.
	TokensFile string `yaml:"tokens_file"`
	// Identities maps client-certificate names (CN or SAN) to roles (mTLS).
	Identities []Identity `yaml:"identities"`
	// Insecure allows unauthenticated plaintext calls with every right.
	// Local development only; logged loudly. Refused when grpc.listen is
	// not a loopback address unless AllowInsecureNonLoopback is set too.
	Insecure bool `yaml:"insecure"`
	// AllowInsecureNonLoopback accepts Insecure on an address other hosts
	// can reach (a throw-away test cluster); the address is logged at start.
	AllowInsecureNonLoopback bool `yaml:"allow_insecure_non_loopback"`
}

// HTTPConfig is the metrics / health listener.
type HTTPConfig struct {
	Listen string `yaml:"listen"`
}

// FollowConfig bounds the follow stream.
type FollowConfig struct {
	// MaxTail is the largest tail a subscriber may ask for.
	MaxTail uint32 `yaml:"max_tail"`
	// ReadChunk is how many log records a subscriber reads at a time.
	ReadChunk int `yaml:"read_chunk"`
	// MaxTailScan bounds how many log records one tail replay scans
	// backwards looking for its matches (a rare sandbox in a large log);
	// when it stops early the subscriber is told (eventpipe-tail-scanned-from).
	MaxTailScan uint64 `yaml:"max_tail_scan"`
}

// ReadinessConfig shapes /readyz.
type ReadinessConfig struct {
	// LossWindow is kept so that older config files still load; it has no
	// effect. /readyz means "can acknowledge ingest": a consumer that lost
	// records to retention is an alert (eventpipe_sink_lost_records_total),
	// not a reason to take the collector out of its Service.
	LossWindow time.Duration `yaml:"loss_window"`
}

// Values of log.
const (
	LogLocal = "local"
	LogKafka = "kafka"
)

// KafkaMode reports whether the collector keeps its log in Kafka.
func (c Config) KafkaMode() bool { return c.Log == LogKafka }

// Sink types.
const (
	SinkFile  = "file"
	SinkLoki  = "loki"
	SinkKafka = "kafka"
)

// SinkConfig is one entry of sinks: a destination and its shared-layer
// settings. Exactly the section named by type is set.
type SinkConfig struct {
	Name   string             `yaml:"name"`
	Type   string             `yaml:"type"`
	File   *file.Config       `yaml:"file,omitempty"`
	Loki   *loki.Config       `yaml:"loki,omitempty"`
	Kafka  *kafka.Config      `yaml:"kafka,omitempty"`
	Filter sinks.FilterConfig `yaml:"filter"`
	Batch  sinks.BatchConfig  `yaml:"batch"`
	Retry  sinks.RetryConfig  `yaml:"retry"`
	// CommitInterval is sinks.RunnerConfig.CommitInterval (YAML
	// commit_interval, default 1s; 0 commits after every push).
	CommitInterval time.Duration `yaml:"commit_interval"`
}

// RunnerConfig is the entry's shared-layer configuration.
func (s SinkConfig) RunnerConfig() sinks.RunnerConfig {
	return sinks.RunnerConfig{Name: s.Name, Batch: s.Batch, Retry: s.Retry, Filter: s.Filter, CommitInterval: s.CommitInterval}
}

// UnmarshalYAML fills the defaults (shared layer, and the section of the
// named type) before the user's values, so a partial entry is complete.
func (s *SinkConfig) UnmarshalYAML(unmarshal func(any) error) error {
	var probe map[string]any
	if err := unmarshal(&probe); err != nil {
		return err
	}
	typ, _ := probe["type"].(string)
	d := sinks.NewDefaultRunnerConfig("")
	type plain SinkConfig
	p := plain{Batch: d.Batch, Retry: d.Retry, CommitInterval: d.CommitInterval}
	switch typ {
	case SinkFile:
		c := file.NewDefaultConfig()
		p.File = &c
	case SinkLoki:
		c := loki.NewDefaultConfig()
		p.Loki = &c
	case SinkKafka:
		c := kafka.NewDefaultConfig()
		p.Kafka = &c
	}
	// A section that does not belong to the type stays nil unless the user
	// wrote it, so Validate can point at it.
	if err := unmarshal(&p); err != nil {
		return err
	}
	*s = SinkConfig(p)
	return nil
}

// Defaults.
const (
	DefaultGRPCListen     = "127.0.0.1:7070"
	DefaultHTTPListen     = "127.0.0.1:7071"
	DefaultMaxRecvBytes   = 16 << 20
	DefaultMaxSendBytes   = 16 << 20
	DefaultIngestPipeline = 8
	DefaultShutdownGrace  = 10 * time.Second
	DefaultMaxTail        = 10_000
	DefaultReadChunk      = 512
	DefaultMaxTailScan    = 2_000_000
	DefaultLossWindow     = 15 * time.Minute
	minSendBytes          = 5 << 20
	// Below these a setting cannot do its job: a grace shorter than a
	// second cuts every stream, a retention under a minute deletes data
	// before a sink can read it, a dedupe window under a second dedupes
	// nothing (an agent re-sends after seconds).
	minShutdownGrace = time.Second
	minRetentionAge  = time.Minute
	minDedupeWindow  = time.Second
)

// NewDefaultConfig returns the defaults: loopback listeners, no sinks, no
// auth (Validate then demands tokens, mTLS, or insecure: true).
func NewDefaultConfig() Config {
	return Config{
		GRPC: GRPCConfig{
			Listen:         DefaultGRPCListen,
			MaxRecvBytes:   DefaultMaxRecvBytes,
			MaxSendBytes:   DefaultMaxSendBytes,
			IngestPipeline: DefaultIngestPipeline,
			ShutdownGrace:  DefaultShutdownGrace,
		},
		HTTP:      HTTPConfig{Listen: DefaultHTTPListen},
		Store:     store.NewDefaultConfig(),
		Follow:    FollowConfig{MaxTail: DefaultMaxTail, ReadChunk: DefaultReadChunk, MaxTailScan: DefaultMaxTailScan},
		Readiness: ReadinessConfig{LossWindow: DefaultLossWindow},
	}
}

// DevConfig is the configuration used when no --config is given: everything
// under ./eventpipe-data, a file sink, loopback listeners, insecure dev mode.
func DevConfig() Config {
	c := NewDefaultConfig()
	c.Auth.Insecure = true
	c.Store.Dir = filepath.Join("eventpipe-data", "log")
	fc := file.NewDefaultConfig()
	fc.Path = filepath.Join("eventpipe-data", "events.jsonl")
	d := sinks.NewDefaultRunnerConfig("file")
	c.Sinks = []SinkConfig{{Name: "file", Type: SinkFile, File: &fc, Batch: d.Batch, Retry: d.Retry, CommitInterval: d.CommitInterval}}
	return c
}

// LoadConfig reads a YAML file over the defaults. Unknown keys are errors.
// It does not validate: call Validate.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	return ParseConfig(data)
}

// ParseConfig parses YAML over the defaults. Unknown keys are errors, and
// so is a duration without a unit (see package api/config: "7d" and "168h"
// are a week, 604800 is refused rather than read as nanoseconds).
func ParseConfig(data []byte) (Config, error) {
	c := NewDefaultConfig()
	data, err := config.NormalizeDurations(data, &c)
	if err != nil {
		return Config{}, fmt.Errorf("parse config:\n%w", err)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return Config{}, fmt.Errorf("parse config: %w", err)
	}
	return c, nil
}

// Validate reports every problem, each with its YAML path.
func (c Config) Validate() error {
	var errs []error
	add := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	prefixed := func(prefix string, err error) {
		if err == nil {
			return
		}
		for _, e := range unjoin(err) {
			errs = append(errs, fmt.Errorf("%s.%w", prefix, e))
		}
	}
	checkAddr := func(path, addr string) {
		if err := config.ListenAddr(addr); err != nil {
			add(path, "%v", err)
		}
	}
	// atLeast refuses a duration that is set but too small to mean what
	// the key is for (zeroOK: 0 is a documented "off" or "unbounded").
	atLeast := func(path string, d, min time.Duration, zeroOK bool) {
		if d == 0 && zeroOK || d < 0 {
			return // negative values have their own message
		}
		if d < min {
			add(path, "%s is too short for this setting (at least %s; was another unit meant?)", d, config.FormatDuration(min))
		}
	}
	checkFile := func(path, name string) {
		if err := config.CheckFile(name); err != nil {
			add(path, "%v", err)
		}
	}

	checkAddr("grpc.listen", c.GRPC.Listen)
	t := c.GRPC.TLS
	if (t.CertFile == "") != (t.KeyFile == "") {
		add("grpc.tls", "cert_file and key_file go together")
	}
	if t.ClientCAFile != "" && t.CertFile == "" {
		add("grpc.tls.client_ca_file", "needs grpc.tls.cert_file and key_file (mTLS is TLS first)")
	}
	checkFile("grpc.tls.cert_file", t.CertFile)
	checkFile("grpc.tls.key_file", t.KeyFile)
	checkFile("grpc.tls.client_ca_file", t.ClientCAFile)
	if c.GRPC.MaxRecvBytes < 1024 || c.GRPC.MaxRecvBytes > 1<<30 {
		add("grpc.max_recv_bytes", "must be between 1024 and %d, got %d", 1<<30, c.GRPC.MaxRecvBytes)
	}
	// The log stores occurrences of up to 4 MiB; a Follow message carries
	// one, so a smaller send limit would wedge subscribers on such a record.
	if c.GRPC.MaxSendBytes < minSendBytes || c.GRPC.MaxSendBytes > 1<<30 {
		add("grpc.max_send_bytes", "must be between %d (the log's largest occurrence, 4 MiB, plus framing) and %d, got %d", minSendBytes, 1<<30, c.GRPC.MaxSendBytes)
	}
	if c.GRPC.IngestPipeline < 1 || c.GRPC.IngestPipeline > 1024 {
		add("grpc.ingest_pipeline", "must be between 1 and 1024, got %d", c.GRPC.IngestPipeline)
	}
	if c.GRPC.ShutdownGrace <= 0 {
		add("grpc.shutdown_grace", "must be positive, got %s", c.GRPC.ShutdownGrace)
	}
	atLeast("grpc.shutdown_grace", c.GRPC.ShutdownGrace, minShutdownGrace, false)

	a := c.Auth
	if a.Insecure && !a.AllowInsecureNonLoopback && config.ListenAddr(c.GRPC.Listen) == nil && !config.IsLoopback(c.GRPC.Listen) {
		add("auth.insecure", "refused on grpc.listen %q, which other hosts can reach: anyone there could ingest and follow every workspace unauthenticated; listen on 127.0.0.1, or set auth.allow_insecure_non_loopback: true for a throw-away test setup", c.GRPC.Listen)
	}
	if a.AllowInsecureNonLoopback && !a.Insecure {
		add("auth.allow_insecure_non_loopback", "has no meaning without auth.insecure: true")
	}
	if !a.Insecure && a.TokensFile == "" && t.ClientCAFile == "" {
		add("auth", "no authentication configured: set auth.tokens_file, or grpc.tls.client_ca_file with auth.identities (mTLS), or auth.insecure: true for local development")
	}
	if len(a.Identities) > 0 && t.ClientCAFile == "" {
		add("auth.identities", "need grpc.tls.client_ca_file (identities come from verified client certificates)")
	}
	if t.ClientCAFile != "" && len(a.Identities) == 0 {
		add("auth.identities", "grpc.tls.client_ca_file is set but no identity maps a certificate to a role")
	}
	seen := map[string]bool{}
	for i, id := range a.Identities {
		at := fmt.Sprintf("auth.identities[%d]", i)
		if id.Name == "" {
			add(at+".name", "must not be empty (a certificate CN or SAN)")
		} else if seen[id.Name] {
			add(at+".name", "duplicate %q", id.Name)
		}
		seen[id.Name] = true
		errs = append(errs, validateRole(at, id.Role, id.Workspaces, id.Clusters)...)
	}
	// Offline (--check-config --offline) the tokens file is a mounted
	// secret not here to read.
	if a.TokensFile != "" && !config.Offline() {
		if _, err := LoadTokens(a.TokensFile); err != nil {
			add("auth.tokens_file", "%v", err)
		}
	}

	checkAddr("http.listen", c.HTTP.Listen)
	if c.HTTP.Listen != "" && c.HTTP.Listen == c.GRPC.Listen && !strings.HasSuffix(c.HTTP.Listen, ":0") {
		add("http.listen", "must differ from grpc.listen")
	}
	switch c.Log {
	case "", LogLocal:
		if c.Backbone != nil {
			add("backbone", "set, but log is %q: add log: kafka to use it, or remove the section", orLocal(c.Log))
		}
		prefixed("store", c.Store.Validate())
		atLeast("store.retention.max_age", c.Store.Retention.MaxAge, minRetentionAge, true)
		atLeast("store.dedupe_window", c.Store.DedupeWindow, minDedupeWindow, false)
	case LogKafka:
		if c.Backbone == nil {
			add("backbone", "log: kafka needs a backbone section (at least backbone.brokers)")
		} else {
			prefixed("backbone", c.Backbone.Validate())
		}
		if c.Store != store.NewDefaultConfig() {
			add("store", "set, but log is kafka: the backbone topic replaces the local log; remove the section")
		}
		errs = append(errs, c.kafkaModeLimits()...)
	default:
		add("log", "must be local or kafka, got %q", c.Log)
	}
	if c.Follow.MaxTail < 1 || c.Follow.MaxTail > 1_000_000 {
		add("follow.max_tail", "must be between 1 and 1000000, got %d", c.Follow.MaxTail)
	}
	if c.Follow.ReadChunk < 1 || c.Follow.ReadChunk > 100_000 {
		add("follow.read_chunk", "must be between 1 and 100000, got %d", c.Follow.ReadChunk)
	}
	if c.Follow.MaxTailScan < uint64(c.Follow.ReadChunk) {
		add("follow.max_tail_scan", "must be at least follow.read_chunk (%d), got %d", c.Follow.ReadChunk, c.Follow.MaxTailScan)
	}
	if c.Readiness.LossWindow <= 0 {
		add("readiness.loss_window", "must be positive, got %s", c.Readiness.LossWindow)
	}
	atLeast("readiness.loss_window", c.Readiness.LossWindow, time.Second, false)

	names := map[string]bool{}
	for i, s := range c.Sinks {
		at := fmt.Sprintf("sinks[%d]", i)
		if s.Name != "" && names[s.Name] {
			add(at+".name", "duplicate sink name %q (it names the sink's cursor)", s.Name)
		}
		names[s.Name] = true
		prefixed(at, s.RunnerConfig().Validate())
		sections := map[string]bool{SinkFile: s.File != nil, SinkLoki: s.Loki != nil, SinkKafka: s.Kafka != nil}
		switch s.Type {
		case SinkFile, SinkLoki, SinkKafka:
			for typ, set := range sections {
				if set && typ != s.Type {
					add(at+"."+typ, "set, but the sink's type is %q", s.Type)
				}
			}
		case "":
			add(at+".type", "must be one of file, loki, kafka")
		default:
			add(at+".type", "must be one of file, loki, kafka, got %q", s.Type)
		}
		switch {
		case s.Type == SinkFile && s.File != nil:
			prefixed(at+".file", s.File.Validate())
		case s.Type == SinkLoki && s.Loki != nil:
			prefixed(at+".loki", s.Loki.Validate())
		case s.Type == SinkKafka && s.Kafka != nil:
			prefixed(at+".kafka", s.Kafka.Validate())
		}
	}
	errs = append(errs, c.filePathTraps()...)
	return errors.Join(errs...)
}

// filePathTraps refuses file sinks that would write where something else
// writes: inside store.dir (a rotation there once overwrote a segment and
// the next start dropped acknowledged records as a torn tail), or onto the
// active or rotated file of another file sink (two writers interleave
// lines and rotate each other's files away). Paths are compared after
// making them absolute and resolving the symbolic links of their existing
// part, so "./data/../data/x" and a link to the store are caught too.
func (c Config) filePathTraps() []error {
	var errs []error
	storeDir := ""
	if !c.KafkaMode() && c.Store.Dir != "" {
		storeDir = resolvePath(c.Store.Dir)
	}
	type owner struct {
		at       string
		maxFiles int
	}
	owners := map[string]owner{} // resolved active path -> the sink writing it
	for i, s := range c.Sinks {
		if s.Type != SinkFile || s.File == nil || s.File.Path == "" {
			continue
		}
		at := fmt.Sprintf("sinks[%d].file.path", i)
		p := resolvePath(s.File.Path)
		if storeDir != "" && within(p, storeDir) {
			errs = append(errs, fmt.Errorf("%s: %q is inside store.dir %q: the log owns every file there (a sink file there can cut a segment); write it elsewhere", at, s.File.Path, c.Store.Dir))
			continue
		}
		if o, ok := owners[p]; ok {
			errs = append(errs, fmt.Errorf("%s: %q is also written by %s: two sinks on one file interleave and rotate each other's lines away", at, s.File.Path, o.at))
			continue
		}
		// One's active file must not be another's rotated file (path.N).
		for q, o := range owners {
			if rotatedOf(p, q, o.maxFiles) || rotatedOf(q, p, s.File.MaxFiles) {
				errs = append(errs, fmt.Errorf("%s: %q and the file of %s are one rotation apart (rotated files are path.1 ... path.N): a rotation of one overwrites the other", at, s.File.Path, o.at))
			}
		}
		owners[p] = owner{at: at, maxFiles: s.File.MaxFiles}
	}
	return errs
}

// resolvePath makes p absolute and resolves the symbolic links of its
// longest existing prefix (the rest may not exist yet); on any error it
// falls back to the cleaned absolute path.
func resolvePath(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return filepath.Clean(p)
	}
	rest := ""
	for dir := abs; ; {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(real, rest)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return abs
		}
		rest = filepath.Join(filepath.Base(dir), rest)
		dir = parent
	}
}

// within reports whether p is dir or below it (both resolved).
func within(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// rotatedOf reports whether p is one of active's rotated files, active.1
// to active.maxFiles (sinks/file's naming).
func rotatedOf(p, active string, maxFiles int) bool {
	n, ok := strings.CutPrefix(p, active+".")
	if !ok {
		return false
	}
	k, err := strconv.Atoi(n)
	return err == nil && k >= 1 && k <= maxFiles && strconv.Itoa(k) == n
}

func orLocal(log string) string {
	if log == "" {
		return LogLocal
	}
	return log
}

// kafkaModeLimits refuses a Kafka sink that would write into the
// backbone's own topics.
func (c Config) kafkaModeLimits() []error {
	var errs []error
	for i, s := range c.Sinks {
		if s.Type == SinkKafka && s.Kafka != nil && c.Backbone != nil && (s.Kafka.Topic == c.Backbone.Topic || s.Kafka.Topic == c.Backbone.CursorTopic) {
			errs = append(errs, fmt.Errorf("sinks[%d].kafka.topic: %q is a backbone topic; a Kafka sink needs a topic of its own", i, s.Kafka.Topic))
		}
	}
	return errs
}

// unjoin splits an errors.Join result (and nested joins) into its parts.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unjoin(e)...)
		}
		return out
	}
	// A single error may still carry several lines.
	if lines := strings.Split(err.Error(), "\n"); len(lines) > 1 {
		out := make([]error, 0, len(lines))
		for _, l := range lines {
			out = append(out, errors.New(l))
		}
		return out
	}
	return []error{err}
}
