package collector

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/store"
)

// Defect 1 of issue 13, end to end: ingest 100, stop, cut 5 bytes off the
// newest segment, restart. The file sink had committed cursor 100, so record
// 100 was acknowledged: the collector refuses to start until the loss is
// accepted. Once accepted, the next occurrence gets offset 101 (never 100
// again) and both the file sink (cursor 100) and a Follow subscriber
// resuming from its pre-crash cursor 100 receive it.
func TestTailRepairNewRecordReachesSinkAndFollower(t *testing.T) {
	dir := t.TempDir()
	jsonl := filepath.Join(dir, "events.jsonl")
	cfg := testConfig(t, dir)
	cfg.Sinks = []SinkConfig{fileSink("archive", jsonl)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	r := startCollector(t, cfg)
	agent := dial(t, r.c.GRPCAddr(), agentToken)
	var occs []*eventpipev1.Occurrence
	for i := range 100 {
		occs = append(occs, occ(fmt.Sprintf("before-%d", i), "sb-1", "ws1", "one", "gw-a"))
	}
	if _, err := ship(t, ctx, agent, batch(1, "prod", "10", occs...)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); len(readJSONL(t, jsonl)) < 100; {
		if time.Now().After(deadline) {
			t.Fatal("the file sink did not deliver the first 100")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := readCursorFile(t, filepath.Join(cfg.Store.Dir, "cursors", "archive")); got != 100 {
		t.Fatalf("sink cursor after a clean stop = %d, want 100", got)
	}
	segs, _ := filepath.Glob(filepath.Join(cfg.Store.Dir, "log", "*.seg"))
	seg := segs[len(segs)-1]
	st, _ := os.Stat(seg)
	if err := os.Truncate(seg, st.Size()-5); err != nil {
		t.Fatal(err)
	}

	if _, err := New(cfg, testLogger(t), prometheus.NewRegistry()); !errors.Is(err, store.ErrDataLoss) {
		t.Fatalf("New after losing an acknowledged record: %v, want ErrDataLoss", err)
	}
	cfg.Store.AcceptDataLoss = true
	r2 := startCollector(t, cfg)
	agent2 := dial(t, r2.c.GRPCAddr(), agentToken)
	reader := dial(t, r2.c.GRPCAddr(), readerAll)
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	fs, err := eventpipev1.NewFollowClient(reader).Follow(fctx, &eventpipev1.FollowRequest{SandboxId: "sb-1", AfterCursor: 100})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Header(); err != nil {
		t.Fatalf("Follow from the pre-crash cursor 100: %v", err)
	}
	if _, err := ship(t, ctx, agent2, batch(2, "prod", "11", occ("after", "sb-1", "ws1", "one", "gw-a"))); err != nil {
		t.Fatal(err)
	}
	got, err := fs.Recv()
	if err != nil {
		t.Fatalf("Follow from cursor 100 after the repair: %v", err)
	}
	if got.GetOccurrence().GetEventId() != "after" || got.GetCursor() != 101 {
		t.Fatalf("Follow got %s at cursor %d, want the new occurrence at 101", got.GetOccurrence().GetEventId(), got.GetCursor())
	}
	for deadline := time.Now().Add(20 * time.Second); readJSONL(t, jsonl)["after"] == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the file sink (cursor 100) never delivered the occurrence stored after the repair")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A resume cursor beyond the end of the log is refused loudly: an error
	// for the subscriber, an ERROR log and a metric for the operator.
	if _, err := follow(t, ctx, reader, &eventpipev1.FollowRequest{SandboxId: "sb-1", AfterCursor: 5000}, 0); status.Code(err) != codes.OutOfRange {
		t.Fatalf("Follow from cursor 5000: %v, want OutOfRange", err)
	}
	if got := counterValue(t, r2.reg, "eventpipe_collector_follow_cursor_beyond_log_total", nil); got != 1 {
		t.Fatalf("eventpipe_collector_follow_cursor_beyond_log_total = %v, want 1", got)
	}
}
