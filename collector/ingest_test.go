package collector

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

func TestIngestAcksAndDedupe(t *testing.T) {
	dir := t.TempDir()
	r := startCollector(t, testConfig(t, dir))
	conn := dial(t, r.c.GRPCAddr(), agentToken)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	a, b, c := occ("uid-a/1", "sb-1", "ws1", "one", "gw"), occ("uid-b/1", "sb-1", "ws1", "one", "gw"), occ("uid-c/1", "", "", "", "")
	acks, err := ship(t, ctx, conn,
		batch(1, "prod", "100", a, b),
		batch(2, "prod", "101", c),
		// The same event_id again (a relist), plus a new one.
		batch(3, "prod", "102", occ("uid-a/1", "sb-1", "ws1", "one", "gw"), occ("uid-d/1", "sb-2", "ws1", "two", "gw")),
		// A bookmark: no occurrences, only a resourceVersion.
		batch(4, "prod", "150"),
	)
	if err != nil {
		t.Fatalf("ship: %v", err)
	}
	want := []struct {
		seq               uint64
		stored, dups      uint32
		lastOffsetNonZero bool
	}{{1, 2, 0, true}, {2, 1, 0, true}, {3, 1, 1, true}, {4, 0, 0, false}}
	if len(acks) != len(want) {
		t.Fatalf("got %d acks, want %d", len(acks), len(want))
	}
	for i, w := range want {
		g := acks[i]
		if g.GetSeq() != w.seq || g.GetStored() != w.stored || g.GetDuplicates() != w.dups || (g.GetLastOffset() != 0) != w.lastOffsetNonZero {
			t.Errorf("ack %d = %v, want seq %d stored %d duplicates %d", i, g, w.seq, w.stored, w.dups)
		}
	}
	if acks[2].GetLastOffset() != 4 {
		t.Errorf("last offset after 4 stored occurrences = %d, want 4", acks[2].GetLastOffset())
	}
	cur, err := eventpipev1.NewIngestClient(conn).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod", Stream: DefaultStream})
	if err != nil || !cur.GetFound() || cur.GetResourceVersion() != "150" {
		t.Fatalf("GetCursor = %v, %v; want 150", cur, err)
	}
	cur, err = eventpipev1.NewIngestClient(conn).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "staging"})
	if err != nil || cur.GetFound() {
		t.Fatalf("GetCursor(unknown cluster) = %v, %v; want not found", cur, err)
	}
	if got := counterValue(t, r.reg, "eventpipe_collector_ingested_occurrences_total", nil); got != 4 {
		t.Errorf("ingested metric = %v, want 4", got)
	}
	if got := counterValue(t, r.reg, "eventpipe_collector_deduplicated_occurrences_total", nil); got != 1 {
		t.Errorf("deduplicated metric = %v, want 1", got)
	}
	if got := counterValue(t, r.reg, "eventpipe_collector_ack_latency_seconds", nil); got != 4 {
		t.Errorf("ack latency observations = %v, want 4", got)
	}
	recs, _, err := r.c.Store().Read(ctx, 1, 100)
	if err != nil || len(recs) != 4 {
		t.Fatalf("log holds %d records (%v), want 4", len(recs), err)
	}
}

func TestIngestRejectsBadBatches(t *testing.T) {
	r := startCollector(t, testConfig(t, t.TempDir()))
	conn := dial(t, r.c.GRPCAddr(), agentToken)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	acks, err := ship(t, ctx, conn, batch(1, "prod", "1", occ("x/1", "", "", "", "")), batch(2, "", "2", occ("y/1", "", "", "", "")))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "cluster must not be empty") {
		t.Fatalf("empty cluster: err = %v, want InvalidArgument about the cluster", err)
	}
	if rej := batchRejection(err); rej == nil || rej.GetSeq() != 2 {
		t.Errorf("empty cluster: BatchRejection %v, want one naming seq 2 (the agent drops that batch)", rej)
	}
	if len(acks) > 1 {
		t.Fatalf("got %d acks, want at most the first batch's", len(acks))
	}
	_, err = ship(t, ctx, conn, batch(5, "prod", "1"), batch(5, "prod", "2"))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("repeated seq: err = %v, want InvalidArgument", err)
	}
	if rej := batchRejection(err); rej != nil {
		t.Errorf("repeated seq is a protocol error, not a refusal of one batch: got BatchRejection %v", rej)
	}
	// An occurrence without event_id is refused (named in the ack), counted,
	// and the rest stored.
	acks, err = ship(t, ctx, conn, batch(1, "prod", "3", occ("", "", "", "", ""), occ("z/1", "", "", "", "")))
	if err != nil || len(acks) != 1 || acks[0].GetStored() != 1 {
		t.Fatalf("ack = %v, %v; want 1 stored", acks, err)
	}
	if r := acks[0].GetRejected(); len(r) != 1 || r[0].GetIndex() != 0 || r[0].GetReason() != "missing_event_id" {
		t.Errorf("ack rejected = %v, want index 0 missing_event_id", r)
	}
	if got := counterValue(t, r.reg, "eventpipe_collector_ingest_rejected_occurrences_total", map[string]string{"reason": "missing_event_id"}); got != 1 {
		t.Errorf("rejected occurrences = %v, want 1", got)
	}
	if _, err := eventpipev1.NewIngestClient(conn).GetCursor(ctx, &eventpipev1.GetCursorRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("GetCursor without cluster: %v, want InvalidArgument", err)
	}
}

// Many batches in flight on one stream are acknowledged in seq order, each
// after it is stored.
func TestIngestPipelinedAcksInOrder(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.GRPC.IngestPipeline = 4
	r := startCollector(t, cfg)
	conn := dial(t, r.c.GRPCAddr(), agentToken)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var bs []*eventpipev1.Batch
	for i := range 200 {
		var occs []*eventpipev1.Occurrence
		for _, id := range seqIDs("p", i*10, 10) {
			occs = append(occs, occ(id, "sb", "ws1", "n", "gw"))
		}
		bs = append(bs, batch(uint64(i+1), "prod", strconv.Itoa(1000+i), occs...))
	}
	acks, err := ship(t, ctx, conn, bs...)
	if err != nil {
		t.Fatal(err)
	}
	if len(acks) != 200 {
		t.Fatalf("%d acks, want 200", len(acks))
	}
	var lastOffset uint64
	for i, a := range acks {
		if a.GetSeq() != uint64(i+1) || a.GetStored() != 10 {
			t.Fatalf("ack %d = %v, want seq %d stored 10", i, a, i+1)
		}
		if a.GetLastOffset() <= lastOffset {
			t.Fatalf("ack %d last_offset %d not after %d: batches reordered in the log", i, a.GetLastOffset(), lastOffset)
		}
		lastOffset = a.GetLastOffset()
	}
	if _, last := r.c.Store().Bounds(); last != 2000 {
		t.Fatalf("log last offset %d, want 2000", last)
	}
}

// GetCursor survives a restart, and a re-sent batch is recognised.
func TestGetCursorAndDedupeAfterRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	r := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := ship(t, ctx, dial(t, r.c.GRPCAddr(), agentToken), batch(1, "prod", "777", occ("r/1", "sb", "ws1", "n", "gw"), occ("r/2", "sb", "ws1", "n", "gw"))); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("stop: %v", err)
	}

	r2 := startCollector(t, cfg)
	conn := dial(t, r2.c.GRPCAddr(), agentToken)
	cur, err := eventpipev1.NewIngestClient(conn).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"})
	if err != nil || cur.GetResourceVersion() != "777" || !cur.GetFound() {
		t.Fatalf("GetCursor after restart = %v, %v; want 777", cur, err)
	}
	acks, err := ship(t, ctx, conn, batch(1, "prod", "778", occ("r/1", "sb", "ws1", "n", "gw"), occ("r/2", "sb", "ws1", "n", "gw"), occ("r/3", "sb", "ws1", "n", "gw")))
	if err != nil || len(acks) != 1 || acks[0].GetStored() != 1 || acks[0].GetDuplicates() != 2 {
		t.Fatalf("re-sent batch acks = %v, %v; want 1 stored 2 duplicates", acks, err)
	}
}

func TestIngestMessageSizeLimit(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.GRPC.MaxRecvBytes = 64 << 10
	r := startCollector(t, cfg)
	conn := dial(t, r.c.GRPCAddr(), agentToken)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	big := occ("big/1", "sb", "ws1", "n", "gw")
	big.Message = strings.Repeat("x", 100<<10)
	_, err := ship(t, ctx, conn, batch(1, "prod", "1", big))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized batch: %v, want ResourceExhausted", err)
	}
	// Issue 21 defect 4: the refusal is counted with its reason (and
	// logged), not only seen by the agent.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := counterValue(t, r.reg, "eventpipe_collector_ingest_rejected_batches_total", map[string]string{"reason": "too_large"})
		if got == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ingest_rejected_batches_total{reason=too_large} = %v, want 1", got)
		}
	}
	// A batch under the limit still goes through on a new stream.
	acks, err := ship(t, ctx, conn, batch(1, "prod", "1", occ("small/1", "sb", "ws1", "n", "gw")))
	if err != nil || len(acks) != 1 || acks[0].GetStored() != 1 {
		t.Fatalf("small batch: %v, %v", acks, err)
	}
	if _, last := r.c.Store().Bounds(); last != 1 {
		t.Fatalf("log last offset %d, want 1 (the oversized batch must not be stored)", last)
	}
}

// Batches that arrive while an append runs are stored together; their acks
// still say exactly what each batch stored, also when some occurrences
// repeat ones of earlier batches in the same group.
func TestIngestGroupedAcksWithDuplicates(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.GRPC.IngestPipeline = 16
	r := startCollector(t, cfg)
	conn := dial(t, r.c.GRPCAddr(), agentToken)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 300
	var bs []*eventpipev1.Batch
	for i := range n {
		var occs []*eventpipev1.Occurrence
		for _, id := range seqIDs(fmt.Sprintf("g%d", i), 0, 5) {
			occs = append(occs, occ(id, "sb", "ws1", "n", "gw"))
		}
		if i > 0 {
			// A relist repeats the previous batch's last occurrence.
			occs = append(occs, occ(fmt.Sprintf("g%d-4", i-1), "sb", "ws1", "n", "gw"))
		}
		bs = append(bs, batch(uint64(i+1), "prod", strconv.Itoa(i+1), occs...))
	}
	acks, err := ship(t, ctx, conn, bs...)
	if err != nil || len(acks) != n {
		t.Fatalf("%d acks, %v", len(acks), err)
	}
	for i, a := range acks {
		wantDup := uint32(1)
		if i == 0 {
			wantDup = 0
		}
		if a.GetSeq() != uint64(i+1) || a.GetStored() != 5 || a.GetDuplicates() != wantDup || a.GetLastOffset() != uint64(5*(i+1)) {
			t.Fatalf("ack %d = %v; want stored 5, duplicates %d, last_offset %d", i, a, wantDup, 5*(i+1))
		}
	}
	calls := counterValue(t, r.reg, "eventpipe_collector_ingest_append_group_batches", nil)
	if calls >= n {
		t.Errorf("%v appends for %d batches: no batches were grouped", calls, n)
	}
	t.Logf("%d batches stored by %v appends", n, calls)
	cur, err := eventpipev1.NewIngestClient(conn).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"})
	if err != nil || cur.GetResourceVersion() != strconv.Itoa(n) {
		t.Fatalf("cursor %v, %v; want %d", cur, err, n)
	}
}

// Shutdown stops ingress first and does not wait the whole grace for
// long-lived streams: an open Ship stream gets its pending acks, then
// Unavailable; an open Follow stream gets Unavailable (resume by cursor).
func TestShutdownDrainsStreams(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.GRPC.ShutdownGrace = 20 * time.Second
	r := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := eventpipev1.NewIngestClient(dial(t, r.c.GRPCAddr(), agentToken)).Ship(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(batch(1, "prod", "1", occ("s/1", "sb", "ws1", "n", "gw"))); err != nil {
		t.Fatal(err)
	}
	if a, err := st.Recv(); err != nil || a.GetStored() != 1 {
		t.Fatalf("ack %v, %v", a, err)
	}
	fl, err := eventpipev1.NewFollowClient(dial(t, r.c.GRPCAddr(), readerAll)).Follow(ctx, &eventpipev1.FollowRequest{Workspace: "ws1", Tail: 1})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := fl.Recv(); err != nil || m.GetOccurrence().GetEventId() != "s/1" {
		t.Fatalf("follow: %v, %v", m, err)
	}
	start := time.Now()
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("shutdown took %s with open streams (grace 20s): streams were not drained", took)
	}
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("Ship after shutdown: %v, want Unavailable", err)
	}
	if _, err := fl.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("Follow after shutdown: %v, want Unavailable", err)
	}
}

// On shutdown the sinks get the rest of the grace to deliver what the log
// holds: a stop right after ingest leaves nothing behind in the file sink.
func TestShutdownFlushesSinks(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.GRPC.ShutdownGrace = 10 * time.Second
	jsonl := filepath.Join(dir, "events.jsonl")
	fs := fileSink("archive", jsonl)
	fs.Batch.MaxWait = time.Second
	cfg.Sinks = []SinkConfig{fs}
	r := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var occs []*eventpipev1.Occurrence
	for _, id := range seqIDs("flush", 0, 100) {
		occs = append(occs, occ(id, "sb", "ws1", "n", "gw"))
	}
	if _, err := ship(t, ctx, dial(t, r.c.GRPCAddr(), agentToken), batch(1, "prod", "1", occs...)); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := readJSONL(t, jsonl); len(got) != 100 {
		t.Fatalf("file sink has %d occurrences after shutdown, want 100", len(got))
	}
}

// batchRejection is the BatchRejection detail of a status error, if any.
func batchRejection(err error) *eventpipev1.BatchRejection {
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*eventpipev1.BatchRejection); ok {
			return r
		}
	}
	return nil
}

// An occurrence the log refuses (too large) is refused on its own, named in
// the ack; the rest of its batch, and the batches pipelined with it, are
// stored, and the cursor moves past it: one bad occurrence never stalls a
// stream.
func TestIngestRefusesOneOccurrenceNotTheBatch(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.GRPC.IngestPipeline = 4
	r := startCollector(t, cfg)
	conn := dial(t, r.c.GRPCAddr(), agentToken)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	huge := occ("big/1", "", "", "", "")
	huge.Message = strings.Repeat("x", 5<<20)
	acks, err := ship(t, ctx, conn,
		batch(1, "prod", "10", occ("a/1", "", "", "", "")),
		batch(2, "prod", "11", occ("b/1", "", "", "", ""), huge, occ("c/1", "", "", "", "")),
		batch(3, "prod", "12", occ("d/1", "", "", "", "")),
	)
	if err != nil {
		t.Fatalf("ship: %v (one oversized occurrence must not end the stream)", err)
	}
	if len(acks) != 3 {
		t.Fatalf("%d acks, want 3", len(acks))
	}
	if a := acks[1]; a.GetStored() != 2 || len(a.GetRejected()) != 1 {
		t.Fatalf("ack of the batch with the oversized occurrence = stored %d rejected %v, want 2 stored and 1 rejected", a.GetStored(), a.GetRejected())
	}
	if rj := acks[1].GetRejected()[0]; rj.GetIndex() != 1 || rj.GetEventId() != "big/1" || rj.GetReason() != "too_large" {
		t.Errorf("rejection = %v, want index 1 big/1 too_large", rj)
	}
	if acks[0].GetStored() != 1 || acks[2].GetStored() != 1 || len(acks[0].GetRejected())+len(acks[2].GetRejected()) != 0 {
		t.Errorf("neighbour acks = %v, %v; want 1 stored each, nothing rejected", acks[0], acks[2])
	}
	cur, err := eventpipev1.NewIngestClient(conn).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"})
	if err != nil || cur.GetResourceVersion() != "12" {
		t.Errorf("cursor = %v, %v; want 12 (moved past the refused occurrence)", cur, err)
	}
	var stored []string
	recs, _, err := r.c.Store().Read(ctx, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		stored = append(stored, rec.Occurrence.GetEventId())
	}
	if got := strings.Join(stored, ","); got != "a/1,b/1,c/1,d/1" {
		t.Errorf("log holds %s, want a/1,b/1,c/1,d/1", got)
	}
	if got := counterValue(t, r.reg, "eventpipe_collector_ingest_rejected_occurrences_total", map[string]string{"reason": "too_large"}); got != 1 {
		t.Errorf("rejected too_large = %v, want 1", got)
	}
}
