package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
)

// testCollector is a real collector (durable store, Follow, Ingest) on
// loopback; restart keeps its directory and its address.
type testCollector struct {
	dir    string
	addr   string
	tokens string // a tokens file: authentication on (Ingest uses agentToken)
	c      *collector.Collector
	cancel context.CancelFunc
	done   chan error
	once   *sync.Once
	seq    uint64
}

func startCollector(t testing.TB, dir, addr string) *testCollector {
	t.Helper()
	tc := &testCollector{dir: dir, addr: addr}
	tc.start(t)
	t.Cleanup(func() { tc.stop(t) })
	return tc
}

func (tc *testCollector) start(t testing.TB) {
	t.Helper()
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen = tc.addr
	if cfg.GRPC.Listen == "" {
		cfg.GRPC.Listen = "127.0.0.1:0"
	}
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = time.Second
	cfg.Auth.Insecure = tc.tokens == ""
	cfg.Auth.TokensFile = tc.tokens
	cfg.Store.Dir = filepath.Join(tc.dir, "log")
	var c *collector.Collector
	var err error
	for range 50 { // the old listener's port may take a moment to free
		if c, err = collector.New(cfg, nil, prometheus.NewRegistry()); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("collector.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tc.c, tc.cancel, tc.done, tc.once = c, cancel, make(chan error, 1), &sync.Once{}
	go func() { tc.done <- c.Run(ctx) }()
	tc.addr = c.GRPCAddr()
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

func (tc *testCollector) restart(t testing.TB) {
	t.Helper()
	tc.stop(t)
	tc.start(t)
}

// ship stores occurrences through the collector's Ingest stream (as the
// agent does) and waits for the ack.
func (tc *testCollector) ship(t testing.TB, occs ...*eventpipev1.Occurrence) {
	t.Helper()
	conn, err := grpc.NewClient(tc.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if tc.tokens != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+agentToken)
	}
	defer cancel()
	st, err := eventpipev1.NewIngestClient(conn).Ship(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc.seq++
	if err := st.Send(&eventpipev1.Batch{Seq: tc.seq, Cluster: "test", Stream: collector.DefaultStream,
		ResourceVersion: fmt.Sprint(tc.seq), Occurrences: occs}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatalf("ship: %v", err)
	}
	_ = st.CloseSend()
	for {
		if _, err := st.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Logf("ship close: %v", err)
			}
			return
		}
	}
}

// Tokens of the authenticated test collector.
const (
	agentToken     = "agent-token-0123456789"
	readerToken    = "reader-repro-0123456789"
	tokensFileYAML = `- {token: agent-token-0123456789, name: agent, role: agent, clusters: ["*"]}
- {token: reader-repro-0123456789, name: gateway-proxy, role: reader, workspaces: [repro]}
`
)

var occSeq int

// occurrence builds an attributed occurrence of the workload pod.
func occurrence(sandboxID, reason, container, message string) *eventpipev1.Occurrence {
	occSeq++
	now := time.Now()
	return &eventpipev1.Occurrence{
		SchemaVersion:      eventpipev1.SchemaVersion,
		EventId:            fmt.Sprintf("uid-%d/%d", occSeq, occSeq),
		OccurredAt:         timestamppb.New(now),
		ObservedAt:         timestamppb.New(now),
		Namespace:          "openshell",
		Event:              &eventpipev1.EventRef{Name: fmt.Sprintf("repro--img.%x", occSeq), Uid: fmt.Sprintf("uid-%d", occSeq), ResourceVersion: fmt.Sprint(occSeq), ApiVersion: "v1"},
		InvolvedObject:     &eventpipev1.ObjectRef{Kind: "Pod", Namespace: "openshell", Name: "repro--img", FieldPath: "spec.initContainers{" + container + "}"},
		Type:               "Normal",
		Reason:             reason,
		Message:            message,
		Count:              1,
		ReportingComponent: "kubelet",
		Sandbox:            &eventpipev1.Sandbox{Id: sandboxID, Name: "img", Workspace: "repro", GatewayId: "openshell", CrNamespace: "openshell", CrName: "repro--img"},
		Attribution:        eventpipev1.AttributionPodAnnotation,
		Role:               eventpipev1.RoleWorkload,
		Container:          container,
		Image:              "docker.io/library/busybox:0.0.0-does-not-exist",
		ImageRole:          eventpipev1.ImageRoleWorkload,
	}
}

func pullFailed(sandboxID string, attempts uint32) *eventpipev1.Occurrence {
	o := occurrence(sandboxID, "Failed", "workspace-init",
		`Failed to pull image "docker.io/library/busybox:0.0.0-does-not-exist": rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": not found`)
	o.Type = "Warning"
	o.PullFailure = &eventpipev1.PullFailure{Category: eventpipev1.CategoryNotFound, Image: o.Image,
		Disposition: eventpipev1.DispositionPersistent, Attempts: attempts, FirstSeen: o.OccurredAt, LastSeen: o.OccurredAt,
		Detail: "docker.io/library/busybox:0.0.0-does-not-exist: not found", Source: eventpipev1.PullSourceEvent}
	return o
}

func pulledAgent(sandboxID string) *eventpipev1.Occurrence {
	o := occurrence(sandboxID, "Pulled", "agent", `Successfully pulled image "docker.io/library/busybox:1.36"`)
	o.InvolvedObject.FieldPath = "spec.containers{agent}"
	o.Image = "docker.io/library/busybox:1.36"
	o.Progress = &eventpipev1.Progress{CompleteStep: eventpipev1.StepPullingImage, CompleteLabel: "Image pulled", ActiveStep: eventpipev1.StepStartingSandbox}
	return o
}
