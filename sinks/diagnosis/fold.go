package diagnosis

import (
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/api/remedy"
)

// States of a sandbox.
const (
	// StateBlocked: at least one blocker is active.
	StateBlocked = "blocked"
	// StateClear: events were seen and nothing blocks the sandbox now.
	StateClear = "clear"
	// StateDeleted: the agent saw the sandbox's CR deleted
	// (Occurrence.sandbox.deleted_at); its blockers are what they were
	// then. OpenShell may reuse the name for a new sandbox (a new id).
	StateDeleted = "deleted"
	// StateReplaced: no deletion was seen, but a newer sandbox (another id)
	// has the same name in the same workspace and gateway, which OpenShell
	// allows only once the old one is gone (the deletion was missed: the
	// agent was down, or the deletion fell out of the tail read).
	StateReplaced = "replaced"
)

// Kinds of blocker: KindImagePull for a pull failure; the other kinds are
// Occurrence.blocker's (eventpipe.v1 BlockerKind*: unschedulable, volume,
// create_refused, container).
const (
	KindImagePull = "image_pull"
)

// DefaultCrashSettle is how long a container must stay up after Started,
// with no later crash, before its crash-loop blocker ends.
const DefaultCrashSettle = time.Minute

// Blocker is one thing that keeps a sandbox from starting.
type Blocker struct {
	// Kind is KindImagePull or a blocker kind (eventpipe.v1 BlockerKind*).
	Kind string `json:"kind"`
	// Cause is the pull-failure category (eventpipe.v1 Category*) or the
	// blocker cause (eventpipe.v1 Blocker*).
	Cause string `json:"cause"`
	// DecidedBy and Confidence say how the cause was decided (text_rule,
	// cluster_context, registry) and how sure it is (certain, likely,
	// weak): the occurrence's pull_failure or blocker fields of the same
	// names.
	DecidedBy  string `json:"decided_by,omitempty"`
	Confidence string `json:"confidence,omitempty"`
	// Image and ImageRole: image pulls only.
	Image string `json:"image,omitempty"`
	// ImageRole says whose image it is: workload (the sandbox's own),
	// supervisor (the gateway's supervisor image), bootstrap, init, unknown.
	ImageRole string `json:"image_role,omitempty"`
	// Object is what the cause names for the other kinds ("Secret/x",
	// "StorageClass/fast", "ResourceQuota/compute", else the involved
	// object, "<Kind>/<name>").
	Object string `json:"object,omitempty"`
	// Involved is the involved object when it is not a pod ("<Kind>/<name>":
	// the claim of an unbound volume, the controller refused a pod).
	Involved string `json:"involved,omitempty"`
	// ExitCode is the container's last exit code from the pod status, when
	// known (container blockers only).
	ExitCode *int32 `json:"exit_code,omitempty"`
	// Role of the pod: workload or supervisor (the supervisor pod).
	Role      string `json:"role,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	Node      string `json:"node,omitempty"`
	// Disposition: retrying, or persistent (retrying will not fix it).
	Disposition string    `json:"disposition"`
	Attempts    uint32    `json:"attempts"`
	Since       time.Time `json:"since"`
	LastSeen    time.Time `json:"last_seen"`
	// Detail is the runtime's own words for the cause.
	Detail string `json:"detail,omitempty"`
	// Remedy is the next step (api/remedy; the occurrence's blocker.fix
	// for the other kinds).
	Remedy string `json:"remedy"`
	// EventID and Cursor name the latest occurrence behind the blocker.
	EventID string `json:"event_id"`
	Cursor  uint64 `json:"cursor"`
	// Verified is what the registry answered about the image when the
	// reader asked it (eventpipe diagnose --verify); Cause and Remedy are
	// then the registry's when its answer was conclusive.
	Verified *Verification `json:"verified,omitempty"`
}

// Verification is one registry answer about a blocker's image (package
// verify's Result, as a reader shows it).
type Verification struct {
	// Answer: exists, tag_not_found, repository_not_found, unauthorized,
	// denied, rate_limited, platform_missing (conclusive), or unreachable,
	// timeout, throttled, invalid_reference (the text diagnosis stands).
	Answer     string    `json:"answer"`
	DecidedBy  string    `json:"decided_by,omitempty"`
	Confidence string    `json:"confidence,omitempty"`
	Detail     string    `json:"detail"`
	Tags       []string  `json:"tags,omitempty"`
	Platforms  []string  `json:"platforms,omitempty"`
	Anonymous  bool      `json:"anonymous"`
	CheckedAt  time.Time `json:"checked_at"`
}

// LastEvent is the most recent occurrence of a sandbox, for context.
type LastEvent struct {
	Time      time.Time `json:"time"`
	Type      string    `json:"type"`
	Reason    string    `json:"reason"`
	Message   string    `json:"message"`
	Object    string    `json:"object"`
	Container string    `json:"container,omitempty"`
}

// Diagnosis is what the collector's occurrences say about one sandbox.
type Diagnosis struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Workspace string `json:"workspace"`
	GatewayID string `json:"gateway_id,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	// State is StateBlocked, StateClear, StateDeleted or StateReplaced.
	State string `json:"state"`
	// DeletedAt is when the agent saw the sandbox deleted (nil while it
	// exists, or when the deletion was not seen).
	DeletedAt *time.Time `json:"deleted_at,omitempty"`
	// ReplacedBy is the id of the sandbox that now has this one's name (in
	// the same workspace and gateway), when this one is older.
	ReplacedBy string `json:"replaced_by,omitempty"`
	// FirstSeen is the earliest time the folded occurrences name (their
	// occurred_at, a failure's first_seen): it orders the sandboxes that had
	// one name, oldest first.
	FirstSeen time.Time `json:"first_seen"`
	// Blockers, supervisor image first, then by stage (creation, claims,
	// scheduling, volume mounts, image pulls, containers), then by Since.
	Blockers []Blocker `json:"blockers"`
	// Progress is the last gateway progress step the events moved
	// ("pulling_image", "starting_sandbox", ...).
	Progress string `json:"progress,omitempty"`
	// Occurrences folded, and the cursor of the last one.
	Occurrences int        `json:"occurrences"`
	Cursor      uint64     `json:"cursor"`
	Last        *LastEvent `json:"last_event,omitempty"`
	// DroppedBlockers counts blockers not kept (over the per-sandbox bound).
	DroppedBlockers int `json:"dropped_blockers,omitempty"`
}

// Blocked reports whether anything blocks the sandbox. A deleted or
// replaced sandbox blocks nothing (its blockers are kept as they were).
func (d *Diagnosis) Blocked() bool { return d.State == StateBlocked }

// Live reports whether the sandbox is the one its name stands for now:
// neither seen deleted nor replaced by a newer sandbox of its name.
func (d *Diagnosis) Live() bool { return d.DeletedAt == nil && d.ReplacedBy == "" }

// DisplayName is the sandbox name, else its id.
func (d *Diagnosis) DisplayName() string {
	if d.Name != "" {
		return d.Name
	}
	return d.ID
}

// DefaultMaxSandboxes bounds a Folder (a gateway's worth of sandboxes).
const DefaultMaxSandboxes = 100_000

// maxBlockersPerSandbox: a sandbox has a handful of containers.
const maxBlockersPerSandbox = 32

// blockerKey: one blocker per kind, involved object and container. objKind
// is "Pod" for pulls and for pod-level blockers.
type blockerKey struct{ kind, namespace, objKind, pod, container string }

type sandboxState struct {
	d        Diagnosis
	blockers map[blockerKey]*Blocker
	// started: a crashing container's Started, not yet settled.
	started map[blockerKey]time.Time
	// pulled is when each container last got its image (the Pulled or later
	// event that closed its pull blocker): a failure not later than that,
	// to the second, is history, not a new blocker.
	pulled map[blockerKey]time.Time
	// ended is when each non-image blocker was last ended by an event
	// showing the pod got past it: a report of it observed no later than
	// that (a recurrence delivered late: the scheduler's series update of
	// a FailedScheduling after the pod's Started) is history, not a new
	// blocker.
	ended map[blockerKey]time.Time
}

// Folder folds occurrences into one Diagnosis per sandbox. Not safe for
// concurrent use (Watcher guards its own).
type Folder struct {
	// MaxSandboxes bounds the sandboxes kept (default DefaultMaxSandboxes;
	// 0: no bound, the caller bounds them with Forget).
	MaxSandboxes int
	// CrashSettle: a container that crashed ends its blocker once it has
	// been up this long after Started with no later crash (default
	// DefaultCrashSettle).
	CrashSettle time.Duration
	// Now is the clock the settling is judged by (default time.Now).
	Now       func() time.Time
	sandboxes map[string]*sandboxState
	dropped   int
	// droppedBlockers: blockers not kept over maxBlockersPerSandbox, summed
	// over every sandbox ever folded (Forget does not lower it).
	droppedBlockers int
	checks          map[string]SupervisorCheck // by gateway id
}

// NewFolder returns an empty Folder.
func NewFolder() *Folder {
	return &Folder{MaxSandboxes: DefaultMaxSandboxes, CrashSettle: DefaultCrashSettle, Now: time.Now, sandboxes: map[string]*sandboxState{}}
}

// Dropped is how many occurrences were not folded because the Folder held
// MaxSandboxes sandboxes already.
func (f *Folder) Dropped() int { return f.dropped }

// Len is the number of sandboxes seen.
func (f *Folder) Len() int { return len(f.sandboxes) }

// DroppedBlockers is how many blockers were not kept because their sandbox
// held maxBlockersPerSandbox already, over all sandboxes.
func (f *Folder) DroppedBlockers() int { return f.droppedBlockers }

// Forget drops everything folded about sandbox id: a reader that bounds its
// sandboxes itself (the gateway proxy) forgets a deleted or evicted one, and
// an occurrence of it folded later starts afresh.
func (f *Folder) Forget(id string) { delete(f.sandboxes, id) }

// Active returns the blockers of sandbox id that are active at now, in the
// order Diagnosis.Blockers lists them: a crash blocker whose container has
// stayed up CrashSettle since its Started is over, as the next read of
// Sandboxes would find. until is the earliest time one of them settles that
// way (zero when none can without another occurrence): the answer holds
// until then. It changes nothing, so readers may share a lock; cheap (one
// map lookup) for a sandbox without blockers.
func (f *Folder) Active(id string, now time.Time) (bs []Blocker, until time.Time) {
	s := f.sandboxes[id]
	if s == nil || len(s.blockers) == 0 || s.d.DeletedAt != nil {
		return nil, time.Time{}
	}
	settle := f.CrashSettle
	if settle <= 0 {
		settle = DefaultCrashSettle
	}
	bs = make([]Blocker, 0, len(s.blockers))
	for k, b := range s.blockers {
		if t, ok := s.started[k]; ok {
			end := t.Add(settle)
			if !now.Before(end) {
				continue
			}
			if until.IsZero() || end.Before(until) {
				until = end
			}
		}
		bs = append(bs, *b)
	}
	if len(bs) > 1 {
		sortBlockers(bs)
	}
	return bs, until
}

// Add folds one occurrence read at cursor. It reports whether what a reader
// is shown changed: a new sandbox, its progress step, or its blockers (one
// opened, closed, or a field of one changed).
func (f *Folder) Add(cursor uint64, o *eventpipev1.Occurrence) bool {
	sb := o.GetSandbox()
	if sb.GetId() == "" {
		if eventpipev1.IsSupervisorCheck(o) {
			return f.addCheck(o)
		}
		return false
	}
	s := f.sandboxes[sb.GetId()]
	isNew := false
	if s == nil {
		if len(f.sandboxes) >= f.MaxSandboxes && f.MaxSandboxes > 0 {
			f.dropped++
			return false
		}
		s = &sandboxState{d: Diagnosis{ID: sb.GetId(), State: StateClear}, blockers: map[blockerKey]*Blocker{}, started: map[blockerKey]time.Time{}, pulled: map[blockerKey]time.Time{}, ended: map[blockerKey]time.Time{}}
		f.sandboxes[sb.GetId()] = s
		isNew = true
	}
	d := &s.d
	// Names can arrive late (an event attributed before its CR was cached).
	setIf(&d.Name, sb.GetName())
	setIf(&d.Workspace, sb.GetWorkspace())
	setIf(&d.GatewayID, sb.GetGatewayId())
	setIf(&d.Namespace, sb.GetCrNamespace())
	if d.Namespace == "" {
		d.Namespace = o.GetInvolvedObject().GetNamespace()
	}
	d.Occurrences++
	d.Cursor = max(d.Cursor, cursor)
	at := o.GetOccurredAt().AsTime()
	d.FirstSeen = earliest(d.FirstSeen, at, o.GetPullFailure().GetFirstSeen(), o.GetBlocker().GetFirstSeen())
	deleted := false
	if t := sb.GetDeletedAt(); t != nil && d.DeletedAt == nil {
		// Every later occurrence of it is history: nothing it says reaches
		// another sandbox (a replacement has another id).
		da := t.AsTime()
		d.DeletedAt, deleted = &da, true
	}
	if d.Last == nil || !at.Before(d.Last.Time) {
		obj := o.GetInvolvedObject()
		d.Last = &LastEvent{Time: at, Type: o.GetType(), Reason: o.GetReason(), Message: o.GetMessage(),
			Object: strings.ToLower(obj.GetKind()) + "/" + obj.GetName(), Container: o.GetContainer()}
	}
	progress := d.Progress
	if p := o.GetProgress(); p != nil {
		switch {
		case p.GetActiveStep() != "":
			d.Progress = p.GetActiveStep()
		case p.GetCompleteStep() != "":
			d.Progress = p.GetCompleteStep() + " done"
		}
	}

	obj := o.GetInvolvedObject()
	key := blockerKey{KindImagePull, obj.GetNamespace(), "Pod", obj.GetName(), o.GetContainer()}
	changed := false
	dropped := s.d.DroppedBlockers
	defer func() { f.droppedBlockers += s.d.DroppedBlockers - dropped }()
	switch {
	case o.GetPullFailure() != nil:
		changed = s.openPull(key, cursor, o, o.GetPullFailure())
	case o.GetBlocker() != nil:
		changed = s.openBlocker(cursor, o, o.GetBlocker())
	default:
		if closesPull(o.GetReason()) {
			// To the second: kubelet's Event times have one-second
			// resolution, a pod-status observation the agent's clock; in a
			// tie the image is there.
			if b := s.blockers[key]; b != nil && notBefore(at, b.LastSeen) {
				delete(s.blockers, key)
				changed = true
			}
			if p, ok := s.pulled[key]; !ok || at.After(p) {
				if !ok && len(s.pulled) >= maxBlockersPerSandbox {
					clear(s.pulled) // bounded; forgetting only loses the tie-break
				}
				s.pulled[key] = at
			}
			if o.GetRole() == eventpipev1.RoleWorkload && o.GetContainer() == workloadContainer {
				changed = s.closeWorkloadPulls(key, at) || changed
			}
		}
		changed = s.closeBlockers(o, at) || changed
	}
	if changed || deleted {
		s.refresh()
	}
	return changed || deleted || isNew || progress != d.Progress
}

// earliest is the earliest of t, at and the set timestamps (unset and
// zero times do not count).
func earliest(t, at time.Time, more ...*timestamppb.Timestamp) time.Time {
	pick := func(c time.Time) {
		if c.Unix() > 0 && (t.IsZero() || c.Before(t)) {
			t = c
		}
	}
	pick(at)
	for _, ts := range more {
		if ts.IsValid() {
			pick(ts.AsTime())
		}
	}
	return t
}

// notBefore reports whether a is not earlier than b, to the second.
func notBefore(a, b time.Time) bool {
	return !a.Truncate(time.Second).Before(b.Truncate(time.Second))
}

// workloadContainer is the sandbox's own container in OpenShell's workload
// pod; its init containers run before it.
const workloadContainer = "agent"

// podPulls is the pulled key that stands for every container of a workload
// pod (no container name contains "*").
func podPulls(k blockerKey) blockerKey {
	k.container = "*"
	return k
}

// closeWorkloadPulls: the workload pod's agent container has its image
// (agent is its key), so its init containers, which run first, had theirs:
// their pull blockers not later than at (to the second) end, and a failure
// of theirs not later than at, read late, does not open again. The
// supervisor pod is another pod with its own images.
func (s *sandboxState) closeWorkloadPulls(agent blockerKey, at time.Time) bool {
	pod := podPulls(agent)
	if p, ok := s.pulled[pod]; !ok || at.After(p) {
		if !ok && len(s.pulled) >= maxBlockersPerSandbox {
			clear(s.pulled) // bounded; forgetting only loses the tie-break
		}
		s.pulled[pod] = at
	}
	closed := false
	for k, b := range s.blockers {
		if k.kind == KindImagePull && podPulls(k) == pod && b.Role == eventpipev1.RoleWorkload && notBefore(at, b.LastSeen) {
			delete(s.blockers, k)
			closed = true
		}
	}
	return closed
}

// closesPull: the container has its image (Pulled, also "already present"),
// or got past it.
func closesPull(reason string) bool {
	return reason == "Pulled" || reason == "Created" || reason == "Started"
}

func (s *sandboxState) openPull(key blockerKey, cursor uint64, o *eventpipev1.Occurrence, pf *eventpipev1.PullFailure) bool {
	if p, ok := s.pulled[key]; ok && s.blockers[key] == nil && notBefore(p, o.GetOccurredAt().AsTime()) {
		return false // seen no later than the pull that ended it (to the second)
	}
	if p, ok := s.pulled[podPulls(key)]; ok && o.GetRole() == eventpipev1.RoleWorkload && s.blockers[key] == nil && notBefore(p, o.GetOccurredAt().AsTime()) {
		return false // seen no later than the agent container's pull
	}
	image := pf.GetImage()
	if image == "" {
		image = o.GetImage()
	}
	b := s.blockers[key]
	if b == nil {
		if len(s.blockers) >= maxBlockersPerSandbox {
			s.d.DroppedBlockers++
			return false
		}
		b = &Blocker{Kind: KindImagePull, Namespace: key.namespace, Pod: key.pod, Container: key.container}
		s.blockers[key] = b
	}
	old := *b
	if image != "" && b.Image != "" && image != b.Image {
		// The pod now pulls another image: the old failure is history.
		*b = Blocker{Kind: KindImagePull, Namespace: key.namespace, Pod: key.pod, Container: key.container}
	}
	setIf(&b.Image, image)
	setIf(&b.ImageRole, o.GetImageRole())
	setIf(&b.Role, o.GetRole())
	if n := o.GetReportingInstance(); n != "" {
		b.Node = n
	}
	// An "unknown" cause never overwrites a known one of the same image.
	if c := pf.GetCategory(); c != "" && (c != eventpipev1.CategoryUnknown || b.Cause == "") {
		b.Cause = c
		setIf(&b.Detail, pf.GetDetail())
		b.DecidedBy, b.Confidence = pf.GetDecidedBy(), pf.GetConfidence()
	}
	setIf(&b.Disposition, pf.GetDisposition())
	b.Attempts = max(b.Attempts, pf.GetAttempts())
	if t := pf.GetFirstSeen(); t != nil && (b.Since.IsZero() || t.AsTime().Before(b.Since)) {
		b.Since = t.AsTime()
	}
	last := o.GetOccurredAt().AsTime()
	if t := pf.GetLastSeen(); t != nil {
		last = t.AsTime()
	}
	if last.After(b.LastSeen) {
		b.LastSeen = last
	}
	if b.Since.IsZero() {
		b.Since = b.LastSeen
	}
	b.EventID = o.GetEventId()
	b.Cursor = cursor
	b.Remedy = remedy.Pull(remedy.Input{Category: b.Cause, Image: b.Image, ImageRole: b.ImageRole, Node: b.Node, Detail: b.Detail})
	// The latest event and cursor alone are not a change worth redrawing.
	cmp := *b
	cmp.EventID, cmp.Cursor = old.EventID, old.Cursor
	return cmp != old
}

// refresh rebuilds the sorted blocker list and the state.
func (s *sandboxState) refresh() {
	s.d.Blockers = s.d.Blockers[:0]
	for _, b := range s.blockers {
		s.d.Blockers = append(s.d.Blockers, *b)
	}
	sortBlockers(s.d.Blockers)
	s.d.State = StateClear
	switch {
	case s.d.DeletedAt != nil:
		s.d.State = StateDeleted
	case len(s.d.Blockers) > 0:
		s.d.State = StateBlocked
	}
}

func sortBlockers(bs []Blocker) {
	sort.Slice(bs, func(i, j int) bool {
		a, b := bs[i], bs[j]
		if (a.ImageRole == eventpipev1.ImageRoleSupervisor) != (b.ImageRole == eventpipev1.ImageRoleSupervisor) {
			return a.ImageRole == eventpipev1.ImageRoleSupervisor
		}
		if stage(a) != stage(b) {
			return stage(a) < stage(b)
		}
		if !a.Since.Equal(b.Since) {
			return a.Since.Before(b.Since)
		}
		return a.Pod+"/"+a.Container < b.Pod+"/"+b.Container
	})
}

func setIf(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

// Sandbox returns the diagnosis of one sandbox by id (with ReplacedBy).
func (f *Folder) Sandbox(id string) (Diagnosis, bool) {
	if f.sandboxes[id] == nil {
		return Diagnosis{}, false
	}
	for _, d := range f.Sandboxes() {
		if d.ID == id {
			return d, true
		}
	}
	return Diagnosis{}, false
}

func (s *sandboxState) copy() Diagnosis {
	d := s.d
	d.Blockers = append([]Blocker(nil), s.d.Blockers...)
	for i := range d.Blockers {
		if c := d.Blockers[i].ExitCode; c != nil {
			v := *c
			d.Blockers[i].ExitCode = &v
		}
	}
	if d.Blockers == nil {
		d.Blockers = []Blocker{}
	}
	if s.d.Last != nil {
		l := *s.d.Last
		d.Last = &l
	}
	if s.d.DeletedAt != nil {
		t := *s.d.DeletedAt
		d.DeletedAt = &t
	}
	return d
}

// markReplaced sets ReplacedBy (and StateReplaced when no deletion was
// seen) on every sandbox older than the current one of its name, workspace
// and gateway: the newest sandbox not seen deleted, else the newest one.
// Sandboxes are ordered by FirstSeen (then id), so late Events of an old
// sandbox, arriving after its replacement's, do not make it the newer one.
func markReplaced(ds []Diagnosis) {
	type nameKey struct{ gateway, workspace, name string }
	groups := map[nameKey][]int{}
	for i := range ds {
		if ds[i].Name == "" {
			continue
		}
		k := nameKey{ds[i].GatewayID, ds[i].Workspace, ds[i].Name}
		groups[k] = append(groups[k], i)
	}
	newer := func(a, b *Diagnosis) bool {
		if !a.FirstSeen.Equal(b.FirstSeen) {
			return a.FirstSeen.After(b.FirstSeen)
		}
		return a.ID > b.ID
	}
	for _, idx := range groups {
		if len(idx) < 2 {
			continue
		}
		cur := idx[0]
		for _, i := range idx[1:] {
			li, lc := ds[i].DeletedAt == nil, ds[cur].DeletedAt == nil
			if li != lc && li || li == lc && newer(&ds[i], &ds[cur]) {
				cur = i
			}
		}
		for _, i := range idx {
			if i == cur || !newer(&ds[cur], &ds[i]) {
				continue
			}
			ds[i].ReplacedBy = ds[cur].ID
			if ds[i].DeletedAt == nil {
				ds[i].State = StateReplaced
			}
		}
	}
}

// Sandboxes returns every diagnosis, by workspace then name then id.
func (f *Folder) Sandboxes() []Diagnosis {
	f.settle()
	out := make([]Diagnosis, 0, len(f.sandboxes))
	for _, s := range f.sandboxes {
		out = append(out, s.copy())
	}
	markReplaced(out)
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Workspace != b.Workspace {
			return a.Workspace < b.Workspace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		if !a.FirstSeen.Equal(b.FirstSeen) {
			return a.FirstSeen.Before(b.FirstSeen) // the sandboxes of one name, oldest first
		}
		return a.ID < b.ID
	})
	return out
}

// Successor returns d with ReplacedBy (and StateReplaced) as byName, a
// Folder of the sandboxes of d's name and workspace, sees it: a reader that
// selected d by id learns whether its name has passed to a newer sandbox.
func Successor(d Diagnosis, byName *Folder) Diagnosis {
	if s, ok := byName.Sandbox(d.ID); ok && s.ReplacedBy != "" {
		d.ReplacedBy = s.ReplacedBy
		if d.DeletedAt == nil {
			d.State = StateReplaced
		}
	}
	return d
}

// Find returns the sandboxes named name (in workspace, when not empty),
// deleted and replaced ones included (Live tells).
func (f *Folder) Find(name, workspace string) []Diagnosis {
	var out []Diagnosis
	for _, d := range f.Sandboxes() {
		if d.Name == name && (workspace == "" || d.Workspace == workspace) {
			out = append(out, d)
		}
	}
	return out
}

// SandboxRef names a sandbox in a group.
type SandboxRef struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Workspace string `json:"workspace"`
}

// SupervisorFailure is one supervisor image that fails to pull, with every
// sandbox it blocks: a bad supervisor tag on the gateway shows from the
// first failed sandbox on.
type SupervisorFailure struct {
	GatewayID string `json:"gateway_id,omitempty"`
	Image     string `json:"image"`
	Cause     string `json:"cause"`
	// Disposition is persistent when any sandbox's failure is.
	Disposition string `json:"disposition"`
	// Attempts summed over the sandboxes.
	Attempts  uint32       `json:"attempts"`
	Since     time.Time    `json:"since"`
	LastSeen  time.Time    `json:"last_seen"`
	Detail    string       `json:"detail,omitempty"`
	Remedy    string       `json:"remedy"`
	Sandboxes []SandboxRef `json:"sandboxes"`
	// Verified is the agent's registry check that confirms the failure
	// (verify.supervisor), when there is one; with no sandboxes, the
	// failure is known from the check alone, before any sandbox failed.
	Verified *SupervisorCheck `json:"verified,omitempty"`
}

// Supervisor groups the supervisor-image blockers of ds by gateway, image
// and cause, most sandboxes first.
func Supervisor(ds []Diagnosis) []SupervisorFailure {
	type gkey struct{ gw, image, cause string }
	groups := map[gkey]*SupervisorFailure{}
	seen := map[gkey]map[string]bool{}
	for _, d := range ds {
		if !d.Live() {
			continue // its pods are gone: it shows no supervisor image now
		}
		for _, b := range d.Blockers {
			if b.ImageRole != eventpipev1.ImageRoleSupervisor {
				continue
			}
			k := gkey{d.GatewayID, b.Image, b.Cause}
			g := groups[k]
			if g == nil {
				g = &SupervisorFailure{GatewayID: d.GatewayID, Image: b.Image, Cause: b.Cause,
					Disposition: b.Disposition, Since: b.Since, LastSeen: b.LastSeen, Detail: b.Detail, Remedy: b.Remedy}
				groups[k] = g
				seen[k] = map[string]bool{}
			}
			g.Attempts += b.Attempts
			if b.Disposition == eventpipev1.DispositionPersistent {
				g.Disposition = b.Disposition
			}
			if b.Since.Before(g.Since) {
				g.Since = b.Since
			}
			if b.LastSeen.After(g.LastSeen) {
				g.LastSeen = b.LastSeen
			}
			if !seen[k][d.ID] {
				seen[k][d.ID] = true
				g.Sandboxes = append(g.Sandboxes, SandboxRef{ID: d.ID, Name: d.Name, Workspace: d.Workspace})
			}
		}
	}
	out := make([]SupervisorFailure, 0, len(groups))
	for _, g := range groups {
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if len(a.Sandboxes) != len(b.Sandboxes) {
			return len(a.Sandboxes) > len(b.Sandboxes)
		}
		if !a.Since.Equal(b.Since) {
			return a.Since.Before(b.Since)
		}
		return a.GatewayID+a.Image+a.Cause < b.GatewayID+b.Image+b.Cause
	})
	return out
}
