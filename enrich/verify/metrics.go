package verify

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	checks    *prometheus.CounterVec
	calls     *prometheus.CounterVec
	cacheHits prometheus.Counter
	duration  prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_verify_checks_total",
			Help: "Registry checks asked for that were not answered from the cache, by answer (throttled and invalid_reference: no call made).",
		}, []string{"answer"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_verify_registry_calls_total",
			Help: "Checks that called a registry, by answer.",
		}, []string{"answer"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_verify_cache_hits_total",
			Help: "Checks answered from the cache (verify.cache_ttl).",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "eventpipe_verify_registry_call_duration_seconds",
			Help:    "Time of one check's registry calls (token exchange included).",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}),
	}
	for _, a := range Answers {
		m.checks.WithLabelValues(a)
		m.calls.WithLabelValues(a)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.checks, m.calls, m.cacheHits, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register verify metrics: %w", err)
		}
	}
	return m, nil
}
