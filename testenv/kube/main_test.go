package kube_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/testenv/kube"
	"go.uber.org/goleak"
)

// cluster is shared by the tests of this package (one control-plane start
// per package keeps CI fast); tests run sequentially and leave it usable.
var cluster *kube.Cluster

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == servePart { // a process container of TestHollowNodePortForward
		os.Exit(serveFile(os.Args[2:]))
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "kube-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	c, err := kube.StartProcess(context.Background(), kube.Options{Dir: dir,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start control plane:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "control plane started in %v\n", time.Since(start).Round(time.Millisecond))
	cluster = c
	code := m.Run()

	// Stopping the shared cluster is itself a test: nothing may outlive it.
	etcdPID, apiPID := c.PIDs()
	if err := c.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop control plane:", err)
		code = 1
	}
	for name, pid := range map[string]int{"etcd": etcdPID, "kube-apiserver": apiPID} {
		if pid == 0 || kube.ProcessAlive(pid) {
			fmt.Fprintf(os.Stderr, "%s (pid %d) is still alive after Stop\n", name, pid)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(kube.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	return code
}
