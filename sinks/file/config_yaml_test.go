package file

import (
	"os"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v2"
)

func TestConfigFiles(t *testing.T) {
	load := func(path string) Config {
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
	err := load("testdata/no-path.bad.yaml").Validate()
	want := []string{"path: must be set", "max_bytes: must be at least 4096, got 1000", "max_files: must be between 1 and 1000, got 0", "resend_window: must be between 1 and 4194304, got 0"}
	if err == nil || len(strings.Split(err.Error(), "\n")) != len(want) {
		t.Fatalf("got %v, want %d problems", err, len(want))
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q in:\n%v", w, err)
		}
	}
	good := load("testdata/good.yaml")
	if err := good.Validate(); err != nil || good.MaxFiles != 3 {
		t.Errorf("good.yaml: %+v %v", good, err)
	}
}
