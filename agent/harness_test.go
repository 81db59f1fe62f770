package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/testenv/kube"
)

// cluster is one real etcd + kube-apiserver shared by this package's
// integration tests (a start costs seconds on a 2-core machine). Tests use
// distinct namespaces/workspaces so they do not see each other's objects as
// their own; each test counts only the Events it wrote.
var cluster *kube.Cluster

func TestMain(m *testing.M) {
	os.Exit(kube.RunTestMain(m, "agent-test-", func(c *kube.Cluster) error { cluster = c; return nil },
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run")))
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("AGENT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// ---- a real collector (gRPC Ingest over the durable store) ----

type testCollector struct {
	c      *collector.Collector
	reg    *prometheus.Registry // the collector's and its store's metrics
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startCollector(t testing.TB, dir string) *testCollector {
	t.Helper()
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = 2 * time.Second
	cfg.Auth.Insecure = true
	cfg.Store.Dir = filepath.Join(dir, "log")
	reg := prometheus.NewRegistry()
	c, err := collector.New(cfg, nil, reg)
	if err != nil {
		t.Fatalf("collector.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tc := &testCollector{c: c, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { tc.done <- c.Run(ctx) }()
	t.Cleanup(func() { tc.stop(t) })
	return tc
}

func (tc *testCollector) stop(t testing.TB) {
	tc.once.Do(func() {
		tc.cancel()
		select {
		case err := <-tc.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("collector Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("collector did not stop")
		}
	})
}

func (tc *testCollector) addr() string { return tc.c.GRPCAddr() }

// deduplicated is how many occurrences the collector recognised as already
// stored (and did not store again) since it started.
func (tc *testCollector) deduplicated(t testing.TB) float64 {
	return counter(t, tc.reg, "eventpipe_collector_deduplicated_occurrences_total", nil)
}

// all returns every stored occurrence, in log order.
func (tc *testCollector) all(t testing.TB) []*eventpipev1.Occurrence {
	t.Helper()
	var out []*eventpipev1.Occurrence
	from := uint64(1)
	for {
		recs, _, err := tc.c.Store().Read(context.Background(), from, 4096)
		if err != nil {
			t.Fatalf("read store: %v", err)
		}
		if len(recs) == 0 {
			return out
		}
		for _, r := range recs {
			out = append(out, r.Occurrence)
			from = r.Offset + 1
		}
	}
}

// ---- an in-process agent ----

func testConfig(clusterName, collectorAddr string) Config {
	cfg := NewDefaultConfig()
	cfg.Cluster = clusterName
	cfg.Collector.Address = collectorAddr
	cfg.Collector.Insecure = true
	cfg.HTTP.Listen = ""
	cfg.LeaderElection.Enabled = false
	cfg.Ship.FlushInterval = 50 * time.Millisecond
	cfg.Hold.MaxAge = 5 * time.Second
	cfg.Hold.RetryInterval = 100 * time.Millisecond
	return cfg
}

type runningAgent struct {
	a      *Agent
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// startAgent runs an agent with the least-privilege token (AgentConfig).
func startAgent(t testing.TB, cfg Config) *runningAgent {
	t.Helper()
	reg := prometheus.NewRegistry()
	a, err := New(cfg, cluster.AgentConfig(), Options{Logger: testLogger(t), Registerer: reg, Gatherer: reg})
	if err != nil {
		t.Fatalf("agent.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ra := &runningAgent{a: a, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { ra.done <- a.Run(ctx) }()
	t.Cleanup(func() { ra.stop(t) })
	return ra
}

func (ra *runningAgent) stop(t testing.TB) {
	ra.once.Do(func() {
		ra.cancel()
		select {
		case err := <-ra.done:
			if err != nil {
				t.Errorf("agent Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("agent did not stop within 30s")
		}
	})
}

// counter sums a metric family's samples whose labels include want.
func counter(t testing.TB, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				if !hasLabel(m, k, v) {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k {
			return l.GetValue() == v
		}
	}
	return false
}

// waitFor polls cond until it is true or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s: %s", d, what, last)
}

// agentKubeconfig writes a kubeconfig for the agent's least-privilege token.
func agentKubeconfig(t testing.TB, dir string) string {
	t.Helper()
	rc := cluster.AgentConfig()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData, CertificateAuthority: rc.CAFile}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken}
	kc.Contexts["agent"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "agent"}
	kc.CurrentContext = "agent"
	path := filepath.Join(dir, "agent.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("write kubeconfig: %v", err)
	}
	return path
}

var _ = rest.CopyConfig
