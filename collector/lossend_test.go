package collector

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Issue 21 defect 5: after an accepted data loss at the end of the log the
// log's last offset stays where it was (offsets are never reused), but the
// offsets after the last intact record hold nothing. A sink that had not
// read them reported lag_records 50 for ever, and SIGTERM waited the whole
// shutdown grace for it to "catch up". Its lag is now 0 once it handled
// every record there is, and a stop is quick.
func TestAcceptedLossAtTheEndLeavesNoLag(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.GRPC.ShutdownGrace = 10 * time.Second
	cfg.Sinks = []SinkConfig{fileSink("ahead", filepath.Join(dir, "ahead.jsonl")), fileSink("behind", filepath.Join(dir, "behind.jsonl"))}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	r := startCollector(t, cfg)
	var occs []*eventpipev1.Occurrence
	for i := range 100 {
		occs = append(occs, occ(fmt.Sprintf("rec-%d", i), "sb-1", "ws1", "one", "gw-a"))
	}
	if _, err := ship(t, ctx, dial(t, r.c.GRPCAddr(), agentToken), batch(1, "prod", "10", occs...)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); len(readJSONL(t, filepath.Join(dir, "ahead.jsonl"))) < 100; {
		if time.Now().After(deadline) {
			t.Fatal("the file sink did not deliver the 100")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	// Sink "behind" had read only the first 50 (its cursor says so); the
	// last 50 records are cut from the segment, mid-frame. Sink "ahead"
	// committed 100, so they were acknowledged: an accepted data loss.
	if err := os.WriteFile(filepath.Join(cfg.Store.Dir, "cursors", "behind"), []byte("50\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(cfg.Store.Dir, "log", "*.seg"))
	seg := segs[len(segs)-1]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	cut := frameAt(t, b, 51)
	if err := os.Truncate(seg, int64(cut+10)); err != nil {
		t.Fatal(err)
	}
	cfg.Store.AcceptDataLoss = true
	r2 := startCollector(t, cfg)
	if _, last := r2.c.Store().Bounds(); last != 100 {
		t.Fatalf("log last offset after the accepted loss = %d, want 100 (offsets are never reused)", last)
	}
	var lag float64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		lag = counterValue(t, r2.reg, "eventpipe_sink_lag_records", map[string]string{"sink": "behind"})
		if lag == 0 || time.Now().After(deadline) {
			break
		}
	}
	if lag != 0 {
		t.Errorf("lag_records of the sink at 50 = %v after it handled every record the log holds, want 0", lag)
	}
	start := time.Now()
	if err := r2.stop(t); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("stop took %s: it waited for records that do not exist (grace %s)", d, cfg.GRPC.ShutdownGrace)
	}
	if got := readCursorFile(t, filepath.Join(cfg.Store.Dir, "cursors", "behind")); got != 50 {
		t.Errorf("cursor of the sink at 50 = %d after the stop, want 50", got)
	}
}

// frameAt returns the byte position of the frame holding offset off in a
// version 2 segment (collector/wal/FORMAT.md: a 16-byte segment header,
// then frames of a 16-byte header, whose first word's bits 0..30 are the
// payload length and bytes 8..15 the offset, and the payload).
func frameAt(t *testing.T, seg []byte, off uint64) int {
	t.Helper()
	for pos := 16; pos+16 <= len(seg); {
		if binary.LittleEndian.Uint64(seg[pos+8:]) == off {
			return pos
		}
		pos += 16 + int(binary.LittleEndian.Uint32(seg[pos:])&0x7fffffff)
	}
	t.Fatalf("no frame with offset %d", off)
	return 0
}
