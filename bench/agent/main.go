// Command agent is the agent's end-to-end benchmark harness: a real
// kube-apiserver + etcd (testenv/kube), a real collector (in process), and
// `eventpipe agent` as a child process with the least-privilege token, so
// its CPU time and memory are its own. See bench/agent.md.
//
// With -hollow-nodes the Events are written by real kubelets, the
// scheduler and controllers (hollow.go); with -exporter the same backlogs
// are given to kubernetes-event-exporter beside the agent (exporter.go).
//
//	go run ./bench/agent [-backlog 50000] [-sandboxes 10000] [-rate-for 20s]
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/testenv/evbin"
	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench/agent:", err)
		os.Exit(1)
	}
}

var (
	backlog    = flag.Int("backlog", 50000, "Events already in the apiserver when the agent starts")
	smallFirst = flag.Int("backlog-small", 10000, "a first, smaller backlog run to show memory is flat in the backlog size (0: skip)")
	sandboxes  = flag.Int("sandboxes", 10000, "sandboxes (CR + workload pod + supervisor pod + PVC) cached for the memory run (0: skip)")
	rateFor    = flag.Duration("rate-for", 20*time.Second, "how long the sustained-rate run writes Events (0: skip)")
	workers    = flag.Int("workers", 16, "client goroutines writing Events")
	keep       = flag.Bool("keep", false, "keep the work directory")
	profileDir = flag.String("profiles", "", "write each agent's CPU and heap profiles into this directory")
	agentEnv   = flag.String("agent-env", "", "extra environment for the agent child, comma-separated KEY=VALUE (e.g. GOGC=200,GOMEMLIMIT=48MiB); default none, so the agent runs with Go's and its own defaults")
	idleLinger = flag.Duration("agent-idle-linger", -1, "the agent's ship.idle_linger (negative: the agent default)")
	flushIdle  = flag.Bool("agent-flush-when-idle", true, "the agent's ship.flush_when_idle (false: batches go out only when full or at the flush_interval tick, as before 2026-12-01)")
	builds     = flag.String("builds", "full,agentonly", "which eventpipe binaries to measure, comma-separated: full (go build ./cmd/eventpipe) and/or agentonly (go build -tags agentonly ./cmd/eventpipe)")
)

// binary is one build of cmd/eventpipe the runs measure.
type binary struct {
	name string // "full" or "agentonly"
	path string
	size int64
}

type env struct {
	dir     string
	cluster *kube.Cluster
	cs      kubernetes.Interface
	dyn     dynamic.Interface
	bins    []binary
	kcfg    string
}

func run() error {
	flag.Parse()
	dir, err := os.MkdirTemp("", "bench-agent-")
	if err != nil {
		return err
	}
	if !*keep {
		defer os.RemoveAll(dir)
	}
	ctx := context.Background()
	e, err := newEnv(ctx, filepath.Join(dir, "events"))
	if err != nil {
		return err
	}
	defer e.cluster.Stop()
	for _, name := range strings.Split(*builds, ",") {
		b, err := buildEventpipe(dir, strings.TrimSpace(name))
		if err != nil {
			return err
		}
		e.bins = append(e.bins, b)
	}
	fmt.Printf("machine: %d CPUs, %s\n", numCPU(), goVersion())
	for _, b := range e.bins {
		fmt.Printf("binary %s: %.1f MB\n", b.name, float64(b.size)/1e6)
	}
	fmt.Println()

	if *smallFirst > 0 {
		if err := e.createEvents(ctx, "backlog", *smallFirst); err != nil {
			return err
		}
		if err := e.backlogRun(ctx, *smallFirst); err != nil {
			return err
		}
	}
	if *backlog > 0 {
		if err := e.createEvents(ctx, "backlog", *backlog-max(*smallFirst, 0)); err != nil {
			return err
		}
		if err := e.backlogRun(ctx, *backlog); err != nil {
			return err
		}
	}
	if *rateFor > 0 {
		if err := e.rateRun(ctx); err != nil {
			return err
		}
	}
	if err := e.recurrenceRun(ctx); err != nil {
		return err
	}
	if *hollowNodes > 0 {
		if err := hollowRun(ctx, dir, e.bins); err != nil {
			return err
		}
	}
	if *sandboxes > 0 {
		// A cluster of its own, so the agent's memory is its caches' and not
		// the Event backlog the runs above left behind.
		if err := e.cluster.Stop(); err != nil {
			return err
		}
		ce, err := newEnv(ctx, filepath.Join(dir, "cache"))
		if err != nil {
			return err
		}
		defer ce.cluster.Stop()
		ce.bins = e.bins
		if err := ce.cacheRun(ctx, *sandboxes); err != nil {
			return err
		}
	}
	return nil
}

// newEnv starts a control plane in dir and the clients around it.
func newEnv(ctx context.Context, dir string) (*env, error) {
	return newEnvWith(ctx, dir, kube.Writers{})
}

// newEnvWith starts a control plane with the given writers in dir.
func newEnvWith(ctx context.Context, dir string, w kube.Writers) (*env, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c, err := kube.StartProcess(ctx, kube.Options{Dir: filepath.Join(dir, "kube"), Writers: w,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	admin := c.AdminConfig()
	admin.QPS, admin.Burst = 5000, 5000
	e := &env{dir: dir, cluster: c}
	if e.cs, err = kubernetes.NewForConfig(admin); err != nil {
		c.Stop()
		return nil, err
	}
	if e.dyn, err = dynamic.NewForConfig(admin); err != nil {
		c.Stop()
		return nil, err
	}
	if e.kcfg, err = agentKubeconfig(c, dir); err != nil {
		c.Stop()
		return nil, err
	}
	return e, nil
}

// ---- runs ----

// backlogRun starts an agent of each binary (fresh collector, no cursor)
// with total Events in the apiserver and measures until all are
// acknowledged.
func (e *env) backlogRun(ctx context.Context, total int) error {
	for _, b := range e.bins {
		if err := e.backlogRunWith(ctx, b, total); err != nil {
			return err
		}
	}
	return e.exporterRuns(ctx, fmt.Sprintf("harness-written %d", total), total, 0)
}

func (e *env) backlogRunWith(ctx context.Context, b binary, total int) error {
	col, err := startCollector(e.dir, fmt.Sprintf("col-backlog-%d-%s", total, b.name))
	if err != nil {
		return err
	}
	defer col.stop()
	before, err := e.cluster.APIRequestCount(ctx, kube.RequestFilter{Resource: "events"})
	if err != nil {
		return err
	}
	start := time.Now()
	a, err := e.startAgent(b, fmt.Sprintf("backlog-%d", total), col.c.GRPCAddr(), "bench-backlog")
	if err != nil {
		return err
	}
	defer a.stop()
	if err := waitStored(col, total, 10*time.Minute); err != nil {
		return err
	}
	elapsed := time.Since(start)
	cpu, hwm, rss, anon, file := a.usageDetail()
	heap, _ := a.metric("go_memstats_heap_inuse_bytes", "")
	agentReqs, _ := a.metric("eventpipe_agent_api_requests_total", `resource="events"`)
	lists, _ := a.metric("eventpipe_agent_api_requests_total", `resource="events",verb="list"`)
	watches, _ := a.metric("eventpipe_agent_api_requests_total", `resource="events",verb="watch"`)
	gets, _ := a.metric("eventpipe_agent_api_requests_total", `resource="events",verb="get"`)
	after, _ := e.cluster.APIRequestCount(ctx, kube.RequestFilter{Resource: "events"})
	fmt.Printf("[%s] backlog %d Events: all acknowledged in %s; agent CPU %.2f s; RSS peak %.1f MiB, now %.1f MiB = %.1f MiB anonymous + %.1f MiB file-backed (binary); Go heap in use %.1f MiB; requests on events: %v (%v LIST, %v WATCH, %v GET; apiserver_request_total delta over all clients %v)\n",
		b.name, total, elapsed.Round(time.Millisecond), cpu, hwm, rss, anon, file, heap/(1<<20), agentReqs, lists, watches, gets, after-before)
	return nil
}

// rateRun writes Events as fast as `workers` clients can for rateFor while an
// agent runs, and measures occurrences/s and create→stored latency.
func (e *env) rateRun(ctx context.Context) error {
	col, err := startCollector(e.dir, "col-rate")
	if err != nil {
		return err
	}
	defer col.stop()
	a, err := e.startAgent(e.bins[0], "rate", col.c.GRPCAddr(), "bench-rate")
	if err != nil {
		return err
	}
	defer a.stop()
	// Let the agent catch up with whatever the apiserver holds already.
	if err := waitReady(a, time.Minute); err != nil {
		return err
	}
	pre := time.Now().Add(2 * time.Minute)
	for time.Now().Before(pre) {
		n, _ := a.metric("eventpipe_agent_cursor_age_seconds", "")
		q, _ := a.metric("eventpipe_agent_queue_length", "")
		if n == 0 && q == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	_, startOffset := col.c.Store().Bounds()
	ns := "bench-rate"
	if err := ensureNS(ctx, e.cs, ns); err != nil {
		return err
	}
	if err := ensurePods(ctx, e.cs, ns); err != nil {
		return err
	}
	var mu sync.Mutex
	created := map[string]time.Time{}
	stored := map[string]time.Time{}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		from := startOffset + 1
		for watchCtx.Err() == nil {
			recs, _, err := col.c.Store().Read(watchCtx, from, 4096)
			if err != nil {
				return
			}
			now := time.Now()
			mu.Lock()
			for _, r := range recs {
				if r.Occurrence.GetNamespace() == ns {
					stored[r.Occurrence.GetEventId()] = now
				}
				from = r.Offset + 1
			}
			mu.Unlock()
			if len(recs) == 0 {
				_ = col.c.Store().Wait(watchCtx, from-1)
			}
		}
	}()
	var n atomic.Int64
	end := time.Now().Add(*rateFor)
	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				t0 := time.Now()
				id, err := createEvent(ctx, e.cs, ns, int(n.Add(1)))
				if err != nil {
					continue
				}
				mu.Lock()
				created[id] = t0
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	writeEnd := time.Now()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		mu.Lock()
		done := len(stored) >= len(created)
		mu.Unlock()
		if done {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopWatch()
	<-watchDone
	var lat []time.Duration
	var first, last time.Time
	for id, t0 := range created {
		if first.IsZero() || t0.Before(first) {
			first = t0
		}
		if t1, ok := stored[id]; ok {
			lat = append(lat, t1.Sub(t0))
			if t1.After(last) {
				last = t1
			}
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) == 0 {
		return errors.New("rate run: nothing stored")
	}
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	cpu, hwm, _ := a.usage()
	fmt.Printf("[%s] sustained: %d Events created in %s (%.0f creates/s from %d clients); %d stored; %.0f occurrences/s end to end; create→stored p50 %s p99 %s max %s; agent CPU %.2f s total, peak RSS %.1f MiB\n",
		e.bins[0].name, len(created), writeEnd.Sub(first).Round(time.Millisecond), float64(len(created))/writeEnd.Sub(first).Seconds(), *workers,
		len(lat), float64(len(lat))/last.Sub(first).Seconds(), pct(0.5).Round(time.Millisecond), pct(0.99).Round(time.Millisecond),
		lat[len(lat)-1].Round(time.Millisecond), cpu, hwm)
	return nil
}

// recurrenceRun: 200 Events each bumped 5 times.
func (e *env) recurrenceRun(ctx context.Context) error {
	col, err := startCollector(e.dir, "col-recur")
	if err != nil {
		return err
	}
	defer col.stop()
	a, err := e.startAgent(e.bins[0], "recur", col.c.GRPCAddr(), "bench-recur")
	if err != nil {
		return err
	}
	defer a.stop()
	if err := waitReady(a, time.Minute); err != nil {
		return err
	}
	ns := "bench-recur"
	if err := ensureNS(ctx, e.cs, ns); err != nil {
		return err
	}
	if err := ensurePods(ctx, e.cs, ns); err != nil {
		return err
	}
	start := time.Now()
	evs := e.cs.CoreV1().Events(ns)
	for i := 0; i < 200; i++ {
		if _, err := createEvent(ctx, e.cs, ns, i); err != nil {
			return err
		}
	}
	list, err := evs.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, ev := range list.Items {
		cur := ev
		for b := 0; b < 5; b++ {
			cur.Count++
			cur.LastTimestamp = metav1.Now()
			out, err := evs.Update(ctx, &cur, metav1.UpdateOptions{})
			if err != nil {
				return err
			}
			cur = *out
		}
	}
	count := func() int {
		n := 0
		from := uint64(1)
		for {
			recs, _, err := col.c.Store().Read(ctx, from, 4096)
			if err != nil || len(recs) == 0 {
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
	deadline := time.Now().Add(time.Minute)
	n := 0
	for time.Now().Before(deadline) {
		if n = count(); n >= 1200 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // anything extra would show up now
	n = count()
	fmt.Printf("[%s] recurrences: 200 Events x (1 + 5 bumps): %d occurrences stored (want 1200) in %s\n", e.bins[0].name, n, time.Since(start).Round(time.Millisecond))
	return nil
}

// cacheRun creates n sandboxes (shared mode: CR, workload pod, supervisor
// pod, PVC each) and measures the agent's memory once its caches synced.
func (e *env) cacheRun(ctx context.Context, n int) error {
	if err := ensureNS(ctx, e.cs, scenario.SharedNamespace); err != nil {
		return err
	}
	start := time.Now()
	jobs := make(chan int)
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := e.createSandbox(ctx, i); err != nil {
					firstErr.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return *p
	}
	fmt.Printf("cache: created %d sandboxes (%d objects) in %s\n", n, 4*n, time.Since(start).Round(time.Millisecond))
	for _, b := range e.bins {
		if err := e.cacheRunWith(ctx, b, n); err != nil {
			return err
		}
	}
	return nil
}

func (e *env) cacheRunWith(ctx context.Context, b binary, n int) error {
	col, err := startCollector(e.dir, "col-cache-"+b.name)
	if err != nil {
		return err
	}
	defer col.stop()
	a, err := e.startAgent(b, "cache", col.c.GRPCAddr(), "bench-cache")
	if err != nil {
		return err
	}
	defer a.stop()
	if err := waitReady(a, 5*time.Minute); err != nil {
		return err
	}
	time.Sleep(6 * time.Second) // cache gauges update every 5 s
	var objs float64
	for _, k := range []string{"pods", "persistentvolumeclaims", "namespaces", "sandboxes"} {
		v, _ := a.metric("eventpipe_agent_cache_objects", `kind="`+k+`"`)
		objs += v
	}
	_, hwm, rss, anon, file := a.usageDetail()
	heap, _ := a.metric("go_memstats_heap_inuse_bytes", "")
	budget := 64 + objs/1024
	fmt.Printf("[%s] cache: %d sandboxes, %.0f cached objects: agent RSS %.1f MiB = %.1f MiB anonymous + %.1f MiB file-backed (peak %.1f MiB); Go heap in use %.1f MiB; budget 64 MiB + 1 KiB/object = %.1f MiB\n",
		b.name, n, objs, rss, anon, file, hwm, heap/(1<<20), budget)
	return nil
}

func (e *env) createSandbox(ctx context.Context, i int) error {
	sb := scenario.NewSandbox(fmt.Sprintf("sb-%05d", i), fmt.Sprintf("ws%d", i%50), scenario.ModeShared)
	cr := sb.CR()
	gvr := cr.GroupVersionKind().GroupVersion().WithResource("sandboxes")
	out, err := e.dyn.Resource(gvr).Namespace(sb.Namespace()).Create(ctx, cr, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create sandbox CR: %w", err)
	}
	uid := string(out.GetUID())
	if _, err := e.cs.CoreV1().Pods(sb.Namespace()).Create(ctx, sb.WorkloadPod(uid), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create workload pod: %w", err)
	}
	if _, err := e.cs.CoreV1().Pods(sb.Namespace()).Create(ctx, sb.SupervisorPod(uid), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create supervisor pod: %w", err)
	}
	if _, err := e.cs.CoreV1().PersistentVolumeClaims(sb.Namespace()).Create(ctx, sb.PVC(uid), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pvc: %w", err)
	}
	return nil
}

// ---- helpers ----

func (e *env) createEvents(ctx context.Context, ns string, n int) error {
	if n <= 0 {
		return nil
	}
	if err := ensureNS(ctx, e.cs, ns); err != nil {
		return err
	}
	if err := ensurePods(ctx, e.cs, ns); err != nil {
		return err
	}
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	base := int(time.Now().UnixNano() % 1e9)
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > n {
					return
				}
				if _, err := createEvent(ctx, e.cs, ns, base+i); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return *p
	}
	fmt.Printf("created %d Events in %s (%.0f/s)\n", n, time.Since(start).Round(time.Millisecond), float64(n)/time.Since(start).Seconds())
	return nil
}

// createEvent writes one kubelet-shaped core/v1 Event and returns its event_id.
func createEvent(ctx context.Context, cs kubernetes.Interface, ns string, i int) (string, error) {
	now := metav1.Now()
	pod := fmt.Sprintf("pod-%d", i%500)
	img := fmt.Sprintf("registry.example.com/team/agent:%d", i%97)
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod, now.UnixNano()+int64(i)), Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: pod, FieldPath: "spec.containers{agent}"},
		Reason:         "Failed", Type: corev1.EventTypeWarning,
		Message: fmt.Sprintf("Failed to pull image %q: rpc error: code = NotFound desc = failed to pull and unpack image %q: failed to resolve reference %q: %s: not found", img, img, img, img),
		Source:  corev1.EventSource{Component: "kubelet", Host: "node-1"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	out, err := cs.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return string(out.UID) + "/" + out.ResourceVersion, nil
}

// ensurePods creates the pods the generated Events are about (pod-0 ..
// pod-499), so the Events attribute against a cached object as on a real
// cluster instead of waiting in the agent's late-binding hold.
func ensurePods(ctx context.Context, cs kubernetes.Interface, ns string) error {
	for i := 0; i < 500; i++ {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i), Namespace: ns},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "registry.example.com/team/agent:1"}}}}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create pod: %w", err)
		}
	}
	return nil
}

func ensureNS(ctx context.Context, cs kubernetes.Interface, ns string) error {
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

type col struct {
	c      *collector.Collector
	cancel context.CancelFunc
	done   chan error
}

func startCollector(dir, name string) (*col, error) {
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Auth.Insecure = true
	cfg.Store.Dir = filepath.Join(dir, name)
	c, err := collector.New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &col{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	return r, nil
}

func (c *col) stop() { c.cancel(); <-c.done }

func waitStored(c *col, n int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if _, last := c.c.Store().Bounds(); last >= uint64(n) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, last := c.c.Store().Bounds()
	return fmt.Errorf("only %d of %d stored after %s", last, n, within)
}

type agentProc struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

func (e *env) startAgent(b binary, name, collectorAddr, cluster string) (*agentProc, error) {
	name = name + "-" + b.name
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	lf, err := os.Create(filepath.Join(e.dir, "agent-"+name+".log"))
	if err != nil {
		return nil, err
	}
	args := []string{"agent", "--kubeconfig", e.kcfg, "--collector", collectorAddr, "--insecure",
		"--cluster", cluster, "--leader-elect=false", "--listen", addr, "--log-level", "warn"}
	if !*flushIdle || *idleLinger >= 0 {
		ship := fmt.Sprintf("ship:\n  flush_when_idle: %v\n", *flushIdle)
		if *idleLinger >= 0 {
			ship += fmt.Sprintf("  idle_linger: %s\n", *idleLinger)
		}
		cf := filepath.Join(e.dir, "agent-"+name+".yaml")
		if err := os.WriteFile(cf, []byte(ship), 0o600); err != nil {
			return nil, err
		}
		args = append(args, "--config", cf)
	}
	if *profileDir != "" {
		args = append(args, "--cpu-profile", filepath.Join(*profileDir, "agent-"+name+".cpu"),
			"--mem-profile", filepath.Join(*profileDir, "agent-"+name+".heap"))
	}
	cmd := exec.Command(b.path, args...)
	if *agentEnv != "" {
		cmd.Env = append(os.Environ(), strings.Split(*agentEnv, ",")...)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	a := &agentProc{cmd: cmd, addr: addr, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); lf.Close(); close(a.done) }()
	return a, nil
}

func (a *agentProc) stop() {
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
	}
}

// usage: CPU seconds (user+system), peak and current RSS in MiB, from /proc.
func (a *agentProc) usage() (cpu, hwmMiB, rssMiB float64) {
	cpu, hwmMiB, rssMiB, _, _ = a.usageDetail()
	return
}

// usageDetail adds the current RSS split into anonymous memory (the heap,
// stacks: what the agent allocates) and file-backed pages (the mapped
// eventpipe binary's code, read-only data and function tables).
func (a *agentProc) usageDetail() (cpu, hwmMiB, rssMiB, anonMiB, fileMiB float64) {
	pid := a.cmd.Process.Pid
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		cpu = (ut + st) / 100 // USER_HZ
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			kb, _ := strconv.ParseFloat(f[1], 64)
			switch f[0] {
			case "VmHWM:":
				hwmMiB = kb / 1024
			case "VmRSS:":
				rssMiB = kb / 1024
			case "RssAnon:":
				anonMiB = kb / 1024
			case "RssFile:":
				fileMiB = kb / 1024
			}
		}
	}
	return cpu, hwmMiB, rssMiB, anonMiB, fileMiB
}

func (a *agentProc) metric(name, labels string) (float64, error) {
	resp, err := http.Get("http://" + a.addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || len(line) <= len(name) || (line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		if labels != "" && !strings.Contains(line, labels) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}

func waitReady(a *agentProc, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + a.addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				if v, _ := a.metric("eventpipe_agent_leader", ""); v == 1 {
					return nil
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("agent not ready within %s", within)
}

// buildEventpipe builds cmd/eventpipe as shipped: "full" is every
// subcommand, "agentonly" the build tag that leaves out all but the agent.
func buildEventpipe(dir, name string) (binary, error) {
	root, err := kube.RepoRoot()
	if err != nil {
		return binary{}, err
	}
	b := binary{name: name, path: filepath.Join(dir, "eventpipe-"+name)}
	var args []string
	switch name {
	case "full":
	case "agentonly":
		args = append(args, "-tags", "agentonly")
	default:
		return binary{}, fmt.Errorf("unknown build %q (want full or agentonly)", name)
	}
	if err := evbin.Build(context.Background(), root, b.path, args...); err != nil {
		return binary{}, err
	}
	fi, err := os.Stat(b.path)
	if err != nil {
		return binary{}, err
	}
	b.size = fi.Size()
	return b, nil
}

func agentKubeconfig(c *kube.Cluster, dir string) (string, error) {
	path := filepath.Join(dir, "agent.kubeconfig")
	return path, writeKubeconfig(c.AgentConfig(), "agent", path)
}

// writeKubeconfig writes rc's server, CA and credentials as a kubeconfig
// whose one user is named user.
func writeKubeconfig(rc *rest.Config, user, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["bench"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData, CertificateAuthority: rc.CAFile}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: rc.BearerToken, ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData}
	kc.Contexts[user] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: user}
	kc.CurrentContext = user
	return clientcmd.WriteToFile(*kc, path)
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}

func goVersion() string {
	out, err := exec.Command("go", "version").Output()
	if err != nil {
		return "go ?"
	}
	return strings.TrimSpace(string(out))
}
