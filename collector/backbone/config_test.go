package backbone

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func loadConfig(t *testing.T, path string) (Config, error) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return ParseConfig(b)
}

func TestGoodConfigIsTheDefaults(t *testing.T) {
	c, err := loadConfig(t, "testdata/good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("good.yaml: %v", err)
	}
	d := NewDefaultConfig()
	d.Conn.Brokers = c.Conn.Brokers
	if c.ProduceTimeout != 10*time.Second || c.DedupeWindow != 65536 || c.Topic != d.Topic ||
		c.CursorTopic != d.CursorTopic || c.Partitions != d.Partitions || c.GroupPrefix != d.GroupPrefix {
		t.Fatalf("good.yaml (the defaults written out) parsed as %+v, defaults %+v", c, d)
	}
	if c.MinInsync() != 2 {
		t.Errorf("min.insync.replicas for replication 3 = %d, want 2", c.MinInsync())
	}
}

// What a user gets for each bad file in testdata: every problem, with its
// YAML path (the collector prefixes them with "backbone.").
func TestBadConfigFiles(t *testing.T) {
	want := map[string][]string{
		"empty.bad.yaml": {
			"brokers: at least one broker address is required",
		},
		"values.bad.yaml": {
			`brokers[0]: "kafka-0.kafka" is not host:port`,
			"brokers[1]: ",
			"client_id: must be set",
			`topic: "eventpipe occurrences" is not a valid Kafka topic name`,
			"cursor_topic: must be set",
			`group_prefix: "team/a": use letters, digits`,
			"partitions: must be between 1 and 10000, got 0",
			"min_insync_replicas: 4 exceeds replication_factor 3",
			"produce_timeout: 10ms is too short",
			"max_record_bytes: must be between 16384 and 1073741824, got 100",
			"dedupe_window: must be between 1024 and 16777216 records per partition, got 10",
			"session_timeout: must be between 6s and 30m",
		},
		"security.bad.yaml": {
			"cursor_topic: must differ from topic",
			"tls.enabled: tls options are set but tls.enabled is false",
			"tls.cert_file: cert_file and key_file go together",
			"tls.ca_file: open /nonexistent/ca.pem: no such file or directory",
			"tls.cert_file: open /nonexistent/client.pem: no such file or directory",
			`sasl.mechanism: "SCRAM-SHA-1" is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512`,
		},
		"transactions.bad.yaml": {
			"transactions.timeout: must be between 1s and 15m",
			`transactions.id: "collector 0": use letters, digits`,
		},
		"transactions-off.bad.yaml": {
			"transactions.id: set, but transactions.enabled is false",
		},
		// Refused while parsing, before Validate.
		"bare-duration.bad.yaml": {
			"produce_timeout",
		},
	}
	files, _ := filepath.Glob("testdata/*.bad.yaml")
	if len(files) != len(want) {
		t.Fatalf("%d bad files, %d expectations", len(files), len(want))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			c, err := loadConfig(t, f)
			if err == nil {
				err = c.Validate()
			}
			if err == nil {
				t.Fatal("accepted")
			}
			w := want[filepath.Base(f)]
			lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
			if filepath.Base(f) != "bare-duration.bad.yaml" && len(lines) != len(w) {
				t.Errorf("got %d problems, want %d:\n%v", len(lines), len(w), err)
			}
			for _, s := range w {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("missing %q in:\n%v", s, err)
				}
			}
		})
	}
}

func TestMinInsync(t *testing.T) {
	for _, c := range []struct{ rf, set, want int }{
		{1, 0, 1}, {2, 0, 1}, {3, 0, 2}, {4, 0, 3}, {5, 0, 3}, {3, 3, 3},
	} {
		cfg := Config{ReplicationFactor: c.rf, MinInsyncReplicas: c.set}
		if got := cfg.MinInsync(); got != c.want {
			t.Errorf("rf %d set %d: %d, want %d", c.rf, c.set, got, c.want)
		}
	}
}

func TestClientOptions(t *testing.T) {
	c := NewDefaultConfig()
	c.Conn.Brokers = []string{"127.0.0.1:9092"}
	c.Conn.SASL.Mechanism, c.Conn.SASL.Username, c.Conn.SASL.Password = "SCRAM-SHA-512", "u", "p"
	opts, err := c.ClientOptions()
	// seed brokers, client id, software name and version, SASL, read_committed
	if err != nil || len(opts) != 5 {
		t.Fatalf("opts %d, err %v", len(opts), err)
	}
	c.Conn.TLS.Enabled, c.Conn.TLS.CAFile = true, "/nonexistent/ca.pem"
	if _, err := c.ClientOptions(); err == nil || !strings.Contains(err.Error(), "ca_file") {
		t.Fatalf("missing CA file: %v", err)
	}
}

func TestPartialSectionGetsDefaults(t *testing.T) {
	c, err := ParseConfig([]byte("brokers: [\"k:9092\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := NewDefaultConfig()
	want.Conn.Brokers = []string{"k:9092"}
	if c.Topic != want.Topic || c.DedupeWindow != want.DedupeWindow || c.ProduceTimeout != want.ProduceTimeout {
		t.Fatalf("parsed %+v", c)
	}
	if _, err := ParseConfig([]byte("brokers: [\"k:9092\"]\ntopics: x\n")); err == nil {
		t.Fatal("unknown key accepted")
	}
}
