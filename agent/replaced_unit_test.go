package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/enrich"
)

// recorder is a storeHandler that records what it is told.
type recorder struct{ calls []string }

func (r *recorder) added(c *cached)      { r.calls = append(r.calls, "added "+c.meta().UID) }
func (r *recorder) updated(_, c *cached) { r.calls = append(r.calls, "updated "+c.meta().UID) }
func (r *recorder) deleted(c *cached)    { r.calls = append(r.calls, "deleted "+c.meta().UID) }

// A Sandbox CR deleted and created again under its name while the watch
// was down shows up in the relisting as the same name with another uid:
// the old object is reported deleted (client-go's DeletedFinalStateUnknown)
// and the new one added, never as an update of the old. A watch DELETE of
// the old uid does not remove the new object.
func TestReflectorReplacedObject(t *testing.T) {
	rec := &recorder{}
	decode := func(raw []byte) (*cached, error) {
		uid, rv, _ := strings.Cut(string(raw), "@")
		return &cached{sb: &enrich.Sandbox{Meta: enrich.Meta{Namespace: "ns", Name: "web", UID: uid, ResourceVersion: rv}}}, nil
	}
	r := &reflector{store: newObjStore(true), h: rec, decode: decode}
	r.apply(watchAdded, []byte("old@1"), false)
	r.apply(watchModified, []byte("old@2"), false)
	r.gen++
	r.apply(watchAdded, []byte("new@7"), true) // relisting
	r.apply(watchDeleted, []byte("old@8"), false)
	want := "added old,updated old,deleted old,added new"
	if got := strings.Join(rec.calls, ","); got != want {
		t.Errorf("handler calls %s, want %s", got, want)
	}
	if c, ok := r.store.get(objKey{"ns", "web"}); !ok || c.meta().UID != "new" {
		t.Errorf("stored %+v", c)
	}
}

// The deleted Sandbox CR reaches the processor's queue; a full queue
// drops it and counts it, never blocking the reflector.
func TestSandboxDeletionQueued(t *testing.T) {
	m, _ := newMetrics(nil)
	c := &caches{changed: make(chan struct{}, 1), gone: make(chan *enrich.Sandbox, 1), m: m, log: testLogger(t)}
	k := &kindCache{c: c, store: newObjStore(true), tomb: newTombstones(time.Minute, 10)}
	sb := func(uid string) *cached {
		return &cached{sb: &enrich.Sandbox{Meta: enrich.Meta{Namespace: "ns", Name: "web", UID: uid}}}
	}
	k.deleted(sb("a"))
	k.deleted(sb("b"))
	if got := <-c.gone; got.UID != "a" {
		t.Errorf("queued %s", got.UID)
	}
	if n := counterValue(t, m.deletionDropped); n != 1 {
		t.Errorf("dropped %v, want 1", n)
	}
}
