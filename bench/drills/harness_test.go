package drills

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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/netproxy"
)

var (
	full    = flag.Bool("drills.full", false, "run the full drills (minutes each) instead of the short form")
	outPath = flag.String("drills.out", "", "write the results table (markdown) to this file")
)

var cluster *kube.Cluster

func TestMain(m *testing.M) {
	flag.Parse()
	code := kube.RunTestMain(m, "drills-", func(c *kube.Cluster) error { cluster = c; return nil })
	if code == 0 && *outPath != "" {
		if err := writeResults(*outPath); err != nil {
			fmt.Fprintln(os.Stderr, "write results:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// params are the sizes of a drill run.
type params struct {
	rate    int           // Events created per second
	load    time.Duration // how long Events are created
	fault   time.Duration // how long a fault lasts (black hole)
	recover time.Duration // how long the drill waits for delivery after the fault
}

func sizes() params {
	if *full {
		return params{rate: 400, load: 90 * time.Second, fault: time.Minute, recover: 3 * time.Minute}
	}
	return params{rate: 100, load: 8 * time.Second, fault: 3 * time.Second, recover: 90 * time.Second}
}

// ---- the pieces ----

type testCollector struct {
	c      *collector.Collector
	reg    *prometheus.Registry
	proxy  *netproxy.Proxy
	cancel context.CancelFunc
	done   chan error
}

func startCollector(t *testing.T) *testCollector {
	t.Helper()
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = 2 * time.Second
	cfg.Auth.Insecure = true
	cfg.Store.Dir = filepath.Join(t.TempDir(), "log")
	reg := prometheus.NewRegistry()
	c, err := collector.New(cfg, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatalf("collector.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tc := &testCollector{c: c, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { tc.done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-tc.done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("collector Run: %v", err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for c.GRPCAddr() == "" || strings.HasSuffix(c.GRPCAddr(), ":0") {
		if time.Now().After(deadline) {
			t.Fatal("collector did not start listening")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if tc.proxy, err = netproxy.New(c.GRPCAddr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tc.proxy.Close() })
	return tc
}

// records returns, for namespace ns, how many log records each event_id has.
func (tc *testCollector) records(t *testing.T, ns string) map[string]int {
	t.Helper()
	out, err := tc.readRecords(ns)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (tc *testCollector) readRecords(ns string) (map[string]int, error) {
	out := map[string]int{}
	from := uint64(1)
	for {
		recs, _, err := tc.c.Store().Read(context.Background(), from, 4096)
		if err != nil {
			return nil, fmt.Errorf("read log: %w", err)
		}
		if len(recs) == 0 {
			return out, nil
		}
		for _, r := range recs {
			if r.Occurrence.GetNamespace() == ns {
				out[r.Occurrence.GetEventId()]++
			}
			from = r.Offset + 1
		}
	}
}

func (tc *testCollector) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := tc.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func eventpipeBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := kube.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "drills-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "eventpipe")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/eventpipe")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/eventpipe: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// agentProc is an `eventpipe agent` child process.
type agentProc struct {
	cmd  *exec.Cmd
	http string
	log  string
	done chan struct{}
}

func kubeconfig(t *testing.T) string {
	t.Helper()
	rc := cluster.AgentConfig()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData, CertificateAuthority: rc.CAFile}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken}
	kc.Contexts["agent"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "agent"}
	kc.CurrentContext = "agent"
	path := filepath.Join(t.TempDir(), "agent.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func startAgent(t *testing.T, clusterName, collectorAddr string) *agentProc {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logPath := filepath.Join(t.TempDir(), "agent.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// hold.max_age 1s: the load's Events name pods that do not exist, and
	// the default 10 s hold would make every drill's recovery time the hold.
	cfgPath := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte("hold:\n  max_age: 1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(eventpipeBinary(t), "agent", "--config", cfgPath, "--kubeconfig", kubeconfig(t), "--listen", addr, "--collector-insecure",
		"--collector", collectorAddr, "--cluster", clusterName, "--leader-elect=false")
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &agentProc{cmd: cmd, http: addr, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); lf.Close(); close(a.done) }()
	t.Cleanup(func() {
		a.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("agent log tail:\n%s", b)
		}
	})
	waitFor(t, 2*time.Minute, "agent ready", func() bool { return a.ready() })
	return a
}

func (a *agentProc) kill() {
	select {
	case <-a.done:
	default:
		_ = a.cmd.Process.Signal(syscall.SIGKILL)
		<-a.done
	}
}

func (a *agentProc) stop() {
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		a.kill()
	}
}

func (a *agentProc) ready() bool {
	resp, err := http.Get("http://" + a.http + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// metric sums a metric's samples on the agent's /metrics whose line holds
// labels (a substring such as `result="duplicate"`).
func (a *agentProc) metric(name, labels string) float64 {
	resp, err := http.Get("http://" + a.http + "/metrics")
	if err != nil {
		return -1
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
	return sum
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ---- load ----

// loadGen creates core/v1 Events in one namespace, as kubelet would, and
// remembers each occurrence (uid/resourceVersion) it created.
type loadGen struct {
	cs kubernetes.Interface
	ns string

	mu  sync.Mutex
	ids map[string]bool
	n   int
}

func newLoadGen(t *testing.T, ns string) *loadGen {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return &loadGen{cs: cs, ns: ns, ids: map[string]bool{}}
}

// run creates Events at about rate per second for d, with 8 writers; it
// retries a create for up to a minute (the apiserver may be restarting).
func (g *loadGen) run(ctx context.Context, rate int, d time.Duration) error {
	const workers = 8
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	interval := time.Duration(float64(time.Second) * workers / float64(rate))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for ctx.Err() == nil {
				if err := g.create(ctx); err != nil && ctx.Err() == nil {
					errs <- err
					return
				}
				select {
				case <-tick.C:
				case <-ctx.Done():
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (g *loadGen) create(ctx context.Context) error {
	g.mu.Lock()
	i := g.n
	g.n++
	g.mu.Unlock()
	now := metav1.Now()
	pod := fmt.Sprintf("drill-%d", i%200)
	e := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod, now.UnixNano()+int64(i)), Namespace: g.ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: g.ns, Name: pod, FieldPath: "spec.containers{agent}"},
		Reason:         "Pulling", Message: fmt.Sprintf("Pulling image \"example.com/drill:%d\"", i), Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: "kubelet", Host: "node-1"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	deadline := time.Now().Add(time.Minute)
	for {
		// A create must not be cut by the load's end: it would leave an
		// Event the generator does not know about.
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := g.cs.CoreV1().Events(g.ns).Create(cctx, e, metav1.CreateOptions{})
		cancel()
		if err == nil {
			g.mu.Lock()
			g.ids[string(out.UID)+"/"+out.ResourceVersion] = true
			g.mu.Unlock()
			return nil
		}
		if apierrors.IsAlreadyExists(err) {
			return nil // created by an attempt whose answer was lost; the watch has it, the generator cannot name it
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("create event: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (g *loadGen) created() map[string]bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]bool, len(g.ids))
	for k := range g.ids {
		out[k] = true
	}
	return out
}

// ---- results ----

type result struct {
	drill      string
	form       string
	created    int
	acked      int // log records in the drill's namespace (acknowledged to the agent)
	delivered  int // created occurrences found in the log
	duplicated int // log records beyond one per event_id
	lost       int
	resent     float64 // occurrences the collector de-duplicated during the drill (sent again)
	recovery   time.Duration
	note       string
}

var (
	resultsMu sync.Mutex
	results   []result
)

// recovery starts timing, from faultEnd, how long the log takes to hold
// every occurrence created until then (the backlog of the fault); the
// returned func waits for it (at most budget) and returns the time, or -1
// when the backlog was not delivered within budget.
func recovery(t *testing.T, col *testCollector, g *loadGen, faultEnd time.Time, budget time.Duration) func() time.Duration {
	t.Helper()
	backlog := g.created()
	ch := make(chan time.Duration, 1)
	go func() {
		deadline := faultEnd.Add(budget)
		for {
			got, err := col.readRecords(g.ns)
			if err != nil {
				ch <- -1
				return
			}
			missing := 0
			for id := range backlog {
				if got[id] == 0 {
					missing++
				}
			}
			if missing == 0 {
				ch <- time.Since(faultEnd)
				return
			}
			if time.Now().After(deadline) {
				ch <- -1
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return func() time.Duration { return <-ch }
}

// measure waits until every created occurrence is in the log (or budget
// ends), then fills, checks and records r; recovered is from recovery.
func measure(t *testing.T, col *testCollector, g *loadGen, recovered func() time.Duration, budget time.Duration, dedupBefore float64, r result) result {
	t.Helper()
	r.recovery = recovered()
	want := g.created()
	var got map[string]int
	deadline := time.Now().Add(budget)
	for {
		got = col.records(t, g.ns)
		missing := 0
		for id := range want {
			if got[id] == 0 {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.created = len(want)
	for id, n := range got {
		r.acked += n
		if n > 1 {
			r.duplicated += n - 1
		}
		if want[id] {
			r.delivered++
		}
	}
	r.lost = r.created - r.delivered
	r.resent = col.metric(t, "eventpipe_collector_deduplicated_occurrences_total") - dedupBefore
	r.form = "short"
	if *full {
		r.form = "full"
	}
	resultsMu.Lock()
	results = append(results, r)
	resultsMu.Unlock()
	t.Logf("%s: created %d, acknowledged %d, delivered %d, duplicated after dedupe %d, lost %d, re-sent (de-duplicated) %v, recovered in %s",
		r.drill, r.created, r.acked, r.delivered, r.duplicated, r.lost, r.resent, r.recovery.Round(10*time.Millisecond))
	if r.recovery < 0 {
		t.Errorf("%s: the backlog of the fault was not delivered within %s", r.drill, budget)
	}
	if r.lost != 0 {
		t.Errorf("%s: %d of %d created occurrences never reached the log", r.drill, r.lost, r.created)
	}
	if r.duplicated != 0 {
		t.Errorf("%s: %d occurrences stored more than once", r.drill, r.duplicated)
	}
	return r
}

func writeResults(path string) error {
	var b strings.Builder
	b.WriteString("# Fault drills (agent side)\n\n")
	b.WriteString("Produced by `make drills` (bench/drills, `-drills.full`); see bench/drills/doc.go for what each column means.\n")
	b.WriteString("Destination: the collector's durable log (every sink reads it; per-sink drills are not in this suite yet).\n")
	b.WriteString("The agent runs with hold.max_age 1s (the load's Events name pods that do not exist; each is held that long before it ships unattributed).\n")
	b.WriteString("Time to recover: from the end of the fault (agent restarted, apiserver ready, network restored) until every Event created before that moment is in the log; load keeps running meanwhile.\n\n")
	fmt.Fprintf(&b, "Run %s UTC, load `%s`.\n\n", time.Now().UTC().Format("2006-01-02 15:04"), loadavg())
	b.WriteString("| drill | form | created | acknowledged | delivered | duplicated after dedupe | lost | re-sent (de-duplicated by the collector) | time to recover | notes |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	resultsMu.Lock()
	defer resultsMu.Unlock()
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %v | %s | %s |\n", r.drill, r.form, r.created, r.acked, r.delivered,
			r.duplicated, r.lost, r.resent, r.recovery.Round(100*time.Millisecond), r.note)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
