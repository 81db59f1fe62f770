package scenario

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/eventpipe/eventpipe/testenv/crds"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

// Clients are what Play writes through (an admin identity: it creates
// namespaces, CRs, pods, status and Events).
type Clients struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
}

// NewClients builds Clients from a rest.Config.
func NewClients(cfg *rest.Config) (Clients, error) {
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("kubernetes client: %w", err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("dynamic client: %w", err)
	}
	return Clients{Kube: kc, Dynamic: dc}, nil
}

// Options tune Play.
type Options struct {
	// Pace is a real-time pause between steps (0: as fast as possible).
	Pace time.Duration
	// Now is the clock (default time.Now); the scenario's last step is
	// stamped Now() at the start of Play.
	Now func() time.Time
	// Limiter, when set, is waited on before every Event write (create or
	// repeat): the load generator's rate control.
	Limiter interface{ Wait(context.Context) error }
}

// PlayedEvent is one Event object as Play left it.
type PlayedEvent struct {
	Key             string
	API             API
	Namespace       string
	Name            string
	UID             string
	ResourceVersion string // after the last repeat
	Reason          string
	Message         string
	// Count is the number of occurrences written (1 + repeats).
	Count int32
	// InvolvedUID is the involved object's UID ("" when the object did not
	// exist yet when the event was written).
	InvolvedUID string
	Expect      Expectation
}

// Result is what Play wrote.
type Result struct {
	Events []PlayedEvent
	// UIDs of the objects created, keyed "Kind namespace/name".
	UIDs map[string]string
}

// Event returns the played event with the given key.
func (r *Result) Event(key string) (PlayedEvent, bool) {
	for _, e := range r.Events {
		if e.Key == key {
			return e, true
		}
	}
	return PlayedEvent{}, false
}

// Play writes the scenario into the cluster.
func Play(ctx context.Context, c Clients, s *Scenario) (*Result, error) {
	return PlayWith(ctx, c, s, Options{})
}

type player struct {
	c       Clients
	limiter interface{ Wait(context.Context) error }
	base    time.Time
	uids    map[objKey]string
	core    map[string]*corev1.Event
	ev1     map[string]*eventsv1.Event
	counts  map[string]int32
	played  map[string]*PlayedEvent
	order   []string
	stepIdx int
}

// PlayWith is Play with options.
func PlayWith(ctx context.Context, c Clients, s *Scenario, o Options) (*Result, error) {
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	p := &player{c: c, limiter: o.Limiter, base: now().Add(-s.Duration()), uids: map[objKey]string{},
		core: map[string]*corev1.Event{}, ev1: map[string]*eventsv1.Event{},
		counts: map[string]int32{}, played: map[string]*PlayedEvent{}}
	for i, st := range s.steps {
		p.stepIdx = i
		if err := p.step(ctx, st); err != nil {
			return nil, fmt.Errorf("scenario %s step %d (%s): %w", s.Name, i, st.describe(), err)
		}
		if o.Pace > 0 && i < len(s.steps)-1 {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("scenario %s: %w", s.Name, ctx.Err())
			case <-time.After(o.Pace):
			}
		}
	}
	res := &Result{UIDs: map[string]string{}}
	for k, v := range p.uids {
		res.UIDs[k.String()] = v
	}
	for _, k := range p.order {
		res.Events = append(res.Events, *p.played[k])
	}
	return res, nil
}

func sandboxGVR(apiVersion string) schema.GroupVersionResource {
	if apiVersion == SandboxAPIVersionV1alpha1 {
		return crds.SandboxV1alpha1
	}
	return crds.SandboxV1beta1
}

func (p *player) step(ctx context.Context, st step) error {
	sb := st.sb
	ns := sb.Namespace()
	switch st.kind {
	case stepNamespace:
		obj, err := p.c.Kube.CoreV1().Namespaces().Create(ctx, sb.NamespaceObject(), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			obj, err = p.c.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		}
		if err != nil {
			return err
		}
		p.uids[objKey{"Namespace", "", ns}] = string(obj.UID)
	case stepCR:
		obj, err := p.c.Dynamic.Resource(sandboxGVR(sb.crAPIVersion())).Namespace(ns).Create(ctx, sb.CR(), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		p.uids[keyOf(sb, TargetSandbox)] = string(obj.GetUID())
	case stepWorkloadPod, stepSupervisorPod:
		crUID, ok := p.uids[keyOf(sb, TargetSandbox)]
		if !ok {
			return fmt.Errorf("the Sandbox CR %s must be created first", sb.CRName())
		}
		pod, target := sb.WorkloadPod(crUID), TargetWorkloadPod
		if st.kind == stepSupervisorPod {
			pod, target = sb.SupervisorPod(crUID), TargetSupervisorPod
		}
		obj, err := createPod(ctx, p.c.Kube, pod)
		if err != nil {
			return err
		}
		p.uids[keyOf(sb, target)] = string(obj.UID)
	case stepPVC:
		crUID, ok := p.uids[keyOf(sb, TargetSandbox)]
		if !ok {
			return fmt.Errorf("the Sandbox CR %s must be created first", sb.CRName())
		}
		obj, err := p.c.Kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, sb.PVC(crUID), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		p.uids[keyOf(sb, TargetPVC)] = string(obj.UID)
	case stepPodStatus:
		name := targetName(sb, st.target)
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pod, err := p.c.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			var status corev1.PodStatus
			st.status(&status)
			fillPodStatus(&status, pod, p.at(st.at))
			pod.Status = status
			_, err = p.c.Kube.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
			return err
		})
	case stepCRStatus:
		rc := p.c.Dynamic.Resource(sandboxGVR(sb.crAPIVersion())).Namespace(ns)
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cr, err := rc.Get(ctx, sb.CRName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds := make([]any, 0, len(st.conditions))
			ts := p.at(st.at).UTC().Format(time.RFC3339)
			for _, c := range st.conditions {
				conds = append(conds, map[string]any{
					"type": c.Type, "status": c.Status, "reason": c.Reason, "message": c.Message,
					"lastTransitionTime": ts, "observedGeneration": cr.GetGeneration(),
				})
			}
			if err := unstructured.SetNestedSlice(cr.Object, conds, "status", "conditions"); err != nil {
				return err
			}
			_, err = rc.UpdateStatus(ctx, cr, metav1.UpdateOptions{})
			return err
		})
	case stepEvent, stepRepeat:
		if p.limiter != nil {
			if err := p.limiter.Wait(ctx); err != nil {
				return fmt.Errorf("rate limiter: %w", err)
			}
		}
		if st.kind == stepEvent {
			return p.createEvent(ctx, st)
		}
		return p.repeatEvent(ctx, st)
	case stepDelete:
		return p.delete(ctx, st.obj, sb)
	}
	return nil
}

func (p *player) at(offset time.Duration) time.Time { return p.base.Add(offset) }

// fillPodStatus completes a status written by a scenario: the scheduled
// condition, host IP and start time, as the kubelet always reports them.
func fillPodStatus(s *corev1.PodStatus, pod *corev1.Pod, at time.Time) {
	if s.Phase == "" {
		s.Phase = corev1.PodPending
	}
	// Messages that quote the pod's UID (crash-loop back-off) learn it now.
	for _, list := range [][]corev1.ContainerStatus{s.InitContainerStatuses, s.ContainerStatuses} {
		for i := range list {
			if w := list[i].State.Waiting; w != nil {
				w.Message = strings.ReplaceAll(w.Message, "$(UID)", string(pod.UID))
			}
		}
	}
	if pod.Spec.NodeName != "" {
		if s.HostIP == "" {
			s.HostIP = "172.18.0.2"
			s.HostIPs = []corev1.HostIP{{IP: s.HostIP}}
		}
		if s.StartTime == nil {
			t := metav1.NewTime(at.Add(-time.Second))
			s.StartTime = &t
		}
		if !hasCondition(s, corev1.PodScheduled) {
			s.Conditions = append(s.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue,
				LastTransitionTime: metav1.NewTime(at.Add(-time.Second))})
		}
	}
}

func hasCondition(s *corev1.PodStatus, t corev1.PodConditionType) bool {
	for _, c := range s.Conditions {
		if c.Type == t {
			return true
		}
	}
	return false
}

func (p *player) involved(e *eventSpec) corev1.ObjectReference {
	sb := e.sb
	ref := corev1.ObjectReference{Namespace: sb.Namespace(), Name: targetName(sb, e.target), FieldPath: fieldPath(e.container, e.init)}
	switch e.target {
	case TargetSandbox:
		ref.Kind, ref.APIVersion = "Sandbox", sb.crAPIVersion()
	case TargetPVC:
		ref.Kind, ref.APIVersion = "PersistentVolumeClaim", "v1"
	default:
		ref.Kind, ref.APIVersion = "Pod", "v1"
	}
	ref.UID = typesUID(p.uids[keyOf(sb, e.target)])
	return ref
}

func (p *player) createEvent(ctx context.Context, st step) error {
	e := st.event
	ts := p.at(st.at)
	ref := p.involved(e)
	msg := strings.ReplaceAll(e.message, "$(UID)", string(ref.UID))
	// client-go's recorders: <object name>.<hex UnixNano>; the step index
	// keeps two events of one object at one virtual instant apart.
	name := fmt.Sprintf("%s.%x", ref.Name, ts.UnixNano()+int64(p.stepIdx))
	ns := e.sb.Namespace()
	pe := &PlayedEvent{Key: e.key, API: e.api, Namespace: ns, Name: name, Reason: e.reason, Message: msg,
		Count: 1, InvolvedUID: string(ref.UID), Expect: e.expect}
	switch e.api {
	case CoreV1:
		ev := &corev1.Event{
			ObjectMeta:          metav1.ObjectMeta{Name: name, Namespace: ns},
			InvolvedObject:      ref,
			Reason:              e.reason,
			Message:             msg,
			Source:              corev1.EventSource{Component: e.component, Host: sourceHost(e)},
			FirstTimestamp:      metav1.NewTime(ts),
			LastTimestamp:       metav1.NewTime(ts),
			Count:               1,
			Type:                e.typ,
			ReportingController: e.component,
			ReportingInstance:   sourceHost(e),
		}
		out, err := p.c.Kube.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		p.core[e.key] = out
		pe.UID, pe.ResourceVersion = string(out.UID), out.ResourceVersion
	case EventsV1:
		ev := &eventsv1.Event{
			ObjectMeta:          metav1.ObjectMeta{Name: name, Namespace: ns},
			EventTime:           metav1.NewMicroTime(ts),
			ReportingController: e.component,
			ReportingInstance:   reportingInstance(e),
			Action:              e.action,
			Reason:              e.reason,
			Regarding:           ref,
			Note:                msg,
			Type:                e.typ,
		}
		out, err := p.c.Kube.EventsV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		p.ev1[e.key] = out
		pe.UID, pe.ResourceVersion = string(out.UID), out.ResourceVersion
	default:
		return fmt.Errorf("unknown event API %q", e.api)
	}
	p.played[e.key] = pe
	p.order = append(p.order, e.key)
	return nil
}

// sourceHost is source.host: the node for the kubelet, empty for the
// controller-manager's controllers.
func sourceHost(e *eventSpec) string {
	if e.component == KubeletComponent {
		return e.sb.Node
	}
	return ""
}

func reportingInstance(e *eventSpec) string {
	switch e.component {
	case SchedulerComponent:
		return SchedulerComponent + "-" + e.sb.Node
	case SandboxControllerCmp:
		return "agent-sandbox-controller-5d8f7c9b6-x2k4q"
	}
	return e.sb.Node
}

func (p *player) repeatEvent(ctx context.Context, st step) error {
	e := st.event
	pe, ok := p.played[e.key]
	if !ok {
		return fmt.Errorf("event %s repeated before it was written", e.key)
	}
	ts := p.at(st.at)
	ns := e.sb.Namespace()
	switch e.api {
	case CoreV1:
		cur := p.core[e.key].DeepCopy()
		cur.Count++
		cur.LastTimestamp = metav1.NewTime(ts)
		out, err := p.c.Kube.CoreV1().Events(ns).Update(ctx, cur, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		p.core[e.key] = out
		pe.Count, pe.ResourceVersion = out.Count, out.ResourceVersion
	case EventsV1:
		cur := p.ev1[e.key].DeepCopy()
		n := int32(2)
		if cur.Series != nil {
			n = cur.Series.Count + 1
		}
		cur.Series = &eventsv1.EventSeries{Count: n, LastObservedTime: metav1.NewMicroTime(ts)}
		out, err := p.c.Kube.EventsV1().Events(ns).Update(ctx, cur, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		p.ev1[e.key] = out
		pe.Count, pe.ResourceVersion = n, out.ResourceVersion
	}
	return nil
}

func (p *player) delete(ctx context.Context, k objKey, sb Sandbox) error {
	zero := int64(0)
	var err error
	switch k.kind {
	case "Pod":
		// No kubelet confirms graceful deletion here: remove at once.
		err = p.c.Kube.CoreV1().Pods(k.namespace).Delete(ctx, k.name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	case "Sandbox":
		err = p.c.Dynamic.Resource(sandboxGVR(sb.crAPIVersion())).Namespace(k.namespace).Delete(ctx, k.name, metav1.DeleteOptions{})
	case "PersistentVolumeClaim":
		pvcs := p.c.Kube.CoreV1().PersistentVolumeClaims(k.namespace)
		if err = pvcs.Delete(ctx, k.name, metav1.DeleteOptions{}); err == nil {
			// kubernetes.io/pvc-protection is removed by a controller that
			// does not run here.
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				pvc, gerr := pvcs.Get(ctx, k.name, metav1.GetOptions{})
				if apierrors.IsNotFound(gerr) {
					return nil
				}
				if gerr != nil {
					return gerr
				}
				pvc.Finalizers = nil
				_, uerr := pvcs.Update(ctx, pvc, metav1.UpdateOptions{})
				if apierrors.IsNotFound(uerr) {
					return nil
				}
				return uerr
			})
		}
	default:
		return fmt.Errorf("cannot delete kind %s", k.kind)
	}
	return err
}

// createPod creates pod, waiting out ServiceAccount admission (on when the
// cluster runs a controller-manager, as make dev-cluster's does): it
// refuses a pod of a new namespace until the service account controller
// made the namespace's default account, as kubectl users see too.
func createPod(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) (*corev1.Pod, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		obj, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "service account") || time.Now().After(deadline) {
			return obj, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
