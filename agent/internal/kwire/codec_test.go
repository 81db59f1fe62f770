package kwire

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"
)

// The encoders the API server uses for protobuf: the full serializer (magic
// + Unknown) for bodies and embedded watch objects, the raw serializer with
// the length-delimited framer for the watch stream itself.
func protoSerializer(t testing.TB) runtime.SerializerInfo {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		t.Fatal("no protobuf serializer")
	}
	return info
}

func encodeBody(t testing.TB, obj runtime.Object) []byte {
	t.Helper()
	enc := scheme.Codecs.EncoderForVersion(protoSerializer(t).Serializer, corev1.SchemeGroupVersion)
	var buf bytes.Buffer
	if err := enc.Encode(obj, &buf); err != nil {
		t.Fatalf("encode %T: %v", obj, err)
	}
	return buf.Bytes()
}

func encodeWatch(t testing.TB, evs ...watch.Event) []byte {
	t.Helper()
	info := protoSerializer(t)
	var buf bytes.Buffer
	stream := streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&buf),
		scheme.Codecs.EncoderForVersion(info.StreamSerializer.Serializer, corev1.SchemeGroupVersion))
	enc := restclientwatch.NewEncoder(stream, scheme.Codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion))
	for i := range evs {
		if err := enc.Encode(&evs[i]); err != nil {
			t.Fatalf("encode watch event: %v", err)
		}
	}
	return buf.Bytes()
}

// marshal is the typed object's own generated Marshal.
func marshal(t testing.TB, m interface{ Marshal() ([]byte, error) }) []byte {
	t.Helper()
	b, err := m.Marshal()
	if err != nil {
		t.Fatalf("marshal %T: %v", m, err)
	}
	return b
}

// normTime makes times comparable with reflect.DeepEqual: Equal times get
// the same representation (UTC), zero stays zero.
func normTime(t *time.Time) {
	if t.IsZero() {
		*t = time.Time{}
	} else {
		*t = t.UTC()
	}
}

func normEvent(e *Event) {
	normTime(&e.FirstTimestamp)
	normTime(&e.LastTimestamp)
	normTime(&e.EventTime)
	normTime(&e.SeriesLastObserved)
}

func sameEvent(t testing.TB, name string, got, want *Event) {
	t.Helper()
	g, w := *got, *want
	normEvent(&g)
	normEvent(&w)
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s:\n got %s\nwant %s", name, short(g), short(w))
	}
}

// short prints an Event with its message cut (one is 1 MiB).
func short(e Event) string {
	if len(e.Message) > 200 {
		e.Message = e.Message[:200] + "..."
	}
	return fmt.Sprintf("%+v", e)
}
