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
	dir := shortDir(t)
	drv := startDriver(t, dir)
	const id = "0b5e2a7d-1c3f-4e8a-b6d9-2a4c6e8f0a13"
	drv.Put(testSandbox(id, "sup"))
	col := startCollector(t, dir, "")
	rp := startProxy(t, proxyConfig(dir, drv.Path, col.addr))
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
}

// TestFailOpenMisconfigured: a collector that is not there at all and a
// token file that does not exist: driver traffic is unaffected, the
// problem is counted.
func TestFailOpenMisconfigured(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	drv.Put(testSandbox("9d3e1f2a-5b6c-4d7e-8f90-a1b2c3d4e5f6", "x"))
	cfg := proxyConfig(dir, drv.Path, "127.0.0.1:1")
	cfg.Collector.TokenFile = filepath.Join(dir, "missing.token")
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
	// Without eventpipe's events, the driver's own kubernetes events pass.
	w := watch(t, gw)
	if err := drv.WaitWatchers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	drv.Platform("9d3e1f2a-5b6c-4d7e-8f90-a1b2c3d4e5f6", gatewaytest.PlatformEvent{TimestampMS: 1, Source: "kubernetes", Type: "Normal", Reason: "Pulling", Message: "the driver's own"})
	waitFor(t, 5*time.Second, "the driver's kubernetes event passed through", func() (bool, string) {
		return len(w.all()) == 1, fmt.Sprint(len(w.all()))
	})
}

// TestRestarts: the driver restarts (the gateway's stream breaks and is
// reopened on the same connection), then the proxy restarts with its
// state file (the gateway keeps running and redials): no event reaches a
// stream of the same gateway twice, and a gateway that restarts afterwards
// still gets the tail.
func TestRestarts(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	const id = "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"
	drv.Put(testSandbox(id, "r"))
	col := startCollector(t, dir, "")
	cfg := proxyConfig(dir, drv.Path, col.addr)
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
	dir := shortDir(t)
	drv := startDriver(t, dir)
	rp := startProxy(t, proxyConfig(dir, drv.Path, "127.0.0.1:1"))
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
}

// TestFollowAuthenticated: the proxy reads the Follow stream with a reader
// token like any other reader; a wrong token is counted and logged, and
// driver traffic flows regardless.
func TestFollowAuthenticated(t *testing.T) {
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

	good := proxyConfig(dir, drv.Path, col.addr)
	good.Collector.TokenFile = filepath.Join(dir, "reader.token")
	write(good.Collector.TokenFile, readerToken+"\n")
	rp := startProxy(t, good)
	w := watch(t, dialT(t, good.Listen))

	bad := proxyConfig(dir, drv.Path, col.addr)
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
}

// TestShutdownPrompt: with a WatchSandboxes stream open, the proxy stops
// well within its shutdown grace (the stream ends with UNAVAILABLE, so the
// gateway redials the next proxy at once).
func TestShutdownPrompt(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	rp := startProxy(t, proxyConfig(dir, drv.Path, "127.0.0.1:1"))
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
}

// TestFailOpenFromFirstSecond: the driver's own kubernetes platform events
// pass unchanged whenever eventpipe's Follow stream is not live: from the
// proxy's start while the collector is down (with the default settings),
// and from the moment an outage begins. They are replaced (dropped, as
// eventpipe sends its own) only while the stream is live.
func TestFailOpenFromFirstSecond(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	const id = "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b"
	drv.Put(testSandbox(id, "fo"))
	col := startCollector(t, dir, "")
	col.stop(t) // down before the proxy starts; started again below on the same address
	cfg := NewDefaultConfig()
	cfg.Listen = filepath.Join(dir, "proxy", "proxy.sock")
	cfg.Driver, cfg.GatewayID = drv.Path, "openshell"
	cfg.Collector.Address, cfg.Collector.Insecure = col.addr, true
	rp := startProxy(t, cfg)
	gw := dialT(t, cfg.Listen)
	w := watch(t, gw)
	if err := drv.WaitWatchers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	n := 0
	driverEvent := func() {
		n++
		drv.Platform(id, gatewaytest.PlatformEvent{TimestampMS: int64(n), Source: "kubernetes", Type: "Normal", Reason: "Pulling", Message: fmt.Sprintf("the driver's own %d", n)})
	}
	passed := func(what string, want int) {
		t.Helper()
		waitFor(t, 2*time.Second, what, func() (bool, string) {
			return len(w.all())-len(w.ours()) == want, fmt.Sprintf("%d of the driver's events arrived", len(w.all())-len(w.ours()))
		})
	}

	driverEvent()
	passed("the driver's event in the first second, collector never reached", 1)

	col.start(t)
	waitFor(t, 10*time.Second, "the Follow stream live", func() (bool, string) {
		return rp.metric(t, "eventpipe_driver_proxy_follow_connected") == 1, ""
	})
	driverEvent()
	waitFor(t, 5*time.Second, "the driver's event dropped while eventpipe's stream is live", func() (bool, string) {
		return rp.metric(t, "eventpipe_driver_proxy_driver_kubernetes_events_dropped_total") == 1, ""
	})

	col.stop(t)
	waitFor(t, 10*time.Second, "the outage noticed", func() (bool, string) {
		return rp.metric(t, "eventpipe_driver_proxy_follow_connected") == 0, ""
	})
	driverEvent()
	passed("the driver's event at once after the outage began", 2)
}

// TestFollowReturnsFast: after a collector outage long enough for the
// back-off to have grown past its cap, the proxy follows again within
// about one probe interval of the collector's return, not one back-off.
func TestFollowReturnsFast(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	const id = "6f7a8b9c-0d1e-4f2a-8b3c-4d5e6f7a8b9c"
	drv.Put(testSandbox(id, "rf"))
	col := startCollector(t, dir, "")
	cfg := proxyConfig(dir, drv.Path, col.addr)
	cfg.Follow.BackoffMin, cfg.Follow.BackoffMax = time.Second, 20*time.Second
	rp := startProxy(t, cfg)
	gw := dialT(t, cfg.Listen)
	w := watch(t, gw)
	col.ship(t, pullFailed(id, 1))
	waitFor(t, 10*time.Second, "the first event", func() (bool, string) { return len(w.ours()) == 1, "" })

	col.stop(t)
	// Attempts at about 0, 1 and 3 s, then a wait of 4 s (±20 % each):
	// without the probe the next attempt is at least 1.6 s after the
	// collector is back, 3 s typically.
	time.Sleep(4 * time.Second)
	col.start(t)
	back := time.Now()
	waitFor(t, 10*time.Second, "the Follow stream live again", func() (bool, string) {
		return rp.metric(t, "eventpipe_driver_proxy_follow_connected") == 1, ""
	})
	d := time.Since(back)
	t.Logf("followed again %s after the collector returned", d.Round(time.Millisecond))
	if d > 1400*time.Millisecond {
		t.Errorf("followed again %s after the collector returned, want within 1.4s (probes every 250ms)", d.Round(time.Millisecond))
	}
	col.ship(t, pullFailed(id, 2))
	waitFor(t, 5*time.Second, "the event after the outage", func() (bool, string) { return len(w.ours()) == 2, "" })
}
