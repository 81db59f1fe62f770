package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// runShipper runs a shipper against the Ingest service at addr until the
// test ends.
func runShipper(t *testing.T, addr string, cfg Config) (*shipper, *deadLetters, *prometheus.Registry) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	dl := newDeadLetters(testLogger(t), m)
	sh := newShipper(cfg, eventpipev1.NewIngestClient(conn), testLogger(t), m, dl)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sh.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close()
	})
	return sh, dl, reg
}

func dlOcc(id, msg string) *eventpipev1.Occurrence {
	now := timestamppb.New(time.Unix(1_790_000_000, 0))
	return &eventpipev1.Occurrence{SchemaVersion: eventpipev1.SchemaVersion, EventId: id, OccurredAt: now, ObservedAt: now,
		Namespace: "dead-letter", Type: "Warning", Reason: "Failed", Message: msg, Count: 1}
}

func shipBatches(t *testing.T, sh *shipper, batches ...*eventpipev1.Batch) {
	t.Helper()
	for _, b := range batches {
		if err := sh.submit(context.Background(), b, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "every batch acknowledged or dropped", func() (bool, string) {
		o := sh.oldestUnacked()
		return o.IsZero(), "batches still in flight"
	})
}

// Against the real collector: an oversized occurrence (refused by the log),
// a batch the collector refuses whole (no cluster) and an occurrence the
// agent cannot even encode (invalid UTF-8) are each dead-lettered with
// their event ids, counted and served at /debug/deadletter, and everything
// else, before and after, is stored: the agent never stalls on them.
func TestRefusedOccurrencesAreDeadLettered(t *testing.T) {
	col := startCollector(t, t.TempDir())
	cfg := testConfig("deadletter", col.addr())
	cfg.Ship.BackoffInitial = 50 * time.Millisecond
	sh, dl, reg := runShipper(t, col.addr(), cfg)

	b := func(rv string, occs ...*eventpipev1.Occurrence) *eventpipev1.Batch {
		return &eventpipev1.Batch{Cluster: "deadletter", Stream: "events", ResourceVersion: rv, Occurrences: occs}
	}
	noCluster := b("13", dlOcc("d/1", "whole batch refused"))
	noCluster.Cluster = ""
	shipBatches(t, sh,
		b("11", dlOcc("a/1", "ok")),
		b("12", dlOcc("b/1", "ok"), dlOcc("huge/1", strings.Repeat("x", 5<<20)), dlOcc("c/1", "ok")),
		noCluster,
		b("14", dlOcc("e/1", "ok"), dlOcc("utf8/1", "bad \xff\xfe bytes")),
		b("15", dlOcc("f/1", "ok")),
	)

	var stored []string
	for _, o := range col.all(t) {
		stored = append(stored, o.GetEventId())
	}
	if got := strings.Join(stored, ","); got != "a/1,b/1,c/1,e/1,f/1" {
		t.Errorf("collector stored %s, want a/1,b/1,c/1,e/1,f/1", got)
	}
	if rv, _ := col.c.Store().ClusterCursor("deadletter", "events"); rv != "15" {
		t.Errorf("collector cursor %q, want 15 (the agent moved on)", rv)
	}
	want := map[string]string{"huge/1": dlTooLarge, "d/1": dlBatchRefused, "utf8/1": dlUnencodable}
	es, total, _ := dl.entries()
	if total != 3 || len(es) != 3 {
		t.Fatalf("dead letters: %d kept, %d total, want 3: %+v", len(es), total, es)
	}
	for _, e := range es {
		if want[e.EventID] != e.Reason {
			t.Errorf("dead letter %s reason %q, want %q", e.EventID, e.Reason, want[e.EventID])
		}
		if len(e.Occurrence) == 0 || e.Message == "" {
			t.Errorf("dead letter %s lacks the occurrence or the reason's detail: %+v", e.EventID, e)
		}
	}
	for reason, n := range map[string]float64{dlTooLarge: 1, dlBatchRefused: 1, dlUnencodable: 1} {
		if got := counter(t, reg, "eventpipe_agent_dead_letter_total", map[string]string{"reason": reason}); got != n {
			t.Errorf("dead_letter_total{reason=%s} = %v, want %v", reason, got, n)
		}
	}
	if got := counter(t, reg, "eventpipe_agent_batches_total", map[string]string{"result": "refused"}); got != 1 {
		t.Errorf("batches_total{result=refused} = %v, want 1", got)
	}

	// What an operator reads.
	rr := httptest.NewRecorder()
	a := &Agent{cfg: NewDefaultConfig(), dead: dl}
	a.Handler().ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/debug/deadletter", nil))
	if rr.Code != http.StatusOK {
		t.Fatalf("/debug/deadletter: %d", rr.Code)
	}
	sc := bufio.NewScanner(rr.Body)
	sc.Buffer(nil, 1<<20)
	var lines []map[string]any
	for sc.Scan() {
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("/debug/deadletter line %q: %v", sc.Text(), err)
		}
		lines = append(lines, v)
	}
	if len(lines) != 4 || lines[0]["total"] != float64(3) {
		t.Fatalf("/debug/deadletter: %d lines, header %v; want a header with total 3 and 3 entries", len(lines), lines[0])
	}
	seen := map[string]bool{}
	for _, l := range lines[1:] {
		id, _ := l["event_id"].(string)
		seen[id] = true
		if id == "huge/1" && l["occurrence_truncated"] != true {
			t.Errorf("/debug/deadletter: the 5 MiB occurrence is not marked truncated")
		}
	}
	if !seen["huge/1"] || !seen["d/1"] || !seen["utf8/1"] {
		t.Errorf("/debug/deadletter names %v, want huge/1, d/1, utf8/1", seen)
	}
}

// The ring keeps the newest deadLetterCapacity entries and counts the rest.
func TestDeadLetterRingIsBounded(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	dl := newDeadLetters(testLogger(t), m)
	for i := range deadLetterCapacity + 10 {
		dl.add(uint64(i), dlOcc("id/"+string(rune('a'+i%26)), "m"), "", "too_large", "x")
	}
	es, total, evicted := dl.entries()
	if len(es) != deadLetterCapacity || total != deadLetterCapacity+10 || evicted != 10 {
		t.Fatalf("kept %d, total %d, evicted %d", len(es), total, evicted)
	}
	if es[0].Seq != 10 || es[len(es)-1].Seq != deadLetterCapacity+9 {
		t.Errorf("ring order: first seq %d, last %d; want oldest kept first", es[0].Seq, es[len(es)-1].Seq)
	}
}

// oldCollector refuses, like a collector without BatchRejection details,
// any batch holding the event_id "poison" with a bare InvalidArgument, and
// acknowledges the others.
type oldCollector struct {
	eventpipev1.UnimplementedIngestServer
}

func (oldCollector) Ship(st eventpipev1.Ingest_ShipServer) error {
	for {
		b, err := st.Recv()
		if err != nil {
			return nil
		}
		for _, o := range b.GetOccurrences() {
			if o.GetEventId() == "poison" {
				return status.Error(codes.InvalidArgument, "batch refused by the log")
			}
		}
		if err := st.Send(&eventpipev1.Ack{Seq: b.GetSeq(), Stored: uint32(len(b.GetOccurrences()))}); err != nil {
			return err
		}
	}
}

// Without a detail naming the batch, the shipper finds the refused batch by
// sending one batch per stream, drops only that one, and goes on.
func TestRefusedBatchIsolatedWithoutDetails(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	eventpipev1.RegisterIngestServer(srv, oldCollector{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	cfg := testConfig("old", lis.Addr().String())
	cfg.Ship.MaxInFlight = 4
	cfg.Ship.BackoffInitial = 20 * time.Millisecond
	sh, dl, reg := runShipper(t, lis.Addr().String(), cfg)
	var bs []*eventpipev1.Batch
	for i := range 8 {
		id := "ok/" + string(rune('0'+i))
		if i == 3 {
			id = "poison"
		}
		bs = append(bs, &eventpipev1.Batch{Cluster: "old", ResourceVersion: string(rune('a' + i)), Occurrences: []*eventpipev1.Occurrence{dlOcc(id, "m")}})
	}
	shipBatches(t, sh, bs...)
	es, total, _ := dl.entries()
	if total != 1 || es[0].EventID != "poison" || es[0].Reason != dlBatchRefused {
		t.Fatalf("dead letters %+v (total %d), want only poison as batch_refused", es, total)
	}
	if got := counter(t, reg, "eventpipe_agent_acked_occurrences_total", map[string]string{"result": "stored"}); got != 7 {
		t.Errorf("acked stored = %v, want the 7 other occurrences", got)
	}
}
