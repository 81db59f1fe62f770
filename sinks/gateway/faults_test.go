package gateway

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

// TestFailOpenCollectorDown: with the collector stopped (and with a
// collector address that never answers) driver RPCs still answer promptly
// and unchanged; when the collector comes back the proxy resumes after its
// cursor: new events arrive, old ones are not sent again.
func TestFailOpenCollectorDown(t *testing.T) {
	forRelays(t, func(t *testing.T, relay string) {
		dir := shortDir(t)
		drv := startDriver(t, dir)
		const id = "0b5e2a7d-1c3f-4e8a-b6d9-2a4c6e8f0a13"
		drv.Put(testSandbox(id, "sup"))
		col := startCollector(t, dir, "")
		rp := startProxy(t, proxyConfig(relay, dir, drv.Path, col.addr))
		gw := dialT(t, rp.p.cfg.Listen)
		w := watch(t, gw)
		first := pullFailed(id, 1)
		col.ship(t, first)
		waitFor(t, 10*time.Second, "first event", func() (bool, string) { return len(w.ours()) == 1, "" })

		col.stop(t)
		waitFor(t, 10*time.Second, "the proxy to notice", func() (bool, string) {
			return rp.metric(t, "eventpipe_driver_proxy_follow_connected") == 0, ""
		})
		for i := range 20 {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := gw.Unary(ctx, gatewaytest.MethodCaps, nil)
			cancel()
			if err != nil || len(resp.Bodies) != 1 {
				t.Fatalf("GetCapabilities %d with the collector down: %v", i, err)
			}
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Errorf("GetCapabilities %d took %s with the collector down", i, d)
			}
		}
		// The failure known before the collector went down is still reported.
		checkFailing(t, "GetSandbox, collector down", getSandbox(t, gw, id), true)

		col.start(t) // same directory, same address
		pulled := pulledAgent(id)
		col.ship(t, pulled)
		waitFor(t, 15*time.Second, "the event after the collector restart", func() (bool, string) {
			return len(w.ours()) == 2, fmt.Sprint(eventIDs(w.ours()))
		})
		noDuplicates(t, "after collector restart", w.ours())
		if got := eventIDs(w.ours()); got[0] != first.EventId || got[1] != pulled.EventId {
			t.Errorf("got %v", got)
		}
		checkFailing(t, "GetSandbox after Pulled", getSandbox(t, gw, id), false)
	})
}

// TestFailOpenMisconfigured: a collector that is not there at all and a
// token file that does not exist: driver traffic is unaffected, the
// problem is counted.
func TestFailOpenMisconfigured(t *testing.T) {
	forRelays(t, func(t *testing.T, relay string) {
		dir := shortDir(t)
		drv := startDriver(t, dir)
		drv.Put(testSandbox("9d3e1f2a-5b6c-4d7e-8f90-a1b2c3d4e5f6", "x"))
		cfg := proxyConfig(relay, dir, drv.Path, "127.0.0.1:1")
		cfg.Collector.TokenFile = filepath.Join(dir, "missing.token")
		cfg.Follow.FailOpenAfter = 300 * time.Millisecond
		rp := startProxy(t, cfg)
		gw := dialT(t, rp.p.cfg.Listen)
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := gw.Unary(ctx, gatewaytest.MethodList, nil); err != nil {
			t.Fatalf("ListSandboxes: %v", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("ListSandboxes took %s", d)
		}
		waitFor(t, 5*time.Second, "the config error counted", func() (bool, string) {
			return rp.metric(t, "eventpipe_driver_proxy_follow_errors_total") >= 1, ""
		})
		// Without eventpipe's events, the driver's own kubernetes events pass
		// (after the grace).
		time.Sleep(cfg.Follow.FailOpenAfter)
		w := watch(t, gw)
		if err := drv.WaitWatchers(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		drv.Platform("9d3e1f2a-5b6c-4d7e-8f90-a1b2c3d4e5f6", gatewaytest.PlatformEvent{TimestampMS: 1, Source: "kubernetes", Type: "Normal", Reason: "Pulling", Message: "the driver's own"})
		waitFor(t, 5*time.Second, "the driver's kubernetes event passed through", func() (bool, string) {
			return len(w.all()) == 1, fmt.Sprint(len(w.all()))
		})
	})
}

// TestRestarts: the driver restarts (the gateway's stream breaks and is
// reopened on the same connection), then the proxy restarts with its
// state file (the gateway keeps running and redials): no event reaches a
// stream of the same gateway twice, and a gateway that restarts afterwards
// still gets the tail.
func TestRestarts(t *testing.T) {
	forRelays(t, func(t *testing.T, relay string) {
		dir := shortDir(t)
		drv := startDriver(t, dir)
		const id = "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"
		drv.Put(testSandbox(id, "r"))
		col := startCollector(t, dir, "")
		cfg := proxyConfig(relay, dir, drv.Path, col.addr)
		cfg.Follow.StateFile = filepath.Join(dir, "proxy", "state")
		rp := startProxy(t, cfg)
		gw := dialT(t, cfg.Listen)
		w1 := watch(t, gw)
		e1, e2 := pullFailed(id, 1), pullFailed(id, 2)
		col.ship(t, e1, e2)
		waitFor(t, 10*time.Second, "two events", func() (bool, string) { return len(w1.ours()) == 2, "" })
		// Every event seen by this gateway, across its streams.
		var seen []gatewaytest.WatchEvent

		// Driver restart: the stream ends; the gateway reopens it.
		drv.Stop()
		waitFor(t, 5*time.Second, "the stream to end", func() (bool, string) {
			w1.mu.Lock()
			defer w1.mu.Unlock()
			return w1.err != nil, ""
		})
		seen = append(seen, w1.ours()...)
		if err := drv.Start(); err != nil {
			t.Fatal(err)
		}
		e3 := pullFailed(id, 3)
		col.ship(t, e3)
		w2 := watchRetry(t, gw)
		waitFor(t, 10*time.Second, "e3 after the driver restart", func() (bool, string) {
			return len(w2.ours()) == 1, fmt.Sprint(eventIDs(w2.ours()))
		})
		// Proxy restart: the state file keeps the delivered cursor.
		rp.stop(t)
		seen = append(seen, w2.ours()...)
		w2.close()
		rp2 := startProxy(t, cfg)
		e4 := pulledAgent(id)
		col.ship(t, e4)
		w3 := watchRetry(t, gw) // the same gateway, redialled
		waitFor(t, 10*time.Second, "e4 after the proxy restart", func() (bool, string) {
			return len(w3.ours()) >= 1, fmt.Sprint(eventIDs(w3.ours()))
		})
		time.Sleep(300 * time.Millisecond)
		seen = append(seen, w3.ours()...)
		noDuplicates(t, "one gateway across driver and proxy restarts", seen)
		if len(seen) != 4 {
			t.Errorf("the gateway saw %v, want the 4 events once each", eventIDs(seen))
		}
		// A restarted gateway (new connection) gets the whole tail again.
		w4 := watch(t, dialT(t, cfg.Listen))
		waitFor(t, 10*time.Second, "the tail for a restarted gateway", func() (bool, string) {
			return len(w4.ours()) == 4, fmt.Sprint(eventIDs(w4.ours()))
		})
		_ = rp2
	})
}

// watchRetry opens a WatchSandboxes stream the way the gateway does after
// an error: retry until one is accepted.
func watchRetry(t testing.TB, c *gatewaytest.Client) *watcher {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w := watch(t, c)
		time.Sleep(200 * time.Millisecond)
		w.mu.Lock()
		err := w.err
		w.mu.Unlock()
		if err == nil {
			return w
		}
		w.close()
		if time.Now().After(deadline) {
			t.Fatalf("no WatchSandboxes stream: %v", err)
		}
	}
}

// TestDriverDownThenBack: while the driver is down the proxy answers
// UNAVAILABLE at once (the gateway retries); once it is back, calls go
// through again within a second or so, however long it was down.
func TestDriverDownThenBack(t *testing.T) {
	forRelays(t, func(t *testing.T, relay string) {
		dir := shortDir(t)
		drv := startDriver(t, dir)
		rp := startProxy(t, proxyConfig(relay, dir, drv.Path, "127.0.0.1:1"))
		gw := dialT(t, rp.p.cfg.Listen)
		call := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := gw.Unary(ctx, gatewaytest.MethodCaps, nil)
			return err
		}
		if err := call(); err != nil {
			t.Fatal(err)
		}
		drv.Stop()
		for range 10 {
			start := time.Now()
			if err := call(); status.Code(err) != codes.Unavailable {
				t.Errorf("driver down: %v, want UNAVAILABLE", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("driver down: the answer took %s", d)
			}
			time.Sleep(300 * time.Millisecond)
		}
		if err := drv.Start(); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		waitFor(t, 5*time.Second, "calls through again", func() (bool, string) {
			err := call()
			return err == nil, fmt.Sprint(err)
		})
		if d := time.Since(back); d > 2*time.Second {
			t.Errorf("calls went through %s after the driver came back", d)
		}
	})
}

// TestFollowAuthenticated: the proxy reads the Follow stream with a reader
// token like any other reader; a wrong token is counted and logged, and
// driver traffic flows regardless.
func TestFollowAuthenticated(t *testing.T) {
	forRelays(t, func(t *testing.T, relay string) {
		dir := shortDir(t)
		tokens := filepath.Join(dir, "tokens.yaml")
		write := func(path, s string) {
			if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write(tokens, tokensFileYAML)
		drv := startDriver(t, dir)
		const id = "6a7b8c9d-0e1f-4a2b-9c3d-4e5f6a7b8c9d"
		drv.Put(testSandbox(id, "auth"))
		col := &testCollector{dir: dir, tokens: tokens}
		col.start(t)
		t.Cleanup(func() { col.stop(t) })

		good := proxyConfig(relay, dir, drv.Path, col.addr)
		good.Collector.TokenFile = filepath.Join(dir, "reader.token")
		write(good.Collector.TokenFile, readerToken+"\n")
		rp := startProxy(t, good)
		w := watch(t, dialT(t, good.Listen))

		bad := proxyConfig(relay, dir, drv.Path, col.addr)
		bad.Listen = filepath.Join(dir, "proxy2", "proxy.sock")
		bad.Collector.TokenFile = filepath.Join(dir, "wrong.token")
		write(bad.Collector.TokenFile, "not-a-token-0123456789\n")
		rpBad := startProxy(t, bad)
		wBad := watch(t, dialT(t, bad.Listen))

		e := pullFailed(id, 1)
		col.ship(t, e)
		waitFor(t, 10*time.Second, "the event through the reader token", func() (bool, string) { return len(w.ours()) == 1, "" })
		waitFor(t, 10*time.Second, "the refusal counted", func() (bool, string) {
			return rpBad.metric(t, "eventpipe_driver_proxy_follow_errors_total") >= 1, ""
		})
		if len(wBad.ours()) != 0 {
			t.Errorf("a proxy with a wrong token delivered events")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := dialT(t, bad.Listen).Unary(ctx, gatewaytest.MethodCaps, nil); err != nil {
			t.Errorf("driver traffic through the proxy with a refused token: %v", err)
		}
		_ = rp
	})
}

// TestShutdownPrompt: with a WatchSandboxes stream open, the proxy stops
// well within its shutdown grace (the stream ends with UNAVAILABLE, so the
// gateway redials the next proxy at once).
func TestShutdownPrompt(t *testing.T) {
	forRelays(t, func(t *testing.T, relay string) {
		dir := shortDir(t)
		drv := startDriver(t, dir)
		rp := startProxy(t, proxyConfig(relay, dir, drv.Path, "127.0.0.1:1"))
		w := watch(t, dialT(t, rp.p.cfg.Listen))
		if err := drv.WaitWatchers(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		rp.stop(t)
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("stop took %s with a stream open (shutdown grace %s)", d, rp.p.cfg.ShutdownGrace)
		}
		<-w.done
		if status.Code(w.err) != codes.Unavailable {
			t.Errorf("stream ended with %v, want UNAVAILABLE", w.err)
		}
	})
}
