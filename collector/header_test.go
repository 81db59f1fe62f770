package collector

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/store"
	"github.com/eventpipe/eventpipe/collector/wal"
)

// waitDelivered waits until the JSONL file at path holds n distinct ids.
func waitDelivered(t *testing.T, path string, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); len(readJSONL(t, path)) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d delivered", filepath.Base(path), len(readJSONL(t, path)), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readyz(t *testing.T, r *running) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + r.c.HTTPAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Issue 21, defect 1, end to end: 6,000 occurrences in 64 KiB segments, one
// bit flipped in byte 0 of a segment's header.
//   - A middle segment outside the dedupe window, read later by a new sink:
//     the sink used to stop there for ever (2,500 of 6,000) with nothing
//     counted; now it delivers all 6,000, the damaged header is counted
//     (data_loss_bytes_total 16) and the collector is ready.
//   - The last segment: it used to be dropped as a torn tail; now the start
//     is refused, and accepted, every record is kept and new ones follow.
func TestDamagedSegmentHeaderEndToEnd(t *testing.T) {
	dir := t.TempDir()
	archive := filepath.Join(dir, "archive.jsonl")
	cfg := testConfig(t, dir)
	cfg.Store.SegmentBytes = 64 << 10
	cfg.Sinks = []SinkConfig{fileSink("archive", archive)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	r := startCollector(t, cfg)
	agent := dial(t, r.c.GRPCAddr(), agentToken)
	for b := range 12 {
		var occs []*eventpipev1.Occurrence
		for i := range 500 {
			occs = append(occs, occ(fmt.Sprintf("r-%d", b*500+i), "sb-1", "ws1", "one", "gw-a"))
		}
		if _, err := ship(t, ctx, agent, batch(uint64(b+1), "prod", fmt.Sprint(b+1), occs...)); err != nil {
			t.Fatal(err)
		}
	}
	waitDelivered(t, archive, 6000)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(cfg.Store.Dir, "log", "*.seg"))
	if len(segs) < 8 {
		t.Fatalf("want many segments, got %d", len(segs))
	}
	flipBit0(t, segs[len(segs)/2])
	// Outside the dedupe window: not read while the store opens.
	old := time.Now().Add(-2 * cfg.Store.DedupeWindow)
	for _, s := range segs {
		if err := os.Chtimes(s, old, old); err != nil {
			t.Fatal(err)
		}
	}

	late := filepath.Join(dir, "late.jsonl")
	cfg.Sinks = append(cfg.Sinks, fileSink("late", late))
	r2 := startCollector(t, cfg)
	waitDelivered(t, late, 6000)
	reader := dial(t, r2.c.GRPCAddr(), readerAll)
	replay, err := follow(t, ctx, reader, &eventpipev1.FollowRequest{SandboxId: "sb-1", Tail: 6000, NoFollow: true}, 0)
	if err != nil || len(replay) != 6000 {
		t.Fatalf("Follow replay of 6,000 across the damaged header: %d records, %v", len(replay), err)
	}
	if got := counterValue(t, r2.reg, "eventpipe_collector_log_data_loss_bytes_total", nil); got != 16 {
		t.Fatalf("data_loss_bytes_total = %v, want 16", got)
	}
	if code, body := readyz(t, r2); code != http.StatusOK {
		t.Fatalf("/readyz = %d %s", code, body)
	}
	if err := r2.stop(t); err != nil {
		t.Fatal(err)
	}

	segs, _ = filepath.Glob(filepath.Join(cfg.Store.Dir, "log", "*.seg"))
	lastSeg := segs[len(segs)-1]
	flipBit0(t, lastSeg)
	_, err = New(cfg, testLogger(t), prometheus.NewRegistry())
	if !errors.Is(err, store.ErrDataLoss) || !strings.Contains(err.Error(), filepath.Base(lastSeg)) {
		t.Fatalf("New with the last segment's header damaged: %v, want ErrDataLoss naming %s", err, filepath.Base(lastSeg))
	}
	cfg.Store.AcceptDataLoss = true
	r3 := startCollector(t, cfg)
	if rep := r3.c.Store().Repaired(); rep.Records != 0 {
		t.Fatalf("intact records dropped as a torn tail: %+v", rep)
	}
	agent3 := dial(t, r3.c.GRPCAddr(), agentToken)
	if _, err := ship(t, ctx, agent3, batch(13, "prod", "13", occ("after", "sb-1", "ws1", "one", "gw-a"))); err != nil {
		t.Fatal(err)
	}
	waitDelivered(t, archive, 6001)
	waitDelivered(t, late, 6001)
	recs, _, err := r3.c.Store().Read(ctx, 1, 10000)
	if err != nil || len(recs) != 6001 {
		t.Fatalf("log holds %d records (%v), want 6001", len(recs), err)
	}
}

func flipBit0(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[0] ^= 1
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
}

// A log that a sink cannot read past (here a record with an intact frame
// whose occurrence does not decode, as a buggy writer would leave) used to
// leave the sink retrying for ever with only a warning while /readyz said
// 200. Now /readyz names the offset.
func TestUnreadableLogMakesTheCollectorUnready(t *testing.T) {
	dir := t.TempDir()
	archive := filepath.Join(dir, "archive.jsonl")
	cfg := testConfig(t, dir)
	cfg.Sinks = []SinkConfig{fileSink("archive", archive)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := startCollector(t, cfg)
	agent := dial(t, r.c.GRPCAddr(), agentToken)
	if _, err := ship(t, ctx, agent, batch(1, "prod", "1", occ("a", "sb-1", "ws1", "one", "gw-a"))); err != nil {
		t.Fatal(err)
	}
	waitDelivered(t, archive, 1)
	if code, body := readyz(t, r); code != http.StatusOK {
		t.Fatalf("/readyz = %d %s", code, body)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	w, err := wal.Open(filepath.Join(cfg.Store.Dir, "log"), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Record version 1, stored-at, kind occurrence, then a protobuf field
	// whose length runs past the end.
	bad := binary.LittleEndian.AppendUint64([]byte{1}, uint64(time.Now().UnixNano()))
	bad = append(bad, 1, 0x0a, 0x7f)
	if _, _, err := w.Append([][]byte{bad}); err != nil {
		t.Fatal(err)
	}
	w.Close()

	r2 := startCollector(t, cfg)
	for deadline := time.Now().Add(20 * time.Second); ; {
		code, body := readyz(t, r2)
		if code == http.StatusServiceUnavailable && strings.Contains(body, "cannot read past offset 2") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q, want 503 naming offset 2", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
