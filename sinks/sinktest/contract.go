package sinktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
)

// Harness is what a sink's test provides to RunContract.
type Harness struct {
	// Name is the sink name given to the runners ("file", "kafka", ...).
	Name string
	// NewTarget builds a fresh destination for one scenario. Servers it
	// starts are stopped with t.Cleanup.
	NewTarget func(t *testing.T) *Target
	// NewLog builds the log the runners read; nil means NewMemLog. The
	// collector's store is adapted to Log to run the contract over it.
	NewLog func(t *testing.T) Log
	// Records is the number of occurrences per scenario (default 300).
	Records int
	// BatchMaxRecords is the runners' batch.max_records (default 50).
	BatchMaxRecords int
	// Timeout bounds each scenario (default 90s).
	Timeout time.Duration
	// Logger receives the runners' logs (nil: discarded).
	Logger *slog.Logger
}

// Target is one destination instance.
type Target struct {
	// NewPusher returns a Pusher writing to the destination. It is called
	// once per runner; if the Pusher is an io.Closer it is closed when the
	// runner stops.
	NewPusher func() (sinks.Pusher, error)
	// Delivered returns the event_ids found at the destination, one entry
	// per delivered copy.
	Delivered func(ctx context.Context) ([]string, error)
	// Outage makes the destination unavailable for real (server stopped,
	// proxy refusing, file system failing) until end is called. Pushes
	// during an outage must fail with a retryable or throttle error.
	Outage func(t *testing.T) (end func())
	// Poison, if set, changes an occurrence so that the real destination
	// (or the sink's own checks) refuses it for good, reported as a
	// PartialError or a PermanentError. When nil the contract injects the
	// refusal in front of the Pusher.
	Poison func(o *eventpipev1.Occurrence)
}

func (h *Harness) defaults() {
	if h.Name == "" {
		h.Name = "contract"
	}
	if h.Records <= 0 {
		h.Records = 300
	}
	if h.BatchMaxRecords <= 0 {
		h.BatchMaxRecords = 50
	}
	if h.Timeout <= 0 {
		h.Timeout = 90 * time.Second
	}
	if h.Logger == nil {
		h.Logger = slog.New(slog.DiscardHandler)
	}
}

// RunContract runs every scenario of the sink contract as a subtest:
// success, transient (a real outage), permanent (some records refused for
// good), random (injected failures, throttling and lost acknowledgements),
// restart (runner stopped mid-stream, a new one resumes from the cursor)
// retention (records trimmed before they were read are counted lost) and
// readonly (two runners share the same records and neither sink modifies
// them). Each asserts at-least-once delivery of every record not refused
// and that every drop is counted in Status and in the metrics.
func RunContract(t *testing.T, h Harness) {
	h.defaults()
	if h.NewTarget == nil {
		t.Fatal("sinktest: Harness.NewTarget is required")
	}
	t.Run("success", func(t *testing.T) { scenarioSuccess(t, h) })
	t.Run("transient", func(t *testing.T) { scenarioTransient(t, h) })
	t.Run("permanent", func(t *testing.T) { scenarioPermanent(t, h) })
	t.Run("random", func(t *testing.T) { scenarioRandom(t, h) })
	t.Run("restart", func(t *testing.T) { scenarioRestart(t, h) })
	t.Run("retention", func(t *testing.T) { scenarioRetention(t, h) })
	t.Run("readonly", func(t *testing.T) { scenarioReadOnly(t, h) })
}

// env is one scenario's world.
type env struct {
	t      testing.TB
	h      Harness
	ctx    context.Context
	target *Target
	log    Log
	reg    *prometheus.Registry
	gen    *Generator
	ids    []string
}

func newEnv(t *testing.T, h Harness, seed uint64) *env {
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	t.Cleanup(cancel)
	target := h.NewTarget(t)
	if target == nil || target.NewPusher == nil || target.Delivered == nil || target.Outage == nil {
		t.Fatal("sinktest: Target needs NewPusher, Delivered and Outage")
	}
	var l Log
	if h.NewLog != nil {
		l = h.NewLog(t)
	} else {
		l = NewMemLog()
	}
	return &env{t: t, h: h, ctx: ctx, target: target, log: l, reg: prometheus.NewRegistry(),
		gen: NewGenerator(seed, fmt.Sprintf("%s-%s-", h.Name, t.Name()))}
}

func (e *env) append(occs []*eventpipev1.Occurrence) {
	e.t.Helper()
	if err := e.log.Append(e.ctx, occs); err != nil {
		e.t.Fatalf("append to log: %v", err)
	}
	for _, o := range occs {
		e.ids = append(e.ids, o.GetEventId())
	}
}

func (e *env) config() sinks.RunnerConfig {
	cfg := sinks.NewDefaultRunnerConfig(e.h.Name)
	cfg.Batch.MaxRecords = e.h.BatchMaxRecords
	cfg.Batch.MaxWait = 20 * time.Millisecond
	cfg.Retry.Initial = 10 * time.Millisecond
	cfg.Retry.Max = 200 * time.Millisecond
	cfg.Retry.PushTimeout = 10 * time.Second
	return cfg
}

// running is one runner in its goroutine.
type running struct {
	r      *sinks.Runner
	cancel context.CancelFunc
	done   chan error
	closer io.Closer
}

func (e *env) start(wrap func(sinks.Pusher) sinks.Pusher) *running {
	e.t.Helper()
	return e.startOn(e.target, e.h.Name, wrap)
}

// startOn starts a runner called name that pushes to target.
func (e *env) startOn(target *Target, name string, wrap func(sinks.Pusher) sinks.Pusher) *running {
	e.t.Helper()
	p, err := target.NewPusher()
	if err != nil {
		e.t.Fatalf("new pusher: %v", err)
	}
	closer, _ := p.(io.Closer)
	if wrap != nil {
		p = wrap(p)
	}
	cur, err := e.log.Cursor(name)
	if err != nil {
		e.t.Fatalf("cursor: %v", err)
	}
	cfg := e.config()
	cfg.Name = name
	r, err := sinks.NewRunner(cfg, p, e.log, cur, e.h.Logger, e.reg)
	if err != nil {
		e.t.Fatalf("new runner: %v", err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	rn := &running{r: r, cancel: cancel, done: make(chan error, 1), closer: closer}
	go func() { rn.done <- r.Run(ctx) }()
	e.t.Cleanup(func() { rn.stop(e.t) })
	return rn
}

func (rn *running) stop(t testing.TB) {
	if rn.cancel == nil {
		return
	}
	rn.cancel()
	rn.cancel = nil
	select {
	case err := <-rn.done:
		if err != nil {
			t.Errorf("runner returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("runner did not stop within 30s of cancellation")
	}
	if rn.closer != nil {
		if err := rn.closer.Close(); err != nil {
			t.Errorf("close pusher: %v", err)
		}
	}
}

// waitFor polls cond until it holds or the scenario times out.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	for !cond() {
		select {
		case <-e.ctx.Done():
			e.t.Fatalf("timed out waiting for %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitHandled waits until the runner's cursor reaches the log's last
// appended offset.
func (e *env) waitHandled(rn *running, last uint64) {
	e.t.Helper()
	e.waitFor(fmt.Sprintf("cursor to reach %d", last), func() bool { return rn.r.Status().Cursor >= last })
}

// delivered polls the destination until every id in want is there (or the
// scenario times out) and returns how many copies of each id were found.
func (e *env) delivered(want []string) map[string]int {
	e.t.Helper()
	var got map[string]int
	var lastErr error
	e.waitFor("delivery", func() bool {
		ids, err := e.target.Delivered(e.ctx)
		if err != nil {
			lastErr = err
			return false
		}
		got = map[string]int{}
		for _, id := range ids {
			got[id]++
		}
		for _, id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	if lastErr != nil && got == nil {
		e.t.Fatalf("read back: %v", lastErr)
	}
	return got
}

// metric sums one metric family's samples labelled with this sink.
func (e *env) metric(name string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatalf("gather: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			ok := false
			for _, l := range m.GetLabel() {
				if l.GetName() == "sink" && l.GetValue() == e.h.Name {
					ok = true
				}
			}
			if !ok {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func missing(want []string, got map[string]int) []string {
	var out []string
	for _, id := range want {
		if got[id] == 0 {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	if len(out) > 5 {
		out = append(out[:5], fmt.Sprintf("... (%d in all)", len(out)))
	}
	return out
}

func (e *env) assertAllDelivered(want []string) map[string]int {
	e.t.Helper()
	got := e.delivered(want)
	if m := missing(want, got); len(m) > 0 {
		e.t.Fatalf("not delivered: %v", m)
	}
	return got
}

func scenarioSuccess(t *testing.T, h Harness) { successScenario(newEnv(t, h, 1)) }

func successScenario(e *env) {
	t, h := e.t, e.h
	e.append(e.gen.Batch(h.Records / 2))
	rn := e.start(nil)
	e.append(e.gen.Batch(h.Records - h.Records/2)) // while it runs
	e.waitHandled(rn, uint64(h.Records))
	e.assertAllDelivered(e.ids)
	st := rn.r.Status()
	if st.Sent != uint64(h.Records) || st.Failed != 0 || st.Lost != 0 {
		t.Errorf("status = sent %d failed %d lost %d, want sent %d, nothing failed or lost", st.Sent, st.Failed, st.Lost, h.Records)
	}
	if got := e.metric("eventpipe_sink_sent_records_total"); got != float64(h.Records) {
		t.Errorf("eventpipe_sink_sent_records_total = %v, want %d", got, h.Records)
	}
	e.waitFor("lag to reach 0", func() bool { return rn.r.Status().LagRecords == 0 })
	if got := e.metric("eventpipe_sink_lag_records"); got != 0 {
		t.Errorf("eventpipe_sink_lag_records = %v after catching up, want 0", got)
	}
}

func scenarioTransient(t *testing.T, h Harness) {
	e := newEnv(t, h, 2)
	end := e.target.Outage(t)
	ended := false
	defer func() {
		if !ended {
			end()
		}
	}()
	e.append(e.gen.Batch(h.Records))
	rn := e.start(nil)
	// Several failed attempts, and the cursor must not move during the outage.
	e.waitFor("retryable push errors during the outage", func() bool {
		return e.metric("eventpipe_sink_push_errors_total") >= 3
	})
	st := rn.r.Status()
	if st.Cursor != 0 {
		t.Errorf("cursor moved to %d during the outage", st.Cursor)
	}
	if st.LastError == "" {
		t.Error("Status.LastError is empty during the outage")
	}
	_, head := e.log.(sinks.SourceHead)
	_, bounds := e.log.(interface{ Bounds() (uint64, uint64) })
	switch {
	case (head || bounds) && st.LagRecords != uint64(h.Records):
		t.Errorf("Status.LagRecords = %d during the outage, want %d", st.LagRecords, h.Records)
	case st.LagRecords == 0:
		t.Error("Status.LagRecords = 0 during the outage")
	}
	if st.Failed != 0 {
		t.Errorf("%d records dropped during a transient outage", st.Failed)
	}
	end()
	ended = true
	e.append(e.gen.Batch(10))
	e.waitHandled(rn, uint64(h.Records+10))
	e.assertAllDelivered(e.ids)
	if st := rn.r.Status(); st.Failed != 0 || st.LastError != "" {
		t.Errorf("after the outage: failed %d, last error %q", st.Failed, st.LastError)
	}
}

// rejecter refuses for good the records whose event_id is in reject, and
// pushes the others through next.
type rejecter struct {
	next   sinks.Pusher
	reject map[string]bool
}

func (p *rejecter) Push(ctx context.Context, batch []sinks.Record) error {
	var keep []sinks.Record
	var idx []int // index in batch of keep[i]
	failed := map[int]error{}
	for i, r := range batch {
		if p.reject[r.Occurrence.GetEventId()] {
			failed[i] = errors.New("injected: refused by the destination")
			continue
		}
		keep = append(keep, r)
		idx = append(idx, i)
	}
	if len(keep) > 0 {
		err := p.next.Push(ctx, keep)
		var pe *sinks.PartialError
		switch {
		case errors.As(err, &pe):
			for i, reason := range pe.Failed {
				if i >= 0 && i < len(idx) {
					failed[idx[i]] = reason
				}
			}
		case sinks.IsPermanent(err):
			for _, i := range idx {
				failed[i] = err
			}
		case err != nil:
			return err
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return &sinks.PartialError{Failed: failed}
}

func scenarioPermanent(t *testing.T, h Harness) {
	e := newEnv(t, h, 3)
	occs := e.gen.Batch(h.Records)
	refused := map[string]bool{}
	for i, o := range occs {
		if i%7 == 3 {
			if e.target.Poison != nil {
				e.target.Poison(o)
			}
			refused[o.GetEventId()] = true
		}
	}
	e.append(occs)
	var wrap func(sinks.Pusher) sinks.Pusher
	if e.target.Poison == nil {
		wrap = func(p sinks.Pusher) sinks.Pusher { return &rejecter{next: p, reject: refused} }
	}
	rn := e.start(wrap)
	e.waitHandled(rn, uint64(h.Records))
	var want []string
	for _, id := range e.ids {
		if !refused[id] {
			want = append(want, id)
		}
	}
	got := e.assertAllDelivered(want)
	for id := range refused {
		if got[id] > 0 {
			t.Errorf("refused record %s was delivered", id)
		}
	}
	st := rn.r.Status()
	if st.Failed != uint64(len(refused)) || st.Sent != uint64(len(want)) {
		t.Errorf("status: failed %d sent %d, want failed %d sent %d", st.Failed, st.Sent, len(refused), len(want))
	}
	if m := e.metric("eventpipe_sink_failed_records_total"); m != float64(len(refused)) {
		t.Errorf("eventpipe_sink_failed_records_total = %v, want %d", m, len(refused))
	}
}

// flaky fails at random: before pushing (retryable), with a throttle hint,
// or after a successful push (the acknowledgement is lost, so the batch is
// delivered twice).
type flaky struct {
	next sinks.Pusher
	mu   sync.Mutex
	rng  *rand.Rand
	n    int // pushes
	// counts of injected failures
	before, throttled, after int
}

func (p *flaky) Push(ctx context.Context, batch []sinks.Record) error {
	p.mu.Lock()
	p.n++
	x := p.rng.Float64()
	switch p.n { // every kind at least once, then at random
	case 1:
		x = 0
	case 2:
		x = 0.25
	case 3:
		x = 0.4
	}
	p.mu.Unlock()
	switch {
	case x < 0.2:
		p.mu.Lock()
		p.before++
		p.mu.Unlock()
		return errors.New("injected: connection reset by peer")
	case x < 0.3:
		p.mu.Lock()
		p.throttled++
		p.mu.Unlock()
		return sinks.Throttle(errors.New("injected: 429 too many requests"), 5*time.Millisecond)
	}
	if err := p.next.Push(ctx, batch); err != nil {
		return err
	}
	if x < 0.45 {
		p.mu.Lock()
		p.after++
		p.mu.Unlock()
		return errors.New("injected: acknowledgement lost")
	}
	return nil
}

func scenarioRandom(t *testing.T, h Harness) {
	e := newEnv(t, h, 4)
	f := &flaky{rng: rand.New(rand.NewPCG(4, 4))}
	rn := e.start(func(p sinks.Pusher) sinks.Pusher { f.next = p; return f })
	for i := 0; i < 10; i++ {
		e.append(e.gen.Batch(h.Records / 10))
		time.Sleep(5 * time.Millisecond)
	}
	n := len(e.ids)
	e.waitHandled(rn, uint64(n))
	e.assertAllDelivered(e.ids)
	st := rn.r.Status()
	if st.Failed != 0 || st.Lost != 0 {
		t.Errorf("random retryable failures dropped records: failed %d lost %d", st.Failed, st.Lost)
	}
	f.mu.Lock()
	before, throttled, after := f.before, f.throttled, f.after
	f.mu.Unlock()
	if before+throttled+after == 0 {
		t.Fatal("no failure was injected")
	}
	errs := e.metric("eventpipe_sink_push_errors_total")
	if errs != float64(before+throttled+after) {
		t.Errorf("eventpipe_sink_push_errors_total = %v, want %d (injected)", errs, before+throttled+after)
	}
}

func scenarioRestart(t *testing.T, h Harness) {
	e := newEnv(t, h, 5)
	e.append(e.gen.Batch(h.Records))
	// A slow pusher so that the first runner is stopped mid-stream.
	slow := func(p sinks.Pusher) sinks.Pusher { return &slowPusher{next: p, delay: 5 * time.Millisecond} }
	rn1 := e.start(slow)
	e.waitFor("first runner to deliver part of the log", func() bool { return rn1.r.Status().Cursor >= uint64(h.Records/3) })
	rn1.stop(t)
	c1 := rn1.r.Status().Cursor
	if c1 >= uint64(h.Records) {
		t.Logf("first runner finished before it was stopped (cursor %d)", c1)
	}
	cur, err := e.log.Cursor(h.Name)
	if err != nil {
		t.Fatal(err)
	}
	if persisted, err := cur.Load(); err != nil || persisted != c1 {
		t.Fatalf("persisted cursor = %d (%v), runner said %d", persisted, err, c1)
	}
	rn2 := e.start(nil)
	e.append(e.gen.Batch(h.Records / 2))
	e.waitHandled(rn2, uint64(len(e.ids)))
	e.assertAllDelivered(e.ids)
	st2 := rn2.r.Status()
	if st2.Failed != 0 {
		t.Errorf("restart dropped %d records", st2.Failed)
	}
	// The second runner resumed after the cursor: it did not start over.
	if want := uint64(len(e.ids)) - c1; st2.Sent > want+uint64(h.BatchMaxRecords) {
		t.Errorf("second runner sent %d records, more than the %d after the cursor", st2.Sent, want)
	}
}

type slowPusher struct {
	next  sinks.Pusher
	delay time.Duration
}

func (p *slowPusher) Push(ctx context.Context, batch []sinks.Record) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(p.delay):
	}
	return p.next.Push(ctx, batch)
}

// trimmer is implemented by logs that can emulate retention (MemLog).
type trimmer interface{ Trim(upTo uint64) }

// Retainer is implemented by a real log adapted to Log (the collector's
// store): Retain applies the log's own retention so that records up to at
// most upTo are removed, and returns the offset of the last record removed
// (whole segments go, so that can be less than upTo).
type Retainer interface {
	Retain(upTo uint64) (removedThrough uint64)
}

// LossCounter is implemented by a log that counts, per consumer, the
// records its consumers lost to retention; the contract checks that its
// count agrees with the runner's.
type LossCounter interface {
	LostBy(consumer string) uint64
}

func scenarioRetention(t *testing.T, h Harness) {
	e := newEnv(t, h, 6)
	e.append(e.gen.Batch(h.Records))
	lost := uint64(h.Records / 4)
	switch l := e.log.(type) {
	case Retainer: // a real log: its own retention, whole segments
		lost = l.Retain(lost)
		if lost == 0 {
			t.Fatal("the log's retention removed nothing: the scenario cannot test a loss")
		}
	case trimmer:
		l.Trim(lost)
	default:
		t.Fatalf("sinktest: the log %T can neither Trim nor Retain", e.log)
	}
	rn := e.start(nil)
	e.waitHandled(rn, uint64(h.Records))
	e.assertAllDelivered(e.ids[lost:])
	st := rn.r.Status()
	if st.Lost != lost {
		t.Errorf("Status.Lost = %d, want %d", st.Lost, lost)
	}
	if m := e.metric("eventpipe_sink_lost_records_total"); m != float64(lost) {
		t.Errorf("eventpipe_sink_lost_records_total = %v, want %d", m, lost)
	}
	if lc, ok := e.log.(LossCounter); ok {
		if n := lc.LostBy(h.Name); n != lost {
			t.Errorf("the log counts %d records lost by %q, the runner %d", n, h.Name, lost)
		}
	}
}

// scenarioReadOnly runs two runners of the sink, each with its own
// destination, over one log that hands both the same occurrences (as the
// collector does: one decode shared by every runner), with hostile records
// among them (a 1 MiB message to truncate, invalid UTF-8 to sanitise). Every
// occurrence must be unchanged afterwards (proto.Equal to a deep copy taken
// before); under -race a sink that writes to a shared occurrence is also a
// data race with the other runner.
func scenarioReadOnly(t *testing.T, h Harness) {
	readOnlyScenario(newEnv(t, h, 7), h.NewTarget(t))
}

func readOnlyScenario(e *env, second *Target) {
	t, h := e.t, e.h
	e.log = NewMemLog() // shares the appended occurrences with every reader
	occs := append(e.gen.Batch(h.Records), Hostile(e.gen.Prefix()+"hostile-")...)
	before := make([]*eventpipev1.Occurrence, len(occs))
	for i, o := range occs {
		before[i] = proto.Clone(o).(*eventpipev1.Occurrence)
	}
	e.append(occs[:len(occs)/2])
	a := e.startOn(e.target, h.Name+"-a", nil)
	b := e.startOn(second, h.Name+"-b", nil)
	e.append(occs[len(occs)/2:]) // while they run
	for _, rn := range []*running{a, b} {
		e.waitHandled(rn, uint64(len(occs)))
		if st := rn.r.Status(); st.Sent+st.Failed != uint64(len(occs)) || st.Lost != 0 {
			t.Errorf("%s: sent %d + failed %d, lost %d; want %d handled, none lost", st.Name, st.Sent, st.Failed, st.Lost, len(occs))
		}
	}
	a.stop(t)
	b.stop(t)
	changed := 0
	for i, o := range occs {
		if !proto.Equal(before[i], o) {
			changed++
			if changed <= 3 {
				t.Errorf("the sink modified occurrence %d (%s) of its batch", i, before[i].GetEventId())
			}
		}
	}
	if changed > 3 {
		t.Errorf("... %d occurrences modified in all", changed)
	}
}
