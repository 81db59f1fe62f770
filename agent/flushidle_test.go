package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestFlushWhenIdle: with nothing in flight, an occurrence is shipped as
// soon as it is processed, not at the next flush_interval tick (here 60 s,
// so only the idle flush can deliver it in time, even on a loaded CI
// machine); with flush_when_idle off it waits for the tick.
func TestFlushWhenIdle(t *testing.T) {
	for _, tc := range []struct {
		idle   bool
		within time.Duration
	}{{true, 20 * time.Second}, {false, 3 * time.Second}} {
		t.Run(fmt.Sprintf("flush_when_idle=%v", tc.idle), func(t *testing.T) {
			col := startCollector(t, t.TempDir())
			cfg := testConfig(fmt.Sprintf("idle-%v", tc.idle), col.addr())
			cfg.Ship.FlushInterval = 60 * time.Second
			cfg.Ship.FlushWhenIdle = tc.idle
			ra := startAgent(t, cfg)
			waitFor(t, 60*time.Second, "agent synced", func() (bool, string) { return ra.a.synced.Load(), "" })
			g := newLoadGen(t, fmt.Sprintf("idle-%v", tc.idle))
			ctx := context.Background()
			now := metav1.Now()
			// About a Deployment: nothing to wait for in the caches, so the
			// occurrence goes straight into the batch.
			e := &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("web.%x", now.UnixNano()), Namespace: g.ns},
				InvolvedObject: corev1.ObjectReference{Kind: "Deployment", APIVersion: "apps/v1", Namespace: g.ns, Name: "web"},
				Reason:         "ScalingReplicaSet", Message: "Scaled up replica set web-5d4f8 from 0 to 1", Type: corev1.EventTypeNormal,
				Source: corev1.EventSource{Component: "deployment-controller"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
			}
			created := time.Now()
			if _, err := g.cs.CoreV1().Events(g.ns).Create(ctx, e, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			arrived := func() bool {
				for _, o := range col.all(t) {
					if o.GetNamespace() == g.ns && o.GetReason() == "ScalingReplicaSet" {
						return true
					}
				}
				return false
			}
			deadline := created.Add(tc.within)
			for !arrived() && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			got := arrived()
			switch {
			case tc.idle && !got:
				t.Fatalf("occurrence not at the collector %s after the Event was created, with flush_when_idle", tc.within)
			case !tc.idle && got:
				t.Fatalf("occurrence at the collector within %s with flush_when_idle off and a 60 s flush_interval: something else flushes", tc.within)
			case tc.idle:
				t.Logf("created -> stored in %s", time.Since(created).Round(time.Millisecond))
			}
		})
	}
}
