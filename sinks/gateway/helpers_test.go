package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

func TestMain(m *testing.M) {
	if path := os.Getenv("GATEWAY_TEST_DIAL"); path != "" {
		os.Exit(childDial(path))
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("GATEWAY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// shortDir is a temp directory with a short path (Unix socket paths hold
// at most 107 bytes; t.TempDir() names can be long).
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/tmp", "gw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func startDriver(t testing.TB, dir string) *gatewaytest.Driver {
	t.Helper()
	d, err := gatewaytest.StartDriver(filepath.Join(dir, "driver", "driver.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d
}

func proxyConfig(dir, driverPath, collectorAddr string) Config {
	cfg := NewDefaultConfig()
	cfg.Listen = filepath.Join(dir, "proxy", "proxy.sock")
	cfg.Driver = driverPath
	cfg.GatewayID = "openshell"
	cfg.Collector.Address = collectorAddr
	cfg.Collector.Insecure = true
	cfg.Follow.BackoffMin = 50 * time.Millisecond
	cfg.Follow.BackoffMax = 500 * time.Millisecond
	return cfg
}

type runningProxy struct {
	p      *Proxy
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startProxy(t testing.TB, cfg Config) *runningProxy {
	t.Helper()
	reg := prometheus.NewRegistry()
	p, err := New(cfg, testLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rp := &runningProxy{p: p, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { rp.done <- p.Run(ctx) }()
	select {
	case <-p.Ready():
	case err := <-rp.done:
		cancel()
		t.Fatalf("proxy did not start: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("proxy not ready after 10s")
	}
	t.Cleanup(func() { rp.stop(t) })
	return rp
}

func (rp *runningProxy) stop(t testing.TB) {
	rp.once.Do(func() {
		rp.cancel()
		select {
		case err := <-rp.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("proxy Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("proxy did not stop")
		}
	})
}

func (rp *runningProxy) metric(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := rp.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func dialT(t testing.TB, path string) *gatewaytest.Client {
	t.Helper()
	c, err := gatewaytest.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond until it is true or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", d, what, detail)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// childDial runs in a child process (as another uid): it calls
// GetCapabilities on the socket and exits 0 on success, 3 when the
// connection was refused or dropped, 4 when the socket could not be
// reached at all (permissions).
func childDial(path string) int {
	if _, err := os.Stat(path); err != nil {
		fmt.Fprintln(os.Stderr, "stat:", err)
		return 4
	}
	c, err := gatewaytest.Dial(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 3
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = c.Unary(ctx, gatewaytest.MethodCaps, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "call:", err)
		return 3
	}
	return 0
}
