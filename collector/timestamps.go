package collector

import (
	"fmt"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// timestampName is the full name of google.protobuf.Timestamp.
var timestampName = (&timestamppb.Timestamp{}).ProtoReflect().Descriptor().FullName()

// badTimestamp returns the path and the problem of the first
// google.protobuf.Timestamp set in m (at any depth) that is outside the
// range protobuf defines for it (years 1 to 9999, nanos 0 to 999,999,999),
// or "" when every one is valid.
//
// Why at ingest: the JSON encoders (file, Kafka JSON, Loki) cannot write
// such a time, so a sink would drop the record for good after the agent was
// told it is stored. The walk is generic so that a Timestamp field added to
// the schema later is checked without a change here.
func badTimestamp(m protoreflect.Message) (path, problem string) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
			return true
		}
		check := func(at string, sub protoreflect.Message) bool {
			if sub.Descriptor().FullName() == timestampName {
				ts, ok := sub.Interface().(*timestamppb.Timestamp)
				if !ok {
					return true
				}
				if err := ts.CheckValid(); err != nil {
					path, problem = at, fmt.Sprintf("seconds %d, nanos %d: %v", ts.GetSeconds(), ts.GetNanos(), err)
					return false
				}
				return true
			}
			if p, pr := badTimestamp(sub); p != "" {
				path, problem = at+"."+p, pr
				return false
			}
			return true
		}
		name := string(fd.Name())
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				if !check(fmt.Sprintf("%s[%d]", name, i), l.Get(i).Message()) {
					return false
				}
			}
			return true
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			ok := true
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				ok = check(fmt.Sprintf("%s[%v]", name, k.Interface()), mv.Message())
				return ok
			})
			return ok
		default:
			return check(name, v.Message())
		}
	})
	return path, problem
}
