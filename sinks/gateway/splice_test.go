package gateway

import (
	"context"

	"fmt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"strings"
	"sync"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

// watcher reads one WatchSandboxes stream in the background.
type watcher struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	platform  []gatewaytest.WatchEvent
	snapshots map[string]gatewaytest.Sandbox
	nsnap     int
	err       error
}

func watch(t testing.TB, c *gatewaytest.Client) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.Watch(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	wt := &watcher{cancel: cancel, done: make(chan struct{}), snapshots: map[string]gatewaytest.Sandbox{}}
	go func() {
		defer close(wt.done)
		for {
			ev, err := w.Recv()
			wt.mu.Lock()
			if err != nil {
				wt.err = err
				wt.mu.Unlock()
				if ctx.Err() == nil && status.Code(err) != codes.Unavailable {
					t.Errorf("watch stream: %v", err)
				}
				return
			}
			switch {
			case ev.Platform != nil:
				wt.platform = append(wt.platform, ev)
			case ev.Sandbox != nil:
				wt.snapshots[ev.Sandbox.ID] = *ev.Sandbox
				wt.nsnap++
			}
			wt.mu.Unlock()
		}
	}()
	t.Cleanup(wt.close)
	return wt
}

func (w *watcher) close() {
	w.cancel()
	<-w.done
}

// ours are the platform events eventpipe spliced (they carry an event id).
func (w *watcher) ours() []gatewaytest.WatchEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []gatewaytest.WatchEvent
	for _, e := range w.platform {
		if e.Platform.Metadata[KeyEventID] != "" {
			out = append(out, e)
		}
	}
	return out
}

func (w *watcher) all() []gatewaytest.WatchEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]gatewaytest.WatchEvent(nil), w.platform...)
}

func (w *watcher) snapshot(id string) (gatewaytest.Sandbox, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.snapshots[id], w.nsnap
}

// noDuplicates fails when an event id reached this stream twice.
func noDuplicates(t testing.TB, what string, evs []gatewaytest.WatchEvent) {
	t.Helper()
	seen := map[string]int{}
	for _, e := range evs {
		seen[e.Platform.Metadata[KeyEventID]]++
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("%s: event %s delivered %d times to one stream", what, id, n)
		}
	}
}

func eventIDs(evs []gatewaytest.WatchEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Platform.Metadata[KeyEventID])
	}
	return out
}

func getSandbox(t testing.TB, c *gatewaytest.Client, id string) gatewaytest.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Unary(ctx, gatewaytest.MethodGet, reqWithUnknown(id))
	if err != nil {
		t.Fatalf("GetSandbox: %v", err)
	}
	sbs, err := gatewaytest.DecodeSandboxes(resp.Bodies[0])
	if err != nil || len(sbs) != 1 {
		t.Fatalf("GetSandbox answer: %v, %d sandboxes", err, len(sbs))
	}
	return sbs[0]
}

func listSandbox(t testing.TB, c *gatewaytest.Client, id string) gatewaytest.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Unary(ctx, gatewaytest.MethodList, nil)
	if err != nil {
		t.Fatalf("ListSandboxes: %v", err)
	}
	sbs, err := gatewaytest.DecodeSandboxes(resp.Bodies[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sbs {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("ListSandboxes has no %s", id)
	return gatewaytest.Sandbox{}
}

// checkFailing checks the ImagePulled condition and the Ready suffix.
func checkFailing(t testing.TB, where string, s gatewaytest.Sandbox, want bool) {
	t.Helper()
	c, has := s.Condition(ConditionImage)
	ready, _ := s.Condition("Ready")
	if ready.Reason != "DependenciesNotReady" || ready.Status != "False" {
		t.Errorf("%s: Ready changed: %+v", where, ready)
	}
	if !want {
		if has {
			t.Errorf("%s: ImagePulled still present: %+v", where, c)
		}
		if strings.Contains(ready.Message, readySuffixPrefix) {
			t.Errorf("%s: Ready message still has the diagnosis: %q", where, ready.Message)
		}
		return
	}
	if !has {
		t.Fatalf("%s: no ImagePulled condition in %+v", where, s.Conditions)
	}
	if c.Status != "False" || c.Reason != "NotFound" {
		t.Errorf("%s: ImagePulled %s/%s, want False/NotFound", where, c.Status, c.Reason)
	}
	for _, w := range []string{"workload image docker.io/library/busybox:0.0.0-does-not-exist", "persistent: retrying will not fix it", "attempts", "not found"} {
		if !strings.Contains(c.Message, w) {
			t.Errorf("%s: ImagePulled message %q lacks %q", where, c.Message, w)
		}
	}
	if !strings.HasPrefix(ready.Message, "Pod exists with phase: Pending") || !strings.Contains(ready.Message, readySuffixPrefix+c.Message) {
		t.Errorf("%s: Ready message %q, want the driver's message with the diagnosis appended", where, ready.Message)
	}
}

// TestSpliceConditionsAndDedupe runs test driver -> proxy -> gateway
// client with a real collector: eventpipe's events arrive once each with
// their keys, the driver's own kubernetes events do not, the condition is
// on Watch, Get and List while the failure is active and gone after the
// agent's Pulled; a stream reopened on the same connection gets nothing
// twice, a new connection gets the tail.
func TestSpliceConditionsAndDedupe(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	const id = "7f7c2c8e-4a9b-4c1e-9e57-1f0b3a9d2c11"
	drv.Put(testSandbox(id, "img"))
	col := startCollector(t, dir, "")
	rp := startProxy(t, proxyConfig(dir, drv.Path, col.addr))
	gw := dialT(t, rp.p.cfg.Listen)
	w1 := watch(t, gw)
	waitFor(t, 10*time.Second, "proxy following the collector", func() (bool, string) {
		return rp.metric(t, "eventpipe_driver_proxy_follow_connected") == 1, ""
	})

	pulling := occurrence(id, "Pulling", "workspace-init", `Pulling image "docker.io/library/busybox:0.0.0-does-not-exist"`)
	failed := pullFailed(id, 2)
	col.ship(t, pulling, failed)
	// The driver's own events go only to a stream it already has.
	if err := drv.WaitWatchers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	drv.Platform(id, gatewaytest.PlatformEvent{TimestampMS: 5, Source: "kubernetes", Type: "Normal", Reason: "Pulling", Message: "the driver's own",
		Metadata: map[string]string{"openshell.progress.active_step": "pulling_image"}})
	drv.Platform(id, gatewaytest.PlatformEvent{TimestampMS: 6, Source: "gateway", Type: "Normal", Reason: "Other", Message: "not kubernetes"})
	waitFor(t, 10*time.Second, "two spliced events and the driver's non-kubernetes one", func() (bool, string) {
		return len(w1.ours()) == 2 && len(w1.all()) == 3, fmt.Sprint(eventIDs(w1.all()))
	})
	for _, e := range w1.all() {
		if e.Platform.Message == "the driver's own" {
			t.Errorf("the driver's kubernetes event was not dropped")
		}
	}
	ev := w1.ours()[1]
	md := ev.Platform.Metadata
	want := map[string]string{KeyInvolvedKind: "Pod", KeyInvolvedName: "repro--img", KeyNamespace: "openshell", KeyCount: "1",
		KeyContainer: "workspace-init", KeyImage: failed.Image, KeyImageRole: "workload", KeyPullCause: "not_found",
		KeyDisposition: "persistent", KeyAttempts: "2", KeyEventID: failed.EventId}
	for k, v := range want {
		if md[k] != v {
			t.Errorf("metadata %s = %q, want %q", k, md[k], v)
		}
	}
	if ev.PlatformSandboxID != id || ev.Platform.Source != "kubernetes" || ev.Platform.Reason != "Failed" || ev.Platform.Type != "Warning" || ev.Platform.Message != failed.Message {
		t.Errorf("platform event %+v of %s", ev.Platform, ev.PlatformSandboxID)
	}
	if got := ev.Platform.TimestampMS; got != failed.OccurredAt.AsTime().UnixMilli() {
		t.Errorf("timestamp_ms %d, want %d", got, failed.OccurredAt.AsTime().UnixMilli())
	}

	checkFailing(t, "GetSandbox", getSandbox(t, gw, id), true)
	checkFailing(t, "ListSandboxes", listSandbox(t, gw, id), true)
	_, n := w1.snapshot(id)
	drv.Put(testSandbox(id, "img"))
	waitFor(t, 5*time.Second, "a new snapshot", func() (bool, string) { _, m := w1.snapshot(id); return m > n, "" })
	s, _ := w1.snapshot(id)
	checkFailing(t, "WatchSandboxes snapshot", s, true)

	// Gateway stream restart on the same connection: nothing twice.
	w1.close()
	failed2 := pullFailed(id, 3)
	col.ship(t, failed2)
	w2 := watch(t, gw)
	waitFor(t, 10*time.Second, "the event missed between streams", func() (bool, string) {
		return len(w2.ours()) >= 1, fmt.Sprint(eventIDs(w2.ours()))
	})
	pulled := pulledAgent(id)
	col.ship(t, pulled)
	waitFor(t, 10*time.Second, "Pulled on the reopened stream", func() (bool, string) {
		return len(w2.ours()) == 2, fmt.Sprint(eventIDs(w2.ours()))
	})
	if got := eventIDs(w2.ours()); got[0] != failed2.EventId || got[1] != pulled.EventId {
		t.Errorf("reopened stream got %v, want only [%s %s]", got, failed2.EventId, pulled.EventId)
	}
	if md := w2.ours()[1].Platform.Metadata; md[KeyCompleteStep] != "pulling_image" || md[KeyCompleteLabel] != "Image pulled" || md[KeyActiveStep] != "starting_sandbox" {
		t.Errorf("Pulled progress keys: %v", md)
	}

	// After the agent's Pulled the condition is gone everywhere.
	checkFailing(t, "GetSandbox after Pulled", getSandbox(t, gw, id), false)
	checkFailing(t, "ListSandboxes after Pulled", listSandbox(t, gw, id), false)
	_, n = w2.snapshot(id)
	drv.Put(testSandbox(id, "img"))
	waitFor(t, 5*time.Second, "a new snapshot", func() (bool, string) { _, m := w2.snapshot(id); return m > n, "" })
	s, _ = w2.snapshot(id)
	checkFailing(t, "WatchSandboxes snapshot after Pulled", s, false)

	// A new connection (a restarted gateway) gets the tail, in order.
	gw2 := dialT(t, rp.p.cfg.Listen)
	w3 := watch(t, gw2)
	wantTail := []string{pulling.EventId, failed.EventId, failed2.EventId, pulled.EventId}
	waitFor(t, 10*time.Second, "the tail on a new connection", func() (bool, string) {
		return len(w3.ours()) == len(wantTail), fmt.Sprint(eventIDs(w3.ours()))
	})
	if got := fmt.Sprint(eventIDs(w3.ours())); got != fmt.Sprint(wantTail) {
		t.Errorf("tail %s, want %v", got, wantTail)
	}
	// The same occurrence stored twice by the collector (at-least-once
	// ingest from a restarted agent) is not sent twice.
	col.ship(t, pulled)
	time.Sleep(300 * time.Millisecond)
	noDuplicates(t, "stream 2", w2.ours())
	noDuplicates(t, "stream 3", w3.ours())
	if n := rp.metric(t, "eventpipe_driver_proxy_driver_kubernetes_events_dropped_total"); n < 1 {
		t.Errorf("dropped driver events = %v", n)
	}
}

// TestBurstDeliveredOnce: a burst of events for many sandboxes is
// delivered completely and once each.
func TestBurstDeliveredOnce(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	col := startCollector(t, dir, "")
	cfg := proxyConfig(dir, drv.Path, col.addr)
	rp := startProxy(t, cfg)
	w := watch(t, dialT(t, cfg.Listen))
	waitFor(t, 10*time.Second, "proxy following the collector", func() (bool, string) {
		return rp.metric(t, "eventpipe_driver_proxy_follow_connected") == 1, ""
	})
	var occs []*eventpipev1.Occurrence
	for s := range 40 {
		for range 5 {
			occs = append(occs, pullFailed(fmt.Sprintf("3c4d5e6f-7a8b-4c9d-8e0f-%012d", s), 1))
		}
	}
	col.ship(t, occs...)
	waitFor(t, 20*time.Second, "all 200 events", func() (bool, string) {
		return len(w.ours()) >= len(occs), fmt.Sprint(len(w.ours()))
	})
	time.Sleep(200 * time.Millisecond)
	noDuplicates(t, "burst", w.ours())
	if got := len(w.ours()); got != len(occs) {
		t.Errorf("%d events, want %d", got, len(occs))
	}
	if n := rp.metric(t, "eventpipe_driver_proxy_stream_overflows_total"); n != 0 {
		t.Errorf("stream_overflows_total = %v with a log of %d", n, cfg.Follow.MaxEvents)
	}
}
