package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/eventpipe/eventpipe/testenv/kube"
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

// The elector writes only the fields it owns: labels, annotations, owner
// references and spec fields it does not know (spec.strategy,
// spec.preferredHolder of coordinated leader election), set by someone
// else before or while it leads, survive its renewals and its release.
//
// spec.strategy and spec.preferredHolder are served only with the
// CoordinatedLeaderElection feature (off by default: the API server drops
// them otherwise), so this test runs its own control plane with it on.
func TestLeaseElectorKeepsFieldsItDoesNotOwn(t *testing.T) {
	ctx := context.Background()
	cle := kube.Start(t, kube.WithLogger(testLogger(t)),
		kube.WithAPIServerArgs("--feature-gates=CoordinatedLeaderElection=true", "--runtime-config=coordination.k8s.io/v1beta1=true"))
	cs, err := kubernetes.NewForConfig(cle.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	leases := cs.CoordinationV1().Leases("eventpipe")
	strategy := coordinationv1.OldestEmulationVersion
	preferred := "replica-z"
	holder, dur := "gone-replica", int32(1)
	created, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "elector-preserve", Namespace: "eventpipe",
			Labels:      map[string]string{"app.kubernetes.io/name": "eventpipe-agent"},
			Annotations: map[string]string{"example.com/owner": "platform-team"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "keeper",
				UID: "0d6c2a4e-1111-4222-8333-944455556666"}},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur,
			Strategy: &strategy, PreferredHolder: &preferred},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leases.Delete(context.Background(), "elector-preserve", metav1.DeleteOptions{}) })
	if created.Spec.Strategy == nil || created.Spec.PreferredHolder == nil {
		t.Fatalf("the API server dropped spec.strategy/preferredHolder on create (%+v): the test cannot check them", created.Spec)
	}

	e := testElector(t, "elector-preserve", "replica-a")
	if e.kc, err = newKubeClient(cle.AgentConfig()); err != nil {
		t.Fatal(err)
	}
	leading, _, stop := runElector(e)
	waitFor(t, 10*time.Second, "the elector to lead", func() (bool, string) { return leading.Load(), "" })
	// Someone adds a label while it leads (retried on 409: the elector
	// renews every 200 ms).
	for attempt := 0; ; attempt++ {
		l, err := leases.Get(ctx, "elector-preserve", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Labels == nil {
			l.Labels = map[string]string{} // the elector wiped them; check() reports it
		}
		l.Labels["added-while-leading"] = "yes"
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsConflict(err) || attempt > 20 {
			t.Fatal(err)
		}
	}
	renewedAt := func() time.Time {
		l, err := leases.Get(ctx, "elector-preserve", metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			return time.Time{}
		}
		return l.Spec.RenewTime.Time
	}
	first := renewedAt()
	waitFor(t, 10*time.Second, "several renewals", func() (bool, string) {
		return renewedAt().Sub(first) >= 5*e.retryPeriod, ""
	})

	check := func(when string, wantHolder string) {
		t.Helper()
		l, err := leases.Get(ctx, "elector-preserve", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Labels["app.kubernetes.io/name"] != "eventpipe-agent" || l.Labels["added-while-leading"] != "yes" {
			t.Errorf("%s: labels %v", when, l.Labels)
		}
		if l.Annotations["example.com/owner"] != "platform-team" {
			t.Errorf("%s: annotations %v", when, l.Annotations)
		}
		if len(l.OwnerReferences) != 1 || l.OwnerReferences[0].Name != "keeper" {
			t.Errorf("%s: owner references %v", when, l.OwnerReferences)
		}
		if l.Spec.Strategy == nil || *l.Spec.Strategy != strategy || l.Spec.PreferredHolder == nil || *l.Spec.PreferredHolder != preferred {
			t.Errorf("%s: spec.strategy %v, spec.preferredHolder %v; want %s, %s", when, l.Spec.Strategy, l.Spec.PreferredHolder, strategy, preferred)
		}
		if h := l.Spec.HolderIdentity; h == nil || *h != wantHolder {
			t.Errorf("%s: holder %v, want %q", when, h, wantHolder)
		}
	}
	check("after renewals", "replica-a")
	stop()
	check("after release", "")
}
