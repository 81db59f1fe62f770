package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/eventpipe/eventpipe/testenv/kube"
)

// kubeEnv is the real control plane (etcd + kube-apiserver) the agent
// drills share, started on first use.
type kubeEnv struct {
	c    *kube.Cluster
	cs   kubernetes.Interface
	kcfg string // the agent's kubeconfig (least-privilege token)
}

func (e *env) kube(ctx context.Context) (*kubeEnv, error) {
	if e.k != nil {
		return e.k, nil
	}
	c, err := kube.StartProcess(ctx, kube.Options{Dir: filepath.Join(e.dir, "kube"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	admin := c.AdminConfig()
	admin.QPS, admin.Burst = 1000, 1000
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		c.Stop()
		return nil, err
	}
	rc := c.AgentConfig()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["drills"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData, CertificateAuthority: rc.CAFile}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken}
	kc.Contexts["agent"] = &clientcmdapi.Context{Cluster: "drills", AuthInfo: "agent"}
	kc.CurrentContext = "agent"
	path := filepath.Join(e.dir, "agent.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		c.Stop()
		return nil, err
	}
	e.k = &kubeEnv{c: c, cs: cs, kcfg: path}
	return e.k, nil
}

// agentProc is the real `eventpipe agent` as a child process.
type agentProc struct {
	bin, kcfg, collector, listen string
	log                          *lockedBuffer
	cmd                          *exec.Cmd
	done                         chan error
}

func (a *agentProc) start(ctx context.Context) error {
	a.cmd = exec.Command(a.bin, "agent", "--kubeconfig", a.kcfg, "--collector", a.collector, "--insecure",
		"--cluster", "drills", "--leader-elect=false", "--listen", a.listen, "--log-level", "info")
	a.cmd.Stderr, a.cmd.Stdout = a.log, a.log
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		return err
	}
	a.done = make(chan error, 1)
	cmd, done := a.cmd, a.done
	go func() { done <- cmd.Wait() }()
	client := &http.Client{Timeout: 2 * time.Second}
	for deadline := time.Now().Add(90 * time.Second); ; {
		if resp, err := client.Get("http://" + a.listen + "/readyz"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent not ready after 90s:\n%s", tail(a.log.String(), 15))
		}
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("agent exited (%v):\n%s", err, tail(a.log.String(), 15))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (a *agentProc) signal(sig syscall.Signal) {
	if a.cmd == nil || a.cmd.ProcessState != nil {
		return
	}
	_ = a.cmd.Process.Signal(sig)
	select {
	case err := <-a.done:
		a.done <- err
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		err := <-a.done
		a.done <- err
	}
}

func (a *agentProc) metric(name string, labels ...string) float64 {
	v, err := scrape(a.listen, name, labels...)
	if err != nil {
		return -1
	}
	return v
}

// eventGen creates kubelet-shaped Warning Events in one namespace at a
// steady rate and remembers each one's event_id (uid/resourceVersion, as
// the agent computes it). A create that fails is retried (the apiserver
// may be restarting) and not counted until it succeeds.
type eventGen struct {
	cs      kubernetes.Interface
	ns      string
	mu      sync.Mutex
	ids     map[string]bool
	failed  int
	unknown []string // names whose create failed: it may have happened
}

func (g *eventGen) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := metav1.Now()
		pod := fmt.Sprintf("pod-%d", i%20)
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod, now.UnixNano()), Namespace: g.ns},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: g.ns, Name: pod, FieldPath: "spec.containers{agent}"},
			Reason:         "BackOff", Type: corev1.EventTypeWarning,
			Message: "Back-off restarting failed container agent in pod " + pod,
			Source:  corev1.EventSource{Component: "kubelet", Host: "node-1"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		out, err := g.cs.CoreV1().Events(g.ns).Create(cctx, ev, metav1.CreateOptions{})
		cancel()
		g.mu.Lock()
		if err != nil {
			g.failed++
			g.unknown = append(g.unknown, ev.Name)
		} else {
			g.ids[string(out.UID)+"/"+out.ResourceVersion] = true
		}
		g.mu.Unlock()
	}
}

// settle finds out which failed creates happened after all (a timeout
// after the apiserver stored the Event) and counts those. One not found is
// asked about again on the next call: a create the client gave up on can
// still be in the apiserver and be stored after the first look (CI23,
// 2026-12-05, at load 12: etcd-compaction-410 delivered an Event whose
// create had failed and which the first look did not find). Called after
// each read of a sink, it finds every such Event the sink holds.
func (g *eventGen) settle(ctx context.Context) error {
	g.mu.Lock()
	names := g.unknown
	g.unknown = nil
	g.mu.Unlock()
	for _, name := range names {
		ev, err := g.cs.CoreV1().Events(g.ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			g.mu.Lock()
			g.unknown = append(g.unknown, name)
			g.mu.Unlock()
			continue
		}
		if err != nil {
			return fmt.Errorf("settle failed create %s: %w", name, err)
		}
		g.mu.Lock()
		g.ids[string(ev.UID)+"/"+ev.ResourceVersion] = true
		g.failed--
		g.mu.Unlock()
	}
	return nil
}

func (g *eventGen) created() map[string]bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]bool, len(g.ids))
	for id := range g.ids {
		out[id] = true
	}
	return out
}

// agentDrill runs the real agent against the real control plane and
// collector while Events are created at 50/s, applies fault, and checks
// that every created Event reaches the file sink.
func agentDrill(ctx context.Context, e *env, name string, fault func(ctx context.Context, k *kubeEnv, a *agentProc) (string, error)) ([]SinkResult, error) {
	k, err := e.kube(ctx)
	if err != nil {
		return nil, err
	}
	ns := "drill-" + name
	if _, err := k.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	for i := range 20 {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i), Namespace: ns},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "registry.example.com/team/agent:1"}}}}
		if _, err := k.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
	}
	// The Events of earlier drills go, so this drill's fresh collector
	// holds only its own.
	defer func() {
		_ = k.cs.CoreV1().Events(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
	}()
	p, err := e.newPipeline(name, colOpts{})
	if err != nil {
		return nil, err
	}
	defer p.close()
	if err := p.col.start(ctx); err != nil {
		return nil, err
	}
	listen, err := freeAddr()
	if err != nil {
		return nil, err
	}
	a := &agentProc{bin: e.bin, kcfg: k.kcfg, collector: p.col.grpcAddr, listen: listen, log: &lockedBuffer{}}
	defer func() {
		a.signal(syscall.SIGKILL)
		_ = os.WriteFile(filepath.Join(p.dir, "agent.log"), []byte(a.log.String()), 0o644)
	}()
	if err := a.start(ctx); err != nil {
		return nil, err
	}
	gen := &eventGen{cs: k.cs, ns: ns, ids: map[string]bool{}}
	gctx, stopGen := context.WithCancel(ctx)
	genDone := make(chan struct{})
	go func() { gen.run(gctx, 20*time.Millisecond); close(genDone) }()
	sleep(ctx, 3*time.Second)
	note, err := fault(ctx, k, a)
	if err != nil {
		stopGen()
		<-genDone
		return nil, err
	}
	healed := time.Now()
	sleep(ctx, 2*time.Second)
	stopGen()
	<-genDone
	var created map[string]bool
	var r SinkResult
	for deadline := time.Now().Add(pick(e, 90*time.Second, 5*time.Minute)); ; {
		got, err := readFileSinkNS(p.file, ns)
		// After the read: every Event the sink holds is stored by now.
		if err := gen.settle(ctx); err != nil {
			return nil, err
		}
		created = gen.created()
		if err == nil {
			r = tally(name, "file", created, created, got)
			if r.Lost == 0 || time.Now().After(deadline) {
				r.Recover = time.Since(healed)
				break
			}
		} else if time.Now().After(deadline) {
			return nil, err
		}
		sleep(ctx, 200*time.Millisecond)
	}
	// Acked: what the collector stored (its store is this drill's alone).
	r.Acked = int(p.col.mustMetric("eventpipe_collector_log_appended_records_total"))
	r.Explained = int(p.col.mustMetric("eventpipe_sink_lost_records_total", `sink="file"`))
	r.Note = fmt.Sprintf("%s; agent: relists %v, 410s %v, batches resent %v, acked duplicates %v; %d creates failed (no Event)",
		note, a.metric("eventpipe_agent_relists_total"), a.metric("eventpipe_agent_watch_expired_total"),
		a.metric("eventpipe_agent_batches_total", `result="resent"`), a.metric("eventpipe_agent_acked_occurrences_total", `result="duplicate"`),
		gen.failed)
	if name == "etcd-compaction-410" && a.metric("eventpipe_agent_watch_expired_total") < 1 {
		r.Err = "the agent saw no 410 Gone: the drill did not exercise it"
	}
	if r.Lost > 0 {
		r.Note += fmt.Sprintf("; missing e.g. %v", missing(created, mustRead(p.file, ns), 3))
	}
	return []SinkResult{r}, nil
}

func mustRead(path, ns string) copies {
	c, _ := readFileSinkNS(path, ns)
	return c
}

func drillAgentSIGKILL(ctx context.Context, e *env) ([]SinkResult, error) {
	return agentDrill(ctx, e, "agent-sigkill", func(ctx context.Context, _ *kubeEnv, a *agentProc) (string, error) {
		// Kill while the agent holds occurrences the collector has not
		// acknowledged, when the scrape catches such a moment within 5 s.
		var age float64
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			if age = a.metric("eventpipe_agent_cursor_age_seconds"); age > 0 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		a.signal(syscall.SIGKILL)
		unacked := "nothing unacknowledged seen at the kill"
		if age > 0 {
			unacked = fmt.Sprintf("killed with occurrences unacknowledged (cursor age %.3fs)", age)
		}
		start := time.Now()
		if err := a.start(ctx); err != nil {
			return "", fmt.Errorf("restart the agent: %w", err)
		}
		return fmt.Sprintf("agent SIGKILLed, %s, ready again in %s", unacked, time.Since(start).Round(time.Millisecond)), nil
	})
}

func drillAPIServerRestart(ctx context.Context, e *env) ([]SinkResult, error) {
	return agentDrill(ctx, e, "apiserver-restart", func(ctx context.Context, k *kubeEnv, _ *agentProc) (string, error) {
		start := time.Now()
		if err := k.c.RestartAPIServer(ctx); err != nil {
			return "", err
		}
		return fmt.Sprintf("kube-apiserver restarted in %s", time.Since(start).Round(time.Millisecond)), nil
	})
}

func drill410(ctx context.Context, e *env) ([]SinkResult, error) {
	return agentDrill(ctx, e, "etcd-compaction-410", func(ctx context.Context, k *kubeEnv, a *agentProc) (string, error) {
		// The agent is away while Events keep coming and etcd compacts
		// past its cursor: it resumes from the collector's cursor, gets
		// 410 Gone, and must relist.
		a.signal(syscall.SIGTERM)
		sleep(ctx, 3*time.Second)
		rev, err := k.c.Compact(ctx)
		if err != nil {
			return "", err
		}
		if err := a.start(ctx); err != nil {
			return "", fmt.Errorf("restart the agent: %w", err)
		}
		return fmt.Sprintf("agent stopped 3s, etcd compacted at revision %d, agent restarted", rev), nil
	})
}
