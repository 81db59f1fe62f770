package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/eventpipe/eventpipe/bench/hollowload"
	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/osdriver"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// The end-to-end run's load mode: the Events are written by the components
// that write them on a cluster (bench/hollowload: hollow nodes whose
// runtime fails the pulls of the workload image, sandboxes created as the
// OpenShell driver creates them, their workload pods made by the Agent
// Sandbox controller and placed by kube-scheduler), not by this harness.
var (
	hollowNodes = flag.Int("hollow-nodes", 0, "e2e load mode: hollow nodes (real kubelets) whose pulls of the workload image fail, and Events written by them, kube-scheduler, kube-controller-manager and the Agent Sandbox controller instead of -workers; 0: the harness writes the Events")
	failingPods = flag.Int("failing-pods", 50, "e2e load mode: sandboxes (shared mode) whose workload pod's image pull fails")
)

// hollowLoad starts the nodes, creates the sandboxes and, for e2eFor from
// the first sandbox on, reports each change of an Event in the sandboxes'
// namespace (event_id = UID/resourceVersion, as the agent names an
// occurrence) with the time this harness's own watch saw it: a reader
// beside the agent, so the latency measured from it is the pipeline's
// (agent, collector, proxy), not the writers' back-off.
func hollowLoad(ctx context.Context, cl *kube.Cluster, kc kubernetes.Interface, saw func(id string, at time.Time, what string)) error {
	t0 := time.Now()
	// Two pods a sandbox (workload and supervisor).
	if err := hollowload.AddNodes(ctx, cl, *hollowNodes, 2**failingPods, true); err != nil {
		return err
	}
	fmt.Printf("e2e load mode: %d hollow nodes Ready in %s\n", *hollowNodes, time.Since(t0).Round(time.Millisecond))
	ns := scenario.SharedNamespace
	l, err := kc.CoreV1().Events(ns).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return fmt.Errorf("list events: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := kc.CoreV1().Events(ns).Watch(wctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		return fmt.Errorf("watch events: %w", err)
	}
	defer w.Stop()
	stop := time.Now().Add(*e2eFor)
	drv, err := osdriver.New(cl.AdminConfig())
	if err != nil {
		return err
	}
	created := make(chan error, 1)
	go func() {
		t := time.Now()
		_, err := hollowload.Sandboxes(ctx, drv, *failingPods)
		if err == nil {
			fmt.Printf("e2e load mode: %d sandboxes created in %s; the writers write until %s from the first\n", *failingPods, time.Since(t).Round(time.Millisecond), *e2eFor)
		}
		created <- err
	}()
	timer := time.NewTimer(time.Until(stop))
	defer timer.Stop()
	for {
		select {
		case err := <-created:
			if err != nil {
				return err
			}
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("the harness's Event watch ended before %s", *e2eFor)
			}
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			now := time.Now()
			e, ok := ev.Object.(*corev1.Event)
			if !ok {
				return fmt.Errorf("the Event watch delivered %T", ev.Object)
			}
			w := e.Source.Component
			if w == "" {
				w = e.ReportingController
			}
			saw(string(e.UID)+"/"+e.ResourceVersion, now, w+" "+e.Reason+" "+e.InvolvedObject.Kind)
		case <-timer.C:
			return nil
		}
	}
}
