package sinktest

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Leaf is one scalar of an occurrence that EveryField set: the path of
// proto field names to it ("pull_failure.first_seen") and its value, one of
// string, int64, uint64, bool or time.Time.
type Leaf struct {
	Path  string
	Value any
}

// EveryField returns an occurrence with every field of the schema set,
// recursively, each scalar to a value no other scalar has (booleans are
// true), and the leaves it set, in field order. It walks the protobuf
// descriptor, so a field added to api/eventpipe/v1 is populated here without
// anyone remembering to: the encoders' coverage tests then fail until each
// encoder carries it. A field of a kind it cannot fill (repeated, map) is an
// error naming it, so that case is extended here rather than skipped.
func EveryField() (*eventpipev1.Occurrence, []Leaf, error) {
	o := &eventpipev1.Occurrence{}
	f := filler{base: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)}
	if err := f.fill(o.ProtoReflect(), ""); err != nil {
		return nil, nil, err
	}
	return o, f.leaves, nil
}

type filler struct {
	base   time.Time
	n      int
	leaves []Leaf
}

var timestampName = (&timestamppb.Timestamp{}).ProtoReflect().Descriptor().FullName()

func (f *filler) fill(m protoreflect.Message, prefix string) error {
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		path := prefix + string(fd.Name())
		if fd.IsList() || fd.IsMap() {
			return fmt.Errorf("field %s: repeated and map fields are not filled yet: extend sinktest.EveryField", path)
		}
		f.n++
		n := f.n
		switch fd.Kind() {
		case protoreflect.MessageKind:
			if fd.Message().FullName() == timestampName {
				// Distinct instants with distinct sub-second parts, so a
				// dropped or rounded fraction shows.
				t := f.base.Add(time.Duration(n)*time.Minute + time.Duration(n)*time.Millisecond + 7*time.Microsecond)
				m.Set(fd, protoreflect.ValueOfMessage(timestamppb.New(t).ProtoReflect()))
				f.leaves = append(f.leaves, Leaf{path, t})
				continue
			}
			sub := m.Mutable(fd).Message()
			if err := f.fill(sub, path+"."); err != nil {
				return err
			}
		case protoreflect.StringKind:
			v := fmt.Sprintf("v%02d-%s", n, strings.ReplaceAll(path, ".", "-"))
			m.Set(fd, protoreflect.ValueOfString(v))
			f.leaves = append(f.leaves, Leaf{path, v})
		case protoreflect.BoolKind:
			m.Set(fd, protoreflect.ValueOfBool(true))
			f.leaves = append(f.leaves, Leaf{path, true})
		case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
			m.Set(fd, protoreflect.ValueOfInt32(int32(100+n)))
			f.leaves = append(f.leaves, Leaf{path, int64(100 + n)})
		case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
			m.Set(fd, protoreflect.ValueOfInt64(int64(100+n)))
			f.leaves = append(f.leaves, Leaf{path, int64(100 + n)})
		case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
			m.Set(fd, protoreflect.ValueOfUint32(uint32(100+n)))
			f.leaves = append(f.leaves, Leaf{path, uint64(100 + n)})
		case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
			m.Set(fd, protoreflect.ValueOfUint64(uint64(100+n)))
			f.leaves = append(f.leaves, Leaf{path, uint64(100 + n)})
		default:
			return fmt.Errorf("field %s: kind %s is not filled yet: extend sinktest.EveryField", path, fd.Kind())
		}
	}
	return nil
}

// JSONAt returns the member of the decoded JSON value v at the dotted path
// ("pull_failure.first_seen"), and whether it is there.
func JSONAt(v any, path string) (any, bool) {
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// SameValue reports whether got, a value decoded from JSON (with
// json.Decoder.UseNumber or as float64) or a string from elsewhere (a
// label, a header), says the leaf's value. A time matches an RFC 3339
// string of the same instant.
func SameValue(want any, got any) bool {
	switch w := want.(type) {
	case time.Time:
		s, ok := got.(string)
		if !ok {
			return false
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		return err == nil && t.Equal(w)
	case bool:
		b, ok := got.(bool)
		return ok && b == w
	case string:
		s, ok := got.(string)
		return ok && s == w
	case int64, uint64:
		ws := fmt.Sprint(w)
		switch g := got.(type) {
		case json.Number:
			return g.String() == ws
		case float64:
			return fmt.Sprint(int64(g)) == ws && g == float64(int64(g))
		case string: // protojson writes 64-bit integers as strings
			return g == ws
		}
	}
	return false
}
