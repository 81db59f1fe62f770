package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterSharesAndReportsConflicts(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "eventpipe_test_things_total", Help: "Things."}
	a, err := Register(reg, prometheus.NewCounter(opts))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Register(reg, prometheus.NewCounter(opts))
	if err != nil || a != b {
		t.Fatalf("second registration: %v, same collector %v", err, a == b)
	}
	b.Inc()
	// Same name, different help: a real conflict is reported.
	if _, err := Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: opts.Name, Help: "Other."})); err == nil {
		t.Error("conflicting registration accepted")
	}
	if c, err := Register[prometheus.Counter](nil, prometheus.NewCounter(opts)); err != nil || c == nil {
		t.Errorf("nil registerer: %v", err)
	}
}
