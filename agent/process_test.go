package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/eventpipe/eventpipe/testenv/evbin"
	"github.com/eventpipe/eventpipe/testenv/kube"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// eventpipeBinary builds ./cmd/eventpipe once per test binary.
func eventpipeBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := kube.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "eventpipe-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "eventpipe")
		buildErr = evbin.Build(context.Background(), root, binPath)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// child is an `eventpipe agent` process.
type child struct {
	name    string
	cmd     *exec.Cmd
	metrics string // http address
	log     string
	done    chan struct{}
}

// startChild runs `eventpipe agent` with the least-privilege kubeconfig. The
// agent binds a port it chooses (--listen 127.0.0.1:0) and the address is
// read from its log: a port the test picked and closed again could be taken
// by another process before the agent binds it.
func startChild(t testing.TB, dir, name string, args ...string) *child {
	t.Helper()
	all := append([]string{"agent", "--kubeconfig", agentKubeconfig(t, dir), "--listen", "127.0.0.1:0", "--insecure", "--identity", name}, args...)
	c, from := spawn(t, dir, "agent", name, 4000, all...)
	c.metrics = c.waitLogged(t, from, "serving /metrics, /healthz and /readyz")["http"]
	return c
}

// spawn starts the eventpipe binary with args as the child name (what is
// "agent" or "collector", for messages), its output appended to
// dir/name.log, killed at cleanup, with the last tailBytes of its log in a
// failed test's output. It returns the child and the log's size before
// the start: a restarted child appends to the log of its predecessor, and
// only what it writes counts.
func spawn(t testing.TB, dir, what, name string, tailBytes int, args ...string) (*child, int64) {
	t.Helper()
	bin := eventpipeBinary(t)
	logPath := filepath.Join(dir, name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	st, err := lf.Stat()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s %s: %v", what, name, err)
	}
	c := &child{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		lf.Close()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s %s log (tail):\n%s", what, name, tail(string(b), tailBytes))
		}
	})
	return c, st.Size()
}

// waitLogged waits until c's JSON log has, past offset from, a line with
// message msg, and returns that line's string fields. It fails the test
// when the child exits first or after 60 s.
func (c *child) waitLogged(t testing.TB, from int64, msg string) map[string]string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		// Whether it had exited is known before the read: a line written
		// just before the exit is still found.
		var exited bool
		select {
		case <-c.done:
			exited = true
		default:
		}
		b, _ := os.ReadFile(c.log)
		if int64(len(b)) > from {
			for _, line := range strings.Split(string(b[from:]), "\n") {
				var rec map[string]any
				if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != msg {
					continue
				}
				out := map[string]string{}
				for k, v := range rec {
					if s, ok := v.(string); ok {
						out[k] = s
					}
				}
				return out
			}
		}
		if exited {
			t.Fatalf("%s exited before logging %q; log:\n%s", c.name, msg, tail(string(b), 4000))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q in 60s; log:\n%s", c.name, msg, tail(string(b), 4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (c *child) kill() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

func (c *child) stop(t testing.TB) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		t.Errorf("agent %s did not stop on SIGTERM", c.name)
		c.kill()
	}
}

// metric reads one sample sum from the child's /metrics (text format);
// labels is a substring filter like `method="watchlist"`.
func (c *child) metric(name, labels string) (float64, error) {
	resp, err := http.Get("http://" + c.metrics + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		if labels != "" && !strings.Contains(line, labels) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}

func (c *child) ready() bool {
	resp, err := http.Get("http://" + c.metrics + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// ---- load ----

// loadGen writes core/v1 Events into one namespace, as kubelet would, and
// remembers every occurrence it created (UID/resourceVersion).
type loadGen struct {
	cs kubernetes.Interface
	ns string
	// pods, when set, are the pods the Events name (round robin), so they
	// are attributed to sandboxes; otherwise they name pods load-0..199,
	// which do not exist.
	pods []string

	mu  sync.Mutex
	ids map[string]bool // event_id
}

func newLoadGen(t testing.TB, ns string) *loadGen {
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

// run creates n Events at about rate per second with workers goroutines.
func (g *loadGen) run(ctx context.Context, n, rate, workers int) error {
	interval := time.Duration(float64(time.Second) * float64(workers) / float64(rate))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	next := make(chan int)
	go func() {
		defer close(next)
		for i := 0; i < n; i++ {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(interval)
			defer t.Stop()
			for i := range next {
				if err := g.create(ctx, i); err != nil {
					errs <- err
					return
				}
				select {
				case <-t.C:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (g *loadGen) create(ctx context.Context, i int) error {
	now := metav1.Now()
	pod := fmt.Sprintf("load-%d", i%200)
	if len(g.pods) > 0 {
		pod = g.pods[i%len(g.pods)]
	}
	e := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod, now.UnixNano()+int64(i)), Namespace: g.ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: g.ns, Name: pod, FieldPath: "spec.containers{agent}"},
		Reason:         "Pulling", Message: fmt.Sprintf("Pulling image \"example.com/load:%d\"", i), Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: "kubelet", Host: "node-1"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	for attempt := 0; ; attempt++ {
		out, err := g.cs.CoreV1().Events(g.ns).Create(ctx, e, metav1.CreateOptions{})
		if err == nil {
			g.mu.Lock()
			g.ids[string(out.UID)+"/"+out.ResourceVersion] = true
			g.mu.Unlock()
			return nil
		}
		if ctx.Err() != nil || attempt > 20 {
			return fmt.Errorf("create event: %w", err)
		}
		time.Sleep(100 * time.Millisecond) // the apiserver may be restarting
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

// checkDelivered waits until every created occurrence is in the collector
// and checks that none is stored twice.
func checkDelivered(t *testing.T, col *testCollector, g *loadGen, within time.Duration) {
	t.Helper()
	want := g.created()
	var stored map[string]int
	waitFor(t, within, "every created Event at the collector", func() (bool, string) {
		stored = map[string]int{}
		for _, o := range col.all(t) {
			if o.GetNamespace() == g.ns {
				stored[o.GetEventId()]++
			}
		}
		var missing []string
		for id := range want {
			if stored[id] == 0 {
				missing = append(missing, id)
			}
		}
		n := len(missing)
		if n > 10 {
			missing = append(missing[:10], "...")
		}
		return n == 0, fmt.Sprintf("%d of %d missing (%s)", n, len(want), strings.Join(missing, " "))
	})
	dups := 0
	for id, n := range stored {
		if n > 1 {
			dups++
			t.Errorf("event %s stored %d times", id, n)
		}
		if !want[id] {
			t.Errorf("stored occurrence %s was never created", id)
		}
	}
	t.Logf("%d created, %d stored, %d stored twice", len(want), len(stored), dups)
}

// ---- tests ----

// TestSIGKILLUnderLoad kills the agent process with SIGKILL while Events are
// being written, restarts it, and checks that the collector has every Event
// exactly once. Because the collector de-duplicates, "stored once" alone
// cannot fail; what the restarted agent sent again is counted on both sides
// (the collector's de-duplications after the kill, the agent's acks of
// duplicates) and bounded by what can have been in flight at the kill:
// ship.max_in_flight batches of ship.batch_size. A restart that re-listed
// instead of resuming at the collector's cursor would resend thousands.
func TestSIGKILLUnderLoad(t *testing.T) {
	dir := t.TempDir()
	col := startCollector(t, dir)
	const batchSize, inFlight = 100, 4
	cfgPath := filepath.Join(dir, "agent.yaml")
	// hold.max_age 1s: the load's Events name pods that do not exist, so
	// each is held (and holds the cursor back) until then; with the 10 s
	// default nothing of the load would be acknowledged before the kill.
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf("ship:\n  batch_size: %d\n  max_in_flight: %d\nhold:\n  max_age: 1s\n", batchSize, inFlight)), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", cfgPath, "--collector", col.addr(), "--cluster", "kill", "--leader-elect=false"}
	a := startChild(t, dir, "agent-1", args...)
	waitFor(t, 60*time.Second, "agent ready", func() (bool, string) { return a.ready(), "" })
	// The initial listing (everything earlier tests left in the cluster) is
	// over once the collector holds a cursor; only then does a restart
	// resume instead of listing again.
	var cursor0 string
	waitFor(t, 120*time.Second, "a cursor at the collector", func() (bool, string) {
		rv, ok := col.c.Store().ClusterCursor("kill", "events")
		cursor0 = rv
		return ok, ""
	})

	g := newLoadGen(t, "load-kill")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	loadDone := make(chan error, 1)
	go func() { loadDone <- g.run(ctx, 3000, 400, 8) }()
	// Kill once part of the load is acknowledged, so batches are in flight.
	waitFor(t, 60*time.Second, "the load to be acknowledged in part", func() (bool, string) {
		rv, _ := col.c.Store().ClusterCursor("kill", "events")
		return rv != cursor0, rv
	})
	time.Sleep(time.Second)
	a.kill()
	t.Logf("agent killed with %d events created", len(g.created()))
	time.Sleep(time.Second) // appends the collector had under way finish
	dedupBefore := col.deduplicated(t)
	b := startChild(t, dir, "agent-2", args...)
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}
	checkDelivered(t, col, g, 60*time.Second)
	if n, err := b.metric("eventpipe_agent_relists_total", ""); err != nil || n != 0 {
		t.Errorf("restarted agent relisted %v times (err %v), want 0: it must resume from the collector's cursor", n, err)
	}
	var dups, acked float64
	waitFor(t, 30*time.Second, "the restarted agent's acks to match the collector's de-duplications", func() (bool, string) {
		dups = col.deduplicated(t) - dedupBefore
		var err error
		acked, err = b.metric("eventpipe_agent_acked_occurrences_total", `result="duplicate"`)
		return err == nil && acked == dups, fmt.Sprintf("collector de-duplicated %v, agent acked %v duplicates (err %v)", dups, acked, err)
	})
	resent, _ := b.metric("eventpipe_agent_resent_occurrences_total", "")
	if limit := float64(inFlight * batchSize); dups > limit {
		t.Errorf("after the restart the collector de-duplicated %v occurrences, more than the %v that can have been in flight at the kill", dups, limit)
	}
	t.Logf("after the kill: collector de-duplicated %v, restarted agent acked %v duplicates and re-sent %v occurrences on reconnects", dups, acked, resent)
}

// TestResumeAfterCompaction stops the agent, writes Events, compacts etcd so
// the agent's cursor is gone (410), and checks that the restarted agent
// relists and the collector ends with every Event exactly once.
func TestResumeAfterCompaction(t *testing.T) {
	dir := t.TempDir()
	col := startCollector(t, dir)
	args := []string{"--collector", col.addr(), "--cluster", "compact", "--leader-elect=false"}
	a := startChild(t, dir, "agent-1", args...)
	waitFor(t, 60*time.Second, "agent ready", func() (bool, string) { return a.ready(), "" })
	g := newLoadGen(t, "load-compact")
	ctx := context.Background()
	if err := g.run(ctx, 500, 500, 4); err != nil {
		t.Fatal(err)
	}
	checkDelivered(t, col, g, 60*time.Second)
	a.stop(t)
	if err := g.run(ctx, 500, 500, 4); err != nil {
		t.Fatal(err)
	}
	rev, err := cluster.Compact(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("compacted etcd at revision %d", rev)
	b := startChild(t, dir, "agent-2", args...)
	checkDelivered(t, col, g, 60*time.Second)
	expired, _ := b.metric("eventpipe_agent_watch_expired_total", "")
	relists, _ := b.metric("eventpipe_agent_relists_total", "")
	if expired < 1 || relists < 1 {
		t.Errorf("after compaction: watch_expired_total=%v relists_total=%v, want both >= 1", expired, relists)
	}
}

// TestLeaderFailover runs two replicas with leader election, kills the
// leader under load, and checks that the other takes over from the
// collector's cursor with nothing lost or stored twice.
func TestLeaderFailover(t *testing.T) {
	dir := t.TempDir()
	col := startCollector(t, dir)
	cfgPath := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte(`leader_election:
  enabled: true
  namespace: eventpipe
  name: eventpipe-agent-failover
  lease_duration: 4s
  renew_deadline: 3s
  retry_period: 500ms
hold:
  max_age: 1s
`), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", cfgPath, "--collector", col.addr(), "--cluster", "failover"}
	reps := map[string]*child{
		"replica-a": startChild(t, dir, "replica-a", args...),
		"replica-b": startChild(t, dir, "replica-b", args...),
	}
	cs, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	holder := func() string {
		l, err := cs.CoordinationV1().Leases("eventpipe").Get(context.Background(), "eventpipe-agent-failover", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	var leader string
	waitFor(t, 60*time.Second, "a leader", func() (bool, string) {
		leader = holder()
		c, ok := reps[leader]
		if !ok {
			return false, "no holder"
		}
		n, _ := c.metric("eventpipe_agent_leader", "")
		return n == 1 && c.ready(), leader
	})
	// The leader's initial listing is over once the collector holds a
	// cursor: the failover below must resume, not list.
	var cursor0 string
	waitFor(t, 120*time.Second, "a cursor at the collector", func() (bool, string) {
		rv, ok := col.c.Store().ClusterCursor("failover", "events")
		cursor0 = rv
		return ok, ""
	})
	g := newLoadGen(t, "load-failover")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	loadDone := make(chan error, 1)
	go func() { loadDone <- g.run(ctx, 3000, 400, 8) }()
	// Kill once part of the load is acknowledged: the new leader must
	// resume mid-stream.
	waitFor(t, 60*time.Second, "the load to be acknowledged in part", func() (bool, string) {
		rv, _ := col.c.Store().ClusterCursor("failover", "events")
		return rv != cursor0, rv
	})
	time.Sleep(time.Second)
	var other *child
	for n, c := range reps {
		if n != leader {
			other = c
		}
	}
	// The standby does not watch (or list) Events while the leader leads.
	for _, verb := range []string{"watch", "list"} {
		if n, err := other.metric("eventpipe_agent_api_requests_total", `resource="events",verb="`+verb+`"`); err != nil || n != 0 {
			t.Errorf("standby %s issued %v %s requests on Events before the failover (err %v), want 0", other.name, n, verb, err)
		}
	}
	reps[leader].kill()
	t.Logf("leader %s killed with %d events created", leader, len(g.created()))
	time.Sleep(time.Second) // appends the collector had under way finish
	cursor, ok := col.c.Store().ClusterCursor("failover", "events")
	if !ok {
		t.Fatal("no cursor at the collector after the leader shipped for 3 s")
	}
	apiMetric := func(name string) float64 {
		v, found, err := cluster.MetricSum(ctx, name, map[string]string{"resource": "events"})
		if err != nil || !found {
			t.Fatalf("kube-apiserver metric %s: found %v, err %v", name, found, err)
		}
		return v
	}
	listsBefore, err := cluster.APIRequestCount(ctx, kube.RequestFilter{Resource: "events", Verb: "LIST"})
	if err != nil {
		t.Fatal(err)
	}
	watchListsBefore := apiMetric("apiserver_watch_list_duration_seconds_count")
	sentBefore := apiMetric("apiserver_watch_events_total")
	waitFor(t, 30*time.Second, "the other replica to lead", func() (bool, string) {
		n, _ := other.metric("eventpipe_agent_leader", "")
		return n == 1, holder()
	})
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}
	checkDelivered(t, col, g, 60*time.Second)

	// The new leader resumed from the collector's cursor: it says so, it
	// did not relist, and the apiserver sent it only the Events after that
	// cursor (each once, plus a few bookmarks).
	if rv := resumedFrom(t, other); rv != cursor {
		t.Errorf("new leader resumed its watch from resourceVersion %q, want the collector's cursor %q", rv, cursor)
	}
	if n, err := other.metric("eventpipe_agent_relists_total", ""); err != nil || n != 0 {
		t.Errorf("new leader relisted Events %v times (err %v), want 0", n, err)
	}
	lists, err := cluster.APIRequestCount(ctx, kube.RequestFilter{Resource: "events", Verb: "LIST"})
	if err != nil {
		t.Fatal(err)
	}
	if d := lists - listsBefore; d != 0 {
		t.Errorf("kube-apiserver counted %v LISTs of Events during the failover, want 0", d)
	}
	if d := apiMetric("apiserver_watch_list_duration_seconds_count") - watchListsBefore; d != 0 {
		t.Errorf("kube-apiserver served %v watch-lists of Events during the failover, want 0", d)
	}
	after := 0
	cur, _ := strconv.ParseUint(cursor, 10, 64)
	for id := range g.created() {
		if rv, err := strconv.ParseUint(id[strings.LastIndexByte(id, '/')+1:], 10, 64); err == nil && rv > cur {
			after++
		}
	}
	sent := apiMetric("apiserver_watch_events_total") - sentBefore
	if limit := float64(after + 50); sent > limit {
		t.Errorf("kube-apiserver sent %v Event watch events to the new leader, but only %d Events were created after the cursor %s (limit %v): it listed what was already stored", sent, after, cursor, limit)
	}
	t.Logf("failover: cursor %s, %d Events created after it, %v watch events sent to the new leader", cursor, after, sent)
}

// resumedFrom reads from c's JSON log the resourceVersion its first term
// resumed the Event watch from.
func resumedFrom(t *testing.T, c *child) string {
	t.Helper()
	f, err := os.Open(c.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg string `json:"msg"`
			RV  string `json:"resourceVersion"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "resuming event watch" {
			return line.RV
		}
	}
	t.Fatalf("%s: no \"resuming event watch\" line in its log", c.name)
	return ""
}
