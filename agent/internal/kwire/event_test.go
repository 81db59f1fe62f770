package kwire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// The typed path (generated Unmarshal + the agent's conversion) and
// DecodeEvent agree on every fixture.
func TestDecodeEventEquivalence(t *testing.T) {
	fx := eventFixtures()
	var out Event
	for _, name := range sortedNames(fx) {
		b := marshal(t, fx[name])
		var typed corev1.Event
		if err := typed.Unmarshal(b); err != nil {
			t.Fatalf("%s: typed unmarshal: %v", name, err)
		}
		want := refEvent(&typed)
		if err := DecodeEvent(b, &out); err != nil {
			t.Fatalf("%s: DecodeEvent: %v", name, err)
		}
		sameEvent(t, name, &out, want)
	}
}

// Spot checks that the reference itself reads what the fixtures say (so the
// equivalence is not between two identical mistakes).
func TestDecodeEventValues(t *testing.T) {
	fx := eventFixtures()
	var e Event
	if err := DecodeEvent(marshal(t, fx["series"]), &e); err != nil {
		t.Fatal(err)
	}
	if e.Event.Count != 17 || e.Count != 1 || e.SeriesCount != 17 {
		t.Errorf("series counts: enrich %d core %d series %d", e.Event.Count, e.Count, e.SeriesCount)
	}
	if got, want := e.EventTime.UTC(), tNanos.Truncate(1000); !got.Equal(want) {
		t.Errorf("eventTime %v, want %v (microseconds)", got, want)
	}
	if e.SeriesLastObserved.Nanosecond() != 111111000 {
		t.Errorf("series.lastObservedTime nanos %d", e.SeriesLastObserved.Nanosecond())
	}
	if err := DecodeEvent(marshal(t, fx["source-and-reporting"]), &e); err != nil {
		t.Fatal(err)
	}
	if e.ReportingComponent != "default-scheduler" || e.ReportingInstance != "host-from-reporting" || e.SeriesCount != -1 {
		t.Errorf("reporting %q %q series %d", e.ReportingComponent, e.ReportingInstance, e.SeriesCount)
	}
	if e.FirstTimestamp.Nanosecond() != 0 || !e.FirstTimestamp.Equal(tNanos.Truncate(1e9)) {
		t.Errorf("firstTimestamp %v: Time keeps whole seconds", e.FirstTimestamp)
	}
	if err := DecodeEvent(marshal(t, fx["zero-times"]), &e); err != nil {
		t.Fatal(err)
	}
	if !e.FirstTimestamp.IsZero() || !e.LastTimestamp.IsZero() || !e.EventTime.IsZero() || e.Name != "z" {
		t.Errorf("zero times: %+v", e.Event)
	}
	if err := DecodeEvent(marshal(t, fx["invalidutf"]), &e); err != nil {
		t.Fatal(err)
	}
	if e.Message != "bad \xff\xfe\x80 bytes \xc3" {
		t.Errorf("invalid UTF-8 changed: %q", e.Message)
	}
}

// No string of a decoded Event refers to the input buffer.
func TestDecodeEventCopies(t *testing.T) {
	b := marshal(t, eventFixtures()["backoff"])
	var e Event
	if err := DecodeEvent(b, &e); err != nil {
		t.Fatal(err)
	}
	want := e.Event
	want.Message = strings.Clone(e.Message)
	want.Name = strings.Clone(e.Name)
	for i := range b {
		b[i] = 'Z'
	}
	if e.Message != want.Message || e.Name != want.Name {
		t.Errorf("decoded strings changed with the input buffer: %q", e.Name)
	}
}

// The reused out is overwritten entirely (a series Event followed by one
// without series must not keep the series values).
func TestDecodeEventReusesOut(t *testing.T) {
	fx := eventFixtures()
	var e Event
	for _, name := range []string{"series", "empty", "events.k8s.io", "pulling"} {
		if err := DecodeEvent(marshal(t, fx[name]), &e); err != nil {
			t.Fatal(err)
		}
		var typed corev1.Event
		if err := typed.Unmarshal(marshal(t, fx[name])); err != nil {
			t.Fatal(err)
		}
		sameEvent(t, name, &e, refEvent(&typed))
	}
}

// Bodies, lists and watch streams as the API server encodes them.
func TestEventEnvelopes(t *testing.T) {
	fx := eventFixtures()
	names := sortedNames(fx)
	list := &corev1.EventList{ListMeta: metav1.ListMeta{ResourceVersion: "9001", Continue: "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"}}
	var evs []watch.Event
	for i, name := range names {
		list.Items = append(list.Items, *fx[name])
		typ := []watch.EventType{watch.Added, watch.Modified, watch.Deleted}[i%3]
		evs = append(evs, watch.Event{Type: typ, Object: fx[name]})
	}
	bm := &corev1.Event{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "9100", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	evs = append(evs, watch.Event{Type: watch.Bookmark, Object: bm})
	st := &metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version: 5 (9000)"}
	evs = append(evs, watch.Event{Type: watch.Error, Object: st})

	t.Run("body", func(t *testing.T) {
		for _, name := range names {
			body := encodeBody(t, fx[name])
			av, kind, raw, err := Unwrap(body)
			if err != nil || av != "v1" || kind != "Event" {
				t.Fatalf("%s: Unwrap: %q %q %v", name, av, kind, err)
			}
			var got Event
			if err := DecodeEvent(raw, &got); err != nil {
				t.Fatal(err)
			}
			var typed corev1.Event
			if err := typed.Unmarshal(raw); err != nil {
				t.Fatal(err)
			}
			sameEvent(t, name, &got, refEvent(&typed))
		}
	})
	t.Run("list", func(t *testing.T) {
		av, kind, raw, err := Unwrap(encodeBody(t, list))
		if err != nil || av != "v1" || kind != "EventList" {
			t.Fatalf("Unwrap: %q %q %v", av, kind, err)
		}
		i := 0
		lm, err := ListItems(raw, func(item []byte) error {
			var got Event
			if err := DecodeEvent(item, &got); err != nil {
				return err
			}
			sameEvent(t, names[i], &got, typedEvent(t, &list.Items[i]))
			i++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if lm != (ListMeta{ResourceVersion: "9001", Continue: list.Continue}) || i != len(names) {
			t.Errorf("list meta %+v, %d items", lm, i)
		}
		stop := errors.New("stop")
		if _, err := ListItems(raw, func([]byte) error { return stop }); err != stop {
			t.Errorf("item error not returned as is: %v", err)
		}
	})
	t.Run("watch", func(t *testing.T) {
		stream := encodeWatch(t, evs...)
		r := bufio.NewReader(bytes.NewReader(stream))
		var buf []byte
		for i, want := range evs {
			frame, err := ReadFrame(r, buf, 4<<20)
			if err != nil {
				t.Fatalf("frame %d: %v", i, err)
			}
			buf = frame
			typ, obj, err := DecodeWatchEvent(frame)
			if err != nil {
				t.Fatalf("frame %d: %v", i, err)
			}
			if typ != string(want.Type) {
				t.Errorf("frame %d: type %q, want %q", i, typ, want.Type)
			}
			switch want.Type {
			case watch.Bookmark:
				rv, end, err := BookmarkInfo(obj)
				if err != nil || rv != "9100" || !end {
					t.Errorf("bookmark: %q %v %v", rv, end, err)
				}
			case watch.Error:
				s, err := DecodeStatus(obj)
				if err != nil {
					t.Fatal(err)
				}
				if s.Code != 410 || s.Reason != "Expired" || s.Message != st.Message || !s.Expired() || s.Error() != st.Message {
					t.Errorf("status %+v", s)
				}
			default:
				var got Event
				if err := DecodeEvent(obj, &got); err != nil {
					t.Fatal(err)
				}
				sameEvent(t, names[i], &got, typedEvent(t, want.Object.(*corev1.Event)))
			}
		}
		if _, err := ReadFrame(r, buf, 4<<20); err != io.EOF {
			t.Errorf("after the last frame: %v, want io.EOF", err)
		}
	})
}

// typedEvent is the reference result for e as it arrives: e's own encoding
// decoded by the typed path (times lose precision on the wire), converted.
func typedEvent(t testing.TB, e *corev1.Event) *Event {
	t.Helper()
	var typed corev1.Event
	if err := typed.Unmarshal(marshal(t, e)); err != nil {
		t.Fatal(err)
	}
	return refEvent(&typed)
}
