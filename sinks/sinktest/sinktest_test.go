package sinktest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"go.uber.org/goleak"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memDest is an in-memory destination: the contract's own self-test (the
// real sinks run it against real destinations).
type memDest struct {
	mu   sync.Mutex
	ids  []string
	down bool
}

func (d *memDest) Push(ctx context.Context, batch []sinks.Record) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return errors.New("connection refused")
	}
	var failed map[int]error
	for i, r := range batch {
		if r.Occurrence.GetReason() == "Poisoned" {
			if failed == nil {
				failed = map[int]error{}
			}
			failed[i] = errors.New("poisoned")
			continue
		}
		d.ids = append(d.ids, r.Occurrence.GetEventId())
	}
	if failed != nil {
		return &sinks.PartialError{Failed: failed}
	}
	return nil
}

func memTarget(poison bool) func(t *testing.T) *Target {
	return func(t *testing.T) *Target {
		d := &memDest{}
		tg := &Target{
			NewPusher: func() (sinks.Pusher, error) { return d, nil },
			Delivered: func(context.Context) ([]string, error) {
				d.mu.Lock()
				defer d.mu.Unlock()
				return append([]string(nil), d.ids...), nil
			},
			Outage: func(t *testing.T) func() {
				d.mu.Lock()
				d.down = true
				d.mu.Unlock()
				return func() { d.mu.Lock(); d.down = false; d.mu.Unlock() }
			},
		}
		if poison {
			tg.Poison = func(o *eventpipev1.Occurrence) { o.Reason = "Poisoned" }
		}
		return tg
	}
}

func TestContractInjectedRefusal(t *testing.T) {
	RunContract(t, Harness{Name: "mem", NewTarget: memTarget(false)})
}

func TestContractPoison(t *testing.T) {
	RunContract(t, Harness{Name: "mem", NewTarget: memTarget(true), Records: 120, BatchMaxRecords: 7})
}

// A destination that loses records must fail the contract: the contract is
// only worth something if it can fail.
func TestContractCatchesLoss(t *testing.T) {
	ft := &fakeT{}
	d := &memDest{}
	lossy := pusherFunc(func(ctx context.Context, b []sinks.Record) error {
		return d.Push(ctx, b[:len(b)-1]) // silently drops the last record
	})
	tg := &Target{
		NewPusher: func() (sinks.Pusher, error) { return lossy, nil },
		Delivered: func(context.Context) ([]string, error) {
			d.mu.Lock()
			defer d.mu.Unlock()
			return append([]string(nil), d.ids...), nil
		},
		Outage: func(*testing.T) func() { return func() {} },
	}
	h := Harness{Name: "lossy", Records: 40, Timeout: 2e9}
	h.defaults()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = recover() }()
		runSuccessInto(ft, h, tg)
	}()
	<-done
	if !ft.failed {
		t.Fatal("the contract did not notice a sink that drops records")
	}
}

// A sink that modifies the records it is given must fail the readonly
// scenario. It changes a field that neither the runner nor the other sink
// reads, so that under -race the failure is the scenario's, not a race.
func TestContractCatchesMutation(t *testing.T) {
	ft := &fakeT{}
	d := &memDest{}
	mutating := pusherFunc(func(ctx context.Context, b []sinks.Record) error {
		for _, r := range b {
			r.Occurrence.Action = "rewritten by the sink"
		}
		return d.Push(ctx, b)
	})
	tg := &Target{
		NewPusher: func() (sinks.Pusher, error) { return mutating, nil },
		Delivered: func(context.Context) ([]string, error) { return nil, nil },
		Outage:    func(*testing.T) func() { return func() {} },
	}
	other := memTarget(false)(t)
	h := Harness{Name: "mutating", Records: 40, Timeout: 10e9}
	h.defaults()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runReadOnlyInto(ft, h, tg, other)
	}()
	<-done
	if !ft.failed {
		t.Fatal("the contract did not notice a sink that modifies its batch")
	}
}

type pusherFunc func(context.Context, []sinks.Record) error

func (f pusherFunc) Push(ctx context.Context, b []sinks.Record) error { return f(ctx, b) }

func TestMemLogRetention(t *testing.T) {
	l := NewMemLog()
	g := NewGenerator(1, "x-")
	if err := l.Append(context.Background(), g.Batch(10)); err != nil {
		t.Fatal(err)
	}
	l.Trim(4)
	recs, skipped, err := l.Read(context.Background(), 2, 3)
	if err != nil || skipped != 3 || len(recs) != 3 || recs[0].Offset != 5 {
		t.Fatalf("read = %d records from %v, skipped %d, err %v", len(recs), recs, skipped, err)
	}
	if l.LastOffset() != 10 {
		t.Errorf("last offset %d", l.LastOffset())
	}
}

func TestGenerator(t *testing.T) {
	g := NewGenerator(7, "p-")
	seen := map[string]bool{}
	var seed, unattributed, pulls int
	for _, o := range g.Batch(500) {
		if seen[o.GetEventId()] {
			t.Fatalf("duplicate event_id %s", o.GetEventId())
		}
		seen[o.GetEventId()] = true
		if o.GetOccurredAt() == nil || o.GetObservedAt() == nil {
			t.Fatal("occurrence without times")
		}
		switch {
		case o.GetSandbox().GetId() == SeedSandboxID:
			seed++
			if o.GetNamespace() != SeedNamespace {
				t.Errorf("seed sandbox in namespace %q", o.GetNamespace())
			}
		case o.GetSandbox() == nil:
			unattributed++
		}
		if o.GetPullFailure() != nil {
			pulls++
		}
	}
	if seed == 0 || unattributed == 0 || pulls == 0 {
		t.Errorf("seed %d, unattributed %d, pull failures %d: want all kinds", seed, unattributed, pulls)
	}
	h := Hostile("h-")
	if len(h[0].GetMessage()) != 1<<20 {
		t.Errorf("big message is %d bytes", len(h[0].GetMessage()))
	}
}
