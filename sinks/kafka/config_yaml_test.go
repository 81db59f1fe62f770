package kafka

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v2"
)

// What a user gets for each bad file in testdata: every problem, with its
// YAML path (the collector prefixes them with sinks[i].kafka).
func TestBadConfigFiles(t *testing.T) {
	want := map[string][]string{
		"sasl-without-password.bad.yaml": {
			"sasl.password: set exactly one of password and password_file",
		},
		"unknown-options.bad.yaml": {
			`brokers[0]: "kafka-0.kafka" is not host:port`,
			`topic: "audit events" is not a valid Kafka topic name`,
			`compression: "brotli" is not one of none, snappy, lz4, zstd, gzip`,
			`value_format: "avro" is not one of json, protobuf, ocsf`,
			"max_message_bytes: must be at least 16384, got 100",
		},
		"tls-off-with-files.bad.yaml": {
			"tls.enabled: tls options are set but tls.enabled is false",
			"tls.cert_file: cert_file and key_file go together",
			"tls.ca_file: open /nonexistent/ca.pem: no such file or directory",
			"tls.cert_file: open /nonexistent/client.pem: no such file or directory",
			"create_topic.partitions: must be at least 1, got 0",
			"create_topic.replication_factor: must be at least 1, got 0",
		},
	}
	files, _ := filepath.Glob("testdata/*.bad.yaml")
	if len(files) != len(want) {
		t.Fatalf("%d bad files, %d expectations", len(files), len(want))
	}
	for _, f := range files {
		cfg := load(t, f)
		err := cfg.Validate()
		if err == nil {
			t.Errorf("%s: accepted", f)
			continue
		}
		lines := strings.Split(err.Error(), "\n")
		exp := want[filepath.Base(f)]
		if len(lines) != len(exp) {
			t.Errorf("%s: %d problems, want %d:\n%v", f, len(lines), len(exp), err)
		}
		for _, w := range exp {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: missing %q in:\n%v", f, w, err)
			}
		}
	}
	good := load(t, "testdata/good.yaml")
	if err := good.Validate(); err != nil {
		t.Errorf("good.yaml: %v", err)
	}
	if good.Compression != CompressionZstd || good.Conn.ClientID != DefaultClientID || good.WriteTimeout.Seconds() != 5 {
		t.Errorf("good.yaml parsed to %+v", good)
	}
}

func load(t *testing.T, path string) Config {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := NewDefaultConfig()
	if err := yaml.UnmarshalStrict(b, &cfg); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cfg
}
