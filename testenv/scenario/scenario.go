package scenario

import (
	"fmt"
	"strings"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// API names an Event API.
type API string

// The two Event APIs.
const (
	CoreV1   API = "v1"
	EventsV1 API = "events.k8s.io/v1"
)

// Reporting components.
const (
	KubeletComponent     = "kubelet"
	SchedulerComponent   = "default-scheduler"
	SandboxControllerCmp = "agent-sandbox-controller"
	PVControllerCmp      = "persistentvolume-controller"
)

// Expectation is what a correct consumer should conclude about one Event,
// once the objects it names are known (cached, or remembered after
// deletion). Values are api/eventpipe/v1 constants.
type Expectation struct {
	SandboxID   string // "" when the event belongs to no sandbox
	SandboxName string // the user's sandbox name
	Workspace   string
	Role        string // eventpipev1.Role*
	Attribution string // eventpipev1.Attribution*: the first rule that matches
	Container   string // from involvedObject.fieldPath; "" when none
	ImageRole   string // eventpipev1.ImageRole* for Container; "" when no container
	Image       string // the image reference the message names, else ""
	// PullFailure: the event reports a failed image pull (Failed with the
	// runtime's error, ErrImagePull, BackOff pulling, ImagePullBackOff).
	PullFailure bool
	// PullCategory is the cause (eventpipev1.Category*) of the container's
	// pull failure; CategoryInMessage says whether this event's message
	// alone names it (otherwise a consumer learns it from an earlier event
	// or the pod's waiting state).
	PullCategory      string
	CategoryInMessage bool
	// BlockerKind and BlockerCause (eventpipev1.Blocker*): the event reports
	// what else keeps the pod from running (unschedulable, volume, creation
	// refused, a container that dies); CauseInMessage says whether this
	// message alone names the cause (a crash back-off does not: the pod
	// status's last termination does). See blockers.go.
	BlockerKind, BlockerCause string
	CauseInMessage            bool
}

// Target names the object an Event is about.
type Target int

// Event targets.
const (
	TargetWorkloadPod Target = iota
	TargetSupervisorPod
	TargetSandbox
	TargetPVC
)

type stepKind int

const (
	stepNamespace stepKind = iota
	stepCR
	stepWorkloadPod
	stepSupervisorPod
	stepPVC
	stepPodStatus
	stepCRStatus
	stepEvent
	stepRepeat
	stepDelete
)

// objKey identifies an object the scenario creates.
type objKey struct {
	kind      string // Namespace, Sandbox, Pod, PersistentVolumeClaim
	namespace string
	name      string
}

func (k objKey) String() string { return k.kind + " " + k.namespace + "/" + k.name }

type step struct {
	kind   stepKind
	at     time.Duration
	sb     Sandbox
	target Target
	// stepPodStatus
	status func(*corev1.PodStatus)
	// stepCRStatus
	conditions []Condition
	// stepEvent / stepRepeat
	event *eventSpec
	// stepDelete
	obj objKey
}

func (s step) describe() string {
	switch s.kind {
	case stepNamespace:
		return "create namespace " + s.sb.Namespace()
	case stepCR:
		return "create sandbox " + s.sb.Namespace() + "/" + s.sb.CRName()
	case stepWorkloadPod:
		return "create pod " + s.sb.Namespace() + "/" + s.sb.PodName()
	case stepSupervisorPod:
		return "create pod " + s.sb.Namespace() + "/" + s.sb.SupervisorPodName()
	case stepPVC:
		return "create pvc " + s.sb.Namespace() + "/" + s.sb.PVCName()
	case stepPodStatus:
		return "update status of pod " + s.sb.Namespace() + "/" + targetName(s.sb, s.target)
	case stepCRStatus:
		return "update status of sandbox " + s.sb.Namespace() + "/" + s.sb.CRName()
	case stepEvent:
		return fmt.Sprintf("create %s event %s %s", s.event.api, s.event.reason, s.event.key)
	case stepRepeat:
		return fmt.Sprintf("repeat %s event %s %s", s.event.api, s.event.reason, s.event.key)
	case stepDelete:
		return "delete " + s.obj.String()
	}
	return "unknown step"
}

// Condition is one status condition written to a Sandbox CR.
type Condition struct {
	Type, Status, Reason, Message string
}

// eventSpec is one Event a scenario writes (its repeats update it).
type eventSpec struct {
	key       string
	api       API
	sb        Sandbox
	target    Target
	container string
	init      bool
	typ       string // Normal, Warning
	reason    string
	message   string // may contain $(UID): the involved object's UID
	component string // kubelet, default-scheduler, agent-sandbox-controller
	action    string // events.k8s.io only
	expect    Expectation
}

// Scenario is a named, ordered list of steps with the expected conclusion
// for every Event it writes.
type Scenario struct {
	Name        string
	Description string
	// Sandboxes are the sandboxes the scenario plays, in creation order.
	Sandboxes []Sandbox
	steps     []step
	events    []*eventSpec
}

// Steps returns one line per step, for logs and docs.
func (s *Scenario) Steps() []string {
	out := make([]string, len(s.steps))
	for i, st := range s.steps {
		out[i] = fmt.Sprintf("+%v %s", st.at, st.describe())
	}
	return out
}

// EventCount is the number of distinct Event objects the scenario writes.
func (s *Scenario) EventCount() int { return len(s.events) }

// Duration is the virtual time the scenario spans.
func (s *Scenario) Duration() time.Duration {
	var d time.Duration
	for _, st := range s.steps {
		d = max(d, st.at)
	}
	return d
}

// Builder assembles a Scenario. Steps happen at the current virtual offset
// (At / After move it); builders never fail, Build does the checking.
type Builder struct {
	sc   *Scenario
	now  time.Duration
	keys map[string]*eventSpec
	errs []string
	seq  int
}

// NewBuilder starts a scenario.
func NewBuilder(name, description string) *Builder {
	return &Builder{sc: &Scenario{Name: name, Description: description}, keys: map[string]*eventSpec{}}
}

// At sets the virtual offset of the following steps.
func (b *Builder) At(d time.Duration) *Builder { b.now = d; return b }

// After advances the virtual offset by d.
func (b *Builder) After(d time.Duration) *Builder { b.now += d; return b }

func (b *Builder) add(s step) { s.at = b.now; b.sc.steps = append(b.sc.steps, s) }

// Namespace creates the sandbox's namespace (no error if it exists).
func (b *Builder) Namespace(sb Sandbox) *Builder { b.add(step{kind: stepNamespace, sb: sb}); return b }

// SandboxCR creates the Sandbox CR.
func (b *Builder) SandboxCR(sb Sandbox) *Builder {
	b.sc.Sandboxes = append(b.sc.Sandboxes, sb)
	b.add(step{kind: stepCR, sb: sb})
	return b
}

// WorkloadPod creates the workload pod (after the CR: it needs its UID).
func (b *Builder) WorkloadPod(sb Sandbox) *Builder {
	b.add(step{kind: stepWorkloadPod, sb: sb})
	return b
}

// SupervisorPod creates the supervisor pod (newer generation).
func (b *Builder) SupervisorPod(sb Sandbox) *Builder {
	b.add(step{kind: stepSupervisorPod, sb: sb})
	return b
}

// PVC creates the workspace claim.
func (b *Builder) PVC(sb Sandbox) *Builder { b.add(step{kind: stepPVC, sb: sb}); return b }

// PodStatus replaces a pod's status with what fill writes into a fresh
// PodStatus (through the status subresource, as the kubelet does).
func (b *Builder) PodStatus(sb Sandbox, target Target, fill func(*corev1.PodStatus)) *Builder {
	if target != TargetWorkloadPod && target != TargetSupervisorPod {
		b.errs = append(b.errs, "PodStatus needs a pod target")
	}
	b.add(step{kind: stepPodStatus, sb: sb, target: target, status: fill})
	return b
}

// SandboxConditions replaces the CR's status.conditions.
func (b *Builder) SandboxConditions(sb Sandbox, conds ...Condition) *Builder {
	b.add(step{kind: stepCRStatus, sb: sb, conditions: conds})
	return b
}

// Delete deletes the target object of sb.
func (b *Builder) Delete(sb Sandbox, target Target) *Builder {
	b.add(step{kind: stepDelete, sb: sb, obj: keyOf(sb, target)})
	return b
}

func keyOf(sb Sandbox, t Target) objKey {
	switch t {
	case TargetSandbox:
		return objKey{"Sandbox", sb.Namespace(), sb.CRName()}
	case TargetPVC:
		return objKey{"PersistentVolumeClaim", sb.Namespace(), sb.PVCName()}
	default:
		return objKey{"Pod", sb.Namespace(), targetName(sb, t)}
	}
}

func targetName(sb Sandbox, t Target) string {
	switch t {
	case TargetSupervisorPod:
		return sb.SupervisorPodName()
	case TargetSandbox:
		return sb.CRName()
	case TargetPVC:
		return sb.PVCName()
	default:
		return sb.PodName()
	}
}

// EventOpt adjusts the expectation of an event being built.
type EventOpt func(*eventSpec)

// PullFailed marks the event as a pull failure of the given cause;
// inMessage says whether its message names the cause.
func PullFailed(category string, inMessage bool) EventOpt {
	return func(e *eventSpec) {
		e.expect.PullFailure = true
		e.expect.PullCategory = category
		e.expect.CategoryInMessage = inMessage
	}
}

// NamesImage records the image reference the message names.
func NamesImage(image string) EventOpt { return func(e *eventSpec) { e.expect.Image = image } }

// Kubelet writes a core/v1 Event as the kubelet on sb.Node does (source
// kubelet/<node>, fieldPath for container when set). It returns the event's
// key for Repeat.
func (b *Builder) Kubelet(sb Sandbox, target Target, container, typ, reason, message string, opts ...EventOpt) string {
	return b.event(CoreV1, KubeletComponent, "", sb, target, container, typ, reason, message, opts)
}

// PVController writes a core/v1 Event about the sandbox's PVC as
// kube-controller-manager's persistentvolume-controller does.
func (b *Builder) PVController(sb Sandbox, typ, reason, message string, opts ...EventOpt) string {
	return b.event(CoreV1, PVControllerCmp, "", sb, TargetPVC, "", typ, reason, message, opts)
}

// Scheduler writes an events.k8s.io/v1 Event as default-scheduler does.
func (b *Builder) Scheduler(sb Sandbox, target Target, typ, reason, action, note string, opts ...EventOpt) string {
	return b.event(EventsV1, SchedulerComponent, action, sb, target, "", typ, reason, note, opts)
}

// Controller writes an events.k8s.io/v1 Event as the Agent Sandbox
// controller does (about the CR unless target says otherwise).
func (b *Builder) Controller(sb Sandbox, target Target, typ, reason, action, note string, opts ...EventOpt) string {
	return b.event(EventsV1, SandboxControllerCmp, action, sb, target, "", typ, reason, note, opts)
}

// Repeat records another occurrence of the event key: core/v1 count+1 and
// lastTimestamp, events.k8s.io series.count and series.lastObservedTime.
func (b *Builder) Repeat(key string) *Builder {
	e, ok := b.keys[key]
	if !ok {
		b.errs = append(b.errs, "Repeat of unknown event "+key)
		return b
	}
	b.add(step{kind: stepRepeat, event: e, sb: e.sb, target: e.target})
	return b
}

// RepeatEvery repeats key n times, every interval, doubling the interval
// each time when backoff is set (the kubelet's image back-off).
func (b *Builder) RepeatEvery(key string, n int, interval time.Duration, backoff bool) *Builder {
	for range n {
		b.After(interval)
		b.Repeat(key)
		if backoff {
			interval *= 2
		}
	}
	return b
}

func (b *Builder) event(api API, component, action string, sb Sandbox, target Target, container, typ, reason, message string, opts []EventOpt) string {
	b.seq++
	key := fmt.Sprintf("%s/%s/%s/%d", sb.Namespace(), targetName(sb, target), reason, b.seq)
	e := &eventSpec{key: key, api: api, sb: sb, target: target, container: container, typ: typ,
		reason: reason, message: message, component: component, action: action}
	if container != "" {
		e.init = isInit(sb, target, container)
	}
	e.expect = baseExpectation(sb, target, container)
	for _, o := range opts {
		o(e)
	}
	b.keys[key] = e
	b.sc.events = append(b.sc.events, e)
	b.add(step{kind: stepEvent, event: e, sb: sb, target: target})
	return key
}

func isInit(sb Sandbox, t Target, container string) bool {
	if t != TargetWorkloadPod {
		return false
	}
	for _, c := range sb.InitContainers() {
		if c.Name == container {
			return true
		}
	}
	return false
}

// baseExpectation is the attribution part of an Expectation.
func baseExpectation(sb Sandbox, t Target, container string) Expectation {
	e := Expectation{SandboxID: sb.ID, SandboxName: sb.Name, Workspace: sb.Workspace, Container: container}
	switch t {
	case TargetWorkloadPod:
		e.Role = eventpipev1.RoleWorkload
		e.Attribution = eventpipev1.AttributionPodAnnotation
	case TargetSupervisorPod:
		e.Role = eventpipev1.RoleSupervisor
		e.Attribution = eventpipev1.AttributionPodAnnotation
	case TargetSandbox:
		e.Role = eventpipev1.RoleSandbox
		e.Attribution = eventpipev1.AttributionSandboxAnnotation
	case TargetPVC:
		e.Role = eventpipev1.RoleVolume
		e.Attribution = eventpipev1.AttributionPVCOwner
	}
	if container != "" {
		e.ImageRole = imageRole(container)
	}
	return e
}

func imageRole(container string) string {
	switch container {
	case ContainerAgent, ContainerWorkspaceInit:
		return eventpipev1.ImageRoleWorkload
	case ContainerSupervisor, ContainerSupervisorInstall:
		return eventpipev1.ImageRoleSupervisor
	case ContainerSandboxBootstrap:
		return eventpipev1.ImageRoleBootstrap
	}
	return eventpipev1.ImageRoleUnknown
}

// Build checks and returns the scenario.
func (b *Builder) Build() (*Scenario, error) {
	if len(b.errs) > 0 {
		return nil, fmt.Errorf("scenario %s: %s", b.sc.Name, strings.Join(b.errs, "; "))
	}
	return b.sc, nil
}

func fieldPath(container string, init bool) string {
	if container == "" {
		return ""
	}
	if init {
		return "spec.initContainers{" + container + "}"
	}
	return "spec.containers{" + container + "}"
}

func typesUID(s string) types.UID { return types.UID(s) }

// EventInfo describes one Event a scenario writes, as built (before Play
// names it). Message may contain $(UID), replaced at play time by the
// involved object's UID.
type EventInfo struct {
	Key       string
	API       API
	Type      string
	Reason    string
	Message   string
	Component string
	Container string
	Init      bool
	Target    Target
	Sandbox   Sandbox
	Expect    Expectation
}

// Events lists the Events the scenario writes, in creation order.
func (s *Scenario) Events() []EventInfo {
	out := make([]EventInfo, len(s.events))
	for i, e := range s.events {
		out[i] = EventInfo{Key: e.key, API: e.api, Type: e.typ, Reason: e.reason, Message: e.message,
			Component: e.component, Container: e.container, Init: e.init, Target: e.target, Sandbox: e.sb, Expect: e.expect}
	}
	return out
}

// FieldPath is the involvedObject.fieldPath the event carries.
func (e EventInfo) FieldPath() string { return fieldPath(e.Container, e.Init) }
