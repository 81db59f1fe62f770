package loki

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v2"
)

func loadConfig(path string) (Config, error) {
	c := NewDefaultConfig()
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return c, err
	}
	return c, c.Validate()
}

func TestDefaultConfigIsValid(t *testing.T) {
	if err := NewDefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigExample(t *testing.T) {
	c, err := loadConfig("testdata/loki.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxAge != 168*time.Hour || c.Timeout != 15*time.Second || !c.Tenant.FromWorkspace ||
		c.Labels.Static["env"] != "prod" || len(c.Labels.Fields) != 4 || c.TLS.CAFile != "testdata/ca.pem" {
		t.Fatalf("parsed %+v", c)
	}
}

// TestConfigBad shows what users get when they err: every problem, each
// with its YAML path.
func TestConfigBad(t *testing.T) {
	want := map[string][]string{
		"labels.bad.yaml": {
			`labels.job: value "eventpipe" is 9 bytes, longer than labels.max_value_bytes (4)`,
			`labels.static.__name__: "__name__" is not a valid label name`,
			`labels.static.env: value must not be empty`,
			`labels.static.job: label "job" is already set by labels.job`,
			`labels.fields[1]: "sandbox_id" is not allowed as a label (unbounded values belong in structured metadata)`,
			`labels.fields[2]: "pod" is not allowed as a label`,
			`labels.fields[3]: label "cluster" is already set by labels.fields[0]`,
			`labels.max_value_bytes: must be between 16 and 1024, got 4`,
		},
		"tenant-auth-tls.bad.yaml": {
			`tenant: set either fixed or from_workspace, not both`,
			`tenant.fixed: "team a" is not a valid tenant ID`,
			`tenant.default: required with from_workspace`,
			`auth.username: required with a password`,
			`tls: cert_file and key_file go together`,
			`tls: insecure_skip_verify makes ca_file useless`,
		},
		"wire.bad.yaml": {
			`url: scheme must be http or https, got "ftp"`,
			`encoding: must be "protobuf" or "json", got "xml"`,
			`timeout: must be positive, got 0s`,
			`max_age: must be positive, got -1h0m0s`,
			`max_future: must be positive, got 0s`,
			`max_message_bytes: must be between 256 and 16777216, got 10`,
		},
		"unknown-key.bad.yaml": {`field batch_size not found`},
		"no-fixed-label.bad.yaml": {
			`labels: set labels.job or a labels.static pair`,
		},
	}
	files, _ := filepath.Glob("testdata/*.bad.yaml")
	if len(files) != len(want) {
		t.Fatalf("%d bad files, %d expectations", len(files), len(want))
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			_, err := loadConfig(f)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range want[name] {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("missing %q in:\n%v", w, err)
				}
			}
			if got, exp := strings.Count(err.Error(), "\n")+1, len(want[name]); name != "unknown-key.bad.yaml" && got != exp {
				t.Errorf("%d problems reported, want %d:\n%v", got, exp, err)
			}
		})
	}
}
