package collector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/backbone"
)

const kfTopic = "eventpipe.occurrences"

// kafkaBackbone starts a 3-broker kfake cluster with the backbone topic.
func kafkaBackbone(t *testing.T, parts int32) backbone.Config {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(parts, kfTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	bb := backbone.NewDefaultConfig()
	bb.Conn.Brokers = c.ListenAddrs()
	bb.Topic = kfTopic
	bb.DedupeWindow = 1024
	return bb
}

// produceBackbone writes occurrences as the Kafka-mode ingest does.
func produceBackbone(t *testing.T, bb backbone.Config, occs ...*eventpipev1.Occurrence) {
	t.Helper()
	if err := produceBackboneErr(bb, occs...); err != nil {
		t.Fatal(err)
	}
}

func produceBackboneErr(bb backbone.Config, occs ...*eventpipev1.Occurrence) error {
	opts, _ := bb.ClientOptions()
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(bb.Topic))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	var recs []*kgo.Record
	for _, o := range occs {
		r, err := backbone.Encode(o, "events")
		if err != nil {
			return err
		}
		recs = append(recs, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// kafkaReplica is one collector replica's Follow service on loopback,
// behind the collector's authenticator.
type kafkaReplica struct {
	addr string
	srv  *grpc.Server
	f    *kafkaFollowServer
	reg  *prometheus.Registry
}

func startKafkaFollow(t *testing.T, bb backbone.Config) *kafkaReplica {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(path, []byte(tokensFileYML), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	a := &authenticator{failures: func(r string) { m.authFailures.WithLabelValues(r).Inc() }, logger: testLogger(t)}
	a.state.Store(newAuthState(AuthConfig{}, tokens))
	fc := NewDefaultConfig().Follow
	fc.ReadChunk = 64
	f, err := newKafkaFollowServer(bb, fc, testLogger(t), m, reg, context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.StreamInterceptor(a.stream))
	eventpipev1.RegisterFollowServer(srv, f)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	r := &kafkaReplica{addr: l.Addr().String(), srv: srv, f: f, reg: reg}
	t.Cleanup(r.kill)
	return r
}

// kill drops every stream at once, as a killed process would.
func (r *kafkaReplica) kill() {
	if r.srv == nil {
		return
	}
	r.srv.Stop()
	r.f.Close()
	r.srv = nil
}

// gwOccs are occurrences of gateway gw-1 across 12 sandboxes (so across
// partitions), with increasing times.
func gwOccs(from, n int) []*eventpipev1.Occurrence {
	var out []*eventpipev1.Occurrence
	for i := from; i < from+n; i++ {
		o := occ(fmt.Sprintf("c1/ev-%04d/1", i), fmt.Sprintf("sbx-%02d", i%12), "ws1", fmt.Sprintf("demo-%02d", i%12), "gw-1")
		out = append(out, o)
	}
	return out
}

// subscriber is a client that keeps the last position, as eventpipe's
// clients do.
type subscriber struct {
	got      map[string]int
	order    []string
	position []byte
	cursor   uint64
}

// run follows on conn until n more occurrences arrived or the stream
// broke; it returns the stream's error.
func (s *subscriber) run(ctx context.Context, conn *grpc.ClientConn, req *eventpipev1.FollowRequest, n int, onMsg func(int)) error {
	if len(s.position) > 0 {
		req.AfterPosition, req.Tail = s.position, 0
	}
	st, err := eventpipev1.NewFollowClient(conn).Follow(ctx, req)
	if err != nil {
		return err
	}
	if hdr, err := st.Header(); err == nil && len(s.position) == 0 {
		if v := hdr.Get(HeaderLastPosition); len(v) > 0 && req.GetTail() == 0 {
			s.position = []byte(v[0])
		}
	}
	for i := 0; i < n; i++ {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		id := m.GetOccurrence().GetEventId()
		s.got[id]++
		s.order = append(s.order, id)
		s.position, s.cursor = m.GetPosition(), m.GetCursor()
		if onMsg != nil {
			onMsg(len(s.order))
		}
	}
	return nil
}

// TestKafkaFollowResumeThroughAnotherReplica: a gateway subscriber follows
// replica A (tail, then live), A is killed mid-stream, records keep
// arriving and agents resend records already delivered and records not yet
// delivered; the subscriber resumes on replica B with its last position:
// every occurrence arrives exactly once, none is missing.
func TestKafkaFollowResumeThroughAnotherReplica(t *testing.T) {
	bb := kafkaBackbone(t, 6)
	all := gwOccs(0, 400)
	produceBackbone(t, bb, all[:100]...)
	a := startKafkaFollow(t, bb)
	b := startKafkaFollow(t, bb)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	s := &subscriber{got: map[string]int{}}
	req := &eventpipev1.FollowRequest{GatewayId: "gw-1", Tail: 30}
	produced := make(chan error, 1)
	err := s.run(ctx, dial(t, a.addr, readerWS1), req, 120, func(n int) {
		if n == 30 {
			go func() { produced <- produceBackboneErr(bb, all[100:250]...) }()
		}
		if n == 120 {
			a.kill() // after this message: the stream breaks
		}
	})
	if err != nil {
		t.Fatalf("first subscription: %v", err)
	}
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	// While nobody follows: new records and resends (same event_id) of
	// records delivered (before the position) and not yet delivered.
	produceBackbone(t, bb, all[250:350]...)
	produceBackbone(t, bb, append(append([]*eventpipev1.Occurrence{}, all[80:100]...), all[200:220]...)...)
	produceBackbone(t, bb, all[350:]...)
	// The tail covered the last 30 of the first 100; then 100..399 live.
	want := 30 + 300
	if err := s.run(ctx, dial(t, b.addr, readerWS1), &eventpipev1.FollowRequest{GatewayId: "gw-1"}, want-len(s.order), nil); err != nil {
		t.Fatalf("resumed subscription on b (got %d of %d): %v", len(s.order), want, err)
	}
	// Nothing more may come: no duplicates queued behind.
	extra := &subscriber{got: map[string]int{}, position: s.position}
	ectx, ecancel := context.WithTimeout(ctx, 2*time.Second)
	err = extra.run(ectx, dial(t, b.addr, readerWS1), &eventpipev1.FollowRequest{GatewayId: "gw-1"}, 1, nil)
	ecancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("after everything was delivered, a resume got %v (%v), want nothing", extra.order, err)
	}
	// The tail is the last 30 of the first 100 by record time (records
	// of one produce call share it, so which 30 is not asserted); every
	// later one must arrive once, and nothing twice.
	for _, o := range all[100:] {
		if n := s.got[o.GetEventId()]; n != 1 {
			t.Errorf("%s delivered %d times, want 1", o.GetEventId(), n)
		}
	}
	for id, n := range s.got {
		if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
	if len(s.got) != want {
		t.Errorf("delivered %d distinct occurrences, want %d", len(s.got), want)
	}
	if d := counterValue(t, b.reg, "eventpipe_collector_backbone_duplicates_dropped_total", map[string]string{"consumer": backbone.ConsumerFollow}); d < 40 {
		t.Errorf("replica b dropped %v resends, want 40", d)
	}
}

// TestKafkaFollowSandboxTailNoFollow: a sandbox selector reads its
// partition only; tail and no_follow end with the last position; a
// cursor-only resume works for one sandbox and is refused for a
// multi-partition selector.
func TestKafkaFollowSandboxTailNoFollow(t *testing.T) {
	bb := kafkaBackbone(t, 6)
	all := gwOccs(0, 120)
	produceBackbone(t, bb, all...)
	produceBackbone(t, bb, all[110:]...) // resends
	r := startKafkaFollow(t, bb)
	conn := dial(t, r.addr, readerWS1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	st, err := eventpipev1.NewFollowClient(conn).Follow(ctx, &eventpipev1.FollowRequest{SandboxId: "sbx-03", Tail: 4, NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []*eventpipev1.FollowResponse
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
	}
	if ids(got) != "c1/ev-0075/1,c1/ev-0087/1,c1/ev-0099/1,c1/ev-0111/1" {
		t.Errorf("tail 4 of sbx-03 = %s", ids(got))
	}
	hdr, _ := st.Header()
	if len(hdr.Get(HeaderLastPosition)) == 0 || len(hdr.Get(HeaderLastCursor)) == 0 {
		t.Errorf("header %v lacks the last position or cursor", hdr)
	}
	// Resume by cursor after the second: the two after it.
	rest, err := follow(t, ctx, conn, &eventpipev1.FollowRequest{SandboxId: "sbx-03", AfterCursor: got[1].GetCursor(), NoFollow: true}, 0)
	if err != nil || ids(rest) != "c1/ev-0099/1,c1/ev-0111/1" {
		t.Errorf("resume after cursor %d: %s, %v", got[1].GetCursor(), ids(rest), err)
	}
	// Resume by position after the first: the three after it.
	rest, err = follow(t, ctx, conn, &eventpipev1.FollowRequest{SandboxId: "sbx-03", AfterPosition: got[0].GetPosition(), NoFollow: true}, 0)
	if err != nil || ids(rest) != "c1/ev-0087/1,c1/ev-0099/1,c1/ev-0111/1" {
		t.Errorf("resume after position: %s, %v", ids(rest), err)
	}
	_, err = follow(t, ctx, conn, &eventpipev1.FollowRequest{Workspace: "ws1", AfterCursor: 5, NoFollow: true}, 0)
	if status.Code(err) != codes.OutOfRange {
		t.Errorf("cursor-only resume of a workspace: %v, want OutOfRange", err)
	}
	_, err = follow(t, ctx, conn, &eventpipev1.FollowRequest{Workspace: "ws1", AfterPosition: []byte("junk"), NoFollow: true}, 0)
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("junk position: %v, want InvalidArgument", err)
	}
	_, err = follow(t, ctx, dial(t, r.addr, readerWS2), &eventpipev1.FollowRequest{Workspace: "ws1", Tail: 1, NoFollow: true}, 0)
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("reader of ws2 following ws1: %v, want PermissionDenied", err)
	}
	// The workspace tail merges partitions by time and removes resends.
	ws, err := follow(t, ctx, conn, &eventpipev1.FollowRequest{Workspace: "ws1", Tail: 15, NoFollow: true}, 0)
	if err != nil || len(ws) != 15 {
		t.Fatalf("workspace tail: %d records, %v", len(ws), err)
	}
	seen := map[string]bool{}
	for _, m := range ws {
		if seen[m.GetOccurrence().GetEventId()] {
			t.Errorf("workspace tail repeats %s", m.GetOccurrence().GetEventId())
		}
		seen[m.GetOccurrence().GetEventId()] = true
	}
}

func TestFollowPositionRoundTrip(t *testing.T) {
	p := followPosition{topic: "t", next: map[int32]int64{0: 5, 3: 1 << 40, 11: 0}}
	q, err := parsePosition(p.marshal())
	if err != nil || q.topic != "t" || len(q.next) != 3 || q.next[3] != 1<<40 || q.next[0] != 5 {
		t.Fatalf("round trip: %+v, %v", q, err)
	}
	b := p.marshal()
	for _, bad := range [][]byte{nil, {2}, b[:len(b)-1], append(append([]byte{}, b...), 0)} {
		if _, err := parsePosition(bad); err == nil {
			t.Errorf("parsePosition(%v) accepted", bad)
		}
	}
}

// TestKafkaFollowTailThenLiveDropsResends: a resend arriving live of an
// occurrence the tail replay sent is dropped (the replay fills the live
// stream's window); a new one arrives.
func TestKafkaFollowTailThenLiveDropsResends(t *testing.T) {
	bb := kafkaBackbone(t, 3)
	all := gwOccs(0, 36) // sbx-05: ev-0005, ev-0017, ev-0029
	produceBackbone(t, bb, all...)
	r := startKafkaFollow(t, bb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := eventpipev1.NewFollowClient(dial(t, r.addr, readerWS1)).Follow(ctx, &eventpipev1.FollowRequest{SandboxId: "sbx-05", Tail: 2})
	if err != nil {
		t.Fatal(err)
	}
	var got []*eventpipev1.FollowResponse
	for len(got) < 2 {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
	}
	if ids(got) != "c1/ev-0017/1,c1/ev-0029/1" {
		t.Fatalf("tail 2 = %s", ids(got))
	}
	fresh := occ("c1/ev-9999/1", "sbx-05", "ws1", "demo-05", "gw-1")
	produceBackbone(t, bb, all[17], all[29], fresh)
	m, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if id := m.GetOccurrence().GetEventId(); id != "c1/ev-9999/1" {
		t.Errorf("after the tail, live sent %s first, want the new c1/ev-9999/1 (the resends of replayed occurrences are duplicates)", id)
	}
}
