package driverwire

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"google.golang.org/protobuf/encoding/protowire"
)

// Layout names the pinned wire layout (OpenShell main, 2026-08-21).
const Layout = "2026-08-21"

// Service is the full name of the compute driver service.
const Service = "openshell.compute.v1.ComputeDriver"

// Full method names of the three RPCs whose responses the proxy edits.
const (
	MethodWatchSandboxes = "/" + Service + "/WatchSandboxes"
	MethodGetSandbox     = "/" + Service + "/GetSandbox"
	MethodListSandboxes  = "/" + Service + "/ListSandboxes"
)

// Field numbers (see the package doc).
const (
	sandboxID     protowire.Number = 1
	sandboxStatus protowire.Number = 5

	statusConditions protowire.Number = 5

	condType    protowire.Number = 1
	condStatus  protowire.Number = 2
	condReason  protowire.Number = 3
	condMessage protowire.Number = 4
	condTime    protowire.Number = 5

	peTimestampMS protowire.Number = 1
	peSource      protowire.Number = 2
	peType        protowire.Number = 3
	peReason      protowire.Number = 4
	peMessage     protowire.Number = 5
	peMetadata    protowire.Number = 6

	watchSandbox  protowire.Number = 1
	watchDeleted  protowire.Number = 2
	watchPlatform protowire.Number = 3

	wrappedSandbox protowire.Number = 1 // WatchSandboxesSandboxEvent.sandbox, Get/List responses
	platformSbID   protowire.Number = 1
	platformEvent  protowire.Number = 2
	deletedSbID    protowire.Number = 1
)

// ErrMalformed wraps every parse failure.
var ErrMalformed = errors.New("malformed driver message")

// Condition is a DriverCondition.
type Condition struct {
	Type, Status, Reason, Message, LastTransitionTime string
}

// PlatformEvent is a DriverPlatformEvent.
type PlatformEvent struct {
	TimestampMS                   int64
	Source, Type, Reason, Message string
	Metadata                      map[string]string
}

// Patch is what the proxy changes on one DriverSandbox: conditions added to
// its status, and a suffix appended to the message of a Ready condition
// whose status is "False" (reason untouched).
type Patch struct {
	Add         []Condition
	ReadySuffix string
}

// Empty reports whether the patch changes nothing.
func (p Patch) Empty() bool { return len(p.Add) == 0 && p.ReadySuffix == "" }

// PatchFunc returns the patch for a sandbox id (ok false: leave it alone).
type PatchFunc func(sandboxID string) (p Patch, ok bool)

// field is one parsed top-level field: its number, wire type, the bytes of
// the whole field (tag included) and, for LEN fields, the payload.
type field struct {
	num   protowire.Number
	typ   protowire.Type
	raw   []byte
	value []byte
}

// fields splits a message into its top-level fields without copying.
func fields(b []byte) ([]field, error) {
	var out []field
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: %v", ErrMalformed, protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, fmt.Errorf("%w: field %d: %v", ErrMalformed, num, protowire.ParseError(m))
		}
		f := field{num: num, typ: typ, raw: b[:n+m]}
		if typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[n : n+m])
			f.value = v
		}
		out = append(out, f)
		b = b[n+m:]
	}
	return out, nil
}

// lastString is the value of the last occurrence of a string field.
func lastString(fs []field, num protowire.Number) string {
	s := ""
	for _, f := range fs {
		if f.num == num && f.typ == protowire.BytesType {
			s = string(f.value)
		}
	}
	return s
}

// rewrite edits the LEN fields numbered num with fn, keeping every other
// byte. changed is false (and out is b) when fn changed nothing.
func rewrite(b []byte, num protowire.Number, fn func(v []byte) ([]byte, bool, error)) (out []byte, changed bool, err error) {
	fs, err := fields(b)
	if err != nil {
		return b, false, err
	}
	var buf []byte
	for i, f := range fs {
		if f.num != num || f.typ != protowire.BytesType {
			if buf != nil {
				buf = append(buf, f.raw...)
			}
			continue
		}
		nv, ch, err := fn(f.value)
		if err != nil {
			return b, false, err
		}
		if !ch {
			if buf != nil {
				buf = append(buf, f.raw...)
			}
			continue
		}
		if buf == nil {
			buf = make([]byte, 0, len(b)+len(nv)-len(f.value)+8)
			for _, g := range fs[:i] {
				buf = append(buf, g.raw...)
			}
		}
		buf = protowire.AppendTag(buf, num, protowire.BytesType)
		buf = protowire.AppendBytes(buf, nv)
	}
	if buf == nil {
		return b, false, nil
	}
	return buf, true, nil
}

// SandboxID reads DriverSandbox.id.
func SandboxID(sandbox []byte) (string, error) {
	fs, err := fields(sandbox)
	if err != nil {
		return "", err
	}
	return lastString(fs, sandboxID), nil
}

// PatchSandbox applies p to an encoded DriverSandbox. The conditions are
// appended to the last status occurrence (or a new status field when there
// is none); the Ready suffix goes into every Ready=False condition.
func PatchSandbox(sandbox []byte, p Patch) ([]byte, error) {
	if p.Empty() {
		return sandbox, nil
	}
	fs, err := fields(sandbox)
	if err != nil {
		return sandbox, err
	}
	last := -1
	for i, f := range fs {
		if f.num == sandboxStatus && f.typ == protowire.BytesType {
			last = i
		}
	}
	out := make([]byte, 0, len(sandbox)+64*len(p.Add)+len(p.ReadySuffix))
	for i, f := range fs {
		if f.num != sandboxStatus || f.typ != protowire.BytesType {
			out = append(out, f.raw...)
			continue
		}
		st, _, err := patchReady(f.value, p.ReadySuffix)
		if err != nil {
			return sandbox, err
		}
		if i == last {
			// st may be f.value itself, a window into sandbox: clipped, the
			// append copies instead of writing over the bytes after it.
			st = appendConditions(slices.Clip(st), p.Add)
		}
		out = protowire.AppendTag(out, sandboxStatus, protowire.BytesType)
		out = protowire.AppendBytes(out, st)
	}
	if last < 0 && len(p.Add) > 0 {
		out = protowire.AppendTag(out, sandboxStatus, protowire.BytesType)
		out = protowire.AppendBytes(out, appendConditions(nil, p.Add))
	}
	return out, nil
}

// patchReady appends suffix to the message of every Ready=False condition
// of an encoded DriverSandboxStatus.
func patchReady(status []byte, suffix string) ([]byte, bool, error) {
	if suffix == "" {
		return status, false, nil
	}
	return rewrite(status, statusConditions, func(c []byte) ([]byte, bool, error) {
		fs, err := fields(c)
		if err != nil {
			return nil, false, err
		}
		if lastString(fs, condType) != "Ready" || lastString(fs, condStatus) != "False" {
			return c, false, nil
		}
		msg := lastString(fs, condMessage)
		if msg != "" {
			msg += " "
		}
		msg += suffix
		// The last occurrence of message wins: replace it (or add one).
		idx := -1
		for i, f := range fs {
			if f.num == condMessage {
				idx = i
			}
		}
		out := make([]byte, 0, len(c)+len(suffix)+8)
		for i, f := range fs {
			if i == idx {
				out = protowire.AppendTag(out, condMessage, protowire.BytesType)
				out = protowire.AppendString(out, msg)
				continue
			}
			out = append(out, f.raw...)
		}
		if idx < 0 {
			out = protowire.AppendTag(out, condMessage, protowire.BytesType)
			out = protowire.AppendString(out, msg)
		}
		return out, true, nil
	})
}

func appendConditions(status []byte, cs []Condition) []byte {
	for _, c := range cs {
		var m []byte
		m = appendString(m, condType, c.Type)
		m = appendString(m, condStatus, c.Status)
		m = appendString(m, condReason, c.Reason)
		m = appendString(m, condMessage, c.Message)
		m = appendString(m, condTime, c.LastTransitionTime)
		status = protowire.AppendTag(status, statusConditions, protowire.BytesType)
		status = protowire.AppendBytes(status, m)
	}
	return status
}

// appendString appends a proto3 string field, omitting the empty string as
// proto3 encoders do.
func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// patchWrapped applies fn's patch to every DriverSandbox in field 1 of a
// wrapper message (GetSandboxResponse, ListSandboxesResponse,
// WatchSandboxesSandboxEvent).
func patchWrapped(b []byte, fn PatchFunc) ([]byte, bool, error) {
	out, changed, err := rewrite(b, wrappedSandbox, func(sb []byte) ([]byte, bool, error) {
		id, err := SandboxID(sb)
		if err != nil {
			return nil, false, err
		}
		p, ok := fn(id)
		if !ok || p.Empty() {
			return sb, false, nil
		}
		nb, err := PatchSandbox(sb, p)
		return nb, err == nil, err
	})
	if err != nil {
		return b, false, err
	}
	return out, changed, nil
}

// PatchGetSandboxResponse patches the sandbox of a GetSandboxResponse.
func PatchGetSandboxResponse(b []byte, fn PatchFunc) ([]byte, error) {
	out, _, err := patchWrapped(b, fn)
	return out, err
}

// PatchListSandboxesResponse patches every sandbox of a
// ListSandboxesResponse.
func PatchListSandboxesResponse(b []byte, fn PatchFunc) ([]byte, error) {
	out, _, err := patchWrapped(b, fn)
	return out, err
}

// Kind is the payload of a WatchSandboxesEvent.
type Kind int

// Payload kinds of WatchSandboxesEvent.
const (
	KindUnknown Kind = iota // none set, or a payload newer than Layout
	KindSandbox
	KindDeleted
	KindPlatform
)

// WatchEvent is what the proxy needs to know about one WatchSandboxesEvent.
type WatchEvent struct {
	Kind Kind
	// SandboxID: the deleted or platform event's sandbox_id; for a
	// snapshot, the DriverSandbox id.
	SandboxID string
	// Source of a platform event (e.g. "kubernetes").
	Source string
}

// ParseWatchEvent reads the payload kind, sandbox id and platform source.
func ParseWatchEvent(b []byte) (WatchEvent, error) {
	fs, err := fields(b)
	if err != nil {
		return WatchEvent{}, err
	}
	var ev WatchEvent
	for _, f := range fs {
		if f.typ != protowire.BytesType {
			continue
		}
		switch f.num {
		case watchSandbox:
			inner, err := fields(f.value)
			if err != nil {
				return WatchEvent{}, err
			}
			id := ""
			for _, g := range inner {
				if g.num == wrappedSandbox && g.typ == protowire.BytesType {
					if id, err = SandboxID(g.value); err != nil {
						return WatchEvent{}, err
					}
				}
			}
			ev = WatchEvent{Kind: KindSandbox, SandboxID: id}
		case watchDeleted:
			inner, err := fields(f.value)
			if err != nil {
				return WatchEvent{}, err
			}
			ev = WatchEvent{Kind: KindDeleted, SandboxID: lastString(inner, deletedSbID)}
		case watchPlatform:
			inner, err := fields(f.value)
			if err != nil {
				return WatchEvent{}, err
			}
			ev = WatchEvent{Kind: KindPlatform, SandboxID: lastString(inner, platformSbID)}
			for _, g := range inner {
				if g.num == platformEvent && g.typ == protowire.BytesType {
					pe, err := fields(g.value)
					if err != nil {
						return WatchEvent{}, err
					}
					if s := lastString(pe, peSource); s != "" {
						ev.Source = s
					}
				}
			}
		}
	}
	return ev, nil
}

// PatchWatchEvent patches the DriverSandbox of a snapshot event; other
// payloads come back unchanged.
func PatchWatchEvent(b []byte, fn PatchFunc) ([]byte, error) {
	out, _, err := rewrite(b, watchSandbox, func(v []byte) ([]byte, bool, error) {
		return patchWrapped(v, fn)
	})
	if err != nil {
		return b, err
	}
	return out, nil
}

// AppendPlatformEvent appends an encoded WatchSandboxesEvent carrying a
// WatchSandboxesPlatformEvent to dst. Metadata entries are written in key
// order, so the same event always encodes to the same bytes.
func AppendPlatformEvent(dst []byte, sandboxID string, ev PlatformEvent) []byte {
	var pe []byte
	if ev.TimestampMS != 0 {
		pe = protowire.AppendTag(pe, peTimestampMS, protowire.VarintType)
		pe = protowire.AppendVarint(pe, uint64(ev.TimestampMS))
	}
	pe = appendString(pe, peSource, ev.Source)
	pe = appendString(pe, peType, ev.Type)
	pe = appendString(pe, peReason, ev.Reason)
	pe = appendString(pe, peMessage, ev.Message)
	keys := make([]string, 0, len(ev.Metadata))
	for k := range ev.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, ev.Metadata[k])
		pe = protowire.AppendTag(pe, peMetadata, protowire.BytesType)
		pe = protowire.AppendBytes(pe, e)
	}
	var w []byte
	w = appendString(w, platformSbID, sandboxID)
	w = protowire.AppendTag(w, platformEvent, protowire.BytesType)
	w = protowire.AppendBytes(w, pe)
	dst = protowire.AppendTag(dst, watchPlatform, protowire.BytesType)
	return protowire.AppendBytes(dst, w)
}
