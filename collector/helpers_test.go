package collector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/file"
)

// TestMain runs the package's tests, or, when the kill test started this
// binary as one of its collector replicas (envKillReplica set), that
// replica until it is signalled: the helper is dispatched here and not as
// a test that skips itself in every ordinary run.
func TestMain(m *testing.M) {
	if slot := os.Getenv(envKillReplica); slot != "" {
		if err := runKillReplica(slot); err != nil {
			fmt.Fprintf(os.Stderr, "kill test replica %s: %v\n", slot, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// Test tokens (at least 16 characters, as LoadTokens demands).
const (
	agentToken    = "agent-token-0123456789"
	readerWS1     = "reader-ws1-0123456789"
	readerAll     = "reader-all-0123456789"
	readerWS2     = "reader-ws2-0123456789"
	tokensFileYML = `- {token: agent-token-0123456789, name: agent-a, role: agent, clusters: ["*"]}
- {token: reader-ws1-0123456789, name: reader-ws1, role: reader, workspaces: [ws1]}
- {token: reader-all-0123456789, name: reader-all, role: reader, workspaces: ["*"]}
- {token: reader-ws2-0123456789, name: reader-ws2, role: reader, workspaces: [ws2]}
`
)

func testLogger(testing.TB) *slog.Logger { return envLogger() }

// envLogger discards, unless COLLECTOR_TEST_LOG is set: then it writes
// debug lines to stderr.
func envLogger() *slog.Logger {
	if os.Getenv("COLLECTOR_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// testConfig is a collector on loopback port 0 with its store in dir, auth
// by tokens, and one file sink.
func testConfig(t testing.TB, dir string) Config {
	t.Helper()
	cfg, err := tokensConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// tokensConfig is testConfig for callers without a testing.TB (the kill
// test's replica processes).
func tokensConfig(dir string) (Config, error) {
	cfg := NewDefaultConfig()
	cfg.GRPC.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = 2 * time.Second
	cfg.Store.Dir = filepath.Join(dir, "log")
	tokens := filepath.Join(dir, "tokens.yaml")
	if _, err := os.Stat(tokens); err != nil {
		if err := os.WriteFile(tokens, []byte(tokensFileYML), 0o600); err != nil {
			return Config{}, err
		}
	}
	cfg.Auth.TokensFile = tokens
	return cfg, nil
}

type running struct {
	c      *Collector
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// stop ends Run (once) and returns its error.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(30 * time.Second):
			r.err = errors.New("collector did not stop within 30s")
		}
	})
	return r.err
}

func startCollector(t testing.TB, cfg Config, opts ...Option) *running {
	t.Helper()
	reg := prometheus.NewRegistry()
	c, err := New(cfg, testLogger(t), reg, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() {
		if err := r.stop(t); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// bearer is per-RPC credentials for plaintext test connections.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if b == "" {
		return nil, nil
	}
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

func dial(t testing.TB, addr, token string, extra ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearer(token)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
	}, extra...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// occ builds an occurrence; sandboxID "" makes it unattributed.
func occ(id, sandboxID, workspace, name, gateway string) *eventpipev1.Occurrence {
	now := timestamppb.New(time.Unix(1_790_000_000, 0))
	o := &eventpipev1.Occurrence{
		SchemaVersion: eventpipev1.SchemaVersion,
		EventId:       id,
		OccurredAt:    now,
		ObservedAt:    now,
		Namespace:     "openshell-openshell-" + workspace,
		Type:          "Normal",
		Reason:        "Pulling",
		Message:       "Pulling image \"ghcr.io/example/agent:1.2.3\"",
		Count:         1,
		Attribution:   eventpipev1.AttributionNone,
		Role:          eventpipev1.RoleNone,
	}
	if sandboxID != "" {
		o.Sandbox = &eventpipev1.Sandbox{Id: sandboxID, Name: name, Workspace: workspace, GatewayId: gateway}
		o.Attribution = eventpipev1.AttributionPodAnnotation
		o.Role = eventpipev1.RoleWorkload
	} else {
		o.Namespace = "kube-system"
	}
	return o
}

// ship sends batches on one stream and returns their acks in order.
func ship(t testing.TB, ctx context.Context, conn *grpc.ClientConn, batches ...*eventpipev1.Batch) ([]*eventpipev1.Ack, error) {
	t.Helper()
	st, err := eventpipev1.NewIngestClient(conn).Ship(ctx)
	if err != nil {
		return nil, err
	}
	errc := make(chan error, 1)
	go func() {
		for _, b := range batches {
			if err := st.Send(b); err != nil {
				errc <- err
				return
			}
		}
		errc <- st.CloseSend()
	}()
	var acks []*eventpipev1.Ack
	for {
		a, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			<-errc
			return acks, err
		}
		acks = append(acks, a)
	}
	if err := <-errc; err != nil && !errors.Is(err, io.EOF) {
		return acks, err
	}
	return acks, nil
}

// follow collects FollowResponses until the stream ends or n are received.
func follow(t testing.TB, ctx context.Context, conn *grpc.ClientConn, req *eventpipev1.FollowRequest, n int) ([]*eventpipev1.FollowResponse, error) {
	t.Helper()
	st, err := eventpipev1.NewFollowClient(conn).Follow(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []*eventpipev1.FollowResponse
	for n <= 0 || len(out) < n {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
	return out, nil
}

func ids(rs []*eventpipev1.FollowResponse) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.GetOccurrence().GetEventId())
	}
	return strings.Join(s, ",")
}

func counterValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

func batch(seq uint64, cluster, rv string, occs ...*eventpipev1.Occurrence) *eventpipev1.Batch {
	return &eventpipev1.Batch{Seq: seq, Cluster: cluster, Stream: DefaultStream, ResourceVersion: rv, Occurrences: occs}
}

func seqIDs(prefix string, from, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, from+i)
	}
	return out
}

func fileSink(name, path string) SinkConfig {
	fc := file.NewDefaultConfig()
	fc.Path = path
	d := sinks.NewDefaultRunnerConfig(name)
	d.Batch.MaxWait = 20 * time.Millisecond
	return SinkConfig{Name: name, Type: SinkFile, File: &fc, Batch: d.Batch, Retry: d.Retry}
}
