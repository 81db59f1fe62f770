package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eventpipe/eventpipe/collector"
)

// TestCollectorTokenAuth: the agent authenticates to a collector that
// demands bearer tokens (tokens file, role agent) with collector.tokenFile;
// with a wrong token it gets no cursor and is not ready.
func TestCollectorTokenAuth(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokens, []byte("- {token: agent-token-0123456789abc, name: agent-a, role: agent}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = 2 * time.Second
	cfg.Auth.TokensFile = tokens
	cfg.Store.Dir = filepath.Join(dir, "log")
	c, err := collector.New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	tc := &testCollector{c: c, cancel: cancel, done: done}
	t.Cleanup(func() { tc.stop(t) })

	good := filepath.Join(dir, "good-token")
	bad := filepath.Join(dir, "bad-token")
	if err := os.WriteFile(good, []byte("agent-token-0123456789abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("not-the-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	badCfg := testConfig("auth-bad", tc.addr())
	badCfg.Collector.TokenFile = bad
	rb := startAgent(t, badCfg)

	goodCfg := testConfig("auth", tc.addr())
	goodCfg.Collector.TokenFile = good
	startAgent(t, goodCfg)
	g := newLoadGen(t, "load-auth")
	for i := 0; i < 50; i++ {
		if err := g.create(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	checkDelivered(t, tc, g, 60*time.Second)

	if rb.a.Ready() == nil {
		t.Errorf("agent with a wrong token is ready")
	}
	if _, ok := c.Store().ClusterCursor("auth-bad", "events"); ok {
		t.Errorf("agent with a wrong token stored a cursor")
	}
}
