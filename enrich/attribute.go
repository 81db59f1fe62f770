package enrich

import (
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// compiledRules is Rules prepared for lookups on the hot path.
type compiledRules struct {
	Rules
	imageRoles map[string]string // container name -> image role
	shared     map[string]bool
	// Maps as slices: ranging over a map on the hot path is slow.
	supervisorLabels, managedLabels [][2]string
}

func compileRules(r Rules) compiledRules {
	set := func(l []string) map[string]bool {
		m := make(map[string]bool, len(l))
		for _, s := range l {
			m[s] = true
		}
		return m
	}
	pairs := func(m map[string]string) [][2]string {
		out := make([][2]string, 0, len(m))
		for k, v := range m {
			out = append(out, [2]string{k, v})
		}
		return out
	}
	return compiledRules{
		supervisorLabels: pairs(r.SupervisorLabels),
		managedLabels:    pairs(r.ManagedNamespaceLabels),
		Rules:            r,
		imageRoles:       imageRoles(r),
		shared:           set(r.SharedNamespaces),
	}
}

// imageRoles maps container names to image roles; a name listed twice
// keeps its first role in the order workload, supervisor, bootstrap.
func imageRoles(r Rules) map[string]string {
	m := map[string]string{}
	for _, l := range []struct {
		names []string
		role  string
	}{
		{r.WorkloadImageContainers, eventpipev1.ImageRoleWorkload},
		{r.SupervisorImageContainers, eventpipev1.ImageRoleSupervisor},
		{r.BootstrapImageContainers, eventpipev1.ImageRoleBootstrap},
	} {
		for _, n := range l.names {
			if _, ok := m[n]; !ok {
				m[n] = l.role
			}
		}
	}
	return m
}

// eventImageRole is imageRole for the image an event names: the image of
// a FailedCreatePodSandBox event (no container) is the pod sandbox
// ("pause") image, which no container of the pod runs.
func (r *compiledRules) eventImageRole(reason, container string, pod *Pod) string {
	if container == "" && reason == "FailedCreatePodSandBox" {
		return eventpipev1.ImageRolePodSandbox
	}
	return r.imageRole(container, pod)
}

// imageRole says which image a container runs. pod may be nil.
func (r *compiledRules) imageRole(container string, pod *Pod) string {
	if container == "" {
		return eventpipev1.ImageRoleUnknown
	}
	if role, ok := r.imageRoles[container]; ok {
		return role
	}
	if pod != nil {
		if c := findContainer(pod, container); c != nil && c.Init {
			return eventpipev1.ImageRoleInit
		}
	}
	return eventpipev1.ImageRoleUnknown
}

// attribution is what attribute found.
type attribution struct {
	rule    string
	role    string
	sandbox *eventpipev1.Sandbox // dst once filled in, else nil
	dst     *eventpipev1.Sandbox // where describe writes (caller-owned)
	pod     *Pod                 // the involved pod, when cached
	missing bool
}

// attribute ties an involved object to its sandbox, applying the rules in
// docs/design.md order and recording the one that matched.
// dst receives the Sandbox part (it is part of the caller's allocation).
func (e *Enricher) attribute(ref *ObjectRef, eventNS string, dst *eventpipev1.Sandbox) attribution {
	a := attribution{rule: eventpipev1.AttributionNone, role: eventpipev1.RoleNone, dst: dst}
	ns := ref.Namespace
	if ns == "" {
		ns = eventNS
	}
	switch ref.Kind {
	case e.rules.SandboxKind:
		if !e.isSandboxAPI(ref.APIVersion) {
			return a
		}
		e.attributeSandbox(&a, ns, ref)
	case "Pod":
		if ref.APIVersion != "" && ref.APIVersion != "v1" {
			return a
		}
		e.attributePod(&a, ns, ref.Name, ref.UID)
	case "PersistentVolumeClaim":
		if ref.APIVersion != "" && ref.APIVersion != "v1" {
			return a
		}
		e.attributePVC(&a, ns, ref.Name, ref.UID)
	}
	return a
}

func (e *Enricher) isSandboxAPI(apiVersion string) bool {
	if apiVersion == "" {
		return true
	}
	group, _, ok := strings.Cut(apiVersion, "/")
	return ok && group == e.rules.SandboxGroup
}

func (e *Enricher) attributeSandbox(a *attribution, ns string, ref *ObjectRef) {
	cr := e.sandboxCR(ns, ref.Name)
	if cr != nil && !sameUID(cr.UID, ref.UID) {
		// A CR of that name, but another one: the sandbox was deleted and
		// created again under its name. The event is about the old one.
		cr = nil
	}
	if cr == nil && ref.UID != "" && e.lk.Sandboxes != nil {
		cr, _ = e.lk.Sandboxes.SandboxByUID(ref.UID)
	}
	if cr == nil {
		a.missing = true
		return
	}
	if id := firstKey(cr.Annotations, e.rules.SandboxIDKeys); id != "" {
		a.rule = eventpipev1.AttributionSandboxAnnotation
	} else if id := firstKey(cr.Labels, e.rules.SandboxIDKeys); id != "" {
		a.rule = eventpipev1.AttributionSandboxLabel
	} else {
		return
	}
	a.role = eventpipev1.RoleSandbox
	a.sandbox, a.missing = e.describe(a.dst, cr, nil, ns, "")
}

func (e *Enricher) attributePod(a *attribution, ns, name, uid string) {
	var pod *Pod
	if e.lk.Pods != nil {
		pod, _ = e.lk.Pods.Pod(ns, name)
	}
	// replaced: a pod of that name is cached, but not the one the event is
	// about (its uid differs): the old pod of a sandbox deleted and created
	// again under its name, or a newer pod not cached yet. Neither the
	// cached pod nor the name may attribute the event then, or an old
	// sandbox's events would land on its replacement.
	replaced := false
	if pod != nil && !sameUID(pod.UID, uid) {
		pod, replaced = e.podByUID(uid), true
	}
	a.pod = pod
	supervisor := e.isSupervisorPod(name, pod)
	var id, rule string
	var cr *Sandbox
	ownerMissing := false
	if pod != nil {
		if id = firstKey(pod.Annotations, e.rules.SandboxIDKeys); id != "" {
			rule = eventpipev1.AttributionPodAnnotation
		} else if id = firstKey(pod.Labels, e.rules.SandboxIDKeys); id != "" {
			rule = eventpipev1.AttributionPodLabel
		} else if id = firstKey(pod.Labels, e.rules.BoundaryPairLabels); id != "" {
			rule = eventpipev1.AttributionBoundaryPair
		}
	}
	if rule == "" {
		if uuid, ok := e.supervisorUUID(name); ok {
			id, rule = uuid, eventpipev1.AttributionSupervisorName
			supervisor = true
		}
	}
	// The CR gives name, workspace and gateway; the owner chain also
	// attributes on its own.
	owned := false
	if pod != nil {
		cr, owned = e.ownerSandbox(ns, pod.Owners)
		if owned && cr == nil {
			ownerMissing = true
		}
		if rule == "" && cr != nil {
			rule = eventpipev1.AttributionOwnerChain
		}
	}
	// The name rule guesses: not for a pod whose owner is known to be
	// another CR (ownerSandbox matched none by uid), nor for a replaced one.
	if cr == nil && !supervisor && !owned && !replaced {
		// pod name == CR name (also works before the pod is cached).
		if c := e.sandboxCR(ns, name); c != nil && (c.PodName == "" || c.PodName == name) {
			cr = c
			if rule == "" {
				rule = eventpipev1.AttributionPodName
			}
		}
	}
	if rule == "" {
		a.missing = pod == nil || ownerMissing
		return
	}
	a.rule = rule
	a.role = eventpipev1.RoleWorkload
	if supervisor {
		a.role = eventpipev1.RoleSupervisor
	}
	var meta *Meta
	if pod != nil {
		meta = &pod.Meta
	}
	var nsMissing bool
	a.sandbox, nsMissing = e.describe(a.dst, cr, meta, ns, id)
	a.missing = pod == nil || ownerMissing || nsMissing
}

func (e *Enricher) attributePVC(a *attribution, ns, name, uid string) {
	var pvc *PVC
	if e.lk.PVCs != nil {
		pvc, _ = e.lk.PVCs.PVC(ns, name)
	}
	if pvc != nil && !sameUID(pvc.UID, uid) {
		// Another claim of that name (the workspace claim of a sandbox
		// created again under its name): neither it nor the name rule may
		// attribute the old claim's events.
		a.missing = true
		return
	}
	var cr *Sandbox
	rule := ""
	ownerMissing := false
	if pvc != nil {
		var owned bool
		cr, owned = e.ownerSandbox(ns, pvc.Owners)
		if cr != nil {
			rule = eventpipev1.AttributionPVCOwner
		} else if owned {
			ownerMissing = true
		}
	}
	// The name rule only for a claim no Sandbox owns: a claim whose owning
	// Sandbox is not cached yet (created again under its name, its CR not
	// seen) would otherwise go to the old CR of that name; it waits for its
	// owner instead (missing).
	if cr == nil && !ownerMissing && e.rules.PVCPrefix != "" && strings.HasPrefix(name, e.rules.PVCPrefix) {
		if c := e.sandboxCR(ns, strings.TrimPrefix(name, e.rules.PVCPrefix)); c != nil {
			cr, rule = c, eventpipev1.AttributionPVCName
		}
	}
	if cr == nil {
		a.missing = pvc == nil || ownerMissing
		return
	}
	var meta *Meta
	if pvc != nil {
		meta = &pvc.Meta
	}
	a.rule = rule
	a.role = eventpipev1.RoleVolume
	var nsMissing bool
	a.sandbox, nsMissing = e.describe(a.dst, cr, meta, ns, "")
	a.missing = nsMissing
}

// describe fills s, the Sandbox part, from the CR (may be nil), the involved
// object's metadata (may be nil) and an id found by a pod rule. missing is
// true when the workspace depends on a namespace that is not cached.
func (e *Enricher) describe(s *eventpipev1.Sandbox, cr *Sandbox, obj *Meta, ns, id string) (*eventpipev1.Sandbox, bool) {
	pick := func(keys []string) string {
		if cr != nil {
			if v := firstKey(cr.Annotations, keys); v != "" {
				return v
			}
			if v := firstKey(cr.Labels, keys); v != "" {
				return v
			}
		}
		if obj != nil {
			if v := firstKey(obj.Annotations, keys); v != "" {
				return v
			}
			if v := firstKey(obj.Labels, keys); v != "" {
				return v
			}
		}
		return ""
	}
	if id == "" || cr != nil {
		if v := pick(e.rules.SandboxIDKeys); v != "" {
			id = v
		}
	}
	s.Id = id
	if cr != nil && !cr.DeletedAt.IsZero() {
		// Attributed through a remembered CR: the sandbox is gone, and a
		// new one may have its name.
		s.DeletedAt = timestamppb.New(cr.DeletedAt)
	}
	s.Workspace = pick(e.rules.WorkspaceKeys)
	s.GatewayId = pick(e.rules.GatewayIDKeys)
	name := pick(e.rules.SandboxNameKeys)
	missing := false
	shared := e.rules.shared[ns]
	if cr != nil {
		s.CrNamespace, s.CrName = cr.Namespace, cr.Name
		if shared {
			if ws, n, ok := strings.Cut(cr.Name, e.rules.SharedSeparator); ok {
				if s.Workspace == "" {
					s.Workspace = ws
				}
				if name == "" {
					name = n
				}
			}
		}
		if name == "" {
			name = cr.Name
		}
	}
	if s.Workspace == "" || s.GatewayId == "" {
		var nsObj *Namespace
		if e.lk.Namespaces != nil && ns != "" {
			nsObj, _ = e.lk.Namespaces.Namespace(ns)
		}
		switch {
		case nsObj != nil && e.isManaged(nsObj):
			if s.Workspace == "" {
				s.Workspace = firstKey(nsObj.Labels, e.rules.WorkspaceKeys)
				if s.Workspace == "" {
					s.Workspace = firstKey(nsObj.Annotations, e.rules.WorkspaceKeys)
				}
			}
			if s.GatewayId == "" {
				s.GatewayId = firstKey(nsObj.Labels, e.rules.GatewayIDKeys)
			}
		case shared || s.Workspace != "":
			// Shared mode: the CR name prefix, handled above.
		case nsObj != nil:
			// Operator mode: the namespace is the workspace.
			s.Workspace = ns
		default:
			missing = s.Workspace == ""
		}
	}
	f := [...]string{s.Id, s.CrNamespace, s.CrName, name, s.Workspace, s.GatewayId}
	cleanFields(f[:])
	s.Id, s.CrNamespace, s.CrName, s.Name, s.Workspace, s.GatewayId = f[0], f[1], f[2], f[3], f[4], f[5]
	return s, missing
}

func (e *Enricher) isManaged(ns *Namespace) bool {
	if len(e.rules.managedLabels) == 0 {
		return false
	}
	for _, kv := range e.rules.managedLabels {
		if got, ok := ns.Labels.Lookup(kv[0]); !ok || got != kv[1] {
			return false
		}
	}
	return true
}

// sameUID reports whether a cached object's uid can be the one an event
// names: equal, or either unknown (an event written before its object had
// a uid, a file without uids).
func sameUID(cached, ref string) bool {
	return cached == "" || ref == "" || cached == ref
}

// podByUID finds a pod by uid when the Pods lookup can (PodUIDLookup: the
// agent remembers deleted pods by uid), else nil.
func (e *Enricher) podByUID(uid string) *Pod {
	if l, ok := e.lk.Pods.(PodUIDLookup); ok && uid != "" {
		if p, ok := l.PodByUID(uid); ok {
			return p
		}
	}
	return nil
}

// sandboxCR looks a CR up by namespace and name.
func (e *Enricher) sandboxCR(ns, name string) *Sandbox {
	if e.lk.Sandboxes == nil || name == "" {
		return nil
	}
	cr, ok := e.lk.Sandboxes.Sandbox(ns, name)
	if !ok {
		return nil
	}
	return cr
}

// ownerSandbox follows ownerReferences to a Sandbox CR (controller first,
// then any). owned reports whether any owner is a Sandbox, cached or not.
func (e *Enricher) ownerSandbox(ns string, owners []Owner) (cr *Sandbox, owned bool) {
	for pass := 0; pass < 2; pass++ {
		for i := range owners {
			o := &owners[i]
			if o.Controller != (pass == 0) || o.Kind != e.rules.SandboxKind || !e.isSandboxAPI(o.APIVersion) {
				continue
			}
			owned = true
			if o.UID != "" && e.lk.Sandboxes != nil {
				if c, ok := e.lk.Sandboxes.SandboxByUID(o.UID); ok {
					return c, true
				}
			}
			if c := e.sandboxCR(ns, o.Name); c != nil && (o.UID == "" || c.UID == "" || c.UID == o.UID) {
				return c, true
			}
		}
	}
	return nil, owned
}

// isSupervisorPod: supervisor labels, or the naming rule.
func (e *Enricher) isSupervisorPod(name string, pod *Pod) bool {
	// The name first: a prefix test is cheaper than the label lookups.
	if _, ok := e.supervisorUUID(name); ok {
		return true
	}
	if pod != nil && len(pod.Labels) > 0 {
		for _, kv := range e.rules.supervisorLabels {
			if kv[1] != "" && pod.Labels.Get(kv[0]) == kv[1] {
				return true
			}
		}
	}
	return false
}

// supervisorUUID applies the os-supervisor-<uuid> rule to a Pod name.
func (e *Enricher) supervisorUUID(name string) (string, bool) {
	p := e.rules.SupervisorPodPrefix
	if p == "" || !strings.HasPrefix(name, p) {
		return "", false
	}
	rest := name[len(p):]
	if !isUUID(rest) {
		return "", false
	}
	return rest, true
}

// isUUID: 8-4-4-4-12 hex digits.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}

func firstKey(m Pairs, keys []string) string {
	if len(m) == 0 {
		return ""
	}
	for _, k := range keys {
		if v := m.Get(k); v != "" {
			return v
		}
	}
	return ""
}

func findContainer(p *Pod, name string) *Container {
	for i := range p.Containers {
		if p.Containers[i].Name == name {
			return &p.Containers[i]
		}
	}
	return nil
}

// containerForImage finds the only container of p running image.
func containerForImage(p *Pod, image string) string {
	found := ""
	for i := range p.Containers {
		if p.Containers[i].Image == image {
			if found != "" && found != p.Containers[i].Name {
				return ""
			}
			found = p.Containers[i].Name
		}
	}
	return found
}
