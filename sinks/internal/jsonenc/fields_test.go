package jsonenc

import (
	"bytes"
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

// TestEveryFieldReachesTheFileJSON: an occurrence with every field of the
// schema set (found by walking the protobuf descriptor) comes out with every
// value under its proto name, and the line reads back into the same
// occurrence. A field added to the schema and not to AppendProtoJSON fails
// here.
func TestEveryFieldReachesTheFileJSON(t *testing.T) {
	o, leaves, err := sinktest.EveryField()
	if err != nil {
		t.Fatal(err)
	}
	b, err := AppendProtoJSON(nil, o)
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("invalid JSON %s: %v", b, err)
	}
	for _, l := range leaves {
		got, ok := sinktest.JSONAt(v, l.Path)
		if !ok || !sinktest.SameValue(l.Value, got) {
			t.Errorf("%s: got %v (present %v), want %v", l.Path, got, ok, l.Value)
		}
	}
	var back = o.ProtoReflect().New().Interface()
	if err := protojson.Unmarshal(b, back); err != nil || !proto.Equal(back, o) {
		t.Errorf("the line does not read back into the occurrence (%v)", err)
	}
}
