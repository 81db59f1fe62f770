package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/eventpipe/eventpipe/testenv/kube"
)

// TestAPICalls counts the agent's requests (its counting transport, and the
// apiserver's own apiserver_request_total as a cross-check): one listing per
// kind at start, then watches only, zero LISTs and zero GETs of Events in a
// steady phase in which the Event watch is re-established many times (the
// watch timeout is shortened so 15 s see as many re-watches as an hour with
// the defaults).
func TestAPICalls(t *testing.T) {
	dir := t.TempDir()
	col := startCollector(t, dir)
	cfg := testConfig("apicalls", col.addr())
	cfg.Watch.MinWatchTimeout = time.Second
	ra := startAgent(t, cfg)
	waitFor(t, 60*time.Second, "agent synced", func() (bool, string) { return ra.a.synced.Load() && ra.a.Ready() == nil, "" })
	waitFor(t, 30*time.Second, "initial listing done", func() (bool, string) {
		return ra.a.AckedResourceVersion() != "", "no cursor acked yet"
	})

	req := func(verb, resource string) float64 {
		return counter(t, ra.reg, "eventpipe_agent_api_requests_total", map[string]string{"verb": verb, "resource": resource})
	}
	// client-go's informers list either with one LIST then a WATCH, or (the
	// WatchListClient default of current client-go against an apiserver that
	// serves it) with one watch-list request: one listing per kind either way.
	for _, r := range []string{"pods", "persistentvolumeclaims", "namespaces", "sandboxes"} {
		l, w := req("list", r), req("watch", r)
		if !(l == 1 && w <= 1 || l == 0 && w == 1) {
			t.Errorf("%s at start: %v LIST and %v WATCH requests, want one listing (1 LIST [+1 WATCH] or 1 watch-list)", r, l, w)
		}
		t.Logf("%s at start: %v LIST, %v WATCH", r, l, w)
	}
	listings := req("list", "events") + counter(t, ra.reg, "eventpipe_agent_relists_total", map[string]string{"method": "watchlist"})
	if listings != 1 {
		t.Errorf("Event listings at start: %v (LIST pages + watch-lists), want 1", listings)
	}
	t.Logf("start: LIST events %v, watch-lists %v", req("list", "events"),
		counter(t, ra.reg, "eventpipe_agent_relists_total", map[string]string{"method": "watchlist"}))

	ctx := context.Background()
	before := map[string]float64{}
	apiBefore := map[string]float64{}
	kinds := []string{"events", "pods", "persistentvolumeclaims", "namespaces", "sandboxes"}
	for _, r := range kinds {
		before[r] = req("list", r)
		n, err := cluster.APIRequestCount(ctx, kube.RequestFilter{Resource: r, Verb: "LIST"})
		if err != nil {
			t.Fatal(err)
		}
		apiBefore[r] = n
	}
	watchesBefore := req("watch", "events")
	relistsBefore := counter(t, ra.reg, "eventpipe_agent_relists_total", nil)
	// What the apiserver sent on Event watches, and its watch-lists of
	// Events: a re-watch that turned into a full relist would show in both.
	apiMetric := func(name string) float64 {
		v, found, err := cluster.MetricSum(ctx, name, map[string]string{"resource": "events"})
		if err != nil {
			t.Fatal(err)
		}
		if !found {
			t.Fatalf("kube-apiserver does not export %s: the steady phase cannot be checked", name)
		}
		return v
	}
	sentBefore := apiMetric("apiserver_watch_events_total")
	watchListsBefore := apiMetric("apiserver_watch_list_duration_seconds_count")

	// Steady phase: Events and pod churn for 15 s.
	g := newLoadGen(t, "load-apicalls")
	end := time.Now().Add(15 * time.Second)
	i := 0
	for time.Now().Before(end) {
		if err := g.create(ctx, i); err != nil {
			t.Fatal(err)
		}
		if i%20 == 0 {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("churn-%d", i), Namespace: g.ns},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "example.com/a:1"}}}}
			if _, err := g.cs.CoreV1().Pods(g.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		i++
		time.Sleep(20 * time.Millisecond)
	}
	checkDelivered(t, col, g, 30*time.Second)

	for _, r := range kinds {
		if d := req("list", r) - before[r]; d != 0 {
			t.Errorf("agent LISTed %s %v times in the steady phase, want 0", r, d)
		}
		n, err := cluster.APIRequestCount(ctx, kube.RequestFilter{Resource: r, Verb: "LIST"})
		if err != nil {
			t.Fatal(err)
		}
		if d := n - apiBefore[r]; d != 0 {
			t.Errorf("kube-apiserver counted %v LISTs of %s in the steady phase, want 0", d, r)
		}
	}
	if n := req("get", "events"); n != 0 {
		t.Errorf("agent issued %v GETs of Events, want 0", n)
	}
	rewatches := req("watch", "events") - watchesBefore
	if rewatches < 5 {
		t.Errorf("only %v Event re-watches in the steady phase; the shortened watch timeout should give >= 5", rewatches)
	}
	if d := counter(t, ra.reg, "eventpipe_agent_relists_total", nil) - relistsBefore; d != 0 {
		t.Errorf("agent relisted Events %v times in the steady phase, want 0 (every re-watch resumes from its resourceVersion)", d)
	}
	if d := apiMetric("apiserver_watch_list_duration_seconds_count") - watchListsBefore; d != 0 {
		t.Errorf("kube-apiserver served %v watch-lists of Events in the steady phase, want 0", d)
	}
	// Each created Event is sent once on the one Event watch; a re-watch may
	// add a bookmark or two. A relist on re-watch would resend everything
	// created so far, each time.
	sent := apiMetric("apiserver_watch_events_total") - sentBefore
	if limit := float64(i) + 2*rewatches + 20; sent > limit {
		t.Errorf("kube-apiserver sent %v Event watch events in the steady phase for %d Events created and %v re-watches (limit %v): the agent re-listed", sent, i, rewatches, limit)
	}
	t.Logf("steady phase: %d Events, %v Event re-watches, 0 LISTs, 0 relists, %v watch events sent", i, rewatches, sent)
}
