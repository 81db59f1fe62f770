package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*clientConnReadLoop).run"),
	)
}

func TestParseRejectsBadFlags(t *testing.T) {
	tests := map[string][]string{
		"unknown scenario": {"--scenario", "nope"},
		"unknown mode":     {"--mode", "cloud"},
		"bad generation":   {"--generation", "oldest"},
		"negative load":    {"--load", "-1"},
		"stray argument":   {"extra"},
	}
	for name, args := range tests {
		var stderr bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &stderr, nil); code != 2 {
			t.Errorf("%s: exit %d, want 2 (stderr %q)", name, code, stderr.String())
		}
	}
	c, err := parse([]string{"--scenario", "all", "--mode", "all"}, io.Discard)
	if err != nil || len(c.scenarios) < 10 || len(c.modes) != 3 {
		t.Errorf("all/all: %+v %v", c, err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// The command starts a cluster, plays the seed scenario, prints a working
// kubeconfig, and stops cleanly when its context ends.
func TestDevClusterPlaysAndStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	readyCh := make(chan struct{})
	go func() {
		done <- run(ctx, []string{"--scenario", "img-missing", "--mode", "managed,shared", "--load", "5"}, &stdout, &stderr, func() { close(readyCh) })
	}()
	select {
	case <-readyCh:
	case code := <-done:
		t.Fatalf("exited %d before ready:\n%s\n%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	i := strings.Index(out, "export KUBECONFIG=")
	if i < 0 || !strings.Contains(out, "played img-missing") || !strings.Contains(out, "load: 5 sandboxes, 40 events") ||
		!strings.Contains(out, "node dev-node Ready") || !strings.Contains(out, "storage: default StorageClass dev-hostpath, 3 hostPath volumes") {
		t.Fatalf("output:\n%s", out)
	}
	path := strings.TrimSpace(strings.SplitN(out[i+len("export KUBECONFIG="):], "\n", 2)[0])
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := cs.CoreV1().Events("openshell-openshell-repro").List(ctx, metav1.ListOptions{})
	if err != nil || len(evs.Items) == 0 {
		t.Fatalf("events in the played namespace: %d, %v", len(evs.Items), err)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d:\n%s", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("did not stop")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("temporary state %s not removed: %v", path, err)
	}
}
