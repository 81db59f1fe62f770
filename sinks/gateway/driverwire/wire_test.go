package driverwire

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// Small builders for fixtures (field numbers spelled out so the fixtures
// read like the layout table).
func s(num protowire.Number, v string) []byte {
	return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), v)
}

func m(num protowire.Number, parts ...[]byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), bytes.Join(parts, nil))
}

func v(num protowire.Number, x uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), x)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

var (
	ready = m(5, s(1, "Ready"), s(2, "False"), s(3, "DependenciesNotReady"), s(950, "unknown-in-condition"), s(4, "Pod exists with phase: Pending"), s(5, "2026-12-01T10:00:00Z"))
	added = Condition{Type: "ImagePulled", Status: "False", Reason: "NotFound", Message: "workload image x cannot be pulled", LastTransitionTime: "2026-12-01T10:00:01Z"}
	patch = Patch{Add: []Condition{added}, ReadySuffix: "[eventpipe] workload image x cannot be pulled"}
)

func addedBytes() []byte {
	return m(5, s(1, added.Type), s(2, added.Status), s(3, added.Reason), s(4, added.Message), s(5, added.LastTransitionTime))
}

func TestPatchSandbox(t *testing.T) {
	readyPatched := m(5, s(1, "Ready"), s(2, "False"), s(3, "DependenciesNotReady"), s(950, "unknown-in-condition"),
		s(4, "Pod exists with phase: Pending "+patch.ReadySuffix), s(5, "2026-12-01T10:00:00Z"))
	other := m(5, s(1, "Suspended"), s(2, "False"), s(4, "left alone"))
	for _, tc := range []struct {
		name    string
		in, out []byte
		p       Patch
	}{
		{
			name: "unknown fields and order kept, condition appended after them, Ready message extended",
			in:   cat(s(1, "id-1"), s(900, "unknown-top"), s(2, "img"), m(5, s(1, "img"), ready, other, v(951, 7)), s(6, "repro")),
			out:  cat(s(1, "id-1"), s(900, "unknown-top"), s(2, "img"), m(5, s(1, "img"), readyPatched, other, v(951, 7), addedBytes()), s(6, "repro")),
			p:    patch,
		},
		{
			name: "no status at all: one is added",
			in:   cat(s(1, "id-1"), s(2, "img")),
			out:  cat(s(1, "id-1"), s(2, "img"), m(5, addedBytes())),
			p:    patch,
		},
		{
			name: "status split in two occurrences: Ready edited where it is, condition in the last",
			in:   cat(s(1, "id-1"), m(5, ready), s(2, "img"), m(5, s(2, "inst"))),
			out:  cat(s(1, "id-1"), m(5, readyPatched), s(2, "img"), m(5, s(2, "inst"), addedBytes())),
			p:    patch,
		},
		{
			name: "Ready=True untouched",
			in:   cat(s(1, "id-1"), m(5, m(5, s(1, "Ready"), s(2, "True"), s(4, "ok")))),
			out:  cat(s(1, "id-1"), m(5, m(5, s(1, "Ready"), s(2, "True"), s(4, "ok")), addedBytes())),
			p:    patch,
		},
		{
			// The status's bytes are a window into the input: appending the
			// condition to them in place wrote over the workspace field
			// after it (in the caller's buffer, and so in the output too).
			name: "Ready=True with a field after the status: the input is not written to",
			in:   cat(s(1, "id-1"), m(5, m(5, s(1, "Ready"), s(2, "True"), s(4, "ok"))), s(6, "workspace-after-the-status")),
			out:  cat(s(1, "id-1"), m(5, m(5, s(1, "Ready"), s(2, "True"), s(4, "ok")), addedBytes()), s(6, "workspace-after-the-status")),
			p:    patch,
		},
		{
			name: "Ready=False without a message gets the suffix alone",
			in:   cat(s(1, "id-1"), m(5, m(5, s(1, "Ready"), s(2, "False"), s(3, "Starting")))),
			out:  cat(s(1, "id-1"), m(5, m(5, s(1, "Ready"), s(2, "False"), s(3, "Starting"), s(4, patch.ReadySuffix)), addedBytes())),
			p:    patch,
		},
		{
			name: "empty patch returns the input",
			in:   cat(s(1, "id-1"), m(5, ready)),
			out:  cat(s(1, "id-1"), m(5, ready)),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The input as a window of a larger buffer, as a gRPC frame's
			// message is: room after it that an append could write into.
			buf := append(append([]byte(nil), tc.in...), bytes.Repeat([]byte{0xee}, 256)...)
			in := buf[:len(tc.in)]
			got, err := PatchSandbox(in, tc.p)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.out) {
				t.Errorf("got  %x\nwant %x", got, tc.out)
			}
			if !bytes.Equal(buf[:len(tc.in)], tc.in) || !bytes.Equal(buf[len(tc.in):], bytes.Repeat([]byte{0xee}, 256)) {
				t.Errorf("the input buffer was written to")
			}
		})
	}
}

func TestPatchResponsesAndWatch(t *testing.T) {
	sb1 := cat(s(1, "id-1"), m(5, ready))
	sb2 := cat(s(1, "id-2"), m(5, ready))
	fn := func(id string) (Patch, bool) { return patch, id == "id-1" }
	list := cat(m(1, sb1), s(900, "list-unknown"), m(1, sb2))
	got, err := PatchListSandboxesResponse(list, fn)
	if err != nil {
		t.Fatal(err)
	}
	p1, _ := PatchSandbox(sb1, patch)
	if want := cat(m(1, p1), s(900, "list-unknown"), m(1, sb2)); !bytes.Equal(got, want) {
		t.Errorf("list: got %x\nwant %x", got, want)
	}
	// Nothing to patch: the very same bytes come back.
	none := func(string) (Patch, bool) { return Patch{}, false }
	if got, _ := PatchGetSandboxResponse(m(1, sb2), none); !bytes.Equal(got, m(1, sb2)) {
		t.Errorf("get without patch changed the message")
	}
	watch := cat(m(1, m(1, sb1)), s(904, "watch-unknown"))
	ev, err := ParseWatchEvent(watch)
	if err != nil || ev.Kind != KindSandbox || ev.SandboxID != "id-1" {
		t.Errorf("ParseWatchEvent snapshot = %+v, %v", ev, err)
	}
	got, err = PatchWatchEvent(watch, fn)
	if err != nil {
		t.Fatal(err)
	}
	if want := cat(m(1, m(1, p1)), s(904, "watch-unknown")); !bytes.Equal(got, want) {
		t.Errorf("watch: got %x\nwant %x", got, want)
	}
	platform := m(3, s(1, "id-1"), m(2, v(1, 5), s(2, "kubernetes"), s(4, "Pulling")))
	if got, _ := PatchWatchEvent(platform, fn); !bytes.Equal(got, platform) {
		t.Errorf("a platform event was edited")
	}
	if ev, err := ParseWatchEvent(platform); err != nil || ev.Kind != KindPlatform || ev.Source != "kubernetes" || ev.SandboxID != "id-1" {
		t.Errorf("ParseWatchEvent platform = %+v, %v", ev, err)
	}
	if ev, err := ParseWatchEvent(m(2, s(1, "id-2"))); err != nil || ev.Kind != KindDeleted || ev.SandboxID != "id-2" {
		t.Errorf("ParseWatchEvent deleted = %+v, %v", ev, err)
	}
	if ev, err := ParseWatchEvent(m(7, s(1, "x"))); err != nil || ev.Kind != KindUnknown {
		t.Errorf("ParseWatchEvent of a newer payload = %+v, %v", ev, err)
	}
}

func TestMalformed(t *testing.T) {
	bad := [][]byte{
		{0x0a, 0x05, 'a'},        // length beyond the end
		{0xff},                   // truncated tag
		m(1, []byte{0x0a, 0x09}), // a sandbox whose inner field is cut
	}
	for _, b := range bad {
		fn := func(string) (Patch, bool) { return patch, true }
		if out, err := PatchGetSandboxResponse(b, fn); !errors.Is(err, ErrMalformed) || !bytes.Equal(out, b) {
			t.Errorf("%x: err %v, out %x: want ErrMalformed and the input back", b, err, out)
		}
		if _, err := ParseWatchEvent(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%x: ParseWatchEvent err %v", b, err)
		}
	}
}

func TestAppendPlatformEvent(t *testing.T) {
	got := AppendPlatformEvent(nil, "id-1", PlatformEvent{TimestampMS: 1700000000123, Source: "kubernetes", Type: "Warning",
		Reason: "Failed", Message: "boom", Metadata: map[string]string{"b": "2", "a": "1"}})
	want := m(3, s(1, "id-1"), m(2, v(1, 1700000000123), s(2, "kubernetes"), s(3, "Warning"), s(4, "Failed"), s(5, "boom"),
		m(6, s(1, "a"), s(2, "1")), m(6, s(1, "b"), s(2, "2"))))
	if !bytes.Equal(got, want) {
		t.Errorf("got  %x\nwant %x", got, want)
	}
}

func FuzzPatch(f *testing.F) {
	f.Add(cat(m(1, cat(s(1, "id-1"), m(5, ready)))))
	f.Add(cat(m(1, m(1, cat(s(1, "id-1"), m(5, ready))))))
	f.Fuzz(func(t *testing.T, b []byte) {
		fn := func(string) (Patch, bool) { return patch, true }
		_, _ = PatchListSandboxesResponse(b, fn)
		_, _ = PatchWatchEvent(b, fn)
		_, _ = ParseWatchEvent(b)
	})
}
