package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/bench/hollowload"
	"github.com/eventpipe/eventpipe/testenv/kube"
)

// The load mode: Events written by real kubelets instead of by this
// harness (bench/hollowload: hollow nodes whose runtime fails every pull
// of the workload image as containerd 2.x does, bare pods with that image
// placed by kube-scheduler); their kubelets write Pulling, Failed, BackOff
// with their own back-off and event correlation (a repeat bumps the count
// of one Event object), for as long as the pods exist.
var (
	hollowNodes = flag.Int("hollow-nodes", 0, "load mode: hollow nodes (real kubelets) whose pulls of the workload image fail; 0 skips it")
	failingPods = flag.Int("failing-pods", 100, "load mode: pods whose image pull fails, placed by kube-scheduler on the hollow nodes")
	hollowFor   = flag.Duration("hollow-for", 90*time.Second, "load mode: how long the kubelets write Events before the agent starts")
	hollowLive  = flag.Duration("hollow-live", 30*time.Second, "load mode: how long the agent is measured after its backlog, while the kubelets keep writing")
)

// hollowRun runs the load mode on a control plane of its own with every
// writer: the Events the writers wrote during hollowFor are the backlog an
// agent of each binary (and, with -exporter, the exporter) starts on; each
// then keeps running for hollowLive. The writers go on meanwhile, so each
// program starts on the backlog of its own start, listed just before.
func hollowRun(ctx context.Context, dir string, bins []binary) error {
	e, err := newEnvWith(ctx, filepath.Join(dir, "hollow"), kube.AllWriters)
	if err != nil {
		return err
	}
	defer e.cluster.Stop()
	e.bins = bins
	t0 := time.Now()
	if err := hollowload.AddNodes(ctx, e.cluster, *hollowNodes, *failingPods, false); err != nil {
		return err
	}
	fmt.Printf("load mode: %d hollow nodes Ready in %s\n", *hollowNodes, time.Since(t0).Round(time.Millisecond))
	if err := hollowload.Pods(ctx, e.cluster, e.cs, *failingPods); err != nil {
		return err
	}
	fmt.Printf("load mode: %d pods created; the kubelets write for %s\n", *failingPods, *hollowFor)
	time.Sleep(*hollowFor)
	for _, b := range e.bins {
		listed, err := e.listBacklog(ctx)
		if err != nil {
			return err
		}
		if err := hollowAgent(ctx, e, b, listed); err != nil {
			return err
		}
	}
	if *exporterBin == "" {
		return nil
	}
	listed, err := e.listBacklog(ctx)
	if err != nil {
		return err
	}
	return e.exporterRuns(ctx, "hollow", listed, *hollowLive)
}

// listBacklog lists every Event in the apiserver (every namespace: the
// agent reads them all, the Node's own Events too), prints what the
// writers wrote and returns how many objects there are.
func (e *env) listBacklog(ctx context.Context) (int, error) {
	events, err := e.cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list events: %w", err)
	}
	fmt.Printf("load mode: backlog %s\n", hollowload.Describe(events.Items))
	return len(events.Items), nil
}

// hollowAgent starts an agent of binary b (fresh collector, no cursor) on
// the writers' backlog of listed Event objects, measures until that many
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
	// The backlog is in once as many occurrences made from Events are
	// stored as there were Event objects (the agent also makes occurrences
	// from pod statuses; they do not count here).
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if n, _, _ := storedBySource(ctx, col, 0, 0); n >= listed {
			break
		}
		if time.Now().After(deadline) {
			n, _, _ := storedBySource(ctx, col, 0, 0)
			return fmt.Errorf("hollow backlog: only %d occurrences from Events of %d Event objects stored in 10m", n, listed)
		}
	}
	elapsed := time.Since(start)
	cpu0, hwm0, _ := a.usage()
	_, stored0 := col.c.Store().Bounds()
	fromEvents, fromStatus, _ := storedBySource(ctx, col, 0, stored0)
	fmt.Printf("[%s] hollow backlog: %d Event objects written by the kubelets, scheduler and controllers acknowledged in %s (%d occurrences from Events, %d from pod status); agent CPU %.2f s; RSS peak %.1f MiB\n",
		b.name, listed, elapsed.Round(time.Millisecond), fromEvents, fromStatus, cpu0, hwm0)
	ch, stop, err := watchChanges(ctx, e.cs)
	if err != nil {
		return err
	}
	time.Sleep(*hollowLive)
	stop()
	cpu1, hwm1, rss1 := a.usage()
	_, stored1 := col.c.Store().Bounds()
	fromEvents, fromStatus, other := storedBySource(ctx, col, stored0, stored1)

	fmt.Printf("[%s] hollow live %s: the apiserver had %s; %d more occurrences stored (%.1f/s: %d from Events, %d from pod status, %d other); agent CPU %.2f s (%.1f%% of one core); RSS peak %.1f MiB, now %.1f MiB\n",
		b.name, *hollowLive, ch, stored1-stored0, float64(stored1-stored0)/hollowLive.Seconds(), fromEvents, fromStatus, other, cpu1-cpu0, 100*(cpu1-cpu0)/hollowLive.Seconds(), hwm1, rss1)
	return nil
}

// storedBySource counts the occurrences stored after offset from up to
// offset to (0: all): those
// made from a Kubernetes Event, and those the agent made from a pod's
// status (a container waiting in ErrImagePull or ImagePullBackOff, another
// waiting reason), which no Event change stands behind.
func storedBySource(ctx context.Context, c *col, from, to uint64) (events, podStatus, other int) {
	for next := from + 1; ; {
		recs, _, err := c.c.Store().Read(ctx, next, 4096)
		if err != nil || len(recs) == 0 {
			return events, podStatus, other
		}
		for _, r := range recs {
			if to > 0 && r.Offset > to {
				return events, podStatus, other
			}
			o := r.Occurrence
			switch {
			case o.GetPullFailure().GetSource() == eventpipev1.PullSourcePodStatus || o.GetBlocker().GetSource() == eventpipev1.PullSourcePodStatus:
				podStatus++
			case o.GetEvent().GetUid() != "":
				events++
			default:
				other++
			}
			next = r.Offset + 1
		}
	}
}
