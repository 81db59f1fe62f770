package drills

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// setup starts a collector (behind its proxy) and an agent for a drill and
// waits until the agent's initial listing is acknowledged, so the drill
// measures the fault, not the start.
func setup(t *testing.T, name string) (*testCollector, *agentProc, *loadGen) {
	t.Helper()
	col := startCollector(t)
	a := startAgent(t, name, col.proxy.Addr())
	waitFor(t, 2*time.Minute, "a cursor at the collector", func() bool {
		_, ok := col.c.Store().ClusterCursor(name, "events")
		return ok
	})
	return col, a, newLoadGen(t, "drill-"+name)
}

// runLoad creates Events for p.load in the background; the returned wait
// returns the load's error.
func runLoad(t *testing.T, g *loadGen, p params) (wait func()) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- g.run(context.Background(), p.rate, p.load) }()
	return func() {
		t.Helper()
		if err := <-errc; err != nil {
			t.Fatalf("load: %v", err)
		}
	}
}

// The agent is SIGKILLed under load and restarted after a second.
func TestDrillAgentSIGKILL(t *testing.T) {
	p := sizes()
	col, a, g := setup(t, "agent-sigkill")
	wait := runLoad(t, g, p)
	time.Sleep(p.load / 3)
	a.kill()
	time.Sleep(time.Second)
	dedup := col.metric(t, "eventpipe_collector_deduplicated_occurrences_total")
	restarted := time.Now()
	rec := recovery(t, col, g, restarted, p.recover)
	b := startAgent(t, "agent-sigkill", col.proxy.Addr())
	wait()
	r := measure(t, col, g, rec, p.recover, dedup, result{drill: "agent SIGKILL under load"})
	relists := b.metric("eventpipe_agent_relists_total", "")
	if relists != 0 {
		t.Errorf("the restarted agent relisted %v times, want 0 (resume from the collector's cursor)", relists)
	}
	r.note = fmt.Sprintf("restart relists %v", relists)
	setNote(r)
}

// kube-apiserver is stopped and started again under load (the agent's
// watches break; it must resume without a relist and lose nothing).
func TestDrillAPIServerRestart(t *testing.T) {
	p := sizes()
	col, a, g := setup(t, "apiserver-restart")
	dedup := col.metric(t, "eventpipe_collector_deduplicated_occurrences_total")
	relists := a.metric("eventpipe_agent_relists_total", "")
	wait := runLoad(t, g, p)
	time.Sleep(p.load / 3)
	down := time.Now()
	if err := cluster.RestartAPIServer(context.Background()); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	rec := recovery(t, col, g, up, p.recover)
	wait()
	r := measure(t, col, g, rec, p.recover, dedup, result{drill: "kube-apiserver restart"})
	r.note = fmt.Sprintf("apiserver stopped and ready again in %s; agent relists during the drill %v, watch errors %v", up.Sub(down).Round(100*time.Millisecond),
		a.metric("eventpipe_agent_relists_total", "")-relists, a.metric("eventpipe_agent_watch_errors_total", ""))
	setNote(r)
}

// The agent is stopped, Events are written and etcd is compacted past its
// cursor: the restarted agent gets 410 Gone, relists, and the collector's
// de-duplication absorbs what the relist sends again.
func TestDrillCompaction410(t *testing.T) {
	p := sizes()
	col, a, g := setup(t, "compaction-410")
	wait := runLoad(t, g, params{rate: p.rate, load: p.load / 2})
	wait()
	waitFor(t, p.recover, "the first half delivered", func() bool {
		got := col.records(t, g.ns)
		for id := range g.created() {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	a.stop()
	wait = runLoad(t, g, params{rate: p.rate, load: p.load / 2})
	wait()
	rev, err := cluster.Compact(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dedup := col.metric(t, "eventpipe_collector_deduplicated_occurrences_total")
	restarted := time.Now()
	rec := recovery(t, col, g, restarted, p.recover)
	b := startAgent(t, "compaction-410", col.proxy.Addr())
	r := measure(t, col, g, rec, p.recover, dedup, result{drill: "410 after etcd compaction"})
	expired, relists := b.metric("eventpipe_agent_watch_expired_total", ""), b.metric("eventpipe_agent_relists_total", "")
	if expired < 1 || relists < 1 {
		t.Errorf("after compaction at revision %d: watch_expired_total %v, relists_total %v, want both >= 1", rev, expired, relists)
	}
	r.note = fmt.Sprintf("compacted at revision %d; 410s %v, relists %v (re-sent = the relist's already-stored Events)", rev, expired, relists)
	setNote(r)
}

// The network between agent and collector is black-holed (nothing
// arrives, nothing is refused) while Events keep coming, then restored.
func TestDrillNetworkBlackhole(t *testing.T) {
	p := sizes()
	col, a, g := setup(t, "blackhole")
	dedup := col.metric(t, "eventpipe_collector_deduplicated_occurrences_total")
	wait := runLoad(t, g, p)
	time.Sleep(p.load / 4)
	col.proxy.Blackhole()
	time.Sleep(p.fault)
	col.proxy.Restore()
	rec := recovery(t, col, g, time.Now(), p.recover)
	wait()
	r := measure(t, col, g, rec, p.recover, dedup, result{drill: "agent-collector network black-holed"})
	r.note = fmt.Sprintf("hole %s; agent ship errors %v, batches re-sent %v", p.fault, a.metric("eventpipe_agent_ship_errors_total", ""),
		a.metric("eventpipe_agent_batches_total", `result="resent"`))
	setNote(r)
}

// setNote replaces the recorded result of r's drill with r (its note).
func setNote(r result) {
	resultsMu.Lock()
	defer resultsMu.Unlock()
	for i := range results {
		if results[i].drill == r.drill {
			results[i] = r
		}
	}
}
