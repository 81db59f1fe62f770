package collector

import (
	"fmt"
	"net/http"
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
}

// readiness answers /readyz: ready means "can acknowledge ingest", i.e. the
// store accepts appends. A sink that loses records to retention does not
// make the collector unready: with one replica that would remove the
// Service's only endpoint and turn a Loki outage into an outage of every
// agent and consumer. Sink loss is a metric and an alert instead
// (eventpipe_sink_lost_records_total, docs/operations.md), and so is
// acknowledged data found lost in the log
// (eventpipe_collector_log_data_loss_records_total; at start-up the store
// refuses such a log unless store.accept_data_loss is set). A log that
// consumers cannot read past (a read that keeps failing at one offset) does
// make it unready: what it acknowledges would never be delivered.
type readiness struct {
	log readinessLog
	// what names the log in messages ("store" when empty).
	what string
}

func (r *readiness) check(time.Time) []string {
	var problems []string
	if err := r.log.Writable(); err != nil {
		what := r.what
		if what == "" {
			what = "store"
		}
		problems = append(problems, what+" not writable: "+err.Error())
	}
	if rl, ok := r.log.(interface{ Readable() error }); ok {
		if err := rl.Readable(); err != nil {
			problems = append(problems, "log not readable: "+err.Error())
		}
	}
	return problems
}
