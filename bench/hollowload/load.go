package hollowload

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/osdriver"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// Namespace holds the bare failing pods of Pods.
const Namespace = "load"

// parallel is how many creations run at once (the apiserver shares two
// cores with every writer).
const parallel = 8

// podsPerNode is the pod capacity a node needs so that pods spread over
// nodes all fit, with room for the scheduler's uneven spread.
func podsPerNode(pods, nodes int) int { return pods/nodes + 10 }

// AddNodes starts nodes hollow nodes named hollow-0 ... able to hold pods
// pods between them. For sandboxes they are osdriver's node (its taint,
// pool label and runtime, which every osdriver sandbox tolerates and
// needs); otherwise untainted nodes whose runtime fails the pulls of
// scenario.ImageMissing.
func AddNodes(ctx context.Context, c *kube.Cluster, nodes, pods int, sandboxes bool) error {
	if nodes <= 0 {
		return fmt.Errorf("hollowload: %d nodes: need at least one", nodes)
	}
	for i := range nodes {
		nc := kube.NodeConfig{Runtime: kube.RuntimeConfig{Images: []kube.ImageRule{{Image: scenario.ImageMissing, Pull: kube.PullNotFound}}}}
		if sandboxes {
			nc = osdriver.Node()
		}
		nc.Name = fmt.Sprintf("hollow-%d", i)
		nc.Pods = podsPerNode(pods, nodes)
		if _, err := c.AddNode(ctx, nc); err != nil {
			return fmt.Errorf("hollowload: node %s: %w", nc.Name, err)
		}
	}
	return nil
}

// Pods creates n bare pods (failing-0 ...) with the missing image in
// Namespace, once its default service account exists.
func Pods(ctx context.Context, c *kube.Cluster, cs kubernetes.Interface, n int) error {
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("hollowload: namespace: %w", err)
	}
	if err := c.WaitServiceAccount(ctx, Namespace); err != nil {
		return fmt.Errorf("hollowload: %w", err)
	}
	return each(n, func(i int) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("failing-%d", i), Namespace: Namespace},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: scenario.ImageMissing}}}}
		if _, err := cs.CoreV1().Pods(Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("hollowload: pod %s: %w", p.Name, err)
		}
		return nil
	})
}

// Sandboxes creates n sandboxes of osdriver's img-missing scenario in shared
// mode (namespace "openshell", workspaces load-0 ...): per sandbox a
// workspace volume, the Sandbox CR (the controller makes the workload pod
// whose workspace-init pull fails) and the supervisor pod (which starts).
func Sandboxes(ctx context.Context, d *osdriver.Driver, n int) ([]osdriver.Sandbox, error) {
	out := make([]osdriver.Sandbox, n)
	err := each(n, func(i int) error {
		s, err := d.Run(ctx, "img-missing", osdriver.Params{Mode: scenario.ModeShared, Workspace: fmt.Sprintf("load-%d", i)})
		if err != nil {
			return fmt.Errorf("hollowload: sandbox %d: %w", i, err)
		}
		out[i] = s
		return nil
	})
	return out, err
}

// each runs f(0) ... f(n-1), parallel at a time, and returns the first error.
func each(n int, f func(int) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, parallel)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when none failed
}

// combinedPrefix starts the message of an Event the kubelet's correlator
// aggregated: client-go's record package folds more than 10 similar Events
// (same source, object, type and reason, other messages) within 10 minutes
// into one object with this prefix.
const combinedPrefix = "(combined from similar events): "

// Describe sums Events by writer and reason, with their counts (the
// kubelet's correlator folds repeats into one object whose count grows),
// and says how many are aggregated ones.
func Describe(items []corev1.Event) string {
	type k struct{ writer, reason string }
	objects, counts := map[k]int{}, map[k]int32{}
	combined := 0
	for _, ev := range items {
		if strings.HasPrefix(ev.Message, combinedPrefix) {
			combined++
		}
		w := ev.Source.Component
		if w == "" {
			w = ev.ReportingController
		}
		objects[k{w, ev.Reason}]++
		counts[k{w, ev.Reason}] += max(ev.Count, 1)
	}
	parts := make([]string, 0, len(objects))
	for key, n := range objects {
		parts = append(parts, fmt.Sprintf("%s %s: %d objects, count %d", key.writer, key.reason, n, counts[key]))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d Event objects, %d of them aggregated (%s)", len(items), combined, strings.Join(parts, "; "))
}
