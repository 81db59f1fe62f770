//go:build !race

package enrich

import (
	"runtime"
	"testing"
	"time"
)

// Occurrence.blocker added a pointer to every occurrence: the occurrence's
// one allocation must still fit its size class (896 bytes plain, 1,024
// with progress, 1,152 with a pull failure, the allocator's header for
// objects with pointers included), or every event pays a larger one.
// (Not under -race, which changes allocation sizes.)
func TestOccurrenceSizeClass(t *testing.T) {
	m, ids := benchWorld(4)
	events := benchEvents(ids)
	e := mustNew(t, NewDefaultConfig(), m.lookups())
	observed := t0.Add(time.Hour)
	for _, ev := range events {
		e.Enrich(ev, observed)
	}
	for _, ev := range events[:12] {
		o := e.Enrich(ev, observed).Occurrence
		limit := uint64(896)
		switch {
		case o.PullFailure != nil:
			limit = 1152
		case o.Progress != nil || e.mayProgress(ev, o.Container):
			limit = 1024
		}
		var a, b runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&a)
		const n = 200
		for range n {
			e.Enrich(ev, observed)
		}
		runtime.ReadMemStats(&b)
		if got := (b.TotalAlloc - a.TotalAlloc) / n; got > limit {
			t.Errorf("%s %s: %d bytes per occurrence, size class %d", ev.Reason, ev.Involved.FieldPath, got, limit)
		}
	}
}
