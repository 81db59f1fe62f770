package gateway

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
)

type metrics struct {
	rpcs                *prometheus.CounterVec
	rpcSeconds          *prometheus.HistogramVec
	streams             prometheus.Gauge
	spliced             prometheus.Counter
	duplicates          prometheus.Counter
	droppedDriverEvents prometheus.Counter
	lagged              prometheus.Counter
	malformed           prometheus.Counter
	peerRejected        prometheus.Counter
	occurrences         prometheus.Counter
	followErrors        *prometheus.CounterVec
	connected           prometheus.Gauge
	sandboxes           prometheus.Gauge
	failing             prometheus.Gauge
	blocked             prometheus.Gauge
	blockersDropped     prometheus.Counter
	events              prometheus.Gauge
	evicted             prometheus.Counter
	trimmed             prometheus.Counter
	stateErrors         prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns = "eventpipe_driver_proxy_"
	m := &metrics{
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "rpcs_total",
			Help: "Driver RPCs forwarded, by method (unknown methods: other) and gRPC code."}, []string{"method", "code"}),
		rpcSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: ns + "rpc_duration_seconds",
			Help:    "Time of unary driver RPCs through the proxy (driver included).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"method"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "watch_streams",
			Help: "Open WatchSandboxes streams."}),
		spliced: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "platform_events_sent_total",
			Help: "Platform events from the collector sent to gateway streams."}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "duplicates_suppressed_total",
			Help: "Platform events not sent because the same event id was kept or sent already."}),
		droppedDriverEvents: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "driver_kubernetes_events_dropped_total",
			Help: "The driver's own kubernetes platform events replaced by eventpipe's."}),
		lagged: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "stream_overflows_total",
			Help: "Times a WatchSandboxes stream fell more than follow.max_events behind; it then catches up from the per-sandbox tails."}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "unparsed_messages_total",
			Help: "Driver messages forwarded unedited because they could not be parsed."}),
		peerRejected: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "peers_rejected_total",
			Help: "Connections refused because the peer runs as another uid (or its credentials could not be read)."}),
		occurrences: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "occurrences_total",
			Help: "Occurrences read from the collector's Follow stream."}),
		followErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "follow_errors_total",
			Help: "Follow stream failures by gRPC code (config: the connection could not be built)."}, []string{"code"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "follow_connected",
			Help: "1 while the Follow stream is open."}),
		sandboxes: prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "sandboxes",
			Help: "Sandboxes the proxy keeps state for."}),
		failing: prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "pull_failures_active",
			Help: "Sandboxes with an active image-pull failure (ImagePulled=False)."}),
		blocked: prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "blocked_sandboxes",
			Help: "Sandboxes with an active blocker of any kind, each shown as a condition (ImagePulled=False included)."}),
		blockersDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "blockers_dropped_total",
			Help: "Blockers not kept because their sandbox had 32 already (the ones kept are still shown)."}),
		events: prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "tail_events",
			Help: "Platform events kept in the per-sandbox tails."}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "sandboxes_evicted_total",
			Help: "Sandboxes forgotten because follow.max_sandboxes was reached."}),
		trimmed: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "tail_events_trimmed_total",
			Help: "Tail events dropped because follow.max_events was reached."}),
		stateErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "state_write_errors_total",
			Help: "Failed writes of follow.state_file."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.rpcs, m.rpcSeconds, m.streams, m.spliced, m.duplicates, m.droppedDriverEvents,
			m.lagged, m.malformed, m.peerRejected, m.occurrences, m.followErrors, m.connected,
			m.sandboxes, m.failing, m.blocked, m.blockersDropped, m.events, m.evicted, m.trimmed, m.stateErrors} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register driver-proxy metrics: %w", err)
			}
		}
	}
	return m, nil
}

func codeLabel(err error) string {
	return status.Code(err).String()
}
