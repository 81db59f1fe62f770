package wal

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metrics are the WAL's Prometheus collectors. Create them once with
// NewMetrics and pass them in Options.Metrics when a WAL is reopened in the
// same process (after a failure), so they are registered only once.
type Metrics struct {
	fsync           prometheus.Histogram
	repairedRecords prometheus.Counter
	repairedBytes   prometheus.Counter
	lostRecords     prometheus.Counter
	lostBytes       prometheus.Counter
	failures        prometheus.Counter
	segments        prometheus.Gauge
	bytes           prometheus.Gauge
}

// NewMetrics creates and registers the WAL's metrics (reg nil: unregistered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		fsync: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "eventpipe_collector_log_fsync_duration_seconds",
			Help:    "Time spent in fsync of the log's active segment.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		repairedRecords: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_log_repaired_records_total",
			Help: "Unacknowledged records dropped from the torn tail of the last write when the log was opened.",
		}),
		repairedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_log_repaired_bytes_total",
			Help: "Bytes dropped from the torn tail of the last write when the log was opened.",
		}),
		lostRecords: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_log_data_loss_records_total",
			Help: "Acknowledged records found damaged or missing in the log (corruption, or a disk that lost fsynced data); each region is logged at ERROR.",
		}),
		lostBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_log_data_loss_bytes_total",
			Help: "Bytes of damaged acknowledged data found in the log (see eventpipe_collector_log_data_loss_records_total).",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_log_write_failures_total",
			Help: "Failed writes or fsyncs; each makes the log refuse appends until reopened.",
		}),
		segments: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "eventpipe_collector_log_segments",
			Help: "Segment files in the log.",
		}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "eventpipe_collector_log_stored_bytes",
			Help: "Bytes of durable data in the log's segment files.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.fsync, m.repairedRecords, m.repairedBytes, m.lostRecords, m.lostBytes, m.failures, m.segments, m.bytes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register wal metrics: %w", err)
		}
	}
	return m, nil
}

// FsyncStats returns how many fsyncs of the active segment were observed and
// their total duration in seconds (for benchmarks and tests).
func (m *Metrics) FsyncStats() (count uint64, seconds float64) {
	var d dto.Metric
	if err := m.fsync.Write(&d); err != nil {
		return 0, 0
	}
	return d.GetHistogram().GetSampleCount(), d.GetHistogram().GetSampleSum()
}
