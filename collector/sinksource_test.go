package collector

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/store"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

// countingLog counts the records the log decodes for its readers.
type countingLog struct {
	followLog
	decoded atomic.Int64
}

func (l *countingLog) Read(ctx context.Context, from uint64, max int) ([]sinks.Record, uint64, error) {
	recs, skipped, err := l.followLog.Read(ctx, from, max)
	l.decoded.Add(int64(len(recs)))
	return recs, skipped, err
}

func openTestStore(t *testing.T) *store.Store {
	t.Helper()
	cfg := store.NewDefaultConfig()
	cfg.Dir = filepath.Join(t.TempDir(), "log")
	cfg.Fsync = false
	st, err := store.Open(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func appendN(t *testing.T, st *store.Store, prefix string, n int) {
	t.Helper()
	var occs []*eventpipev1.Occurrence
	for i := range n {
		occs = append(occs, occ(fmt.Sprintf("%s-%d", prefix, i), "sb", "ws1", "n", "gw"))
	}
	if _, err := st.Append(context.Background(), "c", "events", "", occs); err != nil {
		t.Fatal(err)
	}
}

// recorder keeps every record pushed to it.
type recorder struct {
	mu   sync.Mutex
	recs []sinks.Record
}

func (r *recorder) Push(_ context.Context, b []sinks.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, b...)
	return nil
}

// Two runners over the collector's sink source, following a log that grows
// in small appends, receive the very same decoded occurrences, and the log
// decodes each record about once (not once per runner).
func TestSinkSourceSharesOneDecodeBetweenRunners(t *testing.T) {
	st := openTestStore(t)
	cl := &countingLog{followLog: st}
	src := newSinkSource(cl)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var rs []*sinks.Runner
	var pushed []*recorder
	for _, name := range []string{"a", "b"} {
		cfg := sinks.NewDefaultRunnerConfig(name)
		cfg.Batch.MaxRecords = 100
		cfg.Batch.MaxWait = 5 * time.Millisecond
		cur, err := st.Cursor(name)
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{}
		r, err := sinks.NewRunner(cfg, rec, src, cur, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		rs, pushed = append(rs, r), append(pushed, rec)
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(ctx) }()
	}
	const appends, per = 60, 50 // 3000 records, chunks of 1024 filled in steps of 50
	for i := range appends {
		appendN(t, st, fmt.Sprintf("s%d", i), per)
		time.Sleep(2 * time.Millisecond)
	}
	const total = appends * per
	deadline := time.Now().Add(20 * time.Second)
	for rs[0].Status().Handled < total || rs[1].Status().Handled < total {
		if time.Now().After(deadline) {
			t.Fatalf("runners did not reach %d: %+v %+v", total, rs[0].Status(), rs[1].Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	a, b := pushed[0].recs, pushed[1].recs
	if len(a) != total || len(b) != total {
		t.Fatalf("pushed %d and %d records, want %d each", len(a), len(b), total)
	}
	shared := 0
	for i := range a {
		if a[i].Offset != uint64(i+1) || b[i].Offset != uint64(i+1) {
			t.Fatalf("record %d: offsets %d and %d", i, a[i].Offset, b[i].Offset)
		}
		if a[i].Occurrence == b[i].Occurrence {
			shared++
		}
	}
	decoded := cl.decoded.Load()
	t.Logf("%d of %d occurrences shared by both runners; the log decoded %d records for them", shared, total, decoded)
	// The two runners move at about the same pace through the same chunks:
	// a record read by only one of them (the other was ahead by more than
	// the cache holds) would be decoded twice. Allow a little slack for a
	// reader that finds a chunk being extended and reads on its own.
	if decoded > total*5/4 {
		t.Errorf("the log decoded %d records for two runners of %d: the read is not shared", decoded, total)
	}
	if shared < total*3/4 {
		t.Errorf("only %d of %d occurrences were the same object in both runners", shared, total)
	}
}

// trimLog is sinktest.MemLog (retention at will) with the log's Bounds.
type trimLog struct{ *sinktest.MemLog }

func (l trimLog) Bounds() (first, last uint64) {
	_, skipped, _ := l.Read(context.Background(), 1, 0) // records before the first retained one
	return 1 + skipped, l.LastOffset()
}

// The shared source keeps sinks.Source's contract: at most max records,
// retention losses reported as skipped, the head grown without decoding the
// cached records again, and returned slices that a caller cannot use to
// write into the cache.
func TestSinkSourceContract(t *testing.T) {
	ctx := context.Background()
	mem := sinktest.NewMemLog()
	l := &countingLog{followLog: trimLog{mem}}
	src := newSinkSource(l)
	add := func(n int) {
		if err := mem.Append(ctx, sinktest.NewGenerator(uint64(n), "src-").Batch(n)); err != nil {
			t.Fatal(err)
		}
	}
	add(10)
	recs, skipped, err := src.Read(ctx, 1, 4)
	if err != nil || skipped != 0 || len(recs) != 4 || recs[0].Offset != 1 || recs[3].Offset != 4 {
		t.Fatalf("Read(1, max 4) = %d records from %v, skipped %d, %v", len(recs), recs, skipped, err)
	}
	if cap(recs) != len(recs) {
		t.Errorf("returned slice has room (cap %d > len %d): an append would write into the shared chunk", cap(recs), len(recs))
	}
	first := recs[0].Occurrence
	if recs, _, _ = src.Read(ctx, 5, 100); len(recs) != 6 || recs[0].Offset != 5 {
		t.Fatalf("Read(5) = %d records", len(recs))
	}
	if _, last := src.Bounds(); last != 10 {
		t.Errorf("Bounds last = %d, want 10", last)
	}

	// The head chunk grows: only the new records are read.
	add(10)
	decodedBefore := l.decoded.Load()
	recs, _, _ = src.Read(ctx, 11, 100)
	if len(recs) != 10 || recs[0].Offset != 11 {
		t.Fatalf("Read(11) after growth = %d records", len(recs))
	}
	again, _, _ := src.Read(ctx, 1, 100)
	if len(again) != 20 || again[0].Occurrence != first {
		t.Errorf("Read(1) after growth: %d records, same first occurrence %v; want 20, the cached one", len(again), again[0].Occurrence == first)
	}
	if n := l.decoded.Load() - decodedBefore; n != 10 {
		t.Errorf("growing the chunk by 10 and reading it all again read %d records from the log, want 10", n)
	}

	// Retention removed 1..15: a reader at 3 is told it lost 13 records.
	mem.Trim(15)
	recs, skipped, err = src.Read(ctx, 3, 100)
	if err != nil || skipped != 13 || len(recs) == 0 || recs[0].Offset != 16 {
		t.Fatalf("Read(3) after retention = %d records, skipped %d, %v; want from 16, skipped 13", len(recs), skipped, err)
	}
	// Nothing past the head.
	if recs, skipped, err = src.Read(ctx, 21, 100); len(recs) != 0 || skipped != 0 || err != nil {
		t.Errorf("Read(21) = %d records, skipped %d, %v; want nothing", len(recs), skipped, err)
	}
}
