//go:build !agentonly

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestCollectorCommandConfigErrors(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("grpc: {listen: nope, ingest_pipeline: 0}\nstore: {dir: \"\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := realMain([]string{"collector", "--config", bad}, nil, &stdout, &stderr); code != 2 {
		t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr.String())
	}
	for _, want := range []string{
		"invalid config " + bad,
		"grpc.listen: \"nope\" is not host:port",
		"grpc.ingest_pipeline: must be between 1 and 1024, got 0",
		"store.dir: must be set",
		"auth: no authentication configured",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	stderr.Reset()
	if code := realMain([]string{"collector", "--config", filepath.Join(dir, "missing.yaml")}, nil, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "no such file") {
		t.Fatalf("missing file: exit %d, stderr %s", code, stderr.String())
	}
	if code := realMain([]string{"collector", "extra"}, nil, &stdout, &stderr); code != 2 {
		t.Fatalf("stray argument: exit %d", code)
	}
}

// The traps an operator reported: --check-config refuses durations without
// a unit (they were nanoseconds) and addresses no listener can bind.
func TestCollectorCheckConfigRefusesTraps(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		yaml string
		want []string
	}{
		{"store: {dir: /tmp/x, retention: {max_age: 604800}, dedupe_window: 3600}\ngrpc: {shutdown_grace: 20}\nauth: {insecure: true}\n", []string{
			"store.retention.max_age: 604800 is a bare number", "write 168h or 7d",
			"store.dedupe_window: 3600 is a bare number", "grpc.shutdown_grace: 20 is a bare number",
		}},
		{"grpc: {listen: \"127.0.0.1:99999\"}\nstore: {dir: /tmp/x}\nauth: {insecure: true}\n", []string{`grpc.listen: "127.0.0.1:99999": port 99999 is out of range`}},
		{"grpc: {listen: \"256.1.1.1:1\"}\nstore: {dir: /tmp/x}\nauth: {insecure: true, allow_insecure_non_loopback: true}\n", []string{`host "256.1.1.1" is not a valid IPv4 address`}},
		{"http: {listen: \":70x\"}\nstore: {dir: /tmp/x}\nauth: {insecure: true}\n", []string{`http.listen: ":70x": port "70x" is neither a number`}},
	} {
		f := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(f, []byte(c.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		if code := runCollector(context.Background(), []string{"--config", f, "--check-config"}, nil, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2; stdout %q", c.yaml, code, stdout.String())
		}
		for _, w := range c.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%q: stderr lacks %q:\n%s", c.yaml, w, stderr.String())
			}
		}
	}
}

// The command runs a real collector from a config file and stops cleanly
// when its context ends (SIGTERM in main).
func TestCollectorCommandRunsAndStops(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "collector.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
grpc: {listen: "127.0.0.1:0"}
http: {listen: "127.0.0.1:0"}
auth: {insecure: true}
store: {dir: %q}
sinks:
  - {name: archive, type: file, file: {path: %q}}
`, filepath.Join(dir, "log"), filepath.Join(dir, "events.jsonl"))), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if code := runCollector(context.Background(), []string{"--config", cfg, "--check-config"}, nil, &stdout, os.Stderr); code != 0 || !strings.Contains(stdout.String(), "is valid") {
		t.Fatalf("--check-config: exit %d, %q", code, stdout.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- runCollector(ctx, []string{"--config", cfg, "--log-format", "json"}, nil, &stdout, &stderr)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), `"msg":"collector started"`) {
		if time.Now().After(deadline) {
			t.Fatalf("not started:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), "INSECURE MODE") {
		t.Errorf("insecure mode not logged loudly:\n%s", stderr.String())
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("did not stop")
	}
	if !strings.Contains(stderr.String(), `"msg":"collector stopped"`) {
		t.Errorf("no clean stop logged:\n%s", stderr.String())
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
