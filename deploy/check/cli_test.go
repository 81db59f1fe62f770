package check

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/testenv/evbin"
)

// The eventpipe binary, built once for the package's CLI tests.
var (
	cliOnce sync.Once
	cliBin  string
	cliErr  error
)

func eventpipeBinary(t *testing.T) string {
	t.Helper()
	cliOnce.Do(func() {
		bin := filepath.Join(tmpDir, "cli", "eventpipe")
		if err := evbin.Build(ctxT(t, 10*time.Minute), root, bin); err != nil {
			cliErr = err
			return
		}
		cliBin = bin
	})
	if cliErr != nil {
		t.Fatal(cliErr)
	}
	return cliBin
}

// runCLI runs the binary with args and returns its exit status and output.
func runCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	return runCLIIn(t, "", args...)
}

// TestCheckConfigOffline: the agent and collector configs the chart renders
// pass `--check-config --offline` exactly as rendered (secrets mounted at
// /var/run/secrets/eventpipe/... exist only in the pod), and the same check
// without --offline refuses them for those missing files: so CI can check a
// chart-rendered config, and --offline is what makes the difference.
func TestCheckConfigOffline(t *testing.T) {
	for _, values := range []string{"", "minimal.yaml", "kafka.yaml", "all-on.yaml"} {
		name := values
		var files []string
		if values == "" {
			name = "defaults"
		} else {
			files = []string{filepath.Join(root, "deploy", "check", "testdata", "values", values)}
		}
		t.Run(name, func(t *testing.T) {
			docs := renderSet(t, files, "cluster=ci")
			dir := t.TempDir()
			seen := 0
			for _, d := range docs {
				if d.Kind != "ConfigMap" {
					continue
				}
				data, _ := d.Object["data"].(map[string]any)
				for key, cmd := range map[string]string{"agent.yaml": "agent", "collector.yaml": "collector"} {
					s, ok := data[key].(string)
					if !ok {
						continue
					}
					seen++
					path := filepath.Join(dir, d.Name+"-"+key)
					if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
						t.Fatal(err)
					}
					if code, out := runCLI(t, cmd, "--config", path, "--check-config", "--offline"); code != 0 {
						t.Errorf("%s --check-config --offline %s: exit %d:\n%s\n%s", cmd, key, code, out, s)
					}
					mountsSecrets := strings.Contains(s, "/var/run/secrets/eventpipe/")
					code, out := runCLI(t, cmd, "--config", path, "--check-config")
					if mountsSecrets && (code != 2 || !strings.Contains(out, "/var/run/secrets/eventpipe/")) {
						t.Errorf("%s --check-config (online) %s: exit %d, want 2 naming a missing secret file:\n%s", cmd, key, code, out)
					}
				}
			}
			if seen == 0 {
				t.Fatal("no agent.yaml or collector.yaml rendered")
			}
		})
	}
}
