package enrich

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user+system CPU time: on a shared, loaded
// machine events per CPU-second is the fair "per core" figure, wall-clock
// events/s is reported beside it.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchWorld caches n managed-mode sandboxes (CR, workload pod, supervisor
// pod, PVC) in one namespace, like an agent's informer caches.
func benchWorld(n int) (*maps, []string) {
	m := newMaps()
	m.addNS(managedNamespace())
	ids := make([]string, n)
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("%08x-1a7b-49a2-a640-14ae153f93ea", i)
		ids[i] = id
		name := fmt.Sprintf("sb-%d", i)
		crUID := "cr-" + id
		m.addSandbox(&Sandbox{Meta: Meta{Namespace: seedNS, Name: name, UID: crUID,
			Labels:      PairsOf(map[string]string{"openshell.ai/sandbox-id": id, "openshell.ai/sandbox-name": name, "openshell.ai/sandbox-workspace": "repro", "openshell.ai/gateway-id": "openshell"}),
			Annotations: PairsOf(map[string]string{"openshell.ai/sandbox-id": id})}, PodName: name})
		owner := []Owner{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: name, UID: crUID, Controller: true}}
		p := seedPod()
		p.Name, p.UID, p.Owners = name, "pod-"+id, owner
		p.Annotations = PairsOf(map[string]string{"openshell.ai/sandbox-id": id})
		p.Labels = PairsOf(map[string]string{"openshell.ai/boundary-pair": id})
		m.addPod(p)
		s := seedSupervisorPod()
		s.Name, s.UID = "os-supervisor-"+id, "sup-"+id
		s.Annotations = PairsOf(map[string]string{"openshell.ai/sandbox-id": id})
		s.Owners = []Owner{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: name, UID: crUID}}
		m.addPod(s)
		m.addPVC(&PVC{Meta: Meta{Namespace: seedNS, Name: "workspace-" + name, Owners: owner}})
	}
	return m, ids
}

// benchEvents is a realistic mix: a sandbox's life (scheduled, pulls,
// starts), pull failures and back-offs, volume and CR events, and events
// about objects that are no sandbox's.
func benchEvents(ids []string) []*Event {
	var out []*Event
	for i, id := range ids {
		name := fmt.Sprintf("sb-%d", i)
		sup := "os-supervisor-" + id
		pe := func(pod, fp, reason, typ, msg string) *Event {
			return &Event{APIVersion: "v1", Namespace: seedNS, Name: pod + ".1", UID: fmt.Sprintf("ev-%d-%d", i, len(out)), ResourceVersion: "7",
				Involved: ObjectRef{Kind: "Pod", APIVersion: "v1", Namespace: seedNS, Name: pod, FieldPath: fp},
				Type:     typ, Reason: reason, Message: msg, Count: 3, FirstTimestamp: t0, LastTimestamp: t0.Add(time.Duration(len(out)) * time.Millisecond),
				ReportingComponent: "kubelet", ReportingInstance: "node-1"}
		}
		out = append(out,
			pe(name, "", "Scheduled", "Normal", "Successfully assigned "+seedNS+"/"+name+" to node-1"),
			pe(name, "spec.initContainers{openshell-sandbox-bootstrap}", "Pulled", "Normal", `Container image "`+seedBootImage+`" already present on machine`),
			pe(name, "spec.initContainers{workspace-init}", "Pulling", "Normal", `Pulling image "`+seedImage+`"`),
			pe(name, "spec.initContainers{workspace-init}", "Failed", "Warning", seedFailed),
			pe(name, "spec.initContainers{workspace-init}", "Failed", "Warning", "Error: ErrImagePull"),
			pe(name, "spec.initContainers{workspace-init}", "BackOff", "Normal", `Back-off pulling image "`+seedImage+`"`),
			pe(name, "spec.containers{agent}", "Started", "Normal", "Started container agent"),
			pe(sup, "spec.containers{supervisor}", "Failed", "Warning", `Failed to pull image "`+seedSupImage+`": rpc error: code = Unknown desc = Error response from daemon: toomanyrequests: You have reached your pull rate limit.`),
			pe(sup, "spec.containers{supervisor}", "Created", "Normal", "Created container: supervisor"),
			pe("coredns-7db6d8ff4d-x", "spec.containers{coredns}", "Unhealthy", "Warning", "Readiness probe failed: HTTP probe failed with statuscode: 503"),
			&Event{APIVersion: "v1", Namespace: seedNS, UID: fmt.Sprintf("pvc-%d", i), ResourceVersion: "3", Reason: "ProvisioningSucceeded",
				Involved: ObjectRef{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: seedNS, Name: "workspace-" + name},
				Message:  "Successfully provisioned volume pvc-1", LastTimestamp: t0},
			&Event{APIVersion: "events.k8s.io/v1", Namespace: seedNS, UID: fmt.Sprintf("cr-%d", i), ResourceVersion: "4", Reason: "PodCreated",
				Involved: ObjectRef{Kind: "Sandbox", APIVersion: "agents.x-k8s.io/v1beta1", Namespace: seedNS, Name: name},
				Message:  "Created pod " + name, EventTime: t0},
		)
	}
	return out
}

// BenchmarkEnrich measures attribution + classification of a realistic mix
// on cached metadata. Target: at least 500,000 events/s per core
// (go test -run '^$' -bench BenchmarkEnrich -cpu 1 ./enrich/).
func BenchmarkEnrich(b *testing.B) {
	m, ids := benchWorld(1000)
	events := benchEvents(ids)
	e := mustNew(b, NewDefaultConfig(), m.lookups())
	observed := t0.Add(time.Hour)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		r := e.Enrich(events[i%len(events)], observed)
		if r.Occurrence == nil {
			b.Fatal("nil occurrence")
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	if cpu := cpuTime() - cpu0; cpu > 0 {
		b.ReportMetric(float64(b.N)/cpu.Seconds(), "events/cpu-s")
	}
}

// BenchmarkEnrichNormal is the same world with only the Normal events of a
// sandbox's start that are not about a failure (Scheduled, Pulled,
// Pulling, Created, Started): the bulk of a healthy cluster's events. It is
// a second view, not the target's measure (BenchmarkEnrich is).
func BenchmarkEnrichNormal(b *testing.B) {
	m, ids := benchWorld(1000)
	var events []*Event
	for _, ev := range benchEvents(ids) {
		switch ev.Reason {
		case "Scheduled", "Pulled", "Pulling", "Created", "Started":
			events = append(events, ev)
		}
	}
	e := mustNew(b, NewDefaultConfig(), m.lookups())
	observed := t0.Add(time.Hour)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r := e.Enrich(events[i%len(events)], observed); r.Occurrence == nil {
			b.Fatal("nil occurrence")
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkClassifyPull(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, _, _, ok := ClassifyPull("Failed", seedFailed); !ok {
			b.Fatal("not a pull failure")
		}
	}
}

// BenchmarkClassifyPullCorpus classifies every message of the pull corpus
// (all draws, look-alikes included) in turn: the classifier's cost on real
// wordings rather than on one seed message, so a rule that slows the
// matcher down on long runtime messages shows here.
func BenchmarkClassifyPullCorpus(b *testing.B) {
	msgs := loadCorpus(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m := msgs[i%len(msgs)]
		ClassifyPull(m.Reason, m.Message)
	}
}
