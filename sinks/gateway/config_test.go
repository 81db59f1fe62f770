package gateway

import (
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	good := NewDefaultConfig()
	good.Listen, good.Driver, good.GatewayID = "/run/p/proxy.sock", "/run/d/driver.sock", "openshell"
	good.Collector.Address = "collector:7070"
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want []string
	}{
		{"nothing set", func(c *Config) { *c = NewDefaultConfig() }, []string{"listen: must be set", "driver: must be set", "gateway_id: must be set", "collector.address: must be set"}},
		{"relative and equal sockets", func(c *Config) { c.Listen, c.Driver = "p.sock", "p.sock" }, []string{"listen: must be an absolute path", "driver: must be an absolute path", "listen: must differ from driver"}},
		{"socket path too long", func(c *Config) { c.Listen = "/" + strings.Repeat("x", 120) }, []string{"at most 107"}},
		{"unknown layout", func(c *Config) { c.Layout = "2027-01-01" }, []string{`layout: unsupported driver wire layout "2027-01-01"`}},
		{"tls halves", func(c *Config) { c.Collector.CertFile = "c.pem" }, []string{"cert_file and key_file go together"}},
		{"insecure with tls", func(c *Config) { c.Collector.Insecure, c.Collector.CAFile = true, "ca.pem" }, []string{"collector.insecure: plaintext cannot be combined"}},
		{"unknown relay", func(c *Config) { c.Relay = "h3" }, []string{`relay: is no longer a setting (there is one relay, the gRPC legs); remove it, got "h3"`}},
		{"backoff cap", func(c *Config) { c.Follow.BackoffMax = 2 * time.Minute }, []string{"follow.backoff_max: must be at most 1m"}},
		{"bounds", func(c *Config) {
			c.Follow.MaxSandboxes, c.Follow.MaxEvents, c.Follow.DedupeWindow = 0, 0, 0
			c.Follow.TailPerSandbox, c.Follow.StartTail = 5000, -1
			c.Follow.BackoffMin, c.Follow.BackoffMax = time.Second, time.Millisecond
		}, []string{"follow.max_sandboxes", "follow.max_events", "follow.dedupe_window",
			"follow.tail_per_sandbox: must be between 0 and 1000", "follow.start_tail", "follow.backoff_min"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mod(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte("listen: /run/p.sock\nfollow:\n  backoff_min: 250ms\n  tail_per_sandbox: 20\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "/run/p.sock" || c.Follow.BackoffMin != 250*time.Millisecond || c.Follow.TailPerSandbox != 20 || c.Follow.MaxSandboxes != 10000 ||
		c.Follow.BackoffMax != 5*time.Second {
		t.Errorf("parsed %+v", c)
	}
	if d := c.Deprecations(); len(d) != 0 {
		t.Errorf("deprecations of a current config: %q", d)
	}
	if _, err := ParseConfig([]byte("follow:\n  tail: 3\n")); err == nil || !strings.Contains(err.Error(), "field tail not found") {
		t.Errorf("unknown key: %v", err)
	}
}

// TestRemovedSettings: a config written for the proxy with two relays and a
// fail-open grace still starts (an upgrade must not cut the gateway off its
// driver), and each removed key gets a warning that says what to do.
func TestRemovedSettings(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want []string
	}{
		{"relay: frame\n", []string{`relay: "frame" is ignored`}},
		{"relay: grpc\nrelay_edit_max_bytes: 1048576\n", []string{`relay: "grpc" is ignored`, "relay_edit_max_bytes is ignored"}},
		{"follow:\n  fail_open_after: 30s\n", []string{"follow.fail_open_after is ignored"}},
	} {
		t.Run(strings.TrimSpace(tc.yaml), func(t *testing.T) {
			c, err := ParseConfig([]byte("listen: /run/p/proxy.sock\ndriver: /run/d/driver.sock\ngateway_id: openshell\ncollector:\n  address: collector:7070\n" + tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			d := strings.Join(c.Deprecations(), "\n")
			if len(c.Deprecations()) != len(tc.want) {
				t.Errorf("warnings %q, want %d", d, len(tc.want))
			}
			for _, w := range tc.want {
				if !strings.Contains(d, w) || !strings.Contains(d, "remove the key") {
					t.Errorf("warnings lack %q and what to do:\n%s", w, d)
				}
			}
		})
	}
}
