package collector

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func (c *Collector) buildHTTP() {
	mux := http.NewServeMux()
	if g, ok := c.reg.(prometheus.Gatherer); ok {
		mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	} else {
		mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "no metrics registry configured", http.StatusNotFound)
		})
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if problems := c.ready.check(time.Now()); len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:")
			for _, p := range problems {
				fmt.Fprintln(w, "- "+p)
			}
			return
		}
		fmt.Fprintln(w, "ready")
	})
	c.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

// readinessLog is what /readyz asks the store.
type readinessLog interface {
	Writable() error
	Lost() map[string]uint64
}

type lossMark struct {
	count uint64
	at    time.Time // when count last grew
}

// readiness remembers when each consumer last lost records to retention, so
// /readyz can fail for window after a loss and name the consumer.
type readiness struct {
	log    readinessLog
	window time.Duration
	logger *slog.Logger

	mu    sync.Mutex
	since map[string]lossMark
}

// observe records growth of the store's per-consumer loss counters. A
// consumer seen with losses for the first time counts as a fresh loss: the
// collector cannot tell how old it is, so it says so rather than hide it.
func (r *readiness) observe(now time.Time) {
	lost := r.log.Lost()
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, n := range lost {
		prev, ok := r.since[name]
		if n > prev.count || (!ok && n > 0) {
			r.since[name] = lossMark{count: n, at: now}
			if ok {
				r.logger.Error("consumer lost records to retention", "consumer", name, "lost_total", n, "new", n-prev.count)
			}
		}
	}
}

func (r *readiness) check(now time.Time) []string {
	var problems []string
	if err := r.log.Writable(); err != nil {
		problems = append(problems, "store not writable: "+err.Error())
	}
	r.observe(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	var names []string
	for name, m := range r.since {
		if m.count > 0 && now.Sub(m.at) < r.window {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		m := r.since[name]
		problems = append(problems, fmt.Sprintf("consumer %q lost records to retention %s ago (%d lost in total); it stays not ready for %s after a loss",
			name, now.Sub(m.at).Truncate(time.Second), m.count, r.window))
	}
	return problems
}

// run polls the loss counters so a loss is noticed (and logged) even when
// nobody asks /readyz.
func (r *readiness) run(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	r.observe(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.observe(now)
		}
	}
}
