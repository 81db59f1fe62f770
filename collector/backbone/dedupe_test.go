package backbone

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
)

func TestWindow(t *testing.T) {
	cases := []struct {
		name      string
		size      int
		seed      []string
		ids       []string
		dups      []bool
		evictions uint64
	}{
		{name: "new ids pass", size: 4, ids: []string{"a", "b", "c"}, dups: []bool{false, false, false}},
		{name: "repeat inside the window is dropped", size: 4, ids: []string{"a", "b", "a", "b"}, dups: []bool{false, false, true, true}},
		{name: "repeat beyond the window passes", size: 2, ids: []string{"a", "b", "c", "a"}, dups: []bool{false, false, false, false}, evictions: 2},
		{name: "duplicates do not push older ids out", size: 2, ids: []string{"a", "b", "b", "b", "a"}, dups: []bool{false, false, true, true, true}},
		{name: "empty id is never a duplicate", size: 4, ids: []string{"", ""}, dups: []bool{false, false}},
		{name: "seeded ids are duplicates", size: 4, seed: []string{"x", "y"}, ids: []string{"y", "z", "x"}, dups: []bool{true, false, true}},
		{name: "seed larger than the window keeps the newest", size: 2, seed: []string{"x", "y", "z"}, ids: []string{"x", "z"}, dups: []bool{false, true}, evictions: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := NewWindow(c.size)
			for _, id := range c.seed {
				w.Remember(id)
			}
			for i, id := range c.ids {
				if got := w.Check(id); got != c.dups[i] {
					t.Errorf("Check(%q) #%d = %v, want %v", id, i, got, c.dups[i])
				}
			}
			if w.Evictions() != c.evictions {
				t.Errorf("evictions %d, want %d", w.Evictions(), c.evictions)
			}
			if w.Len() > c.size {
				t.Errorf("window holds %d ids, more than its size %d", w.Len(), c.size)
			}
		})
	}
}

// startKfake starts a kfake cluster of 3 brokers with topic (parts
// partitions) and returns client options for it.
func startKfake(t *testing.T, topic string, parts int32) []kgo.Opt {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(parts, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
}

func occ(id, sandbox string) *eventpipev1.Occurrence {
	return &eventpipev1.Occurrence{EventId: id, Cluster: "c1", Namespace: "openshell", Reason: "Failed",
		Sandbox: &eventpipev1.Sandbox{Id: sandbox, Workspace: "ws"}}
}

// produce writes occurrences with acks=all and returns their partition and
// offset.
func produce(t *testing.T, opts []kgo.Opt, topic string, occs ...*eventpipev1.Occurrence) []*kgo.Record {
	t.Helper()
	recs, err := produceRecs(opts, topic, occs...)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func produceErr(opts []kgo.Opt, topic string, occs ...*eventpipev1.Occurrence) error {
	_, err := produceRecs(opts, topic, occs...)
	return err
}

func produceRecs(opts []kgo.Opt, topic string, occs ...*eventpipev1.Occurrence) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var recs []*kgo.Record
	for _, o := range occs {
		r, err := Encode(o, "events")
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return recs, cl.ProduceSync(ctx, recs...).FirstErr()
}

// pollRecords polls r until it has want records or the deadline passes.
func pollRecords(t *testing.T, r *Reader, want int, d time.Duration) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out []Record
	for len(out) < want {
		recs, err := r.Poll(ctx)
		if err != nil {
			break
		}
		out = append(out, recs...)
	}
	return out
}

// TestReaderSeedsWindowBeforeStart: a consumer restarting at offset X
// must still drop the resend (after X) of a record written before X. It
// fails when seeding is removed.
func TestReaderSeedsWindowBeforeStart(t *testing.T) {
	const topic = "bb"
	opts := startKfake(t, topic, 1)
	var occs []*eventpipev1.Occurrence
	for i := range 10 {
		occs = append(occs, occ(fmt.Sprintf("c1/e/%d", i), "sbx-1"))
	}
	produce(t, opts, topic, occs...)
	// The agent resends e/7, e/8 (their ack was lost) and goes on with e/10.
	resend := produce(t, opts, topic, occs[7], occs[8], occ("c1/e/10", "sbx-1"))
	// A consumer restarts after having handled offsets 0..9 (start = 10).
	reg := prometheus.NewRegistry()
	m, err := NewReadMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReader(opts, topic, map[int32]int64{0: resend[0].Offset}, 16, SinkConsumer("loki"), m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := pollRecords(t, r, 1, 10*time.Second)
	if len(got) != 1 || got[0].Occurrence.GetEventId() != "c1/e/10" {
		var ids []string
		for _, g := range got {
			ids = append(ids, g.Occurrence.GetEventId())
		}
		t.Fatalf("delivered %v, want only c1/e/10 (the resends of e/7 and e/8 are duplicates of records before the start)", ids)
	}
	if n := counter(t, m.duplicates.WithLabelValues(SinkConsumer("loki"))); n != 2 {
		t.Errorf("duplicates counted %v, want 2", n)
	}
	if n := counter(t, m.seeded.WithLabelValues(SinkConsumer("loki"))); n != 10 {
		t.Errorf("seeded %v, want 10", n)
	}
}

// TestReaderWindowBounded: a window smaller than the resend distance lets
// the resend through and counts the evictions that made it so.
func TestReaderWindowBounded(t *testing.T) {
	const topic = "bb"
	opts := startKfake(t, topic, 1)
	produce(t, opts, topic, occ("a", "s"), occ("b", "s"), occ("c", "s"), occ("d", "s"), occ("a", "s"), occ("d", "s"), occ("x", "s"))
	m, _ := NewReadMetrics(nil)
	r, err := NewReader(opts, topic, map[int32]int64{0: 0}, 2, ConsumerFollow, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := pollRecords(t, r, 6, 10*time.Second)
	var ids []string
	for _, g := range got {
		ids = append(ids, g.Occurrence.GetEventId())
	}
	if fmt.Sprint(ids) != "[a b c d a x]" {
		t.Errorf("delivered %v, want [a b c d a x] (a is 4 records back: beyond a window of 2; d is 1 back)", ids)
	}
	if n := counter(t, m.evictions.WithLabelValues(ConsumerFollow)); n != 4 {
		t.Errorf("evictions %v, want 4", n)
	}
}

func TestReaderSkipsUndecodable(t *testing.T) {
	const topic = "bb"
	opts := startKfake(t, topic, 1)
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		t.Fatal(err)
	}
	foreign := &kgo.Record{Value: []byte(`{"not":"ours"}`), Headers: []kgo.RecordHeader{{Key: HeaderContentType, Value: []byte("application/json")}}}
	if err := cl.ProduceSync(context.Background(), foreign).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	produce(t, opts, topic, occ("ok", "s"))
	m, _ := NewReadMetrics(nil)
	r, err := NewReader(opts, topic, map[int32]int64{0: 0}, 16, ConsumerFollow, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := pollRecords(t, r, 1, 10*time.Second)
	if len(got) != 1 || got[0].Occurrence.GetEventId() != "ok" || got[0].Offset != 1 {
		t.Fatalf("got %v", got)
	}
	if n := counter(t, m.undecodable.WithLabelValues(ConsumerFollow)); n != 1 {
		t.Errorf("undecodable %v, want 1", n)
	}
}

// TestPartitionOfMatchesProducer: a sandbox's Follow reads only the
// partition PartitionOf names; it must be the one the producer chose.
func TestPartitionOfMatchesProducer(t *testing.T) {
	const topic = "bb"
	opts := startKfake(t, topic, 12)
	var occs []*eventpipev1.Occurrence
	for i := range 40 {
		occs = append(occs, occ(fmt.Sprintf("e%d", i), fmt.Sprintf("sbx-%d", i)))
	}
	for _, r := range produce(t, opts, topic, occs...) {
		if p := PartitionOf(r.Key, 12); p != r.Partition {
			t.Errorf("key %s: PartitionOf = %d, producer chose %d", r.Key, p, r.Partition)
		}
	}
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// BenchmarkWindowFull measures a full default window: Check per id and the
// heap it holds (reported as MB/window).
func BenchmarkWindowFull(b *testing.B) {
	ids := make([]string, DefaultDedupeWindow)
	for i := range ids {
		ids[i] = fmt.Sprintf("prod-cluster-eu/5f0c2a6e-3f7b-4c1e-9d2a-%012d/%d", i, 1_000_000+i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	w := NewWindow(DefaultDedupeWindow)
	for _, id := range ids {
		w.Check(id)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w.Check(ids[i%len(ids)])
	}
	b.ReportMetric(held, "MB/window")
	runtime.KeepAlive(w)
}

// TestReaderPollKeepsRecordsWhenContextEnds: a poll that returns records
// just as the caller's context ends (a runner's batch deadline) must hand
// them over: the client has moved past them. Dropping them skipped records
// silently (seen as gaps in a partition under load).
func TestReaderPollKeepsRecordsWhenContextEnds(t *testing.T) {
	const topic = "bb"
	opts := startKfake(t, topic, 1)
	produce(t, opts, topic, occ("a", "s"), occ("b", "s"))
	r, err := NewReader(opts, topic, map[int32]int64{0: 0}, 16, ConsumerFollow, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	real := r.poll
	r.poll = func(pctx context.Context) kgo.Fetches {
		for {
			fs := real(context.Background())
			if fs.NumRecords() > 0 {
				cancel() // the deadline fires while the fetch comes back
				return fs
			}
		}
	}
	got, err := r.Poll(ctx)
	if err != nil || len(got) != 2 {
		t.Fatalf("Poll = %d records, %v; want the 2 fetched records", len(got), err)
	}
}

// deleteRecords advances partition p's log start to before (retention).
func deleteRecords(t *testing.T, opts []kgo.Opt, topic string, p int32, before int64) {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = p, before
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 5000
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, t2 := range resp.Topics {
		for _, p2 := range t2.Partitions {
			if err := kerr.ErrorForCode(p2.ErrorCode); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestReaderReportsRecordsRemovedWhileBehind: records retention removes
// after a consumer started, before it read them, are reported on the next
// record read (Skipped) and counted: never skipped silently.
func TestReaderReportsRecordsRemovedWhileBehind(t *testing.T) {
	const topic = "bb"
	opts := startKfake(t, topic, 1)
	var first []*eventpipev1.Occurrence
	for i := range 5 {
		first = append(first, occ(fmt.Sprintf("a%d", i), "s"))
	}
	produce(t, opts, topic, first...)
	m, _ := NewReadMetrics(nil)
	r, err := NewReader(opts, topic, map[int32]int64{0: 0}, 16, ConsumerFollow, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := pollRecords(t, r, 5, 10*time.Second); len(got) != 5 {
		t.Fatalf("read %d of the first 5", len(got))
	}
	r.Close()
	// The consumer falls behind (here: it is gone) while 10 more records
	// arrive and retention removes 7 of them; it comes back where it
	// stopped, at offset 5. (Pausing a live reader instead raced with a
	// fetch already on its way.)
	var more []*eventpipev1.Occurrence
	for i := range 10 {
		more = append(more, occ(fmt.Sprintf("b%d", i), "s"))
	}
	produce(t, opts, topic, more...)
	deleteRecords(t, opts, topic, 0, 12)
	r, err = NewReader(opts, topic, map[int32]int64{0: 5}, 16, ConsumerFollow, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := pollRecords(t, r, 3, 10*time.Second)
	if len(got) != 3 || got[0].Offset != 12 || got[0].Skipped != 7 || got[1].Skipped != 0 {
		t.Fatalf("after the removal: %+v; want offsets 12-14, the first with Skipped 7", got)
	}
	if n := counter(t, m.skipped.WithLabelValues(ConsumerFollow)); n != 7 {
		t.Errorf("skipped counted %v, want 7", n)
	}
}

func TestPartSourceReportsGaps(t *testing.T) {
	rec := func(off, skipped uint64) bufRecord {
		return bufRecord{Record: sinks.Record{Offset: off}, skipped: skipped}
	}
	s := &partSource{pendingLost: 2, buf: []bufRecord{rec(3, 0), rec(4, 0), rec(9, 4), rec(10, 0)}}
	steps := []struct {
		from     uint64
		wantOffs []uint64
		wantLost uint64
	}{
		{from: 1, wantOffs: []uint64{3, 4}, wantLost: 2}, // lost before the start; the gap before 9 ends the slice
		{from: 5, wantOffs: []uint64{9, 10}, wantLost: 4},
		{from: 11, wantOffs: nil, wantLost: 0},
	}
	for i, st := range steps {
		got, lost, _ := s.Read(context.Background(), st.from, 10)
		var offs []uint64
		for _, r := range got {
			offs = append(offs, r.Offset)
		}
		if fmt.Sprint(offs) != fmt.Sprint(st.wantOffs) || lost != st.wantLost {
			t.Errorf("step %d: Read(%d) = %v, lost %d; want %v, lost %d", i, st.from, offs, lost, st.wantOffs, st.wantLost)
		}
	}
}
