// Command gateway is the driver proxy's benchmark harness. It builds
// `eventpipe` and runs `eventpipe driver-proxy` as a child process between
// the test driver (sinks/gateway/gatewaytest) and a gateway-side client,
// with a real collector in process, and measures:
//
//   - unary: GetCapabilities and GetSandbox round trips, direct vs through
//     the proxy (the proxy's added latency);
//   - stream: a WatchSandboxes message from the driver's send to the
//     client's receipt, direct vs through the proxy;
//   - rss: the proxy's resident memory with -sandboxes live sandboxes, each
//     with -events-per-sandbox events and an active pull failure;
//   - restart: SIGKILL and restart of the proxy process until the first
//     RPC answers through it again;
//   - e2e: Event creation in a real kube-apiserver to the gateway client's
//     receipt, through the real agent and collector, at the apiserver's full
//     create rate (-e2e-for; 0 skips it), or on Events written by hollow
//     kubelets, kube-scheduler and the controllers (-hollow-nodes, hollow.go).
//
// See bench/gateway.md.
//
//	go run ./bench/gateway [-n 20000] [-sandboxes 10000] [-e2e-for 20s]
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
	"github.com/eventpipe/eventpipe/testenv/evbin"
)

var (
	n                  = flag.Int("n", 20000, "round trips / stream messages per measurement")
	sandboxes          = flag.Int("sandboxes", 10000, "live sandboxes for the memory run (0: skip)")
	perSandbox         = flag.Int("events-per-sandbox", 10, "events per sandbox in the memory run")
	restarts           = flag.Int("restarts", 20, "proxy kill+restart cycles (0: skip)")
	e2eFor             = flag.Duration("e2e-for", 20*time.Second, "how long the end-to-end run creates Events (0: skip)")
	agentFlushInterval = flag.Duration("agent-flush-interval", 0, "the e2e agent's ship.flush_interval (0: the agent default, 200ms)")
	agentFlushWhenIdle = flag.Bool("agent-flush-when-idle", true, "the e2e agent's ship.flush_when_idle")
	workers            = flag.Int("workers", 16, "client goroutines creating Events in the e2e run")
	keep               = flag.Bool("keep", false, "keep the work directory")
	proxyEnv           = flag.String("proxy-env", "", "extra environment of the proxy process, comma-separated KEY=VALUE (e.g. GOMAXPROCS=1)")
	proxyProf          = flag.String("proxy-cpu-profile", "", "write the latency run's proxy CPU profile to this file")
	fsync              = flag.Bool("fsync", true, "the collector fsyncs its log (false: only to show how much of the e2e latency is the fsync)")
	quietPeers         = flag.Bool("quiet-peers", false, "the test gateway client and driver use fixed flow-control windows: no bandwidth-delay PINGs for the proxy to ack (grpc-go's default sends them)")
	pipe               = flag.Bool("pipe", false, "also measure unary calls through a plain byte relay process (the floor of any relay design)")
	only               = flag.String("only", "", "run only this part of the latency measurement: unary or stream (empty: both)")
	proxyCPUs          = flag.String("proxy-cpus", "", "run the proxy and the byte relay under `taskset -c LIST` (e.g. 1, with the harness itself started under taskset -c 0): each side gets its own core")
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == pipeArg {
		os.Exit(runPipe(os.Args[2:]))
	}
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench/gateway:", err)
		os.Exit(1)
	}
}

type env struct {
	dir     string
	bin     string
	drv     *gatewaytest.Driver
	col     *collector.Collector
	colStop func()
}

func run() error {
	dir, err := os.MkdirTemp("/tmp", "gwbench")
	if err != nil {
		return err
	}
	if !*keep {
		defer os.RemoveAll(dir)
	}
	e := &env{dir: dir, bin: filepath.Join(dir, "eventpipe")}
	fmt.Println("building eventpipe ...")
	if err := evbin.Build(context.Background(), ".", e.bin); err != nil {
		return err
	}
	if e.drv, err = gatewaytest.StartDriver(filepath.Join(dir, "driver", "driver.sock"), driverOpts()...); err != nil {
		return err
	}
	defer e.drv.Stop()
	if err := e.startCollector(); err != nil {
		return err
	}
	defer e.colStop()
	printLoad("start")

	if err := e.latency(); err != nil {
		return err
	}
	if *restarts > 0 {
		if err := e.restart(); err != nil {
			return err
		}
	}
	if *sandboxes > 0 {
		if err := e.rss(); err != nil {
			return err
		}
	}
	if *e2eFor > 0 {
		if err := e.endToEnd(); err != nil {
			return err
		}
	}
	printLoad("end")
	return nil
}

func printLoad(when string) {
	out, _ := exec.Command("uptime").Output()
	fmt.Printf("load (%s): %s", when, out)
	// CPU pressure: the share of time some runnable task waited for a core.
	if b, err := os.ReadFile("/proc/pressure/cpu"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		fmt.Printf("cpu pressure (%s): %s\n", when, line)
	}
}

func (e *env) startCollector() error {
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen, cfg.HTTP.Listen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = time.Second
	cfg.Auth.Insecure = true
	cfg.Store.Dir = filepath.Join(e.dir, "log")
	cfg.Store.Fsync = *fsync
	c, err := collector.New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.col = c
	e.colStop = func() { cancel(); <-done }
	return nil
}

// proc is one `eventpipe driver-proxy` child process.
type proc struct {
	cmd  *exec.Cmd
	sock string
}

func (e *env) startProxy(name string, extra ...string) (*proc, error) {
	sock := filepath.Join(e.dir, name, "proxy.sock")
	args := append([]string{"driver-proxy", "--listen", sock, "--driver", e.drv.Path, "--gateway", "openshell",
		"--collector", e.col.GRPCAddr(), "--insecure", "--log-level", "warn"}, extra...)
	if name == "lat" && *proxyProf != "" {
		args = append(args, "--cpu-profile", *proxyProf)
	}
	cmd := pinned(e.bin, args...)
	if *proxyEnv != "" {
		cmd.Env = append(os.Environ(), splitEnv(*proxyEnv)...)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &proc{cmd: cmd, sock: sock}, nil
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// waitServing calls GetCapabilities until it answers; it returns when.
func waitServing(c *gatewaytest.Client, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := c.Unary(ctx, gatewaytest.MethodCaps, nil)
		cancel()
		if err == nil {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("no answer within %s: %w", limit, err)
		}
		time.Sleep(time.Millisecond)
	}
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p * float64(len(s)-1))
	return s[i]
}

func summary(d []time.Duration) string {
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  max %s  (n=%d)", us(pct(d, .5)), us(pct(d, .9)), us(pct(d, .99)), us(pct(d, 1)), len(d))
}

func us(d time.Duration) string { return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond)) }

// latency: the proxy's added latency on unary RPCs and stream messages.
func (e *env) latency() error {
	for i := range 100 {
		e.drv.Put(gatewaytest.Sandbox{ID: benchID(i), Name: fmt.Sprintf("sb-%d", i),
			Conditions: []gatewaytest.Condition{{Type: "Ready", Status: "False", Reason: "DependenciesNotReady", Message: "Pod exists with phase: Pending"}}})
	}
	// Sandbox 42 has an active pull failure: its GetSandbox answer is
	// edited (the condition added, the Ready message extended).
	if err := e.ship(benchOccurrence(42, 0)); err != nil {
		return err
	}
	p, err := e.startProxy("lat")
	if err != nil {
		return err
	}
	defer p.stop()
	direct, err := dialPeer(e.drv.Path)
	if err != nil {
		return err
	}
	defer direct.Close()
	via, err := dialPeer(p.sock)
	if err != nil {
		return err
	}
	defer via.Close()
	if _, err := waitServing(via, 10*time.Second); err != nil {
		return err
	}
	getReq := append([]byte{0x0a, 36}, benchID(42)...)
	if r, err := via.Unary(context.Background(), gatewaytest.MethodGet, getReq); err != nil {
		return err
	} else if sbs, _ := gatewaytest.DecodeSandboxes(r.Bodies[0]); len(sbs) != 1 {
		return fmt.Errorf("GetSandbox: %d sandboxes", len(sbs))
	} else if _, ok := sbs[0].Condition("ImagePulled"); !ok {
		// The proxy may still be reading its start tail.
		time.Sleep(time.Second)
	}
	rpcs := []struct {
		name   string
		method string
		req    []byte
	}{{"GetCapabilities", gatewaytest.MethodCaps, nil}, {"GetSandbox", gatewaytest.MethodGet, getReq}}
	if *only == "stream" {
		rpcs = nil
	}
	clients := []*gatewaytest.Client{direct, via}
	var pp *proc
	var pc *gatewaytest.Client
	if *pipe && len(rpcs) > 0 {
		if pp, err = e.startPipe(); err != nil {
			return err
		}
		defer pp.stop()
		if pc, err = dialPeer(pp.sock); err != nil {
			return err
		}
		defer pc.Close()
		if _, err := waitServing(pc, 10*time.Second); err != nil {
			return err
		}
		clients = append(clients, pc)
	}
	for _, rpc := range rpcs {
		// Interleave direct and proxied calls so load changes hit both.
		cpu0 := procCPU(p.cmd.Process.Pid)
		r0, w0 := procIO(p.cmd.Process.Pid)
		var pcpu0 time.Duration
		var pr0, pw0 int64
		if pp != nil {
			pcpu0 = procCPU(pp.cmd.Process.Pid)
			pr0, pw0 = procIO(pp.cmd.Process.Pid)
		}
		var d, v, vp []time.Duration
		for i := 0; i < *n; i++ {
			for _, c := range clients {
				start := time.Now()
				if _, err := c.Unary(context.Background(), rpc.method, rpc.req); err != nil {
					return fmt.Errorf("%s: %w", rpc.name, err)
				}
				el := time.Since(start)
				switch c {
				case direct:
					d = append(d, el)
				case via:
					v = append(v, el)
				default:
					vp = append(vp, el)
				}
			}
		}
		if pp != nil {
			pr1, pw1 := procIO(pp.cmd.Process.Pid)
			fmt.Printf("unary %s via byte relay: %s\n", rpc.name, summary(vp))
			fmt.Printf("unary %s byte relay added: p50 %s  p99 %s; relay CPU %s per call; %.1f read and %.1f write syscalls per call\n", rpc.name,
				us(pct(vp, .5)-pct(d, .5)), us(pct(vp, .99)-pct(d, .99)), us((procCPU(pp.cmd.Process.Pid)-pcpu0)/time.Duration(*n)),
				float64(pr1-pr0)/float64(*n), float64(pw1-pw0)/float64(*n))
		}
		fmt.Printf("unary %s direct:      %s\n", rpc.name, summary(d))
		fmt.Printf("unary %s via proxy:   %s\n", rpc.name, summary(v))
		fmt.Printf("unary %s added:       p50 %s  p99 %s\n", rpc.name, us(pct(v, .5)-pct(d, .5)), us(pct(v, .99)-pct(d, .99)))
		r1, w1 := procIO(p.cmd.Process.Pid)
		fmt.Printf("unary %s proxy CPU:   %s per call (user+system); %.1f read and %.1f write syscalls per call\n", rpc.name,
			us((procCPU(p.cmd.Process.Pid)-cpu0)/time.Duration(*n)), float64(r1-r0)/float64(*n), float64(w1-w0)/float64(*n))
	}

	if *only == "unary" {
		return nil
	}
	// Stream: the driver stamps each platform event with its send time
	// (nanoseconds in timestamp_ms); both streams receive every message.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wd, err := direct.Watch(ctx)
	if err != nil {
		return err
	}
	wv, err := via.Watch(ctx)
	if err != nil {
		return err
	}
	if err := e.drv.WaitWatchers(ctx, 2); err != nil {
		return err
	}
	recv := func(w *gatewaytest.Watch, out *[]time.Duration, wg *sync.WaitGroup) {
		defer wg.Done()
		for len(*out) < *n {
			ev, err := w.Recv()
			if err != nil {
				return
			}
			if ev.Platform == nil || ev.Platform.Source != "bench" {
				continue
			}
			*out = append(*out, time.Duration(time.Now().UnixNano()-ev.Platform.TimestampMS))
		}
	}
	var sd, sv []time.Duration
	cpu0 := procCPU(p.cmd.Process.Pid)
	var wg sync.WaitGroup
	wg.Add(2)
	go recv(wd, &sd, &wg)
	go recv(wv, &sv, &wg)
	for i := 0; i < *n; i++ {
		e.drv.Platform(benchID(1), gatewaytest.PlatformEvent{TimestampMS: time.Now().UnixNano(), Source: "bench", Type: "Normal", Reason: "Tick"})
		if i%4 == 3 {
			time.Sleep(200 * time.Microsecond) // below the driver's watcher buffer
		}
	}
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		cancel() // ends both streams
		<-waited
		fmt.Printf("stream: only %d/%d direct and %d/%d proxied messages arrived (the test driver drops on a full watcher buffer)\n", len(sd), *n, len(sv), *n)
	}
	fmt.Printf("stream message direct:     %s\n", summary(sd))
	fmt.Printf("stream message via proxy:  %s\n", summary(sv))
	fmt.Printf("stream message added:      p50 %s  p99 %s\n", us(pct(sv, .5)-pct(sd, .5)), us(pct(sv, .99)-pct(sd, .99)))
	fmt.Printf("stream message proxy CPU:  %s per message (user+system)\n", us((procCPU(p.cmd.Process.Pid)-cpu0)/time.Duration(max(len(sv), 1))))
	return nil
}

// restart: SIGKILL the proxy and start it again; the time from exec until
// the socket accepts a connection, and until a fresh client's first RPC
// is answered (the gateway redials every 2 s, so this is the outage it
// sees at most, plus its redial wait).
func (e *env) restart() error {
	state := filepath.Join(e.dir, "rst", "state")
	sock := filepath.Join(e.dir, "rst", "proxy.sock")
	var accept, answer []time.Duration
	for i := 0; i <= *restarts; i++ {
		start := time.Now()
		p, err := e.startProxy("rst", "--state-file", state)
		if err != nil {
			return err
		}
		for {
			if c, err := net.Dial("unix", sock); err == nil {
				c.Close()
				break
			}
			if time.Since(start) > 10*time.Second {
				return fmt.Errorf("proxy socket not accepting after 10s")
			}
			time.Sleep(200 * time.Microsecond)
		}
		acc := time.Since(start)
		c, err := dialPeer(sock)
		if err != nil {
			return err
		}
		at, err := waitServing(c, 10*time.Second)
		c.Close()
		if err != nil {
			return err
		}
		if i > 0 { // the first start warms the page cache
			accept = append(accept, acc)
			answer = append(answer, at.Sub(start))
		}
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
	fmt.Printf("proxy restart after SIGKILL, exec to socket accepting: %s\n", summaryMS(accept))
	fmt.Printf("proxy restart after SIGKILL, exec to first RPC answered: %s\n", summaryMS(answer))
	return nil
}

func summaryMS(d []time.Duration) string {
	ms := func(x time.Duration) string { return fmt.Sprintf("%.1fms", float64(x)/float64(time.Millisecond)) }
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  max %s  (n=%d)", ms(pct(d, .5)), ms(pct(d, .9)), ms(pct(d, .99)), ms(pct(d, 1)), len(d))
}

// rss: the proxy with -sandboxes live sandboxes, each with events and an
// active pull failure, and a gateway stream open.
func (e *env) rss() error {
	ml, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	metricsAddr := ml.Addr().String()
	ml.Close()
	p, err := e.startProxy("rss", "--metrics-listen", metricsAddr)
	if err != nil {
		return err
	}
	defer p.stop()
	c, err := dialPeer(p.sock)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := waitServing(c, 10*time.Second); err != nil {
		return err
	}
	base := vmRSS(p.cmd.Process.Pid)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := c.Watch(ctx)
	if err != nil {
		return err
	}
	got := make(chan int, 1)
	go func() {
		k := 0
		for {
			ev, err := w.Recv()
			if err != nil {
				got <- k
				return
			}
			if ev.Platform != nil && ev.Platform.Source == "kubernetes" {
				k++
				if k == *sandboxes**perSandbox {
					got <- k
					return
				}
			}
		}
	}()
	conn, err := grpc.NewClient(e.col.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ship, err := eventpipev1.NewIngestClient(conn).Ship(ctx)
	if err != nil {
		return err
	}
	acks := make(chan error, 1)
	go func() {
		for {
			if _, err := ship.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				acks <- err
				return
			}
		}
	}()
	start := time.Now()
	seq := uint64(0)
	var batch []*eventpipev1.Occurrence
	for k := 0; k < *perSandbox; k++ {
		for s := 0; s < *sandboxes; s++ {
			batch = append(batch, benchOccurrence(s, k))
			if len(batch) == 500 {
				seq++
				if err := ship.Send(&eventpipev1.Batch{Seq: seq, Cluster: "bench", Stream: collector.DefaultStream, ResourceVersion: strconv.FormatUint(seq, 10), Occurrences: batch}); err != nil {
					return err
				}
				batch = nil
			}
		}
	}
	if len(batch) > 0 {
		seq++
		if err := ship.Send(&eventpipev1.Batch{Seq: seq, Cluster: "bench", Stream: collector.DefaultStream, ResourceVersion: strconv.FormatUint(seq, 10), Occurrences: batch}); err != nil {
			return err
		}
	}
	_ = ship.CloseSend()
	if err := <-acks; err != nil {
		return fmt.Errorf("ship: %w", err)
	}
	select {
	case k := <-got:
		fmt.Printf("rss run: %d platform events received by the gateway client in %s\n", k, time.Since(start).Round(time.Millisecond))
	case <-time.After(5 * time.Minute):
		return fmt.Errorf("the gateway client did not get every event")
	}
	// Get/List with the conditions of 10,000 failing sandboxes.
	for s := 0; s < *sandboxes; s++ {
		e.drv.Put(gatewaytest.Sandbox{ID: benchID(s), Name: fmt.Sprintf("sb-%d", s),
			Conditions: []gatewaytest.Condition{{Type: "Ready", Status: "False", Reason: "DependenciesNotReady", Message: "Pod exists with phase: Pending"}}})
	}
	direct, err := dialPeer(e.drv.Path)
	if err != nil {
		return err
	}
	defer direct.Close()
	t0 := time.Now()
	if _, err := direct.Unary(context.Background(), gatewaytest.MethodList, nil); err != nil {
		return err
	}
	fmt.Printf("ListSandboxes direct: %s\n", time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	r, err := c.Unary(context.Background(), gatewaytest.MethodList, nil)
	if err != nil {
		return err
	}
	sbs, _ := gatewaytest.DecodeSandboxes(r.Bodies[0])
	failing := 0
	for _, sb := range sbs {
		if _, ok := sb.Condition("ImagePulled"); ok {
			failing++
		}
	}
	fmt.Printf("ListSandboxes through the proxy: %d sandboxes, %d with ImagePulled=False, %d bytes, %s\n", len(sbs), failing, len(r.Bodies[0]), time.Since(t0).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	fmt.Printf("proxy RSS: %d MiB at start, %d MiB with %d live sandboxes x %d events (+ an active pull failure each), a gateway stream open\n",
		base>>20, vmRSS(p.cmd.Process.Pid)>>20, *sandboxes, *perSandbox)
	fmt.Printf("proxy Go heap: %s\n", scrape(metricsAddr, "go_memstats_heap_inuse_bytes", "go_memstats_heap_alloc_bytes",
		"eventpipe_driver_proxy_sandboxes", "eventpipe_driver_proxy_tail_events", "eventpipe_driver_proxy_stream_overflows_total"))
	return nil
}

// ship stores occurrences in the collector through its Ingest stream.
func (e *env) ship(occs ...*eventpipev1.Occurrence) error {
	conn, err := grpc.NewClient(e.col.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := eventpipev1.NewIngestClient(conn).Ship(ctx)
	if err != nil {
		return err
	}
	shipSeq++
	if err := st.Send(&eventpipev1.Batch{Seq: shipSeq, Cluster: "bench", Stream: "single", ResourceVersion: strconv.FormatUint(shipSeq, 10), Occurrences: occs}); err != nil {
		return err
	}
	if _, err := st.Recv(); err != nil {
		return err
	}
	return st.CloseSend()
}

var shipSeq uint64

func benchID(s int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012d", s, s) }

var benchSeq uint64

func benchOccurrence(s, k int) *eventpipev1.Occurrence {
	benchSeq++
	now := timestamppb.Now()
	img := "docker.io/library/busybox:0.0.0-does-not-exist"
	o := &eventpipev1.Occurrence{
		SchemaVersion: 1, EventId: fmt.Sprintf("bench-%d/%d", benchSeq, benchSeq), OccurredAt: now, ObservedAt: now,
		Namespace: "openshell", Type: "Warning", Reason: "Failed", Count: int32(k + 1),
		Message:            fmt.Sprintf("Failed to pull image %q: rpc error: code = NotFound desc = failed to pull and unpack image %q: not found", img, img),
		Event:              &eventpipev1.EventRef{Name: fmt.Sprintf("repro--sb-%d.%x", s, benchSeq), Uid: fmt.Sprintf("uid-%d", benchSeq), ResourceVersion: "1", ApiVersion: "v1"},
		InvolvedObject:     &eventpipev1.ObjectRef{Kind: "Pod", Namespace: "openshell", Name: fmt.Sprintf("repro--sb-%d", s), FieldPath: "spec.initContainers{workspace-init}"},
		ReportingComponent: "kubelet",
		Sandbox:            &eventpipev1.Sandbox{Id: benchID(s), Name: fmt.Sprintf("sb-%d", s), Workspace: "repro", GatewayId: "openshell"},
		Attribution:        eventpipev1.AttributionPodAnnotation, Role: eventpipev1.RoleWorkload, Container: "workspace-init",
		Image: img, ImageRole: eventpipev1.ImageRoleWorkload,
		PullFailure: &eventpipev1.PullFailure{Category: eventpipev1.CategoryNotFound, Image: img, Disposition: eventpipev1.DispositionPersistent,
			Attempts: uint32(k + 1), FirstSeen: now, LastSeen: now, Detail: img + ": not found", Source: eventpipev1.PullSourceEvent},
	}
	return o
}

// procCPU is a process's user+system CPU time (/proc/<pid>/stat, in clock
// ticks of 10 ms: USER_HZ is 100 on Linux).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// dialPeer dials like the gateway (with -quiet-peers: fixed windows).
func dialPeer(path string) (*gatewaytest.Client, error) {
	if *quietPeers {
		return gatewaytest.Dial(path, grpc.WithStaticStreamWindowSize(1<<20), grpc.WithStaticConnWindowSize(4<<20))
	}
	return gatewaytest.Dial(path)
}

// driverOpts: the test driver's extra server options (-quiet-peers).
func driverOpts() []grpc.ServerOption {
	if *quietPeers {
		return []grpc.ServerOption{grpc.StaticStreamWindowSize(1 << 20), grpc.StaticConnWindowSize(4 << 20)}
	}
	return nil
}

func splitEnv(s string) []string { return strings.Split(s, ",") }

// procIO is a process's read and write syscall counts so far
// (/proc/<pid>/io: syscr, syscw).
func procIO(pid int) (reads, writes int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "syscr: "); ok {
			reads, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			writes, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return reads, writes
}

// scrape reads gauges from the proxy's /metrics.
func scrape(addr string, names ...string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		for _, n := range names {
			if v, ok := strings.CutPrefix(line, n+" "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				if strings.HasSuffix(n, "_bytes") {
					out = append(out, fmt.Sprintf("%s %.0f MiB", strings.TrimPrefix(n, "go_memstats_"), f/(1<<20)))
				} else {
					out = append(out, fmt.Sprintf("%s %.0f", strings.TrimPrefix(n, "eventpipe_driver_proxy_"), f))
				}
			}
		}
	}
	return strings.Join(out, ", ")
}

func vmRSS(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// pinned is exec.Command, under taskset when -proxy-cpus is set (taskset
// execs the program: the pid, and so its /proc accounting, stay the same).
func pinned(name string, args ...string) *exec.Cmd {
	if *proxyCPUs == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("taskset", append([]string{"-c", *proxyCPUs, name}, args...)...)
}
