package agent

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/eventpipe/eventpipe/agent/internal/kwire"
	"github.com/eventpipe/eventpipe/enrich"
)

func TestConfigFiles(t *testing.T) {
	cfg, err := LoadConfig("testdata/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("testdata/agent.yaml: %v", err)
	}
	if cfg.Cluster != "prod-eu-1" || cfg.Ship.FlushInterval != 200*time.Millisecond || cfg.Enrich.MaxMessageBytes != 4096 {
		t.Errorf("decoded %+v", cfg)
	}
	if len(cfg.Enrich.Rules.SandboxIDKeys) == 0 {
		t.Errorf("enrich rules not kept from defaults when only some keys are set")
	}

	cases := map[string][]string{
		"many.bad.yaml": {
			"cluster: must be set",
			`collector.address: "no-port" is not host:port`,
			"collector.cert_file: cert_file and key_file must be set together",
			"collector.cert_file: stat /nonexistent/cert.pem",
			"watch.queue_capacity: must be at least 1, got 0",
			"watch.backoff_max: must be at least watch.backoff_initial (2s), got 1s",
			"hold.max_age: must not be negative, got -1s",
			"ship.batch_size: must be at least 1, got 0",
			"ship.max_in_flight: must be at least 1, got 0",
			"leader_election.namespace: must be set when leader election is enabled",
			"leader_election.lease_duration: must be greater than renew_deadline (10s), got 5s",
			"enrich.max_message_bytes:",
		},
		"unknown-key.bad.yaml": {"field adress not found"},
		"types.bad.yaml":       {"soon"},
		"durations.bad.yaml": {
			"collector.dial_timeout: 10 is a bare number, which would be read as nanoseconds; write the unit: if 10 seconds were meant, write 10s",
			"watch.stale_after: 900 is a bare number, which would be read as nanoseconds; write the unit: if 900 seconds were meant, write 15m",
			"hold.max_age: 0.5 is a bare number",
			"leader_election.lease_duration: 15 is a bare number",
			"enrich.persistent_window: 1us is below 1ms",
		},
		"placeholder.bad.yaml": {`cluster: "CHANGE-ME" is the placeholder of the shipped manifests`},
		"replicas.bad.yaml": {
			"collector.addresses: set collector.address or collector.addresses, not both",
			`collector.addresses[1]: "dns:///collector:7070"`,
			`collector.addresses[2]: duplicate "collector-0.collector:7070"`,
		},
		"verify.bad.yaml": {
			"verify.registry.timeout: must be positive, got 0s",
			"verify.registry.rate_per_registry: must be positive, got 0",
			`verify.registry.insecure_registries[0]: must be a host or host:port, got "registry.local/path"`,
			"verify.supervisor.namespace: must be set with verify.supervisor.name",
			`verify.supervisor.kind: must be Deployment, StatefulSet or empty, got "DaemonSet"`,
			"verify.supervisor.interval: must be positive, got 0s",
			`verify.platform: must be os/arch[/variant], got "amd64"`,
			"verify.queue: must be at least 1, got 0",
			`verify.pull_secrets[1]: needs namespace and name, got ""/"mirror-cred"`,
		},
		"verify-off.bad.yaml": {"verify.enabled: must be true for verify.pull_failures, verify.supervisor or verify.pull_secrets (they ask registries)"},
		"addresses.bad.yaml": {
			`collector.address: "256.1.1.1:7070": host "256.1.1.1" is not a valid IPv4 address`,
			`http.listen: ":99999": port 99999 is out of range 0-65535`,
		},
	}
	for file, wants := range cases {
		t.Run(file, func(t *testing.T) {
			cfg, err := LoadConfig(filepath.Join("testdata", file))
			if err == nil {
				err = cfg.Validate()
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
	if err := NewDefaultConfig().Validate(); err == nil || !strings.Contains(err.Error(), "cluster: must be set") {
		t.Errorf("defaults without cluster: %v", err)
	}
}

func TestCursorTracker(t *testing.T) {
	c := cursorTracker{safe: "10"}
	c.advance("11")
	if c.safe != "11" {
		t.Fatalf("safe %q", c.safe)
	}
	held := c.add("12") // held: the cursor must not pass it
	c.advance("13")
	c.advance("") // a listed event: no cursor of its own
	c.advance("14")
	if c.safe != "11" {
		t.Fatalf("cursor passed a held event: %q", c.safe)
	}
	held2 := c.add("15")
	c.advance("16")
	c.done(held)
	if c.safe != "14" {
		t.Fatalf("after the first held event shipped: %q, want 14", c.safe)
	}
	c.done(held2)
	if c.safe != "16" || len(c.queue) != 0 {
		t.Fatalf("after all shipped: %q (queue %d)", c.safe, len(c.queue))
	}
	// A held event released after a later one: order of release does not matter.
	a, b := c.add("17"), c.add("18")
	c.done(b)
	if c.safe != "16" {
		t.Fatalf("cursor passed the earlier held event: %q", c.safe)
	}
	c.done(a)
	if c.safe != "18" {
		t.Fatalf("got %q, want 18", c.safe)
	}
}

func TestFingerprintKeys(t *testing.T) {
	uids := []string{
		"0b8f1e5c-3c1a-4f6e-9d2a-7c41b2e9a0f1",
		"0b8f1e5c-3c1a-4f6e-9d2a-7c41b2e9a0f2", // differs in the last nibble
		"1b8f1e5c-3c1a-4f6e-9d2a-7c41b2e9a0f1", // and in the first
		"0B8F1E5C-3C1A-4F6E-9D2A-7C41B2E9A0F1", // upper case: not what the API server writes, hashed
		"0b8f1e5c-3c1a-4f6e-9d2a-7c41b2e9a0fg", // not hex
		"0b8f1e5c3c1a4f6e9d2a7c41b2e9a0f1",     // no dashes
		"a", "b", "",
	}
	seen := map[uidKey]string{}
	for _, u := range uids {
		k := keyOf(u)
		if prev, dup := seen[k]; dup {
			t.Errorf("keyOf(%q) == keyOf(%q)", u, prev)
		}
		seen[k] = u
		if keyOf(u) != k {
			t.Errorf("keyOf(%q) not stable", u)
		}
	}
	if k := keyOf(uids[0]); k[0] != 0x0b || k[15] != 0xf1 {
		t.Errorf("UUID not packed into its bytes: %x", k)
	}
}

func TestFingerprints(t *testing.T) {
	f := newFingerprints(4) // two generations of 2
	f.put("a", 1)
	f.put("b", 2)
	f.put("c", 3) // a, b move to the old generation
	for k, v := range map[string]uint64{"a": 1, "b": 2, "c": 3} {
		if got, ok := f.get(k); !ok || got != v {
			t.Errorf("get(%s) = %d, %v", k, got, ok)
		}
	}
	f.put("d", 4)
	f.put("e", 5) // c, d old; a, b dropped
	if _, ok := f.get("a"); ok {
		t.Errorf("a kept beyond capacity")
	}
	if len(f.young)+len(f.old) > 4 {
		t.Errorf("%d entries, capacity 4", len(f.young)+len(f.old))
	}
	f.forget("e")
	if _, ok := f.get("e"); ok {
		t.Errorf("forget did not forget")
	}
}

// wireItem encodes e as the API server does (protobuf) and decodes it the
// way the watcher does.
func wireItem(t *testing.T, e *corev1.Event, modified bool) item {
	t.Helper()
	raw, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &watcher{m: m, log: slog.New(slog.DiscardHandler)}
	it, ok := w.decodeItem(raw, modified, false)
	if !ok {
		t.Fatalf("event did not decode")
	}
	return it
}

func TestFingerprintIgnoresHeartbeat(t *testing.T) {
	e := &corev1.Event{Message: "m", Series: &corev1.EventSeries{Count: 3, LastObservedTime: metav1.NowMicro()}}
	a := wireItem(t, e, true).fp
	e.Series.LastObservedTime = metav1.NewMicroTime(time.Now().Add(30 * time.Minute))
	if b := wireItem(t, e, true).fp; a != b {
		t.Errorf("a series heartbeat changed the fingerprint")
	}
	e.Series.Count = 4
	if c := wireItem(t, e, true).fp; c == a {
		t.Errorf("a series count bump did not change the fingerprint")
	}
	e2 := &corev1.Event{Message: "m", Count: 1}
	x := wireItem(t, e2, true).fp
	e2.Message = "n"
	if wireItem(t, e2, true).fp == x {
		t.Errorf("a message change did not change the fingerprint")
	}
	e2.Message = "m"
	e2.Count = 2
	if wireItem(t, e2, true).fp == x {
		t.Errorf("a count bump did not change the fingerprint")
	}
}

func TestDecodeEventItem(t *testing.T) {
	now := time.Now().Truncate(time.Microsecond)
	e := &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Namespace: "ns", Name: "x.1", UID: "u", ResourceVersion: "7"},
		InvolvedObject:      corev1.ObjectReference{Kind: "Pod", Name: "p", FieldPath: "spec.containers{agent}"},
		Reason:              "Started",
		EventTime:           metav1.NewMicroTime(now),
		Series:              &corev1.EventSeries{Count: 5, LastObservedTime: metav1.NewMicroTime(now)},
		ReportingController: "agent-sandbox-controller",
		ReportingInstance:   "ctrl-0",
		Action:              "Create",
	}
	it := wireItem(t, e, false)
	ev := it.ev
	if it.kind != itemEvent || it.rv != "7" || ev.Namespace != "ns" || ev.UID != "u" || ev.Involved.Name != "p" ||
		ev.Count != 5 || !ev.SeriesLastObserved.Equal(now) || !ev.EventTime.Equal(now) || ev.ReportingComponent != "agent-sandbox-controller" ||
		ev.ReportingInstance != "ctrl-0" || ev.Involved.FieldPath != "spec.containers{agent}" || ev.Action != "Create" {
		t.Errorf("%+v", ev)
	}
	e.Source = corev1.EventSource{Component: "kubelet", Host: "n1"}
	ev = wireItem(t, e, false).ev
	if ev.ReportingComponent != "kubelet" || ev.ReportingInstance != "n1" {
		t.Errorf("source not preferred: %+v", ev)
	}
}

func TestClassifyRequest(t *testing.T) {
	cases := []struct{ method, url, verb, resource string }{
		{"GET", "/api/v1/events?limit=500", "list", "events"},
		{"GET", "/api/v1/events?watch=true&resourceVersion=5", "watch", "events"},
		{"GET", "/api/v1/namespaces/ns/events/x", "get", "events"},
		{"GET", "/api/v1/namespaces", "list", "namespaces"},
		{"GET", "/api/v1/namespaces/ns", "get", "namespaces"},
		{"GET", "/apis/agents.x-k8s.io/v1beta1/sandboxes?watch=1", "watch", "sandboxes"},
		{"GET", "/apis/agents.x-k8s.io/v1beta1", "list", "discovery"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/eventpipe/leases/eventpipe-agent", "update", "leases"},
		{"GET", "/api/v1/secrets", "list", "other"},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, c.url, nil)
		v, res := classifyRequest(r)
		if v != c.verb || res != c.resource {
			t.Errorf("%s %s = %s %s, want %s %s", c.method, c.url, v, res, c.verb, c.resource)
		}
	}
}

func TestTombstones(t *testing.T) {
	ts := newTombstones(time.Minute, 2)
	now := time.Unix(1000, 0)
	ts.now = func() time.Time { return now }
	ts.put("ns/a", "ua", "A")
	ts.put("ns/b", "ub", "B")
	ts.put("ns/c", "uc", "C") // a evicted (max 2)
	if _, _, ok := ts.get("ns/a"); ok {
		t.Errorf("a kept beyond max")
	}
	if o, at, ok := ts.getByUID("ub"); !ok || o != "B" || !at.Equal(now) {
		t.Errorf("getByUID(ub) = %v %v %v", o, at, ok)
	}
	now = now.Add(2 * time.Minute)
	if _, _, ok := ts.get("ns/c"); ok {
		t.Errorf("c kept beyond ttl")
	}
	if ts.len() != 0 {
		t.Errorf("len %d after expiry", ts.len())
	}
}

func TestCachedPodFromWire(t *testing.T) {
	c := &caches{cfg: NewDefaultConfig().Cache}
	c.mo = kwire.MetaOptions{KeepPrefixes: c.cfg.KeepPrefixes, Intern: c.in.intern, InternSmall: c.in.internSmall}
	ctrl := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", ResourceVersion: "3",
			Labels:          map[string]string{"openshell.ai/sandbox-id": "id", "app": "x"},
			Annotations:     map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 5000), "openshell.io/sandbox-id": "id"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "m"}},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Sandbox", Name: "s", UID: "su", Controller: &ctrl}}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "agent", Image: "img:1", Env: []corev1.EnvVar{{Name: "SECRETISH", Value: "v"}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: "Ready"}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off"}}}}},
	}
	raw, err := p.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	co, err := c.decodePod(raw)
	if err != nil {
		t.Fatal(err)
	}
	if m := co.meta(); m.Name != "p" || m.Namespace != "ns" || m.ResourceVersion != "3" || m.UID != "u" {
		t.Errorf("identity %+v", m)
	}
	ep := co.pod
	if _, ok := ep.Labels.Lookup("app"); ok {
		t.Errorf("foreign label kept")
	}
	if _, ok := ep.Annotations.Lookup("kubectl.kubernetes.io/last-applied-configuration"); ok {
		t.Errorf("foreign annotation kept")
	}
	if ep.NodeName != "n1" || ep.Phase != "Pending" || ep.Labels.Get("openshell.ai/sandbox-id") != "id" || ep.Annotations.Get("openshell.io/sandbox-id") != "id" ||
		len(ep.Owners) != 1 || !ep.Owners[0].Controller || ep.Containers[0].WaitingReason != "ImagePullBackOff" || ep.Containers[0].Image != "img:1" || !co.waiting {
		t.Errorf("enrich pod %+v", ep)
	}
	// A tombstone lookup carries DeletedAt without touching the cached value.
	k := &kindCache{c: c, store: newObjStore(false), tomb: newTombstones(time.Minute, 10), pod: true}
	c.pods = k
	c.changed = make(chan struct{}, 1)
	c.diagnose = make(chan objKey, 1)
	m, _ := newMetrics(nil)
	c.m = m
	k.store.put(co, 1)
	k.added(co)
	if got := <-c.diagnose; got != (objKey{"ns", "p"}) {
		t.Errorf("diagnose key %v", got)
	}
	k.store.remove(objKey{"ns", "p"}, "")
	k.deleted(co)
	got, ok := podLookup{c}.Pod("ns", "p")
	if !ok || got.DeletedAt.IsZero() || co.pod.DeletedAt != (time.Time{}) {
		t.Errorf("tombstone lookup %+v %v; cached DeletedAt %v", got, ok, co.pod.DeletedAt)
	}
}

func TestObjStoreStaleAfterRelist(t *testing.T) {
	s := newObjStore(true)
	mk := func(name, uid, rv string) *cached {
		return &cached{sb: &enrich.Sandbox{Meta: enrich.Meta{Namespace: "ns", Name: name, UID: uid, ResourceVersion: rv}}}
	}
	s.put(mk("a", "ua", "1"), 1)
	s.put(mk("b", "ub", "1"), 1)
	// Listing 2 sees a unchanged and b recreated with a new UID; c is new.
	if !s.touch(objKey{"ns", "a"}, "1", 2) {
		t.Errorf("unchanged a not touched")
	}
	if s.touch(objKey{"ns", "b"}, "5", 2) {
		t.Errorf("changed b touched")
	}
	s.put(mk("b", "ub2", "5"), 2)
	s.put(mk("c", "uc", "6"), 3) // from a later listing
	stale := s.stale(2)
	if len(stale) != 1 || stale[0].meta().Name != "c" {
		t.Errorf("stale %v", stale)
	}
	if _, ok := s.getByUID("ub"); ok {
		t.Errorf("old uid of b still indexed")
	}
	if c, ok := s.getByUID("ub2"); !ok || c.meta().Name != "b" {
		t.Errorf("new uid of b not indexed")
	}
	if s.len() != 2 {
		t.Errorf("len %d", s.len())
	}
}

func TestHealthEndpoints(t *testing.T) {
	a := &Agent{cfg: NewDefaultConfig()}
	a.cfg.LeaderElection.Enabled = false
	h := a.Handler()
	get := func(path string) int {
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, path, nil))
		return rr.Code
	}
	if get("/healthz") != 200 {
		t.Errorf("healthz")
	}
	if get("/readyz") != 503 {
		t.Errorf("readyz before sync should fail")
	}
	a.synced.Store(true)
	a.watchAlive.Store(time.Now().UnixNano())
	if get("/readyz") != 200 {
		t.Errorf("readyz when synced and fresh: %v", a.Ready())
	}
	a.watchAlive.Store(time.Now().Add(-time.Hour).UnixNano())
	if get("/readyz") != 503 {
		t.Errorf("readyz with a stale watch should fail")
	}
	a.watchAlive.Store(time.Now().UnixNano())
	sh := &shipper{}
	sh.inflight = []*flight{{created: time.Now().Add(-time.Hour)}}
	a.cur.Store(sh)
	if get("/readyz") != 503 {
		t.Errorf("readyz with a batch unacknowledged for an hour should fail")
	}
}

// The client paces requests by rest.Config QPS/Burst, as client-go's REST
// client does (paginated LISTs and retries must not flood the API server).
func TestKubeClientRateLimit(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"APIResourceList","resources":[]}`))
	}))
	defer srv.Close()
	kc, err := newKubeClient(&rest.Config{Host: srv.URL, QPS: 20, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range 5 {
		if _, err := kc.getJSON(context.Background(), "/apis/agents.x-k8s.io/v1beta1"); err != nil {
			t.Fatal(err)
		}
	}
	// Burst 1 then 20/s: the 4 requests after the first wait 50 ms each.
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("5 requests at 20 QPS, burst 1, took %s", d)
	}
	if n.Load() != 5 {
		t.Errorf("%d requests served", n.Load())
	}
	unlimited, err := newKubeClient(&rest.Config{Host: srv.URL, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	if unlimited.limiter != nil {
		t.Errorf("QPS < 0 should mean no client-side limit")
	}
}

// Held Events released together may span several batches: each batch's
// cursor must cover only what it (or an earlier batch) carries, or a crash
// between the batches would resume past the Events of the later one.
func TestHeldEventsBatchCursor(t *testing.T) {
	cfg := NewDefaultConfig()
	cfg.Cluster = "c"
	cfg.Ship.BatchSize = 2
	cfg.Ship.MaxInFlight = 10
	cfg.Hold.MaxAge = time.Second
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	enr, err := enrich.New(cfg.Enrich, enrich.Lookups{}) // nothing cached: pod Events are held
	if err != nil {
		t.Fatal(err)
	}
	sh := newShipper(cfg, nil, testLogger(t), m, newDeadLetters(testLogger(t), m))
	p := newProcessor(cfg, nil, nil, enr, sh, "9", testLogger(t), m)
	now := time.Now()
	p.now = func() time.Time { return now }
	ctx := context.Background()
	for _, rv := range []string{"10", "11", "12"} {
		ev := &enrich.Event{APIVersion: "v1", Namespace: "ns", Name: "e" + rv, UID: "uid-" + rv, ResourceVersion: rv,
			Involved: enrich.ObjectRef{Kind: "Pod", APIVersion: "v1", Namespace: "ns", Name: "not-cached"},
			Reason:   "Pulling", Message: "Pulling image", Count: 1, LastTimestamp: now}
		if !p.handle(ctx, item{kind: itemEvent, rv: rv, ev: ev, observed: now}) {
			t.Fatal("handle")
		}
	}
	if len(p.held) != 3 {
		t.Fatalf("%d held, want 3", len(p.held))
	}
	now = now.Add(2 * time.Second) // the hold expires: all three ship
	if !p.retryHeld(ctx) || !p.flush(ctx) {
		t.Fatal("retryHeld/flush")
	}
	shipped := map[string]bool{}
	for _, f := range sh.inflight {
		for _, o := range f.b.GetOccurrences() {
			shipped[o.GetEvent().GetResourceVersion()] = true
		}
		for _, rv := range []string{"10", "11", "12"} {
			if rv <= f.b.GetResourceVersion() && !shipped[rv] {
				t.Errorf("batch %d carries cursor %s but Event %s is in a later batch", f.b.GetSeq(), f.b.GetResourceVersion(), rv)
			}
		}
	}
	if len(shipped) != 3 {
		t.Errorf("shipped %v, want all three", shipped)
	}
}
