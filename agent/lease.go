package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"time"
)

// leaseElector is Lease-based leader election: the algorithm of client-go's
// tools/leaderelection (acquire when the Lease is free or its holder has not
// renewed for leaseDurationSeconds by the local clock, renew every
// retryPeriod, give up leading when no renewal succeeded for renewDeadline,
// release on a clean stop) over the same coordination.k8s.io/v1 Lease
// fields, so a replica running client-go's elector and one running this
// exclude each other.
//
// Why not client-go's package itself: it imports the typed clientset, which
// links and registers every built-in API group at start, about 9 MiB of
// resident memory (bench/agent.md) for a process whose whole budget is
// 64 MiB. The agent needs three calls on one object: GET, POST and PUT.
type leaseElector struct {
	kc            *kubeClient
	namespace     string
	name          string
	identity      string
	leaseDuration time.Duration
	renewDeadline time.Duration
	retryPeriod   time.Duration
	log           *slog.Logger
	now           func() time.Time

	// What this replica last saw of the Lease, and when (local clock): a
	// holder counts as alive while observedAt + its duration is ahead.
	observed   leaseSpec
	observedAt time.Time
}

// lease is a coordination.k8s.io/v1 Lease: the spec fields the election
// owns, decoded, and the whole object as the server sent it. Writes change
// only the owned fields in raw and send everything else back untouched
// (labels, annotations, owner references, fields this code does not know
// such as spec.preferredHolder or spec.strategy), with the resourceVersion
// read as the precondition.
type lease struct {
	Spec leaseSpec
	raw  map[string]json.RawMessage
}

type leaseSpec struct {
	HolderIdentity       *string    `json:"holderIdentity,omitempty"`
	LeaseDurationSeconds *int32     `json:"leaseDurationSeconds,omitempty"`
	AcquireTime          *microTime `json:"acquireTime,omitempty"`
	RenewTime            *microTime `json:"renewTime,omitempty"`
	LeaseTransitions     *int32     `json:"leaseTransitions,omitempty"`
}

func (s leaseSpec) holder() string {
	if s.HolderIdentity == nil {
		return ""
	}
	return *s.HolderIdentity
}

func (s leaseSpec) duration() time.Duration {
	if s.LeaseDurationSeconds == nil {
		return 0
	}
	return time.Duration(*s.LeaseDurationSeconds) * time.Second
}

func (s leaseSpec) transitions() int32 {
	if s.LeaseTransitions == nil {
		return 0
	}
	return *s.LeaseTransitions
}

func (s leaseSpec) equal(o leaseSpec) bool {
	a, _ := json.Marshal(s)
	b, _ := json.Marshal(o)
	return string(a) == string(b)
}

// microTime is metav1.MicroTime's JSON form (RFC 3339, microseconds, UTC).
type microTime struct{ time.Time }

const microTimeLayout = "2006-01-02T15:04:05.000000Z07:00"

func (t microTime) MarshalJSON() ([]byte, error) {
	return json.Marshal(t.UTC().Format(microTimeLayout))
}

func (t *microTime) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if s == "" {
		t.Time = time.Time{}
		return nil
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return err
	}
	t.Time = v
	return nil
}

func (e *leaseElector) path() string {
	return "/apis/coordination.k8s.io/v1/namespaces/" + e.namespace + "/leases"
}

// run campaigns until ctx ends; each time this replica acquires the Lease it
// calls lead with a context that ends when the Lease is lost (or ctx ends),
// and waits for lead to return before campaigning again.
func (e *leaseElector) run(ctx context.Context, lead func(context.Context)) {
	for ctx.Err() == nil {
		if !e.acquire(ctx) {
			return
		}
		leadCtx, cancel := context.WithCancel(ctx)
		renewDone := make(chan struct{})
		go func() {
			defer close(renewDone)
			defer cancel()
			e.renew(leadCtx)
		}()
		lead(leadCtx)
		cancel()
		<-renewDone
		if ctx.Err() != nil {
			e.release()
			return
		}
		e.log.Info("stopped leading", "identity", e.identity)
	}
}

// acquire tries every retryPeriod (with jitter) until this replica holds the
// Lease; false when ctx ended first.
func (e *leaseElector) acquire(ctx context.Context) bool {
	for {
		if e.tryAcquireOrRenew(ctx) {
			return true
		}
		if !sleepCtx(ctx, e.retryPeriod+time.Duration(rand.Float64()*0.2*float64(e.retryPeriod))) {
			return false
		}
	}
}

// renew keeps the Lease every retryPeriod and returns when a renewal has not
// succeeded for renewDeadline (leadership lost) or ctx ends.
func (e *leaseElector) renew(ctx context.Context) {
	last := e.now()
	for {
		if !sleepCtx(ctx, e.retryPeriod) {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, e.renewDeadline)
		ok := e.tryAcquireOrRenew(rctx)
		cancel()
		if ok {
			last = e.now()
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if e.now().Sub(last) >= e.renewDeadline {
			e.log.Warn("failed to renew the leader Lease in time; giving up leadership",
				"lease", e.namespace+"/"+e.name, "renew_deadline", e.renewDeadline)
			return
		}
	}
}

// tryAcquireOrRenew is client-go's step of the same name.
func (e *leaseElector) tryAcquireOrRenew(ctx context.Context) bool {
	now := e.now()
	id := e.identity
	secs := int32(e.leaseDuration / time.Second)
	want := leaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &secs, AcquireTime: &microTime{now}, RenewTime: &microTime{now}}
	zero := int32(0)
	want.LeaseTransitions = &zero

	cur, err := e.get(ctx)
	if isNotFound(err) {
		if err := e.write(ctx, http.MethodPost, e.path(), e.newLease(want)); err != nil {
			e.log.Warn("create leader Lease failed", "err", err)
			return false
		}
		e.observed, e.observedAt = want, now
		return true
	}
	if err != nil {
		e.log.Warn("get leader Lease failed", "err", err)
		return false
	}
	if !cur.Spec.equal(e.observed) {
		e.observed, e.observedAt = cur.Spec, now
	}
	holder := cur.Spec.holder()
	if holder != "" && holder != id && e.observedAt.Add(cur.Spec.duration()).After(now) {
		return false // held by another replica that renews
	}
	if holder == id {
		want.AcquireTime = cur.Spec.AcquireTime
		want.LeaseTransitions = cur.Spec.LeaseTransitions
		if want.LeaseTransitions == nil {
			want.LeaseTransitions = &zero
		}
	} else {
		n := cur.Spec.transitions() + 1
		want.LeaseTransitions = &n
	}
	cur.Spec = want
	if err := e.write(ctx, http.MethodPut, e.path()+"/"+e.name, cur); err != nil {
		e.log.Warn("update leader Lease failed", "err", err)
		return false
	}
	e.observed, e.observedAt = want, now
	return true
}

// release gives the Lease up on a clean stop, so a standby takes over
// without waiting for it to expire.
func (e *leaseElector) release() {
	ctx, cancel := context.WithTimeout(context.Background(), e.renewDeadline)
	defer cancel()
	cur, err := e.get(ctx)
	if err != nil || cur.Spec.holder() != e.identity {
		return
	}
	now := e.now()
	empty, one := "", int32(1)
	cur.Spec.HolderIdentity = &empty
	cur.Spec.LeaseDurationSeconds = &one
	cur.Spec.RenewTime = &microTime{now}
	cur.Spec.AcquireTime = &microTime{now}
	if err := e.write(ctx, http.MethodPut, e.path()+"/"+e.name, cur); err != nil {
		e.log.Warn("release leader Lease failed", "err", err)
		return
	}
	e.log.Info("released the leader Lease", "lease", e.namespace+"/"+e.name)
}

func (e *leaseElector) get(ctx context.Context) (lease, error) {
	var l lease
	b, err := e.kc.getJSON(ctx, e.path()+"/"+e.name)
	if err != nil {
		return l, err
	}
	if err := json.Unmarshal(b, &l.raw); err != nil {
		return l, fmt.Errorf("decode leader Lease: %w", err)
	}
	if spec, ok := l.raw["spec"]; ok {
		if err := json.Unmarshal(spec, &l.Spec); err != nil {
			return l, fmt.Errorf("decode leader Lease spec: %w", err)
		}
	}
	return l, nil
}

// newLease is the object a POST creates: name, namespace and the spec.
func (e *leaseElector) newLease(spec leaseSpec) lease {
	meta, _ := json.Marshal(map[string]string{"name": e.name, "namespace": e.namespace})
	return lease{Spec: spec, raw: map[string]json.RawMessage{"metadata": meta}}
}

// encode is l.raw with the owned spec fields replaced by l.Spec's (an
// owned field l.Spec leaves nil is removed) and every other field as read.
func (l lease) encode() ([]byte, error) {
	obj := make(map[string]json.RawMessage, len(l.raw)+2)
	for k, v := range l.raw {
		obj[k] = v
	}
	spec := map[string]json.RawMessage{}
	if b, ok := obj["spec"]; ok && string(b) != "null" {
		if err := json.Unmarshal(b, &spec); err != nil {
			return nil, fmt.Errorf("decode leader Lease spec: %w", err)
		}
	}
	owned, err := json.Marshal(l.Spec)
	if err != nil {
		return nil, err
	}
	var set map[string]json.RawMessage
	if err := json.Unmarshal(owned, &set); err != nil {
		return nil, err
	}
	for _, k := range leaseOwnedFields {
		delete(spec, k)
		if v, ok := set[k]; ok {
			spec[k] = v
		}
	}
	if obj["spec"], err = json.Marshal(spec); err != nil {
		return nil, err
	}
	obj["apiVersion"], obj["kind"] = json.RawMessage(`"coordination.k8s.io/v1"`), json.RawMessage(`"Lease"`)
	return json.Marshal(obj)
}

// leaseOwnedFields are the spec fields the election writes (leaseSpec's).
var leaseOwnedFields = []string{"holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions"}

// write creates (POST) or replaces (PUT, guarded by the resourceVersion
// read: a concurrent writer makes it fail with 409) the Lease.
func (e *leaseElector) write(ctx context.Context, method, path string, l lease) error {
	body, err := l.encode()
	if err != nil {
		return err
	}
	op := method + " " + path
	resp, err := e.kc.do(ctx, op, method, path, nil, acceptJSON, body)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	return resp.Body.Close()
}
