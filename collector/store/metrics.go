package store

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	appended      prometheus.Counter
	deduplicated  prometheus.Counter
	retention     prometheus.Counter
	consumerLost  *prometheus.CounterVec
	firstOffset   prometheus.Gauge
	lastOffset    prometheus.Gauge
	inflight      prometheus.Gauge
	appendErrors  prometheus.Counter
	dedupeEvicted prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		appended: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_log_appended_records_total",
			Help: "Occurrences durably appended to the log.",
		}),
		deduplicated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_log_deduplicated_total",
			Help: "Occurrences not stored because their event_id was stored within the dedupe window.",
		}),
		retention: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_log_retention_removed_records_total",
			Help: "Records removed from the log by retention (size or age).",
		}),
		consumerLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_log_consumer_lost_records_total",
			Help: "Records removed by retention before the consumer (sink) read them.",
		}, []string{"consumer"}),
		firstOffset: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "eventpipe_collector_log_first_offset",
			Help: "Offset of the oldest retained record.",
		}),
		lastOffset: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "eventpipe_collector_log_last_offset",
			Help: "Offset of the newest durable record.",
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "eventpipe_collector_log_inflight_bytes",
			Help: "Bytes of batches accepted and waiting for their group commit (bounded by max_inflight_bytes).",
		}),
		dedupeEvicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_log_dedupe_evicted_total",
			Help: "Event ids dropped from the full dedupe index before their window ended (dedupe_max_entries).",
		}),
		appendErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_log_append_failures_total",
			Help: "Append calls that failed (nothing acknowledged).",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.appended, m.deduplicated, m.retention, m.consumerLost,
		m.firstOffset, m.lastOffset, m.inflight, m.appendErrors, m.dedupeEvicted} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register store metrics: %w", err)
		}
	}
	return m, nil
}
