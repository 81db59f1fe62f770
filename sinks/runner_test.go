package sinks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeLog is a minimal Source + Cursor for unit tests of the runner (the
// contract in sinktest runs it against real destinations).
type fakeLog struct {
	mu         sync.Mutex
	recs       []Record
	first      uint64
	notify     chan struct{}
	cursor     uint64
	commits    []uint64
	failCommit int
}

func newFakeLog() *fakeLog { return &fakeLog{first: 1, notify: make(chan struct{})} }

func (l *fakeLog) add(occs ...*eventpipev1.Occurrence) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range occs {
		l.recs = append(l.recs, Record{Offset: l.first + uint64(len(l.recs)), Occurrence: o})
	}
	close(l.notify)
	l.notify = make(chan struct{})
}

func (l *fakeLog) Read(_ context.Context, from uint64, max int) ([]Record, uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var skipped uint64
	if from < l.first {
		skipped, from = l.first-from, l.first
	}
	i := int(from - l.first)
	if i >= len(l.recs) {
		return nil, skipped, nil
	}
	end := min(i+max, len(l.recs))
	return append([]Record(nil), l.recs[i:end]...), skipped, nil
}

func (l *fakeLog) Wait(ctx context.Context, after uint64) error {
	for {
		l.mu.Lock()
		last, ch := l.first+uint64(len(l.recs))-1, l.notify
		l.mu.Unlock()
		if last > after {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

func (l *fakeLog) Load() (uint64, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.cursor, nil }
func (l *fakeLog) Commit(off uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failCommit > 0 {
		l.failCommit--
		return errors.New("disk full")
	}
	l.cursor = off
	l.commits = append(l.commits, off)
	return nil
}

type scripted struct {
	mu      sync.Mutex
	errs    []error // returned in order, then nil
	batches [][]Record
	block   bool
	hangs   int // the first hangs pushes wait for their context
}

func (s *scripted) Push(ctx context.Context, b []Record) error {
	s.mu.Lock()
	block := s.block || s.hangs > 0
	if s.hangs > 0 {
		s.hangs--
	}
	s.mu.Unlock()
	if block {
		<-ctx.Done()
		return ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, append([]Record(nil), b...))
	if len(s.errs) > 0 {
		err := s.errs[0]
		s.errs = s.errs[1:]
		return err
	}
	return nil
}

func (s *scripted) pushes() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.batches) }

func occ(id, ns, typ, reason string) *eventpipev1.Occurrence {
	return &eventpipev1.Occurrence{EventId: id, Namespace: ns, Type: typ, Reason: reason}
}

func occs(n int) []*eventpipev1.Occurrence {
	out := make([]*eventpipev1.Occurrence, n)
	for i := range out {
		out[i] = occ(fmt.Sprintf("uid-%d/%d", i, i+100), "openshell-openshell-repro", "Warning", "Failed")
	}
	return out
}

func testConfig() RunnerConfig {
	c := NewDefaultRunnerConfig("t")
	c.Batch.MaxRecords = 10
	c.Batch.MaxWait = 30 * time.Millisecond
	c.Retry.Initial = time.Millisecond
	c.Retry.Max = 4 * time.Millisecond
	c.CommitInterval = 0 // commit after every push: the tests below count commits
	return c
}

type harness struct {
	r      *Runner
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	mu     sync.Mutex
	waits  []time.Duration
}

func start(t *testing.T, cfg RunnerConfig, p Pusher, l *fakeLog) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := NewRunner(cfg, p, l, l, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{r: r, reg: reg, done: make(chan error, 1)}
	r.sleep = func(ctx context.Context, d time.Duration) error {
		h.mu.Lock()
		h.waits = append(h.waits, d)
		h.mu.Unlock()
		return sleepCtx(ctx, time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- r.Run(ctx) }()
	t.Cleanup(func() { h.stop(t) })
	return h
}

func (h *harness) stop(t *testing.T) {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("runner did not stop")
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestRunnerBatchesBySizeAndTime(t *testing.T) {
	l := newFakeLog()
	l.add(occs(25)...)
	p := &scripted{}
	h := start(t, testConfig(), p, l)
	eventually(t, "cursor 25", func() bool { return h.r.Status().Cursor == 25 })
	p.mu.Lock()
	sizes := []int{}
	for _, b := range p.batches {
		sizes = append(sizes, len(b))
	}
	p.mu.Unlock()
	// Two full batches at once, then the last 5 after max_wait.
	if fmt.Sprint(sizes) != "[10 10 5]" {
		t.Errorf("batch sizes = %v, want [10 10 5]", sizes)
	}
	if got := value(h.r.m.m.sent.WithLabelValues("t")); got != 25 {
		t.Errorf("sent = %v", got)
	}
	st := h.r.Status()
	if st.LagRecords != 0 || st.LastOffset != 25 || st.Sent != 25 || !st.Running {
		t.Errorf("status = %+v", st)
	}
}

func TestRunnerRetriesWithBackoffAndHonoursRetryAfter(t *testing.T) {
	l := newFakeLog()
	l.add(occs(3)...)
	p := &scripted{errs: []error{
		errors.New("connection refused"),
		errors.New("connection refused"),
		errors.New("connection refused"),
		errors.New("connection refused"),
		Throttle(errors.New("429"), 777*time.Millisecond),
		fmt.Errorf("produce: %w", Throttle(errors.New("throttled"), 0)),
	}}
	cfg := testConfig()
	cfg.Retry.Jitter = 0
	h := start(t, cfg, p, l)
	eventually(t, "delivered", func() bool { return h.r.Status().Cursor == 3 })
	h.mu.Lock()
	waits := fmt.Sprint(h.waits)
	h.mu.Unlock()
	// 1ms, 2ms, 4ms, capped at 4ms; the hint; then the backoff (4ms, capped).
	if waits != "[1ms 2ms 4ms 4ms 777ms 4ms]" {
		t.Errorf("waits = %s", waits)
	}
	if got := value(h.r.m.m.pushErrors.WithLabelValues("t", ClassRetryable)); got != 4 {
		t.Errorf("retryable errors = %v", got)
	}
	if got := value(h.r.m.m.pushErrors.WithLabelValues("t", ClassThrottle)); got != 2 {
		t.Errorf("throttle errors = %v", got)
	}
	if st := h.r.Status(); st.Failed != 0 || st.Sent != 3 || st.LastError != "" {
		t.Errorf("status = %+v", st)
	}
	for _, b := range p.batches {
		if len(b) != 3 {
			t.Errorf("a retry pushed %d records, want the same 3", len(b))
		}
	}
}

func TestRunnerJitterStaysInBounds(t *testing.T) {
	r := &Runner{cfg: NewDefaultRunnerConfig("j")}
	for i := 0; i < 1000; i++ {
		d := r.jitter(time.Second)
		if d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("jitter(1s) = %s, outside ±20%%", d)
		}
	}
}

func TestRunnerPermanentAndPartialDrops(t *testing.T) {
	l := newFakeLog()
	l.add(occs(20)...)
	p := &scripted{errs: []error{
		fmt.Errorf("push: %w", Permanent(errors.New("400 bad request"))),
		&PartialError{Failed: map[int]error{0: errors.New("too large"), 9: nil, 42: errors.New("bogus index")}},
	}}
	var logs strings.Builder
	var mu sync.Mutex
	reg := prometheus.NewRegistry()
	logger := newTestLogger(&logs, &mu)
	r, err := NewRunner(testConfig(), p, l, l, logger, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	eventually(t, "cursor 20", func() bool { return r.Status().Cursor == 20 })
	cancel()
	<-done
	st := r.Status()
	if st.Failed != 12 || st.Sent != 8 {
		t.Errorf("failed %d sent %d, want 12 and 8", st.Failed, st.Sent)
	}
	if got := value(r.m.m.failed.WithLabelValues("t", FailedPermanent)); got != 10 {
		t.Errorf("failed{permanent} = %v", got)
	}
	if got := value(r.m.m.failed.WithLabelValues("t", FailedPartial)); got != 2 {
		t.Errorf("failed{partial} = %v", got)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	// Every dropped record is logged with its event_id.
	for i := 0; i < 10; i++ {
		if !strings.Contains(out, fmt.Sprintf("event_id=uid-%d/%d", i, i+100)) {
			t.Errorf("drop of uid-%d not logged", i)
		}
	}
	for _, i := range []int{10, 19} {
		if !strings.Contains(out, fmt.Sprintf("event_id=uid-%d/%d", i, i+100)) {
			t.Errorf("partial drop of uid-%d not logged", i)
		}
	}
	if !strings.Contains(out, "outside the batch") {
		t.Error("bogus partial index not reported")
	}
}

func TestRunnerFilterAndHotReload(t *testing.T) {
	l := newFakeLog()
	cfg := testConfig()
	cfg.Filter = FilterConfig{Types: []string{"Warning"}}
	p := &scripted{}
	h := start(t, cfg, p, l)
	l.add(occ("a/1", "ns", "Normal", "Pulling"), occ("a/2", "ns", "Warning", "Failed"), occ("a/3", "ns", "Normal", "Pulled"))
	eventually(t, "cursor 3", func() bool { return h.r.Status().Cursor == 3 })
	if err := h.r.SetFilter(FilterConfig{Types: []string{""}}); err == nil {
		t.Error("invalid filter accepted")
	}
	if err := h.r.SetFilter(FilterConfig{Reasons: []string{"Pulled"}}); err != nil {
		t.Fatal(err)
	}
	l.add(occ("b/1", "ns", "Warning", "Failed"), occ("b/2", "ns", "Normal", "Pulled"))
	eventually(t, "cursor 5", func() bool { return h.r.Status().Cursor == 5 })
	var ids []string
	p.mu.Lock()
	for _, b := range p.batches {
		for _, r := range b {
			ids = append(ids, r.Occurrence.GetEventId())
		}
	}
	p.mu.Unlock()
	if fmt.Sprint(ids) != "[a/2 b/2]" {
		t.Errorf("pushed %v, want [a/2 b/2]", ids)
	}
	if st := h.r.Status(); st.Filtered != 3 {
		t.Errorf("filtered = %d", st.Filtered)
	}
	// Only filtered records: the cursor still moves.
	l.add(occ("c/1", "ns", "Normal", "Started"))
	eventually(t, "cursor 6", func() bool { return h.r.Status().Cursor == 6 })
}

func TestFilterMatch(t *testing.T) {
	sb := &eventpipev1.Occurrence{Namespace: "openshell-openshell-repro", Type: "Warning", Reason: "Failed",
		Sandbox:     &eventpipev1.Sandbox{Id: "2ff21e26-1a7b-49a2-a640-14ae153f93ea", Workspace: "repro"},
		PullFailure: &eventpipev1.PullFailure{Category: "not_found"}}
	un := &eventpipev1.Occurrence{Namespace: "kube-system", Type: "Warning", Reason: "Unhealthy"}
	for _, tc := range []struct {
		name   string
		f      FilterConfig
		sb, un bool
	}{
		{"empty", FilterConfig{}, true, true},
		{"namespaces", FilterConfig{Namespaces: []string{"kube-system"}}, false, true},
		{"exclude", FilterConfig{ExcludeNamespaces: []string{"kube-system"}}, true, false},
		{"types", FilterConfig{Types: []string{"Normal"}}, false, false},
		{"reasons", FilterConfig{Reasons: []string{"Failed", "BackOff"}}, true, false},
		{"workspaces", FilterConfig{Workspaces: []string{"repro"}}, true, false},
		{"other workspace", FilterConfig{Workspaces: []string{"prod"}}, false, false},
		{"attributed", FilterConfig{AttributedOnly: true}, true, false},
		{"pull failures", FilterConfig{PullFailuresOnly: true}, true, false},
	} {
		if got := tc.f.Match(sb); got != tc.sb {
			t.Errorf("%s: sandbox event matched %v", tc.name, got)
		}
		if got := tc.f.Match(un); got != tc.un {
			t.Errorf("%s: unattributed event matched %v", tc.name, got)
		}
	}
	if (FilterConfig{}).Match(nil) {
		t.Error("nil occurrence matched")
	}
}

func TestRunnerStopAbandonsInFlightPush(t *testing.T) {
	l := newFakeLog()
	l.add(occs(5)...)
	p := &scripted{block: true}
	h := start(t, testConfig(), p, l)
	time.Sleep(60 * time.Millisecond) // past max_wait: the push is in flight
	h.stop(t)
	if c, _ := l.Load(); c != 0 {
		t.Errorf("cursor committed to %d for an undelivered batch", c)
	}
	if st := h.r.Status(); st.Running || st.Sent != 0 {
		t.Errorf("status after stop: %+v", st)
	}
}

func TestRunnerRetriesCommit(t *testing.T) {
	l := newFakeLog()
	l.failCommit = 3
	l.add(occs(10)...)
	h := start(t, testConfig(), &scripted{}, l)
	eventually(t, "commit", func() bool { return h.r.Status().Cursor == 10 })
	if c, _ := l.Load(); c != 10 {
		t.Errorf("persisted cursor %d", c)
	}
}

func TestRunnerCountsRetentionLoss(t *testing.T) {
	l := newFakeLog()
	l.add(occs(10)...)
	l.mu.Lock()
	l.recs, l.first = l.recs[4:], 5
	l.mu.Unlock()
	h := start(t, testConfig(), &scripted{}, l)
	eventually(t, "cursor 10", func() bool { return h.r.Status().Cursor == 10 })
	if st := h.r.Status(); st.Lost != 4 || st.Sent != 6 {
		t.Errorf("lost %d sent %d", st.Lost, st.Sent)
	}
	if got := value(h.r.m.m.lost.WithLabelValues("t")); got != 4 {
		t.Errorf("lost metric = %v", got)
	}
}

func TestRunnerLagWhileDestinationIsDown(t *testing.T) {
	l := newFakeLog()
	old := occs(4)
	for _, o := range old {
		o.ObservedAt = timestampAgo(90 * time.Second)
	}
	l.add(old...)
	errs := make([]error, 1000)
	for i := range errs {
		errs[i] = errors.New("connection refused")
	}
	p := &scripted{errs: errs}
	h := start(t, testConfig(), p, l)
	eventually(t, "failed pushes", func() bool { return p.pushes() > 3 })
	st := h.r.Status()
	if st.LagRecords != 4 || st.LagSeconds < 89 || st.LastError == "" || st.Cursor != 0 {
		t.Errorf("status while down = %+v", st)
	}
	if got := value(h.r.m.m.lagRecords.WithLabelValues("t")); got != 4 {
		t.Errorf("lag_records = %v", got)
	}
	if got := value(h.r.m.m.lagSeconds.WithLabelValues("t")); got < 89 {
		t.Errorf("lag_seconds = %v", got)
	}
}

func TestRunnersShareOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := newFakeLog()
	for _, name := range []string{"file", "kafka", "loki"} {
		if _, err := NewRunner(NewDefaultRunnerConfig(name), &scripted{}, l, l, nil, reg); err != nil {
			t.Fatalf("runner %s: %v", name, err)
		}
	}
	// A second runner with the same name also works (a reload rebuilds it).
	if _, err := NewRunner(NewDefaultRunnerConfig("file"), &scripted{}, l, l, nil, reg); err != nil {
		t.Fatal(err)
	}
	n, err := series(reg, "eventpipe_sink_lag_records")
	if err != nil || n != 3 {
		t.Errorf("lag_records series = %d (%v), want 3", n, err)
	}
}

func TestRunnerConfigValidate(t *testing.T) {
	if err := NewDefaultRunnerConfig("file").Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	bad := RunnerConfig{Name: "a b", CommitInterval: -time.Second, Retry: RetryConfig{Multiplier: 0.5, Jitter: 2, Initial: time.Second, Max: time.Millisecond},
		Filter: FilterConfig{Namespaces: []string{"x", "x"}, ExcludeNamespaces: []string{"x"}, Types: []string{""}}}
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, want := range []string{"name:", "batch.max_records:", "batch.max_wait:", "retry.max:", "retry.multiplier:",
		"retry.jitter:", "retry.push_timeout:", "commit_interval:", "filter.namespaces[1]: duplicate", "filter.exclude_namespaces:", "filter.types[0]:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
	if _, err := NewRunner(bad, &scripted{}, newFakeLog(), newFakeLog(), nil, nil); err == nil {
		t.Error("NewRunner accepted a bad config")
	}
}

type boundsLog struct{ *fakeLog }

func (b boundsLog) Bounds() (uint64, uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.first, b.first + uint64(len(b.recs)) - 1
}

func TestRunnerLagFromSourceBounds(t *testing.T) {
	l := newFakeLog()
	l.add(occs(7)...)
	errs := make([]error, 1000)
	for i := range errs {
		errs[i] = errors.New("connection refused")
	}
	p := &scripted{errs: errs}
	cfg := testConfig()
	cfg.Batch.MaxRecords = 2
	r, err := NewRunner(cfg, p, boundsLog{l}, l, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	eventually(t, "failed pushes", func() bool { return p.pushes() > 2 })
	if st := r.Status(); st.LagRecords != 7 || st.LastOffset != 7 {
		t.Errorf("lag %d last %d, want 7 and 7 (only 2 records were read)", st.LagRecords, st.LastOffset)
	}
	cancel()
	<-done
}

func TestRunnerPushTimeoutBoundsAHungPush(t *testing.T) {
	l := newFakeLog()
	l.add(occs(3)...)
	p := &scripted{hangs: 2}
	cfg := testConfig()
	cfg.Retry.PushTimeout = 30 * time.Millisecond
	h := start(t, cfg, p, l)
	eventually(t, "delivered after two hung pushes", func() bool { return h.r.Status().Cursor == 3 })
	if got := value(h.r.m.m.pushErrors.WithLabelValues("t", ClassRetryable)); got != 2 {
		t.Errorf("retryable errors = %v, want the 2 timeouts", got)
	}
}

// blockAfter delivers records up to offset limit and then hangs until its
// context ends (a destination that stops answering).
type blockAfter struct {
	limit uint64
	mu    sync.Mutex
	sent  int
}

func (p *blockAfter) Push(ctx context.Context, b []Record) error {
	if b[len(b)-1].Offset > p.limit {
		<-ctx.Done()
		return ctx.Err()
	}
	p.mu.Lock()
	p.sent += len(b)
	p.mu.Unlock()
	return nil
}

// With commit_interval, records flowing through a runner are committed at
// most once per interval; a clean stop commits what was delivered, never
// the push it abandoned.
func TestRunnerCommitIntervalWhileFlowing(t *testing.T) {
	l := newFakeLog()
	l.add(occs(95)...)
	cfg := testConfig()
	cfg.CommitInterval = MaxCommitInterval // nothing is due while the test runs
	p := &blockAfter{limit: 60}
	h := start(t, cfg, p, l)
	eventually(t, "60 delivered", func() bool { return h.r.Status().Handled == 60 })
	st := h.r.Status()
	// The lag counts from what was handled, not from the older cursor (this
	// log has no Bounds: the runner knows of the records it has read).
	if st.Cursor != 0 || st.Sent != 60 || st.LastOffset < 70 || st.LagRecords != st.LastOffset-60 {
		t.Errorf("status %+v: want cursor 0 (no commit due), 60 sent and handled, lag from 60", st)
	}
	l.mu.Lock()
	commits := append([]uint64(nil), l.commits...)
	l.mu.Unlock()
	if len(commits) != 0 {
		t.Errorf("committed %v within the interval; want no commit while records flow", commits)
	}
	h.stop(t) // abandons the push of 61..70
	if got, _ := l.Load(); got != 60 {
		t.Errorf("cursor after a clean stop = %d, want 60 (delivered, not the abandoned push)", got)
	}
	if st := h.r.Status(); st.Cursor != 60 || st.Handled != 60 {
		t.Errorf("status after stop: cursor %d handled %d, want 60", st.Cursor, st.Handled)
	}
	if n := value(h.r.m.commits); n != 1 {
		t.Errorf("eventpipe_sink_cursor_commits_total = %v, want 1 (on stop)", n)
	}
}

// A runner that catches up commits once the interval since the previous
// commit has passed, without waiting for new records; a runner following a
// live log (caught up after every append) does not commit per append.
func TestRunnerCommitIntervalWhenCaughtUp(t *testing.T) {
	l := newFakeLog()
	cfg := testConfig()
	cfg.CommitInterval = 150 * time.Millisecond
	cfg.Batch.MaxWait = time.Millisecond
	h := start(t, cfg, &scripted{}, l)
	start := time.Now()
	for i := 0; i < 30; i++ { // 30 appends, 10 ms apart: ~300 ms of traffic
		l.add(occs(3)...)
		time.Sleep(10 * time.Millisecond)
	}
	eventually(t, "cursor 90", func() bool { return h.r.Status().Cursor == 90 })
	el := time.Since(start)
	l.mu.Lock()
	n := len(l.commits)
	l.mu.Unlock()
	// One commit per interval of traffic, plus the one after it stopped.
	if max := int(el/cfg.CommitInterval) + 1; n > max || n == 0 {
		t.Errorf("%d commits in %s with commit_interval %s; want 1..%d", n, el.Round(time.Millisecond), cfg.CommitInterval, max)
	}
	if st := h.r.Status(); st.Sent != 90 || st.LagRecords != 0 || st.Handled != 90 {
		t.Errorf("status %+v", st)
	}
}
