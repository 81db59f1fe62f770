package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// The side-by-side backlog: the most used standalone exporter,
// kubernetes-event-exporter, on the same backlog as the agent. It is not
// part of this repository and is not built by it: -exporter names a binary
// built from its public source. It runs with its file receiver (one JSON
// line per exported Event) so that what it delivered can be counted, as a
// child process so that its CPU and memory are its own, with the admin
// token (it GETs each Event's involved object, of any kind, for labels
// and annotations unless omitLookup is set).
var (
	exporterBin      = flag.String("exporter", "", "side by side: a kubernetes-event-exporter binary (built from its public source; not part of this repository), run on the same backlogs as the agent; empty skips it")
	exporterRunsFlag = flag.String("exporter-runs", "default,age,age-nolookup", "side by side: the exporter's configurations, one run each, comma-separated: default (its defaults: maxEventAgeSeconds 5, a GET of each Event's involved object, kubeQPS 5), age (maxEventAgeSeconds 86400, so a backlog is not discarded as old), age-nolookup (and omitLookup: true, no GETs)")
	exporterQuiet    = flag.Duration("exporter-quiet", 20*time.Second, "side by side: the exporter is done with a backlog it has not finished once, for this long, its output has not grown and it has used under 2% of a core (it has read and discarded the rest)")
	exporterMaxWait  = flag.Duration("exporter-max-wait", 3*time.Minute, "side by side: the longest the exporter is given for a backlog")
)

// exporterConfigs are the exporter's configurations by -exporter-runs name:
// the YAML keys set beside the file receiver.
var exporterConfigs = map[string]string{
	"default":      "",
	"age":          "maxEventAgeSeconds: 86400\n",
	"age-nolookup": "maxEventAgeSeconds: 86400\nomitLookup: true\n",
}

// exporterRuns runs the exporter once per -exporter-max-age on the Events
// in the apiserver (want of them; the backlog), then for live while the
// writers go on (0: no live window).
func (e *env) exporterRuns(ctx context.Context, label string, want int, live time.Duration) error {
	if *exporterBin == "" {
		return nil
	}
	for _, cfg := range strings.Split(*exporterRunsFlag, ",") {
		cfg = strings.TrimSpace(cfg)
		keys, ok := exporterConfigs[cfg]
		if !ok {
			return fmt.Errorf("-exporter-runs: unknown configuration %q (want default, age or age-nolookup)", cfg)
		}
		if err := e.exporterRun(ctx, label, cfg, keys, want, live); err != nil {
			return err
		}
	}
	return nil
}

func (e *env) exporterRun(ctx context.Context, label, cfgName, keys string, want int, live time.Duration) error {
	name := fmt.Sprintf("exporter-%s-%s", strings.ReplaceAll(label, " ", "-"), cfgName)
	kcfg, err := e.adminKubeconfig()
	if err != nil {
		return err
	}
	out := filepath.Join(e.dir, name+".jsonl")
	conf := "logLevel: warn\nlogFormat: json\n" + keys
	conf += "route:\n  routes:\n    - match:\n        - receiver: file\nreceivers:\n  - name: file\n    file:\n      path: " + out + "\n"
	cf := filepath.Join(e.dir, name+".yaml")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()
	lf, err := os.Create(filepath.Join(e.dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(*exporterBin, "-conf", cf, "-kubeconfig", kcfg, "-metrics-address", addr)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("start exporter: %w", err)
	}
	p := &agentProc{cmd: cmd, addr: addr, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); lf.Close(); close(p.done) }()
	defer p.stop()

	// Done: all exported, or quiet (no new line and next to no CPU: a
	// backlog being listed or discarded costs CPU without output), or out
	// of time.
	lines := &lineCounter{path: out}
	last, lastAt, busyAt := 0, start, start
	cpuPrev, cpuAt := 0.0, start
	for time.Since(start) < *exporterMaxWait {
		n := lines.count()
		if n > last {
			last, lastAt, busyAt = n, time.Now(), time.Now()
		}
		if d := time.Since(cpuAt); d >= time.Second {
			cpu, _, _ := p.usage()
			if (cpu-cpuPrev)/d.Seconds() > 0.02 {
				busyAt = time.Now()
			}
			cpuPrev, cpuAt = cpu, time.Now()
		}
		if n >= want || time.Since(busyAt) > *exporterQuiet {
			break
		}
		select {
		case <-p.done:
			return fmt.Errorf("exporter exited early; see %s", lf.Name())
		case <-time.After(200 * time.Millisecond):
		}
	}
	cpu, hwm, rss := p.usage()
	misses, _ := p.metric("kube_api_read_cache_misses", "")
	state := "stopped growing"
	switch {
	case last >= want:
		state = "all exported"
	case time.Since(start) >= *exporterMaxWait:
		state = fmt.Sprintf("stopped at %s, still busy", *exporterMaxWait)
	}
	fmt.Printf("[exporter %s] %s backlog %d Event objects: %d exported (%.1f%%, %s), the last %s after start; exporter CPU %.2f s; RSS peak %.1f MiB, now %.1f MiB; involved-object lookups %.0f (each a discovery of every API group and a GET)\n",
		cfgName, label, want, last, 100*float64(last)/float64(max(want, 1)), state, lastAt.Sub(start).Round(time.Millisecond), cpu, hwm, rss, misses)
	if live <= 0 {
		return nil
	}
	ch, stop, err := watchChanges(ctx, e.cs)
	if err != nil {
		return err
	}
	n0 := lines.count()
	cpu0, _, _ := p.usage()
	time.Sleep(live)
	stop()
	cpu1, hwm1, _ := p.usage()
	n1 := lines.count()
	fmt.Printf("[exporter %s] %s live %s: the apiserver had %s; %d exported; exporter CPU %.2f s; RSS peak %.1f MiB\n",
		cfgName, label, live, ch, n1-n0, cpu1-cpu0, hwm1)
	return nil
}

// adminKubeconfig writes (once) a kubeconfig with the admin credentials.
func (e *env) adminKubeconfig() (string, error) {
	path := filepath.Join(e.dir, "admin.kubeconfig")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	return path, writeKubeconfig(e.cluster.AdminConfig(), "admin", path)
}

// lineCounter counts the lines of a growing file, reading only what was
// appended since the last count.
type lineCounter struct {
	path string
	off  int64
	n    int
}

func (c *lineCounter) count() int {
	f, err := os.Open(c.path)
	if err != nil {
		return c.n // not created yet: nothing exported
	}
	defer f.Close()
	if _, err := f.Seek(c.off, io.SeekStart); err != nil {
		return c.n
	}
	buf := make([]byte, 1<<20)
	for {
		k, err := f.Read(buf)
		c.n += bytes.Count(buf[:k], []byte{'\n'})
		c.off += int64(k)
		if err != nil {
			return c.n
		}
	}
}

// changes counts what the apiserver's Event watch delivered: new Event
// objects and updates of existing ones (a kubelet's correlator bumping a
// count, a series); and, as a check that does not depend on the watch, how
// much the Events' counts grew between a listing before and one after.
type changes struct {
	added, modified, errors atomic.Int64
	ended                   atomic.Bool // the watch closed before stop
	countsBefore            int64
	countsAfter             int64
}

func (c *changes) String() string {
	s := fmt.Sprintf("%d Event changes (%d new objects, %d updates; their counts grew by %d)", c.added.Load()+c.modified.Load(), c.added.Load(), c.modified.Load(), c.countsAfter-c.countsBefore)
	if c.errors.Load() > 0 || c.ended.Load() {
		s += fmt.Sprintf(" [the watch had %d errors, ended early: %v]", c.errors.Load(), c.ended.Load())
	}
	return s
}

// countSum is the sum of every Event's count (at least 1 each): one per
// report a writer's recorder let through.
func countSum(ctx context.Context, cs kubernetes.Interface) (int64, error) {
	l, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list events: %w", err)
	}
	var n int64
	for _, ev := range l.Items {
		n += int64(max(ev.Count, 1))
	}
	return n, nil
}

// watchChanges counts Event changes in every namespace from now until stop.
func watchChanges(ctx context.Context, cs kubernetes.Interface) (*changes, func(), error) {
	c := &changes{}
	var err error
	if c.countsBefore, err = countSum(ctx, cs); err != nil {
		return nil, nil, err
	}
	l, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, nil, fmt.Errorf("list events: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := cs.CoreV1().Events("").Watch(wctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("watch events: %w", err)
	}
	var stopping atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added:
				c.added.Add(1)
			case watch.Modified:
				c.modified.Add(1)
			case watch.Error:
				c.errors.Add(1)
			}
		}
		c.ended.Store(!stopping.Load())
	}()
	return c, func() {
		stopping.Store(true)
		w.Stop()
		cancel()
		<-done
		c.countsAfter, _ = countSum(ctx, cs) // 0 on error: the difference shows it
	}, nil
}
