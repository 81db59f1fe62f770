package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/eventpipe/eventpipe/agent"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/sinks/gateway"
	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// restartable runs a component that can be stopped and started again.
type restartable struct {
	cancel context.CancelFunc
	done   chan error
}

func startR(fn func(context.Context) error) *restartable {
	ctx, cancel := context.WithCancel(context.Background())
	r := &restartable{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- fn(ctx) }()
	return r
}

func (r *restartable) stop(t *testing.T, what string) {
	t.Helper()
	if r == nil || r.cancel == nil {
		return
	}
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", what, err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("%s did not stop", what)
	}
	r.cancel = nil
}

// TestEndToEndFaults runs the real pipeline (apiserver, agent, collector,
// proxy, test driver, one gateway connection that reopens its
// WatchSandboxes stream 200 ms after any error) through a collector stop
// and restart, a proxy restart, a driver restart and a stream closed and
// reopened by the gateway. Driver RPCs answer while the collector is down;
// every occurrence of the sandbox reaches this gateway, none twice.
func TestEndToEndFaults(t *testing.T) {
	cluster := kube.Start(t)
	dir := t.TempDir()
	sockDir := shortTemp(t)

	var col *collector.Collector
	var colR *restartable
	colAddr := "127.0.0.1:0"
	startCol := func() {
		cfg := collector.NewDefaultConfig()
		cfg.GRPC.Listen, cfg.HTTP.Listen = colAddr, "127.0.0.1:0"
		cfg.GRPC.ShutdownGrace = time.Second
		cfg.Auth.Insecure = true
		cfg.Store.Dir = filepath.Join(dir, "log")
		var err error
		for range 50 {
			if col, err = collector.New(cfg, nil, prometheus.NewRegistry()); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		colAddr = col.GRPCAddr()
		colR = startR(col.Run)
	}
	startCol()
	t.Cleanup(func() { colR.stop(t, "collector") })

	acfg := agent.NewDefaultConfig()
	acfg.Cluster = "e2e-faults"
	acfg.Collector.Address = colAddr
	acfg.Collector.Insecure = true
	acfg.HTTP.Listen = ""
	acfg.LeaderElection.Enabled = false
	acfg.Ship.FlushInterval = 50 * time.Millisecond
	ag, err := agent.New(acfg, cluster.AgentConfig(), agent.Options{Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "agent", ag.Run)

	drv, err := gatewaytest.StartDriver(filepath.Join(sockDir, "driver", "driver.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drv.Stop)
	pcfg := gateway.NewDefaultConfig()
	pcfg.Listen = filepath.Join(sockDir, "proxy", "proxy.sock")
	pcfg.Driver = drv.Path
	pcfg.GatewayID = scenario.DefaultGateway
	pcfg.Collector.Address = colAddr
	pcfg.Collector.Insecure = true
	pcfg.Follow.BackoffMin, pcfg.Follow.BackoffMax = 100*time.Millisecond, time.Second
	pcfg.Follow.StateFile = filepath.Join(sockDir, "proxy", "state")
	var proxyR *restartable
	startProxy := func() {
		p, err := gateway.New(pcfg, logger(), nil)
		if err != nil {
			t.Fatal(err)
		}
		proxyR = startR(p.Run)
		<-p.Ready()
	}
	startProxy()
	t.Cleanup(func() { proxyR.stop(t, "proxy") })

	gw, err := gatewaytest.Dial(pcfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	// The gateway's side: one connection, the stream reopened after errors.
	var mu sync.Mutex
	got := map[string]int{} // event id -> deliveries to this gateway
	streams := 0
	var cur context.CancelFunc
	gctx, gcancel := context.WithCancel(context.Background())
	gdone := make(chan struct{})
	go func() {
		defer close(gdone)
		for gctx.Err() == nil {
			sctx, scancel := context.WithCancel(gctx)
			mu.Lock()
			cur = scancel
			mu.Unlock()
			if w, err := gw.Watch(sctx); err == nil {
				opened := false
				for {
					ev, err := w.Recv()
					if err != nil {
						break
					}
					mu.Lock()
					if !opened {
						streams++
						opened = true
					}
					if ev.Platform != nil {
						got[ev.Platform.Metadata[gateway.KeyEventID]]++
					}
					mu.Unlock()
				}
			}
			scancel()
			select {
			case <-gctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { gcancel(); <-gdone })
	waitFor(t, 60*time.Second, "agent ready", func() (bool, string) { return ag.Ready() == nil, fmt.Sprint(ag.Ready()) })

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
		for _, o := range readAll(t, col) {
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
			mu.Lock()
			defer mu.Unlock()
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
	colR.stop(t, "collector")
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
	startCol()
	allArrived("the Pulled after the collector restart", n+1)
	n = len(all())

	// 2. Proxy restart (the gateway redials the same socket).
	proxyR.stop(t, "proxy")
	startProxy()
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
	mu.Lock()
	cur()
	mu.Unlock()
	write("Killing", "agent", "Stopping container agent")
	allArrived("an event after the stream was reopened", n+1)

	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for id, k := range got {
		if k > 1 {
			t.Errorf("occurrence %s reached this gateway %d times", id, k)
		}
	}
	if streams < 4 {
		t.Errorf("%d streams were opened; the faults did not break the stream as intended", streams)
	}
	t.Logf("%d occurrences, each delivered once over %d WatchSandboxes streams", len(got), streams)
}

func shortTemp(t *testing.T) string {
	t.Helper()
	// Unix socket paths hold 107 bytes: t.TempDir() names can be longer.
	d, err := os.MkdirTemp("/tmp", "gwe2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
