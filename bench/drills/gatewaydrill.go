package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/eventpipe/eventpipe/sinks/gateway"
	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

// drillGateway runs `eventpipe driver-proxy` (real binary, with a state
// file) between a gateway client and a compute driver (the gatewaytest
// parts, in process), fed by the real collector under load; it SIGKILLs
// the proxy and restarts it, then restarts the driver. The proxy is at
// most once per gateway connection (sinks/gateway/doc.go): a duplicate
// fails the drill, a miss is reported.
func drillGateway(ctx context.Context, e *env) ([]SinkResult, error) {
	p, err := e.newPipeline("gateway-restart", colOpts{})
	if err != nil {
		return nil, err
	}
	defer p.close()
	p.ship.perBatch = 20 // 200/s
	if err := p.col.start(ctx); err != nil {
		return nil, err
	}
	dir := filepath.Join(p.dir, "gw")
	drv, err := gatewaytest.StartDriver(filepath.Join(dir, "driver", "driver.sock"))
	if err != nil {
		return nil, fmt.Errorf("driver: %w", err)
	}
	defer drv.Stop()
	sock := filepath.Join(dir, "proxy", "proxy.sock")
	logf, err := os.Create(filepath.Join(p.dir, "driver-proxy.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	var proc *exec.Cmd
	start := func() error {
		proc = exec.Command(e.bin, "driver-proxy", "--listen", sock, "--driver", drv.Path, "--gateway", "gw",
			"--collector", p.col.grpcAddr, "--insecure", "--state-file", filepath.Join(dir, "proxy", "state"), "--log-level", "warn")
		proc.Stderr, proc.Stdout = logf, logf
		proc.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return proc.Start()
	}
	if err := start(); err != nil {
		return nil, err
	}
	defer func() { _ = proc.Process.Kill(); _ = proc.Wait() }()

	gw, err := gatewaytest.Dial(sock)
	if err != nil {
		return nil, err
	}
	defer gw.Close()
	var mu sync.Mutex
	got := copies{}
	streams := 0
	wctx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for wctx.Err() == nil {
			if w, err := gw.Watch(wctx); err == nil {
				mu.Lock()
				streams++
				mu.Unlock()
				for {
					ev, err := w.Recv()
					if err != nil {
						break
					}
					if ev.Platform != nil {
						id := ev.Platform.Metadata[gateway.KeyEventID]
						mu.Lock()
						got[id] = append(got[id], "")
						mu.Unlock()
					}
				}
			}
			sleep(wctx, 100*time.Millisecond)
		}
	}()
	defer func() { stopWatch(); <-watchDone }()
	waitStreams := func(n int) error {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
			mu.Lock()
			s := streams
			mu.Unlock()
			if s >= n {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		return fmt.Errorf("the gateway's watch stream %d did not open within 30s", n)
	}
	if err := waitStreams(1); err != nil {
		return nil, err
	}
	p.ship.workspace = "gw-drill"
	p.startLoad(ctx, 100*time.Millisecond)
	sleep(ctx, 3*time.Second)
	// 1. The proxy SIGKILLed mid-flow and started again.
	_ = proc.Process.Kill()
	_ = proc.Wait()
	if err := start(); err != nil {
		return nil, err
	}
	if err := waitStreams(2); err != nil {
		return nil, err
	}
	sleep(ctx, 3*time.Second)
	// 2. The driver restarted under the proxy.
	drv.Stop()
	if err := drv.Start(); err != nil {
		return nil, fmt.Errorf("restart the driver: %w", err)
	}
	healed := time.Now()
	if err := waitStreams(3); err != nil {
		return nil, err
	}
	sleep(ctx, 2*time.Second)
	rs, err := p.finish(ctx, healed)
	if err != nil {
		return rs, err
	}
	created, acked := p.ship.createdIDs(), p.ship.ackedIDs()
	var r SinkResult
	for deadline := time.Now().Add(20 * time.Second); ; {
		mu.Lock()
		snap := copies{}
		for id, c := range got {
			snap[id] = append([]string(nil), c...)
		}
		s := streams
		mu.Unlock()
		r = tally(p.name, "gateway (driver-proxy)", created, acked, snap)
		r.Recover = time.Since(healed)
		r.Note = fmt.Sprintf("proxy SIGKILLed and restarted, then the driver restarted; %d watch streams", s)
		if r.Lost == 0 || time.Now().After(deadline) {
			break
		}
		sleep(ctx, 200*time.Millisecond)
	}
	r.AtMostOnce = true
	if r.Lost > 0 {
		r.Note += fmt.Sprintf("; %d not delivered: at most once per gateway connection by contract, no metric counts them", r.Lost)
	}
	return append(rs, r), nil
}
