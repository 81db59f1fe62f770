package collector

import (
	"context"
	"fmt"
	"sync"
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// The cache returns what the log returns, for any start, while the log
// grows (partial chunks are refreshed), and under concurrent readers.
func TestChunkCacheMatchesTheLog(t *testing.T) {
	st := openTestStore(t)
	ctx := context.Background()
	add := func(from, n int) {
		var occs []*eventpipev1.Occurrence
		for i := range n {
			occs = append(occs, occ(fmt.Sprintf("c-%d", from+i), "sb", "ws1", "n", "gw"))
		}
		if _, err := st.Append(ctx, "c", "events", "", occs); err != nil {
			t.Fatal(err)
		}
	}
	c := newChunkCache(st, 64, 4)
	check := func(from uint64) {
		t.Helper()
		got, gs, err := c.Read(ctx, from)
		if err != nil {
			t.Fatal(err)
		}
		want, ws, _ := st.Read(ctx, from, 64)
		if gs != ws || len(got) == 0 && len(want) != 0 || len(got) > 0 && (got[0].Offset != want[0].Offset || got[len(got)-1].Offset > want[len(want)-1].Offset) {
			t.Fatalf("from %d: cache %d records (skipped %d), log %d (skipped %d)", from, len(got), gs, len(want), ws)
		}
		for i, r := range got {
			if r.Offset != from+uint64(i) || r.Occurrence.GetEventId() != want[i].Occurrence.GetEventId() {
				t.Fatalf("from %d: record %d = %d %s, want %d %s", from, i, r.Offset, r.Occurrence.GetEventId(), want[i].Offset, want[i].Occurrence.GetEventId())
			}
		}
	}
	add(1, 10)
	check(1)
	check(5)
	add(11, 100) // the first chunk grew from 10 to 64 records
	check(5)
	check(11)
	for from := uint64(1); from <= 110; from += 7 {
		check(from)
	}
	check(111) // nothing yet
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for from := uint64(1 + g); from <= 110; from += 3 {
				if recs, _, err := c.Read(ctx, from); err != nil || len(recs) == 0 || recs[0].Offset != from {
					t.Errorf("concurrent read from %d: %d records, %v", from, len(recs), err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
