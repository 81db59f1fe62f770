package kwire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"strconv"
)

// magic starts every body the Kubernetes protobuf serializer writes
// (k8s.io/apimachinery/pkg/runtime/serializer/protobuf).
const magic = "k8s\x00"

// ContentTypeProtobuf is the media type to Accept for protobuf bodies and
// watches of built-in kinds. The API server answers a watch with
// "application/vnd.kubernetes.protobuf;stream=watch" and an error with a
// protobuf Status when the request accepted protobuf (a JSON Status
// otherwise): pick DecodeStatus or DecodeStatusJSON by the Content-Type.
const ContentTypeProtobuf = "application/vnd.kubernetes.protobuf"

// unwrap parses magic + runtime.Unknown and returns its typeMeta and raw
// (sub-slices of b).
func unwrap(b []byte) (apiVersion, kind, raw []byte, err error) {
	if len(b) < len(magic) || string(b[:len(magic)]) != magic {
		return nil, nil, nil, &Error{Path: "Unknown", Msg: "no k8s protobuf magic prefix"}
	}
	f := newFields(b[len(magic):])
	for f.next() {
		switch f.num {
		case 1: // typeMeta
			tm, err := f.bytesField()
			if err != nil {
				return nil, nil, nil, at(err, "Unknown.typeMeta")
			}
			g := newFields(tm)
			for g.next() {
				switch g.num {
				case 1:
					if apiVersion, err = g.bytesField(); err != nil {
						return nil, nil, nil, at(err, "Unknown.typeMeta")
					}
				case 2:
					if kind, err = g.bytesField(); err != nil {
						return nil, nil, nil, at(err, "Unknown.typeMeta")
					}
				}
			}
			if g.err != nil {
				return nil, nil, nil, at(g.err, "Unknown.typeMeta")
			}
		case 2:
			if raw, err = f.bytesField(); err != nil {
				return nil, nil, nil, at(err, "Unknown")
			}
		case 3: // contentEncoding: the API server never sets one
			ce, err := f.bytesField()
			if err != nil {
				return nil, nil, nil, at(err, "Unknown")
			}
			if len(ce) > 0 {
				return nil, nil, nil, &Error{Path: "Unknown", Msg: "unsupported contentEncoding " + strconv.Quote(string(ce))}
			}
		}
	}
	if f.err != nil {
		return nil, nil, nil, at(f.err, "Unknown")
	}
	return apiVersion, kind, raw, nil
}

// Unwrap parses a protobuf response body or watch-event object: the magic
// "k8s\x00" followed by a runtime.Unknown. raw is the kind's message; it
// aliases b (no copy). apiVersion and kind are copies.
func Unwrap(b []byte) (apiVersion, kind string, raw []byte, err error) {
	av, k, raw, err := unwrap(b)
	if err != nil {
		return "", "", nil, err
	}
	return string(av), string(k), raw, nil
}

// ReadFrame reads one frame of a length-delimited stream (a protobuf watch:
// a 4-byte big-endian length, then that many bytes). The frame is read into
// buf when it fits (pass the previous frame's slice back to reuse it) and is
// only valid until the next call with the same buf. A frame longer than max
// is an error, returned before anything is allocated for it. At a clean end
// of stream (no byte of a new frame read) the error is io.EOF; a frame cut
// short gives io.ErrUnexpectedEOF.
func ReadFrame(r *bufio.Reader, buf []byte, max int) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := uint64(binary.BigEndian.Uint32(h[:]))
	if max < 0 || n > uint64(max) {
		return nil, &Error{Path: "frame", Msg: "length " + strconv.FormatUint(n, 10) + " exceeds the limit of " + strconv.Itoa(max) + " bytes"}
	}
	if uint64(cap(buf)) >= n {
		buf = buf[:n]
	} else {
		buf = make([]byte, n)
	}
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// DecodeWatchEvent decodes one frame of a protobuf watch stream: a
// metav1.WatchEvent whose object is the kind's protobuf body (magic +
// runtime.Unknown). The API server writes the WatchEvent itself without an
// envelope (its stream serializer is the raw one); a frame that does start
// with the magic (an Unknown holding the WatchEvent) is accepted too. object
// is the kind's message with both envelopes stripped; it aliases msg. typ is
// "ADDED", "MODIFIED", "DELETED", "BOOKMARK" or "ERROR" (anything else is
// returned as is); an ERROR's object is a metav1.Status (DecodeStatus).
func DecodeWatchEvent(msg []byte) (typ string, object []byte, err error) {
	if len(msg) >= len(magic) && string(msg[:len(magic)]) == magic {
		_, kind, raw, err := unwrap(msg)
		if err != nil {
			return "", nil, at(err, "WatchEvent")
		}
		if string(kind) != "WatchEvent" {
			return "", nil, &Error{Path: "WatchEvent", Msg: "envelope holds kind " + strconv.Quote(string(kind))}
		}
		msg = raw
	}
	var t, obj []byte
	haveObj := false
	f := newFields(msg)
	for f.next() {
		switch f.num {
		case 1:
			if t, err = f.bytesField(); err != nil {
				return "", nil, at(err, "WatchEvent.type")
			}
		case 2: // RawExtension
			ext, err := f.bytesField()
			if err != nil {
				return "", nil, at(err, "WatchEvent.object")
			}
			g := newFields(ext)
			for g.next() {
				if g.num == 1 {
					if obj, err = g.bytesField(); err != nil {
						return "", nil, at(err, "WatchEvent.object")
					}
					haveObj = true
				}
			}
			if g.err != nil {
				return "", nil, at(g.err, "WatchEvent.object")
			}
		}
	}
	if f.err != nil {
		return "", nil, at(f.err, "WatchEvent")
	}
	if len(t) == 0 {
		return "", nil, &Error{Path: "WatchEvent", Msg: "no type"}
	}
	if !haveObj {
		return "", nil, &Error{Path: "WatchEvent", Msg: "no object"}
	}
	_, _, object, err = unwrap(obj)
	if err != nil {
		return "", nil, at(err, "WatchEvent.object")
	}
	return eventType(t), object, nil
}

// eventType returns the watch event type without allocating for the known ones.
func eventType(b []byte) string {
	switch string(b) {
	case "ADDED":
		return "ADDED"
	case "MODIFIED":
		return "MODIFIED"
	case "DELETED":
		return "DELETED"
	case "BOOKMARK":
		return "BOOKMARK"
	case "ERROR":
		return "ERROR"
	}
	return string(b)
}

// ListMeta is what a listing's metadata tells the next request.
type ListMeta struct {
	// ResourceVersion is the listing's resourceVersion (watch from it).
	ResourceVersion string
	// Continue is the token for the next page; empty on the last one.
	Continue string
}

// ListItems decodes a protobuf XxxList message (the raw of Unwrap) and calls
// item with each item's message, in order. The slice given to item aliases
// raw. An error from item stops the walk and is returned as is.
func ListItems(raw []byte, item func(raw []byte) error) (ListMeta, error) {
	var lm ListMeta
	f := newFields(raw)
	n := 0
	for f.next() {
		switch f.num {
		case 1:
			b, err := f.bytesField()
			if err != nil {
				return ListMeta{}, at(err, "List.metadata")
			}
			if err := decodeListMeta(b, &lm); err != nil {
				return ListMeta{}, at(err, "List.metadata")
			}
		case 2:
			b, err := f.bytesField()
			if err != nil {
				return ListMeta{}, atIndex(err, "List.items", n)
			}
			if err := item(b); err != nil {
				return ListMeta{}, err
			}
			n++
		}
	}
	if f.err != nil {
		return ListMeta{}, at(f.err, "List")
	}
	return lm, nil
}

func decodeListMeta(b []byte, lm *ListMeta) error {
	f := newFields(b)
	for f.next() {
		switch f.num {
		case 2, 3:
			v, err := f.bytesField()
			if err != nil {
				return err
			}
			if f.num == 2 {
				lm.ResourceVersion = string(v)
			} else {
				lm.Continue = string(v)
			}
		}
	}
	return f.err
}

// Status is a metav1.Status: an API error, from a response body or the
// object of an ERROR watch event.
type Status struct {
	// Code is the HTTP status code (410 for an expired resourceVersion).
	Code int32
	// Reason is the machine-readable reason ("Expired", "Gone", "NotFound", ...).
	Reason  string
	Message string
	// Causes are details.causes (e.g. the field a bad request is about).
	Causes []Cause
	// RetryAfterSeconds is details.retryAfterSeconds (0 when not set).
	RetryAfterSeconds int32
}

// Cause is one details.causes entry of a Status.
type Cause struct {
	Type    string
	Message string
	Field   string
}

// Error returns the message, like client-go's StatusError.
func (s *Status) Error() string {
	if s.Message != "" {
		return s.Message
	}
	if s.Reason != "" {
		return "status " + strconv.Itoa(int(s.Code)) + " " + s.Reason
	}
	return "status " + strconv.Itoa(int(s.Code))
}

// Expired reports whether the Status says the resourceVersion is too old
// (410 Gone, reason Expired or Gone): the caller must list again.
func (s *Status) Expired() bool {
	return s.Code == 410 || s.Reason == "Expired" || s.Reason == "Gone"
}

// DecodeStatus decodes a protobuf metav1.Status message (the raw of Unwrap,
// or the object of an ERROR watch event).
func DecodeStatus(raw []byte) (*Status, error) {
	s := &Status{}
	f := newFields(raw)
	for f.next() {
		var err error
		switch f.num {
		case 3, 4:
			var v []byte
			if v, err = f.bytesField(); err == nil {
				if f.num == 3 {
					s.Message = string(v)
				} else {
					s.Reason = string(v)
				}
			}
		case 5:
			var v []byte
			if v, err = f.bytesField(); err == nil {
				err = decodeStatusDetails(v, s)
			}
			if err != nil {
				err = at(err, "details")
			}
		case 6:
			var v uint64
			if v, err = f.varintField(); err == nil {
				s.Code = int32(v)
			}
		}
		if err != nil {
			return nil, at(err, "Status")
		}
	}
	if f.err != nil {
		return nil, at(f.err, "Status")
	}
	return s, nil
}

func decodeStatusDetails(b []byte, s *Status) error {
	f := newFields(b)
	for f.next() {
		switch f.num {
		case 4:
			v, err := f.bytesField()
			if err != nil {
				return atIndex(err, "causes", len(s.Causes))
			}
			var c Cause
			g := newFields(v)
			for g.next() {
				if g.num >= 1 && g.num <= 3 {
					w, err := g.bytesField()
					if err != nil {
						return atIndex(err, "causes", len(s.Causes))
					}
					switch g.num {
					case 1:
						c.Type = string(w)
					case 2:
						c.Message = string(w)
					case 3:
						c.Field = string(w)
					}
				}
			}
			if g.err != nil {
				return atIndex(g.err, "causes", len(s.Causes))
			}
			s.Causes = append(s.Causes, c)
		case 5:
			v, err := f.varintField()
			if err != nil {
				return err
			}
			s.RetryAfterSeconds = int32(v)
		}
	}
	return f.err
}

// InitialEventsEndAnnotation marks the bookmark that ends the initial
// events of a watch with sendInitialEvents=true.
const InitialEventsEndAnnotation = "k8s.io/initial-events-end"

// BookmarkInfo reads a BOOKMARK watch event's protobuf object (of any kind:
// only its metadata is read): its resourceVersion, and whether it carries the
// annotation k8s.io/initial-events-end: "true".
func BookmarkInfo(raw []byte) (resourceVersion string, initialEventsEnd bool, err error) {
	f := newFields(raw)
	for f.next() {
		if f.num != 1 {
			continue
		}
		md, err := f.bytesField()
		if err != nil {
			return "", false, at(err, "bookmark.metadata")
		}
		g := newFields(md)
		for g.next() {
			switch g.num {
			case 6:
				v, err := g.bytesField()
				if err != nil {
					return "", false, at(err, "bookmark.metadata.resourceVersion")
				}
				resourceVersion = string(v)
			case 12:
				v, err := g.bytesField()
				if err != nil {
					return "", false, at(err, "bookmark.metadata.annotations")
				}
				k, val, err := mapEntry(v)
				if err != nil {
					return "", false, at(err, "bookmark.metadata.annotations")
				}
				if string(k) == InitialEventsEndAnnotation {
					initialEventsEnd = string(val) == "true"
				}
			}
		}
		if g.err != nil {
			return "", false, at(g.err, "bookmark.metadata")
		}
	}
	if f.err != nil {
		return "", false, at(f.err, "bookmark")
	}
	return resourceVersion, initialEventsEnd, nil
}

// mapEntry decodes one map<string,string> entry (key = 1, value = 2; last wins).
func mapEntry(b []byte) (k, v []byte, err error) {
	f := newFields(b)
	for f.next() {
		switch f.num {
		case 1:
			if k, err = f.bytesField(); err != nil {
				return nil, nil, err
			}
		case 2:
			if v, err = f.bytesField(); err != nil {
				return nil, nil, err
			}
		}
	}
	return k, v, f.err
}
