package loki

import (
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/eventpipe/eventpipe/sinks/internal/jsonenc"
)

// entry is one record ready to send: its stream, timestamp, line and
// metadata. idx is its index in the batch given to Push.
type entry struct {
	idx    int
	tenant string
	stream string      // label string, the grouping key
	labels []labelPair // the same labels, for the JSON encoding
	ts     time.Time
	line   []byte
	meta   []labelPair
}

// stream is the entries of one label set, sorted by timestamp.
type stream struct {
	labels  string
	pairs   []labelPair
	entries []*entry
}

// groupStreams groups entries by label set (in order of first appearance)
// and sorts each stream by timestamp; entries with the same timestamp keep
// their batch order.
func groupStreams(entries []*entry) []stream {
	index := make(map[string]int, 8)
	var out []stream
	for _, e := range entries {
		i, ok := index[e.stream]
		if !ok {
			i = len(out)
			index[e.stream] = i
			out = append(out, stream{labels: e.stream, pairs: e.labels})
		}
		out[i].entries = append(out[i].entries, e)
	}
	for i := range out {
		slices.SortStableFunc(out[i].entries, func(a, b *entry) int { return a.ts.Compare(b.ts) })
	}
	return out
}

// The Loki push protobuf (package logproto, github.com/grafana/loki/pkg/push):
//
//	message PushRequest      { repeated StreamAdapter streams = 1; }
//	message StreamAdapter    { string labels = 1; repeated EntryAdapter entries = 2; uint64 hash = 3; }
//	message EntryAdapter     { google.protobuf.Timestamp timestamp = 1; string line = 2;
//	                           repeated LabelPairAdapter structuredMetadata = 3; }
//	message LabelPairAdapter { string name = 1; string value = 2; }
//	message Timestamp        { int64 seconds = 1; int32 nanos = 2; }
//
// hash is never sent (the server computes it).

func sizeTimestamp(t time.Time) int {
	n := 0
	if s := t.Unix(); s != 0 {
		n += 1 + protowire.SizeVarint(uint64(s))
	}
	if ns := t.Nanosecond(); ns != 0 {
		n += 1 + protowire.SizeVarint(uint64(ns))
	}
	return n
}

func sizeBytesField(n int) int { return 1 + protowire.SizeVarint(uint64(n)) + n }

func sizePair(p labelPair) int {
	return sizeBytesField(len(p.name)) + sizeBytesField(len(p.value))
}

func sizeEntry(e *entry) int {
	n := sizeBytesField(sizeTimestamp(e.ts)) + sizeBytesField(len(e.line))
	for _, p := range e.meta {
		n += sizeBytesField(sizePair(p))
	}
	return n
}

func sizeStream(s *stream, entrySizes []int) int {
	n := sizeBytesField(len(s.labels))
	for _, es := range entrySizes {
		n += sizeBytesField(es)
	}
	return n
}

// appendPushProto appends the PushRequest of streams to dst (uncompressed).
func appendPushProto(dst []byte, streams []stream) []byte {
	var sizes []int
	for i := range streams {
		s := &streams[i]
		sizes = sizes[:0]
		for _, e := range s.entries {
			sizes = append(sizes, sizeEntry(e))
		}
		dst = protowire.AppendTag(dst, 1, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(sizeStream(s, sizes)))
		dst = protowire.AppendTag(dst, 1, protowire.BytesType)
		dst = protowire.AppendString(dst, s.labels)
		for j, e := range s.entries {
			dst = protowire.AppendTag(dst, 2, protowire.BytesType)
			dst = protowire.AppendVarint(dst, uint64(sizes[j]))
			dst = protowire.AppendTag(dst, 1, protowire.BytesType)
			dst = protowire.AppendVarint(dst, uint64(sizeTimestamp(e.ts)))
			if sec := e.ts.Unix(); sec != 0 {
				dst = protowire.AppendTag(dst, 1, protowire.VarintType)
				dst = protowire.AppendVarint(dst, uint64(sec))
			}
			if ns := e.ts.Nanosecond(); ns != 0 {
				dst = protowire.AppendTag(dst, 2, protowire.VarintType)
				dst = protowire.AppendVarint(dst, uint64(ns))
			}
			dst = protowire.AppendTag(dst, 2, protowire.BytesType)
			dst = protowire.AppendBytes(dst, e.line)
			for _, p := range e.meta {
				dst = protowire.AppendTag(dst, 3, protowire.BytesType)
				dst = protowire.AppendVarint(dst, uint64(sizePair(p)))
				dst = protowire.AppendTag(dst, 1, protowire.BytesType)
				dst = protowire.AppendString(dst, p.name)
				dst = protowire.AppendTag(dst, 2, protowire.BytesType)
				dst = protowire.AppendString(dst, p.value)
			}
		}
	}
	return dst
}

// appendPushJSON appends the JSON push body of streams to dst:
//
//	{"streams":[{"stream":{"job":"eventpipe"},"values":[["<unix ns>","<line>",{"event_id":"..."}]]}]}
func appendPushJSON(dst []byte, streams []stream) []byte {
	dst = append(dst, `{"streams":[`...)
	for i := range streams {
		s := &streams[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"stream":{`...)
		for j, p := range s.pairs {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = jsonenc.AppendString(dst, p.name)
			dst = append(dst, ':')
			dst = jsonenc.AppendString(dst, p.value)
		}
		dst = append(dst, `},"values":[`...)
		for j, e := range s.entries {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `["`...)
			dst = strconv.AppendInt(dst, e.ts.UnixNano(), 10)
			dst = append(dst, `",`...)
			dst = jsonenc.AppendString(dst, string(e.line))
			if len(e.meta) > 0 {
				dst = append(dst, ",{"...)
				for k, p := range e.meta {
					if k > 0 {
						dst = append(dst, ',')
					}
					dst = jsonenc.AppendString(dst, p.name)
					dst = append(dst, ':')
					dst = jsonenc.AppendString(dst, p.value)
				}
				dst = append(dst, '}')
			}
			dst = append(dst, ']')
		}
		dst = append(dst, "]}"...)
	}
	return append(dst, "]}"...)
}
