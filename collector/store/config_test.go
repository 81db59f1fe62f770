package store

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v2"
)

func loadConfig(t *testing.T, name string) Config {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	cfg := NewDefaultConfig()
	if err := yaml.UnmarshalStrict(b, &cfg); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return cfg
}

func TestConfigFiles(t *testing.T) {
	good := loadConfig(t, "good.yaml")
	if err := good.Validate(); err != nil {
		t.Fatalf("good.yaml: %v", err)
	}
	if good.Retention.MaxAge != 168*time.Hour || good.DedupeWindow != time.Hour || good != NewDefaultConfig() {
		t.Fatalf("good.yaml (the defaults written out) parsed as %+v", good)
	}
	cases := map[string][]string{
		"negative.bad.yaml": {
			"segment_bytes: 1024 is below the minimum 4096",
			"retention.max_bytes: -1 must not be negative (0 = unbounded)",
			"retention.max_age: -5m0s must not be negative (0 = unbounded)",
			"dedupe_window: 0s must be positive",
			"dedupe_max_entries: 0 must be positive",
			"max_inflight_bytes: -3 must be positive",
		},
		"inconsistent.bad.yaml": {
			"dir: must be set",
			"retention.max_bytes: 100000000 must be at least twice segment_bytes (67108864)",
			"dedupe_window: 1h0m0s must not exceed retention.max_age (30m0s)",
		},
	}
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := loadConfig(t, name)
			err := cfg.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(want) {
				t.Errorf("got %d problems, want %d:\n%v", len(lines), len(want), err)
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("missing %q in:\n%v", w, err)
				}
			}
		})
	}
}
