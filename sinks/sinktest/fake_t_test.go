package sinktest

import (
	"context"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeT records failures of a contract scenario run against a broken sink.
type fakeT struct {
	testing.TB
	failed bool
	clean  []func()
}

func (f *fakeT) Helper()               {}
func (f *fakeT) Errorf(string, ...any) { f.failed = true }
func (f *fakeT) Fatalf(string, ...any) { f.failed = true; runtime.Goexit() }
func (f *fakeT) Fatal(...any)          { f.failed = true; runtime.Goexit() }
func (f *fakeT) Logf(string, ...any)   {}
func (f *fakeT) Cleanup(fn func())     { f.clean = append(f.clean, fn) }
func (f *fakeT) Name() string          { return "fake" }

// runSuccessInto runs the success scenario with a fake T.
func runSuccessInto(ft *fakeT, h Harness, tg *Target) {
	runInto(ft, h, tg, successScenario)
}

// runReadOnlyInto runs the readonly scenario with a fake T; second is the
// second runner's destination.
func runReadOnlyInto(ft *fakeT, h Harness, tg, second *Target) {
	runInto(ft, h, tg, func(e *env) { readOnlyScenario(e, second) })
}

func runInto(ft *fakeT, h Harness, tg *Target, scenario func(*env)) {
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	defer func() {
		for i := len(ft.clean) - 1; i >= 0; i-- {
			ft.clean[i]()
		}
	}()
	e := &env{t: ft, h: h, ctx: ctx, target: tg, log: NewMemLog(), reg: prometheus.NewRegistry(), gen: NewGenerator(1, h.Name+"-")}
	scenario(e)
}
