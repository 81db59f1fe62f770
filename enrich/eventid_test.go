package enrich

import (
	"strings"
	"testing"
	"time"
)

// An Event without uid gets an id of its own, stable for the same object
// version, and never the "/<rv>" every such Event used to share (two
// different Events then de-duplicated into one at the collector).
func TestEventIDWithoutUID(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	id := func(mod func(ev *Event)) string {
		ev := podEvent("img-missing", "spec.containers{agent}", "Failed", seedFailed)
		ev.UID = ""
		mod(ev)
		return e.Enrich(ev, t0).Occurrence.EventId
	}
	base := id(func(*Event) {})
	if base != "nouid/"+seedNS+"/img-missing.18a2f0c1/1" {
		t.Errorf("event_id %q, want nouid/<namespace>/<name>/<rv>", base)
	}
	cases := []struct {
		name string
		mod  func(ev *Event)
		same bool
	}{
		{"same object version seen later", func(*Event) {}, true},
		{"another Event", func(ev *Event) { ev.Name = "other.18a2f0c2" }, false},
		{"same Event, next version", func(ev *Event) { ev.ResourceVersion = "2" }, false},
		{"same name in another namespace", func(ev *Event) { ev.Namespace = "elsewhere" }, false},
	}
	for _, tc := range cases {
		if got := id(tc.mod); (got == base) != tc.same {
			t.Errorf("%s: event_id %q vs %q, same=%v want %v", tc.name, got, base, got == base, tc.same)
		}
	}

	// No name and no resourceVersion either: a hash of what the Event says
	// tells different Events apart, and is the same for the same one.
	bare := func(mod func(ev *Event)) string {
		return id(func(ev *Event) { ev.Name, ev.ResourceVersion = "", ""; mod(ev) })
	}
	a, again := bare(func(*Event) {}), bare(func(*Event) {})
	if a != again {
		t.Errorf("the same bare Event got %q then %q", a, again)
	}
	for name, mod := range map[string]func(ev *Event){
		"message":   func(ev *Event) { ev.Message += "!" },
		"count":     func(ev *Event) { ev.Count = 2 },
		"last time": func(ev *Event) { ev.LastTimestamp = ev.LastTimestamp.Add(time.Second) },
		"object":    func(ev *Event) { ev.Involved.Name = "other" },
	} {
		if b := bare(mod); b == a {
			t.Errorf("bare Events differing in %s share event_id %q", name, a)
		}
	}
	// The time the agent saw it is not part of the id.
	ev := podEvent("img-missing", "", "Failed", seedFailed)
	ev.UID, ev.Name, ev.ResourceVersion = "", "", ""
	if x, y := e.Enrich(ev, t0).Occurrence.EventId, e.Enrich(ev, t0.Add(time.Hour)).Occurrence.EventId; x != y {
		t.Errorf("event_id depends on when the Event was seen: %q vs %q", x, y)
	}
	if strings.HasPrefix(a, "/") || strings.HasPrefix(base, "/") {
		t.Errorf("event_id starts with / : %q %q", a, base)
	}
}

// Issue 21 defect 6: an Event with a uid but no resourceVersion (a file or
// a replay) got "<uid>/" for every version, so the collector kept only the
// first. Each version now gets an id of its own, from what changes between
// versions; the same version read again gets the same id.
func TestEventIDWithoutResourceVersion(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	id := func(mod func(ev *Event)) string {
		ev := podEvent("img-missing", "spec.containers{agent}", "Failed", seedFailed)
		ev.ResourceVersion = ""
		mod(ev)
		return e.Enrich(ev, t0).Occurrence.EventId
	}
	base := id(func(*Event) {})
	uid := podEvent("img-missing", "spec.containers{agent}", "Failed", seedFailed).UID
	if !strings.HasPrefix(base, uid+"/norv-") || len(base) == len(uid)+len("/norv-") {
		t.Fatalf("event_id %q, want %s/norv-<hash>", base, uid)
	}
	if again := id(func(*Event) {}); again != base {
		t.Errorf("the same version read twice: %q then %q", base, again)
	}
	for name, mod := range map[string]func(ev *Event){
		"count bumped":        func(ev *Event) { ev.Count++ },
		"lastTimestamp moved": func(ev *Event) { ev.LastTimestamp = ev.LastTimestamp.Add(time.Minute) },
		"series observed":     func(ev *Event) { ev.SeriesLastObserved = t0.Add(time.Minute) },
		"message changed":     func(ev *Event) { ev.Message += " (again)" },
	} {
		if got := id(mod); got == base {
			t.Errorf("%s: the next version shares event_id %q", name, base)
		}
	}
	// Seen later, the same version keeps its id (observed time is no part).
	ev := podEvent("img-missing", "spec.containers{agent}", "Failed", seedFailed)
	ev.ResourceVersion = ""
	if x, y := e.Enrich(ev, t0).Occurrence.EventId, e.Enrich(ev, t0.Add(time.Hour)).Occurrence.EventId; x != y {
		t.Errorf("event_id depends on when the Event was seen: %q vs %q", x, y)
	}
}

// A pod without uid: its pod-status diagnosis is named by namespace, pod
// name, resourceVersion and container.
func TestDiagnosePodWithoutUID(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	w := seedWorld()
	var p *Pod
	for _, c := range w.pods {
		for _, ct := range c.Containers {
			if ct.WaitingReason != "" {
				p = c
			}
		}
	}
	if p == nil {
		t.Fatal("no seed pod with a waiting container")
	}
	cp := *p
	cp.UID = ""
	occs := e.DiagnosePod(&cp, t0)
	if len(occs) == 0 {
		t.Fatal("no diagnosis")
	}
	want := "nouid/" + cp.Namespace + "/" + cp.Name + "/" + cp.ResourceVersion + "/"
	if id := occs[0].EventId; !strings.HasPrefix(id, want) {
		t.Errorf("event_id %q, want prefix %q", id, want)
	}
}
