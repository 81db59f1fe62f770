package loki

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Fixed label values.
const (
	// refused reasons
	reasonBadRequest = "bad_request" // Loki answered 400 for the entry alone
	reasonTooLarge   = "too_large"   // 413 for the entry alone
	reasonInvalid    = "invalid"     // refused before sending (no occurrence, bad tenant)
	// request codes
	codeError = "error" // no HTTP answer (network, timeout)
)

type metrics struct {
	requests    *prometheus.CounterVec
	refused     *prometheus.CounterVec
	restamped   prometheus.Counter
	splits      prometheus.Counter
	sentBytes   prometheus.Counter
	sentEntries prometheus.Counter
	duration    prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_sink_loki_requests_total",
			Help: "Loki push requests by answer: 2xx, 400, 401, 403, 404, 413, 429, 4xx (other), 5xx, error (no answer).",
		}, []string{"code"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_sink_loki_entries_refused_total",
			Help: "Occurrences Loki refused for good (found by splitting a refused request) or that could not be sent, by reason.",
		}, []string{"reason"}),
		restamped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_sink_loki_entries_restamped_total",
			Help: "Occurrences sent with the push time because their own time was outside [now-max_age, now+max_future].",
		}),
		splits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_sink_loki_request_splits_total",
			Help: "Refused (400/413) requests split in halves to find the refused entries.",
		}),
		sentBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_sink_loki_sent_bytes_total",
			Help: "Request body bytes (compressed) Loki accepted.",
		}),
		sentEntries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_sink_loki_sent_entries_total",
			Help: "Entries in requests Loki accepted (a split can send an entry twice).",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "eventpipe_sink_loki_request_duration_seconds",
			Help:    "Duration of Loki push requests.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}),
	}
	for _, c := range []string{"2xx", "400", "401", "403", "404", "413", "429", "4xx", "5xx", codeError} {
		m.requests.WithLabelValues(c)
	}
	for _, r := range []string{reasonBadRequest, reasonTooLarge, reasonInvalid} {
		m.refused.WithLabelValues(r)
	}
	return m
}

// register adds the metrics to reg (nil: not registered). A second Loki
// sink on the same registerer shares the already registered collectors;
// to tell sinks apart, give each prometheus.WrapRegistererWith(
// prometheus.Labels{"sink": name}, reg).
func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	cs := []prometheus.Collector{m.requests, m.refused, m.restamped, m.splits, m.sentBytes, m.sentEntries, m.duration}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
			cs[i] = are.ExistingCollector
		}
	}
	m.requests = cs[0].(*prometheus.CounterVec)
	m.refused = cs[1].(*prometheus.CounterVec)
	m.restamped = cs[2].(prometheus.Counter)
	m.splits = cs[3].(prometheus.Counter)
	m.sentBytes = cs[4].(prometheus.Counter)
	m.sentEntries = cs[5].(prometheus.Counter)
	m.duration = cs[6].(prometheus.Histogram)
	return nil
}

func codeClass(code int) string {
	switch code {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound,
		http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return strconv.Itoa(code)
	}
	switch code / 100 {
	case 2:
		return "2xx"
	case 4:
		return "4xx"
	case 5:
		return "5xx"
	}
	return "error"
}
