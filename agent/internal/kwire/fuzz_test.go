package kwire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// The fuzz targets check that no input panics, that every refusal is an
// *Error, and, where the typed path also accepts the input, that both give
// the same result. (The generated decoders accept a few malformed shapes
// kwire refuses, e.g. a map entry whose key runs past the entry, so a
// refusal alone is not a failure.)

func isKwireError(t *testing.T, err error) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %T %v is not a *kwire.Error", err, err)
	}
}

func FuzzDecodeEvent(f *testing.F) {
	for _, name := range sortedNames(eventFixtures()) {
		if name == "big" {
			continue // 1 MiB: slows every fuzz iteration down
		}
		f.Add(marshal(f, eventFixtures()[name]))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got Event
		err := DecodeEvent(b, &got)
		if err != nil {
			isKwireError(t, err)
			return
		}
		var typed corev1.Event
		if typed.Unmarshal(b) != nil {
			return
		}
		sameEvent(t, "fuzz", &got, refEvent(&typed))
	})
}

func FuzzDecodePod(f *testing.F) {
	for _, name := range sortedNames(podFixtures()) {
		f.Add(marshal(f, podFixtures()[name]))
	}
	o := &MetaOptions{KeepPrefixes: keepPrefix}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, waiting, err := DecodePod(b, o)
		if err != nil {
			isKwireError(t, err)
			return
		}
		var typed corev1.Pod
		if typed.Unmarshal(b) != nil {
			return
		}
		want, wantWaiting := refOf(o).pod(&typed)
		if !reflect.DeepEqual(got, want) || waiting != wantWaiting {
			t.Fatalf("got %+v %v\nwant %+v %v", got, waiting, want, wantWaiting)
		}
	})
}

func FuzzDecodeMetaOnly(f *testing.F) {
	for _, p := range pvcFixtures() {
		f.Add(marshal(f, p))
	}
	for _, n := range namespaceFixtures() {
		f.Add(marshal(f, n))
	}
	o := &MetaOptions{KeepPrefixes: keepPrefix}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeNamespace(b, o)
		if err != nil {
			isKwireError(t, err)
			return
		}
		var typed corev1.Namespace
		if typed.Unmarshal(b) != nil {
			return
		}
		if want := refOf(o).enrichMeta(&typed.ObjectMeta); !reflect.DeepEqual(got.Meta, want) {
			t.Fatalf("got %+v\nwant %+v", got.Meta, want)
		}
	})
}

// FuzzUnwrap covers the envelopes: Unwrap, DecodeWatchEvent (and the
// embedded object's envelope), BookmarkInfo and DecodeStatus on whatever
// they unwrap.
func FuzzUnwrap(f *testing.F) {
	ev := eventFixtures()["series"]
	f.Add(encodeBody(f, ev))
	f.Add(encodeBody(f, &corev1.EventList{Items: []corev1.Event{*ev}}))
	stream := encodeWatch(f,
		watch.Event{Type: watch.Added, Object: ev},
		watch.Event{Type: watch.Bookmark, Object: &corev1.Event{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "9", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}},
		watch.Event{Type: watch.Error, Object: &metav1.Status{Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old"}})
	r := bufio.NewReader(bytes.NewReader(stream))
	for {
		frame, err := ReadFrame(r, nil, 1<<20)
		if err != nil {
			break
		}
		f.Add(frame)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		av, kind, raw, err := Unwrap(b)
		if err != nil {
			isKwireError(t, err)
		} else if len(b) >= 4 {
			var unk runtime.Unknown
			if unk.Unmarshal(b[4:]) == nil && (unk.APIVersion != av || unk.Kind != kind || !bytes.Equal(unk.Raw, raw)) {
				t.Fatalf("Unwrap %q %q %x, typed %q %q %x", av, kind, raw, unk.APIVersion, unk.Kind, unk.Raw)
			}
		}
		typ, obj, err := DecodeWatchEvent(b)
		if err != nil {
			isKwireError(t, err)
			return
		}
		var we metav1.WatchEvent
		if !bytes.HasPrefix(b, []byte(magic)) && we.Unmarshal(b) == nil && we.Type != typ {
			t.Fatalf("type %q, typed %q", typ, we.Type)
		}
		rv, end, err := BookmarkInfo(obj)
		var typedEv corev1.Event
		if err != nil {
			isKwireError(t, err)
		} else if typedEv.Unmarshal(obj) == nil {
			if typed := &typedEv; rv != typed.ResourceVersion || end != (typed.Annotations[metav1.InitialEventsAnnotationKey] == "true") {
				t.Fatalf("bookmark %q %v, typed %q %v", rv, end, typed.ResourceVersion, typed.Annotations)
			}
		}
		s, err := DecodeStatus(obj)
		var typed metav1.Status
		if err != nil {
			isKwireError(t, err)
		} else if typed.Unmarshal(obj) == nil {
			want := &Status{Code: typed.Code, Reason: string(typed.Reason), Message: typed.Message}
			if d := typed.Details; d != nil {
				want.RetryAfterSeconds = d.RetryAfterSeconds
				for _, c := range d.Causes {
					want.Causes = append(want.Causes, Cause{Type: string(c.Type), Message: c.Message, Field: c.Field})
				}
			}
			if !equalStatus(s, want) {
				t.Fatalf("status %+v, typed %+v", s, want)
			}
		}
	})
}

func FuzzListItems(f *testing.F) {
	ev := eventFixtures()["pulling"]
	for _, l := range []*corev1.EventList{
		{ListMeta: metav1.ListMeta{ResourceVersion: "10", Continue: "c"}, Items: []corev1.Event{*ev, *eventFixtures()["series"]}},
		{},
	} {
		f.Add(marshal(f, l))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n := 0
		var out Event
		lm, err := ListItems(b, func(item []byte) error {
			n++
			return DecodeEvent(item, &out)
		})
		if err != nil {
			isKwireError(t, err)
			return
		}
		var typed corev1.EventList
		if typed.Unmarshal(b) != nil {
			return
		}
		if n != len(typed.Items) || lm.ResourceVersion != typed.ResourceVersion || lm.Continue != typed.Continue {
			t.Fatalf("%d items %+v, typed %d items %q %q", n, lm, len(typed.Items), typed.ResourceVersion, typed.Continue)
		}
	})
}

// FuzzSandboxJSON compares with the unstructured path on the canonical
// re-encoding of what unstructured read (encoding/json matches keys
// case-insensitively, unstructured does not: the API server only writes
// canonical JSON).
func FuzzSandboxJSON(f *testing.F) {
	for _, s := range sandboxFixtures() {
		f.Add([]byte(s))
	}
	o := &MetaOptions{KeepPrefixes: keepPrefix}
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := DecodeSandboxJSON(b, o, podNameAnn); err != nil {
			isKwireError(t, err)
		}
		for _, fn := range []func([]byte) error{
			func(b []byte) error { _, _, err := DecodeWatchEventJSON(b); return err },
			func(b []byte) error { _, err := ListItemsJSON(b, func([]byte) error { return nil }); return err },
			func(b []byte) error { _, err := DecodeStatusJSON(b); return err },
			func(b []byte) error { _, _, err := BookmarkInfoJSON(b); return err },
			func(b []byte) error { _, err := DecodeAPIResourceNamesJSON(b); return err },
		} {
			if err := fn(b); err != nil {
				isKwireError(t, err)
			}
		}
		var u unstructured.Unstructured
		if u.UnmarshalJSON(b) != nil {
			return
		}
		canon, err := json.Marshal(u.Object)
		if err != nil {
			return
		}
		got, err := DecodeSandboxJSON(canon, o, podNameAnn)
		if err != nil {
			return // a type unstructured tolerates (e.g. a numeric label value)
		}
		if want := refOf(o).sandbox(&u); !reflect.DeepEqual(got, want) {
			t.Fatalf("got %+v\nwant %+v", got, want)
		}
	})
}
