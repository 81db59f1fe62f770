package kwire

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/eventpipe/eventpipe/enrich"
)

// The reference path: what the agent did before kwire (agent/watch.go
// toEnrichEvent/fingerprint and agent/caches.go transform/keep/enrichMeta/
// stripSandbox at commit 2972f26), copied here so the equivalence tests keep
// comparing against it while agent/ is rewritten. Interning is left out: it
// changes which copy of a string is used, never its value.

func refEvent(e *corev1.Event) *Event {
	out := &enrich.Event{
		APIVersion: "v1", Namespace: e.Namespace, Name: e.Name, UID: string(e.UID), ResourceVersion: e.ResourceVersion,
		Involved: enrich.ObjectRef{
			Kind: e.InvolvedObject.Kind, APIVersion: e.InvolvedObject.APIVersion, Namespace: e.InvolvedObject.Namespace,
			Name: e.InvolvedObject.Name, UID: string(e.InvolvedObject.UID), FieldPath: e.InvolvedObject.FieldPath,
		},
		Type: e.Type, Reason: e.Reason, Message: e.Message, Action: e.Action, Count: e.Count,
		FirstTimestamp: e.FirstTimestamp.Time, LastTimestamp: e.LastTimestamp.Time, EventTime: e.EventTime.Time,
		ReportingComponent: e.Source.Component, ReportingInstance: e.Source.Host,
	}
	if e.Series != nil {
		out.Count = e.Series.Count
		out.SeriesLastObserved = e.Series.LastObservedTime.Time
	}
	if out.ReportingComponent == "" {
		out.ReportingComponent = e.ReportingController
	}
	if out.ReportingInstance == "" {
		out.ReportingInstance = e.ReportingInstance
	}
	sc := int32(-1)
	if e.Series != nil {
		sc = e.Series.Count
	}
	return &Event{Event: *out, Count: e.Count, SeriesCount: sc}
}

type refConv struct {
	keepPrefixes []string
	podNameAnn   string
}

func (c refConv) pod(o *corev1.Pod) (*enrich.Pod, bool) {
	m := c.enrichMeta(&o.ObjectMeta)
	p := &enrich.Pod{Meta: m, NodeName: o.Spec.NodeName, Phase: string(o.Status.Phase)}
	for _, ref := range o.Spec.ImagePullSecrets {
		if ref.Name != "" {
			p.PullSecrets = append(p.PullSecrets, ref.Name)
		}
	}
	p.Containers = make([]enrich.Container, 0, len(o.Spec.InitContainers)+len(o.Spec.Containers))
	waiting := false
	add := func(specs []corev1.Container, statuses []corev1.ContainerStatus, init bool) {
		for i := range specs {
			// Probed, Ready and Started were added after that commit.
			ct := enrich.Container{Name: specs[i].Name, Image: specs[i].Image, Init: init,
				Probed: specs[i].ReadinessProbe != nil || specs[i].StartupProbe != nil}
			for j := range statuses {
				st := &statuses[j]
				if st.Name != ct.Name {
					continue
				}
				ct.RestartCount = st.RestartCount
				ct.Ready, ct.Started = st.Ready, st.Started != nil && *st.Started
				if w := st.State.Waiting; w != nil {
					ct.WaitingReason, ct.WaitingMessage = w.Reason, w.Message
					waiting = waiting || w.Reason != ""
				}
				if t := st.State.Terminated; t != nil {
					ct.TerminatedReason, ct.TerminatedExitCode, ct.Terminated = t.Reason, t.ExitCode, true
					waiting = waiting || t.ExitCode != 0 || t.Reason != "" && t.Reason != "Completed"
				} else if t := st.LastTerminationState.Terminated; t != nil {
					ct.TerminatedReason, ct.TerminatedExitCode, ct.Terminated = t.Reason, t.ExitCode, false
				}
			}
			p.Containers = append(p.Containers, ct)
		}
	}
	add(o.Spec.InitContainers, o.Status.InitContainerStatuses, true)
	add(o.Spec.Containers, o.Status.ContainerStatuses, false)
	return p, waiting
}

func (c refConv) keep(m map[string]string) map[string]string {
	var out map[string]string
	for k, v := range m {
		for _, p := range c.keepPrefixes {
			if strings.HasPrefix(k, p) {
				if out == nil {
					out = make(map[string]string, 4)
				}
				out[k] = v
				break
			}
		}
	}
	return out
}

func (c refConv) enrichMeta(m *metav1.ObjectMeta) enrich.Meta {
	out := enrich.Meta{
		Namespace: m.Namespace, Name: m.Name, UID: string(m.UID), ResourceVersion: m.ResourceVersion,
		Labels: enrich.PairsOf(c.keep(m.Labels)), Annotations: enrich.PairsOf(c.keep(m.Annotations)),
	}
	if len(m.OwnerReferences) > 0 {
		out.Owners = make([]enrich.Owner, len(m.OwnerReferences))
		for i, r := range m.OwnerReferences {
			out.Owners[i] = enrich.Owner{APIVersion: r.APIVersion, Kind: r.Kind, Name: r.Name, UID: string(r.UID), Controller: r.Controller != nil && *r.Controller}
		}
	}
	return out
}

func (c refConv) sandbox(u *unstructured.Unstructured) *enrich.Sandbox {
	m := enrich.Meta{
		Namespace: u.GetNamespace(), Name: u.GetName(), UID: string(u.GetUID()), ResourceVersion: u.GetResourceVersion(),
		Labels: enrich.PairsOf(c.keep(u.GetLabels())), Annotations: enrich.PairsOf(c.keep(u.GetAnnotations())),
	}
	for _, r := range u.GetOwnerReferences() {
		m.Owners = append(m.Owners, enrich.Owner{APIVersion: r.APIVersion, Kind: r.Kind, Name: r.Name, UID: string(r.UID), Controller: r.Controller != nil && *r.Controller})
	}
	s := &enrich.Sandbox{Meta: m, APIVersion: u.GetAPIVersion(), PodName: u.GetName()}
	if v := u.GetAnnotations()[c.podNameAnn]; v != "" {
		s.PodName = v
	}
	if conds, ok, _ := unstructured.NestedSlice(u.Object, "status", "conditions"); ok {
		for _, ci := range conds {
			if cm, ok := ci.(map[string]any); ok {
				str := func(k string) string { v, _ := cm[k].(string); return v }
				s.Conditions = append(s.Conditions, enrich.Condition{Type: str("type"), Status: str("status"), Reason: str("reason"), Message: str("message")})
			}
		}
	}
	return s
}
