package collector

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/store"
)

// buildEventpipe builds ./cmd/eventpipe into dir (the real binary, as
// deployed).
func buildEventpipe(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "eventpipe")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/eventpipe")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go build ./cmd/eventpipe: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// child is one run of `eventpipe collector` as a separate process.
type child struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan error
}

func startChild(t *testing.T, bin, config, httpAddr string) *child {
	t.Helper()
	c := &child{stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	c.cmd = exec.Command(bin, "collector", "--config", config)
	c.cmd.Stderr = &syncWriter{w: c.stderr}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			<-c.done
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("collector not ready after 30s; stderr:\n%s", c.stderrString())
		}
		select {
		case err := <-c.done:
			t.Fatalf("collector exited early: %v; stderr:\n%s", err, c.stderrString())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *child) stderrString() string {
	return c.stderr.String()
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// agentRun plays the agent: it ships numbered batches (RV = batch number)
// on one stream, several in flight, until the stream breaks or stop is
// closed, and reports what was sent and what was acknowledged.
type agentRun struct {
	mu    sync.Mutex
	sent  map[uint64]*eventpipev1.Batch
	acked map[uint64]bool
}

func (a *agentRun) ship(ctx context.Context, t *testing.T, addr string, firstBatch, perBatch int, stop <-chan struct{}) error {
	conn := dial(t, addr, agentToken)
	st, err := eventpipev1.NewIngestClient(conn).Ship(ctx)
	if err != nil {
		return err
	}
	inflight := make(chan struct{}, 8)
	recvErr := make(chan error, 1)
	go func() {
		for {
			ack, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			a.mu.Lock()
			a.acked[ack.GetSeq()] = true
			a.mu.Unlock()
			<-inflight
		}
	}()
	for n := firstBatch; ; n++ {
		select {
		case <-stop:
			st.CloseSend()
			return <-recvErr
		case err := <-recvErr:
			return err
		case inflight <- struct{}{}:
		}
		b := &eventpipev1.Batch{Seq: uint64(n), Cluster: "prod", Stream: DefaultStream, ResourceVersion: strconv.Itoa(n)}
		for i := range perBatch {
			b.Occurrences = append(b.Occurrences, occ(fmt.Sprintf("kill-%d-%d", n, i), fmt.Sprintf("sb-%d", i%7), "ws1", "n", "gw"))
		}
		a.mu.Lock()
		a.sent[uint64(n)] = b
		a.mu.Unlock()
		if err := st.Send(b); err != nil {
			return <-recvErr
		}
	}
}

// TestSIGKILLMidIngest kills the real collector process with SIGKILL while
// an agent streams, restarts it, and checks the promise: every acknowledged
// occurrence is in the log exactly once and reaches the file sink, the
// agent's re-sent unacknowledged batches are not stored twice, and
// GetCursor returns (at least) the last acknowledged resourceVersion.
func TestSIGKILLMidIngest(t *testing.T) {
	dir := t.TempDir()
	bin := buildEventpipe(t, dir)
	grpcAddr, httpAddr := freePort(t), freePort(t)
	if err := os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(tokensFileYML), 0o600); err != nil {
		t.Fatal(err)
	}
	jsonl := filepath.Join(dir, "events.jsonl")
	config := filepath.Join(dir, "collector.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
grpc: {listen: %q, shutdown_grace: 5s}
http: {listen: %q}
auth: {tokens_file: %q}
store: {dir: %q, segment_bytes: 1048576}
sinks:
  - name: archive
    type: file
    file: {path: %q, max_bytes: 1073741824}
    batch: {max_records: 2000, max_wait: 50ms}
`, grpcAddr, httpAddr, filepath.Join(dir, "tokens.yaml"), filepath.Join(dir, "log"), jsonl)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	first := startChild(t, bin, config, httpAddr)
	agent := &agentRun{sent: map[uint64]*eventpipev1.Batch{}, acked: map[uint64]bool{}}
	const perBatch = 50
	shipErr := make(chan error, 1)
	go func() { shipErr <- agent.ship(ctx, t, grpcAddr, 1, perBatch, nil) }()
	// Let a steady stream run, then kill mid-stream.
	deadline := time.Now().Add(20 * time.Second)
	for {
		agent.mu.Lock()
		n := len(agent.acked)
		agent.mu.Unlock()
		if n >= 200 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	if err := <-shipErr; err == nil {
		t.Fatal("the stream survived SIGKILL?")
	}
	agent.mu.Lock()
	var lastAcked uint64
	for seq := range agent.acked {
		lastAcked = max(lastAcked, seq)
	}
	for seq := uint64(1); seq <= lastAcked; seq++ {
		if !agent.acked[seq] {
			t.Fatalf("ack %d missing below the last ack %d: acks out of order", seq, lastAcked)
		}
	}
	sentCount, ackedCount := len(agent.sent), len(agent.acked)
	agent.mu.Unlock()
	t.Logf("before SIGKILL: %d batches sent, %d acknowledged (last %d)", sentCount, ackedCount, lastAcked)
	if ackedCount == 0 {
		t.Fatal("nothing acknowledged before the kill")
	}
	if sentCount == ackedCount {
		t.Logf("note: every sent batch was acknowledged before the kill")
	}

	second := startChild(t, bin, config, httpAddr)
	conn := dial(t, grpcAddr, agentToken)
	cur, err := eventpipev1.NewIngestClient(conn).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod", Stream: DefaultStream})
	if err != nil || !cur.GetFound() {
		t.Fatalf("GetCursor after restart: %v, %v", cur, err)
	}
	rv, err := strconv.ParseUint(cur.GetResourceVersion(), 10, 64)
	if err != nil {
		t.Fatalf("cursor %q is not a resourceVersion the agent sent", cur.GetResourceVersion())
	}
	// The cursor is the last acknowledged RV, or later when a batch was
	// stored but its ack was lost in the kill; never earlier, never unsent.
	if rv < lastAcked || rv > uint64(sentCount) {
		t.Fatalf("GetCursor = %d after restart; last acknowledged %d, last sent %d", rv, lastAcked, sentCount)
	}
	t.Logf("GetCursor after restart = %d (last acknowledged %d)", rv, lastAcked)

	// The agent resumes: it re-sends everything it has not seen acknowledged.
	var resend []*eventpipev1.Batch
	for seq := lastAcked + 1; seq <= uint64(sentCount); seq++ {
		resend = append(resend, agent.sent[seq])
	}
	acks, err := ship(t, ctx, conn, resend...)
	if err != nil {
		t.Fatalf("re-send: %v", err)
	}
	var reStored, reDup uint32
	for _, a := range acks {
		reStored += a.GetStored()
		reDup += a.GetDuplicates()
	}
	if int(reStored+reDup) != len(resend)*perBatch {
		t.Fatalf("re-sent %d occurrences, acks count %d stored + %d duplicates", len(resend)*perBatch, reStored, reDup)
	}
	// Stored-but-unacked batches come back as duplicates: at least those
	// with RV <= the cursor (the cursor may trail the data after a crash).
	if want := uint32(rv-lastAcked) * perBatch; reDup < want {
		t.Errorf("re-send duplicates = %d, want >= %d (batches %d..%d were stored before the kill)", reDup, want, lastAcked+1, rv)
	}
	t.Logf("re-sent %d batches: %d stored, %d recognised as duplicates", len(resend), reStored, reDup)
	if len(resend) > 0 {
		cur, err = eventpipev1.NewIngestClient(conn).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod", Stream: DefaultStream})
		if err != nil || cur.GetResourceVersion() != strconv.Itoa(sentCount) {
			t.Fatalf("GetCursor after re-send = %v, %v; want %d", cur, err, sentCount)
		}
	}
	total := sentCount * perBatch

	// Every occurrence reaches the file sink.
	var inFile map[string]int
	for deadline := time.Now().Add(60 * time.Second); ; {
		inFile = readJSONL(t, jsonl)
		if len(inFile) >= total || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	agent.mu.Lock()
	for seq, b := range agent.sent {
		for _, o := range b.GetOccurrences() {
			if inFile[o.GetEventId()] == 0 {
				t.Fatalf("occurrence %s (batch %d, acked %v) never reached the file sink", o.GetEventId(), seq, agent.acked[seq])
			}
		}
	}
	agent.mu.Unlock()

	// Stop cleanly (SIGTERM) and read the log itself: each occurrence once.
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-second.done; err != nil {
		t.Fatalf("collector exit after SIGTERM: %v\n%s", err, second.stderrString())
	}
	scfg := store.NewDefaultConfig()
	scfg.Dir, scfg.SegmentBytes = filepath.Join(dir, "log"), 1<<20
	st, err := store.Open(scfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	seen := map[string]bool{}
	for from := uint64(1); ; {
		recs, skipped, err := st.Read(ctx, from, 5000)
		if err != nil || skipped != 0 {
			t.Fatalf("read log: %v (skipped %d)", err, skipped)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			id := r.Occurrence.GetEventId()
			if seen[id] {
				t.Fatalf("occurrence %s stored twice (offset %d)", id, r.Offset)
			}
			seen[id] = true
		}
		from = recs[len(recs)-1].Offset + 1
	}
	if len(seen) != total {
		t.Fatalf("log holds %d distinct occurrences, want %d", len(seen), total)
	}
	t.Logf("log: %d occurrences, each once; file sink: %d distinct (at-least-once)", len(seen), len(inFile))
}

// readJSONL counts event_ids in the file sink's output (active file and
// rotated ones).
func readJSONL(t *testing.T, path string) map[string]int {
	t.Helper()
	out := map[string]int{}
	files, _ := filepath.Glob(path + "*")
	for _, f := range files {
		fh, err := os.Open(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 4<<20)
		for sc.Scan() {
			var o eventpipev1.Occurrence
			if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(sc.Bytes(), &o); err != nil {
				// A line being written right now is not complete yet.
				continue
			}
			out[o.GetEventId()]++
		}
		fh.Close()
	}
	return out
}
