package kwire

import (
	"strings"
	"time"

	"github.com/eventpipe/eventpipe/enrich"
)

// Event is a decoded core/v1 Event: the enrich view plus what the agent's
// occurrence fingerprint needs.
type Event struct {
	// Event is what the agent hands enrich: Count is series.count when the
	// Event has a series, else count; ReportingComponent/Instance are
	// source.component/host, else reportingController/Instance.
	enrich.Event
	// Count is the core/v1 count field as sent.
	Count int32
	// SeriesCount is series.count, or -1 when the Event has no series.
	SeriesCount int32
}

// eventBytes are the string fields of an Event as sub-slices of its
// message, gathered before one allocation holds them all.
type eventBytes struct {
	name, namespace, uid, rv                              []byte
	invKind, invAPIVersion, invNamespace, invName, invUID []byte
	invFieldPath                                          []byte
	reason, message, typ, action                          []byte
	srcComponent, srcHost, repController, repInstance     []byte
}

// DecodeEvent decodes a core/v1 Event message (the raw of Unwrap, an item of
// ListItems, or a watch event's object) into out, overwriting all of it (the
// caller may reuse out); on error out is left as it was. Nothing in out refers to raw: the strings are copied,
// all of one Event into one allocation (a retained string keeps the Event's
// other strings alive too).
func DecodeEvent(raw []byte, out *Event) error {
	var sb eventBytes
	var count, seriesCount int32
	hasSeries := false
	var first, last, evTime, seriesLast time.Time
	f := newFields(raw)
	for f.next() {
		var err error
		switch f.num {
		case 1:
			var v []byte
			if v, err = f.bytesField(); err == nil {
				err = eventMeta(v, &sb)
			}
			if err != nil {
				return at(err, "Event.metadata")
			}
		case 2:
			var v []byte
			if v, err = f.bytesField(); err == nil {
				err = eventInvolved(v, &sb)
			}
			if err != nil {
				return at(err, "Event.involvedObject")
			}
		case 3:
			sb.reason, err = f.bytesField()
		case 4:
			sb.message, err = f.bytesField()
		case 5:
			var v []byte
			if v, err = f.bytesField(); err == nil {
				g := newFields(v)
				for g.next() && err == nil {
					switch g.num {
					case 1:
						sb.srcComponent, err = g.bytesField()
					case 2:
						sb.srcHost, err = g.bytesField()
					}
				}
				if err == nil {
					err = g.err
				}
			}
			if err != nil {
				return at(err, "Event.source")
			}
		case 6, 7:
			var v []byte
			var t time.Time
			if v, err = f.bytesField(); err == nil {
				t, err = decodeTime(v, false)
			}
			if err != nil {
				if f.num == 6 {
					return at(err, "Event.firstTimestamp")
				}
				return at(err, "Event.lastTimestamp")
			}
			if f.num == 6 {
				first = t
			} else {
				last = t
			}
		case 8:
			var v uint64
			v, err = f.varintField()
			count = int32(v)
		case 9:
			sb.typ, err = f.bytesField()
		case 10:
			var v []byte
			if v, err = f.bytesField(); err == nil {
				evTime, err = decodeTime(v, true)
			}
			if err != nil {
				return at(err, "Event.eventTime")
			}
		case 11:
			var v []byte
			if v, err = f.bytesField(); err == nil {
				hasSeries = true
				g := newFields(v)
				for g.next() && err == nil {
					switch g.num {
					case 1:
						var c uint64
						c, err = g.varintField()
						seriesCount = int32(c)
					case 2:
						var w []byte
						if w, err = g.bytesField(); err == nil {
							seriesLast, err = decodeTime(w, true)
						}
					}
				}
				if err == nil {
					err = g.err
				}
			}
			if err != nil {
				return at(err, "Event.series")
			}
		case 12:
			sb.action, err = f.bytesField()
		case 14:
			sb.repController, err = f.bytesField()
		case 15:
			sb.repInstance, err = f.bytesField()
		}
		if err != nil {
			return at(err, "Event")
		}
	}
	if f.err != nil {
		return at(f.err, "Event")
	}

	comp, inst := sb.srcComponent, sb.srcHost
	if len(comp) == 0 {
		comp = sb.repController
	}
	if len(inst) == 0 {
		inst = sb.repInstance
	}
	parts := [...][]byte{
		sb.namespace, sb.name, sb.uid, sb.rv,
		sb.invKind, sb.invAPIVersion, sb.invNamespace, sb.invName, sb.invUID, sb.invFieldPath,
		sb.typ, sb.reason, sb.message, sb.action, comp, inst,
	}
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var b strings.Builder
	b.Grow(n)
	for _, p := range parts {
		b.Write(p)
	}
	all := b.String()
	var strs [len(parts)]string
	off := 0
	for i, p := range parts {
		strs[i] = all[off : off+len(p)]
		off += len(p)
	}

	// Built on the stack and stored once: one bulk write barrier instead of
	// one per field.
	res := Event{Event: enrich.Event{
		APIVersion: "v1",
		Namespace:  strs[0], Name: strs[1], UID: strs[2], ResourceVersion: strs[3],
		Involved: enrich.ObjectRef{Kind: strs[4], APIVersion: strs[5], Namespace: strs[6], Name: strs[7], UID: strs[8], FieldPath: strs[9]},
		Type:     strs[10], Reason: strs[11], Message: strs[12], Action: strs[13],
		Count:          count,
		FirstTimestamp: first, LastTimestamp: last, EventTime: evTime,
		ReportingComponent: strs[14], ReportingInstance: strs[15],
	}, Count: count, SeriesCount: -1}
	if hasSeries {
		res.Event.Count = seriesCount
		res.SeriesLastObserved = seriesLast
		res.SeriesCount = seriesCount
	}
	*out = res
	return nil
}

func eventMeta(b []byte, sb *eventBytes) error {
	f := newFields(b)
	var err error
	for f.next() && err == nil {
		switch f.num {
		case 1:
			sb.name, err = f.bytesField()
		case 3:
			sb.namespace, err = f.bytesField()
		case 5:
			sb.uid, err = f.bytesField()
		case 6:
			sb.rv, err = f.bytesField()
		}
	}
	if err != nil {
		return err
	}
	return f.err
}

func eventInvolved(b []byte, sb *eventBytes) error {
	f := newFields(b)
	var err error
	for f.next() && err == nil {
		switch f.num {
		case 1:
			sb.invKind, err = f.bytesField()
		case 2:
			sb.invNamespace, err = f.bytesField()
		case 3:
			sb.invName, err = f.bytesField()
		case 4:
			sb.invUID, err = f.bytesField()
		case 5:
			sb.invAPIVersion, err = f.bytesField()
		case 7:
			sb.invFieldPath, err = f.bytesField()
		}
	}
	if err != nil {
		return err
	}
	return f.err
}

// decodeTime decodes a metav1.Time (micro=false) or MicroTime (micro=true)
// message as their generated Unmarshal does: an empty message is the zero
// time; Time keeps whole seconds only; MicroTime truncates nanos to
// microseconds. The result is in time.Local, like client-go's.
func decodeTime(b []byte, micro bool) (time.Time, error) {
	if len(b) == 0 {
		return time.Time{}, nil
	}
	var sec int64
	var nanos int32
	f := newFields(b)
	for f.next() {
		switch f.num {
		case 1, 2:
			v, err := f.varintField()
			if err != nil {
				return time.Time{}, err
			}
			if f.num == 1 {
				sec = int64(v)
			} else {
				nanos = int32(v)
			}
		}
	}
	if f.err != nil {
		return time.Time{}, f.err
	}
	if !micro {
		return time.Unix(sec, 0), nil
	}
	return time.Unix(sec, int64(time.Duration(nanos).Truncate(time.Microsecond))), nil
}
