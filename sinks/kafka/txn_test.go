package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

// TestTransactionalPushCommitsOffsetWithBatch: a transactional push makes
// the batch visible to read_committed readers and moves the consumer
// group's offset in the same step; a push that fails (its context ended
// before it could finish) makes neither visible; and a second producer
// with the same transactional id fences the first, whose next push fails.
func TestTransactionalPushCommitsOffsetWithBatch(t *testing.T) {
	b := startBroker(t, kfake.SeedTopics(1, "src"), kfake.SeedTopics(3, "archive"))
	cfg := testConfig(b.addr(), "archive")
	cfg.CreateTopic.Enabled = false
	s, err := New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The group member whose generation the commits are made under.
	grp, err := kgo.NewClient(kgo.SeedBrokers(b.addr()), kgo.ConsumerGroup("archive-group"), kgo.ConsumeTopics("src"),
		kgo.DisableAutoCommit(), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer grp.Close()
	for {
		if m, gen := grp.GroupMetadata(); m != "" && gen > 0 {
			break
		}
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		grp.PollFetches(pctx)
		pcancel()
		if ctx.Err() != nil {
			t.Fatal("the group member never joined")
		}
	}
	src := sinks.TxnSource{Group: "archive-group", Topic: "src", Partition: 0, TransactionalID: "archive-group.src.0",
		Timeout: 10 * time.Second, Member: grp.GroupMetadata}
	var committed uint64
	src.Committed = func(off uint64) { committed = off }
	tp, err := s.Transactional(src)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	if err := tp.Init(ctx); err != nil {
		t.Fatal(err)
	}
	g := sinktest.NewGenerator(31, "txn-")
	batch := func(from, n int) []sinks.Record {
		out := make([]sinks.Record, n)
		for i := range out {
			out[i] = sinks.Record{Offset: uint64(from + i), Occurrence: g.Next()}
		}
		return out
	}
	readCommitted := func() int {
		recs, err := readTopic(ctx, []kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}, b.addr(), "archive")
		if err != nil {
			t.Fatal(err)
		}
		return len(recs)
	}
	groupOffset := func() int64 {
		adm, err := kgo.NewClient(kgo.SeedBrokers(b.addr()))
		if err != nil {
			t.Fatal(err)
		}
		defer adm.Close()
		offs, err := kadm.NewClient(adm).FetchOffsets(ctx, "archive-group")
		if err != nil {
			t.Fatal(err)
		}
		o, _ := offs.Lookup("src", 0)
		return o.At
	}

	if err := tp.Push(ctx, batch(1, 5)); err != nil {
		t.Fatal(err)
	}
	if n, off := readCommitted(), groupOffset(); n != 5 || off != 5 || committed != 5 {
		t.Fatalf("after one push: %d records, group offset %d, told %d; want 5, 5, 5", n, off, committed)
	}

	// A push whose context has ended is aborted: neither its records nor
	// its offset are visible.
	dead, stop := context.WithCancel(ctx)
	stop()
	if err := tp.Push(dead, batch(6, 5)); err == nil {
		t.Fatal("a push with an ended context succeeded")
	}
	if n, off := readCommitted(), groupOffset(); n != 5 || off != 5 {
		t.Fatalf("after an aborted push: %d records, group offset %d; want 5, 5", n, off)
	}

	// The partition's next owner: same transactional id. It fences the
	// first producer.
	next, err := s.Transactional(src)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if err := next.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tp.Push(ctx, batch(6, 5)); err == nil {
		t.Fatal("the fenced producer's push succeeded")
	}
	if err := next.Push(ctx, batch(6, 5)); err != nil {
		t.Fatal(err)
	}
	if n, off := readCommitted(), groupOffset(); n != 10 || off != 10 {
		t.Fatalf("after the new owner's push: %d records, group offset %d; want 10, 10", n, off)
	}
}
