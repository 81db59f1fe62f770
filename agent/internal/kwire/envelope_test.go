package kwire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// The API server's watch frames are the raw WatchEvent (no magic); its
// object is a full body (magic + Unknown). DecodeWatchEvent also takes a
// frame wrapped in its own envelope.
func TestWatchFrameShapes(t *testing.T) {
	ev := eventFixtures()["pulling"]
	stream := encodeWatch(t, watch.Event{Type: watch.Added, Object: ev})
	frame, err := ReadFrame(bufio.NewReader(bytes.NewReader(stream)), nil, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.HasPrefix(frame, []byte(magic)) {
		t.Errorf("encoder wrote a magic prefix on the frame: the test encoder is not the API server's")
	}
	var we metav1.WatchEvent
	if err := we.Unmarshal(frame); err != nil {
		t.Fatalf("frame is not a raw WatchEvent: %v", err)
	}
	if !bytes.HasPrefix(we.Object.Raw, []byte(magic)) {
		t.Errorf("embedded object without the magic prefix")
	}
	unk := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "v1", Kind: "WatchEvent"}, Raw: frame}
	wrapped := append([]byte(magic), marshal(t, &unk)...)
	for name, msg := range map[string][]byte{"raw": frame, "enveloped": wrapped} {
		typ, obj, err := DecodeWatchEvent(msg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got Event
		if err := DecodeEvent(obj, &got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if typ != "ADDED" || got.Name != ev.Name {
			t.Errorf("%s: %s %q", name, typ, got.Name)
		}
	}
	// An envelope around something else is refused.
	if _, _, err := DecodeWatchEvent(encodeBody(t, ev)); err == nil || !strings.Contains(err.Error(), `kind "Event"`) {
		t.Errorf("enveloped Event as a WatchEvent: %v", err)
	}
}

func TestReadFrame(t *testing.T) {
	frame := func(b []byte) []byte {
		out := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
		return append(out, b...)
	}
	var stream []byte
	stream = append(stream, frame([]byte("one"))...)
	stream = append(stream, frame(nil)...)
	stream = append(stream, frame([]byte("three33"))...)
	r := bufio.NewReader(bytes.NewReader(stream))
	buf := make([]byte, 0, 16)
	for _, want := range []string{"one", "", "three33"} {
		got, err := ReadFrame(r, buf, 16)
		if err != nil || string(got) != want {
			t.Fatalf("ReadFrame = %q, %v; want %q", got, err, want)
		}
		if cap(got) > 0 && &got[:1][0] != &buf[:1][0] {
			t.Errorf("buf not reused")
		}
	}
	if _, err := ReadFrame(r, buf, 16); err != io.EOF {
		t.Errorf("at the end: %v, want io.EOF", err)
	}

	// Limits: a huge length is refused before any allocation.
	huge := binary.BigEndian.AppendUint32(nil, 0xfffffff0)
	br := bytes.NewReader(huge)
	hr := bufio.NewReader(br)
	allocs := testing.AllocsPerRun(10, func() {
		br.Reset(huge)
		hr.Reset(br)
		_, err := ReadFrame(hr, nil, 1<<20)
		if err == nil {
			t.Fatal("huge frame accepted")
		}
	})
	if allocs > 6 {
		t.Errorf("%.0f allocations for a refused frame", allocs)
	}
	_, err := ReadFrame(bufio.NewReader(bytes.NewReader(huge)), nil, 1<<20)
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(err.Error(), "exceeds the limit") {
		t.Errorf("huge frame: %v", err)
	}
	// Truncation in the header and in the body.
	for _, b := range [][]byte{{0, 0}, frame([]byte("abcdef"))[:7]} {
		if _, err := ReadFrame(bufio.NewReader(bytes.NewReader(b)), nil, 100); err != io.ErrUnexpectedEOF {
			t.Errorf("truncated %x: %v, want io.ErrUnexpectedEOF", b, err)
		}
	}
}

// Every prefix of a valid message is either decoded or refused with an
// *Error; none panics. Lengths past the end name what was being decoded.
func TestTruncatedInputs(t *testing.T) {
	ev := eventFixtures()["series"]
	body := encodeBody(t, ev)
	list := encodeBody(t, &corev1.EventList{Items: []corev1.Event{*ev, *ev}})
	_, _, listRaw, _ := Unwrap(list)
	frame := encodeWatch(t, watch.Event{Type: watch.Modified, Object: ev})[4:]
	status := marshal(t, &metav1.Status{Code: 400, Reason: "BadRequest", Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "FieldValueNotSupported", Field: "sendInitialEvents"}}}})
	raw := marshal(t, ev)
	var out Event
	decoders := map[string]func([]byte) error{
		"Unwrap":           func(b []byte) error { _, _, _, err := Unwrap(b); return err },
		"DecodeWatchEvent": func(b []byte) error { _, _, err := DecodeWatchEvent(b); return err },
		"ListItems": func(b []byte) error {
			_, err := ListItems(b, func(it []byte) error { return DecodeEvent(it, &out) })
			return err
		},
		"DecodeStatus": func(b []byte) error { _, err := DecodeStatus(b); return err },
		"DecodeEvent":  func(b []byte) error { return DecodeEvent(b, &out) },
		"BookmarkInfo": func(b []byte) error { _, _, err := BookmarkInfo(b); return err },
	}
	inputs := map[string][]byte{"Unwrap": body, "DecodeWatchEvent": frame, "ListItems": listRaw, "DecodeStatus": status, "DecodeEvent": raw, "BookmarkInfo": raw}
	for name, dec := range decoders {
		full := inputs[name]
		if err := dec(full); err != nil {
			t.Fatalf("%s: full input: %v", name, err)
		}
		refused := 0
		for n := 0; n < len(full); n++ {
			err := dec(full[:n:n])
			if err == nil {
				continue
			}
			refused++
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("%s[:%d]: error %T %v is not a *kwire.Error", name, n, err, err)
			}
		}
		if refused == 0 {
			t.Errorf("%s: no prefix refused", name)
		}
	}
	// A nested length past the end names its path.
	err := DecodeEvent(raw[:len(raw)-3], &out)
	if err == nil || !strings.HasPrefix(err.Error(), "kwire: Event") || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated Event: %v", err)
	}
}

func TestStatus(t *testing.T) {
	in := &metav1.Status{Status: metav1.StatusFailure, Code: 422, Reason: metav1.StatusReasonInvalid, Message: `Event "x" is invalid`,
		Details: &metav1.StatusDetails{Name: "x", Kind: "Event", RetryAfterSeconds: 3, Causes: []metav1.StatusCause{
			{Type: metav1.CauseTypeFieldValueInvalid, Message: "Invalid value", Field: "metadata.name"},
			{Type: metav1.CauseTypeFieldValueNotSupported, Message: "not supported", Field: "sendInitialEvents"},
		}}}
	s, err := DecodeStatus(marshal(t, in))
	if err != nil {
		t.Fatal(err)
	}
	want := &Status{Code: 422, Reason: "Invalid", Message: in.Message, RetryAfterSeconds: 3, Causes: []Cause{
		{Type: "FieldValueInvalid", Message: "Invalid value", Field: "metadata.name"},
		{Type: "FieldValueNotSupported", Message: "not supported", Field: "sendInitialEvents"},
	}}
	if !equalStatus(s, want) {
		t.Errorf("got %+v\nwant %+v", s, want)
	}
	if s.Expired() || s.Error() != in.Message {
		t.Errorf("Expired %v Error %q", s.Expired(), s.Error())
	}
	if got := (&Status{Code: 500}).Error(); got != "status 500" {
		t.Errorf("Error without message: %q", got)
	}
}

func equalStatus(a, b *Status) bool {
	if a.Code != b.Code || a.Reason != b.Reason || a.Message != b.Message || a.RetryAfterSeconds != b.RetryAfterSeconds || len(a.Causes) != len(b.Causes) {
		return false
	}
	for i := range a.Causes {
		if a.Causes[i] != b.Causes[i] {
			return false
		}
	}
	return true
}
