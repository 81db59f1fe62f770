package diagnosis

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
)

const (
	agentToken  = "agent-token-0123456789"
	readerRepro = "reader-repro-0123456789"
	readerOther = "reader-other-0123456789"
)

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// startCollector runs a real collector on loopback (tokens auth, durable log
// in a temp dir) until the test ends, and returns its gRPC address.
func startCollector(t *testing.T) string {
	t.Helper()
	addr, _ := startCollectorAt(t, t.TempDir(), "127.0.0.1:0")
	return addr
}

// startCollectorAt runs a collector with its state in dir on listen; stop
// ends it (also run at the end of the test).
func startCollectorAt(t *testing.T, dir, listen string) (addr string, stop func()) {
	t.Helper()
	tokens := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokens, []byte(`- {token: `+agentToken+`, name: agent, role: agent, clusters: [test]}
- {token: `+readerRepro+`, name: reader-repro, role: reader, workspaces: [repro]}
- {token: `+readerOther+`, name: reader-other, role: reader, workspaces: [other]}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen, cfg.HTTP.Listen = listen, "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = 2 * time.Second
	cfg.Store.Dir = filepath.Join(dir, "log")
	cfg.Auth.TokensFile = tokens
	c, err := collector.New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("collector.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("collector Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return c.GRPCAddr(), stop
}

func dial(t *testing.T, addr, token string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(token)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// ship sends occurrences to the collector's Ingest as the agent does and
// waits for the acknowledgement.
func ship(t *testing.T, ctx context.Context, addr string, seq uint64, os ...[]*eventpipev1.Occurrence) {
	t.Helper()
	var all []*eventpipev1.Occurrence
	for _, b := range os {
		all = append(all, b...)
	}
	stream, err := eventpipev1.NewIngestClient(dial(t, addr, agentToken)).Ship(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&eventpipev1.Batch{Seq: seq, Cluster: "test", Stream: "events", Occurrences: all}); err != nil {
		t.Fatal(err)
	}
	ack, err := stream.Recv()
	if err != nil {
		t.Fatalf("ship: %v", err)
	}
	if ack.GetStored() != uint32(len(all)) {
		t.Fatalf("ship: stored %d of %d", ack.GetStored(), len(all))
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
}

// The seed scenarios go through a real collector (durable log, auth,
// Follow) and come back as the right diagnoses, by id, by workspace and
// name, and across the gateway; a reader of another workspace sees none.
func TestReadFromCollector(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addr := startCollector(t)
	imgMissing := newSandbox(10, "img-missing", imageMissing, supervisorGood)
	supBad := newSandbox(11, "sup-bad", workloadImage, supervisorBad)
	healthy := newSandbox(12, "healthy", workloadImage, supervisorGood)
	fx := newFixture(t, imgMissing, supBad, healthy)
	var batch [][]*eventpipev1.Occurrence
	batch = append(batch, fx.start(healthy, true, "supervisor", supervisorGood), fx.start(healthy, false, "agent", workloadImage),
		fx.start(imgMissing, true, "supervisor", supervisorGood), fx.start(supBad, false, "agent", workloadImage))
	for n := int32(1); n <= 3; n++ {
		batch = append(batch, fx.pullFailure(imgMissing, false, "workspace-init", imageMissing, n),
			fx.pullFailure(supBad, true, "supervisor", supervisorBad, n))
	}
	ship(t, ctx, addr, 1, batch...)

	client := eventpipev1.NewFollowClient(dial(t, addr, readerRepro))
	f, info, err := Read(ctx, client, &eventpipev1.FollowRequest{GatewayId: gatewayID, Tail: 1000})
	if err != nil {
		t.Fatalf("Read gateway: %v", err)
	}
	if f.Len() != 3 || info.LostRecords != 0 || info.LastCursor == 0 || info.Read == 0 {
		t.Fatalf("gateway read: %d sandboxes, info %+v", f.Len(), info)
	}
	check := func(d Diagnosis, role, image string) {
		t.Helper()
		if len(d.Blockers) != 1 {
			t.Fatalf("%s: blockers %+v", d.Name, d.Blockers)
		}
		b := d.Blockers[0]
		if b.ImageRole != role || b.Image != image || b.Cause != eventpipev1.CategoryNotFound ||
			b.Disposition != eventpipev1.DispositionPersistent || b.Attempts < 3 {
			t.Errorf("%s: blocker %+v", d.Name, b)
		}
	}
	im, _ := f.Sandbox(imgMissing.id)
	check(im, eventpipev1.ImageRoleWorkload, imageMissing)
	sb, _ := f.Sandbox(supBad.id)
	check(sb, eventpipev1.ImageRoleSupervisor, supervisorBad)
	if h, _ := f.Sandbox(healthy.id); h.State != StateClear {
		t.Errorf("healthy: %+v", h)
	}
	if g := Supervisor(f.Sandboxes()); len(g) != 1 || g[0].Image != supervisorBad || len(g[0].Sandboxes) != 1 {
		t.Errorf("supervisor groups: %+v", g)
	}

	// By id and by workspace + name: the same diagnosis.
	for _, req := range []*eventpipev1.FollowRequest{{SandboxId: supBad.id, Tail: 1000}, {Workspace: workspace, SandboxName: "sup-bad", Tail: 1000}} {
		f1, _, err := Read(ctx, client, req)
		if err != nil {
			t.Fatalf("Read %v: %v", req, err)
		}
		if f1.Len() != 1 {
			t.Fatalf("Read %v: %d sandboxes", req, f1.Len())
		}
		d, _ := f1.Sandbox(supBad.id)
		check(d, eventpipev1.ImageRoleSupervisor, supervisorBad)
	}

	// Another workspace's reader: refused for the workspace, nothing via the gateway.
	other := eventpipev1.NewFollowClient(dial(t, addr, readerOther))
	if _, _, err := Read(ctx, other, &eventpipev1.FollowRequest{Workspace: workspace, Tail: 10}); status.Code(err) != codes.PermissionDenied || !Refused(err) {
		t.Errorf("reader of another workspace: err %v, want PermissionDenied", err)
	}
	if f2, _, err := Read(ctx, other, &eventpipev1.FollowRequest{GatewayId: gatewayID, Tail: 1000}); err != nil || f2.Len() != 0 {
		t.Errorf("reader of another workspace via the gateway: %d sandboxes, err %v", f2.Len(), err)
	}
	bad := eventpipev1.NewFollowClient(dial(t, addr, "not-a-token-0123456789"))
	if _, _, err := Read(ctx, bad, &eventpipev1.FollowRequest{GatewayId: gatewayID}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("bad token: err %v, want Unauthenticated", err)
	}
}

// The Watcher shows a failure as it happens, its turn to persistent, and
// its end when the image is pulled; a refused selection ends Run.
func TestWatcherLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addr := startCollector(t)
	s := newSandbox(13, "img-missing", imageMissing, supervisorGood)
	fx := newFixture(t, s)
	ship(t, ctx, addr, 1, fx.start(s, true, "supervisor", supervisorGood))

	w, err := NewWatcher(eventpipev1.NewFollowClient(dial(t, addr, readerRepro)),
		&eventpipev1.FollowRequest{Workspace: workspace, Tail: 100}, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		wcancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitFor := func(what string, ok func(Diagnosis) bool) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			for _, d := range w.Sandboxes() {
				if d.ID == s.id && ok(d) {
					return
				}
			}
			select {
			case <-w.Changed():
			case <-time.After(200 * time.Millisecond):
			case <-deadline:
				t.Fatalf("timed out waiting for %s; have %+v (status %+v)", what, w.Sandboxes(), w.Status())
			}
		}
	}
	waitFor("the replayed sandbox, clear", func(d Diagnosis) bool { return d.State == StateClear })
	ship(t, ctx, addr, 2, fx.pullFailure(s, false, "workspace-init", imageMissing, 1))
	waitFor("a retrying workload failure", func(d Diagnosis) bool {
		return d.Blocked() && d.Blockers[0].Disposition == eventpipev1.DispositionRetrying && d.Blockers[0].ImageRole == eventpipev1.ImageRoleWorkload
	})
	ship(t, ctx, addr, 3, fx.pullFailure(s, false, "workspace-init", imageMissing, 2), fx.pullFailure(s, false, "workspace-init", imageMissing, 3))
	waitFor("persistent", func(d Diagnosis) bool {
		return d.Blocked() && d.Blockers[0].Disposition == eventpipev1.DispositionPersistent
	})
	ship(t, ctx, addr, 4, fx.start(s, false, "workspace-init", imageMissing))
	waitFor("cleared by Pulled", func(d Diagnosis) bool { return d.State == StateClear })
	if st := w.Status(); !st.Connected || st.Cursor == 0 {
		t.Errorf("status %+v", st)
	}

	// A selection the token may not read ends Run with the refusal.
	w2, _ := NewWatcher(eventpipev1.NewFollowClient(dial(t, addr, readerOther)), &eventpipev1.FollowRequest{Workspace: workspace}, WatchOptions{})
	if err := w2.Run(ctx); status.Code(err) != codes.PermissionDenied {
		t.Errorf("refused watcher: Run = %v, want PermissionDenied", err)
	}
}

// A collector restart breaks the stream: the Watcher resubscribes after its
// last cursor and keeps the diagnosis current, with no event folded twice.
func TestWatcherResumesAfterCollectorRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	addr, stop := startCollectorAt(t, dir, "127.0.0.1:0")
	s := newSandbox(14, "img-missing", imageMissing, supervisorGood)
	fx := newFixture(t, s)
	ship(t, ctx, addr, 1, fx.pullFailure(s, false, "workspace-init", imageMissing, 1))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(readerRepro)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w, _ := NewWatcher(eventpipev1.NewFollowClient(conn), &eventpipev1.FollowRequest{Workspace: workspace, Tail: 100},
		WatchOptions{BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		wcancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	until := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (status %+v, sandboxes %+v)", what, w.Status(), w.Sandboxes())
			}
		}
	}
	occurrences := func() int {
		for _, d := range w.Sandboxes() {
			return d.Occurrences
		}
		return 0
	}
	until("the replay", func() bool { return occurrences() == 5 && w.Status().Connected })
	stop()
	until("the broken stream", func() bool { return !w.Status().Connected })
	addr2, _ := startCollectorAt(t, dir, addr) // same log, same address
	if addr2 != addr {
		t.Fatalf("restarted on %s, want %s", addr2, addr)
	}
	ship(t, ctx, addr, 2, fx.pullFailure(s, false, "workspace-init", imageMissing, 2), fx.pullFailure(s, false, "workspace-init", imageMissing, 3))
	until("the events after the restart", func() bool { return occurrences() >= 15 })
	time.Sleep(300 * time.Millisecond)
	if n := occurrences(); n != 15 {
		t.Errorf("%d occurrences folded, want 15 (5 before the restart, 10 after): some were replayed twice", n)
	}
	if st := w.Status(); st.Reconnects == 0 || !st.Connected {
		t.Errorf("status %+v", st)
	}
	d := w.Sandboxes()[0]
	if !d.Blocked() || d.Blockers[0].Disposition != eventpipev1.DispositionPersistent {
		t.Errorf("after the restart: %+v", d)
	}
}
