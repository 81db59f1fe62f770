package agent

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// metrics are the agent's Prometheus series. Labels take values only from
// the fixed lists below.
type metrics struct {
	watchEvents     *prometheus.CounterVec // type
	occurrences     *prometheus.CounterVec // source
	attributed      *prometheus.CounterVec // rule
	unattributed    prometheus.Counter
	skipped         *prometheus.CounterVec // reason
	held            prometheus.Gauge
	lateBound       prometheus.Counter
	holdExpired     prometheus.Counter
	holdOverflow    prometheus.Counter
	relists         *prometheus.CounterVec // method
	expired         prometheus.Counter
	watchErrors     prometheus.Counter
	apiRequests     *prometheus.CounterVec // verb, resource
	cursorAge       prometheus.Gauge
	shipLatency     prometheus.Histogram
	batches         *prometheus.CounterVec // result
	acked           *prometheus.CounterVec // result
	shipErrors      prometheus.Counter
	queueLength     prometheus.Gauge
	leader          prometheus.Gauge
	cacheObjects    *prometheus.GaugeVec // kind
	diagnoseDropped prometheus.Counter
	deletionDropped prometheus.Counter
	// conditionDropped: Sandbox Ready conditions not shipped (queue full)
	conditionDropped prometheus.Counter
	// readyDropped: container readiness changes not shipped (queue full)
	readyDropped prometheus.Counter
	// supervisor image check (verify.supervisor)
	supervisorBad    prometheus.Gauge
	supervisorErrors prometheus.Counter
	// registry checks of pull failures (verify.pull_failures)
	verifyApplied *prometheus.CounterVec
	verifyDropped prometheus.Counter
	// verifyPullSecretErrors: reads of a granted pull secret that failed.
	verifyPullSecretErrors prometheus.Counter
	// cluster-context rules (pullcontext.go)
	contextApplied prometheus.Counter
	deadLetters    *prometheus.CounterVec // reason
	resent         prometheus.Counter
}

var (
	watchTypes       = []string{"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"}
	attributionRules = []string{
		eventpipev1.AttributionSandboxAnnotation, eventpipev1.AttributionSandboxLabel,
		eventpipev1.AttributionPodAnnotation, eventpipev1.AttributionPodLabel,
		eventpipev1.AttributionBoundaryPair, eventpipev1.AttributionSupervisorName,
		eventpipev1.AttributionOwnerChain, eventpipev1.AttributionPodName,
		eventpipev1.AttributionPVCOwner, eventpipev1.AttributionPVCName, "other",
	}
	apiVerbs     = []string{"list", "watch", "get", "create", "update", "other"}
	apiResources = []string{"events", "pods", "persistentvolumeclaims", "namespaces", "sandboxes", "leases", "statefulsets", "deployments", "configmaps", "discovery", "other"}
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		watchEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_agent_watch_events_total", Help: "Event watch notifications received, by watch type.",
		}, []string{"type"}),
		occurrences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_agent_occurrences_total", Help: "Occurrences handed to the shipper, by source (event, pod_status, deletion: a Sandbox CR seen deleted, sandbox_condition: its Ready condition, container_ready: a probed container of a sandbox became ready, registry_check: a supervisor-image check or a pull failure updated by the registry).",
		}, []string{"source"}),
		attributed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_agent_attributed_total", Help: "Occurrences attributed to a sandbox, by the rule that matched.",
		}, []string{"rule"}),
		unattributed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_unattributed_total", Help: "Occurrences shipped without a sandbox.",
		}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_agent_skipped_total", Help: "Watch notifications that are not occurrences, by reason (unchanged, deleted, bad_object).",
		}, []string{"reason"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "eventpipe_agent_held_events", Help: "Events held because their owner is not cached yet.",
		}),
		lateBound: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_late_bound_total", Help: "Held Events attributed after their owner appeared in the cache.",
		}),
		holdExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_hold_expired_total", Help: "Held Events shipped unattributed after hold.maxAge.",
		}),
		holdOverflow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_hold_overflow_total", Help: "Events shipped at once (unattributed) because the hold was full.",
		}),
		relists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_agent_relists_total", Help: "Full listings of Events (start without cursor, or after 410 Gone), by method (watchlist, list).",
		}, []string{"method"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_watch_expired_total", Help: "Watches refused or ended with 410 Gone (resourceVersion too old).",
		}),
		watchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_watch_errors_total", Help: "Event watch or list failures other than 410 Gone.",
		}),
		apiRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_agent_api_requests_total", Help: "Requests to the Kubernetes API, by verb and resource.",
		}, []string{"verb", "resource"}),
		cursorAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "eventpipe_agent_cursor_age_seconds", Help: "Age of the oldest occurrence not yet acknowledged by the collector (0 when none).",
		}),
		shipLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "eventpipe_agent_ship_latency_seconds", Help: "Time from sending a batch to its Ack.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_agent_batches_total", Help: "Batches, by result (acked, resent, refused: dropped after the collector refused the whole batch for good).",
		}, []string{"result"}),
		acked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_agent_acked_occurrences_total", Help: "Occurrences acknowledged by the collector, by result (stored, duplicate, rejected: refused for good and dead-lettered).",
		}, []string{"result"}),
		shipErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_ship_errors_total", Help: "Ship stream failures (each followed by a reconnect with backoff).",
		}),
		queueLength: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "eventpipe_agent_queue_length", Help: "Events read from the watch and not yet processed.",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "eventpipe_agent_leader", Help: "1 while this replica holds the Lease and watches.",
		}),
		cacheObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "eventpipe_agent_cache_objects", Help: "Objects in the metadata caches, by kind (live objects, not tombstones).",
		}, []string{"kind"}),
		diagnoseDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_diagnose_dropped_total", Help: "Pod-status diagnoses dropped because the diagnose queue was full (the pod's next update retries).",
		}),
		supervisorBad: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "eventpipe_agent_supervisor_image_bad",
			Help: "1 while the registry says the OpenShell gateway's supervisor image cannot be pulled (verify.supervisor); 0 otherwise.",
		}),
		supervisorErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_supervisor_resolve_errors_total",
			Help: "Supervisor image checks that could not tell the gateway's supervisor image (workload or ConfigMap unreadable, no version).",
		}),
		verifyApplied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_agent_verify_applied_total",
			Help: "Pull-failure diagnoses a registry answer upgraded (decided_by registry), by how: cached (a fresh answer, in place, on the event path), kept (the last conclusive answer, in place, while the image is asked again) or update (an update occurrence after the check).",
		}, []string{"how"}),
		verifyPullSecretErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_verify_pull_secret_errors_total",
			Help: "Reads of a pull secret granted for registry checks (verify.pull_secrets) that failed: forbidden, missing, or not a docker config. The secret's last credentials stay in use.",
		}),
		contextApplied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_context_applied_total",
			Help: "Pull-failure diagnoses a cluster-context rule changed (decided_by cluster_context), e.g. a pod's missing image pull secret.",
		}),
		verifyDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_verify_dropped_total",
			Help: "Pull failures not checked with the registry because verify.queue was full.",
		}),
		conditionDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_condition_dropped_total", Help: "Sandbox Ready conditions reporting a refused pod (or its end) not shipped because the condition queue was full (the CR's next change retries).",
		}),
		readyDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_ready_dropped_total", Help: "Pods whose probed containers became ready not shipped as container readiness occurrences because the ready queue was full (readers keep those containers' probe blockers open).",
		}),
		deletionDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_deletion_dropped_total", Help: "Sandbox deletions not shipped because the deletion queue was full (readers then tell the live sandbox of a reused name by which id appeared last).",
		}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_agent_dead_letter_total", Help: "Occurrences refused for good (by the collector, or not encodable), logged, kept at /debug/deadletter and skipped, by reason.",
		}, []string{"reason"}),
		resent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_agent_resent_occurrences_total", Help: "Occurrences sent again on a new Ship stream because their batch was not acknowledged on the previous one.",
		}),
	}
	for _, r := range deadLetterReasons {
		m.deadLetters.WithLabelValues(r)
	}
	for _, r := range []string{"acked", "resent", "refused"} {
		m.batches.WithLabelValues(r)
	}
	for _, h := range []string{"cached", "kept", "update"} {
		m.verifyApplied.WithLabelValues(h)
	}
	for _, r := range []string{"stored", "duplicate", "rejected"} {
		m.acked.WithLabelValues(r)
	}
	for _, t := range watchTypes {
		m.watchEvents.WithLabelValues(t)
	}
	for _, r := range attributionRules {
		m.attributed.WithLabelValues(r)
	}
	for _, v := range apiVerbs {
		for _, r := range apiResources {
			m.apiRequests.WithLabelValues(v, r)
		}
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.watchEvents, m.occurrences, m.attributed, m.unattributed, m.skipped, m.held,
			m.lateBound, m.holdExpired, m.holdOverflow, m.relists, m.expired, m.watchErrors, m.apiRequests,
			m.cursorAge, m.shipLatency, m.batches, m.acked, m.shipErrors, m.queueLength, m.leader,
			m.cacheObjects, m.diagnoseDropped, m.deletionDropped, m.conditionDropped, m.readyDropped, m.supervisorBad, m.supervisorErrors, m.verifyApplied, m.verifyDropped, m.verifyPullSecretErrors, m.contextApplied, m.deadLetters, m.resent} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register agent metrics: %w", err)
			}
		}
	}
	return m, nil
}

func ruleLabel(rule string) string {
	for _, r := range attributionRules {
		if r == rule {
			return r
		}
	}
	return "other"
}

func watchTypeLabel(t string) string {
	for _, w := range watchTypes {
		if w == t {
			return w
		}
	}
	return "ERROR"
}
