package gateway

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/testenv/evbin"
)

// TestProcessSIGKILLNoRepeat runs the real binary (`eventpipe
// driver-proxy` with a state file) and SIGKILLs it three times while
// events flow; one gateway connection keeps reopening its stream (and
// redials the restarted proxy). No event reaches it twice, and events after
// the last restart arrive.
func TestProcessSIGKILLNoRepeat(t *testing.T) {
	dir := shortDir(t)
	bin := filepath.Join(dir, "eventpipe")
	if err := evbin.Build(context.Background(), "../..", bin); err != nil {
		t.Fatal(err)
	}
	drv := startDriver(t, dir)
	col := startCollector(t, dir, "")
	sock := filepath.Join(dir, "proxy", "proxy.sock")
	state := filepath.Join(dir, "proxy", "state")
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "driver-proxy", "--listen", sock, "--driver", drv.Path, "--gateway", "openshell",
			"--collector", col.addr, "--insecure", "--state-file", state, "--log-level", "error")
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	proc := start()
	t.Cleanup(func() { _ = proc.Process.Kill(); _ = proc.Wait() })

	gw := dialT(t, sock)
	var mu sync.Mutex
	got := map[string]int{}
	streams := 0
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if w, err := gw.Watch(ctx); err == nil {
				mu.Lock()
				streams++
				mu.Unlock()
				for {
					ev, err := w.Recv()
					if err != nil {
						break
					}
					if ev.Platform != nil {
						mu.Lock()
						got[ev.Platform.Metadata[KeyEventID]]++
						mu.Unlock()
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })

	var shipped []string
	shipSome := func(k int) {
		var occs []*eventpipev1.Occurrence
		for range k {
			o := pullFailed(fmt.Sprintf("5e6f7a8b-9c0d-4e1f-8a2b-%012d", len(shipped)%7), 1)
			occs = append(occs, o)
			shipped = append(shipped, o.EventId)
		}
		col.ship(t, occs...)
	}
	for round := range 4 {
		// The gateway has (re)connected before events flow.
		waitFor(t, 20*time.Second, fmt.Sprintf("stream %d open", round+1), func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			return streams > round, fmt.Sprint(streams)
		})
		time.Sleep(200 * time.Millisecond)
		for range 10 {
			shipSome(5)
			time.Sleep(20 * time.Millisecond)
		}
		if round < 3 {
			_ = proc.Process.Kill() // SIGKILL, mid-flow
			_ = proc.Wait()
			proc = start()
		}
	}
	last := shipped[len(shipped)-1]
	waitFor(t, 20*time.Second, "the last event after the last restart", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return got[last] == 1, fmt.Sprintf("%d distinct events", len(got))
	})
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	missed := 0
	for _, id := range shipped {
		switch got[id] {
		case 0:
			missed++
		case 1:
		default:
			t.Errorf("event %s reached the gateway %d times", id, got[id])
		}
	}
	t.Logf("%d events shipped across 3 SIGKILLs, %d delivered once, %d missed (at most once)", len(shipped), len(shipped)-missed, missed)
	if missed > len(shipped)/4 {
		t.Errorf("%d of %d events missed", missed, len(shipped))
	}
}
