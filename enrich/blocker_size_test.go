package enrich

import (
	"testing"
	"unsafe"
)

// Occurrence.blocker added a pointer to every occurrence: the occurrence's
// one allocation (TestEnrichOneAllocation) must still fit its size class,
// with the allocator's 8-byte header for objects with pointers above 512
// bytes, or every event pays the next class (measured: 896 -> 1,024 and
// 1,152 -> 1,280 bytes per event before the event_id buffer shrank).
func TestOccurrenceSizeClass(t *testing.T) {
	const header = 8
	for _, c := range []struct {
		name        string
		size, class uintptr
	}{
		{"plain", unsafe.Sizeof(occAlloc{}), 896},
		{"progress", unsafe.Sizeof(occProgressAlloc{}), 1024},
		// 1,152 until PullFailure gained decided_by and confidence (32
		// bytes): pull failures are a small share of events, and the
		// larger class costs them no second allocation.
		{"pull failure", unsafe.Sizeof(occPullAlloc{}), 1280},
	} {
		if c.size+header > c.class {
			t.Errorf("%s occurrence: %d bytes + %d header > the %d-byte size class", c.name, c.size, header, c.class)
		}
	}
}
