package collector

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// seedFollow stores, in this order: 5 occurrences of sandbox sb-1 (ws1,
// "one", gateway gw-a) interleaved with unattributed ones and sb-2 (ws2,
// gateway gw-a) and sb-3 (ws1, "three", gateway gw-b).
func seedFollow(t *testing.T, ctx context.Context, conn *grpc.ClientConn) {
	t.Helper()
	var occs []*eventpipev1.Occurrence
	for i := range 5 {
		occs = append(occs,
			occ(fmt.Sprintf("sb1-%d", i), "sb-1", "ws1", "one", "gw-a"),
			occ(fmt.Sprintf("none-%d", i), "", "", "", ""),
			occ(fmt.Sprintf("sb2-%d", i), "sb-2", "ws2", "two", "gw-a"),
			occ(fmt.Sprintf("sb3-%d", i), "sb-3", "ws1", "three", "gw-b"),
		)
	}
	if _, err := ship(t, ctx, conn, batch(1, "prod", "10", occs...)); err != nil {
		t.Fatal(err)
	}
}

func TestFollowTailResumeLive(t *testing.T) {
	r := startCollector(t, testConfig(t, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	agent := dial(t, r.c.GRPCAddr(), agentToken)
	reader := dial(t, r.c.GRPCAddr(), readerAll)
	seedFollow(t, ctx, agent)

	cases := []struct {
		name string
		req  *eventpipev1.FollowRequest
		want string
	}{
		{"tail by sandbox id", &eventpipev1.FollowRequest{SandboxId: "sb-1", Tail: 3, NoFollow: true}, "sb1-2,sb1-3,sb1-4"},
		{"tail larger than history", &eventpipev1.FollowRequest{SandboxId: "sb-1", Tail: 50, NoFollow: true}, "sb1-0,sb1-1,sb1-2,sb1-3,sb1-4"},
		{"workspace and name", &eventpipev1.FollowRequest{Workspace: "ws1", SandboxName: "three", Tail: 2, NoFollow: true}, "sb3-3,sb3-4"},
		{"workspace", &eventpipev1.FollowRequest{Workspace: "ws1", Tail: 3, NoFollow: true}, "sb3-3,sb1-4,sb3-4"},
		{"gateway", &eventpipev1.FollowRequest{GatewayId: "gw-a", Tail: 2, NoFollow: true}, "sb1-4,sb2-4"},
		// Cursors 1..20: sb1-i is at 4i+1. Resume after sb1-2 (cursor 9).
		{"resume after cursor", &eventpipev1.FollowRequest{SandboxId: "sb-1", AfterCursor: 9, NoFollow: true}, "sb1-3,sb1-4"},
		{"no tail, no cursor, no follow", &eventpipev1.FollowRequest{SandboxId: "sb-1", NoFollow: true}, ""},
		{"unknown sandbox", &eventpipev1.FollowRequest{SandboxId: "nope", Tail: 10, NoFollow: true}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := follow(t, ctx, reader, tc.req, 0)
			if err != nil {
				t.Fatal(err)
			}
			if ids(got) != tc.want {
				t.Fatalf("got %q, want %q", ids(got), tc.want)
			}
			for _, m := range got {
				if m.GetCursor() == 0 {
					t.Fatalf("message without cursor: %v", m)
				}
			}
		})
	}

	// Cursor = log offset: sb1-2 is the 9th record.
	got, err := follow(t, ctx, reader, &eventpipev1.FollowRequest{SandboxId: "sb-1", Tail: 5, NoFollow: true}, 0)
	if err != nil || len(got) != 5 || got[2].GetCursor() != 9 {
		t.Fatalf("cursor of sb1-2 = %v (%v), want 9", got, err)
	}

	// Live: tail 1, then what arrives after.
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	st, err := eventpipev1.NewFollowClient(reader).Follow(lctx, &eventpipev1.FollowRequest{SandboxId: "sb-1", Tail: 1})
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.Recv()
	if err != nil || first.GetOccurrence().GetEventId() != "sb1-4" {
		t.Fatalf("first live message = %v, %v", first, err)
	}
	if _, err := ship(t, ctx, agent, batch(1, "prod", "11",
		occ("none-live", "", "", "", ""), occ("sb1-live-1", "sb-1", "ws1", "one", "gw-a"),
		occ("sb2-live", "sb-2", "ws2", "two", "gw-a"), occ("sb1-live-2", "sb-1", "ws1", "one", "gw-a"))); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sb1-live-1", "sb1-live-2"} {
		m, err := st.Recv()
		if err != nil || m.GetOccurrence().GetEventId() != want {
			t.Fatalf("live message = %v, %v; want %s", m, err, want)
		}
	}
	if got := counterValue(t, r.reg, "eventpipe_collector_follow_subscribers", nil); got != 1 {
		t.Errorf("subscribers gauge = %v, want 1", got)
	}
	lcancel()
	// Resume after disconnect from the last cursor seen.
	if _, err := ship(t, ctx, agent, batch(2, "prod", "12", occ("sb1-after", "sb-1", "ws1", "one", "gw-a"))); err != nil {
		t.Fatal(err)
	}
	got, err = follow(t, ctx, reader, &eventpipev1.FollowRequest{SandboxId: "sb-1", AfterCursor: first.GetCursor(), NoFollow: true}, 0)
	if err != nil || ids(got) != "sb1-live-1,sb1-live-2,sb1-after" {
		t.Fatalf("resume: %q, %v", ids(got), err)
	}
}

func TestFollowSelectorValidation(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Follow.MaxTail = 100
	r := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reader := dial(t, r.c.GRPCAddr(), readerAll)
	for _, req := range []*eventpipev1.FollowRequest{
		{},
		{SandboxId: "a", Workspace: "ws1"},
		{SandboxId: "a", GatewayId: "g"},
		{SandboxName: "n"},
		{SandboxId: "a", Tail: 101},
	} {
		if _, err := follow(t, ctx, reader, req, 0); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: err %v, want InvalidArgument", req, err)
		}
	}
	// A cursor beyond the end of the log (the log was reset) is refused, not
	// waited for.
	if _, err := follow(t, ctx, reader, &eventpipev1.FollowRequest{SandboxId: "a", AfterCursor: 5000}, 0); status.Code(err) != codes.OutOfRange {
		t.Errorf("cursor beyond the log: %v, want OutOfRange", err)
	}
}

// A subscriber that stops reading while 100k records arrive is neither cut
// off nor skipped: once it reads again it gets every record, in order.
func TestFollowSlowSubscriberCatchesUp(t *testing.T) {
	const total = 100_000
	r := startCollector(t, testConfig(t, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	agent := dial(t, r.c.GRPCAddr(), agentToken)
	reader := dial(t, r.c.GRPCAddr(), readerWS1)

	st, err := eventpipev1.NewFollowClient(reader).Follow(ctx, &eventpipev1.FollowRequest{Workspace: "ws1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Header(); err != nil { // the server has taken its position
		t.Fatal(err)
	}
	const per = 1000
	var bs []*eventpipev1.Batch
	for b := range total / per {
		occs := make([]*eventpipev1.Occurrence, 0, per)
		for i := range per {
			n := b*per + i
			occs = append(occs, occ(fmt.Sprintf("slow-%d", n), fmt.Sprintf("sb-%d", n%50), "ws1", "n", "gw"))
		}
		bs = append(bs, batch(uint64(b+1), "prod", fmt.Sprint(b), occs...))
	}
	if _, err := ship(t, ctx, agent, bs...); err != nil {
		t.Fatal(err)
	}
	if _, last := r.c.Store().Bounds(); last != total {
		t.Fatalf("log has %d records, want %d", last, total)
	}
	// Only now does the subscriber read: it is 100k records behind.
	for n := range total {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("after %d messages: %v", n, err)
		}
		if want := fmt.Sprintf("slow-%d", n); m.GetOccurrence().GetEventId() != want || m.GetCursor() != uint64(n+1) {
			t.Fatalf("message %d = %s at cursor %d, want %s at %d", n, m.GetOccurrence().GetEventId(), m.GetCursor(), want, n+1)
		}
	}
}

func TestFollowAuthorization(t *testing.T) {
	r := startCollector(t, testConfig(t, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := r.c.GRPCAddr()
	seedFollow(t, ctx, dial(t, addr, agentToken))

	cases := []struct {
		name  string
		token string
		req   *eventpipev1.FollowRequest
		code  codes.Code
		want  string
	}{
		{"no token", "", &eventpipev1.FollowRequest{SandboxId: "sb-1", Tail: 5, NoFollow: true}, codes.Unauthenticated, ""},
		{"unknown token", "not-a-real-token-at-all", &eventpipev1.FollowRequest{SandboxId: "sb-1", Tail: 5, NoFollow: true}, codes.Unauthenticated, ""},
		{"agent may not follow", agentToken, &eventpipev1.FollowRequest{SandboxId: "sb-1", Tail: 5, NoFollow: true}, codes.PermissionDenied, ""},
		{"reader of ws1 follows ws1", readerWS1, &eventpipev1.FollowRequest{Workspace: "ws1", SandboxName: "one", Tail: 2, NoFollow: true}, codes.OK, "sb1-3,sb1-4"},
		{"reader of ws1 refused ws2", readerWS1, &eventpipev1.FollowRequest{Workspace: "ws2", Tail: 2, NoFollow: true}, codes.PermissionDenied, ""},
		{"reader of ws1, sandbox of ws2: filtered", readerWS1, &eventpipev1.FollowRequest{SandboxId: "sb-2", Tail: 5, NoFollow: true}, codes.OK, ""},
		{"reader of ws2, sandbox of ws2", readerWS2, &eventpipev1.FollowRequest{SandboxId: "sb-2", Tail: 1, NoFollow: true}, codes.OK, "sb2-4"},
		{"reader of ws1, gateway spanning ws1 and ws2: only ws1", readerWS1, &eventpipev1.FollowRequest{GatewayId: "gw-a", Tail: 3, NoFollow: true}, codes.OK, "sb1-2,sb1-3,sb1-4"},
		{"reader of all, gateway", readerAll, &eventpipev1.FollowRequest{GatewayId: "gw-a", Tail: 3, NoFollow: true}, codes.OK, "sb2-3,sb1-4,sb2-4"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := follow(t, ctx, dial(t, addr, tc.token), tc.req, 0)
			if status.Code(err) != tc.code {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, tc.code)
			}
			if ids(got) != tc.want {
				t.Fatalf("got %q, want %q", ids(got), tc.want)
			}
		})
	}
	// Readers may not ingest nor read cursors.
	reader := dial(t, addr, readerAll)
	if _, err := eventpipev1.NewIngestClient(reader).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reader GetCursor: %v, want PermissionDenied", err)
	}
	if _, err := ship(t, ctx, reader, batch(1, "prod", "1", occ("evil/1", "sb-1", "ws1", "one", "gw-a"))); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reader Ship: %v, want PermissionDenied", err)
	}
	if _, err := eventpipev1.NewIngestClient(dial(t, addr, "")).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("anonymous GetCursor: %v, want Unauthenticated", err)
	}
	for reason, want := range map[string]float64{authMissing: 2, authBadToken: 1, authWrongRole: 3, authWorkspace: 1} {
		if got := counterValue(t, r.reg, "eventpipe_collector_auth_failures_total", map[string]string{"reason": reason}); got != want {
			t.Errorf("auth failures{reason=%s} = %v, want %v", reason, got, want)
		}
	}
}

// A subscriber whose resume cursor is older than retention is told how many
// records it lost, in the header, and then gets what exists.
func TestFollowResumeBehindRetentionIsReported(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Store.SegmentBytes = 4 << 10
	cfg.Store.Retention.MaxBytes = 8 << 10
	r := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	agent := dial(t, r.c.GRPCAddr(), agentToken)
	var bs []*eventpipev1.Batch
	for b := range 40 {
		var occs []*eventpipev1.Occurrence
		for i := range 10 {
			occs = append(occs, occ(fmt.Sprintf("ret-%d-%d", b, i), "sb-1", "ws1", "one", "gw"))
		}
		bs = append(bs, batch(uint64(b+1), "prod", fmt.Sprint(b), occs...))
	}
	if _, err := ship(t, ctx, agent, bs...); err != nil {
		t.Fatal(err)
	}
	// Retention runs periodically in the store's Run loop; run it now.
	if _, err := r.c.Store().ApplyRetention(); err != nil {
		t.Fatal(err)
	}
	first, last := r.c.Store().Bounds()
	if first <= 1 {
		t.Fatalf("retention removed nothing (bounds %d..%d)", first, last)
	}
	st, err := eventpipev1.NewFollowClient(dial(t, r.c.GRPCAddr(), readerWS1)).Follow(ctx, &eventpipev1.FollowRequest{SandboxId: "sb-1", AfterCursor: 1, NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := st.Header()
	if err != nil {
		t.Fatal(err)
	}
	lost := hdr.Get(HeaderLostRecords)
	if len(lost) != 1 || lost[0] != fmt.Sprint(first-2) {
		t.Fatalf("%s = %v, want %d (records 2..%d are gone)", HeaderLostRecords, lost, first-2, first-1)
	}
	n := 0
	for {
		m, err := st.Recv()
		if err != nil {
			break
		}
		if n == 0 && m.GetCursor() != first {
			t.Fatalf("first message at cursor %d, want %d", m.GetCursor(), first)
		}
		n++
	}
	if uint64(n) != last-first+1 {
		t.Fatalf("received %d, want %d (everything retained)", n, last-first+1)
	}
	var tr metadata.MD = st.Trailer()
	if got := tr.Get(HeaderLostRecords); len(got) != 1 || got[0] != fmt.Sprint(first-2) {
		t.Fatalf("trailer %s = %v", HeaderLostRecords, got)
	}
}

// A tail replay scans at most follow.max_tail_scan records backwards and
// says where it stopped, rather than pretending there is nothing older.
func TestFollowTailScanLimitIsReported(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Follow.ReadChunk = 8
	cfg.Follow.MaxTailScan = 16
	r := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	occs := []*eventpipev1.Occurrence{occ("rare-1", "sb-rare", "ws1", "rare", "gw"), occ("rare-2", "sb-rare", "ws1", "rare", "gw")}
	for i := range 38 {
		occs = append(occs, occ(fmt.Sprintf("common-%d", i), "sb-common", "ws1", "common", "gw"))
	}
	if _, err := ship(t, ctx, dial(t, r.c.GRPCAddr(), agentToken), batch(1, "prod", "1", occs...)); err != nil {
		t.Fatal(err)
	}
	reader := dial(t, r.c.GRPCAddr(), readerWS1)
	run := func(sandbox string, tail uint32) ([]*eventpipev1.FollowResponse, metadata.MD) {
		st, err := eventpipev1.NewFollowClient(reader).Follow(ctx, &eventpipev1.FollowRequest{SandboxId: sandbox, Tail: tail, NoFollow: true})
		if err != nil {
			t.Fatal(err)
		}
		hdr, err := st.Header()
		if err != nil {
			t.Fatal(err)
		}
		var got []*eventpipev1.FollowResponse
		for {
			m, err := st.Recv()
			if err != nil {
				break
			}
			got = append(got, m)
		}
		return got, hdr
	}
	got, hdr := run("sb-rare", 5)
	if len(got) != 0 || strings.Join(hdr.Get(HeaderTailScannedFrom), "") != "25" {
		t.Fatalf("rare sandbox: %q, %s=%v; want nothing and scanned-from 25", ids(got), HeaderTailScannedFrom, hdr.Get(HeaderTailScannedFrom))
	}
	got, hdr = run("sb-common", 3)
	if ids(got) != "common-35,common-36,common-37" || len(hdr.Get(HeaderTailScannedFrom)) != 0 {
		t.Fatalf("common sandbox: %q, header %v", ids(got), hdr)
	}
}
