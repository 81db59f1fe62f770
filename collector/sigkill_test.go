package collector

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/store"
	"github.com/eventpipe/eventpipe/testenv/evbin"
)

// buildEventpipe builds ./cmd/eventpipe into dir (the real binary, as
// deployed).
func buildEventpipe(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "eventpipe")
	if err := evbin.Build(context.Background(), "..", bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// child is one run of `eventpipe collector` as a separate process. Its
// config listens on 127.0.0.1:0 and grpc and http are the addresses it
// reports having bound: a port the test picked and closed again could be
// taken by another process before the child binds it, or between a kill and
// the restart.
type child struct {
	cmd        *exec.Cmd
	stderr     *syncWriter
	done       chan error
	grpc, http string
}

// startChild runs the collector with JSON logs, reads the addresses it bound
// from its "collector started" line and waits until /readyz answers 200.
func startChild(t *testing.T, bin, config string) *child {
	t.Helper()
	c := &child{stderr: &syncWriter{}, done: make(chan error, 1)}
	c.cmd = exec.Command(bin, "collector", "--config", config, "--log-format", "json")
	c.cmd.Stderr = c.stderr
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
		if c.http == "" {
			c.grpc, c.http = startedAddrs(c.stderrString())
		}
		if c.http != "" {
			resp, err := http.Get("http://" + c.http + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return c
				}
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

// startedAddrs returns the gRPC and HTTP addresses of the "collector
// started" line of a JSON log, or empty strings before it was written.
func startedAddrs(log string) (grpcAddr, httpAddr string) {
	for _, line := range strings.Split(log, "\n") {
		var rec struct{ Msg, GRPC, HTTP string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "collector started" {
			return rec.GRPC, rec.HTTP
		}
	}
	return "", ""
}

func (c *child) stderrString() string {
	return c.stderr.String()
}

// syncWriter is the child's stderr, read while the child writes it.
type syncWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
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
// an agent streams with batches in flight (it tries again until at least one
// sent batch was not acknowledged at the kill), restarts it, and checks the
// promise: every acknowledged occurrence is in the log exactly once and
// reaches the file sink, the agent's re-sent unacknowledged batches are not
// stored twice, GetCursor returns (at least) the last acknowledged
// resourceVersion, and the file sink holds each occurrence once: what it
// had written past its committed cursor at the kill is pushed again by the
// restarted runner and skipped by event_id (sinks/file, "resend window").
func TestSIGKILLMidIngest(t *testing.T) {
	dir := t.TempDir()
	bin := buildEventpipe(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(tokensFileYML), 0o600); err != nil {
		t.Fatal(err)
	}
	jsonl := filepath.Join(dir, "events.jsonl")
	config := filepath.Join(dir, "collector.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
grpc: {listen: "127.0.0.1:0", shutdown_grace: 5s}
http: {listen: "127.0.0.1:0"}
auth: {tokens_file: %q}
store: {dir: %q, segment_bytes: 1048576}
sinks:
  - name: archive
    type: file
    file: {path: %q, max_bytes: 1073741824}
    batch: {max_records: 2000, max_wait: 50ms}
`, filepath.Join(dir, "tokens.yaml"), filepath.Join(dir, "log"), jsonl)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	agent := &agentRun{sent: map[uint64]*eventpipev1.Batch{}, acked: map[uint64]bool{}}
	counts := func() (sent, acked int) {
		agent.mu.Lock()
		defer agent.mu.Unlock()
		return len(agent.sent), len(agent.acked)
	}
	const perBatch = 50
	var (
		proc     = startChild(t, bin, config)
		inflight int    // batches sent but not acknowledged at the kill
		dupBound uint64 // records the sink may deliver twice: past its committed cursor at each kill
		kills    int
	)
	for attempt := 1; ; attempt++ {
		if attempt > 8 {
			t.Fatalf("no batch was in flight at the kill in %d attempts", attempt-1)
		}
		sent0, acked0 := counts()
		shipErr := make(chan error, 1)
		addr := proc.grpc
		go func() { shipErr <- agent.ship(ctx, t, addr, sent0+1, perBatch, nil) }()
		// A steady stream (long enough for the sink to commit its cursor
		// once: commit_interval), then the kill at a moment when batches
		// are sent and not yet acknowledged.
		cursorFile := filepath.Join(dir, "log", "cursors", "archive")
		committed0 := readCursorFile(t, cursorFile)
		deadline := time.Now().Add(20 * time.Second)
		for {
			sent, acked := counts()
			if (acked-acked0 >= 200 && sent > acked && readCursorFile(t, cursorFile) > committed0) || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err := proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-proc.done
		kills++
		if err := <-shipErr; err == nil {
			t.Fatal("the stream survived SIGKILL?")
		}
		committed := readCursorFile(t, cursorFile)
		proc = startChild(t, bin, config)
		last := uint64(scrapeGauge(t, proc.http, "eventpipe_collector_log_last_offset"))
		if last > committed {
			dupBound += last - committed
		}
		sent, acked := counts()
		if sent > acked {
			inflight = sent - acked
			t.Logf("kill %d: %d batches sent, %d acknowledged: %d in flight; the sink had committed %d of %d",
				kills, sent, acked, inflight, committed, last)
			break
		}
		t.Logf("kill %d: every sent batch (%d) was acknowledged before the kill; again", kills, sent)
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
	if ackedCount == 0 {
		t.Fatal("nothing acknowledged before the kill")
	}

	second := proc
	conn := dial(t, second.grpc, agentToken)
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

	// Every occurrence reaches the file sink, exactly once, and nothing
	// else.
	var inFile map[string]int
	for deadline := time.Now().Add(60 * time.Second); ; {
		inFile = readJSONL(t, jsonl)
		if len(inFile) >= total || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	known := map[string]bool{}
	agent.mu.Lock()
	for seq, b := range agent.sent {
		for _, o := range b.GetOccurrences() {
			known[o.GetEventId()] = true
			if inFile[o.GetEventId()] == 0 {
				agent.mu.Unlock()
				t.Fatalf("occurrence %s (batch %d, acked %v) never reached the file sink", o.GetEventId(), seq, agent.acked[seq])
			}
		}
	}
	agent.mu.Unlock()
	var duplicated uint64
	for id, n := range inFile {
		if !known[id] {
			t.Fatalf("the file sink holds %s, which the agent never sent", id)
		}
		duplicated += uint64(n - 1)
	}
	if len(inFile) != total {
		t.Fatalf("file sink: %d distinct occurrences after dedupe, want %d", len(inFile), total)
	}
	repeated := scrapeGauge(t, proc.http, "eventpipe_sink_file_repeated_records_total")
	t.Logf("drill collector-sigkill (file sink): created %d, acknowledged %d, in flight at the kill %d batches, delivered %d distinct, duplicated %d, pushed again and skipped %.0f (at most %d past the committed cursor), lost 0",
		total, ackedCount*perBatch, inflight, len(inFile), duplicated, repeated, dupBound)
	if duplicated > 0 {
		t.Fatalf("file sink: %d duplicated lines after a SIGKILL and restart (the runner pushed again up to %d records past its committed cursor)", duplicated, dupBound)
	}

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
	t.Logf("log: %d occurrences, each once; file sink: %d distinct, each once", len(seen), len(inFile))
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

// readCursorFile reads a consumer cursor file of the store (0 if absent).
func readCursorFile(t *testing.T, path string) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("cursor file %s: %v", path, err)
	}
	return n
}

// scrapeGauge reads one unlabelled series from the collector's /metrics.
func scrapeGauge(t *testing.T, httpAddr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("%s not in /metrics", name)
	return 0
}

// The bit-flip drill on the real binary: ingest, SIGKILL, flip one byte of
// an acknowledged record in the middle of the active segment, restart. The
// collector refuses to start (non-zero exit, the log names the damaged
// offsets and store.accept_data_loss); started with the loss accepted it
// keeps every other record, counts exactly one lost
// (eventpipe_collector_log_data_loss_records_total) and ingests on.
func TestBitFlipDrill(t *testing.T) {
	dir := t.TempDir()
	bin := buildEventpipe(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(tokensFileYML), 0o600); err != nil {
		t.Fatal(err)
	}
	writeConfig := func(accept bool) string {
		config := filepath.Join(dir, "collector.yaml")
		if err := os.WriteFile(config, []byte(fmt.Sprintf(`
grpc: {listen: "127.0.0.1:0", shutdown_grace: 5s}
http: {listen: "127.0.0.1:0"}
auth: {tokens_file: %q}
store: {dir: %q, accept_data_loss: %t}
`, filepath.Join(dir, "tokens.yaml"), filepath.Join(dir, "log"), accept)), 0o600); err != nil {
			t.Fatal(err)
		}
		return config
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	config := writeConfig(false)
	first := startChild(t, bin, config)
	conn := dial(t, first.grpc, agentToken)
	const total = 10_000
	for b := range total / 500 {
		var occs []*eventpipev1.Occurrence
		for i := range 500 {
			occs = append(occs, occ(fmt.Sprintf("flip-%05d", b*500+i), "sb-1", "ws1", "n", "gw"))
		}
		if _, err := ship(t, ctx, conn, batch(uint64(b+1), "prod", strconv.Itoa(b+1), occs...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	segs, _ := filepath.Glob(filepath.Join(dir, "log", "log", "*.seg"))
	seg := segs[len(segs)-1]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, []byte("flip-05000"))
	if at < 0 {
		t.Fatal("record flip-05000 not in the newest segment")
	}
	b[at+7] ^= 0x01
	if err := os.WriteFile(seg, b, 0o640); err != nil {
		t.Fatal(err)
	}

	// Refused, loudly, and the log left as it was.
	refused := exec.Command(bin, "collector", "--config", config)
	out, err := refused.CombinedOutput()
	if err == nil {
		t.Fatalf("the collector started on a log with a damaged acknowledged record:\n%s", out)
	}
	for _, want := range []string{"accept_data_loss", "offsets 5001..5001"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Fatalf("refusal does not mention %q:\n%s", want, out)
		}
	}
	if after, _ := os.ReadFile(seg); !bytes.Equal(after, b) {
		t.Fatal("the refused start modified the segment")
	}

	second := startChild(t, bin, writeConfig(true))
	if got := scrapeGauge(t, second.http, "eventpipe_collector_log_data_loss_records_total"); got != 1 {
		t.Fatalf("eventpipe_collector_log_data_loss_records_total = %v, want 1", got)
	}
	conn2 := dial(t, second.grpc, agentToken)
	if _, err := ship(t, ctx, conn2, batch(100, "prod", "100", occ("flip-after", "sb-1", "ws1", "n", "gw"))); err != nil {
		t.Fatal(err)
	}
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-second.done; err != nil {
		t.Fatalf("collector exit after SIGTERM: %v\n%s", err, second.stderrString())
	}
	// The repair is durable: the log opens without accepting anything.
	scfg := store.NewDefaultConfig()
	scfg.Dir = filepath.Join(dir, "log")
	sto, err := store.Open(scfg, nil, nil)
	if err != nil {
		t.Fatalf("open after the accepted repair, without accepting: %v", err)
	}
	defer sto.Close()
	got := map[string]uint64{}
	for from := uint64(1); ; {
		recs, skipped, err := sto.Read(ctx, from, 5000)
		if err != nil || skipped != 0 {
			t.Fatalf("read log: %v (skipped %d)", err, skipped)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			got[r.Occurrence.GetEventId()] = r.Offset
		}
		from = recs[len(recs)-1].Offset + 1
	}
	if len(got) != total {
		t.Fatalf("after the accepted repair the log holds %d occurrences, want %d (all but flip-05000, plus flip-after)", len(got), total)
	}
	if _, ok := got["flip-05000"]; ok {
		t.Fatal("the damaged record was read back")
	}
	if got["flip-04999"] != 5000 || got["flip-05001"] != 5002 || got["flip-after"] != total+1 {
		t.Fatalf("offsets moved: flip-04999 at %d, flip-05001 at %d, flip-after at %d", got["flip-04999"], got["flip-05001"], got["flip-after"])
	}
	t.Logf("drill bit-flip: created %d, acknowledged %d, lost 1 (counted, start refused until accepted), read back %d", total+1, total+1, len(got))
}
