package collector

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func loadAndValidate(path string) error {
	c, err := LoadConfig(path)
	if err != nil {
		return err
	}
	return c.Validate()
}

func TestConfigExampleIsValid(t *testing.T) {
	c, err := LoadConfig("testdata/collector.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("testdata/collector.yaml: %v", err)
	}
	// "7d" is a week (day units are accepted and documented).
	if c.Store.Retention.MaxAge != 168*time.Hour {
		t.Errorf("store.retention.max_age: 7d read as %s", c.Store.Retention.MaxAge)
	}
	// Partial sections keep their defaults.
	if c.GRPC.ShutdownGrace != 15*time.Second || c.GRPC.MaxSendBytes != DefaultMaxSendBytes {
		t.Errorf("grpc = %+v", c.GRPC)
	}
	if len(c.Sinks) != 3 || c.Sinks[0].Batch.MaxRecords != 1000 || c.Sinks[0].Batch.MaxWait <= 0 || c.Sinks[0].Retry.Initial <= 0 {
		t.Errorf("sinks[0] defaults not kept: %+v", c.Sinks[0])
	}
	if c.Sinks[0].File == nil || c.Sinks[0].File.MaxFiles <= 0 || c.Sinks[1].Loki == nil || c.Sinks[2].Kafka == nil {
		t.Errorf("type sections not filled: %+v", c.Sinks)
	}
	if !c.Sinks[1].Filter.AttributedOnly || len(c.Sinks[2].Filter.Types) != 1 {
		t.Errorf("filters not read: %+v %+v", c.Sinks[1].Filter, c.Sinks[2].Filter)
	}
	if err := DevConfig().Validate(); err != nil {
		t.Fatalf("DevConfig: %v", err)
	}
}

func TestConfigKafkaExampleIsValid(t *testing.T) {
	c, err := LoadConfig("testdata/collector-kafka.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("testdata/collector-kafka.yaml: %v", err)
	}
	// A partial backbone section keeps the defaults of the rest.
	if !c.KafkaMode() || c.Backbone.Topic != "eventpipe.occurrences" || c.Backbone.CursorTopic != "eventpipe.cursors" ||
		c.Backbone.DedupeWindow != 65536 || !c.Backbone.CreateTopics {
		t.Errorf("backbone = %+v", c.Backbone)
	}
}

func TestLoadTokens(t *testing.T) {
	for _, f := range []string{"testdata/tokens.yaml", "testdata/tokens.csv"} {
		es, err := LoadTokens(f)
		if err != nil || len(es) != 2 || es[0].Role != RoleAgent || es[1].Role != RoleReader || len(es[1].Workspaces) == 0 {
			t.Errorf("%s: %+v, %v", f, es, err)
		}
	}
	es, _ := LoadTokens("testdata/tokens.csv")
	if strings.Join(es[1].Workspaces, ",") != "ws1,ws2" {
		t.Errorf("csv workspaces = %v", es[1].Workspaces)
	}
}

// Every *.bad.yaml is refused with all of its problems, each named by its
// YAML path.
func TestConfigBadFiles(t *testing.T) {
	cases := map[string][]string{
		"no-auth.bad.yaml": {
			"auth: no authentication configured: set auth.tokens_file, or grpc.tls.client_ca_file with auth.identities (mTLS), or auth.insecure: true for local development",
		},
		"unknown-key.bad.yaml": {
			"field listne not found",
		},
		"tokens-file.bad.yaml": {
			"auth.tokens_file: ",
			"testdata/tokens.bad.yaml[0].token: must be at least 16 characters",
			"testdata/tokens.bad.yaml[1].name: duplicate name \"a\"",
			"testdata/tokens.bad.yaml[1].workspaces: a reader needs at least one workspace",
			"testdata/tokens.bad.yaml[2].role: must be \"agent\" or \"reader\", got \"admin\"",
			"testdata/tokens.bad.yaml[3].workspaces: only a reader has workspaces",
		},
		"mtls.bad.yaml": {
			"grpc.tls.client_ca_file: needs grpc.tls.cert_file and key_file",
			"auth.identities[1].name: duplicate \"agent.prod.example\"",
			"auth.identities[1].workspaces: a reader needs at least one workspace",
		},
		"durations.bad.yaml": {
			"grpc.shutdown_grace: 20 is a bare number, which would be read as nanoseconds; write the unit: if 20 seconds were meant, write 20s",
			"store.retention.max_age: 604800 is a bare number, which would be read as nanoseconds; write the unit: if 604800 seconds were meant, write 168h or 7d",
			"store.dedupe_window: 3600 is a bare number, which would be read as nanoseconds; write the unit: if 3600 seconds were meant, write 1h",
			`readiness.loss_window: "15 minutes" is not a duration; write a number with a unit: ms, s, m, h or d (e.g. 500ms, 30s, 5m, 1h, 7d)`,
			"sinks[0].loki.timeout: 10 is a bare number",
			"sinks[0].batch.max_wait: 0.5 is a bare number, which would be read as nanoseconds; write the unit, e.g. 30s, 5m, 1h or 7d",
			"sinks[0].commit_interval: 1ns is below 1ms, the smallest duration eventpipe takes",
		},
		"short-durations.bad.yaml": {
			"grpc.shutdown_grace: 20ms is too short for this setting (at least 1s; was another unit meant?)",
			"store.retention.max_age: 30s is too short for this setting (at least 1m; was another unit meant?)",
			"store.dedupe_window: 500ms is too short for this setting (at least 1s; was another unit meant?)",
			"readiness.loss_window: 100ms is too short for this setting (at least 1s; was another unit meant?)",
		},
		"addresses.bad.yaml": {
			`grpc.listen: "127.0.0.1:99999": port 99999 is out of range 0-65535`,
			`http.listen: ":70x": port "70x" is neither a number (0-65535) nor a known service name`,
			`sinks[0].kafka.brokers[0]: "256.1.1.1:1": host "256.1.1.1" is not a valid IPv4 address`,
			`sinks[0].kafka.brokers[2]: "kafka-1:0": port 0 cannot be dialled`,
			`sinks[1].loki.url: "127.0.0.1:99999": port 99999 is out of range 0-65535`,
		},
		"kafka-mode.bad.yaml": {
			`backbone.brokers[0]: "kafka-0.kafka" is not host:port`,
			"backbone.produce_timeout: 10ms is too short",
			"store: set, but log is kafka",
			`sinks[0].kafka.topic: "eventpipe.occurrences" is a backbone topic`,
		},
		"log-mode.bad.yaml": {
			`log: must be local or kafka, got "embedded"`,
		},
		"backbone-without-kafka.bad.yaml": {
			`backbone: set, but log is "local": add log: kafka to use it`,
		},
		"kafka-no-backbone.bad.yaml": {
			"backbone: log: kafka needs a backbone section",
		},
		"insecure-exposed.bad.yaml": {
			`auth.insecure: refused on grpc.listen "0.0.0.0:7070", which other hosts can reach: anyone there could ingest and follow every workspace unauthenticated; listen on 127.0.0.1, or set auth.allow_insecure_non_loopback: true for a throw-away test setup`,
		},
		"file-sink-paths.bad.yaml": {
			`sinks[0].file.path: "/var/lib/eventpipe/sub/../log/events.jsonl" is inside store.dir "/var/lib/eventpipe/log": the log owns every file there`,
			`sinks[2].file.path: "/var/lib/eventpipe//events.jsonl" is also written by sinks[1].file.path: two sinks on one file`,
			`sinks[3].file.path: "/var/lib/eventpipe/events.jsonl.2" and the file of sinks[1].file.path are one rotation apart`,
		},
		"many.bad.yaml": {
			"grpc.listen: \"7070\" is not host:port",
			"grpc.tls: cert_file and key_file go together",
			"grpc.tls.cert_file: stat testdata/missing-cert.pem: no such file or directory",
			"grpc.max_recv_bytes: must be between 1024 and 1073741824, got 10",
			"grpc.ingest_pipeline: must be between 1 and 1024, got 0",
			"auth.identities: need grpc.tls.client_ca_file",
			"auth.identities[0].role: must be \"agent\" or \"reader\", got \"admin\"",
			"http.listen: must be set (host:port)",
			"store.dir: must be set",
			"store.segment_bytes: 10 is below the minimum",
			"follow.max_tail: must be between 1 and 1000000, got 0",
			"sinks[0].batch.max_records: must be between 1 and 100000, got 0",
			"sinks[0].loki: set, but the sink's type is \"file\"",
			"sinks[0].file.path: must be set",
			"sinks[0].file.max_files: must be between 1 and 1000, got 0",
			"sinks[1].name: duplicate sink name \"archive\"",
			"sinks[1].type: must be one of file, loki, kafka, got \"s3\"",
			"sinks[2].name: \"bad name!\" must use only letters",
			"sinks[2].filter.types[1]: duplicate \"Warning\"",
			"sinks[2].commit_interval: must be between 0 (after every push) and 5m0s, got -1s",
		},
	}
	files, _ := filepath.Glob("testdata/*.bad.yaml")
	for _, f := range files {
		if filepath.Base(f) == "tokens.bad.yaml" {
			continue // a tokens file, used by tokens-file.bad.yaml
		}
		if _, ok := cases[filepath.Base(f)]; !ok {
			t.Errorf("%s has no expected messages in this table", f)
		}
	}
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			err := loadAndValidate(filepath.Join("testdata", name))
			if err == nil {
				t.Fatal("accepted")
			}
			msg := strings.TrimPrefix(err.Error(), "parse config:\n")
			for _, w := range want {
				if !strings.Contains(msg, w) {
					t.Errorf("missing %q in:\n%s", w, msg)
				}
			}
			// Every problem, and only those listed: one line each (the tokens
			// file's problems are nested under auth.tokens_file).
			if lines := strings.Count(msg, "\n") + 1; name != "unknown-key.bad.yaml" && lines != len(want) && name != "tokens-file.bad.yaml" {
				t.Errorf("%d problems reported, want %d:\n%s", lines, len(want), msg)
			}
		})
	}
}

// auth.insecure on an address other hosts reach is accepted only with the
// explicit opt-in, which means nothing on its own.
func TestConfigInsecureNonLoopbackOptIn(t *testing.T) {
	for _, c := range []struct {
		yaml, want string
	}{
		{"grpc: {listen: \"127.0.0.1:7070\"}\nauth: {insecure: true}\n", ""},
		{"grpc: {listen: \"localhost:7070\"}\nauth: {insecure: true}\n", ""},
		{"grpc: {listen: \":7070\"}\nauth: {insecure: true}\n", `auth.insecure: refused on grpc.listen ":7070"`},
		{"grpc: {listen: \"10.1.2.3:7070\"}\nauth: {insecure: true}\n", `auth.insecure: refused on grpc.listen "10.1.2.3:7070"`},
		{"grpc: {listen: \"0.0.0.0:7070\"}\nauth: {insecure: true, allow_insecure_non_loopback: true}\n", ""},
		{"auth: {tokens_file: testdata/tokens.yaml, allow_insecure_non_loopback: true}\n", "auth.allow_insecure_non_loopback: has no meaning without auth.insecure: true"},
	} {
		cfg, err := ParseConfig([]byte(c.yaml + "store: {dir: /tmp/x}\n"))
		if err == nil {
			err = cfg.Validate()
		}
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q: %v", c.yaml, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%q: %v, want %q", c.yaml, err, c.want)
		}
	}
}

func TestConfigParseKeepsUnsetSinkSectionNil(t *testing.T) {
	c, err := ParseConfig([]byte("auth: {insecure: true}\nsinks:\n- {name: f, type: file, file: {path: /tmp/x.jsonl}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Sinks[0].Loki != nil || c.Sinks[0].Kafka != nil {
		t.Fatalf("sections of other types were filled: %+v", c.Sinks[0])
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// The shipped Kubernetes config parses, and validates once its mounted
// files exist.
func TestDeployConfigIsValid(t *testing.T) {
	data, err := os.ReadFile("../deploy/collector/collector.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca := newCA(t, "deploy-test")
	sc, sk := ca.issue(t, "collector", true)
	c.GRPC.TLS.CertFile = writeFile(t, filepath.Join(dir, "tls.crt"), sc)
	c.GRPC.TLS.KeyFile = writeFile(t, filepath.Join(dir, "tls.key"), sk)
	c.GRPC.TLS.ClientCAFile = writeFile(t, filepath.Join(dir, "ca.crt"), ca.pem)
	c.Auth.TokensFile = "../deploy/collector/tokens.example.yaml"
	// As shipped, the agent's cluster is the placeholder: refused in both
	// the identities and the tokens file until the operator names it; the
	// example's placeholder tokens are refused too.
	err = c.Validate()
	for _, want := range []string{
		`auth.identities[0].clusters[0]: "CHANGE-ME" is the placeholder of the shipped manifests`,
		`tokens.example.yaml[0].clusters[0]: "CHANGE-ME" is the placeholder of the shipped manifests`,
		`tokens.example.yaml[0].token: "REPLACE-WITH-A-RANDOM-TOKEN-FOR-THE-AGENT" is the example's placeholder`,
		`tokens.example.yaml[1].token: "REPLACE-WITH-A-RANDOM-TOKEN-FOR-TEAM-A" is the example's placeholder`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("shipped placeholder cluster: missing %q in %v", want, err)
		}
	}
	named, _ := os.ReadFile(c.Auth.TokensFile)
	named = []byte(strings.NewReplacer("[CHANGE-ME]", "[prod-eu-1]",
		"REPLACE-WITH-A-RANDOM-TOKEN-FOR-THE-AGENT", "4f1d9c2b7e6a5d8c3b0a9f8e7d6c5b4a",
		"REPLACE-WITH-A-RANDOM-TOKEN-FOR-TEAM-A", "0a1b2c3d4e5f60718293a4b5c6d7e8f9").Replace(string(named)))
	c.Auth.TokensFile = writeFile(t, filepath.Join(dir, "tokens.yaml"), named)
	c.Auth.Identities[0].Clusters = []string{"prod-eu-1"}
	if err := c.Validate(); err != nil {
		t.Fatalf("deploy/collector/collector.yaml: %v", err)
	}
	if !c.Store.Fsync || c.Store.DedupeWindow < time.Hour || len(c.Sinks) != 1 {
		t.Fatalf("unexpected deploy config: %+v", c)
	}
}

// A file sink reached through a symbolic link to store.dir is inside it
// too; a sibling whose name merely starts like the store's is not.
func TestConfigFileSinkPathResolved(t *testing.T) {
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "log")
	if err := os.MkdirAll(storeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(storeDir, filepath.Join(dir, "alias")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, want string
	}{
		{filepath.Join(dir, "alias", "events.jsonl"), "is inside store.dir"},
		{filepath.Join(dir, "alias", "new", "deeper", "events.jsonl"), "is inside store.dir"},
		{filepath.Join(dir, "log2", "events.jsonl"), ""},
		{filepath.Join(dir, "events.jsonl"), ""},
	} {
		cfg := NewDefaultConfig()
		cfg.Auth.Insecure = true
		cfg.Store.Dir = storeDir
		cfg.Sinks = []SinkConfig{fileSink("archive", c.path)}
		err := cfg.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.path, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.path, err, c.want)
		}
	}
}
