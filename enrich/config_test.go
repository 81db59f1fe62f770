package enrich

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// loadConfig decodes YAML over the defaults, as the agent does.
func loadConfig(t *testing.T, path string) (Config, error) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := NewDefaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	return cfg, cfg.Validate()
}

func TestConfigYAML(t *testing.T) {
	cfg, err := loadConfig(t, "testdata/config/good.yaml")
	if err != nil {
		t.Fatalf("good.yaml: %v", err)
	}
	if cfg.Cluster != "kind-osrepro" || cfg.PersistentWindow != 15*time.Minute || cfg.PersistentAfter != 5 ||
		len(cfg.Rules.SharedNamespaces) != 2 || cfg.Rules.PVCPrefix != "workspace-" {
		t.Fatalf("good.yaml decoded as %+v", cfg)
	}
	tests := map[string][]string{
		"testdata/config/limits.bad.yaml": {
			"max_message_bytes: must be at least 30, got 10",
			"persistent_after: must be at least 1, got 0",
			"persistent_window: must be positive, got -1m0s",
			"tracker_capacity: must be at least 1, got 0",
		},
		"testdata/config/rules.bad.yaml": {
			"rules.sandbox_id_keys: must list at least one key",
			"rules.workspace_keys[0]: must not be empty",
			"rules.sandbox_kind: must not be empty",
			"rules.shared_separator: must not be empty when rules.shared_namespaces is set",
			"rules.progress_container: must not be empty",
		},
	}
	for path, want := range tests {
		_, err := loadConfig(t, path)
		if err == nil {
			t.Fatalf("%s accepted", path)
		}
		lines := strings.Split(err.Error(), "\n")
		if len(lines) != len(want) {
			t.Errorf("%s: %d problems reported, want %d:\n%v", path, len(lines), len(want), err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: missing %q in:\n%v", path, w, err)
			}
		}
	}
}
