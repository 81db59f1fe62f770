package store

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/wal"
)

// occ is a realistic image-pull failure occurrence (~600 bytes encoded).
func occ(i int) *eventpipev1.Occurrence {
	uid := fmt.Sprintf("6f1c2a4e-9b3d-4c1e-8f7a-%012d", i)
	rv := fmt.Sprintf("%d", 184467+i)
	t := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Millisecond)
	return &eventpipev1.Occurrence{
		SchemaVersion: eventpipev1.SchemaVersion,
		EventId:       uid + "/" + rv,
		OccurredAt:    timestamppb.New(t),
		ObservedAt:    timestamppb.New(t.Add(40 * time.Millisecond)),
		Cluster:       "prod-eu-1",
		Namespace:     "openshell-ws-data-science",
		Event: &eventpipev1.EventRef{Name: fmt.Sprintf("my-sandbox-7d9f.%x", 1800000000000+i), Uid: uid,
			ResourceVersion: rv, ApiVersion: "v1"},
		InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", ApiVersion: "v1", Namespace: "openshell-ws-data-science",
			Name: "my-sandbox", Uid: "0b8e61a2-3c55-4d0e-a1f9-2e7c9d1b4a60", FieldPath: "spec.containers{agent}"},
		Type:   "Warning",
		Reason: "Failed",
		Message: `Failed to pull image "ghcr.io/acme/sandbox-python:3.12-typo": rpc error: code = NotFound ` +
			`desc = failed to pull and unpack image "ghcr.io/acme/sandbox-python:3.12-typo": not found`,
		Count:              int32(1 + i%5),
		ReportingComponent: "kubelet",
		ReportingInstance:  "node-pool-a-7x2k",
		Sandbox: &eventpipev1.Sandbox{Id: "3f2b8c1d-5e6a-4b7c-9d8e-1a2b3c4d5e6f", Name: "my-sandbox",
			Workspace: "data-science", CrNamespace: "openshell-ws-data-science", CrName: "my-sandbox"},
		Attribution: eventpipev1.AttributionPodAnnotation,
		Role:        eventpipev1.RoleWorkload,
		Container:   "agent",
		Image:       "ghcr.io/acme/sandbox-python:3.12-typo",
		ImageRole:   eventpipev1.ImageRoleWorkload,
		PullFailure: &eventpipev1.PullFailure{Category: "not_found", Disposition: "retrying", Attempts: 1, Source: "event"},
	}
}

func occs(from, n int) []*eventpipev1.Occurrence {
	out := make([]*eventpipev1.Occurrence, n)
	for i := range out {
		out[i] = occ(from + i)
	}
	return out
}

func testConfig(dir string) Config {
	c := NewDefaultConfig()
	c.Dir = dir
	return c
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)} }
func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func mustOpen(t testing.TB, cfg Config, o options) *Store {
	t.Helper()
	s, err := openWith(cfg, nil, nil, o)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// faultFS injects faults into files whose path contains match ("" = all).
type faultFS struct {
	wal.OSFS
	mu        sync.Mutex
	match     string
	failWrite bool
	failSync  bool
	syncGate  chan struct{} // when set, Sync waits for it to close
}

var errInjected = errors.New("injected fault")

func (f *faultFS) set(fn func(*faultFS)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *faultFS) OpenFile(name string, flag int, perm os.FileMode) (wal.File, error) {
	file, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f, name: name}, nil
}

type faultFile struct {
	wal.File
	fs   *faultFS
	name string
}

func (f *faultFile) applies() (failWrite, failSync bool, gate chan struct{}) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.match != "" && !strings.Contains(f.name, f.fs.match) {
		return false, false, nil
	}
	return f.fs.failWrite, f.fs.failSync, f.fs.syncGate
}

func (f *faultFile) Write(b []byte) (int, error) {
	if fw, _, _ := f.applies(); fw {
		return 0, errInjected
	}
	return f.File.Write(b)
}

func (f *faultFile) Sync() error {
	_, fs, gate := f.applies()
	if gate != nil {
		<-gate
	}
	if fs {
		return errInjected
	}
	return f.File.Sync()
}

func counter(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 16)
	c.Collect(ch)
	close(ch)
	var sum float64
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		sum += d.GetCounter().GetValue() + d.GetGauge().GetValue()
	}
	return sum
}
