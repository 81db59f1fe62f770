package kwire

import (
	"github.com/eventpipe/eventpipe/enrich"
)

// MetaOptions say which metadata a decoded cache object keeps and how its
// repeated strings are shared. A nil *MetaOptions keeps no labels or
// annotations and interns nothing.
type MetaOptions struct {
	// KeepPrefixes: only labels and annotations whose key starts with one of
	// these are kept; the maps stay nil when nothing is kept.
	KeepPrefixes []string
	// Intern returns a shared copy of a string that repeats across objects
	// (namespaces, label keys, images, container names, owner kinds and
	// apiVersions, phases, node names, waiting and terminated reasons). It
	// must not retain b. nil = a plain copy.
	Intern func(b []byte) string
	// InternSmall is Intern for label and annotation values (the agent
	// interns only short ones: ids are unique). nil = Intern.
	InternSmall func(b []byte) string
}

func (o *MetaOptions) intern(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if o != nil && o.Intern != nil {
		return o.Intern(b)
	}
	return string(b)
}

func (o *MetaOptions) internSmall(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if o != nil && o.InternSmall != nil {
		return o.InternSmall(b)
	}
	return o.intern(b)
}

func (o *MetaOptions) keep(key []byte) bool {
	if o == nil {
		return false
	}
	for _, p := range o.KeepPrefixes {
		if len(key) >= len(p) && string(key[:len(p)]) == p {
			return true
		}
	}
	return false
}

// decodeMeta merges an ObjectMeta message into m (a repeated metadata field
// merges, as in the generated Unmarshal).
func decodeMeta(b []byte, m *enrich.Meta, o *MetaOptions) error {
	// Kept labels and annotations are gathered on the stack and copied once,
	// at their exact size, into m (enrich.Pairs: no map per object).
	var lbuf, abuf [8]enrich.Pair
	labels := append(lbuf[:0], m.Labels...)
	ann := append(abuf[:0], m.Annotations...)
	f := newFields(b)
	for f.next() {
		var err error
		switch f.num {
		case 1, 3, 5, 6:
			var v []byte
			if v, err = f.bytesField(); err != nil {
				break
			}
			switch f.num {
			case 1:
				m.Name = string(v)
			case 3:
				m.Namespace = o.intern(v)
			case 5:
				m.UID = string(v)
			case 6:
				m.ResourceVersion = string(v)
			}
		case 11, 12:
			var v, k, val []byte
			if v, err = f.bytesField(); err == nil {
				k, val, err = mapEntry(v)
			}
			if err != nil {
				if f.num == 11 {
					return at(err, "labels")
				}
				return at(err, "annotations")
			}
			if !o.keep(k) {
				continue
			}
			if f.num == 11 {
				labels = setPair(labels, o.intern(k), o.internSmall(val))
			} else {
				ann = setPair(ann, o.intern(k), o.internSmall(val))
			}
		case 13:
			var v []byte
			if v, err = f.bytesField(); err == nil {
				err = decodeOwner(v, m, o)
			}
			if err != nil {
				return atIndex(err, "ownerReferences", len(m.Owners))
			}
		}
		if err != nil {
			return err
		}
	}
	if f.err != nil {
		return f.err
	}
	m.Labels, m.Annotations = finishPairs(labels), finishPairs(ann)
	return nil
}

func decodeOwner(b []byte, m *enrich.Meta, o *MetaOptions) error {
	var r enrich.Owner
	f := newFields(b)
	for f.next() {
		switch f.num {
		case 1, 3, 4, 5:
			v, err := f.bytesField()
			if err != nil {
				return err
			}
			switch f.num {
			case 1:
				r.Kind = o.intern(v)
			case 3:
				r.Name = string(v)
			case 4:
				r.UID = string(v)
			case 5:
				r.APIVersion = o.intern(v)
			}
		case 6:
			v, err := f.varintField()
			if err != nil {
				return err
			}
			r.Controller = v != 0
		}
	}
	if f.err != nil {
		return f.err
	}
	m.Owners = append(m.Owners, r)
	return nil
}

// decodeMetaOnly decodes the metadata of an object whose other fields are
// not read (PVC, Namespace).
func decodeMetaOnly(raw []byte, m *enrich.Meta, o *MetaOptions, kind string) error {
	f := newFields(raw)
	for f.next() {
		if f.num != 1 {
			continue
		}
		v, err := f.bytesField()
		if err == nil {
			err = decodeMeta(v, m, o)
		}
		if err != nil {
			return at(err, kind+".metadata")
		}
	}
	if f.err != nil {
		return at(f.err, kind)
	}
	return nil
}

// DecodePVC decodes a core/v1 PersistentVolumeClaim message into what
// enrich reads (its metadata).
func DecodePVC(raw []byte, o *MetaOptions) (*enrich.PVC, error) {
	p := &enrich.PVC{}
	if err := decodeMetaOnly(raw, &p.Meta, o, "PersistentVolumeClaim"); err != nil {
		return nil, err
	}
	return p, nil
}

// DecodeNamespace decodes a core/v1 Namespace message into what enrich
// reads (its metadata).
func DecodeNamespace(raw []byte, o *MetaOptions) (*enrich.Namespace, error) {
	n := &enrich.Namespace{}
	if err := decodeMetaOnly(raw, &n.Meta, o, "Namespace"); err != nil {
		return nil, err
	}
	return n, nil
}

// Field numbers in core/v1 PodSpec and PodStatus.
const (
	specContainers     = 2
	specNodeName       = 10
	specPullSecrets    = 15
	specInitContainers = 20
	statusPhase        = 1
	statusContainers   = 8
	statusInit         = 10
)

// DecodePod decodes a core/v1 Pod message into what enrich reads: metadata,
// node, phase, and the init containers then the containers (spec order)
// with image and whether a readiness or startup probe is set and, from the
// status of the same name, restart count, ready, started, waiting
// reason/message and the terminated reason (else the last state's).
// waiting reports whether some container waits with a non-empty reason, or
// is terminated other than Completed with exit code 0 (the pod wants a
// pod-status diagnosis).
func DecodePod(raw []byte, o *MetaOptions) (p *enrich.Pod, waiting bool, err error) {
	p = &enrich.Pod{}
	// spec and status may each occur more than once (they merge); their
	// slices are kept to be walked after the metadata.
	var specBuf, statusBuf [2][]byte
	specs, statuses := specBuf[:0], statusBuf[:0]
	f := newFields(raw)
	for f.next() {
		switch f.num {
		case 1:
			v, err := f.bytesField()
			if err == nil {
				err = decodeMeta(v, &p.Meta, o)
			}
			if err != nil {
				return nil, false, at(err, "Pod.metadata")
			}
		case 2, 3:
			v, err := f.bytesField()
			if err != nil {
				return nil, false, at(err, "Pod")
			}
			if f.num == 2 {
				specs = append(specs, v)
			} else {
				statuses = append(statuses, v)
			}
		}
	}
	if f.err != nil {
		return nil, false, at(f.err, "Pod")
	}

	// Spec: node name and how many containers, then the containers.
	nInit, nCont := 0, 0
	for _, s := range specs {
		g := newFields(s)
		for g.next() {
			switch g.num {
			case specNodeName:
				v, err := g.bytesField()
				if err != nil {
					return nil, false, at(err, "Pod.spec.nodeName")
				}
				p.NodeName = o.intern(v)
			case specPullSecrets:
				v, err := g.bytesField()
				if err == nil {
					err = decodeSecretRef(v, p, o)
				}
				if err != nil {
					return nil, false, at(err, "Pod.spec.imagePullSecrets")
				}
			case specContainers, specInitContainers:
				if g.typ != wireBytes {
					return nil, false, at(wrongType(&g), "Pod.spec")
				}
				if g.num == specInitContainers {
					nInit++
				} else {
					nCont++
				}
			}
		}
		if g.err != nil {
			return nil, false, at(g.err, "Pod.spec")
		}
	}
	p.Containers = make([]enrich.Container, 0, nInit+nCont)
	for _, init := range [2]bool{true, false} {
		num, name := int32(specContainers), "Pod.spec.containers"
		if init {
			num, name = specInitContainers, "Pod.spec.initContainers"
		}
		i := 0
		for _, s := range specs {
			g := newFields(s) // checked above
			for g.next() {
				if g.num != num {
					continue
				}
				ct := enrich.Container{Init: init}
				if err := decodeContainer(g.val, &ct, o); err != nil {
					return nil, false, atIndex(err, name, i)
				}
				p.Containers = append(p.Containers, ct)
				i++
			}
		}
	}

	// Status: phase, then each container's state from the statuses of its
	// name (init containers from initContainerStatuses).
	for _, s := range statuses {
		g := newFields(s)
		for g.next() {
			switch g.num {
			case statusPhase:
				v, err := g.bytesField()
				if err != nil {
					return nil, false, at(err, "Pod.status.phase")
				}
				p.Phase = o.intern(v)
			case statusContainers, statusInit:
				if g.typ != wireBytes {
					return nil, false, at(wrongType(&g), "Pod.status")
				}
			}
		}
		if g.err != nil {
			return nil, false, at(g.err, "Pod.status")
		}
	}
	if len(statuses) == 0 {
		return p, false, nil
	}
	for ci := range p.Containers {
		ct := &p.Containers[ci]
		num, name := int32(statusContainers), "Pod.status.containerStatuses"
		if ct.Init {
			num, name = statusInit, "Pod.status.initContainerStatuses"
		}
		j := 0
		for _, s := range statuses {
			g := newFields(s) // checked above
			for g.next() {
				if g.num != num {
					continue
				}
				w, err := applyStatus(g.val, ct, o)
				if err != nil {
					return nil, false, atIndex(err, name, j)
				}
				waiting = waiting || w
				j++
			}
		}
	}
	return p, waiting, nil
}

// decodeSecretRef appends the name of one LocalObjectReference of
// spec.imagePullSecrets to p.PullSecrets (an empty name names nothing).
func decodeSecretRef(b []byte, p *enrich.Pod, o *MetaOptions) error {
	f := newFields(b)
	for f.next() {
		if f.num != 1 {
			continue
		}
		v, err := f.bytesField()
		if err != nil {
			return err
		}
		if len(v) > 0 {
			p.PullSecrets = append(p.PullSecrets, o.internSmall(v))
		}
	}
	return f.err
}

// Container fields besides name (1) and image (2): the probes whose
// presence Container.Probed records.
const (
	containerReadinessProbe = 11
	containerStartupProbe   = 22
)

func decodeContainer(b []byte, ct *enrich.Container, o *MetaOptions) error {
	f := newFields(b)
	for f.next() {
		switch f.num {
		case containerReadinessProbe, containerStartupProbe:
			if _, err := f.bytesField(); err != nil {
				return err
			}
			ct.Probed = true
		case 1, 2:
			v, err := f.bytesField()
			if err != nil {
				return err
			}
			if f.num == 1 {
				ct.Name = o.intern(v)
			} else {
				ct.Image = o.intern(v)
			}
		}
	}
	return f.err
}

// containerStatus is what DecodePod reads of a ContainerStatus, as
// sub-slices of the message. set* tell a present (possibly empty) state
// from an absent one, like the generated code's nil pointers.
type containerStatus struct {
	restartCount                     int32
	ready, started                   bool
	setWaiting, setTerm, setLastTerm bool
	waitReason, waitMsg, termReason  []byte
	lastTermReason                   []byte
	termExit, lastTermExit           int32
}

// statusName returns the name of a ContainerStatus message (last wins).
func statusName(b []byte) ([]byte, error) {
	var name []byte
	f := newFields(b)
	for f.next() {
		if f.num == 1 {
			v, err := f.bytesField()
			if err != nil {
				return nil, at(err, "name")
			}
			name = v
		}
	}
	return name, f.err
}

// applyStatus applies a ContainerStatus to ct when its name is ct's, as
// the agent's transform did; it reports whether ct waits with a reason or
// ended badly (a current termination other than Completed with code 0).
func applyStatus(b []byte, ct *enrich.Container, o *MetaOptions) (bool, error) {
	name, err := statusName(b)
	if err != nil {
		return false, err
	}
	if string(name) != ct.Name {
		return false, nil
	}
	var st containerStatus
	f := newFields(b)
	for f.next() {
		switch f.num {
		case 2, 3:
			v, err := f.bytesField()
			if err == nil {
				err = decodeState(v, &st, f.num == 3)
			}
			if err != nil {
				if f.num == 2 {
					return false, at(err, "state")
				}
				return false, at(err, "lastState")
			}
		case 5:
			v, err := f.varintField()
			if err != nil {
				return false, at(err, "restartCount")
			}
			st.restartCount = int32(v)
		case 4, 9:
			v, err := f.varintField()
			if err != nil {
				if f.num == 4 {
					return false, at(err, "ready")
				}
				return false, at(err, "started")
			}
			if f.num == 4 {
				st.ready = v != 0
			} else {
				st.started = v != 0
			}
		}
	}
	if f.err != nil {
		return false, f.err
	}
	ct.RestartCount = st.restartCount
	ct.Ready, ct.Started = st.ready, st.started
	waiting := false
	if st.setWaiting {
		ct.WaitingReason, ct.WaitingMessage = o.intern(st.waitReason), string(st.waitMsg)
		waiting = len(st.waitReason) > 0
	}
	// Terminated reasons are a handful of values (Completed, Error,
	// OOMKilled, ...): shared copies.
	// The exit code is that same termination's.
	if st.setTerm {
		ct.TerminatedReason, ct.TerminatedExitCode = o.intern(st.termReason), st.termExit
		ct.Terminated = true
		// A container that ended badly and waits for nothing (restartPolicy
		// Never, a failed init container) needs the diagnosis as much as a
		// waiting one; Completed with exit code 0 does not.
		waiting = waiting || st.termExit != 0 || len(st.termReason) > 0 && string(st.termReason) != "Completed"
	} else if st.setLastTerm {
		ct.TerminatedReason, ct.TerminatedExitCode, ct.Terminated = o.intern(st.lastTermReason), st.lastTermExit, false
	}
	return waiting, nil
}

// decodeState merges a ContainerState message into st: waiting (1) and
// terminated (3) of state, or only terminated of lastState.
func decodeState(b []byte, st *containerStatus, last bool) error {
	f := newFields(b)
	for f.next() {
		switch f.num {
		case 1:
			v, err := f.bytesField()
			if err != nil {
				return at(err, "waiting")
			}
			if last {
				continue
			}
			st.setWaiting = true
			g := newFields(v)
			for g.next() {
				if g.num == 1 || g.num == 2 {
					w, err := g.bytesField()
					if err != nil {
						return at(err, "waiting")
					}
					if g.num == 1 {
						st.waitReason = w
					} else {
						st.waitMsg = w
					}
				}
			}
			if g.err != nil {
				return at(g.err, "waiting")
			}
		case 3:
			v, err := f.bytesField()
			if err != nil {
				return at(err, "terminated")
			}
			var reason []byte
			var exit int32
			hasReason := false
			g := newFields(v)
			for g.next() {
				switch g.num {
				case 1: // exitCode (int32: negative codes are 10-byte varints)
					x, err := g.varintField()
					if err != nil {
						return at(err, "terminated.exitCode")
					}
					exit = int32(x)
				case 3:
					if reason, err = g.bytesField(); err != nil {
						return at(err, "terminated")
					}
					hasReason = true
				}
			}
			if g.err != nil {
				return at(g.err, "terminated")
			}
			if last {
				st.setLastTerm, st.lastTermExit = true, exit
				if hasReason {
					st.lastTermReason = reason
				}
			} else {
				st.setTerm, st.termExit = true, exit
				if hasReason {
					st.termReason = reason
				}
			}
		}
	}
	return f.err
}

// setPair sets key to value in p: a repeated key keeps the last value, as a
// protobuf map (and a JSON object decoded into a map) does.
func setPair(p []enrich.Pair, key, value string) []enrich.Pair {
	for i := range p {
		if p[i].Key == key {
			p[i].Value = value
			return p
		}
	}
	return append(p, enrich.Pair{Key: key, Value: value})
}

// finishPairs copies p at its exact size, sorted by key (the API server
// already sends map keys sorted; the sort is for other encoders), nil when
// empty.
func finishPairs(p []enrich.Pair) enrich.Pairs {
	if len(p) == 0 {
		return nil
	}
	for i := 1; i < len(p); i++ { // insertion sort: a few entries, usually sorted
		for j := i; j > 0 && p[j].Key < p[j-1].Key; j-- {
			p[j], p[j-1] = p[j-1], p[j]
		}
	}
	return append(enrich.Pairs(nil), p...)
}
