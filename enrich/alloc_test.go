package enrich

import (
	"strings"
	"testing"
	"time"
)

// The occurrence and its parts share one allocation, and event_id's bytes
// live in it when they fit: each occurrence must still be independent of
// every other, and event_id exact at the edge of the buffer.
func TestEventIDInBlock(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	for _, uidLen := range []int{1, 36, eventIDBytes - 2, eventIDBytes - 1, eventIDBytes, eventIDBytes + 1, 300} {
		for _, rv := range []string{"7", "123456789"} { // "": TestEventIDWithoutResourceVersion
			ev := podEvent("img-missing", "spec.containers{agent}", "Started", "Started container agent")
			ev.UID, ev.ResourceVersion = strings.Repeat("u", uidLen), rv
			if got, want := e.Enrich(ev, t0).Occurrence.EventId, ev.UID+"/"+rv; got != want {
				t.Errorf("uid %d bytes, rv %q: event_id %q, want %q", uidLen, rv, got, want)
			}
		}
	}
	a := e.Enrich(podEvent("img-missing", "", "Scheduled", "Successfully assigned"), t0).Occurrence
	ev := podEvent("img-missing", "spec.initContainers{workspace-init}", "Failed", seedFailed)
	ev.UID = "other-uid"
	b := e.Enrich(ev, t0).Occurrence
	if a.EventId != "ev-img-missing-Scheduled/1" || b.EventId != "other-uid/1" {
		t.Fatalf("event ids %q %q", a.EventId, b.EventId)
	}
	if a.Progress == nil || b.PullFailure == nil || a.Sandbox == b.Sandbox || a.Event == b.Event {
		t.Fatalf("parts shared or missing: %+v %+v", a, b)
	}
}

// Every kind of occurrence (plain, with a pull failure, with progress)
// costs one allocation.
func TestEnrichOneAllocation(t *testing.T) {
	m, ids := benchWorld(4)
	events := benchEvents(ids)
	e := mustNew(t, NewDefaultConfig(), m.lookups())
	observed := t0.Add(time.Hour)
	for _, ev := range events {
		e.Enrich(ev, observed) // tracker entries exist from here on
	}
	kinds := map[string]bool{}
	for _, ev := range events[:12] {
		o := e.Enrich(ev, observed).Occurrence
		switch {
		case o.PullFailure != nil:
			kinds["pull"] = true
		case o.Progress != nil:
			kinds["progress"] = true
		default:
			kinds["plain"] = true
		}
		if n := testing.AllocsPerRun(20, func() { e.Enrich(ev, observed) }); n != 1 {
			t.Errorf("%s %s: %v allocations, want 1", ev.Reason, ev.Involved.FieldPath, n)
		}
	}
	if len(kinds) != 3 {
		t.Fatalf("the mix covers %v, want plain, pull and progress", kinds)
	}
}
