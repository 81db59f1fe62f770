package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// The load mode: Events written by real kubelets instead of by this
// harness. Hollow nodes (testenv/kube AddNode: the kubelet v1.37.2 with
// eventpipe's CRI) fail every pull of the workload image as containerd 2.x
// does for a tag that does not exist; kube-scheduler spreads the pods over
// them; their kubelets write Pulling, Failed, BackOff with their own
// back-off and event correlation (a repeat bumps the count of one Event
// object), for as long as the pods exist.
var (
	hollowNodes = flag.Int("hollow-nodes", 0, "load mode: hollow nodes (real kubelets) whose pulls of the workload image fail; 0 skips it")
	failingPods = flag.Int("failing-pods", 100, "load mode: pods whose image pull fails, placed by kube-scheduler on the hollow nodes")
	hollowFor   = flag.Duration("hollow-for", 90*time.Second, "load mode: how long the kubelets write Events before the agent starts")
	hollowLive  = flag.Duration("hollow-live", 30*time.Second, "load mode: how long the agent is measured after its backlog, while the kubelets keep writing")
)

const hollowNS = "load"

// hollowRun runs the load mode on a control plane of its own with every
// writer: the Events the kubelets wrote during hollowFor are the backlog an
// agent of each binary starts on; then it keeps running for hollowLive.
func hollowRun(ctx context.Context, dir string, bins []binary) error {
	e, err := newEnvWith(ctx, filepath.Join(dir, "hollow"), kube.AllWriters)
	if err != nil {
		return err
	}
	defer e.cluster.Stop()
	e.bins = bins
	t0 := time.Now()
	perNode := *failingPods / *hollowNodes + 10
	for i := 0; i < *hollowNodes; i++ {
		_, err := e.cluster.AddNode(ctx, kube.NodeConfig{Name: fmt.Sprintf("hollow-%d", i), Pods: perNode,
			Runtime: kube.RuntimeConfig{Images: []kube.ImageRule{{Image: scenario.ImageMissing, Pull: kube.PullNotFound}}}})
		if err != nil {
			return err
		}
	}
	fmt.Printf("load mode: %d hollow nodes Ready in %s\n", *hollowNodes, time.Since(t0).Round(time.Millisecond))
	if err := ensureNS(ctx, e.cs, hollowNS); err != nil {
		return err
	}
	if err := e.cluster.WaitServiceAccount(ctx, hollowNS); err != nil {
		return err
	}
	if err := createFailingPods(ctx, e, *failingPods); err != nil {
		return err
	}
	fmt.Printf("load mode: %d pods created; the kubelets write for %s\n", *failingPods, *hollowFor)
	time.Sleep(*hollowFor)
	events, err := e.cs.CoreV1().Events(hollowNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	fmt.Printf("load mode: backlog %s\n", describeEvents(events.Items))
	for _, b := range e.bins {
		if err := hollowAgent(ctx, e, b, len(events.Items)); err != nil {
			return err
		}
	}
	return nil
}

// describeEvents sums Events by writer and reason, with their counts (the
// kubelet's correlator folds repeats into one object).
func describeEvents(items []corev1.Event) string {
	type k struct{ writer, reason string }
	objects, counts := map[k]int{}, map[k]int32{}
	for _, ev := range items {
		w := ev.Source.Component
		if w == "" {
			w = ev.ReportingController
		}
		objects[k{w, ev.Reason}]++
		counts[k{w, ev.Reason}] += max(ev.Count, 1)
	}
	var parts []string
	for key, n := range objects {
		parts = append(parts, fmt.Sprintf("%s %s: %d objects, count %d", key.writer, key.reason, n, counts[key]))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d Event objects (%s)", len(items), strings.Join(parts, "; "))
}

func createFailingPods(ctx context.Context, e *env, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("failing-%d", i), Namespace: hollowNS},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: scenario.ImageMissing}}}}
			if _, err := e.cs.CoreV1().Pods(hollowNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				errs <- fmt.Errorf("create pod %s: %w", p.Name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when none failed
}

// hollowAgent starts an agent of binary b (fresh collector, no cursor) on
// the kubelets' backlog of listed Event objects, measures until that many
// occurrences are stored, then for hollowLive while the kubelets go on.
func hollowAgent(ctx context.Context, e *env, b binary, listed int) error {
	col, err := startCollector(e.dir, "col-hollow-"+b.name)
	if err != nil {
		return err
	}
	defer col.stop()
	start := time.Now()
	a, err := e.startAgent(b, "hollow", col.c.GRPCAddr(), "bench-hollow")
	if err != nil {
		return err
	}
	defer a.stop()
	if err := waitStored(col, listed, 10*time.Minute); err != nil {
		return err
	}
	elapsed := time.Since(start)
	cpu0, hwm0, _ := a.usage()
	_, stored0 := col.c.Store().Bounds()
	fmt.Printf("[%s] hollow backlog: %d Event objects written by the kubelets, scheduler and controllers acknowledged in %s; agent CPU %.2f s; RSS peak %.1f MiB\n",
		b.name, listed, elapsed.Round(time.Millisecond), cpu0, hwm0)
	time.Sleep(*hollowLive)
	cpu1, hwm1, rss1 := a.usage()
	_, stored1 := col.c.Store().Bounds()
	fmt.Printf("[%s] hollow live %s: %d more occurrences stored (%.1f/s); agent CPU %.2f s (%.1f%% of one core); RSS peak %.1f MiB, now %.1f MiB\n",
		b.name, *hollowLive, stored1-stored0, float64(stored1-stored0)/hollowLive.Seconds(), cpu1-cpu0, 100*(cpu1-cpu0)/hollowLive.Seconds(), hwm1, rss1)
	return nil
}
