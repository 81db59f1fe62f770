package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/eventpipe/eventpipe/api/config"
	"github.com/eventpipe/eventpipe/sinks/gateway/driverwire"
)

// Config is what a user writes for eventpipe driver-proxy (YAML).
type Config struct {
	// Listen is the Unix socket the gateway dials
	// (OPENSHELL_COMPUTE_DRIVER_SOCKET). Its directory must be owned by
	// the proxy's uid; it is created 0700 when missing.
	Listen string `yaml:"listen"`
	// Driver is the real driver's Unix socket
	// (openshell-driver-kubernetes --bind-socket).
	Driver string `yaml:"driver"`
	// GatewayID selects this gateway's sandboxes on the collector's Follow
	// stream (openshell.ai/gateway-id; the Helm default is "openshell").
	GatewayID string `yaml:"gateway_id"`
	// Layout is the driver wire layout; only driverwire.Layout for now.
	Layout    string          `yaml:"layout"`
	Collector CollectorConfig `yaml:"collector"`
	Follow    FollowConfig    `yaml:"follow"`
	// DropDriverKubernetesEvents drops the driver's own platform events
	// with source "kubernetes" (shared mode), so each occurrence reaches
	// the gateway once, from eventpipe. On by default. They are dropped
	// only while eventpipe's Follow stream is live; before it first comes
	// up and during an outage they pass unchanged.
	DropDriverKubernetesEvents bool `yaml:"drop_driver_kubernetes_events"`
	// Relay and RelayEditMaxBytes are accepted, and ignored with a warning
	// (Deprecations), so a config written when the proxy had a second,
	// HTTP/2-frame relay (until 2026-12-04) still starts the proxy:
	// refusing it would cut the gateway off its driver on an upgrade.
	// There is one relay now, the gRPC legs (docs/design.md says why).
	Relay             string `yaml:"relay,omitempty"`
	RelayEditMaxBytes int    `yaml:"relay_edit_max_bytes,omitempty"`
	// ShutdownGrace bounds how long Run waits for open RPCs on shutdown.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
}

// CollectorConfig says how to reach the collector's Follow stream, with a
// token of role reader granted this gateway's workspaces.
type CollectorConfig struct {
	Address    string `yaml:"address"`
	TokenFile  string `yaml:"token_file"`
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
	// Insecure: plaintext gRPC (a collector on loopback, tests).
	Insecure bool `yaml:"insecure"`
}

// FollowConfig bounds what the proxy keeps from the Follow stream.
type FollowConfig struct {
	// TailPerSandbox is how many recent events per live sandbox a new
	// WatchSandboxes stream gets first (the gateway's own replay tail is 50).
	TailPerSandbox int `yaml:"tail_per_sandbox"`
	// MaxSandboxes bounds the sandboxes kept (least recently active are
	// forgotten first, counted).
	MaxSandboxes int `yaml:"max_sandboxes"`
	// MaxEvents bounds the events kept in all tails together (beyond it
	// the oldest events of the least recently active sandboxes go first,
	// counted) and the log of recent events every stream reads from at its
	// own pace (a stream more than MaxEvents behind catches up from the
	// tails, counted).
	MaxEvents int `yaml:"max_events"`
	// StartTail is how many of this gateway's most recent occurrences the
	// proxy reads at start to rebuild the tails and the active blockers.
	StartTail int `yaml:"start_tail"`
	// DedupeWindow is how many event ids per gateway connection are
	// remembered as sent.
	DedupeWindow int `yaml:"dedupe_window"`
	// StateFile keeps the Follow cursor up to which events were sent
	// (written before sending), so a restarted proxy does not send them
	// again to a gateway that kept running. Empty: not kept.
	StateFile string `yaml:"state_file"`
	// FailOpenAfter is accepted and ignored with a warning (Deprecations):
	// the driver's own events now pass from the moment the Follow stream
	// is not live, without a grace.
	FailOpenAfter time.Duration `yaml:"fail_open_after,omitempty"`
	// BackoffMin and BackoffMax bound the wait between Follow attempts
	// (doubling, with ±20 % jitter). While the collector is unreachable it
	// is probed every BackoffMin (at most 250 ms) and followed again as
	// soon as it answers,
	// so BackoffMax matters only for a collector that answers and refuses.
	BackoffMin time.Duration `yaml:"backoff_min"`
	BackoffMax time.Duration `yaml:"backoff_max"`
}

// NewDefaultConfig returns the defaults; Listen, Driver, GatewayID and
// Collector.Address must still be set.
func NewDefaultConfig() Config {
	return Config{
		Layout:                     driverwire.Layout,
		DropDriverKubernetesEvents: true,
		ShutdownGrace:              5 * time.Second,
		Follow: FollowConfig{
			TailPerSandbox: 50,
			MaxSandboxes:   10000,
			MaxEvents:      100000,
			StartTail:      5000,
			DedupeWindow:   100000,
			BackoffMin:     500 * time.Millisecond,
			BackoffMax:     5 * time.Second,
		},
	}
}

// LoadConfig reads a YAML file over the defaults. Unknown keys are errors.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read driver-proxy config: %w", err)
	}
	cfg, err := ParseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes YAML over NewDefaultConfig. It does not validate.
func ParseConfig(b []byte) (Config, error) {
	cfg := NewDefaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("parse driver-proxy config: %w", err)
	}
	return cfg, nil
}

// Deprecations are warnings about settings that are accepted but have no
// effect any more; New logs them.
func (c Config) Deprecations() []string {
	var out []string
	if c.Relay != "" {
		out = append(out, fmt.Sprintf("relay: %q is ignored: the proxy has one relay, the gRPC legs, since 2026-12-04 (the frame relay was removed); remove the key", c.Relay))
	}
	if c.RelayEditMaxBytes != 0 {
		out = append(out, "relay_edit_max_bytes is ignored: it bounded the removed frame relay's edits; remove the key")
	}
	if c.Follow.FailOpenAfter != 0 {
		out = append(out, "follow.fail_open_after is ignored: the driver's own kubernetes events pass whenever the Follow stream is not live, without a grace; remove the key")
	}
	return out
}

// CheckFiles reports every file the config names (the collector's CA,
// client certificate and key, token) that cannot be used, each with its
// YAML path. It is not part of Validate: the proxy fails open, so at run
// time a missing file is a counted follow error and driver traffic flows;
// `driver-proxy --check-config` runs it, and --offline (api/config's
// switch) skips it for a config whose files are mounted only in the pod.
func (c Config) CheckFiles() error {
	var errs []error
	for _, f := range []struct {
		path, name string
		check      func(string) error
	}{
		{"collector.ca_file", c.Collector.CAFile, config.CheckFile},
		{"collector.cert_file", c.Collector.CertFile, config.CheckFile},
		{"collector.key_file", c.Collector.KeyFile, config.CheckReadable},
		{"collector.token_file", c.Collector.TokenFile, config.CheckReadable},
	} {
		if err := f.check(f.name); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.path, err))
		}
	}
	return errors.Join(errs...)
}

// Validate reports every problem, each with its YAML path.
func (c Config) Validate() error {
	var errs []error
	add := func(path, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, a...)))
	}
	sock := func(path, v string) {
		switch {
		case v == "":
			add(path, "must be set (a Unix socket path)")
		case !filepath.IsAbs(v):
			add(path, "must be an absolute path, got %q", v)
		case len(v) > 107:
			add(path, "is %d bytes; a Unix socket path holds at most 107", len(v))
		}
	}
	sock("listen", c.Listen)
	sock("driver", c.Driver)
	if c.Listen != "" && filepath.Clean(c.Listen) == filepath.Clean(c.Driver) {
		add("listen", "must differ from driver (%s)", c.Driver)
	}
	if c.GatewayID == "" {
		add("gateway_id", "must be set (the gateway's openshell.ai/gateway-id; the Helm default is \"openshell\")")
	}
	if c.Layout != driverwire.Layout {
		add("layout", "unsupported driver wire layout %q (supported: %q)", c.Layout, driverwire.Layout)
	}
	if c.Collector.Address == "" {
		add("collector.address", "must be set (host:port of the collector's gRPC listener)")
	}
	if (c.Collector.CertFile == "") != (c.Collector.KeyFile == "") {
		add("collector.cert_file", "cert_file and key_file go together")
	}
	if c.Collector.Insecure && (c.Collector.CAFile != "" || c.Collector.CertFile != "" || c.Collector.ServerName != "") {
		add("collector.insecure", "plaintext cannot be combined with ca_file, cert_file or server_name")
	}
	if c.Relay != "" && c.Relay != "grpc" && c.Relay != "frame" {
		add("relay", "is no longer a setting (there is one relay, the gRPC legs); remove it, got %q", c.Relay)
	}
	if c.RelayEditMaxBytes < 0 {
		add("relay_edit_max_bytes", "is no longer a setting; remove it, got %d", c.RelayEditMaxBytes)
	}
	if c.ShutdownGrace <= 0 {
		add("shutdown_grace", "must be positive, got %s", c.ShutdownGrace)
	}
	f := c.Follow
	if f.TailPerSandbox < 0 || f.TailPerSandbox > 1000 {
		add("follow.tail_per_sandbox", "must be between 0 and 1000, got %d", f.TailPerSandbox)
	}
	if f.MaxSandboxes < 1 {
		add("follow.max_sandboxes", "must be at least 1, got %d", f.MaxSandboxes)
	}
	if f.MaxEvents < 1 {
		add("follow.max_events", "must be at least 1, got %d", f.MaxEvents)
	}
	if f.StartTail < 0 || f.StartTail > 1<<20 {
		add("follow.start_tail", "must be between 0 and 1048576, got %d", f.StartTail)
	}
	if f.DedupeWindow < 1 {
		add("follow.dedupe_window", "must be at least 1, got %d", f.DedupeWindow)
	}
	if f.BackoffMin <= 0 || f.BackoffMax < f.BackoffMin {
		add("follow.backoff_min", "backoff_min must be positive and at most backoff_max, got %s and %s", f.BackoffMin, f.BackoffMax)
	}
	if f.BackoffMax > time.Minute {
		add("follow.backoff_max", "must be at most 1m (a collector that is back is found by the probe; this only spaces refused attempts), got %s", f.BackoffMax)
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "\n"))
}
