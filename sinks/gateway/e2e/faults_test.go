package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/gateway"
	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// TestEndToEndFaults runs the real pipeline (apiserver, agent, collector,
// proxy, test driver, one gateway connection that reopens its
// WatchSandboxes stream 200 ms after any error) through a collector stop
// and restart, a proxy restart, a driver restart and a stream closed and
// reopened by the gateway. Driver RPCs answer while the collector is down;
// every occurrence of the sandbox reaches this gateway, none twice.
func TestEndToEndFaults(t *testing.T) {
	cluster := kube.Start(t)
	pl := startPipeline(t, cluster, withRestarts())
	drv, gw, st := pl.drv, pl.gw, pl.st

	clients, err := scenario.NewClients(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	s, err := scenario.Build("img-missing", scenario.Params{Mode: scenario.ModeShared, Workspace: "faults"})
	if err != nil {
		t.Fatal(err)
	}
	sb := s.Events()[0].Sandbox
	drv.Put(driverSandbox(sb))
	res, err := scenario.Play(context.Background(), clients, s)
	if err != nil {
		t.Fatal(err)
	}
	podUID := res.UIDs["Pod "+sb.Namespace()+"/"+sb.PodName()]
	write := func(reason, container, msg string) {
		t.Helper()
		now := metav1.NewTime(time.Now())
		_, err := kc.CoreV1().Events(sb.Namespace()).Create(context.Background(), &corev1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", sb.PodName(), time.Now().UnixNano()), Namespace: sb.Namespace()},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: sb.Namespace(), Name: sb.PodName(), UID: types.UID(podUID),
				APIVersion: "v1", FieldPath: "spec.containers{" + container + "}"},
			Reason: reason, Message: msg, Type: corev1.EventTypeNormal,
			Source:         corev1.EventSource{Component: "kubelet", Host: sb.Node},
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("write %s: %v", reason, err)
		}
	}
	// all is every stored occurrence of the sandbox; allArrived waits
	// until each reached the gateway.
	all := func() map[string]*eventpipev1.Occurrence {
		out := map[string]*eventpipev1.Occurrence{}
		for _, o := range readAll(t, pl.col) {
			if o.GetSandbox().GetId() == sb.ID {
				out[o.GetEventId()] = o
			}
		}
		return out
	}
	allArrived := func(what string, atLeast int) {
		t.Helper()
		waitFor(t, 60*time.Second, what, func() (bool, string) {
			occ := all()
			got := st.deliveries()
			missing := 0
			for id := range occ {
				if got[id] == 0 {
					missing++
				}
			}
			return len(occ) >= atLeast && missing == 0, fmt.Sprintf("%d stored (want >= %d), %d not at the gateway", len(occ), atLeast, missing)
		})
	}
	allArrived("the played events", len(res.Events))
	n := len(all())

	// 1. Collector down: driver RPCs answer promptly; the failure known
	// before is still reported. A Pulled written meanwhile arrives later.
	pl.stopCollector(t)
	for range 5 {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := gw.Unary(ctx, gatewaytest.MethodGet, protoString(1, sb.ID))
		cancel()
		if err != nil {
			t.Fatalf("GetSandbox with the collector down: %v", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("GetSandbox took %s with the collector down", d)
		}
		sbs, _ := gatewaytest.DecodeSandboxes(r.Bodies[0])
		if _, ok := sbs[0].Condition(gateway.ConditionImage); !ok {
			t.Errorf("the condition vanished while the collector was down")
		}
		time.Sleep(100 * time.Millisecond)
	}
	write("Pulled", "agent", fmt.Sprintf("Successfully pulled image %q in 1s", sb.Image))
	time.Sleep(500 * time.Millisecond)
	pl.startCollector(t)
	allArrived("the Pulled after the collector restart", n+1)
	n = len(all())

	// 2. Proxy restart (the gateway redials the same socket).
	pl.stopProxy(t)
	pl.startProxy(t)
	write("Created", "agent", "Created container: agent")
	allArrived("an event after the proxy restart", n+1)
	n = len(all())

	// 3. Driver restart: the stream breaks and is reopened.
	drv.Stop()
	time.Sleep(300 * time.Millisecond)
	if err := drv.Start(); err != nil {
		t.Fatal(err)
	}
	write("Started", "agent", "Started container agent")
	allArrived("an event after the driver restart", n+1)
	n = len(all())

	// 4. The gateway closes its stream and reopens it.
	st.closeCurrent()
	write("Killing", "agent", "Stopping container agent")
	allArrived("an event after the stream was reopened", n+1)

	time.Sleep(500 * time.Millisecond)
	got := st.deliveries()
	for id, k := range got {
		if k > 1 {
			t.Errorf("occurrence %s reached this gateway %d times", id, k)
		}
	}
	st.mu.Lock()
	streams := st.opened
	st.mu.Unlock()
	if streams < 4 {
		t.Errorf("%d streams were opened; the faults did not break the stream as intended", streams)
	}
	t.Logf("%d occurrences, each delivered once over %d WatchSandboxes streams", len(got), streams)
}
