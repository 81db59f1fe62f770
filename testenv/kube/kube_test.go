package kube_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/testenv/crds"
	"github.com/eventpipe/eventpipe/testenv/kube"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func clients(t *testing.T) (admin, agent kubernetes.Interface) {
	t.Helper()
	a, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	g, err := kubernetes.NewForConfig(cluster.AgentConfig())
	if err != nil {
		t.Fatal(err)
	}
	return a, g
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestVersionAndKubeconfig(t *testing.T) {
	ctx := ctxT(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", cluster.Kubeconfig())
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version through kubeconfig: %v", err)
	}
	if v.GitVersion != "v1.37.2" {
		t.Errorf("server version = %q, want v1.37.2", v.GitVersion)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, kube.AgentNamespace, metav1.GetOptions{}); err != nil {
		t.Errorf("get namespace %s: %v", kube.AgentNamespace, err)
	}
}

func TestAgentRBAC(t *testing.T) {
	ctx := ctxT(t)
	admin, agent := clients(t)
	ns := "rbac-test"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "os-supervisor-x-1"},
		StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cluster.AgentConfig())
	if err != nil {
		t.Fatal(err)
	}

	allowed := map[string]func() error{
		"list core events": func() error { _, err := agent.CoreV1().Events("").List(ctx, metav1.ListOptions{}); return err },
		"list pods":        func() error { _, err := agent.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); return err },
		"list pvcs": func() error {
			_, err := agent.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list namespaces":         func() error { _, err := agent.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); return err },
		"list sandboxes v1beta1":  func() error { _, err := dyn.Resource(crds.SandboxV1beta1).List(ctx, metav1.ListOptions{}); return err },
		"list sandboxes v1alpha1": func() error { _, err := dyn.Resource(crds.SandboxV1alpha1).List(ctx, metav1.ListOptions{}); return err },
		"watch core events":       watchOnce(ctx, func(o metav1.ListOptions) (watch.Interface, error) { return agent.CoreV1().Events("").Watch(ctx, o) }),
		"watch pods":              watchOnce(ctx, func(o metav1.ListOptions) (watch.Interface, error) { return agent.CoreV1().Pods("").Watch(ctx, o) }),
		"watch pvcs": watchOnce(ctx, func(o metav1.ListOptions) (watch.Interface, error) {
			return agent.CoreV1().PersistentVolumeClaims("").Watch(ctx, o)
		}),
		"watch namespaces": watchOnce(ctx, func(o metav1.ListOptions) (watch.Interface, error) { return agent.CoreV1().Namespaces().Watch(ctx, o) }),
		"watch sandboxes": watchOnce(ctx, func(o metav1.ListOptions) (watch.Interface, error) {
			return dyn.Resource(crds.SandboxV1beta1).Watch(ctx, o)
		}),
		"create lease in eventpipe": func() error {
			_, err := agent.CoordinationV1().Leases(kube.AgentNamespace).Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: "eventpipe-agent"}}, metav1.CreateOptions{})
			return err
		},
		"get and update lease in eventpipe": func() error {
			l, err := agent.CoordinationV1().Leases(kube.AgentNamespace).Get(ctx, "eventpipe-agent", metav1.GetOptions{})
			if err != nil {
				return err
			}
			holder := "agent-0"
			l.Spec.HolderIdentity = &holder
			_, err = agent.CoordinationV1().Leases(kube.AgentNamespace).Update(ctx, l, metav1.UpdateOptions{})
			return err
		},
	}
	for _, name := range sortedKeys(allowed) {
		if err := allowed[name](); err != nil {
			t.Errorf("agent: %s: %v", name, err)
		}
	}

	forbidden := map[string]func() error{
		"list secrets": func() error { _, err := agent.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); return err },
		"get secret": func() error {
			_, err := agent.CoreV1().Secrets(ns).Get(ctx, "os-supervisor-x-1", metav1.GetOptions{})
			return err
		},
		"watch secrets":   func() error { _, err := agent.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{}); return err },
		"list configmaps": func() error { _, err := agent.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{}); return err },
		"create core event": func() error {
			_, err := agent.CoreV1().Events(ns).Create(ctx, coreEvent(ns, "x"), metav1.CreateOptions{})
			return err
		},
		"create events.k8s.io": func() error {
			_, err := agent.EventsV1().Events(ns).Create(ctx, eventsEvent(ns, "x"), metav1.CreateOptions{})
			return err
		},
		"delete pod": func() error { return agent.CoreV1().Pods(ns).Delete(ctx, "x", metav1.DeleteOptions{}) },
		// The agent reads core/v1 Events only and never GETs single objects
		// (its ClusterRole grants list and watch: deploy/check compares it
		// with the requests a real agent makes).
		"list events.k8s.io": func() error { _, err := agent.EventsV1().Events("").List(ctx, metav1.ListOptions{}); return err },
		"get namespace":      func() error { _, err := agent.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); return err },
		"get pod":            func() error { _, err := agent.CoreV1().Pods(ns).Get(ctx, "x", metav1.GetOptions{}); return err },
		"create lease elsewhere": func() error {
			_, err := agent.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		},
		"delete sandbox": func() error {
			return dyn.Resource(crds.SandboxV1beta1).Namespace(ns).Delete(ctx, "x", metav1.DeleteOptions{})
		},
	}
	for _, name := range sortedKeys(forbidden) {
		if err := forbidden[name](); !apierrors.IsForbidden(err) {
			t.Errorf("agent: %s: got %v, want Forbidden", name, err)
		}
	}
}

func watchOnce(ctx context.Context, w func(metav1.ListOptions) (watch.Interface, error)) func() error {
	return func() error {
		wi, err := w(metav1.ListOptions{})
		if err != nil {
			return err
		}
		wi.Stop()
		return nil
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func coreEvent(ns, name string) *corev1.Event {
	now := metav1.Now()
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", name, time.Now().UnixNano()), Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: name},
		Reason:         "Pulling", Message: "Pulling image \"busybox\"", Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: "kubelet", Host: "node-1"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
}

func eventsEvent(ns, name string) *eventsv1.Event {
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", name, time.Now().UnixNano()), Namespace: ns},
		EventTime:  metav1.NowMicro(), ReportingController: "default-scheduler", ReportingInstance: "default-scheduler-node-1",
		Action: "Binding", Reason: "Scheduled", Note: "Successfully assigned", Type: corev1.EventTypeNormal,
		Regarding: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: name},
	}
}

// A forced compaction makes a watch of Events from an older resourceVersion
// answer 410 Gone (Events are not watch-cached, so etcd's compaction shows).
func TestCompactionGivesGone(t *testing.T) {
	ctx := ctxT(t)
	admin, agent := clients(t)
	ns := "compact-test"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first, err := admin.CoreV1().Events(ns).Create(ctx, coreEvent(ns, "a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldRV := first.ResourceVersion
	for i := range 5 {
		if _, err := admin.CoreV1().Events(ns).Create(ctx, coreEvent(ns, fmt.Sprintf("b%d", i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Before compaction the old resourceVersion still works.
	w, err := agent.CoreV1().Events(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: oldRV})
	if err != nil {
		t.Fatalf("watch from %s before compaction: %v", oldRV, err)
	}
	select {
	case ev := <-w.ResultChan():
		if ev.Type == watch.Error {
			t.Fatalf("watch from %s before compaction: %v", oldRV, apierrors.FromObject(ev.Object))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch before compaction delivered nothing")
	}
	w.Stop()

	rev, err := cluster.Compact(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("compacted at revision %d; old resourceVersion %s", rev, oldRV)

	for _, api := range []string{"v1", "events.k8s.io/v1"} {
		var wi watch.Interface
		if api == "v1" {
			wi, err = agent.CoreV1().Events(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: oldRV})
		} else {
			// The agent may not read events.k8s.io (it reads core/v1 only).
			wi, err = admin.EventsV1().Events(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: oldRV})
		}
		if err == nil {
			// The apiserver may accept the watch and send the 410 as its first event.
			select {
			case ev, ok := <-wi.ResultChan():
				if !ok {
					t.Fatalf("%s watch closed without an error", api)
				}
				if ev.Type != watch.Error {
					t.Fatalf("%s watch from compacted %s: got %s event, want Error 410", api, oldRV, ev.Type)
				}
				err = apierrors.FromObject(ev.Object)
			case <-time.After(10 * time.Second):
				t.Fatalf("%s watch from compacted %s: no answer", api, oldRV)
			}
			wi.Stop()
		}
		if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
			t.Errorf("%s watch from compacted %s: got %v, want 410 Gone", api, oldRV, err)
		}
	}
	// An exact list at the old resourceVersion is gone too.
	_, err = agent.CoreV1().Events(ns).List(ctx, metav1.ListOptions{ResourceVersion: oldRV, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Errorf("exact list at compacted %s: got %v, want 410 Gone", oldRV, err)
	}
	// Compacting again with nothing new written is not an error.
	if _, err := cluster.Compact(ctx); err != nil {
		t.Errorf("second compaction: %v", err)
	}
}

func TestAPIRequestCounting(t *testing.T) {
	ctx := ctxT(t)
	_, agent := clients(t)
	f := kube.RequestFilter{Resource: "events", Verb: "LIST", Group: ""}
	before, err := cluster.APIRequestCount(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := agent.CoreV1().Events("default").List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The counter is updated when a request completes; poll briefly.
	deadline := time.Now().Add(10 * time.Second)
	for {
		after, err := cluster.APIRequestCount(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if after-before == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events LIST count went %v -> %v, want +3", before, after)
		}
		time.Sleep(100 * time.Millisecond)
	}
	series, err := cluster.APIRequests(ctx, kube.RequestFilter{Resource: "events", Verb: "list"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range series {
		if s.Resource != "events" || s.Verb != "LIST" {
			t.Errorf("filter let through %+v", s)
		}
	}
}

func TestRestartAPIServer(t *testing.T) {
	ctx := ctxT(t)
	admin, _ := clients(t)
	etcdBefore, apiBefore := cluster.PIDs()
	start := time.Now()
	if err := cluster.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver restarted in %v", time.Since(start).Round(time.Millisecond))
	etcdAfter, apiAfter := cluster.PIDs()
	if apiAfter == apiBefore || kube.ProcessAlive(apiBefore) {
		t.Errorf("kube-apiserver pid %d -> %d; old alive=%v", apiBefore, apiAfter, kube.ProcessAlive(apiBefore))
	}
	if etcdAfter != etcdBefore {
		t.Errorf("etcd restarted too: pid %d -> %d", etcdBefore, etcdAfter)
	}
	// Data survives (etcd kept running) and the same clients work again.
	if _, err := admin.CoreV1().Namespaces().Get(ctx, kube.AgentNamespace, metav1.GetOptions{}); err != nil {
		t.Errorf("after restart: %v", err)
	}
}

// A second, separately started cluster stops without leaving a process or
// a listening port behind.
func TestStartStopLeavesNothing(t *testing.T) {
	var etcdPID, apiPID int
	var url, etcdURL string
	t.Run("run", func(t *testing.T) {
		start := time.Now()
		c := kube.Start(t)
		t.Logf("second control plane started in %v", time.Since(start).Round(time.Millisecond))
		etcdPID, apiPID = c.PIDs()
		url, etcdURL = c.URL(), c.EtcdURL()
		if !kube.ProcessAlive(etcdPID) || !kube.ProcessAlive(apiPID) {
			t.Fatalf("processes not running: etcd %d apiserver %d", etcdPID, apiPID)
		}
	}) // t.Cleanup of the subtest stops it
	for name, pid := range map[string]int{"etcd": etcdPID, "kube-apiserver": apiPID} {
		if kube.ProcessAlive(pid) {
			t.Errorf("%s pid %d alive after cleanup", name, pid)
		}
	}
	for _, u := range []string{url, etcdURL} {
		host := u[strings.Index(u, "//")+2:]
		if conn, err := net.DialTimeout("tcp", host, time.Second); err == nil {
			conn.Close()
			t.Errorf("%s still accepts connections", host)
		}
	}
}
