//go:build !agentonly

package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/api/config"
	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
	"github.com/eventpipe/eventpipe/testenv/freeport"
)

// TestProxyReadyz: unready (503) until the proxy's socket listens.
func TestProxyReadyz(t *testing.T) {
	ready := make(chan struct{})
	h := proxyReadyz(ready)
	for i, want := range []int{http.StatusServiceUnavailable, http.StatusOK} {
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if rec.Code != want {
			t.Errorf("readyz %d, want %d", rec.Code, want)
		}
		if i == 0 {
			close(ready)
		}
	}
}

func TestDriverProxyConfigErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("listen: relative.sock\ndriver: /run/d.sock\ncollector:\n  address: ''\nfollow:\n  max_sandboxes: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unknown := filepath.Join(dir, "unknown.yaml")
	if err := os.WriteFile(unknown, []byte("listen: /run/p.sock\ncolector: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--config", bad, "--check-config"}, []string{"listen: must be an absolute path", "gateway_id: must be set",
			"collector.address: must be set", "follow.max_sandboxes: must be at least 1"}},
		{[]string{"--config", unknown}, []string{"field colector not found"}},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, []string{"no such file"}},
		{[]string{"--listen", "/run/p.sock", "--driver", "/run/p.sock", "--gateway", "g", "--collector", "c:1"}, []string{"listen: must differ from driver"}},
		{[]string{"extra"}, []string{"unexpected arguments"}},
	} {
		var stdout, stderr bytes.Buffer
		if code := realMain(append([]string{"driver-proxy"}, tc.args...), nil, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %s)", tc.args, code, stderr.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%v: stderr lacks %q:\n%s", tc.args, w, stderr.String())
			}
		}
	}
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("listen: /run/eventpipe/proxy.sock\ndriver: /run/openshell/driver.sock\ngateway_id: openshell\ncollector:\n  address: collector:7070\n  insecure: true\nfollow:\n  tail_per_sandbox: 50\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := realMain([]string{"driver-proxy", "--config", good, "--check-config"}, nil, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "is valid") {
		t.Errorf("good config: exit %d: %s%s", code, stdout.String(), stderr.String())
	}
	// Settings of the removed frame relay and fail-open grace: accepted,
	// each with a warning that says to remove it.
	old := filepath.Join(dir, "old.yaml")
	if err := os.WriteFile(old, []byte("listen: /run/eventpipe/proxy.sock\ndriver: /run/openshell/driver.sock\ngateway_id: openshell\ncollector:\n  address: collector:7070\n  insecure: true\nrelay_edit_max_bytes: 1048576\nfollow:\n  fail_open_after: 30s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	if code := realMain([]string{"driver-proxy", "--config", old, "--relay", "frame", "--check-config"}, nil, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "is valid") {
		t.Errorf("config with removed settings: exit %d: %s%s", code, stdout.String(), stderr.String())
	}
	for _, w := range []string{`warning: relay: "frame" is ignored`, "warning: relay_edit_max_bytes is ignored", "warning: follow.fail_open_after is ignored"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("removed settings: stderr lacks %q:\n%s", w, stderr.String())
		}
	}
}

// TestDriverProxyCommandForwards runs the subcommand against the test
// driver, with no collector listening, and calls through it.
func TestDriverProxyCommandForwards(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "dp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	drv, err := gatewaytest.StartDriver(filepath.Join(dir, "driver", "driver.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Stop()
	drv.Put(gatewaytest.Sandbox{ID: "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b", Name: "cmd"})
	sock := filepath.Join(dir, "proxy", "proxy.sock")
	metricsAddr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		// --gomaxprocs 0: the command runs in this test process, whose
		// Ps it must not change.
		done <- runDriverProxy(ctx, []string{"--listen", sock, "--driver", drv.Path, "--gateway", "openshell",
			"--collector", "127.0.0.1:1", "--insecure", "--log-level", "error", "--gomaxprocs", "0",
			"--metrics-listen", metricsAddr}, nil, &bytes.Buffer{}, &stderr)
	}()
	c, err := gatewaytest.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := c.Unary(cctx, gatewaytest.MethodList, nil)
		ccancel()
		if err == nil {
			sbs, derr := gatewaytest.DecodeSandboxes(resp.Bodies[0])
			if derr != nil || len(sbs) != 1 || sbs[0].Name != "cmd" {
				t.Errorf("ListSandboxes through the command: %v %+v", derr, sbs)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer through the command: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The probes of the gateway pod (deploy/openshell/gateway-patch.yaml)
	// and the PodMonitor's scrape: ready with the collector unreachable.
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ok", "/metrics": "eventpipe_driver_proxy_rpcs_total"} {
		resp, err := http.Get("http://" + metricsAddr + path)
		if err != nil {
			t.Errorf("GET %s: %v", path, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d %q, want 200 with %q", path, resp.StatusCode, body, want)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d: %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("driver-proxy did not stop")
	}
}

// TestDriverProxyProcs: one P unless told otherwise; an operator's
// GOMAXPROCS is kept unless --gomaxprocs is given.
func TestDriverProxyProcs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flagSet bool
		flag    int
		env     string
		want    int
	}{
		{"default", false, 1, "", 1},
		{"env kept", false, 1, "4", 0},
		{"flag wins over env", true, 2, "4", 2},
		{"flag 0: Go's default", true, 0, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := proxyProcs(tc.flagSet, tc.flag, tc.env); got != tc.want {
				t.Errorf("proxyProcs(%v, %d, %q) = %d, want %d", tc.flagSet, tc.flag, tc.env, got, tc.want)
			}
		})
	}
}

// TestDriverProxyCheckConfigOffline: --check-config looks at the files the
// config names (the proxy itself starts without them: it fails open), and
// --offline leaves them alone, so CI can check the config the gateway pod
// mounts its Secrets for, as with the collector and the agent.
func TestDriverProxyCheckConfigOffline(t *testing.T) {
	t.Cleanup(func() { config.SetOffline(false) })
	dir := t.TempDir()
	rendered := filepath.Join(dir, "proxy.yaml")
	if err := os.WriteFile(rendered, []byte("listen: /run/eventpipe/proxy.sock\ndriver: /run/openshell/driver.sock\ngateway_id: openshell\n"+
		"collector:\n  address: collector.eventpipe.svc:7070\n  ca_file: /etc/eventpipe/tls/ca.crt\n  token_file: /etc/eventpipe/reader/token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args     []string
		code     int
		want     []string
		wantNone string
	}{
		{[]string{"--check-config"}, 2, []string{"collector.ca_file: stat /etc/eventpipe/tls/ca.crt", "collector.token_file: open /etc/eventpipe/reader/token"}, ""},
		{[]string{"--check-config", "--offline"}, 0, []string{"is valid (offline: the files it names not checked)"}, "ca_file"},
		{[]string{"--offline"}, 2, []string{"--offline goes with --check-config"}, ""},
	} {
		var stdout, stderr bytes.Buffer
		code := realMain(append([]string{"driver-proxy", "--config", rendered}, tc.args...), nil, &stdout, &stderr)
		out := stdout.String() + stderr.String()
		if code != tc.code {
			t.Errorf("%v: exit %d, want %d:\n%s", tc.args, code, tc.code, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out)
			}
		}
		if tc.wantNone != "" && strings.Contains(out, tc.wantNone) {
			t.Errorf("%v: output names %q:\n%s", tc.args, tc.wantNone, out)
		}
	}
	// Offline still checks everything else.
	var stdout, stderr bytes.Buffer
	if code := realMain([]string{"driver-proxy", "--config", rendered, "--check-config", "--offline", "--insecure"}, nil, &stdout, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "collector.insecure: plaintext cannot be combined") {
		t.Errorf("offline with --insecure and a CA: exit %d:\n%s", code, stderr.String())
	}
}
