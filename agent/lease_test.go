package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func testElector(t *testing.T, name, id string) *leaseElector {
	t.Helper()
	kc, err := newKubeClient(cluster.AgentConfig()) // the least-privilege token of deploy/agent
	if err != nil {
		t.Fatal(err)
	}
	return &leaseElector{kc: kc, namespace: "eventpipe", name: name, identity: id,
		leaseDuration: 3 * time.Second, renewDeadline: 2 * time.Second, retryPeriod: 200 * time.Millisecond,
		log: testLogger(t), now: time.Now}
}

// runElector runs e in the background; leading reports whether its term is
// on. The returned stop cancels it and waits for it (and its release).
func runElector(e *leaseElector) (leading *atomic.Bool, terms *atomic.Int32, stop func()) {
	leading, terms = &atomic.Bool{}, &atomic.Int32{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.run(ctx, func(lctx context.Context) {
			terms.Add(1)
			leading.Store(true)
			<-lctx.Done()
			leading.Store(false)
		})
	}()
	return leading, terms, func() { cancel(); <-done }
}

func TestLeaseElector(t *testing.T) {
	a := testElector(t, "elector-test", "replica-a")
	b := testElector(t, "elector-test", "replica-b")
	aLeads, _, stopA := runElector(a)
	waitFor(t, 10*time.Second, "a to lead", func() (bool, string) { return aLeads.Load(), "" })
	bLeads, bTerms, stopB := runElector(b)
	defer stopB()
	// b keeps campaigning while a renews: for several lease durations it
	// must never lead.
	deadline := time.Now().Add(2 * a.leaseDuration)
	for time.Now().Before(deadline) {
		if bLeads.Load() {
			t.Fatalf("b leads while a renews the Lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A clean stop releases the Lease: b takes over well before the lease
	// duration would have run out.
	start := time.Now()
	stopA()
	waitFor(t, 10*time.Second, "b to lead after a released", func() (bool, string) { return bLeads.Load(), "" })
	if d := time.Since(start); d >= a.leaseDuration {
		t.Errorf("handover took %s, not faster than the lease duration %s (release not used)", d, a.leaseDuration)
	}
	if bTerms.Load() != 1 {
		t.Errorf("b terms %d", bTerms.Load())
	}
	cs, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	l, err := cs.CoordinationV1().Leases("eventpipe").Get(context.Background(), "elector-test", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != "replica-b" || l.Spec.LeaseTransitions == nil || *l.Spec.LeaseTransitions < 1 {
		t.Errorf("lease spec after handover: %+v", l.Spec)
	}
}

// A replica running client-go's elector and one running leaseElector use the
// same Lease fields and so exclude each other, in both directions.
func TestLeaseElectorExcludesClientGo(t *testing.T) {
	cs, err := kubernetes.NewForConfig(cluster.AgentConfig())
	if err != nil {
		t.Fatal(err)
	}
	var cgLeads atomic.Bool
	runClientGo := func(ctx context.Context) chan struct{} {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: &resourcelock.LeaseLock{
				LeaseMeta:  metav1.ObjectMeta{Namespace: "eventpipe", Name: "elector-compat"},
				Client:     cs.CoordinationV1(),
				LockConfig: resourcelock.ResourceLockConfig{Identity: "client-go"},
			},
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { cgLeads.Store(true) },
				OnStoppedLeading: func() { cgLeads.Store(false) },
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); le.Run(ctx) }()
		return done
	}

	// client-go first: ours must wait.
	ctx, cancel := context.WithCancel(context.Background())
	cgDone := runClientGo(ctx)
	waitFor(t, 10*time.Second, "client-go to lead", func() (bool, string) { return cgLeads.Load(), "" })
	ours := testElector(t, "elector-compat", "eventpipe")
	oursLeads, _, stopOurs := runElector(ours)
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if oursLeads.Load() {
			t.Fatalf("leaseElector leads while client-go's elector holds the Lease")
		}
	}
	cancel()
	<-cgDone
	waitFor(t, 10*time.Second, "ours to lead after client-go released", func() (bool, string) { return oursLeads.Load(), "" })

	// Ours holds it: client-go must wait.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cgDone2 := runClientGo(ctx2)
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if cgLeads.Load() {
			t.Fatalf("client-go's elector leads while leaseElector holds the Lease")
		}
	}
	stopOurs()
	waitFor(t, 10*time.Second, "client-go to lead after ours released", func() (bool, string) { return cgLeads.Load(), "" })
	cancel2()
	<-cgDone2
}
