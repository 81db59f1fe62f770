package enrich

import (
	"sort"
	"time"
)

// The input types below are the only view of Kubernetes that enrich has. The
// agent fills them from its informer caches (keeping only these fields, so a
// cached object costs little memory) and `eventpipe enrich` fills them from
// kubectl JSON. They are read-only once handed to enrich.

// Owner is one metadata.ownerReferences entry.
type Owner struct {
	APIVersion string
	Kind       string
	Name       string
	UID        string
	Controller bool
}

// Pairs is a small read-only set of labels or annotations, sorted by key.
// Not a map: the agent caches tens of thousands of objects with a few kept
// labels each, and a Go map costs about 340 bytes even for one entry, a
// Pairs 32 bytes per pair (bench/agent.md). Lookups scan: the sets are small.
type Pairs []Pair

// Pair is one label or annotation.
type Pair struct{ Key, Value string }

// PairsOf copies m into a Pairs sorted by key (nil for an empty map).
func PairsOf(m map[string]string) Pairs {
	if len(m) == 0 {
		return nil
	}
	p := make(Pairs, 0, len(m))
	for k, v := range m {
		p = append(p, Pair{k, v})
	}
	sort.Slice(p, func(i, j int) bool { return p[i].Key < p[j].Key })
	return p
}

// Lookup returns the value of key and whether it is set.
func (p Pairs) Lookup(key string) (string, bool) {
	for i := range p {
		if p[i].Key == key {
			return p[i].Value, true
		}
	}
	return "", false
}

// Get returns the value of key, "" when it is not set.
func (p Pairs) Get(key string) string {
	v, _ := p.Lookup(key)
	return v
}

// Meta is the subset of ObjectMeta that attribution reads.
type Meta struct {
	Namespace       string
	Name            string
	UID             string
	ResourceVersion string
	Labels          Pairs
	Annotations     Pairs
	Owners          []Owner
	// DeletedAt is set for objects remembered after deletion (tombstones),
	// so teardown events are still attributed.
	DeletedAt time.Time
}

// Container is one container or init container of a pod, with its spec image
// and, when known, its current waiting/terminated state.
type Container struct {
	Name  string
	Image string
	Init  bool
	// From status: the waiting state (e.g. ErrImagePull, ImagePullBackOff
	// and the runtime's message), or empty.
	WaitingReason  string
	WaitingMessage string
	// From status: the last termination reason (e.g. Error, OOMKilled):
	// the current state's when it is terminated, else lastState's.
	TerminatedReason string
	// From status: that termination's exit code (0 when unknown).
	TerminatedExitCode int32
	// Terminated: the current state is terminated (not only lastState):
	// the container is not running and nothing waits to restart it yet
	// (restartPolicy Never or OnFailure after success, an init container
	// that failed, the moment before a back-off).
	Terminated   bool
	RestartCount int32
	// From spec: the container has a readiness or a startup probe, the
	// only probes whose failures can block it without restarting it.
	Probed bool
	// From status: ready (its readiness probe passes, or it has none and
	// runs) and started (its startup probe passed, or it has none and
	// runs). A probe that passes again writes no Event: these are how its
	// blocker is seen to end (ContainersReady).
	Ready   bool
	Started bool
}

// Pod is the subset of a Pod enrich reads.
type Pod struct {
	Meta
	NodeName   string
	Phase      string
	Containers []Container
	// PullSecrets are the names in spec.imagePullSecrets, the only
	// credentials the kubelet sends for the pod's pulls besides the node's
	// own (ServiceAccount admission copies the service account's there when
	// the pod names none). enrich does not read them; the agent's
	// cluster-context rules do. nil when the pod names none.
	PullSecrets []string
}

// PVC is the subset of a PersistentVolumeClaim enrich reads.
type PVC struct {
	Meta
}

// Namespace is the subset of a Namespace enrich reads.
type Namespace struct {
	Meta
}

// Condition is one status condition of a Sandbox CR.
type Condition struct {
	Type    string
	Status  string
	Reason  string
	Message string
}

// Sandbox is the subset of an Agent Sandbox CR (agents.x-k8s.io Sandbox,
// v1beta1 or v1alpha1) enrich reads.
type Sandbox struct {
	Meta
	APIVersion string
	// PodName is the agents.x-k8s.io/pod-name annotation's value, else the CR name.
	PodName    string
	Conditions []Condition
}

// ObjectRef is an Event's involvedObject (core/v1) or regarding
// (events.k8s.io/v1).
type ObjectRef struct {
	Kind       string
	APIVersion string
	Namespace  string
	Name       string
	UID        string
	FieldPath  string
}

// Event is one Kubernetes Event, normalised from either Event API. Zero times
// mean "not set".
type Event struct {
	// "v1" or "events.k8s.io/v1".
	APIVersion      string
	Namespace       string
	Name            string
	UID             string
	ResourceVersion string

	Involved ObjectRef
	Type     string
	Reason   string
	Message  string
	Action   string
	// core/v1 count, or events.k8s.io series.count (deprecatedCount when
	// no series).
	Count int32

	FirstTimestamp     time.Time
	LastTimestamp      time.Time
	EventTime          time.Time
	SeriesLastObserved time.Time

	// source.component / reportingController; source.host / reportingInstance.
	ReportingComponent string
	ReportingInstance  string
}

// Small read-only lookups over cached metadata. Implementations must be safe
// for concurrent reads; they never do I/O (the agent backs them with informer
// indexers, tests with maps). ok=false means "not cached (yet)".
type (
	PodLookup interface {
		Pod(namespace, name string) (*Pod, bool)
	}
	PVCLookup interface {
		PVC(namespace, name string) (*PVC, bool)
	}
	NamespaceLookup interface {
		Namespace(name string) (*Namespace, bool)
	}
	SandboxLookup interface {
		Sandbox(namespace, name string) (*Sandbox, bool)
		SandboxByUID(uid string) (*Sandbox, bool)
	}
	// PodUIDLookup may be implemented by a PodLookup besides Pod: a pod by
	// uid, at least among the deleted pods it remembers. Attribution asks it
	// when the pod cached under an event's pod name has another uid (a
	// sandbox deleted and created again under its name while the old pod's
	// Events still arrive).
	PodUIDLookup interface {
		PodByUID(uid string) (*Pod, bool)
	}
)

// Lookups bundles the caches attribution reads. A nil field behaves as an
// empty cache.
type Lookups struct {
	Pods       PodLookup
	PVCs       PVCLookup
	Namespaces NamespaceLookup
	Sandboxes  SandboxLookup
}
