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
		"many.bad.yaml": {
			"grpc.listen: \"7070\" is not host:port",
			"grpc.tls: cert_file and key_file go together",
			"grpc.tls.cert_file: stat testdata/missing-cert.pem: no such file or directory",
			"grpc.max_recv_bytes: must be between 1024 and 1073741824, got 10",
			"grpc.ingest_pipeline: must be between 1 and 1024, got 0",
			"auth.identities: need grpc.tls.client_ca_file",
			"auth.identities[0].role: must be \"agent\" or \"reader\", got \"admin\"",
			"http.listen: must not be empty (host:port)",
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
			msg := err.Error()
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
	if err := c.Validate(); err != nil {
		t.Fatalf("deploy/collector/collector.yaml: %v", err)
	}
	if !c.Store.Fsync || c.Store.DedupeWindow < time.Hour || len(c.Sinks) != 1 {
		t.Fatalf("unexpected deploy config: %+v", c)
	}
}
