package sinks

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the reason label of eventpipe_sink_failed_records_total.
const (
	FailedPermanent = "permanent"
	FailedPartial   = "partial"
)

// Values of the class label of eventpipe_sink_push_errors_total.
const (
	ClassRetryable = "retryable"
	ClassThrottle  = "throttle"
	ClassPermanent = "permanent"
)

// metrics are the vectors every runner shares; each runner curries them
// with its sink label.
type metrics struct {
	sent, failed, pushErrors, filtered, lost *prometheus.CounterVec
	commits, cursorAhead                     *prometheus.CounterVec
	lagRecords, lagSeconds                   *prometheus.GaugeVec
	pushDuration, batchRecords               *prometheus.HistogramVec
}

func newMetrics() *metrics {
	return &metrics{
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_sink_sent_records_total",
			Help: "Records delivered to the sink's destination.",
		}, []string{"sink"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_sink_failed_records_total",
			Help: "Records refused permanently by the destination and dropped (each one is logged).",
		}, []string{"sink", "reason"}),
		pushErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_sink_push_errors_total",
			Help: "Failed push attempts by error class.",
		}, []string{"sink", "class"}),
		filtered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_sink_filtered_records_total",
			Help: "Records skipped by the sink's filter.",
		}, []string{"sink"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_sink_lost_records_total",
			Help: "Records removed by log retention before the sink read them.",
		}, []string{"sink"}),
		cursorAhead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_sink_cursor_beyond_log_total",
			Help: "Starts at which the sink's committed cursor was beyond the end of the log (records gone from the log, or another log); the sink resumed from the log's end.",
		}, []string{"sink"}),
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_sink_cursor_commits_total",
			Help: "Durable commits of the sink's cursor (at most one per commit_interval while records flow).",
		}, []string{"sink"}),
		lagRecords: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "eventpipe_sink_lag_records",
			Help: "Records in the log the sink has not handled yet (delivered, dropped or filtered).",
		}, []string{"sink"}),
		lagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "eventpipe_sink_lag_seconds",
			Help: "Age of the oldest record the sink has read but not yet delivered (0 when caught up).",
		}, []string{"sink"}),
		pushDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "eventpipe_sink_push_duration_seconds",
			Help:    "Duration of one push attempt.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
		}, []string{"sink"}),
		batchRecords: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "eventpipe_sink_batch_records",
			Help:    "Records per pushed batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}, []string{"sink"}),
	}
}

// register registers every vector on reg, reusing the vectors an earlier
// runner registered there (AlreadyRegisteredError), so several runners share
// one set of vectors on one registry. reg may be nil.
func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	var err error
	m.sent = registerVec(reg, m.sent, &err)
	m.failed = registerVec(reg, m.failed, &err)
	m.pushErrors = registerVec(reg, m.pushErrors, &err)
	m.filtered = registerVec(reg, m.filtered, &err)
	m.lost = registerVec(reg, m.lost, &err)
	m.commits = registerVec(reg, m.commits, &err)
	m.cursorAhead = registerVec(reg, m.cursorAhead, &err)
	m.lagRecords = registerVec(reg, m.lagRecords, &err)
	m.lagSeconds = registerVec(reg, m.lagSeconds, &err)
	m.pushDuration = registerVec(reg, m.pushDuration, &err)
	m.batchRecords = registerVec(reg, m.batchRecords, &err)
	return err
}

func registerVec[T prometheus.Collector](reg prometheus.Registerer, c T, errp *error) T {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing
			}
		}
		if *errp == nil {
			*errp = err
		}
	}
	return c
}

// sinkMetrics are the vectors curried with one sink's label.
type sinkMetrics struct {
	sent, filtered, lost, commits      prometheus.Counter
	cursorAhead                        prometheus.Counter
	failedPermanent, failedPartial     prometheus.Counter
	errRetryable, errThrottle, errPerm prometheus.Counter
	lagRecords, lagSeconds             prometheus.Gauge
	pushDuration, batchRecords         prometheus.Observer
	m                                  *metrics
	name                               string
}

func (m *metrics) forSink(name string) *sinkMetrics {
	return &sinkMetrics{
		m:               m,
		name:            name,
		sent:            m.sent.WithLabelValues(name),
		filtered:        m.filtered.WithLabelValues(name),
		lost:            m.lost.WithLabelValues(name),
		commits:         m.commits.WithLabelValues(name),
		cursorAhead:     m.cursorAhead.WithLabelValues(name),
		failedPermanent: m.failed.WithLabelValues(name, FailedPermanent),
		failedPartial:   m.failed.WithLabelValues(name, FailedPartial),
		errRetryable:    m.pushErrors.WithLabelValues(name, ClassRetryable),
		errThrottle:     m.pushErrors.WithLabelValues(name, ClassThrottle),
		errPerm:         m.pushErrors.WithLabelValues(name, ClassPermanent),
		lagRecords:      m.lagRecords.WithLabelValues(name),
		lagSeconds:      m.lagSeconds.WithLabelValues(name),
		pushDuration:    m.pushDuration.WithLabelValues(name),
		batchRecords:    m.batchRecords.WithLabelValues(name),
	}
}
