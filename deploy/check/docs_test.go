package check

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestDocsCommandsRun is the docs test of issue 22: the README's commands
// and the chart NOTES' commands run as printed, and the test fails naming
// the line when one stops working.
//
//   - README: the "by hand, piece by piece" block runs line by line on
//     the control plane its own `make dev-cluster` line starts (make lines
//     in the repository, the others in a temporary directory holding a .bin
//     link, as on a fresh clone: ./eventpipe-data is made there); long
//     runners (dev-cluster, collector, agent, follow, tail -f) are started
//     in the background, checked for what the README says they show, and
//     stopped with SIGINT as Ctrl-C would (an eventpipe command must then
//     exit 0). Then the enrich pipe (kubectl is kubeparts' kubectl, built
//     by `make kube-tools`) and the inline `.bin/eventpipe enrich --demo`.
//     Every other README sh block is listed with why it is not run here; a
//     new one fails.
//   - NOTES: the chart is installed with the real helm into the same
//     control plane twice, TLS on (a Secret of one's own, no readers: the
//     NOTES' helm upgrade adds one) and TLS off (a reader in the values).
//     The NOTES helm prints are read from its output and every kubectl,
//     helm and eventpipe line runs as printed (WS and SANDBOX filled in).
//
// The NOTES' `kubectl port-forward svc/...` runs as printed, in the
// background as a user keeps it: `make dev-cluster` runs kube-scheduler,
// kube-controller-manager (the StatefulSet and volume controllers) and a
// hollow node whose real kubelet sets up the collector pod's volumes (the
// ConfigMap, the Secrets, a hostPath volume bound to its claim) and whose
// CRI runs its container as a real `eventpipe collector` process (in a
// network namespace of its own); the port-forward reaches it through
// kube-apiserver, the kubelet's server and the CRI's streaming server
// (the test checks the pod's log, read through the kubelet, says it
// started), and the NOTES' follow, context and diagnose lines run through
// it. The chart's agent DaemonSet does not run (no DaemonSet controller;
// an agent pod would need the in-cluster kube-apiserver Service, which a
// hollow node's pods cannot reach): the test starts an agent with the
// chart's agent token and CA, shipping through the port-forward.
func TestDocsCommandsRun(t *testing.T) {
	d := newDocsRun(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeBlocks(t, string(readme))
	start := time.Now()
	d.runLines(blocks.byHand, readmeExpect)
	d.stopAll("collector", "agent", "follow", "tail") // the chart's collector takes 127.0.0.1:7070 next
	d.runLines(blocks.enrich, readmeExpect)
	inline := readmeInline(t, string(readme))
	d.runLines(inline, readmeExpect)
	t.Logf("README: %d lines run in %v", len(blocks.byHand)+len(blocks.enrich)+len(inline), time.Since(start).Round(time.Second))
	if d.kubeconfig == "" {
		t.Fatal("no control plane: the README's make dev-cluster line did not print its kubeconfig")
	}
	start = time.Now()
	d.chartNotes(notesCase{release: "ep", namespace: "eventpipe", tls: true})
	d.chartNotes(notesCase{release: "plain", namespace: "eventpipe-plain", tls: false,
		set: []string{"auth.readers[0].name=team-a", "auth.readers[0].workspaces={repro}"}})
	t.Logf("NOTES, TLS on and off: run in %v", time.Since(start).Round(time.Second))
}

// docsSandbox and docsWorkspace fill the NOTES' SANDBOX and WS: the
// sandbox the README's dev-cluster line plays.
const (
	docsSandbox   = "img-missing"
	docsWorkspace = "repro"
	docsCluster   = "dev"
)

type readmeCommands struct{ byHand, enrich []string }

// readmeNotRun: README sh blocks this test does not run, by a line they
// hold, and why.
var readmeNotRun = map[string]string{
	"make test   #": "make run is testenv/cmd/demo's TestMakeRun; make test is the suite this test is part of",
	`make run ARGS="--kubeconfig $HOME/.kube/config"`: "it needs a real cluster's kubeconfig; the same pipeline on a control plane of ours is TestMakeRun",
}

var shBlock = regexp.MustCompile("(?ms)^```sh\n(.*?)^```")

// readmeBlocks returns the command lines of the by-hand block and the
// enrich pipe, comments stripped; an sh block that is neither and not
// listed in readmeNotRun fails the test.
func readmeBlocks(t *testing.T, readme string) readmeCommands {
	t.Helper()
	var rc readmeCommands
	for _, m := range shBlock.FindAllStringSubmatch(readme, -1) {
		lines := commandLines(m[1])
		switch {
		case strings.Contains(m[1], "make dev-cluster"):
			rc.byHand = lines
		case strings.Contains(m[1], "eventpipe enrich"):
			rc.enrich = lines
		default:
			explained := false
			for key := range readmeNotRun {
				explained = explained || strings.Contains(m[1], key)
			}
			if !explained {
				t.Errorf("README sh block neither run by this test nor listed in readmeNotRun:\n%s", m[1])
			}
		}
	}
	if len(rc.byHand) == 0 || len(rc.enrich) == 0 {
		t.Fatalf("README: no by-hand block (make dev-cluster ...) or no enrich pipe found")
	}
	return rc
}

// readmeInline returns the README's inline commands of the offline
// enricher (`.bin/eventpipe enrich ...` in backticks).
func readmeInline(t *testing.T, readme string) []string {
	t.Helper()
	var out []string
	for _, m := range regexp.MustCompile("`(\\.bin/eventpipe enrich [^`]*)`").FindAllStringSubmatch(readme, -1) {
		out = append(out, m[1])
	}
	if len(out) == 0 {
		t.Errorf("README: no inline .bin/eventpipe enrich command found (the offline enricher's)")
	}
	return out
}

// shComment is a comment after a command: blank, #, blank.
var shComment = regexp.MustCompile(`\s+#\s.*$`)

func commandLines(block string) []string {
	var out []string
	for _, l := range strings.Split(block, "\n") {
		l = strings.TrimSpace(shComment.ReplaceAllString(l, ""))
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// expectation is what a doc line must do: run in the background until
// ready says so (then keep running), or end with exit status code and
// output that check accepts.
type expectation struct {
	name       string
	match      *regexp.Regexp
	background bool
	ready      func(d *docsRun, out string) (bool, string)
	code       int
	check      func(d *docsRun, out string) string // "" is fine, else what is wrong
}

func has(out string, subs ...string) string {
	for _, s := range subs {
		if !strings.Contains(out, s) {
			return fmt.Sprintf("output lacks %q", s)
		}
	}
	return ""
}

var kubeconfigLine = regexp.MustCompile(`export KUBECONFIG=(\S+)`)

// readmeExpect: what the README says each of its commands does. A line
// the table does not know must exit 0.
var readmeExpect = []expectation{
	{name: "build", match: regexp.MustCompile(`^make build\b`), check: func(d *docsRun, out string) string {
		if _, err := os.Stat(filepath.Join(d.bin, "eventpipe")); err != nil {
			return fmt.Sprintf("no eventpipe built: %v", err)
		}
		return ""
	}},
	{name: "dev-cluster", match: regexp.MustCompile(`^make dev-cluster\b`), background: true, ready: func(d *docsRun, out string) (bool, string) {
		m := kubeconfigLine.FindStringSubmatch(out)
		if m == nil {
			return false, "waiting for its export KUBECONFIG=... line"
		}
		if w := has(out, "played "+docsSandbox); w != "" {
			return false, w
		}
		d.kubeconfig = m[1]
		return true, ""
	}},
	{name: "collector", match: regexp.MustCompile(`eventpipe collector\b`), background: true, ready: func(d *docsRun, out string) (bool, string) {
		return strings.Contains(out, "collector started") && dialable("127.0.0.1:7070"), "waiting for \"collector started\" and 127.0.0.1:7070"
	}},
	{name: "agent", match: regexp.MustCompile(`eventpipe agent\b`), background: true, ready: func(d *docsRun, out string) (bool, string) {
		// It shipped: the collector's file sink has the sandbox's pull failure.
		b, _ := os.ReadFile(filepath.Join(d.work, "eventpipe-data", "events.jsonl"))
		return bytes.Contains(b, []byte(`"reason":"Failed"`)) && bytes.Contains(b, []byte(docsSandbox)), "waiting for the pull failure in eventpipe-data/events.jsonl"
	}},
	{name: "follow", match: regexp.MustCompile(`eventpipe follow\b`), background: true, ready: func(d *docsRun, out string) (bool, string) {
		return strings.Contains(out, "workload image") && strings.Contains(out, "not_found"), "waiting for the workload image's not_found line"
	}},
	{name: "diagnose", match: regexp.MustCompile(`eventpipe diagnose\b`), code: 1, check: func(d *docsRun, out string) string {
		return has(out, "sandbox "+docsSandbox, "BLOCKED", "not_found", "fix: ")
	}},
	{name: "tail", match: regexp.MustCompile(`^tail -f `), background: true, ready: func(d *docsRun, out string) (bool, string) {
		return strings.Contains(out, `"reason":"Failed"`) && strings.Contains(out, docsSandbox), "waiting for the pull failure's JSON line"
	}},
	{name: "enrich", match: regexp.MustCompile(`\| \.bin/eventpipe enrich\b`), check: func(d *docsRun, out string) string {
		return has(out, docsSandbox, "BLOCKED", "not_found")
	}},
	{name: "enrich-demo", match: regexp.MustCompile(`^\.bin/eventpipe enrich --demo\b`), check: func(d *docsRun, out string) string {
		return has(out, "BLOCKED", "not_found") // the bundled dump's seeds
	}},
}

// docsRun runs doc lines with bash, as a user pastes them.
type docsRun struct {
	t          *testing.T
	bin        string // the make BIN: kube-tools, helm, eventpipe
	work       string // the user's directory: .bin -> bin
	logs       string // each command's output
	kubeconfig string
	mu         sync.Mutex
	n          int
	bg         []*bgLine
}

func newDocsRun(t *testing.T) *docsRun {
	bin, err := filepath.Abs(BinDir(root))
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"kubectl", "helm"} {
		if _, err := os.Stat(filepath.Join(bin, tool)); err != nil {
			t.Fatalf("%s not built (make kube-tools chart-tools): %v", tool, err)
		}
	}
	if dialable("127.0.0.1:7070") {
		t.Fatal("127.0.0.1:7070 is taken: the README's collector listens there")
	}
	d := &docsRun{t: t, bin: bin, work: t.TempDir(), logs: t.TempDir()}
	if err := os.Symlink(bin, filepath.Join(d.work, ".bin")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.stopAll()
		// Ctrl-C on make dev-cluster leaves no control plane behind.
		if cfg, err := clientcmd.BuildConfigFromFlags("", d.kubeconfig); d.kubeconfig != "" && err == nil {
			if u, err := url.Parse(cfg.Host); err == nil && dialable(u.Host) {
				t.Errorf("kube-apiserver %s still answers after make dev-cluster was stopped", u.Host)
			}
		}
	})
	return d
}

// env is the user's environment: the binaries on PATH (kubectl, helm,
// eventpipe), make's BIN, a helm and an eventpipe config of the test's
// own, and the kubeconfig dev-cluster printed once it did.
func (d *docsRun) env() []string {
	env := append(os.Environ(),
		"PATH="+d.bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"BIN="+d.bin,
		"EVENTPIPE_BIN_DIR="+d.bin,
		"XDG_CONFIG_HOME="+filepath.Join(d.work, "config"),
		"HELM_CONFIG_HOME="+filepath.Join(d.work, "helm", "config"),
		"HELM_CACHE_HOME="+filepath.Join(d.work, "helm", "cache"),
		"HELM_DATA_HOME="+filepath.Join(d.work, "helm", "data"),
	)
	if d.kubeconfig != "" {
		env = append(env, "KUBECONFIG="+d.kubeconfig)
	}
	return env
}

// dirFor: make lines run in the repository (its Makefile), chart paths
// too; the rest in the user's directory, work.
func dirFor(line, work string) string {
	if strings.HasPrefix(line, "make ") || strings.Contains(line, " deploy/helm/eventpipe") {
		return root
	}
	return work
}

func (d *docsRun) command(ctx context.Context, line, dir string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -o pipefail; "+line)
	cmd.Dir = dir
	cmd.Env = d.env()
	// Its own process group, so a stop reaches everything it started
	// (make -> eventpipe-dev-cluster) as Ctrl-C would.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// runLines runs doc lines in order, each checked against the table.
func (d *docsRun) runLines(lines []string, table []expectation) {
	for _, line := range lines {
		d.runLine(line, dirFor(line, d.work), table)
	}
}

func (d *docsRun) runLine(line, dir string, table []expectation) {
	t := d.t
	t.Helper()
	e := expectation{name: "any"}
	for _, x := range table {
		if x.match.MatchString(line) {
			e = x
			break
		}
	}
	if e.background {
		b := d.start(e.name, line, dir)
		if err := b.waitReady(d, e.ready, 4*time.Minute); err != nil {
			t.Fatalf("doc line %q: %v", line, err)
		}
		t.Logf("doc line %q: running, as the docs say", line)
		return
	}
	start := time.Now()
	cmd := d.command(ctxT(t, 5*time.Minute), line, dir)
	out := d.outFile(cmd)
	code := exitCode(cmd.Run())
	if code != e.code {
		t.Fatalf("doc line %q: exit %d, want %d:\n%s", line, code, e.code, tailString(out.String(), 3000))
	}
	if e.check != nil {
		if w := e.check(d, out.String()); w != "" {
			t.Fatalf("doc line %q: %s:\n%s", line, w, tailString(out.String(), 3000))
		}
	}
	t.Logf("doc line %q: exit %d as the docs say (%v)", line, code, time.Since(start).Round(100*time.Millisecond))
}

func exitCode(err error) int {
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	}
	return -1
}

// outFile sends the command's output to a file of its own (a pipe
// would keep Wait waiting for whatever grandchild still holds it, like
// make's heartbeat sleep).
func (d *docsRun) outFile(cmd *exec.Cmd) *fileOut {
	d.t.Helper()
	d.mu.Lock()
	d.n++
	n := d.n
	d.mu.Unlock()
	f, err := os.Create(filepath.Join(d.logs, fmt.Sprintf("%03d.out", n)))
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { f.Close() })
	cmd.Stdout, cmd.Stderr = f, f
	return &fileOut{path: f.Name()}
}

// fileOut is a command's output so far.
type fileOut struct{ path string }

func (f *fileOut) String() string {
	b, _ := os.ReadFile(f.path)
	return string(b)
}

// bgLine is a doc line left running.
type bgLine struct {
	name, line string
	cmd        *exec.Cmd
	out        *fileOut
	done       chan struct{}
	err        error
	// ctrlC0: an eventpipe command, which exits 0 on Ctrl-C (docs/cli.md).
	ctrlC0 bool
}

func (d *docsRun) start(name, line, dir string) *bgLine {
	d.t.Helper()
	b := &bgLine{name: name, line: line, done: make(chan struct{}), ctrlC0: regexp.MustCompile(`^\S*eventpipe `).MatchString(line)}
	b.cmd = d.command(context.Background(), line, dir)
	b.out = d.outFile(b.cmd)
	if err := b.cmd.Start(); err != nil {
		d.t.Fatalf("doc line %q: %v", line, err)
	}
	go func() { b.err = b.cmd.Wait(); close(b.done) }()
	d.mu.Lock()
	d.bg = append(d.bg, b)
	d.mu.Unlock()
	return b
}

func (b *bgLine) waitReady(d *docsRun, ready func(*docsRun, string) (bool, string), within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		ok, why := ready(d, b.out.String())
		if ok {
			return nil
		}
		select {
		case <-b.done:
			return fmt.Errorf("ended (exit %d) before it showed what the docs say (%s):\n%s", exitCode(b.err), why, tailString(b.out.String(), 3000))
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not there within %v (%s):\n%s", within, why, tailString(b.out.String(), 3000))
		}
	}
}

// stop interrupts the line's process group as Ctrl-C does and waits.
func (b *bgLine) stop() error {
	select {
	case <-b.done:
		return nil
	default:
	}
	_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-b.done:
		return nil
	case <-time.After(time.Minute):
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		<-b.done
		return fmt.Errorf("did not stop within a minute of SIGINT")
	}
}

// stopAll stops the named background lines (none named: all), latest
// first.
func (d *docsRun) stopAll(names ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	keep := d.bg[:0:0]
	for i := len(d.bg) - 1; i >= 0; i-- {
		b := d.bg[i]
		named := len(names) == 0
		for _, n := range names {
			named = named || n == b.name
		}
		if !named {
			keep = append([]*bgLine{b}, keep...)
			continue
		}
		if err := b.stop(); err != nil {
			d.t.Errorf("doc line %q: %v", b.line, err)
		} else if code := exitCode(b.err); b.ctrlC0 && code != 0 {
			d.t.Errorf("doc line %q: exit %d on Ctrl-C, want 0:\n%s", b.line, code, tailString(b.out.String(), 2000))
		}
	}
	d.bg = keep
}

func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// notesCase is one install of the chart whose NOTES are run.
type notesCase struct {
	release, namespace string
	tls                bool
	set                []string
}

// notesLine finds a command in a NOTES line: an indented line that is
// one, one after "...: ", or one in backticks.
var notesLine = regexp.MustCompile("^\\s+((?:kubectl|helm|eventpipe) .*)$|: ((?:kubectl|helm|eventpipe) [^`]*)$|`((?:kubectl|helm|eventpipe) [^`]*)`")

// notesPlaceholders fills what NOTES leave to the reader.
var notesPlaceholders = strings.NewReplacer("WS", docsWorkspace, "SANDBOX", docsSandbox)

// chartNotes installs the chart with helm, reads the NOTES helm prints and
// runs their commands as printed.
func (d *docsRun) chartNotes(nc notesCase) {
	t := d.t
	t.Helper()
	ctx := ctxT(t, 10*time.Minute)
	cfg, err := clientcmd.BuildConfigFromFlags("", d.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nc.namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err) // (make dev-cluster makes eventpipe, for the agent's RBAC)
	}
	host := nc.release + "-eventpipe-collector." + nc.namespace + ".svc"
	args := []string{"install", nc.release, ChartDir(root), "-n", nc.namespace, "--set", "cluster=" + docsCluster}
	if nc.tls {
		// TLS from a Secret of one's own (cert-manager is not installed
		// here): a certificate for the Service's name.
		sec, err := tlsSecret(nc.release+"-tls", host)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Secrets(nc.namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--set", "tls.certManager.enabled=false", "--set", "tls.existingSecret="+sec.Name)
	} else {
		args = append(args, "-f", filepath.Join(root, "deploy", "check", "testdata", "values", "minimal.yaml"))
	}
	for _, s := range nc.set {
		args = append(args, "--set", s)
	}
	out, err := HelmKube(ctx, root, d.kubeconfig, args...)
	if err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	_, notes, ok := strings.Cut(string(out), "\nNOTES:\n")
	if !ok {
		t.Fatalf("helm install printed no NOTES:\n%s", out)
	}
	dir := filepath.Join(d.work, nc.release)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ran := map[string]bool{}
	for _, raw := range strings.Split(notes, "\n") {
		m := notesLine.FindStringSubmatch(strings.TrimRight(raw, " "))
		if m == nil {
			continue
		}
		line := notesPlaceholders.Replace(m[1] + m[2] + m[3])
		switch {
		case strings.Contains(line, " port-forward "):
			// To the chart's collector pod, through kube-apiserver, the
			// node's kubelet and its CRI; kept running for what follows.
			b := d.start("notes-port-forward", line, dir)
			if err := b.waitReady(d, func(_ *docsRun, out string) (bool, string) {
				return strings.Contains(out, "Forwarding from 127.0.0.1:7070") && dialable("127.0.0.1:7070"), "waiting for it to forward 127.0.0.1:7070"
			}, 2*time.Minute); err != nil {
				t.Fatalf("NOTES line %q (release %s): %v", line, nc.release, err)
			}
			// What answers is the pod's process: its log (the CRI's, read
			// through the kubelet) says it started from the chart's config.
			logs := d.command(ctx, "kubectl -n "+nc.namespace+" logs statefulset/"+nc.release+"-eventpipe-collector", dir)
			if out, err := logs.CombinedOutput(); err != nil || !strings.Contains(string(out), "collector started") {
				t.Fatalf("release %s: the collector pod's log: %v\n%s", nc.release, err, tailString(string(out), 2000))
			}
			t.Logf("NOTES line %q: forwarding to the chart's collector pod, as the NOTES say", line)
			d.chartAgent(ctx, cs, nc, dir, host)
			ran["port-forward"] = true
		case strings.HasPrefix(line, "eventpipe follow "):
			b := d.start("notes-follow", line, dir)
			if err := b.waitReady(d, func(_ *docsRun, out string) (bool, string) {
				return strings.Contains(out, "workload image") && strings.Contains(out, "not_found"), "waiting for the workload image's not_found line"
			}, 3*time.Minute); err != nil {
				t.Fatalf("NOTES line %q (release %s): %v", line, nc.release, err)
			}
			d.stopAll("notes-follow")
			t.Logf("NOTES line %q: showed the sandbox's pull failure, as the NOTES say", line)
			ran["follow"] = true
		case strings.HasPrefix(line, "eventpipe diagnose "):
			// After the NOTES' set-context line: no connection flags needed.
			d.runLine(line, dir, []expectation{{name: "diagnose", match: regexp.MustCompile(`.`), code: 1, check: func(_ *docsRun, out string) string {
				return has(out, "sandbox "+docsSandbox, "BLOCKED", "not_found")
			}}})
			ran["diagnose"] = true
		default:
			d.runLine(line, dirFor(line, dir), nil)
			for _, f := range []string{"reader.token", "ca.crt"} {
				if strings.HasSuffix(line, "> "+f) {
					if b, err := os.ReadFile(filepath.Join(dir, f)); err != nil || len(bytes.TrimSpace(b)) == 0 {
						t.Fatalf("NOTES line %q wrote no %s: %v", line, f, err)
					}
				}
			}
		}
	}
	for _, k := range []string{"port-forward", "follow", "diagnose"} {
		if !ran[k] {
			t.Errorf("release %s: NOTES have no %s line:\n%s", nc.release, k, notes)
		}
	}
	d.stopAll("chart-agent", "notes-port-forward")
}

// chartAgent starts an agent shipping the control plane's Events through
// the NOTES' port-forward to the chart's collector, with the chart's agent
// token and CA (read from its Secrets). The chart's own agent is a
// DaemonSet whose pods this cluster does not run (no DaemonSet controller,
// and an agent pod would need the in-cluster kube-apiserver Service, which
// a hollow node's pods cannot reach).
func (d *docsRun) chartAgent(ctx context.Context, cs kubernetes.Interface, nc notesCase, dir, host string) {
	t := d.t
	t.Helper()
	secrets := filepath.Join(dir, "agent")
	if err := os.MkdirAll(secrets, 0o700); err != nil {
		t.Fatal(err)
	}
	read := func(secret, key string) string {
		s, err := cs.CoreV1().Secrets(nc.namespace).Get(ctx, secret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(secrets, key)
		if err := os.WriteFile(path, s.Data[key], 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	conn := "--insecure"
	if nc.tls {
		conn = "--ca " + read(nc.release+"-tls", "ca.crt") + " --server-name " + host
	}
	a := d.start("chart-agent", fmt.Sprintf("%s agent --collector 127.0.0.1:7070 %s --token-file %s --cluster %s --leader-elect=false --listen 127.0.0.1:0",
		filepath.Join(d.bin, "eventpipe"), conn, read(nc.release+"-eventpipe-tokens", "agent.token"), docsCluster), dir)
	// What it ships is seen by the NOTES' follow line (with TLS off the
	// chart's values here have no file sink to look at).
	if err := a.waitReady(d, func(_ *docsRun, out string) (bool, string) {
		return strings.Contains(out, "resuming event watch"), "waiting for it to watch"
	}, 3*time.Minute); err != nil {
		t.Fatalf("an agent with the chart's token: %v", err)
	}
}

// tlsSecret is a kubernetes.io/tls Secret with ca.crt, as the chart
// expects of tls.existingSecret: a self-signed certificate for host.
func tlsSecret(name, host string) (*corev1.Secret, error) {
	crt, key, err := selfSigned(&x509.Certificate{Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign})
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": crt},
	}, nil
}
