package kwire

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/eventpipe/eventpipe/enrich"
)

// agentInterner is the agent's interner (agent/caches.go): a mutex-guarded
// map, bounded, short values only for InternSmall. Lookups by []byte do not
// allocate.
type agentInterner struct {
	mu sync.Mutex
	m  map[string]string
}

func (in *agentInterner) intern(b []byte) string {
	in.mu.Lock()
	defer in.mu.Unlock()
	if v, ok := in.m[string(b)]; ok {
		return v
	}
	s := string(b)
	if len(in.m) < 65536 {
		in.m[s] = s
	}
	return s
}

func (in *agentInterner) internSmall(b []byte) string {
	if len(b) >= 32 {
		return string(b)
	}
	return in.intern(b)
}

func agentOptions() *MetaOptions {
	in := &agentInterner{m: map[string]string{}}
	return &MetaOptions{KeepPrefixes: keepPrefix, Intern: in.intern, InternSmall: in.internSmall}
}

// The Event benchmarks decode a kubelet BackOff Event as the API server
// stores it (with managedFields): kwire, and the typed path the agent used
// (generated Unmarshal into corev1.Event, then toEnrichEvent).
func BenchmarkDecodeEvent(b *testing.B) {
	raw := marshal(b, eventFixtures()["backoff"])
	b.Run("kwire", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		var out Event
		defer reportCPU(b)()
		for b.Loop() {
			if err := DecodeEvent(raw, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("typed", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		defer reportCPU(b)()
		for b.Loop() {
			var e corev1.Event
			if err := e.Unmarshal(raw); err != nil {
				b.Fatal(err)
			}
			_ = refEvent(&e)
		}
	})
}

// A watch frame end to end: the envelopes plus the Event.
func BenchmarkWatchFrameEvent(b *testing.B) {
	stream := encodeWatch(b, watch.Event{Type: watch.Modified, Object: eventFixtures()["backoff"]})
	frame := stream[4:]
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	var out Event
	defer reportCPU(b)()
	for b.Loop() {
		_, obj, err := DecodeWatchEvent(frame)
		if err != nil {
			b.Fatal(err)
		}
		if err := DecodeEvent(obj, &out); err != nil {
			b.Fatal(err)
		}
	}
}

// The Pod benchmarks decode the seed's workload pod (4 init containers, 2
// containers, volumes, probes, env, managedFields): kwire with the agent's
// options and interner, and the typed path (generated Unmarshal into
// corev1.Pod, then the informer transform, without interning).
func BenchmarkDecodePod(b *testing.B) {
	raw := marshal(b, podFixtures()["workload"])
	b.Run("kwire", func(b *testing.B) {
		o := agentOptions()
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		defer reportCPU(b)()
		for b.Loop() {
			if _, _, err := DecodePod(raw, o); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("typed", func(b *testing.B) {
		c := refConv{keepPrefixes: keepPrefix}
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		defer reportCPU(b)()
		for b.Loop() {
			var p corev1.Pod
			if err := p.Unmarshal(raw); err != nil {
				b.Fatal(err)
			}
			_, _ = c.pod(&p)
		}
	})
}

// BenchmarkRetainedPod reports the heap a cached enrich.Pod keeps (what
// 10,000 sandboxes' pods cost in the cache), decoded by kwire with the
// agent's interner, for distinct pods of the seed's shape.
func BenchmarkRetainedPod(b *testing.B) {
	const n = 2000
	raws := make([][]byte, n)
	base := podFixtures()["workload"]
	for i := range raws {
		p := base.DeepCopy()
		p.Name = fmt.Sprintf("sandbox-%05d", i)
		p.UID = types.UID(fmt.Sprintf("%08d-2d01-4940-95b4-71b07f1976ff", i))
		p.ResourceVersion = fmt.Sprint(100000 + i)
		p.Labels["openshell.ai/boundary-pair"] = fmt.Sprintf("%08d-1a7b-49a2-a640-14ae153f93ea", i)
		p.Annotations["openshell.ai/sandbox-id"] = p.Labels["openshell.ai/boundary-pair"]
		p.OwnerReferences[0].UID = types.UID(fmt.Sprintf("%08d-8379-42b9-8deb-a047f4214891", i))
		raws[i] = marshal(b, p)
	}
	o := agentOptions()
	keep := make([]*enrich.Pod, n)
	b.ReportAllocs()
	for b.Loop() {
		clear(keep)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i, raw := range raws {
			p, _, err := DecodePod(raw, o)
			if err != nil {
				b.Fatal(err)
			}
			keep[i] = p
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "retained-B/pod")
	}
	runtime.KeepAlive(keep)
}
