// Package sanitize makes occurrences safe to encode: protobuf and protojson
// refuse strings that are not valid UTF-8, and input from the cluster is
// untrusted.
package sanitize

import (
	"strings"
	"unicode/utf8"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ValidUTF8 returns o itself when every string in it is valid UTF-8, else a
// copy in which each invalid byte sequence is replaced by U+FFFD. It never
// modifies o.
func ValidUTF8(o *eventpipev1.Occurrence) *eventpipev1.Occurrence {
	if o == nil || valid(o.ProtoReflect()) {
		return o
	}
	c := proto.Clone(o).(*eventpipev1.Occurrence)
	fix(c.ProtoReflect())
	return c
}

func valid(m protoreflect.Message) bool {
	ok := true
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() || fd.IsMap():
			// The schema has no repeated or map fields of strings today;
			// treat them as needing the slow path to stay safe.
			ok = false
		case fd.Kind() == protoreflect.StringKind:
			ok = utf8.ValidString(v.String())
		case fd.Kind() == protoreflect.MessageKind:
			ok = valid(v.Message())
		}
		return ok
	})
	return ok
}

func fix(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				switch fd.Kind() {
				case protoreflect.StringKind:
					l.Set(i, protoreflect.ValueOfString(strings.ToValidUTF8(l.Get(i).String(), "\uFFFD")))
				case protoreflect.MessageKind:
					fix(l.Get(i).Message())
				}
			}
		case fd.IsMap():
			// No map fields in the schema; nothing to do.
		case fd.Kind() == protoreflect.StringKind:
			if s := v.String(); !utf8.ValidString(s) {
				m.Set(fd, protoreflect.ValueOfString(strings.ToValidUTF8(s, "\uFFFD")))
			}
		case fd.Kind() == protoreflect.MessageKind:
			fix(v.Message())
		}
		return true
	})
}
