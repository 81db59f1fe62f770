package kube

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// LeakOptions ignores client-go's process-wide background goroutines and
// pooled idle connections, which are not owned by the code under test. Test
// packages pass them (plus their own) to goleak.
func LeakOptions(extra ...goleak.Option) []goleak.Option {
	return append([]goleak.Option{
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*clientConnReadLoop).run"),
	}, extra...)
}

// RunTestMain is the TestMain body of a package whose tests share one
// control plane (one start per package keeps CI fast): it starts etcd and
// kube-apiserver in a temp dir named after prefix, calls setup (may be nil)
// and m.Run, stops the control plane, and fails the run when goroutines
// outlive the tests (leakOpts on top of LeakOptions). It returns the exit code.
func RunTestMain(m *testing.M, prefix string, setup func(*Cluster) error, leakOpts ...goleak.Option) int {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	c, err := StartProcess(context.Background(), Options{Dir: dir,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start control plane:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "control plane started in %v\n", time.Since(start).Round(time.Millisecond))
	code := 1
	if setup == nil {
		code = m.Run()
	} else if err := setup(c); err != nil {
		fmt.Fprintln(os.Stderr, "test setup:", err)
	} else {
		code = m.Run()
	}
	if err := c.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop control plane:", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(LeakOptions(leakOpts...)...); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	return code
}
