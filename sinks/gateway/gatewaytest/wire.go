package gatewaytest

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/encoding/protowire"
)

// This file encodes and decodes the compute driver messages the test parts
// use, independently of sinks/gateway/driverwire (a test that used the
// proxy's own decoder would not catch its mistakes). Numbers are those of
// the layout the proxy pins (docs/openshell.md).

// Condition is a decoded DriverCondition.
type Condition struct {
	Type, Status, Reason, Message, LastTransitionTime string
}

// Sandbox is a decoded DriverSandbox (the fields tests look at).
type Sandbox struct {
	ID, Name, Namespace, Workspace string
	Conditions                     []Condition
	Deleting                       bool
}

// Condition returns the last condition of the given type.
func (s Sandbox) Condition(typ string) (Condition, bool) {
	var c Condition
	ok := false
	for _, x := range s.Conditions {
		if x.Type == typ {
			c, ok = x, true
		}
	}
	return c, ok
}

// PlatformEvent is a decoded DriverPlatformEvent.
type PlatformEvent struct {
	TimestampMS                   int64
	Source, Type, Reason, Message string
	Metadata                      map[string]string
}

// WatchEvent is a decoded WatchSandboxesEvent: exactly one of Sandbox,
// DeletedID, Platform is set.
type WatchEvent struct {
	Sandbox   *Sandbox
	DeletedID string
	// PlatformSandboxID and Platform for a platform event.
	PlatformSandboxID string
	Platform          *PlatformEvent
	Raw               []byte
}

type wfield struct {
	num protowire.Number
	typ protowire.Type
	v   []byte
	n   uint64
}

func split(b []byte) ([]wfield, error) {
	var out []wfield
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		f := wfield{num: num, typ: typ}
		switch typ {
		case protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			f.v, n = v, m
		case protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			f.n, n = v, m
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			n = m
		}
		out = append(out, f)
		b = b[n:]
	}
	return out, nil
}

// DecodeSandbox decodes a DriverSandbox.
func DecodeSandbox(b []byte) (Sandbox, error) {
	fs, err := split(b)
	if err != nil {
		return Sandbox{}, err
	}
	var s Sandbox
	for _, f := range fs {
		switch f.num {
		case 1:
			s.ID = string(f.v)
		case 2:
			s.Name = string(f.v)
		case 3:
			s.Namespace = string(f.v)
		case 6:
			s.Workspace = string(f.v)
		case 5:
			if f.typ != protowire.BytesType {
				continue
			}
			st, err := split(f.v)
			if err != nil {
				return Sandbox{}, err
			}
			for _, g := range st {
				switch g.num {
				case 5:
					c, err := decodeCondition(g.v)
					if err != nil {
						return Sandbox{}, err
					}
					s.Conditions = append(s.Conditions, c)
				case 6:
					s.Deleting = g.n != 0
				}
			}
		}
	}
	return s, nil
}

func decodeCondition(b []byte) (Condition, error) {
	fs, err := split(b)
	if err != nil {
		return Condition{}, err
	}
	var c Condition
	for _, f := range fs {
		switch f.num {
		case 1:
			c.Type = string(f.v)
		case 2:
			c.Status = string(f.v)
		case 3:
			c.Reason = string(f.v)
		case 4:
			c.Message = string(f.v)
		case 5:
			c.LastTransitionTime = string(f.v)
		}
	}
	return c, nil
}

// DecodeWatchEvent decodes a WatchSandboxesEvent.
func DecodeWatchEvent(b []byte) (WatchEvent, error) {
	fs, err := split(b)
	if err != nil {
		return WatchEvent{}, err
	}
	ev := WatchEvent{Raw: b}
	for _, f := range fs {
		if f.num < 1 || f.num > 3 || f.typ != protowire.BytesType {
			continue // a field of a newer layout
		}
		inner, err := split(f.v)
		if err != nil {
			return WatchEvent{}, err
		}
		switch f.num {
		case 1:
			for _, g := range inner {
				if g.num == 1 {
					s, err := DecodeSandbox(g.v)
					if err != nil {
						return WatchEvent{}, err
					}
					ev.Sandbox = &s
				}
			}
		case 2:
			for _, g := range inner {
				if g.num == 1 {
					ev.DeletedID = string(g.v)
				}
			}
		case 3:
			for _, g := range inner {
				switch g.num {
				case 1:
					ev.PlatformSandboxID = string(g.v)
				case 2:
					pe, err := decodePlatform(g.v)
					if err != nil {
						return WatchEvent{}, err
					}
					ev.Platform = &pe
				}
			}
		}
	}
	if ev.Sandbox == nil && ev.DeletedID == "" && ev.Platform == nil {
		return ev, fmt.Errorf("watch event with no known payload")
	}
	return ev, nil
}

func decodePlatform(b []byte) (PlatformEvent, error) {
	fs, err := split(b)
	if err != nil {
		return PlatformEvent{}, err
	}
	pe := PlatformEvent{Metadata: map[string]string{}}
	for _, f := range fs {
		switch f.num {
		case 1:
			pe.TimestampMS = int64(f.n)
		case 2:
			pe.Source = string(f.v)
		case 3:
			pe.Type = string(f.v)
		case 4:
			pe.Reason = string(f.v)
		case 5:
			pe.Message = string(f.v)
		case 6:
			kv, err := split(f.v)
			if err != nil {
				return PlatformEvent{}, err
			}
			var k, v string
			for _, g := range kv {
				switch g.num {
				case 1:
					k = string(g.v)
				case 2:
					v = string(g.v)
				}
			}
			pe.Metadata[k] = v
		}
	}
	return pe, nil
}

// DecodeSandboxes decodes field 1 of a GetSandboxResponse or
// ListSandboxesResponse.
func DecodeSandboxes(b []byte) ([]Sandbox, error) {
	fs, err := split(b)
	if err != nil {
		return nil, err
	}
	var out []Sandbox
	for _, f := range fs {
		if f.num == 1 && f.typ == protowire.BytesType {
			s, err := DecodeSandbox(f.v)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// ---- encoding (the test driver's answers) ----

func str(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func msg(b []byte, num protowire.Number, m []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

// unknown appends a field no layout defines (number 900+), so tests can
// check that it survives the proxy.
func unknown(b []byte, num protowire.Number, s string) []byte {
	return str(b, num, s)
}

// EncodeSandbox encodes s the way the test driver sends it: with the
// driver's Ready condition (status/reason/message from ready) and unknown
// fields at several levels.
func EncodeSandbox(s Sandbox) []byte {
	var st []byte
	st = str(st, 1, s.Name)
	st = str(st, 2, "instance-"+s.ID)
	for _, c := range s.Conditions {
		var cb []byte
		cb = str(cb, 1, c.Type)
		cb = str(cb, 2, c.Status)
		cb = str(cb, 3, c.Reason)
		cb = str(cb, 4, c.Message)
		cb = unknown(cb, 901, "condition-unknown")
		cb = str(cb, 5, c.LastTransitionTime)
		st = msg(st, 5, cb)
	}
	st = unknown(st, 902, "status-unknown")
	if s.Deleting {
		st = protowire.AppendTag(st, 6, protowire.VarintType)
		st = protowire.AppendVarint(st, 1)
	}
	var b []byte
	b = str(b, 1, s.ID)
	b = str(b, 2, s.Name)
	b = str(b, 3, s.Namespace)
	b = unknown(b, 903, "sandbox-unknown")
	b = msg(b, 4, str(nil, 1, "spec-of-"+s.Name))
	b = msg(b, 5, st)
	b = str(b, 6, s.Workspace)
	return b
}

// EncodeWatchSandbox is a WatchSandboxesEvent snapshot.
func EncodeWatchSandbox(s Sandbox) []byte {
	return unknown(msg(nil, 1, msg(nil, 1, EncodeSandbox(s))), 904, "watch-unknown")
}

// EncodeWatchDeleted is a WatchSandboxesEvent deletion.
func EncodeWatchDeleted(id string) []byte { return msg(nil, 2, str(nil, 1, id)) }

// EncodeWatchPlatform is a WatchSandboxesEvent platform event.
func EncodeWatchPlatform(id string, pe PlatformEvent) []byte {
	var p []byte
	if pe.TimestampMS != 0 {
		p = protowire.AppendTag(p, 1, protowire.VarintType)
		p = protowire.AppendVarint(p, uint64(pe.TimestampMS))
	}
	p = str(p, 2, pe.Source)
	p = str(p, 3, pe.Type)
	p = str(p, 4, pe.Reason)
	p = str(p, 5, pe.Message)
	keys := make([]string, 0, len(pe.Metadata))
	for k := range pe.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p = msg(p, 6, str(str(nil, 1, k), 2, pe.Metadata[k]))
	}
	return msg(nil, 3, msg(str(nil, 1, id), 2, p))
}
