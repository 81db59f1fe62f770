package agent

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/eventpipe/eventpipe/agent/internal/kwire"
	"github.com/eventpipe/eventpipe/enrich"
)

// caches are what enrich reads: Pods, PVCs, Namespaces and Sandbox CRs,
// each kept by a reflector (list, then watch) in an objStore of enrich's
// small views. Handlers only signal (no I/O), and deleted objects are
// remembered as tombstones for a while so teardown events are still
// attributed.
type caches struct {
	cfg        CacheConfig
	podNameAnn string
	in         interner
	log        *slog.Logger
	m          *metrics
	mo         kwire.MetaOptions

	pods, pvcs, nss, sandboxes *kindCache // sandboxes nil when no version is served
	sandboxGV                  string

	// changed is signalled (non-blocking) on every cache change.
	changed chan struct{}
	// diagnose receives keys of pods with a container waiting on something
	// or terminated with a failure.
	diagnose chan objKey
	// gone receives the Sandbox CRs seen deleted (the processor ships a
	// deletion occurrence for each).
	gone chan *enrich.Sandbox
	// conditions receives the Sandbox CRs whose Ready condition began or
	// stopped saying that the API server refused their pod (the processor
	// ships a sandbox condition occurrence for each; see
	// enrich.DiagnoseSandbox).
	conditions chan *enrich.Sandbox
	// ready receives the pods in which a container with a readiness or
	// startup probe became ready (the processor ships a container
	// readiness occurrence for each of a sandbox's; see
	// enrich.ContainersReady). The pods of the first listing are not sent:
	// the processor sweeps the synced store once instead.
	ready chan readyChange
}

// readyChange is a pod version in which a probed container became ready,
// and the version before it (nil at first sight). Both are the cached,
// immutable values.
type readyChange struct{ old, cur *enrich.Pod }

// goneQueue bounds the Sandbox deletions waiting for the processor; a
// workspace deleted at once deletes all its sandboxes.
const goneQueue = 4096

// conditionQueue bounds the Sandbox conditions waiting for the processor:
// one quota change can refuse (or admit) every sandbox of a workspace.
const conditionQueue = 4096

// readyQueue bounds the pods whose containers became ready, waiting for
// the processor: a node coming back makes every probed container on it
// ready again at once.
const readyQueue = 4096

// kindCache is the store, reflector and tombstones of one kind.
type kindCache struct {
	c     *caches
	label string
	store *objStore
	tomb  *tombstones
	refl  *reflector
	pod   bool
}

func (k *kindCache) added(co *cached) {
	k.c.signal()
	if k.pod {
		k.c.maybeDiagnose(co)
		if k.refl == nil || k.refl.hasSynced() {
			// A pod created since the listing (the listing's pods are
			// swept by the processor once the caches synced).
			k.c.maybeReady(nil, co)
		}
	}
	if co.sb != nil {
		k.c.maybeCondition(nil, co.sb)
	}
}

func (k *kindCache) updated(old, co *cached) {
	k.c.signal()
	if k.pod {
		k.c.maybeDiagnose(co)
		k.c.maybeReady(old, co)
	}
	if co.sb != nil {
		var was *enrich.Sandbox
		if old != nil {
			was = old.sb
		}
		k.c.maybeCondition(was, co.sb)
	}
}

// maybeCondition queues a Sandbox CR whose Ready condition changed what it
// says about a refused pod (a reason compare for every other CR). The
// cached value is immutable, so the processor reads the version that
// changed. A full queue is counted; the CR's next change retries.
func (c *caches) maybeCondition(old, cur *enrich.Sandbox) {
	if !enrich.SandboxRefusalChanged(old, cur) {
		return
	}
	select {
	case c.conditions <- cur:
	default:
		c.m.conditionDropped.Inc()
		c.log.Warn("condition queue full; the refusal this sandbox's Ready condition reports is not shipped", "namespace", cur.Namespace, "name", cur.Name)
	}
}

// maybeReady queues a pod version in which a container with a readiness
// or startup probe became ready (a loop over its containers for every
// other update). A full queue is counted and logged: that end is not
// shipped, and the container's blocker stays open for readers until it
// fails and recovers again or the agent restarts (its sweep).
func (c *caches) maybeReady(old, cur *cached) {
	var was *enrich.Pod
	if old != nil {
		was = old.pod
	}
	if cur.pod == nil || !enrich.BecameReady(was, cur.pod) {
		return
	}
	select {
	case c.ready <- readyChange{was, cur.pod}:
	default:
		c.m.readyDropped.Inc()
		c.log.Warn("ready queue full; the end of this pod's probe blockers is not shipped", "namespace", cur.pod.Namespace, "name", cur.pod.Name)
	}
}

func (k *kindCache) deleted(co *cached) {
	m := co.meta()
	k.tomb.put(nsKey(m.Namespace, m.Name), m.UID, co)
	k.c.signal()
	if co.sb != nil {
		k.c.sandboxGone(co.sb)
	}
}

// sandboxGone queues a deleted Sandbox CR for its deletion occurrence
// without blocking the reflector; a full queue is counted and logged.
func (c *caches) sandboxGone(sb *enrich.Sandbox) {
	select {
	case c.gone <- sb:
	default:
		c.m.deletionDropped.Inc()
		c.log.Warn("deletion queue full; the deletion of this sandbox is not shipped", "namespace", sb.Namespace, "name", sb.Name, "uid", sb.UID)
	}
}

func newCaches(ctx context.Context, cfg Config, kc *kubeClient, log *slog.Logger, m *metrics) (*caches, error) {
	c := &caches{
		cfg:        cfg.Cache,
		podNameAnn: cfg.Enrich.Rules.PodNameAnnotation,
		log:        log,
		m:          m,
		changed:    make(chan struct{}, 1),
		diagnose:   make(chan objKey, cfg.Cache.DiagnoseQueue),
		gone:       make(chan *enrich.Sandbox, goneQueue),
		conditions: make(chan *enrich.Sandbox, conditionQueue),
		ready:      make(chan readyChange, readyQueue),
	}
	c.mo = kwire.MetaOptions{KeepPrefixes: cfg.Cache.KeepPrefixes, Intern: c.in.intern, InternSmall: c.in.internSmall}
	newKind := func(label string, res apiResource, uidIndex, pod bool, decode func([]byte) (*cached, error)) *kindCache {
		k := &kindCache{c: c, label: label, store: newObjStore(uidIndex), tomb: newTombstones(cfg.Cache.TombstoneTTL, cfg.Cache.TombstoneMax), pod: pod}
		k.refl = &reflector{client: kc, res: res, decode: decode, store: k.store, h: k, cfg: cfg.Watch, log: log, m: m, label: label}
		return k
	}
	c.pods = newKind("pods", apiResource{version: "v1", resource: "pods"}, false, true, c.decodePod)
	c.pvcs = newKind("persistentvolumeclaims", apiResource{version: "v1", resource: "persistentvolumeclaims"}, false, false, c.decodePVC)
	c.nss = newKind("namespaces", apiResource{version: "v1", resource: "namespaces"}, false, false, c.decodeNamespace)

	version, err := discoverSandboxes(ctx, kc, cfg.Enrich.Rules.SandboxGroup, cfg.Cache.SandboxVersions)
	if err != nil {
		return nil, err
	}
	if version != "" {
		res := apiResource{group: cfg.Enrich.Rules.SandboxGroup, version: version, resource: "sandboxes", json: true}
		c.sandboxGV = res.group + "/" + version
		c.sandboxes = newKind("sandboxes", res, true, false, c.decodeSandbox)
	} else {
		log.Warn("no served version of the Sandbox CRD; Sandbox CR attribution is off", "group", cfg.Enrich.Rules.SandboxGroup, "versions", cfg.Cache.SandboxVersions)
	}
	return c, nil
}

// The decoders turn one object of the wire (protobuf for the built-in
// kinds, JSON for the CR) into its cached view.

func (c *caches) decodePod(raw []byte) (*cached, error) {
	p, waiting, err := kwire.DecodePod(raw, &c.mo)
	if err != nil {
		return nil, err
	}
	return &cached{pod: p, waiting: waiting}, nil
}

func (c *caches) decodePVC(raw []byte) (*cached, error) {
	p, err := kwire.DecodePVC(raw, &c.mo)
	if err != nil {
		return nil, err
	}
	return &cached{pvc: p}, nil
}

func (c *caches) decodeNamespace(raw []byte) (*cached, error) {
	n, err := kwire.DecodeNamespace(raw, &c.mo)
	if err != nil {
		return nil, err
	}
	return &cached{ns: n}, nil
}

func (c *caches) decodeSandbox(raw []byte) (*cached, error) {
	s, err := kwire.DecodeSandboxJSON(raw, &c.mo, c.podNameAnn)
	if err != nil {
		return nil, err
	}
	return &cached{sb: s}, nil
}

func (c *caches) kinds() []*kindCache {
	out := []*kindCache{c.pods, c.pvcs, c.nss}
	if c.sandboxes != nil {
		out = append(out, c.sandboxes)
	}
	return out
}

// discoverSandboxes returns the first served version of the Sandbox CR, or
// "" when none is served.
func discoverSandboxes(ctx context.Context, kc *kubeClient, group string, versions []string) (string, error) {
	for _, v := range versions {
		gv := group + "/" + v
		b, err := kc.getJSON(ctx, "/apis/"+gv)
		if err != nil {
			if isNotFound(err) {
				continue
			}
			return "", fmt.Errorf("discover %s: %w", gv, err)
		}
		names, err := kwire.DecodeAPIResourceNamesJSON(b)
		if err != nil {
			return "", fmt.Errorf("discover %s: %w", gv, err)
		}
		for _, n := range names {
			if n == "sandboxes" {
				return v, nil
			}
		}
	}
	return "", nil
}

// start runs the reflectors until ctx ends and waits for their first sync.
// wait (called once ctx is done) returns when they have stopped.
func (c *caches) start(ctx context.Context) (wait func(), err error) {
	var wg sync.WaitGroup
	for _, k := range c.kinds() {
		wg.Go(func() { k.refl.run(ctx) })
	}
	wait = wg.Wait
	syncCtx, cancel := context.WithTimeout(ctx, c.cfg.SyncTimeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		all := true
		for _, k := range c.kinds() {
			all = all && k.refl.hasSynced()
		}
		if all {
			return wait, nil
		}
		select {
		case <-syncCtx.Done():
			if ctx.Err() != nil {
				return wait, ctx.Err()
			}
			return wait, fmt.Errorf("caches did not sync within %s", c.cfg.SyncTimeout)
		case <-t.C:
		}
	}
}

func (c *caches) updateGauges() {
	for _, k := range c.kinds() {
		c.m.cacheObjects.WithLabelValues(k.label).Set(float64(k.store.len()))
	}
}

func (c *caches) signal() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (c *caches) maybeDiagnose(co *cached) {
	if co.pod == nil || !co.waiting {
		return
	}
	select {
	case c.diagnose <- objKey{co.pod.Namespace, co.pod.Name}:
	default:
		c.m.diagnoseDropped.Inc()
	}
}

// cached is what the stores keep instead of the API object: the enrich
// view, decoded from the wire by kwire and handed to enrich as is
// (read-only). A full corev1.Pod costs about 5 KB even when emptied (its
// structs are large); this costs a few hundred bytes.
type cached struct {
	pod     *enrich.Pod
	pvc     *enrich.PVC
	ns      *enrich.Namespace
	sb      *enrich.Sandbox
	waiting bool   // a pod container is waiting or ended badly (pod-status diagnosis)
	gen     uint32 // the listing that last saw it (objStore)
}

func (c *cached) meta() *enrich.Meta {
	switch {
	case c.pod != nil:
		return &c.pod.Meta
	case c.pvc != nil:
		return &c.pvc.Meta
	case c.ns != nil:
		return &c.ns.Meta
	case c.sb != nil:
		return &c.sb.Meta
	}
	return &enrich.Meta{}
}

// interner hands out one shared copy of strings that repeat across cached
// objects (label keys, namespaces, container names, images, owner kinds,
// workspace names), so 40,000 objects share one copy instead of holding
// 40,000. It is bounded: past maxInterned distinct strings, strings are
// copied as they are.
type interner struct {
	mu sync.Mutex
	m  map[string]string
}

const maxInterned = 65536

func (in *interner) intern(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if v, ok := in.m[string(b)]; ok { // no allocation for the lookup
		return v
	}
	s := string(b)
	if in.m == nil {
		in.m = make(map[string]string)
	}
	if len(in.m) < maxInterned {
		in.m[s] = s
	}
	return s
}

// internSmall interns values likely to be shared (workspace, role,
// managed-by, gateway id); ids (36 characters) are copied as they are,
// since an interned unique value costs more than it saves.
func (in *interner) internSmall(b []byte) string {
	if len(b) >= 32 {
		return string(b)
	}
	return in.intern(b)
}

// ---- enrich lookups over the caches (store first, then tombstones) ----

func (c *caches) lookups() enrich.Lookups {
	l := enrich.Lookups{Pods: podLookup{c}, PVCs: pvcLookup{c}, Namespaces: nsLookup{c}}
	if c.sandboxes != nil {
		l.Sandboxes = sandboxLookup{c}
	}
	return l
}

// get returns the cached object and, for a tombstone, when it was deleted.
func (k *kindCache) get(ns, name string) (*cached, time.Time, bool) {
	if co, ok := k.store.get(objKey{ns, name}); ok {
		return co, time.Time{}, true
	}
	obj, at, ok := k.tomb.get(nsKey(ns, name))
	co, isCached := obj.(*cached)
	return co, at, ok && isCached
}

func nsKey(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// The lookups return the cached enrich values themselves (read-only); a
// tombstone's value is copied to carry DeletedAt.

type podLookup struct{ c *caches }

// PodByUID finds a deleted pod the caches remember (enrich.PodUIDLookup);
// live pods are not indexed by uid (memory), and enrich asks only after the
// pod cached under the name turned out to be another one.
func (l podLookup) PodByUID(uid string) (*enrich.Pod, bool) {
	obj, deleted, ok := l.c.pods.tomb.getByUID(uid)
	co, isCached := obj.(*cached)
	if !ok || !isCached || co.pod == nil {
		return nil, false
	}
	cp := *co.pod
	cp.DeletedAt = deleted
	return &cp, true
}

func (l podLookup) Pod(ns, name string) (*enrich.Pod, bool) {
	co, deleted, ok := l.c.pods.get(ns, name)
	if !ok || co.pod == nil {
		return nil, false
	}
	if deleted.IsZero() {
		return co.pod, true
	}
	cp := *co.pod
	cp.DeletedAt = deleted
	return &cp, true
}

type pvcLookup struct{ c *caches }

func (l pvcLookup) PVC(ns, name string) (*enrich.PVC, bool) {
	co, deleted, ok := l.c.pvcs.get(ns, name)
	if !ok || co.pvc == nil {
		return nil, false
	}
	if deleted.IsZero() {
		return co.pvc, true
	}
	cp := *co.pvc
	cp.DeletedAt = deleted
	return &cp, true
}

type nsLookup struct{ c *caches }

func (l nsLookup) Namespace(name string) (*enrich.Namespace, bool) {
	co, deleted, ok := l.c.nss.get("", name)
	if !ok || co.ns == nil {
		return nil, false
	}
	if deleted.IsZero() {
		return co.ns, true
	}
	cp := *co.ns
	cp.DeletedAt = deleted
	return &cp, true
}

type sandboxLookup struct{ c *caches }

func (l sandboxLookup) Sandbox(ns, name string) (*enrich.Sandbox, bool) {
	co, deleted, ok := l.c.sandboxes.get(ns, name)
	return sandboxOf(co, deleted, ok)
}

func (l sandboxLookup) SandboxByUID(uid string) (*enrich.Sandbox, bool) {
	if co, ok := l.c.sandboxes.store.getByUID(uid); ok {
		return sandboxOf(co, time.Time{}, true)
	}
	obj, deleted, ok := l.c.sandboxes.tomb.getByUID(uid)
	co, isCached := obj.(*cached)
	return sandboxOf(co, deleted, ok && isCached)
}

func sandboxOf(co *cached, deleted time.Time, ok bool) (*enrich.Sandbox, bool) {
	if !ok || co == nil || co.sb == nil {
		return nil, false
	}
	if deleted.IsZero() {
		return co.sb, true
	}
	cp := *co.sb
	cp.DeletedAt = deleted
	return &cp, true
}

// ---- tombstones ----

// tombstones remember deleted objects for ttl, at most max of them (the
// oldest is forgotten first). Safe for concurrent use.
type tombstones struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu    sync.Mutex
	order *list.List // of *tombstone, oldest first
	byKey map[string]*list.Element
	byUID map[string]*list.Element
}

type tombstone struct {
	key, uid  string
	obj       any
	deletedAt time.Time
}

func newTombstones(ttl time.Duration, max int) *tombstones {
	return &tombstones{ttl: ttl, max: max, now: time.Now, order: list.New(), byKey: map[string]*list.Element{}, byUID: map[string]*list.Element{}}
}

func (t *tombstones) put(key, uid string, obj any) {
	if t.max <= 0 || t.ttl <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byKey[key]; ok {
		t.remove(e)
	}
	e := t.order.PushBack(&tombstone{key: key, uid: uid, obj: obj, deletedAt: t.now()})
	t.byKey[key] = e
	if uid != "" {
		t.byUID[uid] = e
	}
	for t.order.Len() > t.max {
		t.remove(t.order.Front())
	}
	t.expire()
}

func (t *tombstones) remove(e *list.Element) {
	ts := e.Value.(*tombstone)
	t.order.Remove(e)
	if t.byKey[ts.key] == e {
		delete(t.byKey, ts.key)
	}
	if t.byUID[ts.uid] == e {
		delete(t.byUID, ts.uid)
	}
}

func (t *tombstones) expire() {
	cut := t.now().Add(-t.ttl)
	for e := t.order.Front(); e != nil && !e.Value.(*tombstone).deletedAt.After(cut); e = t.order.Front() {
		t.remove(e)
	}
}

func (t *tombstones) get(key string) (any, time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire()
	if e, ok := t.byKey[key]; ok {
		ts := e.Value.(*tombstone)
		return ts.obj, ts.deletedAt, true
	}
	return nil, time.Time{}, false
}

func (t *tombstones) getByUID(uid string) (any, time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire()
	if e, ok := t.byUID[uid]; ok {
		ts := e.Value.(*tombstone)
		return ts.obj, ts.deletedAt, true
	}
	return nil, time.Time{}, false
}

func (t *tombstones) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.order.Len()
}
