package check

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/eventpipe/eventpipe/agent"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/testenv/kube"
)

// TestAgentRBACMatchesRequests runs real agents under the chart's RBAC (the
// control plane of this package applies the chart's ClusterRole and Role for
// the agent's service account) through everything they do against the API:
// the initial listing both ways (watch-list, and LIST+WATCH as against a
// server that refuses watch-list), watches, a relist after 410 Gone,
// leader election (create, renew, release, take-over). The API server's audit log then says which (API
// group, resource, verb) the agent used; the test fails when the chart
// grants one the agent never used, or the agent used one the chart does not
// grant (or was refused anything).
func TestAgentRBACMatchesRequests(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t, 5*time.Minute)
	admin, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}

	col := startTestCollector(t)
	leaseName := ManifestRelease + "-agent"
	newAgent := func(identity string, watchList bool) (stop func()) {
		cfg := agent.NewDefaultConfig()
		cfg.Cluster = "rbac-check"
		cfg.Collector.Address = col.GRPCAddr()
		cfg.Collector.Insecure = true
		cfg.HTTP.Listen = ""
		cfg.Watch.WatchList = watchList
		cfg.Ship.FlushInterval = 50 * time.Millisecond
		cfg.Hold.MaxAge = time.Second
		cfg.LeaderElection = agent.LeaderElectionConfig{Enabled: true, Namespace: kube.AgentNamespace, Name: leaseName,
			Identity: identity, LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond}
		a, err := agent.New(cfg, cluster.AgentConfig(), agent.Options{Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(actx) }()
		stopped := false
		stop = func() {
			if stopped {
				return
			}
			stopped = true
			cancel()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("agent %s: %v", identity, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("agent %s did not stop", identity)
			}
		}
		t.Cleanup(stop)
		return stop
	}
	holder := func() string {
		l, err := admin.CoordinationV1().Leases(kube.AgentNamespace).Get(ctx, leaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}

	ns := "rbac-check"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	events := 0
	emit := func(n int) {
		for i := 0; i < n; i++ {
			pod := fmt.Sprintf("sandbox-%d", events)
			if _, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "example.com/agent:1"}}}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: pod},
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			now := metav1.Now()
			if _, err := admin.CoreV1().Events(ns).Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod, time.Now().UnixNano())},
				InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod, APIVersion: "v1"},
				Reason:         "Pulling", Message: `Pulling image "example.com/agent:1"`, Type: corev1.EventTypeNormal,
				Source: corev1.EventSource{Component: "kubelet"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			events++
		}
	}
	stored := func() int {
		n := 0
		from := uint64(1)
		for {
			recs, _, err := col.Store().Read(ctx, from, 1024)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) == 0 {
				return n
			}
			for _, r := range recs {
				if r.Occurrence.GetNamespace() == ns {
					n++
				}
				from = r.Offset + 1
			}
		}
	}
	// The scenario stops at its first failure; the audit comparison below
	// runs either way (it says which permission was missing).
	func() {
		// Agent a leads with watch-list; b waits (reads the Lease), then takes
		// over when a releases it, listing with LIST+WATCH.
		stopA := newAgent("agent-a", true)
		if !waitUntil(t, time.Minute, "agent-a leads", func() bool { return holder() == "agent-a" }) {
			return
		}
		emit(5)
		if !waitUntil(t, time.Minute, "events delivered by agent-a", func() bool { return stored() >= events }) {
			return
		}
		// A compaction past the cursor: b's watch from it gets 410 Gone and b
		// lists Events again (a paginated LIST: b does not use watch-list).
		// (A watch from resourceVersion r needs r+1 to be kept: two writes.)
		for _, n := range []string{"bump-1", "bump-2"} {
			if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := cluster.Compact(ctx); err != nil {
			t.Fatal(err)
		}
		newAgent("agent-b", false)
		time.Sleep(2 * time.Second) // b polls the held Lease, a renews it
		stopA()
		if !waitUntil(t, 30*time.Second, "agent-b takes over", func() bool { return holder() == "agent-b" }) {
			return
		}
		emit(5)
		if !waitUntil(t, time.Minute, "events delivered by agent-b", func() bool { return stored() >= events }) {
			return
		}
	}()

	used, refused, err := auditedRequests(auditLog, kube.AgentUser)
	if err != nil {
		t.Fatal(err)
	}
	if len(refused) > 0 {
		t.Errorf("the API server refused the agent (the chart lacks a permission it needs): %v", refused)
	}
	granted, err := chartGrants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range sortedKeys(granted) {
		if !used[g] {
			t.Errorf("the chart grants %s, which the agent never used", g)
		}
	}
	for _, u := range sortedKeys(used) {
		if !granted[u] {
			t.Errorf("the agent used %s, which the chart does not grant", u)
		}
	}
	t.Logf("agent requests (group/resource verb) = chart grants: %v", sortedKeys(used))
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func permission(group, resource, verb string) string {
	if group == "" {
		group = "core"
	}
	return group + "/" + resource + " " + verb
}

// auditedRequests reads the audit log: the resource permissions user used
// (non-resource URLs such as discovery are not RBAC rules of the chart), and
// the requests refused with 403.
func auditedRequests(path, user string) (used map[string]bool, refused []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	used = map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev struct {
			User struct {
				Username string `json:"username"`
			} `json:"user"`
			Verb       string `json:"verb"`
			RequestURI string `json:"requestURI"`
			ObjectRef  *struct {
				Resource    string `json:"resource"`
				APIGroup    string `json:"apiGroup"`
				Subresource string `json:"subresource"`
			} `json:"objectRef"`
			ResponseStatus *struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, nil, fmt.Errorf("audit log line: %w", err)
		}
		if ev.User.Username != user {
			continue
		}
		if ev.ResponseStatus != nil && ev.ResponseStatus.Code == 403 {
			refused = append(refused, ev.Verb+" "+ev.RequestURI)
		}
		if ev.ObjectRef == nil {
			continue
		}
		res := ev.ObjectRef.Resource
		if ev.ObjectRef.Subresource != "" {
			res += "/" + ev.ObjectRef.Subresource
		}
		used[permission(ev.ObjectRef.APIGroup, res, ev.Verb)] = true
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	if len(used) == 0 {
		return nil, nil, fmt.Errorf("no request of %s in the audit log %s", user, filepath.Base(path))
	}
	return used, refused, nil
}

// chartGrants expands the chart's ClusterRole and Role rules for the agent
// into permissions. Wildcards and resourceNames fail (they are not least
// privilege, and would make the comparison meaningless).
func chartGrants(ctx context.Context) (map[string]bool, error) {
	docs, err := Render(ctx, root, ManifestRelease, kube.AgentNamespace, nil, nil, "templates/agent-rbac.yaml")
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, d := range docs {
		if d.Kind != "ClusterRole" && d.Kind != "Role" {
			continue
		}
		var r rbacv1.ClusterRole
		if err := yaml.Unmarshal(d.YAML, &r); err != nil {
			return nil, err
		}
		for _, rule := range r.Rules {
			if len(rule.NonResourceURLs) > 0 || len(rule.ResourceNames) > 0 {
				return nil, fmt.Errorf("%s: rule %+v uses nonResourceURLs or resourceNames", d.ID(), rule)
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					for _, v := range rule.Verbs {
						if g == "*" || res == "*" || v == "*" {
							return nil, fmt.Errorf("%s: wildcard in rule %+v", d.ID(), rule)
						}
						out[permission(g, res, v)] = true
					}
				}
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("the chart renders no agent rules")
	}
	return out, nil
}

// startTestCollector runs an insecure in-process collector on loopback.
func startTestCollector(t *testing.T) *collector.Collector {
	t.Helper()
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = 2 * time.Second
	cfg.Auth.Insecure = true
	cfg.Store.Dir = filepath.Join(t.TempDir(), "log")
	c, err := collector.New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("collector: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("collector did not stop")
		}
	})
	return c
}

func waitUntil(t *testing.T, d time.Duration, what string, ok func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Errorf("timed out after %v waiting for %s", d, what)
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}
