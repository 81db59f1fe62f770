package collector

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the collector's own series; the store and the sink runners
// register theirs on the same registerer.
type metrics struct {
	ingested            prometheus.Counter
	duplicates          prometheus.Counter
	batches             prometheus.Counter
	rejectedBatches     *prometheus.CounterVec
	rejectedOccurrences *prometheus.CounterVec
	appendFailures      prometheus.Counter
	ackLatency          prometheus.Histogram
	groupBatches        prometheus.Histogram
	subscribers         prometheus.Gauge
	followSent          prometheus.Counter
	followLost          prometheus.Counter
	followCursorAhead   prometheus.Counter
	authFailures        *prometheus.CounterVec
	streamsRevoked      prometheus.Counter
	reloads             *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		ingested: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_ingested_occurrences_total",
			Help: "Occurrences newly stored in the log and acknowledged.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_deduplicated_occurrences_total",
			Help: "Occurrences recognised as already stored (same event_id) and not stored again.",
		}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_ingest_batches_total",
			Help: "Batches received on Ingest.Ship streams.",
		}),
		rejectedBatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_ingest_rejected_batches_total",
			Help: "Batches refused whole, by reason: too_large (over grpc.max_recv_bytes, refused by gRPC before decoding), invalid_batch (no cluster), out_of_order (seq not increasing), invalid (the log refused every occurrence).",
		}, []string{"reason"}),
		rejectedOccurrences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_ingest_rejected_occurrences_total",
			Help: "Occurrences refused for good at ingest (reported to the agent in the ack), by reason.",
		}, []string{"reason"}),
		appendFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_ingest_append_failures_total",
			Help: "Batches the log refused to store; they were not acknowledged.",
		}),
		ackLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "eventpipe_collector_ack_latency_seconds",
			Help:    "Time from receiving a batch to sending its acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		groupBatches: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "eventpipe_collector_ingest_append_group_batches",
			Help:    "Batches of one Ship stream stored by one log append (pipelined batches share a group commit).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		subscribers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "eventpipe_collector_follow_subscribers",
			Help: "Open Follow streams.",
		}),
		followSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_follow_sent_occurrences_total",
			Help: "Occurrences sent on Follow streams.",
		}),
		followLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_follow_lost_records_total",
			Help: "Log records removed by retention before a Follow subscriber read them (reported to the subscriber).",
		}),
		followCursorAhead: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_follow_cursor_beyond_log_total",
			Help: "Follow resumes refused because after_cursor was beyond the end of the log (the log lost data or is another collector's).",
		}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_auth_failures_total",
			Help: "gRPC calls refused by authentication or authorization, by reason.",
		}, []string{"reason"}),
		streamsRevoked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_collector_streams_ended_by_reload_total",
			Help: "Open Ship/Follow streams ended because a reload removed their token or identity or changed its grants.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_config_reloads_total",
			Help: "Configuration reloads, by result (applied, failed, restart_required).",
		}, []string{"result"}),
	}
	for _, r := range authReasons {
		m.authFailures.WithLabelValues(r)
	}
	for _, r := range rejectionReasons {
		m.rejectedOccurrences.WithLabelValues(r)
	}
	for _, r := range batchRejectionReasons {
		m.rejectedBatches.WithLabelValues(r)
	}
	for _, r := range []string{"applied", "failed", "restart_required"} {
		m.reloads.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.ingested, m.duplicates, m.batches, m.rejectedBatches, m.rejectedOccurrences,
			m.appendFailures, m.ackLatency, m.groupBatches, m.subscribers, m.followSent, m.followLost, m.followCursorAhead, m.authFailures, m.streamsRevoked, m.reloads} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register collector metrics: %w", err)
			}
		}
	}
	return m, nil
}
