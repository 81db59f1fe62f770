package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// copies is what one sink holds: per event_id, the observed_at of each
// copy (the shipper stamps observed_at at every send, so two different
// values mean the collector stored the occurrence twice).
type copies map[string][]string

type line struct {
	EventID    string `json:"event_id"`
	ObservedAt string `json:"observed_at"`
	Namespace  string `json:"namespace"`
}

func (c copies) addJSON(b []byte) error { return c.addJSONNS(b, "") }

// addJSONNS adds the line when ns is empty or its namespace is ns.
func (c copies) addJSONNS(b []byte, ns string) error {
	var l line
	if err := json.Unmarshal(b, &l); err != nil {
		return fmt.Errorf("decode %q: %w", truncate(b, 120), err)
	}
	if l.EventID == "" {
		return fmt.Errorf("no event_id in %q", truncate(b, 120))
	}
	if ns != "" && l.Namespace != ns {
		return nil
	}
	c[l.EventID] = append(c[l.EventID], l.ObservedAt)
	return nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// readFileSink reads the file sink's active and rotated files.
func readFileSink(path string) (copies, error) { return readFileSinkNS(path, "") }

// readFileSinkNS reads the lines of namespace ns only (all when empty).
func readFileSinkNS(path, ns string) (copies, error) {
	out := copies{}
	files, _ := filepath.Glob(path + "*")
	for _, f := range files {
		fh, err := os.Open(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			if len(sc.Bytes()) == 0 {
				continue
			}
			if err := out.addJSONNS(sc.Bytes(), ns); err != nil {
				fh.Close()
				return nil, fmt.Errorf("%s: %w", f, err)
			}
		}
		fh.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	return out, nil
}

// readLoki reads every line the drill pushed to VictoriaLogs (Loki API),
// selected by the drill's static label.
func readLoki(ctx context.Context, vl *vlProc, drill string) (copies, error) {
	rows, err := vl.query(ctx, fmt.Sprintf(`drill:=%q`, drill))
	if err != nil {
		return nil, err
	}
	out := copies{}
	for _, r := range rows {
		var row struct {
			Msg string `json:"_msg"`
		}
		if err := json.Unmarshal(r, &row); err != nil {
			return nil, fmt.Errorf("victoria-logs row %q: %w", truncate(r, 120), err)
		}
		if err := out.addJSON([]byte(row.Msg)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readKafka consumes the topic from the start until a poll of two seconds
// brings nothing new.
func readKafka(ctx context.Context, brokers []string, topic string) (copies, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	out := copies{}
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		n := 0
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = err
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			n++
			if err := out.addJSON(r.Value); err != nil && ferr == nil {
				ferr = err
			}
		})
		if ferr != nil {
			return nil, ferr
		}
		if n == 0 {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return out, nil
		}
	}
}

// SinkResult is one row of the report: one drill, one sink.
type SinkResult struct {
	Drill, Sink string
	Created     int // occurrences the agent generated
	Acked       int // occurrences acknowledged by the collector
	Delivered   int // distinct event ids the sink holds
	RawDup      int // copies beyond the first (at-least-once re-delivery)
	DupAfter    int // copies that are distinct stored records (consumer dedupe by event_id needed; the store promised 0)
	Lost        int // acknowledged occurrences the sink does not hold
	Explained   int // of Lost: the loss the collector counted (metric), documented
	Unknown     int // event ids the agent never generated (must be 0)
	Recover     time.Duration
	Note        string
	Err         string
	// AtMostOnce: a destination that promises at most once (the gateway
	// proxy): misses are reported, not failed; a duplicate fails.
	AtMostOnce bool
}

// OK is the drill's verdict for this sink: nothing lost beyond what the
// collector counted, nothing stored twice, nothing invented.
func (r SinkResult) OK() bool {
	if r.AtMostOnce {
		return r.Err == "" && r.RawDup == 0 && r.Unknown == 0
	}
	return r.Err == "" && r.Lost == r.Explained && r.DupAfter == 0 && r.Unknown == 0
}

// tally compares a sink's copies with what was generated and acknowledged.
func tally(drill, sink string, created, acked map[string]bool, got copies) SinkResult {
	r := SinkResult{Drill: drill, Sink: sink, Created: len(created), Acked: len(acked)}
	for id, cs := range got {
		if !created[id] {
			r.Unknown++
			continue
		}
		r.Delivered++
		r.RawDup += len(cs) - 1
		distinct := map[string]bool{}
		for _, c := range cs {
			distinct[c] = true
		}
		r.DupAfter += len(distinct) - 1
	}
	for id := range acked {
		if len(got[id]) == 0 {
			r.Lost++
		}
	}
	return r
}

// missing lists up to n acknowledged ids the sink lacks (for errors).
func missing(acked map[string]bool, got copies, n int) []string {
	var out []string
	for id := range acked {
		if len(got[id]) == 0 {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// unknown lists up to n ids the sink holds that were never generated.
func unknown(created map[string]bool, got copies, n int) []string {
	var out []string
	for id := range got {
		if !created[id] {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	if len(out) > n {
		out = out[:n]
	}
	return out
}
