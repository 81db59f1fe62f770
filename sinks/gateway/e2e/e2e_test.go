package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
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

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
			goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*flushDaemon).run")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func logger() *slog.Logger {
	if os.Getenv("GATEWAY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// run starts fn(ctx) in a goroutine and stops it at cleanup.
func run(t *testing.T, what string, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("%s: %v", what, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop", what)
		}
	})
}

// stream collects the gateway's WatchSandboxes streams: one, or with
// reopen one after another on a single connection.
type stream struct {
	mu       sync.Mutex
	platform []gatewaytest.WatchEvent
	snaps    map[string]gatewaytest.Sandbox
	nsnap    map[string]int
	opened   int                // streams that delivered at least one event
	cancel   context.CancelFunc // ends the current stream
}

// read opens one stream and collects it until it ends.
func (s *stream) read(ctx context.Context, gw *gatewaytest.Client) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.cancel = cancel
	s.mu.Unlock()
	w, err := gw.Watch(ctx)
	if err != nil {
		return err
	}
	for first := true; ; first = false {
		ev, err := w.Recv()
		if err != nil {
			return err
		}
		s.mu.Lock()
		if first {
			s.opened++
		}
		switch {
		case ev.Platform != nil:
			s.platform = append(s.platform, ev)
		case ev.Sandbox != nil:
			s.snaps[ev.Sandbox.ID] = *ev.Sandbox
			s.nsnap[ev.Sandbox.ID]++
		}
		s.mu.Unlock()
	}
}

// closeCurrent ends the current stream, as a gateway closing it would.
func (s *stream) closeCurrent() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		s.cancel()
	}
}

// deliveries counts the platform events of each event id.
func (s *stream) deliveries() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, e := range s.platform {
		out[e.Platform.Metadata[gateway.KeyEventID]]++
	}
	return out
}

func (s *stream) ofSandbox(id string) []gatewaytest.WatchEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []gatewaytest.WatchEvent
	for _, e := range s.platform {
		if e.PlatformSandboxID == id {
			out = append(out, e)
		}
	}
	return out
}

func (s *stream) snapshot(id string) (gatewaytest.Sandbox, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snaps[id], s.nsnap[id]
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	// A condition that keeps failing is polled less often (50 ms up to
	// 250 ms): the blocker subtests wait side by side, each reading the
	// whole store and asking the proxy three ways per poll.
	pause := 50 * time.Millisecond
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", d, what, detail)
		}
		time.Sleep(pause)
		pause = min(2*pause, 250*time.Millisecond)
	}
}

type played struct {
	name   string
	mode   scenario.Mode
	sb     scenario.Sandbox
	res    *scenario.Result
	role   string // image role of the failing image
	image  string
	podUID string
}

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

// stop ends the component (once) and reports its error.
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

// pipeline is the real pipeline from a cluster to a gateway client: the
// agent, a collector, the proxy in front of the test driver, and the
// gateway's WatchSandboxes stream read into st. The collector and the
// proxy can be stopped and started again (fault tests).
type pipeline struct {
	drv *gatewaytest.Driver
	gw  *gatewaytest.Client
	st  *stream

	ccfg   collector.Config
	pcfg   gateway.Config
	col    *collector.Collector
	colR   *restartable
	preg   *prometheus.Registry
	proxyR *restartable
}

// pipelineOption changes what startPipeline starts.
type pipelineOption func(*pipelineOptions)

type pipelineOptions struct{ restarts bool }

// withRestarts readies the pipeline for restarts of its parts: the proxy
// keeps its Follow position in a state file and redials the collector
// within a second, and the gateway reopens its stream 200 ms after any
// error instead of failing the test.
func withRestarts() pipelineOption { return func(o *pipelineOptions) { o.restarts = true } }

// startCollector starts the collector; after the first start on the
// address the first one got (retried while the old listener lets go).
func (p *pipeline) startCollector(t *testing.T) {
	t.Helper()
	var err error
	for range 50 {
		if p.col, err = collector.New(p.ccfg, nil, prometheus.NewRegistry()); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	p.ccfg.GRPC.Listen = p.col.GRPCAddr()
	p.colR = startR(p.col.Run)
}

func (p *pipeline) stopCollector(t *testing.T) { t.Helper(); p.colR.stop(t, "collector") }

// startProxy starts the proxy and waits until it serves.
func (p *pipeline) startProxy(t *testing.T) {
	t.Helper()
	p.preg = prometheus.NewRegistry()
	proxy, err := gateway.New(p.pcfg, logger(), p.preg)
	if err != nil {
		t.Fatal(err)
	}
	p.proxyR = startR(proxy.Run)
	<-proxy.Ready()
}

func (p *pipeline) stopProxy(t *testing.T) { t.Helper(); p.proxyR.stop(t, "proxy") }

// startPipeline starts the pipeline on cluster and returns once the agent
// is ready, the gateway's stream is open and the proxy follows the
// collector. Everything stops at the test's cleanup.
func startPipeline(t *testing.T, cluster *kube.Cluster, opts ...pipelineOption) *pipeline {
	t.Helper()
	var o pipelineOptions
	for _, opt := range opts {
		opt(&o)
	}
	dir, err := os.MkdirTemp("/tmp", "gwe2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	p := &pipeline{ccfg: collector.NewDefaultConfig()}
	p.ccfg.GRPC.Listen, p.ccfg.HTTP.Listen = "127.0.0.1:0", "127.0.0.1:0"
	p.ccfg.GRPC.ShutdownGrace = time.Second
	p.ccfg.Auth.Insecure = true
	p.ccfg.Store.Dir = filepath.Join(dir, "log")
	p.startCollector(t)
	t.Cleanup(func() { p.stopCollector(t) })

	acfg := agent.NewDefaultConfig()
	acfg.Cluster = "e2e"
	acfg.Collector.Address = p.col.GRPCAddr()
	acfg.Collector.Insecure = true
	acfg.HTTP.Listen = ""
	acfg.LeaderElection.Enabled = false
	acfg.Ship.FlushInterval = 50 * time.Millisecond
	acfg.Hold.MaxAge = 5 * time.Second
	acfg.Hold.RetryInterval = 100 * time.Millisecond
	ag, err := agent.New(acfg, cluster.AgentConfig(), agent.Options{Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "agent", ag.Run)

	if p.drv, err = gatewaytest.StartDriver(filepath.Join(dir, "driver", "driver.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.drv.Stop)
	p.pcfg = gateway.NewDefaultConfig()
	p.pcfg.Listen = filepath.Join(dir, "proxy", "proxy.sock")
	p.pcfg.Driver = p.drv.Path
	p.pcfg.GatewayID = scenario.DefaultGateway
	p.pcfg.Collector.Address = p.col.GRPCAddr()
	p.pcfg.Collector.Insecure = true
	if o.restarts {
		p.pcfg.Follow.BackoffMin, p.pcfg.Follow.BackoffMax = 100*time.Millisecond, time.Second
		p.pcfg.Follow.StateFile = filepath.Join(dir, "proxy", "state")
	}
	p.startProxy(t)
	t.Cleanup(func() { p.stopProxy(t) })

	if p.gw, err = gatewaytest.Dial(p.pcfg.Listen); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.gw.Close() })
	p.st = &stream{snaps: map[string]gatewaytest.Sandbox{}, nsnap: map[string]int{}}
	run(t, "gateway stream", func(ctx context.Context) error {
		for {
			err := p.st.read(ctx, p.gw)
			if ctx.Err() != nil {
				return nil
			}
			if !o.restarts {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	waitFor(t, 60*time.Second, "agent ready", func() (bool, string) { return ag.Ready() == nil, fmt.Sprint(ag.Ready()) })
	if err := p.drv.WaitWatchers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	// The driver's own kubernetes events are replaced only while the
	// proxy's Follow stream is live (before, they pass: fail open).
	waitFor(t, 30*time.Second, "the proxy following the collector", func() (bool, string) {
		mfs, err := p.preg.Gather()
		if err != nil {
			return false, err.Error()
		}
		for _, mf := range mfs {
			if mf.GetName() == "eventpipe_driver_proxy_follow_connected" && len(mf.GetMetric()) == 1 {
				return mf.GetMetric()[0].GetGauge().GetValue() == 1, ""
			}
		}
		return false, "no follow_connected gauge"
	})
	return p
}

// TestEndToEndSeedScenarios: the seed scenarios (workload image missing,
// supervisor image bad tag) in shared and managed mode, played into the
// real kube-apiserver, go through the real agent, the real collector and
// the proxy to a gateway client: every attributed occurrence arrives once
// as a platform event with its keys, the driver's own kubernetes events do
// not, ImagePulled=False is on WatchSandboxes snapshots, GetSandbox and
// ListSandboxes until a Pulled of the agent container (of the supervisor
// container, for the supervisor pod), and pulling_image completes only on
// the agent container's Pulled.
func TestEndToEndSeedScenarios(t *testing.T) {
	cluster := kube.Start(t)
	pl := startPipeline(t, cluster)
	col, drv, gw, st := pl.col, pl.drv, pl.gw, pl.st
	clients, err := scenario.NewClients(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		mode scenario.Mode
		gen  scenario.Generation
	}{
		{"img-missing", scenario.ModeShared, scenario.Newer},
		{"img-missing", scenario.ModeManaged, scenario.Newer},
		{"sup-bad", scenario.ModeShared, scenario.Older},
		{"sup-bad", scenario.ModeManaged, scenario.Older},
		{"sup-bad", scenario.ModeManaged, scenario.Newer},
	}
	var all []*played
	for i, c := range cases {
		s, err := scenario.Build(c.name, scenario.Params{Mode: c.mode, Workspace: fmt.Sprintf("e2e%d", i), Generation: c.gen})
		if err != nil {
			t.Fatal(err)
		}
		sb := s.Events()[0].Sandbox
		gen := "newer"
		if c.gen == scenario.Older {
			gen = "older"
		}
		p := &played{name: fmt.Sprintf("%s/%s/%s", c.mode, c.name, gen), mode: c.mode, sb: sb}
		if c.name == "img-missing" {
			p.role, p.image = eventpipev1.ImageRoleWorkload, sb.Image
		} else {
			p.role, p.image = eventpipev1.ImageRoleSupervisor, sb.SupervisorImage
		}
		// The gateway knows the sandbox before Kubernetes does.
		drv.Put(driverSandbox(sb))
		if c.mode == scenario.ModeShared {
			// The driver's own (supervisor-less, wrong-progress) event.
			drv.Platform(sb.ID, gatewaytest.PlatformEvent{TimestampMS: time.Now().UnixMilli(), Source: "kubernetes",
				Type: "Normal", Reason: "Pulled", Message: "the driver's own event",
				Metadata: map[string]string{"openshell.progress.complete_step": "pulling_image"}})
		}
		if p.res, err = scenario.Play(context.Background(), clients, s); err != nil {
			t.Fatalf("play %s: %v", p.name, err)
		}
		p.podUID = p.res.UIDs["Pod "+sb.Namespace()+"/"+sb.PodName()]
		all = append(all, p)
	}

	for _, p := range all {
		t.Run(p.name, func(t *testing.T) {
			id := p.sb.ID
			stored := func() map[string]*eventpipev1.Occurrence {
				out := map[string]*eventpipev1.Occurrence{}
				for _, o := range readAll(t, col) {
					if o.GetSandbox().GetId() == id {
						out[o.GetEventId()] = o
					}
				}
				return out
			}
			// Every Event played was stored, and every stored occurrence
			// reached the stream.
			waitFor(t, 60*time.Second, "the played events at the gateway", func() (bool, string) {
				occ := stored()
				events := 0
				for _, o := range occ {
					if o.GetPullFailure().GetSource() != eventpipev1.PullSourcePodStatus {
						events++
					}
				}
				got := st.ofSandbox(id)
				return events >= len(p.res.Events) && len(got) >= len(occ), fmt.Sprintf("%d/%d events stored, %d of %d at the gateway", events, len(p.res.Events), len(got), len(occ))
			})
			checkFailure(t, p, st, gw, drv, true)

			pulledID := writePulled(t, kc, p)
			waitFor(t, 30*time.Second, "the Pulled at the gateway", func() (bool, string) {
				for _, e := range st.ofSandbox(id) {
					if strings.HasPrefix(e.Platform.Metadata[gateway.KeyEventID], pulledID+"/") {
						return true, ""
					}
				}
				return false, fmt.Sprintf("%d events", len(st.ofSandbox(id)))
			})
			checkFailure(t, p, st, gw, drv, false)

			evs := st.ofSandbox(id)
			occ := stored()
			seen := map[string]int{}
			for _, e := range evs {
				md := e.Platform.Metadata
				seen[md[gateway.KeyEventID]]++
				if e.Platform.Message == "the driver's own event" {
					t.Errorf("the driver's own kubernetes event reached the gateway")
				}
				o := occ[md[gateway.KeyEventID]]
				if o == nil {
					t.Errorf("platform event %s not in the collector", md[gateway.KeyEventID])
					continue
				}
				for _, k := range []string{gateway.KeyInvolvedKind, gateway.KeyInvolvedName, gateway.KeyNamespace, gateway.KeyCount} {
					if md[k] == "" {
						t.Errorf("event %s (%s) lacks %s: %v", o.GetEventId(), o.GetReason(), k, md)
					}
				}
				if e.Platform.Source != "kubernetes" || e.Platform.Reason != o.GetReason() || e.Platform.Type != o.GetType() {
					t.Errorf("event %s: %+v", o.GetEventId(), e.Platform)
				}
				if pf := o.GetPullFailure(); pf != nil {
					if md[gateway.KeyPullCause] != eventpipev1.CategoryNotFound || md[gateway.KeyDisposition] == "" || md[gateway.KeyImage] != p.image || md[gateway.KeyImageRole] != p.role {
						t.Errorf("pull failure %s keys: %v", o.GetEventId(), md)
					}
				}
				if md[gateway.KeyCompleteStep] == eventpipev1.StepPullingImage && (md[gateway.KeyContainer] != "agent" || e.Platform.Reason != "Pulled") {
					t.Errorf("pulling_image completed by %s of container %q", e.Platform.Reason, md[gateway.KeyContainer])
				}
			}
			for id, n := range seen {
				if n != 1 {
					t.Errorf("occurrence %s reached the stream %d times", id, n)
				}
			}
			for id := range occ {
				if seen[id] == 0 {
					t.Errorf("occurrence %s (%s) never reached the stream", id, occ[id].GetReason())
				}
			}
			completed := 0
			for _, e := range evs {
				if e.Platform.Metadata[gateway.KeyCompleteStep] == eventpipev1.StepPullingImage {
					completed++
				}
			}
			if completed == 0 {
				t.Errorf("pulling_image never completed (the agent's Pulled carries it)")
			}
			failures := 0
			for _, o := range occ {
				if o.GetPullFailure() != nil {
					failures++
				}
			}
			t.Logf("%d occurrences stored, %d platform events at the gateway (%d pull failures, %d completing pulling_image)", len(occ), len(evs), failures, completed)
		})
	}
}

func driverSandbox(sb scenario.Sandbox) gatewaytest.Sandbox {
	return gatewaytest.Sandbox{ID: sb.ID, Name: sb.Name, Namespace: sb.Namespace(), Workspace: sb.Workspace,
		Conditions: []gatewaytest.Condition{{Type: "Ready", Status: "False", Reason: scenario.ReadyReasonNotReady,
			Message: "Pod exists with phase: Pending", LastTransitionTime: time.Now().UTC().Format(time.RFC3339)}}}
}

// checkFailure checks the condition on a fresh snapshot, Get and List.
func checkFailure(t *testing.T, p *played, st *stream, gw *gatewaytest.Client, drv *gatewaytest.Driver, want bool) {
	t.Helper()
	check := func(where string, s gatewaytest.Sandbox) (bool, string) {
		c, has := s.Condition(gateway.ConditionImage)
		ready, _ := s.Condition("Ready")
		if ready.Status != "False" || ready.Reason != scenario.ReadyReasonNotReady {
			return false, fmt.Sprintf("%s: Ready changed: %+v", where, ready)
		}
		if !want {
			if has || strings.Contains(ready.Message, "[eventpipe]") {
				return false, fmt.Sprintf("%s: still failing: %+v / %q", where, c, ready.Message)
			}
			return true, ""
		}
		if !has || c.Status != "False" || c.Reason != "NotFound" {
			return false, fmt.Sprintf("%s: condition %+v (has %v)", where, c, has)
		}
		for _, w := range []string{p.role + " image " + p.image, "attempts", "not found"} {
			if !strings.Contains(c.Message, w) {
				return false, fmt.Sprintf("%s: message %q lacks %q", where, c.Message, w)
			}
		}
		if !strings.Contains(ready.Message, "[eventpipe] "+c.Message) {
			return false, fmt.Sprintf("%s: Ready message %q", where, ready.Message)
		}
		return true, ""
	}
	checkAnswers(t, st, gw, drv, driverSandbox(p.sb), fmt.Sprintf("condition present=%v", want), check)
}

// checkAnswers waits until check holds for the sandbox sb as GetSandbox,
// ListSandboxes and a fresh WatchSandboxes snapshot (after the driver Puts
// sb again) answer it through the proxy.
func checkAnswers(t *testing.T, st *stream, gw *gatewaytest.Client, drv *gatewaytest.Driver, sb gatewaytest.Sandbox, what string,
	check func(where string, s gatewaytest.Sandbox) (bool, string)) {
	t.Helper()
	checkAnswersWithin(t, 20*time.Second, st, gw, drv, sb, what, check)
}

// checkAnswersWithin is checkAnswers waiting up to d (for a cluster that
// has to act first).
func checkAnswersWithin(t *testing.T, d time.Duration, st *stream, gw *gatewaytest.Client, drv *gatewaytest.Driver, sb gatewaytest.Sandbox, what string,
	check func(where string, s gatewaytest.Sandbox) (bool, string)) {
	t.Helper()
	id := sb.ID
	waitFor(t, d, what+" on Get, List and a snapshot", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := gw.Unary(ctx, gatewaytest.MethodGet, protoString(1, id))
		if err != nil {
			return false, err.Error()
		}
		got, err := gatewaytest.DecodeSandboxes(r.Bodies[0])
		if err != nil || len(got) != 1 {
			return false, fmt.Sprintf("GetSandbox answer %x: %d sandboxes (%v)", r.Bodies[0], len(got), err)
		}
		if ok, why := check("GetSandbox", got[0]); !ok {
			return false, why
		}
		r, err = gw.Unary(ctx, gatewaytest.MethodList, nil)
		if err != nil {
			return false, err.Error()
		}
		list, _ := gatewaytest.DecodeSandboxes(r.Bodies[0])
		for _, s := range list {
			if s.ID == id {
				if ok, why := check("ListSandboxes", s); !ok {
					return false, why
				}
			}
		}
		_, n := st.snapshot(id)
		drv.Put(sb)
		deadline := time.Now().Add(5 * time.Second)
		for {
			s, m := st.snapshot(id)
			if m > n {
				return check("WatchSandboxes", s)
			}
			if time.Now().After(deadline) {
				return false, "no new snapshot"
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

func protoString(num byte, s string) []byte {
	return append([]byte{num<<3 | 2, byte(len(s))}, s...)
}

// writePulled writes the kubelet's Pulled event: of the agent container,
// or of the supervisor container for a supervisor pod's failure. It
// returns the Event's UID.
func writePulled(t *testing.T, kc kubernetes.Interface, p *played) string {
	t.Helper()
	sb := p.sb
	pod, podUID, container, image := sb.PodName(), p.podUID, "agent", sb.Image
	if p.role == eventpipev1.ImageRoleSupervisor && sb.HasSupervisorPod() {
		pod, container, image = sb.SupervisorPodName(), "supervisor", sb.SupervisorImage
		podUID = p.res.UIDs["Pod "+sb.Namespace()+"/"+pod]
	}
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod, time.Now().UnixNano()), Namespace: sb.Namespace()},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: sb.Namespace(), Name: pod, UID: types.UID(podUID),
			APIVersion: "v1", FieldPath: "spec.containers{" + container + "}"},
		Reason:         "Pulled",
		Message:        fmt.Sprintf("Successfully pulled image %q in 1.2s (1.2s including waiting). Image size: 2155861 bytes.", image),
		Source:         corev1.EventSource{Component: "kubelet", Host: sb.Node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1, Type: corev1.EventTypeNormal,
	}
	created, err := kc.CoreV1().Events(sb.Namespace()).Create(context.Background(), ev, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("write Pulled: %v", err)
	}
	return string(created.UID)
}

func readAll(t *testing.T, c *collector.Collector) []*eventpipev1.Occurrence {
	t.Helper()
	var out []*eventpipev1.Occurrence
	from := uint64(1)
	for {
		recs, _, err := c.Store().Read(context.Background(), from, 4096)
		if err != nil {
			t.Fatalf("read store: %v", err)
		}
		if len(recs) == 0 {
			return out
		}
		for _, r := range recs {
			out = append(out, r.Occurrence)
			from = r.Offset + 1
		}
	}
}
