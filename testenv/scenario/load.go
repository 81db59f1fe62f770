package scenario

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/flowcontrol"
)

// LoadOptions configure Load.
type LoadOptions struct {
	// Sandboxes to start (default 100).
	Sandboxes int
	// Rate is the target Event writes per second across all workers
	// (0: as fast as the apiserver takes them).
	Rate float64
	// Workers are concurrent client goroutines (default 16).
	Workers int
	Mode    Mode // default managed
	// Workspace (default "load"); sandboxes are named load-00000, ...
	Workspace string
	// NamePrefix replaces "load" in sandbox names (several loads in one
	// workspace need different prefixes).
	NamePrefix string
}

// LoadEventsPerSandbox is how many Events one sandbox start writes: the
// scheduler's two Scheduled, and the kubelet's Pulled (bootstrap), Pulling
// and Pulled (workload image), Created and Started (agent), Started
// (supervisor).
const LoadEventsPerSandbox = 8

// LoadResult is what Load achieved.
type LoadResult struct {
	Sandboxes int           // sandboxes fully played
	Events    int           // Event objects written
	Objects   int           // CRs and pods created
	Duration  time.Duration // wall time of the whole run
	EventRate float64       // achieved Events per second
	Errors    int           // sandboxes whose play failed
}

func (r LoadResult) String() string {
	return fmt.Sprintf("%d sandboxes, %d events, %d objects in %v: %.0f events/s, %d errors",
		r.Sandboxes, r.Events, r.Objects, r.Duration.Round(time.Millisecond), r.EventRate, r.Errors)
}

// LoadScenario is the scenario one load-generator sandbox plays.
func LoadScenario(sb Sandbox) (*Scenario, error) {
	b := NewBuilder("load", "one sandbox start with the usual eight events")
	b.SandboxCR(sb).WorkloadPod(sb).SupervisorPod(sb)
	schedule(b, sb)
	boot := sb.InitContainers()[0]
	b.After(400*time.Millisecond).Kubelet(sb, TargetWorkloadPod, boot.Name, corev1.EventTypeNormal, "Pulled", msgPresent(boot.Image), NamesImage(boot.Image))
	b.Kubelet(sb, TargetWorkloadPod, ContainerWorkspaceInit, corev1.EventTypeNormal, "Pulling", msgPulling(sb.Image), NamesImage(sb.Image))
	b.After(2*time.Second).Kubelet(sb, TargetWorkloadPod, ContainerWorkspaceInit, corev1.EventTypeNormal, "Pulled", msgPulled(sb.Image), NamesImage(sb.Image))
	b.After(time.Second).Kubelet(sb, TargetWorkloadPod, ContainerAgent, corev1.EventTypeNormal, "Created", msgCreated(ContainerAgent))
	b.Kubelet(sb, TargetWorkloadPod, ContainerAgent, corev1.EventTypeNormal, "Started", msgStarted(ContainerAgent))
	b.Kubelet(sb, TargetSupervisorPod, ContainerSupervisor, corev1.EventTypeNormal, "Started", msgStarted(ContainerSupervisor))
	return b.Build()
}

// Load starts o.Sandboxes sandboxes (CR, workload pod, supervisor pod and
// LoadEventsPerSandbox Events each) from o.Workers goroutines, holding the
// Event write rate at o.Rate, and reports the rate it achieved. It returns
// an error (with the partial result) when any sandbox failed.
func Load(ctx context.Context, c Clients, o LoadOptions) (LoadResult, error) {
	if o.Sandboxes <= 0 {
		o.Sandboxes = 100
	}
	if o.Workers <= 0 {
		o.Workers = 16
	}
	if o.Mode == "" {
		o.Mode = ModeManaged
	}
	if o.Workspace == "" {
		o.Workspace = "load"
	}
	if o.NamePrefix == "" {
		o.NamePrefix = "load"
	}
	if o.Rate < 0 {
		return LoadResult{}, fmt.Errorf("load: negative rate %v", o.Rate)
	}
	var limiter interface{ Wait(context.Context) error }
	if o.Rate > 0 {
		burst := max(1, int(o.Rate/10))
		rl := flowcontrol.NewTokenBucketRateLimiter(float32(o.Rate), burst)
		defer rl.Stop()
		limiter = rl
	}
	// The namespace once, up front.
	first := NewSandbox(o.NamePrefix, o.Workspace, o.Mode)
	ns, err := NewBuilder("load-namespace", "").Namespace(first).Build()
	if err != nil {
		return LoadResult{}, err
	}
	if _, err := Play(ctx, c, ns); err != nil {
		return LoadResult{}, fmt.Errorf("load: %w", err)
	}

	var (
		events, objects, done, failed atomic.Int64
		errMu                         sync.Mutex
		firstErr                      error
		wg                            sync.WaitGroup
	)
	work := make(chan int)
	start := time.Now()
	for range o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				sb := NewSandbox(fmt.Sprintf("%s-%05d", o.NamePrefix, i), o.Workspace, o.Mode)
				sc, err := LoadScenario(sb)
				var res *Result
				if err == nil {
					res, err = PlayWith(ctx, c, sc, Options{Limiter: limiter})
				}
				if err != nil {
					failed.Add(1)
					errMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					errMu.Unlock()
					continue
				}
				events.Add(int64(len(res.Events)))
				objects.Add(int64(len(res.UIDs)))
				done.Add(1)
			}
		}()
	}
feed:
	for i := range o.Sandboxes {
		select {
		case work <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	r := LoadResult{Sandboxes: int(done.Load()), Events: int(events.Load()), Objects: int(objects.Load()),
		Duration: time.Since(start), Errors: int(failed.Load())}
	if r.Duration > 0 {
		r.EventRate = float64(r.Events) / r.Duration.Seconds()
	}
	switch {
	case firstErr != nil:
		return r, fmt.Errorf("load: %d of %d sandboxes failed, first: %w", r.Errors, o.Sandboxes, firstErr)
	case ctx.Err() != nil:
		return r, fmt.Errorf("load: %w", ctx.Err())
	}
	return r, nil
}
