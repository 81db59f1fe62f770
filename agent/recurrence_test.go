package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRecurrences: 200 Events each bumped 5 times are 1,200 occurrences; a
// label-only update of each (a no-op for the schema) and the 30-minute
// series heartbeat of events.k8s.io Events (series.lastObservedTime moves,
// count does not) are not occurrences. An Event about a pod that never
// appears is held, then shipped unattributed (never dropped).
func TestRecurrences(t *testing.T) {
	dir := t.TempDir()
	col := startCollector(t, dir)
	cfg := testConfig("recur", col.addr())
	cfg.Hold.MaxAge = 2 * time.Second
	ra := startAgent(t, cfg)
	waitFor(t, 60*time.Second, "agent synced", func() (bool, string) { return ra.a.synced.Load(), "" })
	g := newLoadGen(t, "load-recur")
	ctx := context.Background()
	ev := g.cs.CoreV1().Events(g.ns)
	for i := 0; i < 200; i++ {
		if err := g.create(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	list, err := ev.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		cur := e
		for b := 0; b < 5; b++ {
			cur.Count++
			cur.LastTimestamp = metav1.Now()
			out, err := ev.Update(ctx, &cur, metav1.UpdateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			g.mu.Lock()
			g.ids[string(out.UID)+"/"+out.ResourceVersion] = true
			g.mu.Unlock()
			cur = *out
		}
		// A label-only update: new resourceVersion, same count and message.
		cur.Labels = map[string]string{"touched": "yes"}
		if _, err := ev.Update(ctx, &cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// events.k8s.io series with a heartbeat.
	e1 := g.cs.EventsV1().Events(g.ns)
	for i := 0; i < 10; i++ {
		now := metav1.NowMicro()
		se := &eventsv1.Event{
			ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("series-%d.%x", i, now.UnixNano()), Namespace: g.ns},
			EventTime:           now,
			Series:              &eventsv1.EventSeries{Count: 2, LastObservedTime: now},
			ReportingController: "agent-sandbox-controller", ReportingInstance: "ctrl-0", Action: "Sync", Reason: "Synced",
			Regarding: corev1.ObjectReference{Kind: "Sandbox", APIVersion: "agents.x-k8s.io/v1beta1", Namespace: g.ns, Name: "sb"},
			Note:      "synced", Type: corev1.EventTypeNormal,
		}
		out, err := e1.Create(ctx, se, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		g.mu.Lock()
		g.ids[string(out.UID)+"/"+out.ResourceVersion] = true
		g.mu.Unlock()
		out.Series.LastObservedTime = metav1.NewMicroTime(time.Now().Add(time.Second))
		if _, err := e1.Update(ctx, out, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	checkDelivered(t, col, g, 60*time.Second)
	n := 0
	for _, o := range col.all(t) {
		if o.GetNamespace() == g.ns {
			n++
		}
	}
	if n != 1210 {
		t.Errorf("%d occurrences stored, want 1,200 (200 Events x (1 + 5 bumps)) + 10 series Events", n)
	}
	if s := counter(t, ra.reg, "eventpipe_agent_skipped_total", map[string]string{"reason": "unchanged"}); s != 210 {
		t.Errorf("skipped unchanged = %v, want 210 (200 label-only updates + 10 heartbeats)", s)
	}
	// The Events about pods that never exist were held, then shipped unattributed.
	if x := counter(t, ra.reg, "eventpipe_agent_hold_expired_total", nil); x < 1 {
		t.Errorf("hold_expired_total = %v, want >= 1", x)
	}
	for _, o := range col.all(t) {
		if o.GetNamespace() == g.ns && o.GetSandbox() != nil {
			t.Fatalf("occurrence about a pod that never existed is attributed: %v", o)
		}
	}
}

// TestListFallback: with watch-list off the agent lists Events page by page
// (the fallback for API servers that refuse sendInitialEvents), then watches
// from the listing's resourceVersion.
func TestListFallback(t *testing.T) {
	dir := t.TempDir()
	col := startCollector(t, dir)
	g := newLoadGen(t, "load-listfallback")
	ctx := context.Background()
	for i := 0; i < 300; i++ {
		if err := g.create(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig("listfallback", col.addr())
	cfg.Watch.WatchList = false
	cfg.Watch.ListPageSize = 100
	cfg.Hold.MaxEvents = 0 // the load's pods do not exist; ship at once
	ra := startAgent(t, cfg)
	checkDelivered(t, col, g, 60*time.Second)
	// And the watch that follows the listing delivers new Events.
	for i := 300; i < 350; i++ {
		if err := g.create(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	checkDelivered(t, col, g, 60*time.Second)
	if n := counter(t, ra.reg, "eventpipe_agent_relists_total", map[string]string{"method": "list"}); n != 1 {
		t.Errorf("relists{method=list} = %v, want 1", n)
	}
	if n := counter(t, ra.reg, "eventpipe_agent_relists_total", map[string]string{"method": "watchlist"}); n != 0 {
		t.Errorf("relists{method=watchlist} = %v, want 0", n)
	}
	if n := counter(t, ra.reg, "eventpipe_agent_api_requests_total", map[string]string{"verb": "list", "resource": "events"}); n < 3 {
		t.Errorf("LIST events requests = %v, want >= 3 pages of 100", n)
	}
}
