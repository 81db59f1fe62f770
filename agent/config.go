package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/eventpipe/eventpipe/api/config"
	"github.com/eventpipe/eventpipe/enrich"
	"github.com/eventpipe/eventpipe/enrich/verify"
)

// Config is what an operator writes (YAML) to run the agent. Values that come
// from code (logger, registerer, Kubernetes client config) are passed to New.
type Config struct {
	// Cluster is stamped on every occurrence and names the collector cursor.
	// The collector binds the agent's credentials to the cluster names it
	// may write (auth clusters), so it must be this cluster's real name:
	// PlaceholderCluster, the value the shipped manifests carry, is refused.
	Cluster        string               `yaml:"cluster"`
	Collector      CollectorConfig      `yaml:"collector"`
	Watch          WatchConfig          `yaml:"watch"`
	Hold           HoldConfig           `yaml:"hold"`
	Cache          CacheConfig          `yaml:"cache"`
	Ship           ShipConfig           `yaml:"ship"`
	LeaderElection LeaderElectionConfig `yaml:"leader_election"`
	HTTP           HTTPConfig           `yaml:"http"`
	// Enrich tunes attribution; its cluster is taken from Cluster above.
	Enrich enrich.Config `yaml:"enrich"`
	// Verify asks registries (opt-in; off by default: no registry call
	// without verify.enabled).
	Verify VerifyConfig `yaml:"verify"`
}

// VerifyConfig: registry checks the agent makes, off the path of events
// (package verify). Nothing here calls a registry unless Enabled is set.
type VerifyConfig struct {
	Enabled bool `yaml:"enabled"`
	// Registry bounds every check: timeout, cache, per-registry rate.
	// The agent asks anonymously unless PullSecrets names Secrets.
	Registry verify.Config `yaml:"registry"`
	// PullSecrets are docker-config Secrets the operator granted the agent
	// get on (the chart's Role names exactly these): a registry with an
	// entry in one of them is asked with its credentials (the first listed
	// wins), any other anonymously. Empty (the default): the agent reads
	// no Secret.
	PullSecrets []SecretRef `yaml:"pull_secrets"`
	// PullFailures: every image-pull failure whose cause the registry can
	// decide (not_found, unauthorized, not_found_or_unauthorized,
	// rate_limited, platform_mismatch, unknown, unrecognised) is checked
	// off the event path, and the answer ships as an update of the
	// failure's diagnosis (the same fields, decided_by registry). Later
	// failures of the same image take the cached answer at once.
	PullFailures bool `yaml:"pull_failures"`
	// Platform of the cluster's nodes ("linux/amd64"): an image (or its
	// index) must carry it. Empty: not compared.
	Platform string `yaml:"platform"`
	// Queue bounds the failures waiting for a check; beyond it they are
	// not checked (eventpipe_agent_verify_dropped_total).
	Queue int `yaml:"queue"`
	// Supervisor checks the OpenShell gateway's supervisor image before
	// any sandbox needs it.
	Supervisor SupervisorCheckConfig `yaml:"supervisor"`
}

// SupervisorCheckConfig names the OpenShell gateway whose supervisor image
// the agent verifies, at start, whenever it changes, and again once the
// cached answer expires (verify.registry.cache_ttl).
type SupervisorCheckConfig struct {
	// Namespace and Name of the gateway's Deployment or StatefulSet (the
	// OpenShell chart's release name, e.g. openshell/openshell). Empty
	// Name: no supervisor check.
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
	// Kind is Deployment or StatefulSet; empty tries StatefulSet, then
	// Deployment (the chart makes one of them).
	Kind string `yaml:"kind"`
	// Container is the gateway container (the chart's openshell-gateway);
	// when absent, the first container.
	Container string `yaml:"container"`
	// GatewayID the occurrences carry, so `eventpipe diagnose --supervisor
	// --gateway ID` finds them. Empty: gateway_id from the gateway's TOML
	// file, else "openshell" (the chart's default).
	GatewayID string `yaml:"gateway_id"`
	// Interval between reads of the gateway workload when it cannot be
	// watched (the watch was refused) or after an error or an inconclusive
	// answer. Otherwise a change is seen as the watch reports it.
	Interval time.Duration `yaml:"interval"`
}

// CollectorConfig says where and how to reach the collector's Ingest service.
type CollectorConfig struct {
	// Address is host:port, or a gRPC target (dns:///collector:7070: a
	// headless Service's name resolves to every replica).
	Address string `yaml:"address"`
	// Addresses lists collector replicas (host:port each), instead of
	// Address: the agent connects to one of them, in a random order so
	// agents spread, and when it fails moves on to another, re-sending
	// whatever was not acknowledged (docs/kafka-backbone.md, "Failover").
	Addresses []string `yaml:"addresses"`
	// Stream names the cursor at the collector (one per watch).
	Stream string `yaml:"stream"`
	// Insecure uses plaintext gRPC (tests, a sidecar on loopback). Otherwise
	// TLS is used, verified against CAFile (system roots when empty).
	Insecure   bool   `yaml:"insecure"`
	CAFile     string `yaml:"ca_file"`
	ServerName string `yaml:"server_name"`
	// CertFile/KeyFile: a client certificate for mTLS.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// TokenFile holds a bearer token, re-read on every connection (so a
	// rotated projected token is picked up).
	TokenFile string `yaml:"token_file"`
	// DialTimeout bounds GetCursor and each connection attempt.
	DialTimeout time.Duration `yaml:"dial_timeout"`
}

// WatchConfig tunes the Event watch.
type WatchConfig struct {
	// QueueCapacity bounds the Events read from the API server but not yet
	// processed. When full, the watch reader blocks.
	QueueCapacity int `yaml:"queue_capacity"`
	// WatchList lists through a watch with sendInitialEvents (one request,
	// served from the watch cache, streamed). When the server refuses it the
	// agent falls back to a paginated LIST.
	WatchList bool `yaml:"watch_list"`
	// ListPageSize is the LIST page size of the fallback.
	ListPageSize int64 `yaml:"list_page_size"`
	// FingerprintCapacity bounds the LRU that tells a MODIFIED that changes
	// count/series/message from a heartbeat or a no-op update.
	FingerprintCapacity int `yaml:"fingerprint_capacity"`
	// StaleAfter: /readyz fails when the watch showed no sign of life (an
	// event, a bookmark, a watch (re)established or ended by its timeout)
	// for this long. Must exceed 2*min_watch_timeout.
	StaleAfter time.Duration `yaml:"stale_after"`
	// MinWatchTimeout: each watch asks the server to end it after a random
	// time in [MinWatchTimeout, 2*MinWatchTimeout), as client-go's reflector
	// does, so load spreads over API server replicas.
	MinWatchTimeout time.Duration `yaml:"min_watch_timeout"`
	// BackoffInitial/BackoffMax pace re-watches after errors.
	BackoffInitial time.Duration `yaml:"backoff_initial"`
	BackoffMax     time.Duration `yaml:"backoff_max"`
	// Compression accepts gzip-compressed responses from the API server: less
	// bandwidth, but decompressing a large listing costs the agent about 15%
	// of its CPU. Off by default (the API server is usually in the same
	// network).
	Compression bool `yaml:"compression"`
}

// HoldConfig bounds late binding: Events whose owner is not cached yet.
type HoldConfig struct {
	// MaxEvents held at once; beyond it an unattributable Event ships at once.
	MaxEvents int `yaml:"max_events"`
	// MaxAge: an Event still unattributable after this long ships unattributed.
	MaxAge time.Duration `yaml:"max_age"`
	// RetryInterval: held Events are retried at least this often (and on
	// every cache change).
	RetryInterval time.Duration `yaml:"retry_interval"`
	// FreshWithin: only Events that occurred at most this long before the
	// agent saw them are held. An older Event (a backlog, a relist) had its
	// owner in the caches long ago if it ever will: a missing owner is gone,
	// so holding would only delay it. 0 holds regardless of age.
	FreshWithin time.Duration `yaml:"fresh_within"`
}

// CacheConfig tunes the metadata caches.
type CacheConfig struct {
	// KeepPrefixes: only labels and annotations with one of these prefixes
	// are kept in the caches (everything enrich.Rules reads must match).
	KeepPrefixes []string `yaml:"keep_prefixes"`
	// SandboxVersions of agents.x-k8s.io tried in order (first served wins).
	SandboxVersions []string `yaml:"sandbox_versions"`
	// TombstoneTTL: deleted objects are remembered this long.
	TombstoneTTL time.Duration `yaml:"tombstone_ttl"`
	// TombstoneMax bounds remembered deleted objects per kind (oldest go first).
	TombstoneMax int `yaml:"tombstone_max"`
	// SyncTimeout bounds the initial cache sync.
	SyncTimeout time.Duration `yaml:"sync_timeout"`
	// DiagnoseQueue bounds pods waiting for a pod-status diagnosis.
	DiagnoseQueue int `yaml:"diagnose_queue"`
}

// ShipConfig tunes batching and delivery to the collector.
type ShipConfig struct {
	// BatchSize: occurrences per batch at most.
	BatchSize int `yaml:"batch_size"`
	// MaxBatchBytes: a batch is sent once its encoded occurrences reach this
	// size (keep it well under the collector's grpc.max_recv_bytes).
	MaxBatchBytes int `yaml:"max_batch_bytes"`
	// FlushInterval: a non-empty batch is sent at the latest after this.
	FlushInterval time.Duration `yaml:"flush_interval"`
	// FlushWhenIdle sends a batch as soon as the processor has handled
	// what the watch delivered, when no earlier batch is waiting for its
	// acknowledgement. Latency then does not wait for flush_interval at low
	// rates (what a sandbox's user waits on); under load batches fill while
	// others are in flight. false: only batch_size, max_batch_bytes and
	// flush_interval send a batch.
	FlushWhenIdle bool `yaml:"flush_when_idle"`
	// IdleLinger is how long an idle flush waits for more occurrences to
	// join the batch (Kafka producers' linger.ms): a few milliseconds keep
	// most of the latency gain and far fewer, fuller batches. 0: at once.
	IdleLinger time.Duration `yaml:"idle_linger"`
	// MaxInFlight batches sent but not acknowledged.
	MaxInFlight    int           `yaml:"max_in_flight"`
	BackoffInitial time.Duration `yaml:"backoff_initial"`
	BackoffMax     time.Duration `yaml:"backoff_max"`
	// AckTimeout: /readyz fails when a batch waits longer than this for its
	// Ack.
	AckTimeout time.Duration `yaml:"ack_timeout"`
}

// LeaderElectionConfig configures the Lease that picks the one active replica.
type LeaderElectionConfig struct {
	Enabled   bool   `yaml:"enabled"`
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
	// Identity of this replica; the hostname plus process id when empty.
	Identity      string        `yaml:"identity"`
	LeaseDuration time.Duration `yaml:"lease_duration"`
	RenewDeadline time.Duration `yaml:"renew_deadline"`
	RetryPeriod   time.Duration `yaml:"retry_period"`
}

// HTTPConfig: the metrics and health endpoint.
type HTTPConfig struct {
	// Listen address for /metrics, /healthz, /readyz; empty disables it.
	Listen string `yaml:"listen"`
}

// NewDefaultConfig returns a configuration that needs only Cluster and
// Collector.Address (or Collector.Addresses).
func NewDefaultConfig() Config {
	return Config{
		Collector: CollectorConfig{Stream: "events", DialTimeout: 10 * time.Second},
		Watch: WatchConfig{
			QueueCapacity:       1024,
			WatchList:           true,
			ListPageSize:        500,
			FingerprintCapacity: 100000,
			StaleAfter:          15 * time.Minute,
			MinWatchTimeout:     5 * time.Minute,
			BackoffInitial:      200 * time.Millisecond,
			BackoffMax:          30 * time.Second,
		},
		Hold: HoldConfig{MaxEvents: 10000, MaxAge: 10 * time.Second, RetryInterval: time.Second, FreshWithin: 2 * time.Minute},
		Cache: CacheConfig{
			KeepPrefixes:    []string{"openshell.ai/", "openshell.io/", "agents.x-k8s.io/"},
			SandboxVersions: []string{"v1beta1", "v1alpha1"},
			TombstoneTTL:    5 * time.Minute,
			TombstoneMax:    10000,
			SyncTimeout:     2 * time.Minute,
			DiagnoseQueue:   4096,
		},
		Ship: ShipConfig{
			BatchSize:      500,
			MaxBatchBytes:  4 << 20,
			FlushInterval:  200 * time.Millisecond,
			FlushWhenIdle:  true,
			IdleLinger:     20 * time.Millisecond,
			MaxInFlight:    4,
			BackoffInitial: 200 * time.Millisecond,
			BackoffMax:     10 * time.Second,
			AckTimeout:     2 * time.Minute,
		},
		LeaderElection: LeaderElectionConfig{
			Enabled:       true,
			Namespace:     "eventpipe",
			Name:          "eventpipe-agent",
			LeaseDuration: 15 * time.Second,
			RenewDeadline: 10 * time.Second,
			RetryPeriod:   2 * time.Second,
		},
		HTTP:   HTTPConfig{Listen: ":9464"},
		Enrich: enrich.NewDefaultConfig(),
		Verify: VerifyConfig{
			Registry:   verify.NewDefaultConfig(),
			Queue:      256,
			Supervisor: SupervisorCheckConfig{Container: "openshell-gateway", Interval: 30 * time.Second},
		},
	}
}

// LoadConfig reads a YAML file over the defaults. Unknown keys are errors.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read agent config: %w", err)
	}
	cfg, err := ParseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// PlaceholderCluster is the cluster name of deploy/agent/deployment.yaml,
// to be replaced by the operator; the agent refuses to start with it.
const PlaceholderCluster = config.PlaceholderCluster

// ParseConfig decodes YAML over NewDefaultConfig. It does not validate.
// Durations need a unit (package api/config: "30s", "7d"); a bare number is
// refused with its YAML path.
func ParseConfig(b []byte) (Config, error) {
	cfg := NewDefaultConfig()
	b, err := config.NormalizeDurations(b, &cfg)
	if err != nil {
		return Config{}, fmt.Errorf("parse agent config:\n%w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("parse agent config: %w", err)
	}
	return cfg, nil
}

// Validate reports every problem, each with its YAML path.
func (c Config) Validate() error {
	var errs []error
	add := func(path, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, a...)))
	}
	positive := func(path string, d time.Duration) {
		if d <= 0 {
			add(path, "must be positive, got %s", d)
		}
	}
	atLeast := func(path string, v, min int) {
		if v < min {
			add(path, "must be at least %d, got %d", min, v)
		}
	}
	if strings.TrimSpace(c.Cluster) == "" {
		add("cluster", "must be set (this cluster's name; the collector's auth clusters must grant it)")
	} else if strings.EqualFold(strings.TrimSpace(c.Cluster), PlaceholderCluster) {
		add("cluster", "%q is the placeholder of the shipped manifests: set this cluster's real name (and grant it to this agent's token or certificate in the collector's auth clusters)", c.Cluster)
	} else if strings.TrimSpace(c.Cluster) != c.Cluster {
		add("cluster", "%q has leading or trailing spaces", c.Cluster)
	}
	switch {
	case c.Collector.Address == "" && len(c.Collector.Addresses) == 0:
		add("collector.address", "must be set (host:port), or collector.addresses (a list of replicas)")
	case c.Collector.Address != "" && len(c.Collector.Addresses) > 0:
		add("collector.addresses", "set collector.address or collector.addresses, not both")
	case c.Collector.Address != "":
		if err := checkTarget(c.Collector.Address); err != nil {
			add("collector.address", "%v", err)
		}
	}
	seenAddr := map[string]bool{}
	for i, a := range c.Collector.Addresses {
		at := fmt.Sprintf("collector.addresses[%d]", i)
		if err := config.DialAddr(a); err != nil {
			add(at, "%v (each entry is host:port)", err)
		} else if seenAddr[a] {
			add(at, "duplicate %q", a)
		}
		seenAddr[a] = true
	}
	if c.HTTP.Listen != "" {
		if err := config.ListenAddr(c.HTTP.Listen); err != nil {
			add("http.listen", "%v", err)
		}
	}
	if c.Collector.Stream == "" {
		add("collector.stream", "must be set")
	}
	if (c.Collector.CertFile == "") != (c.Collector.KeyFile == "") {
		add("collector.cert_file", "cert_file and key_file must be set together")
	}
	if c.Collector.Insecure && (c.Collector.CAFile != "" || c.Collector.CertFile != "") {
		add("collector.insecure", "cannot be combined with ca_file/cert_file")
	}
	for _, f := range []struct{ path, file string }{
		{"collector.ca_file", c.Collector.CAFile}, {"collector.cert_file", c.Collector.CertFile},
		{"collector.key_file", c.Collector.KeyFile}, {"collector.token_file", c.Collector.TokenFile},
	} {
		if err := config.CheckFile(f.file); err != nil {
			add(f.path, "%v", err)
		}
	}
	positive("collector.dial_timeout", c.Collector.DialTimeout)

	atLeast("watch.queue_capacity", c.Watch.QueueCapacity, 1)
	if c.Watch.ListPageSize < 1 {
		add("watch.list_page_size", "must be at least 1, got %d", c.Watch.ListPageSize)
	}
	atLeast("watch.fingerprint_capacity", c.Watch.FingerprintCapacity, 1)
	positive("watch.stale_after", c.Watch.StaleAfter)
	positive("watch.min_watch_timeout", c.Watch.MinWatchTimeout)
	if c.Watch.StaleAfter <= 2*c.Watch.MinWatchTimeout {
		add("watch.stale_after", "must exceed 2*watch.min_watch_timeout (%s), got %s", 2*c.Watch.MinWatchTimeout, c.Watch.StaleAfter)
	}
	positive("watch.backoff_initial", c.Watch.BackoffInitial)
	if c.Watch.BackoffMax < c.Watch.BackoffInitial {
		add("watch.backoff_max", "must be at least watch.backoff_initial (%s), got %s", c.Watch.BackoffInitial, c.Watch.BackoffMax)
	}

	atLeast("hold.max_events", c.Hold.MaxEvents, 0)
	if c.Hold.MaxAge < 0 {
		add("hold.max_age", "must not be negative, got %s", c.Hold.MaxAge)
	}
	positive("hold.retry_interval", c.Hold.RetryInterval)
	if c.Hold.FreshWithin < 0 {
		add("hold.fresh_within", "must not be negative, got %s", c.Hold.FreshWithin)
	}

	for i, p := range c.Cache.KeepPrefixes {
		if strings.TrimSpace(p) == "" {
			add(fmt.Sprintf("cache.keep_prefixes[%d]", i), "must not be empty")
		}
	}
	if len(c.Cache.SandboxVersions) == 0 {
		add("cache.sandbox_versions", "must list at least one version")
	}
	for i, v := range c.Cache.SandboxVersions {
		if strings.TrimSpace(v) == "" {
			add(fmt.Sprintf("cache.sandbox_versions[%d]", i), "must not be empty")
		}
	}
	if c.Cache.TombstoneTTL < 0 {
		add("cache.tombstone_ttl", "must not be negative, got %s", c.Cache.TombstoneTTL)
	}
	atLeast("cache.tombstone_max", c.Cache.TombstoneMax, 0)
	positive("cache.sync_timeout", c.Cache.SyncTimeout)
	atLeast("cache.diagnose_queue", c.Cache.DiagnoseQueue, 1)

	atLeast("ship.batch_size", c.Ship.BatchSize, 1)
	atLeast("ship.max_batch_bytes", c.Ship.MaxBatchBytes, 64<<10)
	positive("ship.flush_interval", c.Ship.FlushInterval)
	if c.Ship.IdleLinger < 0 || c.Ship.IdleLinger > c.Ship.FlushInterval {
		add("ship.idle_linger", "must be between 0 and ship.flush_interval (%s), got %s", c.Ship.FlushInterval, c.Ship.IdleLinger)
	}
	atLeast("ship.max_in_flight", c.Ship.MaxInFlight, 1)
	positive("ship.backoff_initial", c.Ship.BackoffInitial)
	if c.Ship.BackoffMax < c.Ship.BackoffInitial {
		add("ship.backoff_max", "must be at least ship.backoff_initial (%s), got %s", c.Ship.BackoffInitial, c.Ship.BackoffMax)
	}
	positive("ship.ack_timeout", c.Ship.AckTimeout)

	if le := c.LeaderElection; le.Enabled {
		if le.Namespace == "" {
			add("leader_election.namespace", "must be set when leader election is enabled")
		}
		if le.Name == "" {
			add("leader_election.name", "must be set when leader election is enabled")
		}
		positive("leader_election.lease_duration", le.LeaseDuration)
		positive("leader_election.renew_deadline", le.RenewDeadline)
		positive("leader_election.retry_period", le.RetryPeriod)
		if le.LeaseDuration <= le.RenewDeadline {
			add("leader_election.lease_duration", "must be greater than renew_deadline (%s), got %s", le.RenewDeadline, le.LeaseDuration)
		}
		if le.RenewDeadline <= le.RetryPeriod {
			add("leader_election.renew_deadline", "must be greater than retry_period (%s), got %s", le.RetryPeriod, le.RenewDeadline)
		}
	}

	if v := c.Verify; v.Enabled {
		if err := v.Registry.Validate("verify.registry."); err != nil {
			errs = append(errs, unjoin(err)...)
		}
		sc := v.Supervisor
		if sc.Name != "" && sc.Namespace == "" {
			add("verify.supervisor.namespace", "must be set with verify.supervisor.name")
		}
		if sc.Kind != "" && sc.Kind != "Deployment" && sc.Kind != "StatefulSet" {
			add("verify.supervisor.kind", "must be Deployment, StatefulSet or empty, got %q", sc.Kind)
		}
		positive("verify.supervisor.interval", sc.Interval)
		if v.Platform != "" && !strings.Contains(v.Platform, "/") {
			add("verify.platform", "must be os/arch[/variant], got %q", v.Platform)
		}
		atLeast("verify.queue", v.Queue, 1)
		for i, ref := range v.PullSecrets {
			if ref.Namespace == "" || ref.Name == "" {
				add(fmt.Sprintf("verify.pull_secrets[%d]", i), "needs namespace and name, got %q/%q", ref.Namespace, ref.Name)
			}
		}
		if !v.PullFailures && sc.Name == "" {
			add("verify.enabled", "checks nothing: set verify.pull_failures or verify.supervisor.name")
		}
	} else if v.Supervisor.Name != "" || v.PullFailures || len(v.PullSecrets) > 0 {
		add("verify.enabled", "must be true for verify.pull_failures, verify.supervisor or verify.pull_secrets (they ask registries)")
	}

	ec := c.Enrich
	ec.Cluster = c.Cluster
	if err := ec.Validate(); err != nil {
		for _, e := range unjoin(err) {
			errs = append(errs, fmt.Errorf("enrich.%w", e))
		}
	}
	return errors.Join(errs...)
}

// checkTarget checks collector.address: host:port, or a gRPC target with
// a scheme (unix:PATH, dns:///host:port).
func checkTarget(addr string) error {
	switch {
	case strings.HasPrefix(addr, "unix:") || strings.HasPrefix(addr, "unix-abstract:"):
		if _, path, _ := strings.Cut(addr, ":"); strings.TrimLeft(path, "/") == "" {
			return fmt.Errorf("%q names no socket", addr)
		}
		return nil
	case strings.HasPrefix(addr, "dns:"):
		rest := strings.TrimPrefix(addr, "dns:")
		if strings.HasPrefix(rest, "//") {
			// dns://[authority]/host:port
			if i := strings.Index(rest[2:], "/"); i >= 0 {
				rest = rest[2+i+1:]
			}
		}
		return config.DialAddr(rest)
	}
	return config.DialAddr(addr)
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
