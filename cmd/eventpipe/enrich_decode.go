//go:build !agentonly

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/eventpipe/eventpipe/enrich"
)

// snapshot is everything `eventpipe enrich` read from its input.
type snapshot struct {
	events     []*enrich.Event
	pods       map[string]*enrich.Pod // "ns/name"
	pvcs       map[string]*enrich.PVC
	namespaces map[string]*enrich.Namespace
	sandboxes  map[string]*enrich.Sandbox
	sandboxUID map[string]*enrich.Sandbox
	ignored    int
}

func newSnapshot() *snapshot {
	return &snapshot{
		pods:       map[string]*enrich.Pod{},
		pvcs:       map[string]*enrich.PVC{},
		namespaces: map[string]*enrich.Namespace{},
		sandboxes:  map[string]*enrich.Sandbox{},
		sandboxUID: map[string]*enrich.Sandbox{},
	}
}

// The snapshot is its own read-only Lookups.
func (s *snapshot) Pod(ns, name string) (*enrich.Pod, bool) {
	p, ok := s.pods[ns+"/"+name]
	return p, ok
}
func (s *snapshot) PVC(ns, name string) (*enrich.PVC, bool) {
	p, ok := s.pvcs[ns+"/"+name]
	return p, ok
}
func (s *snapshot) Namespace(name string) (*enrich.Namespace, bool) {
	n, ok := s.namespaces[name]
	return n, ok
}
func (s *snapshot) Sandbox(ns, name string) (*enrich.Sandbox, bool) {
	c, ok := s.sandboxes[ns+"/"+name]
	return c, ok
}
func (s *snapshot) SandboxByUID(uid string) (*enrich.Sandbox, bool) {
	c, ok := s.sandboxUID[uid]
	return c, ok
}

func (s *snapshot) lookups() enrich.Lookups {
	return enrich.Lookups{Pods: s, PVCs: s, Namespaces: s, Sandboxes: s}
}

// inputError names what was wrong with the input and where.
type inputError struct {
	where string
	err   error
}

func (e *inputError) Error() string { return e.where + ": " + e.err.Error() }
func (e *inputError) Unwrap() error { return e.err }

// maxListDepth bounds List nesting (a List item that is itself a List).
const maxListDepth = 4

// decodeInput reads a kubectl List or a stream of concatenated JSON objects.
// Objects of kinds it does not use are counted in ignored.
func decodeInput(r io.Reader) (*snapshot, error) {
	s := newSnapshot()
	dec := json.NewDecoder(r)
	for index := 0; ; index++ {
		start := dec.InputOffset()
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return s, nil
		}
		if err != nil {
			where := fmt.Sprintf("object %d (starting at byte offset %d)", index, start)
			var se *json.SyntaxError
			if errors.As(err, &se) {
				where = fmt.Sprintf("object %d (syntax error at byte offset %d)", index, se.Offset)
			} else if errors.Is(err, io.ErrUnexpectedEOF) {
				where = fmt.Sprintf("object %d (starting at byte offset %d, truncated)", index, start)
			}
			return nil, &inputError{where: where, err: err}
		}
		if err := s.add(raw, fmt.Sprintf("object %d (byte offset %d)", index, start), 0); err != nil {
			return nil, err
		}
	}
}

type typeMeta struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Items      []json.RawMessage `json:"items"`
}

func (s *snapshot) add(raw json.RawMessage, where string, depth int) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return &inputError{where: where, err: errors.New("not a JSON object")}
	}
	var tm typeMeta
	if err := json.Unmarshal(raw, &tm); err != nil {
		return &inputError{where: where, err: err}
	}
	if tm.Kind == "" {
		return &inputError{where: where, err: errors.New("missing kind")}
	}
	where = fmt.Sprintf("%s, kind %s", where, tm.Kind)
	group, _, _ := strings.Cut(tm.APIVersion, "/")
	if !strings.Contains(tm.APIVersion, "/") {
		group = ""
	}
	var err error
	switch {
	case tm.Kind == "List" || strings.HasSuffix(tm.Kind, "List"):
		if depth >= maxListDepth {
			return &inputError{where: where, err: fmt.Errorf("lists nested deeper than %d", maxListDepth)}
		}
		for i, item := range tm.Items {
			if err := s.add(item, fmt.Sprintf("%s, item %d", where, i), depth+1); err != nil {
				return err
			}
		}
		return nil
	case tm.Kind == "Event" && (group == "" || group == "events.k8s.io"):
		err = s.addEvent(raw, tm.APIVersion)
	case tm.Kind == "Pod" && group == "":
		err = s.addPod(raw)
	case tm.Kind == "PersistentVolumeClaim" && group == "":
		err = s.addPVC(raw)
	case tm.Kind == "Namespace" && group == "":
		err = s.addNamespace(raw)
	case tm.Kind == "Sandbox" && group == "agents.x-k8s.io":
		err = s.addSandbox(raw, tm.APIVersion)
	default:
		s.ignored++
		return nil
	}
	if err != nil {
		return &inputError{where: where, err: err}
	}
	return nil
}

// kubeTime accepts RFC 3339 (with or without fractional seconds), null and "".
type kubeTime struct{ time.Time }

func (t *kubeTime) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("time: %w", err)
	}
	if s == "" {
		return nil
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return fmt.Errorf("time %q: %w", s, err)
	}
	t.Time = v
	return nil
}

type ownerRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
	Controller *bool  `json:"controller"`
}

type objectMeta struct {
	Namespace         string            `json:"namespace"`
	Name              string            `json:"name"`
	UID               string            `json:"uid"`
	ResourceVersion   string            `json:"resourceVersion"`
	Labels            map[string]string `json:"labels"`
	Annotations       map[string]string `json:"annotations"`
	OwnerReferences   []ownerRef        `json:"ownerReferences"`
	DeletionTimestamp kubeTime          `json:"deletionTimestamp"`
}

func (m objectMeta) meta() enrich.Meta {
	out := enrich.Meta{
		Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Labels: enrich.PairsOf(m.Labels), Annotations: enrich.PairsOf(m.Annotations), DeletedAt: m.DeletionTimestamp.Time,
	}
	for _, o := range m.OwnerReferences {
		out.Owners = append(out.Owners, enrich.Owner{
			APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, UID: o.UID,
			Controller: o.Controller != nil && *o.Controller,
		})
	}
	return out
}

type objectRef struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
	FieldPath  string `json:"fieldPath"`
}

func (r *objectRef) ref() enrich.ObjectRef {
	if r == nil {
		return enrich.ObjectRef{}
	}
	return enrich.ObjectRef{Kind: r.Kind, APIVersion: r.APIVersion, Namespace: r.Namespace, Name: r.Name, UID: r.UID, FieldPath: r.FieldPath}
}

// kubeEvent covers core/v1 and events.k8s.io/v1 Events.
type kubeEvent struct {
	Metadata objectMeta `json:"metadata"`
	// core/v1
	InvolvedObject *objectRef `json:"involvedObject"`
	Message        string     `json:"message"`
	Count          int32      `json:"count"`
	FirstTimestamp kubeTime   `json:"firstTimestamp"`
	LastTimestamp  kubeTime   `json:"lastTimestamp"`
	Source         struct {
		Component string `json:"component"`
		Host      string `json:"host"`
	} `json:"source"`
	ReportingComponent string `json:"reportingComponent"`
	// events.k8s.io/v1
	Regarding                *objectRef `json:"regarding"`
	Note                     string     `json:"note"`
	DeprecatedCount          int32      `json:"deprecatedCount"`
	DeprecatedFirstTimestamp kubeTime   `json:"deprecatedFirstTimestamp"`
	DeprecatedLastTimestamp  kubeTime   `json:"deprecatedLastTimestamp"`
	DeprecatedSource         struct {
		Component string `json:"component"`
		Host      string `json:"host"`
	} `json:"deprecatedSource"`
	ReportingController string `json:"reportingController"`
	// both
	Type              string   `json:"type"`
	Reason            string   `json:"reason"`
	Action            string   `json:"action"`
	EventTime         kubeTime `json:"eventTime"`
	ReportingInstance string   `json:"reportingInstance"`
	Series            *struct {
		Count            int32    `json:"count"`
		LastObservedTime kubeTime `json:"lastObservedTime"`
	} `json:"series"`
}

func (s *snapshot) addEvent(raw json.RawMessage, apiVersion string) error {
	var k kubeEvent
	if err := json.Unmarshal(raw, &k); err != nil {
		return err
	}
	ev := &enrich.Event{
		APIVersion:      apiVersion,
		Namespace:       k.Metadata.Namespace,
		Name:            k.Metadata.Name,
		UID:             k.Metadata.UID,
		ResourceVersion: k.Metadata.ResourceVersion,
		Type:            k.Type,
		Reason:          k.Reason,
		Action:          k.Action,
		EventTime:       k.EventTime.Time,
	}
	if apiVersion == "v1" || !strings.Contains(apiVersion, "/") {
		ev.Involved = k.InvolvedObject.ref()
		ev.Message = k.Message
		ev.Count = k.Count
		ev.FirstTimestamp, ev.LastTimestamp = k.FirstTimestamp.Time, k.LastTimestamp.Time
		ev.ReportingComponent = firstNonEmpty(k.Source.Component, k.ReportingComponent)
		ev.ReportingInstance = firstNonEmpty(k.Source.Host, k.ReportingInstance)
	} else {
		ev.Involved = k.Regarding.ref()
		ev.Message = k.Note
		ev.Count = k.DeprecatedCount
		ev.FirstTimestamp, ev.LastTimestamp = k.DeprecatedFirstTimestamp.Time, k.DeprecatedLastTimestamp.Time
		ev.ReportingComponent = firstNonEmpty(k.ReportingController, k.DeprecatedSource.Component)
		ev.ReportingInstance = firstNonEmpty(k.ReportingInstance, k.DeprecatedSource.Host)
	}
	if k.Series != nil {
		if k.Series.Count > 0 {
			ev.Count = k.Series.Count
		}
		ev.SeriesLastObserved = k.Series.LastObservedTime.Time
	}
	s.events = append(s.events, ev)
	return nil
}

type containerSpec struct {
	Name  string `json:"name"`
	Image string `json:"image"`
	// Only whether they are set (enrich.Container.Probed).
	ReadinessProbe json.RawMessage `json:"readinessProbe"`
	StartupProbe   json.RawMessage `json:"startupProbe"`
}

type containerStatus struct {
	Name  string `json:"name"`
	State struct {
		Waiting *struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"waiting"`
		Terminated *terminatedState `json:"terminated"`
	} `json:"state"`
	LastState struct {
		Terminated *terminatedState `json:"terminated"`
	} `json:"lastState"`
	RestartCount int32 `json:"restartCount"`
	Ready        bool  `json:"ready"`
	Started      *bool `json:"started"`
}

// terminatedState is a container's ContainerStateTerminated.
type terminatedState struct {
	Reason   string `json:"reason"`
	ExitCode int32  `json:"exitCode"`
}

type kubePod struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		NodeName       string          `json:"nodeName"`
		InitContainers []containerSpec `json:"initContainers"`
		Containers     []containerSpec `json:"containers"`
	} `json:"spec"`
	Status struct {
		Phase                 string            `json:"phase"`
		InitContainerStatuses []containerStatus `json:"initContainerStatuses"`
		ContainerStatuses     []containerStatus `json:"containerStatuses"`
	} `json:"status"`
}

func (s *snapshot) addPod(raw json.RawMessage) error {
	var k kubePod
	if err := json.Unmarshal(raw, &k); err != nil {
		return err
	}
	p := &enrich.Pod{Meta: k.Metadata.meta(), NodeName: k.Spec.NodeName, Phase: k.Status.Phase}
	add := func(specs []containerSpec, statuses []containerStatus, init bool) {
		for _, c := range specs {
			ct := enrich.Container{Name: c.Name, Image: c.Image, Init: init,
				Probed: isSet(c.ReadinessProbe) || isSet(c.StartupProbe)}
			for _, st := range statuses {
				if st.Name != c.Name {
					continue
				}
				if w := st.State.Waiting; w != nil {
					ct.WaitingReason, ct.WaitingMessage = w.Reason, w.Message
				}
				// The current termination, else the last one (as the agent).
				if t := st.State.Terminated; t != nil {
					ct.TerminatedReason, ct.TerminatedExitCode, ct.Terminated = t.Reason, t.ExitCode, true
				} else if t := st.LastState.Terminated; t != nil {
					ct.TerminatedReason, ct.TerminatedExitCode = t.Reason, t.ExitCode
				}
				ct.RestartCount = st.RestartCount
				ct.Ready, ct.Started = st.Ready, st.Started != nil && *st.Started
			}
			p.Containers = append(p.Containers, ct)
		}
	}
	add(k.Spec.InitContainers, k.Status.InitContainerStatuses, true)
	add(k.Spec.Containers, k.Status.ContainerStatuses, false)
	s.pods[p.Namespace+"/"+p.Name] = p
	return nil
}

// isSet reports whether a JSON field was present with a value (not null).
func isSet(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

func (s *snapshot) addPVC(raw json.RawMessage) error {
	var k struct {
		Metadata objectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &k); err != nil {
		return err
	}
	p := &enrich.PVC{Meta: k.Metadata.meta()}
	s.pvcs[p.Namespace+"/"+p.Name] = p
	return nil
}

func (s *snapshot) addNamespace(raw json.RawMessage) error {
	var k struct {
		Metadata objectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &k); err != nil {
		return err
	}
	n := &enrich.Namespace{Meta: k.Metadata.meta()}
	s.namespaces[n.Name] = n
	return nil
}

func (s *snapshot) addSandbox(raw json.RawMessage, apiVersion string) error {
	var k struct {
		Metadata objectMeta `json:"metadata"`
		Status   struct {
			Conditions []struct {
				Type    string `json:"type"`
				Status  string `json:"status"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(raw, &k); err != nil {
		return err
	}
	sb := &enrich.Sandbox{Meta: k.Metadata.meta(), APIVersion: apiVersion}
	sb.PodName = firstNonEmpty(k.Metadata.Annotations["agents.x-k8s.io/pod-name"], k.Metadata.Name)
	for _, c := range k.Status.Conditions {
		sb.Conditions = append(sb.Conditions, enrich.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message})
	}
	key := sb.Namespace + "/" + sb.Name
	// v1beta1 is preferred when both versions list the same CR.
	if old, ok := s.sandboxes[key]; ok && strings.HasSuffix(old.APIVersion, "/v1beta1") && !strings.HasSuffix(apiVersion, "/v1beta1") {
		return nil
	}
	s.sandboxes[key] = sb
	if sb.UID != "" {
		s.sandboxUID[sb.UID] = sb
	}
	return nil
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}
