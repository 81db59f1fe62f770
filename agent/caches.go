package agent

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/eventpipe/eventpipe/enrich"
)

// caches are the metadata informers enrich reads: Pods, PVCs, Namespaces
// and Sandbox CRs. A transform keeps only what enrich uses, handlers only
// signal (no I/O), and deleted objects are remembered as tombstones for a
// while so teardown events are still attributed.
type caches struct {
	cfg        CacheConfig
	podNameAnn string
	in         interner
	log        *slog.Logger
	m          *metrics

	factory   informers.SharedInformerFactory
	dynamic   dynamicinformer.DynamicSharedInformerFactory
	pods      cache.SharedIndexInformer
	pvcs      cache.SharedIndexInformer
	nss       cache.SharedIndexInformer
	sandboxes cache.SharedIndexInformer // nil when no version is served
	sandboxGV string

	podTomb, pvcTomb, nsTomb, sbTomb *tombstones

	// changed is signalled (non-blocking) on every cache change.
	changed chan struct{}
	// diagnose receives keys of pods with a container waiting on something.
	diagnose chan string
}

const uidIndex = "uid"

func newCaches(ctx context.Context, cfg Config, cs kubernetes.Interface, dyn dynamic.Interface, disc discovery.DiscoveryInterface, log *slog.Logger, m *metrics) (*caches, error) {
	c := &caches{
		cfg:        cfg.Cache,
		podNameAnn: cfg.Enrich.Rules.PodNameAnnotation,
		log:        log,
		m:          m,
		podTomb:    newTombstones(cfg.Cache.TombstoneTTL, cfg.Cache.TombstoneMax),
		pvcTomb:    newTombstones(cfg.Cache.TombstoneTTL, cfg.Cache.TombstoneMax),
		nsTomb:     newTombstones(cfg.Cache.TombstoneTTL, cfg.Cache.TombstoneMax),
		sbTomb:     newTombstones(cfg.Cache.TombstoneTTL, cfg.Cache.TombstoneMax),
		changed:    make(chan struct{}, 1),
		diagnose:   make(chan string, cfg.Cache.DiagnoseQueue),
	}
	c.factory = informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTransform(c.transform))
	// The factory's own informers index every object by namespace; the
	// lookups only get by key, so the index would cost a set entry per
	// cached object for nothing.
	c.pods = c.factory.InformerFor(&corev1.Pod{}, func(cs kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredPodInformer(cs, metav1.NamespaceAll, resync, cache.Indexers{}, nil)
	})
	c.pvcs = c.factory.InformerFor(&corev1.PersistentVolumeClaim{}, func(cs kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredPersistentVolumeClaimInformer(cs, metav1.NamespaceAll, resync, cache.Indexers{}, nil)
	})
	c.nss = c.factory.InformerFor(&corev1.Namespace{}, func(cs kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredNamespaceInformer(cs, resync, cache.Indexers{}, nil)
	})

	gvr, err := discoverSandboxes(disc, cfg.Enrich.Rules.SandboxGroup, cfg.Cache.SandboxVersions)
	if err != nil {
		return nil, err
	}
	if gvr.Version != "" {
		c.sandboxGV = gvr.GroupVersion().String()
		c.dynamic = dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
		c.sandboxes = c.dynamic.ForResource(gvr).Informer()
		if err := c.sandboxes.SetTransform(c.transform); err != nil {
			return nil, fmt.Errorf("sandbox informer transform: %w", err)
		}
		if err := c.sandboxes.AddIndexers(cache.Indexers{uidIndex: uidIndexFunc}); err != nil {
			return nil, fmt.Errorf("sandbox uid index: %w", err)
		}
	} else {
		log.Warn("no served version of the Sandbox CRD; Sandbox CR attribution is off", "group", cfg.Enrich.Rules.SandboxGroup, "versions", cfg.Cache.SandboxVersions)
	}
	for _, h := range []struct {
		inf  cache.SharedIndexInformer
		tomb *tombstones
		pod  bool
	}{{c.pods, c.podTomb, true}, {c.pvcs, c.pvcTomb, false}, {c.nss, c.nsTomb, false}, {c.sandboxes, c.sbTomb, false}} {
		if h.inf == nil {
			continue
		}
		if _, err := h.inf.AddEventHandler(c.handler(h.tomb, h.pod)); err != nil {
			return nil, fmt.Errorf("add cache handler: %w", err)
		}
	}
	return c, nil
}

// discoverSandboxes returns the first served version of the Sandbox CR, or
// an empty GVR when none is served.
func discoverSandboxes(disc discovery.DiscoveryInterface, group string, versions []string) (schema.GroupVersionResource, error) {
	for _, v := range versions {
		gv := schema.GroupVersion{Group: group, Version: v}
		rl, err := disc.ServerResourcesForGroupVersion(gv.String())
		if err != nil {
			if isNotFound(err) {
				continue
			}
			return schema.GroupVersionResource{}, fmt.Errorf("discover %s: %w", gv, err)
		}
		for _, r := range rl.APIResources {
			if r.Name == "sandboxes" {
				return gv.WithResource("sandboxes"), nil
			}
		}
	}
	return schema.GroupVersionResource{}, nil
}

// start runs the informers until ctx ends and waits for their first sync.
func (c *caches) start(ctx context.Context) error {
	c.factory.Start(ctx.Done())
	if c.dynamic != nil {
		c.dynamic.Start(ctx.Done())
	}
	syncCtx, cancel := context.WithTimeout(ctx, c.cfg.SyncTimeout)
	defer cancel()
	synced := []cache.InformerSynced{c.pods.HasSynced, c.pvcs.HasSynced, c.nss.HasSynced}
	if c.sandboxes != nil {
		synced = append(synced, c.sandboxes.HasSynced)
	}
	if !cache.WaitForCacheSync(syncCtx.Done(), synced...) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("caches did not sync within %s", c.cfg.SyncTimeout)
	}
	return nil
}

// shutdown waits for the informer goroutines (ctx given to start must be done).
func (c *caches) shutdown() {
	c.factory.Shutdown()
	if c.dynamic != nil {
		c.dynamic.Shutdown()
	}
}

func (c *caches) updateGauges() {
	c.m.cacheObjects.WithLabelValues("pods").Set(float64(len(c.pods.GetStore().ListKeys())))
	c.m.cacheObjects.WithLabelValues("persistentvolumeclaims").Set(float64(len(c.pvcs.GetStore().ListKeys())))
	c.m.cacheObjects.WithLabelValues("namespaces").Set(float64(len(c.nss.GetStore().ListKeys())))
	if c.sandboxes != nil {
		c.m.cacheObjects.WithLabelValues("sandboxes").Set(float64(len(c.sandboxes.GetStore().ListKeys())))
	}
}

func (c *caches) signal() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// handler only records tombstones and signals; it never does I/O.
func (c *caches) handler(tomb *tombstones, pod bool) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			c.signal()
			if pod {
				c.maybeDiagnose(obj)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, err1 := metaOf(oldObj)
			n, err2 := metaOf(newObj)
			if err1 == nil && err2 == nil && o.GetResourceVersion() == n.GetResourceVersion() {
				return // resync or no-op
			}
			c.signal()
			if pod {
				c.maybeDiagnose(newObj)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			mo, err := metaOf(obj)
			if err != nil {
				return
			}
			tomb.put(mo.GetNamespace()+"/"+mo.GetName(), string(mo.GetUID()), obj)
			c.signal()
		},
	}
}

func (c *caches) maybeDiagnose(obj any) {
	co, ok := obj.(*cached)
	if !ok || co.pod == nil || !co.waiting {
		return
	}
	select {
	case c.diagnose <- co.pod.Namespace + "/" + co.pod.Name:
	default:
		c.m.diagnoseDropped.Inc()
	}
}

func metaOf(obj any) (metav1.Object, error) {
	return meta.Accessor(obj)
}

func uidIndexFunc(obj any) ([]string, error) {
	mo, err := metaOf(obj)
	if err != nil {
		return nil, nil
	}
	return []string{string(mo.GetUID())}, nil
}

// cached is what the informer stores keep instead of the API object: the
// enrich view, built once by the transform and handed to enrich as is
// (read-only). A full corev1.Pod costs about 5 KB even when emptied (its
// structs are large); this costs a few hundred bytes. The store and the
// handlers reach its identity through GetObjectMeta (meta.Accessor).
type cached struct {
	pod     *enrich.Pod
	pvc     *enrich.PVC
	ns      *enrich.Namespace
	sb      *enrich.Sandbox
	waiting bool // a pod container is waiting (pod-status diagnosis)
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

// GetObjectMeta makes cached a metav1.ObjectMetaAccessor for the informer's
// key and index functions.
func (c *cached) GetObjectMeta() metav1.Object {
	m := c.meta()
	return &metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: types.UID(m.UID), ResourceVersion: m.ResourceVersion}
}

// transform strips an object to what enrich reads before it is cached.
func (c *caches) transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		m := c.enrichMeta(&o.ObjectMeta)
		p := &enrich.Pod{Meta: m, NodeName: c.in.intern(o.Spec.NodeName), Phase: c.in.intern(string(o.Status.Phase))}
		p.Containers = make([]enrich.Container, 0, len(o.Spec.InitContainers)+len(o.Spec.Containers))
		waiting := false
		add := func(specs []corev1.Container, statuses []corev1.ContainerStatus, init bool) {
			for i := range specs {
				ct := enrich.Container{Name: c.in.intern(specs[i].Name), Image: c.in.intern(specs[i].Image), Init: init}
				for j := range statuses {
					st := &statuses[j]
					if st.Name != ct.Name {
						continue
					}
					ct.RestartCount = st.RestartCount
					if w := st.State.Waiting; w != nil {
						ct.WaitingReason, ct.WaitingMessage = c.in.intern(w.Reason), w.Message
						waiting = waiting || w.Reason != ""
					}
					if t := st.State.Terminated; t != nil {
						ct.TerminatedReason = t.Reason
					} else if t := st.LastTerminationState.Terminated; t != nil {
						ct.TerminatedReason = t.Reason
					}
				}
				p.Containers = append(p.Containers, ct)
			}
		}
		add(o.Spec.InitContainers, o.Status.InitContainerStatuses, true)
		add(o.Spec.Containers, o.Status.ContainerStatuses, false)
		return &cached{pod: p, waiting: waiting}, nil
	case *corev1.PersistentVolumeClaim:
		return &cached{pvc: &enrich.PVC{Meta: c.enrichMeta(&o.ObjectMeta)}}, nil
	case *corev1.Namespace:
		return &cached{ns: &enrich.Namespace{Meta: c.enrichMeta(&o.ObjectMeta)}}, nil
	case *unstructured.Unstructured:
		return c.stripSandbox(o), nil
	}
	return obj, nil
}

func (c *caches) keep(m map[string]string) map[string]string {
	var out map[string]string
	for k, v := range m {
		for _, p := range c.cfg.KeepPrefixes {
			if strings.HasPrefix(k, p) {
				if out == nil {
					out = make(map[string]string, 4)
				}
				out[c.in.intern(k)] = c.in.internSmall(v)
				break
			}
		}
	}
	return out
}

// interner hands out one shared copy of strings that repeat across cached
// objects (label keys, namespaces, container names, images, owner kinds,
// workspace names), so 40,000 objects share one copy instead of holding
// 40,000. It is bounded: past maxInterned distinct strings, strings are
// kept as they are.
type interner struct {
	mu sync.Mutex
	m  map[string]string
}

const maxInterned = 65536

func (in *interner) intern(s string) string {
	if s == "" {
		return s
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if v, ok := in.m[s]; ok {
		return v
	}
	if in.m == nil {
		in.m = make(map[string]string)
	}
	if len(in.m) < maxInterned {
		in.m[s] = s
	}
	return s
}

// internSmall interns values likely to be shared (workspace, role,
// managed-by, gateway id); ids (36 characters) are kept as they are, since
// an interned unique value costs more than it saves.
func (in *interner) internSmall(s string) string {
	if len(s) >= 32 {
		return s
	}
	return in.intern(s)
}

func (c *caches) enrichMeta(m *metav1.ObjectMeta) enrich.Meta {
	out := enrich.Meta{
		Namespace: c.in.intern(m.Namespace), Name: m.Name, UID: string(m.UID), ResourceVersion: m.ResourceVersion,
		Labels: c.keep(m.Labels), Annotations: c.keep(m.Annotations),
	}
	if len(m.OwnerReferences) > 0 {
		out.Owners = make([]enrich.Owner, len(m.OwnerReferences))
		for i, r := range m.OwnerReferences {
			out.Owners[i] = enrich.Owner{APIVersion: c.in.intern(r.APIVersion), Kind: c.in.intern(r.Kind), Name: r.Name, UID: string(r.UID), Controller: r.Controller != nil && *r.Controller}
		}
	}
	return out
}

// stripSandbox keeps metadata (filtered), the pod-name annotation and
// status.conditions of a Sandbox CR.
func (c *caches) stripSandbox(u *unstructured.Unstructured) *cached {
	m := enrich.Meta{
		Namespace: c.in.intern(u.GetNamespace()), Name: u.GetName(), UID: string(u.GetUID()), ResourceVersion: u.GetResourceVersion(),
		Labels: c.keep(u.GetLabels()), Annotations: c.keep(u.GetAnnotations()),
	}
	for _, r := range u.GetOwnerReferences() {
		m.Owners = append(m.Owners, enrich.Owner{APIVersion: c.in.intern(r.APIVersion), Kind: c.in.intern(r.Kind), Name: r.Name, UID: string(r.UID), Controller: r.Controller != nil && *r.Controller})
	}
	s := &enrich.Sandbox{Meta: m, APIVersion: c.in.intern(u.GetAPIVersion()), PodName: u.GetName()}
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
	return &cached{sb: s}
}

// ---- enrich lookups over the caches (indexer first, then tombstones) ----

func (c *caches) lookups() enrich.Lookups {
	l := enrich.Lookups{Pods: podLookup{c}, PVCs: pvcLookup{c}, Namespaces: nsLookup{c}}
	if c.sandboxes != nil {
		l.Sandboxes = sandboxLookup{c}
	}
	return l
}

// get returns the cached object and, for a tombstone, when it was deleted.
func (c *caches) get(inf cache.SharedIndexInformer, tomb *tombstones, key string) (*cached, time.Time, bool) {
	if obj, ok, err := inf.GetStore().GetByKey(key); err == nil && ok {
		co, isCached := obj.(*cached)
		return co, time.Time{}, isCached
	}
	obj, at, ok := tomb.get(key)
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

func (l podLookup) Pod(ns, name string) (*enrich.Pod, bool) {
	co, deleted, ok := l.c.get(l.c.pods, l.c.podTomb, nsKey(ns, name))
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
	co, deleted, ok := l.c.get(l.c.pvcs, l.c.pvcTomb, nsKey(ns, name))
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
	co, deleted, ok := l.c.get(l.c.nss, l.c.nsTomb, name)
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
	co, deleted, ok := l.c.get(l.c.sandboxes, l.c.sbTomb, nsKey(ns, name))
	return sandboxOf(co, deleted, ok)
}

func (l sandboxLookup) SandboxByUID(uid string) (*enrich.Sandbox, bool) {
	if objs, err := l.c.sandboxes.GetIndexer().ByIndex(uidIndex, uid); err == nil && len(objs) > 0 {
		if co, ok := objs[0].(*cached); ok {
			return sandboxOf(co, time.Time{}, true)
		}
	}
	obj, deleted, ok := l.c.sbTomb.getByUID(uid)
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

func isNotFound(err error) bool {
	return apierrors.IsNotFound(err)
}
