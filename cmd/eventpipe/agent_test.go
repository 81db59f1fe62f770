package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAgentCommandConfigErrors: bad flags and files exit 2 and name every
// problem with its YAML path; --check-config accepts a good configuration.
func TestAgentCommandConfigErrors(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("ship:\n  batch_size: 0\nhold:\n  max_age: -1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		args  []string
		code  int
		wants []string
	}{
		{"no cluster, no collector", []string{"--kubeconfig", kc}, 2,
			[]string{"cluster: must be set", "collector.address: must be set"}},
		{"bad file", []string{"--kubeconfig", kc, "--config", bad, "--cluster", "c", "--collector", "h:1"}, 2,
			[]string{"ship.batch_size: must be at least 1, got 0", "hold.max_age: must not be negative"}},
		{"unknown key", []string{"--config", writeFile(t, dir, "unknown.yaml", "colector: {}\n")}, 2,
			[]string{"field colector not found"}},
		{"missing kubeconfig", []string{"--kubeconfig", filepath.Join(dir, "none"), "--cluster", "c", "--collector", "h:1", "--insecure"}, 2,
			[]string{"kubernetes client config"}},
		{"placeholder cluster", []string{"--kubeconfig", kc, "--cluster", "CHANGE-ME", "--collector", "h:1", "--insecure", "--check-config"}, 2,
			[]string{`cluster: "CHANGE-ME" is the placeholder of the shipped manifests`}},
		{"traps", []string{"--kubeconfig", kc, "--cluster", "c", "--config", writeFile(t, dir, "traps.yaml", "collector: {address: \"256.1.1.1:7070\", dial_timeout: 10}\n"), "--check-config"}, 2,
			[]string{"collector.dial_timeout: 10 is a bare number, which would be read as nanoseconds; write the unit: if 10 seconds were meant, write 10s"}},
		{"unbindable", []string{"--kubeconfig", kc, "--cluster", "c", "--collector", "256.1.1.1:7070", "--listen", "127.0.0.1:99999", "--insecure", "--check-config"}, 2,
			[]string{`collector.address: "256.1.1.1:7070": host "256.1.1.1" is not a valid IPv4 address`, `http.listen: "127.0.0.1:99999": port 99999 is out of range`}},
		{"check ok", []string{"--kubeconfig", kc, "--cluster", "c", "--collector", "h:1", "--insecure", "--check-config"}, 0,
			[]string{"configuration ok"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := runAgent(context.Background(), c.args, nil, &out, &errb)
			if code != c.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, c.code, out.String(), errb.String())
			}
			all := out.String() + errb.String()
			for _, w := range c.wants {
				if !strings.Contains(all, w) {
					t.Errorf("output does not mention %q:\n%s", w, all)
				}
			}
		})
	}
}

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
