package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/eventpipe/eventpipe/testenv/demo"
	"github.com/eventpipe/eventpipe/testenv/evbin"
	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// childEnv makes the test binary run the command itself (as `make run`
// would), so the test drives the real program as a child process.
const childEnv = "EVENTPIPE_DEMO_CHILD_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(childEnv); ok {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := run(ctx, strings.Split(args, "\x1f"), os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	goleak.VerifyTestMain(m, kube.LeakOptions()...)
}

func TestFlagErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"stray argument":            {"extra"},
		"unknown mode":              {"--mode", "cloud"},
		"context without cluster":   {"--context", "x"},
		"scenarios with kubeconfig": {"--kubeconfig", "/nonexistent", "--scenarios", "img-missing"},
	} {
		var stderr bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &stderr); code != 2 {
			t.Errorf("%s: exit %d, want 2 (%s)", name, code, stderr.String())
		}
	}
}

// child is the command running as a child process, its output collected.
type child struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	done chan struct{}
	err  error
	// pids of every descendant seen while it ran.
	pids map[int]string
}

func startChild(t *testing.T, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(args, "\x1f"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, done: make(chan struct{}), pids: map[int]string{}}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c.mu.Lock()
			c.out.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
		}
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			t.Logf("child output:\n%s", c.output())
		}
	})
	return c
}

func (c *child) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// waitFor polls the output until ok says yes, recording descendants.
func (c *child) waitFor(t *testing.T, what string, timeout time.Duration, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c.recordDescendants()
		if ok(c.output()) {
			return
		}
		select {
		case <-c.done:
			t.Fatalf("the command exited (%v) before %s", c.err, what)
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
	}
}

// recordDescendants adds every process whose parent chain leads to the
// child (from /proc) to c.pids.
func (c *child) recordDescendants() {
	parents := map[int]int{}
	names := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(st)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		parents[pid] = ppid
		names[pid] = s[strings.IndexByte(s, '(')+1 : i]
	}
	root := c.cmd.Process.Pid
	for pid := range parents {
		for p, hops := pid, 0; p > 1 && hops < 64; p, hops = parents[p], hops+1 {
			if parents[p] == root {
				c.pids[pid] = names[pid]
				break
			}
		}
	}
}

// rowOf returns the table row of a sandbox in the last view printed.
func rowOf(out, name string) string {
	i := strings.LastIndex(out, "== ")
	if i < 0 {
		return ""
	}
	for _, l := range strings.Split(out[i:], "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == name {
			return l
		}
	}
	return ""
}

// lineHas: some line of out has every word as a field.
func lineHas(out string, words ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		n := 0
		for _, w := range words {
			for _, x := range f {
				if x == w {
					n++
					break
				}
			}
		}
		if n == len(words) {
			return true
		}
	}
	return false
}

func rowHas(out, name string, words ...string) bool {
	row := rowOf(out, name)
	if row == "" {
		return false
	}
	f := strings.Fields(row)
	for _, w := range words {
		found := false
		for _, x := range f {
			if x == w {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// stopAndCheck sends SIGINT, waits for a clean exit and checks that no
// process the command started is left.
func (c *child) stopAndCheck(t *testing.T, dataDir string) {
	t.Helper()
	c.recordDescendants()
	if err := c.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(90 * time.Second):
		t.Fatal("the command did not stop within 90s of SIGINT")
	}
	if c.err != nil {
		t.Errorf("exit after SIGINT: %v (want status 0)", c.err)
	}
	if !strings.Contains(c.output(), "stopped: agent") {
		t.Errorf("no stop message")
	}
	var left []string
	for pid, name := range c.pids {
		if kube.ProcessAlive(pid) {
			left = append(left, fmt.Sprintf("%d (%s)", pid, name))
		}
	}
	// And nothing anywhere still runs out of its data directory.
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cl, []byte(dataDir)) {
			pid, _ := strconv.Atoi(e.Name())
			if kube.ProcessAlive(pid) {
				left = append(left, e.Name()+" "+strings.ReplaceAll(string(cl), "\x00", " "))
			}
		}
	}
	if len(left) > 0 {
		t.Errorf("processes left behind after Ctrl-C: %v", left)
	}
}

// `make run` (no flags): the real writers and a hollow node; the embedded
// pipeline shows both seed diagnoses, from the kubelet's own Events, with
// the right cause and image role (retrying, then persistent), says where
// the data went, and on Ctrl-C stops with nothing left running. What the
// writers wrote is read back from the apiserver and followed into the file
// sink and `eventpipe diagnose` (checkWriters).
func TestMakeRun(t *testing.T) {
	dataDir := shortDataDir(t)
	cli := buildCLI(t)
	t0 := time.Now()
	c := startChild(t, "--plain", "--data-dir", dataDir, "--cli", cli)
	c.waitFor(t, "the control plane", 10*time.Minute, func(out string) bool { return strings.Contains(out, "control plane  kube-apiserver") })
	c.waitFor(t, "the hollow node", 5*time.Minute, func(out string) bool { return strings.Contains(out, "kubeconfig     ") })
	t.Logf("make run: control plane, writers and hollow node ready %s after start", time.Since(t0).Round(time.Second))
	c.waitFor(t, "a retrying pull failure", 3*time.Minute, func(out string) bool {
		return strings.Contains(out, " retrying\n") && strings.Contains(out, "BLOCKED")
	})
	c.waitFor(t, "both seed diagnoses, persistent", 4*time.Minute, func(out string) bool {
		return rowHas(out, "img-missing", "BLOCKED", "workload", scenario.ImageMissing, "not_found", "persistent") &&
			rowHas(out, "sup-bad", "BLOCKED", "supervisor", scenario.SupervisorImageBad, "not_found", "persistent") &&
			rowHas(out, "healthy", "clear") &&
			// Not an image: the claim has no class (shown first), so the
			// pod cannot be scheduled (the row below it).
			rowHas(out, "pvc-unbound", "BLOCKED", "volume", "PersistentVolumeClaim/workspace-pvc-unbound", "no_storage_class", "persistent") &&
			lineHas(out[strings.LastIndex(out, "== "):], "unschedulable", "Pod/pvc-unbound", "unbound_pvc")
	})
	c.waitFor(t, "where the data went", 2*time.Minute, func(out string) bool { return strings.Contains(out, "where the data went:") })
	t.Logf("make run: every default diagnosis in the view %s after start", time.Since(t0).Round(time.Second))
	out := c.output()
	for _, want := range []string{
		"fix sup-bad (supervisor image): tag 0.0.0-does-not-exist does not exist in ghcr.io/nvidia/openshell/supervisor: check the supervisor image setting of the gateway",
		"fix img-missing (workload image): tag 0.0.0-does-not-exist does not exist in docker.io/library/busybox",
		"fix pvc-unbound (volume): ", "fix pvc-unbound (unschedulable): ",
		"file sink", filepath.Join(dataDir, "events.jsonl"), "/metrics", "agent       ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dataDir, "events.jsonl")); err != nil || !bytes.Contains(b, []byte(scenario.SupervisorImageBad)) {
		t.Errorf("file sink %s: %v (%d bytes, without the supervisor failure)", filepath.Join(dataDir, "events.jsonl"), err, len(b))
	}
	if len(c.pids) < 2 {
		t.Errorf("expected etcd and kube-apiserver among the children, saw %v", c.pids)
	}
	checkDiagnoseCommand(t, out, cli)
	checkWriters(t, c, dataDir, scenario.ModeManaged, demo.DefaultScenarios)
	c.stopAndCheck(t, dataDir)
}

// shortDataDir is a data directory for make run short enough for the
// hollow node's unix sockets (t.TempDir() is named after the test and can
// be too long; see kube.Cluster.AddNode).
func shortDataDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "mr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return filepath.Join(d, "data")
}

// buildCLI builds cmd/eventpipe as make run does, for the view's "try"
// line to name (--cli).
func buildCLI(t *testing.T) string {
	t.Helper()
	root, err := kube.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "eventpipe")
	if err := evbin.Build(context.Background(), root, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// checkDiagnoseCommand runs the view's "try" line exactly as printed (the
// real `eventpipe diagnose` against the running pipeline's collector with
// the reader token: what a CLI user without kubectl gets), then the same
// command for single sandboxes.
func checkDiagnoseCommand(t *testing.T, out, cli string) {
	t.Helper()
	i := strings.LastIndex(out, "  try         ")
	if i < 0 {
		t.Fatal("no try line")
	}
	try := strings.Fields(strings.SplitN(out[i:], "\n", 2)[0])[1:]
	if try[0] != cli || try[1] != "diagnose" || try[len(try)-1] != "--supervisor" {
		t.Fatalf("try line %q does not name the built binary %s", try, cli)
	}
	diagnose := tryCommand(t, try)
	// Each scenario has a workspace of its own (managed mode: a namespace
	// each), named after it.
	if code, o := diagnose("sup-bad", "-w", "sup-bad", "-o", "json"); code != 1 ||
		!strings.Contains(o, `"image_role": "supervisor"`) || !strings.Contains(o, `"cause": "not_found"`) ||
		!strings.Contains(o, `"image": "`+scenario.SupervisorImageBad+`"`) || !strings.Contains(o, `"disposition": "persistent"`) {
		t.Errorf("eventpipe diagnose sup-bad: exit %d\n%s", code, o)
	}
	if code, o := diagnose("img-missing", "-w", "img-missing"); code != 1 ||
		!strings.Contains(o, "  workload image "+scenario.ImageMissing+": not_found [text rule, certain]\n") ||
		!strings.Contains(o, "fix: tag 0.0.0-does-not-exist does not exist in docker.io/library/busybox") {
		t.Errorf("eventpipe diagnose img-missing: exit %d\n%s", code, o)
	}
	if code, o := diagnose("healthy", "-w", "healthy"); code != 0 || !strings.Contains(o, "nothing blocks it") {
		t.Errorf("eventpipe diagnose healthy: exit %d\n%s", code, o)
	}
	if code, o := diagnose(try[len(try)-1]); code != 1 || !strings.Contains(o, "supervisor image "+scenario.SupervisorImageBad+" of gateway openshell: not_found") {
		t.Errorf("eventpipe diagnose --supervisor: exit %d\n%s", code, o)
	}
}

// The documented command for a real cluster: the same local pipeline on a
// kubeconfig, with the agent's read-only identity; it plays nothing and
// shows what the cluster's sandboxes say.
func TestRunAgainstACluster(t *testing.T) {
	cl := kube.Start(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	c := startChild(t, "--plain", "--data-dir", dataDir, "--kubeconfig", cl.Kubeconfig(), "--context", "agent")
	c.waitFor(t, "the pipeline", 2*time.Minute, func(out string) bool { return strings.Contains(out, "Ctrl-C stops everything") })
	clients, err := scenario.NewClients(cl.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := scenario.Build("sup-bad", scenario.Params{Mode: scenario.ModeShared, Workspace: "team"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := scenario.Play(ctx, clients, sc); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, "the cluster's sup-bad diagnosis", 2*time.Minute, func(out string) bool {
		return rowHas(out, "sup-bad", "BLOCKED", "supervisor", scenario.SupervisorImageBad, "not_found")
	})
	if strings.Contains(c.output(), "playing") {
		t.Errorf("it played scenarios into a cluster it did not start")
	}
	// Read-only: not even the agent's leader-election Lease was written.
	cs, err := kubernetes.NewForConfig(cl.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	leases, err := cs.CoordinationV1().Leases(kube.AgentNamespace).List(ctx, metav1.ListOptions{})
	if err != nil || len(leases.Items) != 0 {
		t.Errorf("leases in %s: %v (err %v), want none", kube.AgentNamespace, leases, err)
	}
	c.stopAndCheck(t, dataDir)
}

// tryCommand returns a function that runs the view's "try" command (try,
// its fields) without its last argument (--supervisor) and with args
// instead, returning the exit code and output.
func tryCommand(t *testing.T, try []string) func(args ...string) (int, string) {
	t.Helper()
	return func(args ...string) (int, string) {
		t.Helper()
		cmd := exec.Command(try[0], append(append([]string{}, try[1:len(try)-1]...), args...)...)
		var o bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &o
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, o.String()
	}
}
