package backbone

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/file"
	"github.com/eventpipe/eventpipe/sinks/loki"
	"github.com/eventpipe/eventpipe/testenv/victorialogs"
)

// replica is one collector replica's GroupSinks, as its own process would
// run them (own registry).
type replica struct {
	name   string
	g      *GroupSinks
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

func startReplica(t *testing.T, name string, cfg Config, p sinks.Pusher) *replica {
	t.Helper()
	rc := sinks.NewDefaultRunnerConfig("loki")
	rc.Batch.MaxWait = 100 * time.Millisecond
	rc.Batch.MaxRecords = 50
	rc.Retry.Initial = 50 * time.Millisecond
	rc.Retry.Max = 300 * time.Millisecond
	rc.Retry.PushTimeout = 2 * time.Second
	rc.CommitInterval = 200 * time.Millisecond
	reg := prometheus.NewRegistry()
	g, err := NewGroupSinks(cfg, []GroupSink{{Runner: rc, Pusher: p}}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range g.members {
		m.extra = []kgo.Opt{kgo.HeartbeatInterval(200 * time.Millisecond), kgo.SessionTimeout(6 * time.Second), kgo.ClientID(name)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{name: name, g: g, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- g.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *replica) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	<-r.done
	r.cancel = nil
}

func (r *replica) partitions() []int32 {
	var ps []int32
	for _, s := range r.g.Status() {
		for _, p := range s.Partitions {
			ps = append(ps, p.Partition)
		}
	}
	return ps
}

func (r *replica) counter(name string) float64 {
	mfs, _ := r.reg.Gather()
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

func waitUntil(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func occurrences(from, n int) []*eventpipev1.Occurrence {
	now := timestamppb.Now()
	var out []*eventpipev1.Occurrence
	for i := from; i < from+n; i++ {
		o := occ(fmt.Sprintf("c1/ev-%04d/1", i), fmt.Sprintf("sbx-%02d", i%24))
		o.OccurredAt, o.ObservedAt = now, now
		o.Message = fmt.Sprintf("occurrence %d", i)
		out = append(out, o)
	}
	return out
}

// TestGroupSinksRebalanceDuringLokiOutage: two replicas share a sink's
// consumer group; a member joins and then the first one leaves while Loki
// (VictoriaLogs) is down, and resent records (same event_id) sit in the
// topic. After Loki comes back every occurrence is there; the resends are
// dropped by the window; the test reports how many rows Loki holds beyond
// one per event_id.
func TestGroupSinksRebalanceDuringLokiOutage(t *testing.T) {
	const topic = "eventpipe.occurrences"
	opts := startKfake(t, topic, 6)
	vl := victorialogs.Start(t)
	lcfg := loki.NewDefaultConfig()
	lcfg.URL = vl.PushURL()
	lcfg.QueryParams = map[string]string{"disable_message_parsing": "1"}
	lcfg.Timeout = time.Second
	newPusher := func() *loki.Sink {
		s, err := loki.New(lcfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	cfg := NewDefaultConfig()
	cl, _ := kgo.NewClient(opts...)
	cfg.Conn.Brokers = cl.OptValue(kgo.SeedBrokers).([]string)
	cl.Close()
	cfg.Topic = topic
	cfg.DedupeWindow = minDedupeWindow

	all := occurrences(0, 900)
	produce(t, opts, topic, all[:300]...)
	a := startReplica(t, "a", cfg, newPusher())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := vl.WaitFor(ctx, `{job="eventpipe"}`, 300); err != nil {
		t.Fatalf("before the outage: %v", err)
	}

	// Loki outage; records keep arriving, some of them resends.
	vl.Stop()
	produce(t, opts, topic, all[300:600]...)
	produce(t, opts, topic, all[100:120]...) // resends of delivered records
	b := startReplica(t, "b", cfg, newPusher())
	waitUntil(t, 30*time.Second, "b to get partitions", func() bool { return len(b.partitions()) > 0 })
	waitUntil(t, 30*time.Second, "a to give some up", func() bool { return len(a.partitions()) < 6 })
	time.Sleep(time.Second) // both retry against the closed port
	produce(t, opts, topic, all[600:800]...)
	produce(t, opts, topic, all[400:420]...) // resends of undelivered records
	a.stop()
	waitUntil(t, 30*time.Second, "b to own every partition", func() bool { return len(b.partitions()) == 6 })
	produce(t, opts, topic, all[800:]...)
	vl.Restart()

	want := map[string]bool{}
	for _, o := range all {
		want[o.GetEventId()] = true
	}
	var rows []map[string]any
	var err error
	for {
		rows, err = vl.WaitFor(ctx, `{job="eventpipe"} | fields event_id`, len(all))
		if err != nil {
			t.Fatalf("after the outage: %v (status b: %+v)", err, b.g.Status())
		}
		got := map[string]bool{}
		for _, r := range rows {
			id, _ := r["event_id"].(string)
			got[id] = true
		}
		if len(got) == len(want) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	seen := map[string]int{}
	for _, r := range rows {
		id, _ := r["event_id"].(string)
		seen[id]++
	}
	for id := range want {
		if seen[id] == 0 {
			t.Errorf("lost %s", id)
		}
	}
	dups := len(rows) - len(seen)
	dropped := a.counter("eventpipe_collector_backbone_duplicates_dropped_total") + b.counter("eventpipe_collector_backbone_duplicates_dropped_total")
	t.Logf("Loki rows %d for %d event ids: %d duplicate rows (removable by event_id); %v resends dropped by the window; a revoked %d partitions",
		len(rows), len(seen), dups, dropped, a.g.Status()[0].Revoked)
	if dropped < 40 {
		t.Errorf("window dropped %v resends, want at least the 40 the test wrote", dropped)
	}
	if a.g.Status()[0].Revoked == 0 {
		t.Errorf("a never had a partition revoked: the rebalance did not happen")
	}
}

// fileSinkReplica is a replica whose sink is a real file sink at path.
func fileSinkReplica(t *testing.T, name string, cfg Config, path string) *replica {
	t.Helper()
	fc := file.NewDefaultConfig()
	fc.Path = path
	s, err := file.New(fc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return startReplica(t, name, cfg, s)
}

// fileIDs counts the occurrences in the JSONL files at paths.
func fileIDs(t *testing.T, paths ...string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bytes.Split(b, []byte("\n")) {
			var o eventpipev1.Occurrence
			if len(line) == 0 || protojson.Unmarshal(line, &o) != nil {
				continue
			}
			out[o.GetEventId()]++
		}
	}
	return out
}

// TestGroupSinksChurnUnderLoad: records flow while replicas join and
// leave a sink's group (clean stops) three times; every occurrence reaches
// one of the replicas' file sinks. A replica that stops cleanly commits
// what it delivered, so a hand-over repeats nothing; the test reports the
// copies it sees.
func TestGroupSinksChurnUnderLoad(t *testing.T) {
	const topic = "eventpipe.occurrences"
	opts := startKfake(t, topic, 6)
	cfg := NewDefaultConfig()
	cl, _ := kgo.NewClient(opts...)
	cfg.Conn.Brokers = cl.OptValue(kgo.SeedBrokers).([]string)
	cl.Close()
	cfg.Topic = topic
	cfg.DedupeWindow = minDedupeWindow
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl"), filepath.Join(dir, "c.jsonl")}

	all := occurrences(0, 3000)
	done := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < len(all) && err == nil; i += 50 {
			err = produceErr(opts, topic, all[i:i+50]...)
			time.Sleep(20 * time.Millisecond)
		}
		done <- err
	}()
	a := fileSinkReplica(t, "a", cfg, paths[0])
	time.Sleep(300 * time.Millisecond)
	b := fileSinkReplica(t, "b", cfg, paths[1])
	time.Sleep(300 * time.Millisecond)
	a.stop()
	c := fileSinkReplica(t, "c", cfg, paths[2])
	time.Sleep(300 * time.Millisecond)
	b.stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "every occurrence in a file", func() bool {
		got := fileIDs(t, paths...)
		for _, o := range all {
			if got[o.GetEventId()] == 0 {
				return false
			}
		}
		return true
	})
	got := fileIDs(t, paths...)
	copies := 0
	for _, n := range got {
		copies += n - 1
	}
	t.Logf("%d occurrences, %d repeated records across the hand-overs (c holds %v partitions)", len(got), copies, c.partitions())
}

// metric sums the series of name whose labels include want (counter or
// gauge); present says whether any series matched.
func (r *replica) metric(name string, want map[string]string) (v float64, present bool) {
	mfs, _ := r.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, val := range want {
				if have[k] != val {
					continue series
				}
			}
			present = true
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return v, present
}

// TestGroupSinksPartitionMetrics: each replica's
// eventpipe_collector_backbone_sink_assigned_partitions is the number of
// partitions it owns in the sink's group, so after every rebalance the
// gauges of the replicas add up to the topic's partition count; and
// eventpipe_collector_backbone_sink_rebalances_total counts, per kind, the
// rebalances that changed a replica's share: a second member joining
// (revoked on the first, assigned on the second), the first one leaving
// (assigned on the second again). Nothing is fenced here: lost stays 0,
// but its series exists from the start.
func TestGroupSinksPartitionMetrics(t *testing.T) {
	const topic, partitions = "eventpipe.occurrences", 6
	opts := startKfake(t, topic, partitions)
	cfg := NewDefaultConfig()
	cl, _ := kgo.NewClient(opts...)
	cfg.Conn.Brokers = cl.OptValue(kgo.SeedBrokers).([]string)
	cl.Close()
	cfg.Topic = topic
	cfg.DedupeWindow = minDedupeWindow
	dir := t.TempDir()
	produce(t, opts, topic, occurrences(0, 60)...)

	const (
		assigned   = "eventpipe_collector_backbone_sink_assigned_partitions"
		rebalances = "eventpipe_collector_backbone_sink_rebalances_total"
	)
	sink := map[string]string{"sink": "loki"} // startReplica's sink name
	gauge := func(r *replica) int {
		v, _ := r.metric(assigned, sink)
		return int(v)
	}
	count := func(r *replica, kind string) float64 {
		v, ok := r.metric(rebalances, map[string]string{"sink": "loki", "kind": kind})
		if !ok {
			t.Fatalf("%s: no %s series for kind %q", r.name, rebalances, kind)
		}
		return v
	}
	// settled: the gauges add up to the partition count and each equals
	// the partitions the replica's Status lists.
	settled := func(rs ...*replica) bool {
		sum := 0
		for _, r := range rs {
			if gauge(r) != len(r.partitions()) {
				return false
			}
			sum += gauge(r)
		}
		return sum == partitions
	}

	a := fileSinkReplica(t, "a", cfg, filepath.Join(dir, "a.jsonl"))
	waitUntil(t, 30*time.Second, "a to own every partition", func() bool { return gauge(a) == partitions && settled(a) })
	if n := count(a, "assigned"); n != 1 {
		t.Errorf("a alone: %v assigned rebalances, want 1", n)
	}

	b := fileSinkReplica(t, "b", cfg, filepath.Join(dir, "b.jsonl"))
	waitUntil(t, 30*time.Second, "a and b to share the partitions", func() bool {
		return gauge(a) > 0 && gauge(b) > 0 && settled(a, b)
	})
	t.Logf("after b joined: a owns %d, b owns %d", gauge(a), gauge(b))
	if n := count(a, "revoked"); n < 1 {
		t.Errorf("a gave partitions to b, but %v revoked rebalances", n)
	}
	if n := count(b, "assigned"); n < 1 {
		t.Errorf("b got partitions, but %v assigned rebalances", n)
	}
	bAssigned := count(b, "assigned")

	a.stop()
	waitUntil(t, 30*time.Second, "b to own every partition", func() bool { return gauge(b) == partitions && settled(b) })
	if g := gauge(a); g != 0 {
		t.Errorf("a left its group but its gauge says %d partitions", g)
	}
	if n := count(b, "assigned"); n != bAssigned+1 {
		t.Errorf("b took a's partitions: %v assigned rebalances, want %v", n, bAssigned+1)
	}
	for _, r := range []*replica{a, b} {
		if n := count(r, "lost"); n != 0 {
			t.Errorf("%s: %v lost rebalances, want 0 (nothing was fenced)", r.name, n)
		}
	}
}
