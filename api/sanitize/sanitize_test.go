package sanitize

import (
	"testing"
	"unicode/utf8"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

func TestValidUTF8(t *testing.T) {
	good := &eventpipev1.Occurrence{EventId: "a/1", Message: "Pulling image \"x\"", Sandbox: &eventpipev1.Sandbox{Id: "s"}}
	if got := ValidUTF8(good); got != good {
		t.Error("a valid occurrence was copied")
	}
	bad := &eventpipev1.Occurrence{EventId: "a/2", Message: "bad\xff", Sandbox: &eventpipev1.Sandbox{Name: "n\xc3("},
		InvolvedObject: &eventpipev1.ObjectRef{FieldPath: "ok"}}
	before := proto.Clone(bad)
	got := ValidUTF8(bad)
	if !proto.Equal(bad, before) {
		t.Error("input was modified")
	}
	if got.GetMessage() != "bad\uFFFD" || got.GetSandbox().GetName() != "n\uFFFD(" || got.GetInvolvedObject().GetFieldPath() != "ok" {
		t.Errorf("got message %q sandbox name %q", got.GetMessage(), got.GetSandbox().GetName())
	}
	if !utf8.ValidString(got.GetMessage()) {
		t.Error("still invalid")
	}
	if _, err := protojson.Marshal(bad); err == nil {
		t.Fatal("protojson accepted invalid UTF-8: the sanitizer would be pointless")
	}
	if _, err := protojson.Marshal(got); err != nil {
		t.Errorf("sanitized occurrence does not marshal: %v", err)
	}
	if ValidUTF8(nil) != nil {
		t.Error("nil in, non-nil out")
	}
}
