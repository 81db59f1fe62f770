package hollowload

import (
	"errors"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestDescribe(t *testing.T) {
	for _, c := range []struct {
		name  string
		items []corev1.Event
		want  string
	}{
		{"none", nil, "0 Event objects, 0 of them aggregated ()"},
		{"count folded, zero count as one, reporting controller when no source", []corev1.Event{
			{Source: corev1.EventSource{Component: "kubelet"}, Reason: "Failed", Count: 4},
			{Source: corev1.EventSource{Component: "kubelet"}, Reason: "Failed", Count: 2, Message: "(combined from similar events): Error: ErrImagePull"},
			{Source: corev1.EventSource{Component: "kubelet"}, Reason: "BackOff"},
			{ReportingController: "default-scheduler", Reason: "Scheduled", Count: 1},
		}, "4 Event objects, 1 of them aggregated (default-scheduler Scheduled: 1 objects, count 1; kubelet BackOff: 1 objects, count 1; kubelet Failed: 2 objects, count 6)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Describe(c.items); got != c.want {
				t.Errorf("Describe = %q, want %q", got, c.want)
			}
		})
	}
}

func TestEachRunsAllAndReportsAnError(t *testing.T) {
	var ran atomic.Int64
	boom := errors.New("boom")
	err := each(50, func(i int) error {
		ran.Add(1)
		if i == 17 {
			return boom
		}
		return nil
	})
	if ran.Load() != 50 || !errors.Is(err, boom) {
		t.Errorf("ran %d of 50, err %v; want all 50 and boom", ran.Load(), err)
	}
	if err := each(3, func(int) error { return nil }); err != nil {
		t.Errorf("no failure: err %v", err)
	}
}

func TestPodsPerNodeFitsAll(t *testing.T) {
	for _, c := range []struct{ pods, nodes int }{{150, 3}, {500, 5}, {1, 1}, {7, 3}} {
		if got := podsPerNode(c.pods, c.nodes); got*c.nodes < c.pods+10 {
			t.Errorf("podsPerNode(%d, %d) = %d: %d nodes hold fewer than the pods and some room", c.pods, c.nodes, got, c.nodes)
		}
	}
}
