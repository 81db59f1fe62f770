package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/gateway/driverwire"
	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

// The relay soak: one gateway connection carries, for a fixed time, many
// concurrent calls of randomly chosen kinds through the proxy, while the
// pull failures of some sandboxes are switched on and off through the
// collector's follow stream (so the proxy's decision to edit GetSandbox and
// ListSandboxes answers flips mid-run). Every answer is checked against what
// the driver sent: byte for byte for forwarded calls, and for edited ones
// equal to the driverwire edit of the driver's answer with a pull-failure
// state the sandbox had while the call ran. A watchdog fails the run, with
// the stuck calls and a goroutine dump, when a call does not end; at the end
// the connection must still answer a fresh call promptly.
//
// Everything random comes from the seed (printed; -soak.seed replays it,
// up to the scheduling, which the seed cannot fix). Without flags a short
// form runs (seed 2 and a random one, 2 s each, in each relay mode; the h2
// variant a random one); the long form is the same tests with -soak.for
// (README, "Soak").

var (
	soakFor  = flag.Duration("soak.for", 0, "relay soak: how long each seed runs (default 2s, for the default seeds)")
	soakSeed = flag.Uint64("soak.seed", 0, "relay soak: run only this seed (0: the default seeds)")
	// soakRandom is for `make soak`: a new seed each run, printed. Never
	// in `make test`, which must not depend on the draw.
	soakRandom = flag.Bool("soak.random", false, "relay soak: run one new random seed (printed) instead of the fixed ones")
	// soakDirect tells a relay fault from a peer's: the same calls
	// straight to the driver (TestRelaySoakH2; Get/List are then never
	// edited, so the edit checks see the driver's answers).
	soakDirect = flag.Bool("soak.direct", false, "relay soak (h2): call the driver directly, without the proxy")
)

// soakScript is what one soak call asks of the driver; it travels in the
// call's metadata (x-soak-script, JSON) so the driver needs no shared state.
type soakScript struct {
	ID    int64 `json:"id"`
	Delay int   `json:"d,omitempty"` // ms before the driver answers
	Gap   int   `json:"g,omitempty"` // ms before each response message
	Req   []int `json:"q,omitempty"` // sizes of the request messages (checked by the driver)
	Resp  []int `json:"r,omitempty"` // sizes of the response messages
	Echo  bool  `json:"e,omitempty"` // bidi: answer each request with its echo as it comes
	Code  int   `json:"c,omitempty"` // the status the call ends with
	TOnly bool  `json:"t,omitempty"` // end with Code before sending anything (trailers-only)
	Fill  bool  `json:"l,omitempty"` // request messages are h2peer's (h2Fill), not soakBody
}

// soakReq is request message i of a script.
func soakReq(sc soakScript, i int) []byte {
	if sc.Fill {
		return h2Fill(uint64(sc.ID)<<8|uint64(i), sc.Req[i])
	}
	return soakBody(sc.ID, 'q', i, sc.Req[i])
}

// h2Fill is testenv/h2peer's fill: its request messages.
func h2Fill(seed uint64, n int) []byte {
	const mul, add = 6364136223846793005, 1442695040888963407
	x := seed*mul + add
	b := make([]byte, n)
	for i := range b {
		x = x*mul + add
		b[i] = byte(x >> 33)
	}
	return b
}

// soakBody is message i of a call in direction dir ('q' request, 'r'
// response): n bytes from a generator keyed by them, so both ends can
// produce and check it.
func soakBody(id int64, dir byte, i, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(id), uint64(dir)<<32|uint64(i)))
	for j := 0; j < n; j += 8 {
		v := r.Uint64()
		for k := 0; k < 8 && j+k < n; k++ {
			b[j+k] = byte(v >> (8 * k))
		}
	}
	return b
}

// soakEcho is the driver's answer to a bidi request message.
func soakEcho(req []byte) []byte {
	return protowire.AppendString(protowire.AppendTag(append([]byte(nil), req...), 906, protowire.BytesType), "soak-echo")
}

// soakStatus is the status a script ends with (nil: OK); details on some,
// so grpc-status-details-bin crosses the relay too.
func soakStatus(sc soakScript) *status.Status {
	if sc.Code == 0 {
		return nil
	}
	st := status.New(codes.Code(sc.Code), fmt.Sprintf("soak call %d: scripted %s", sc.ID, codes.Code(sc.Code)))
	if sc.ID%2 == 0 {
		st, _ = st.WithDetails(wrapperspb.String(fmt.Sprintf("detail of %d", sc.ID)))
	}
	return st
}

// soakHook plays the driver's side of the soak: Get and List calls wait
// their scripted delay and go to the test driver; other scripted calls are
// answered here. Calls without a script (the proxy's own WatchSandboxes,
// the test's direct calls) are the driver's.
func soakHook(method string, ss grpc.ServerStream) (bool, error) {
	ctx := ss.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get("x-soak-script")
	if len(v) != 1 {
		return false, nil
	}
	var sc soakScript
	if err := json.Unmarshal([]byte(v[0]), &sc); err != nil {
		return true, status.Errorf(codes.Internal, "soak driver: script: %v", err)
	}
	if !sleepCtx(ctx, sc.Delay) {
		return true, ctx.Err()
	}
	if method == gatewaytest.MethodGet || method == gatewaytest.MethodList {
		return false, nil
	}
	if sc.TOnly {
		return true, soakStatus(sc).Err()
	}
	hdr := metadata.Pairs("x-soak-method", method)
	for k, vs := range md {
		if strings.HasPrefix(k, "x-m-") {
			hdr.Append("x-echo-"+k, vs...)
		}
	}
	ss.SetTrailer(metadata.Pairs("x-soak-trailer", fmt.Sprint(sc.ID), "x-soak-trailer-bin", string([]byte{0, byte(sc.ID), 0xff})))
	if err := ss.SendHeader(hdr); err != nil {
		return true, err
	}
	for i := 0; ; i++ {
		var req gatewaytest.Bytes
		err := ss.RecvMsg(&req)
		if errors.Is(err, io.EOF) {
			if i != len(sc.Req) {
				return true, status.Errorf(codes.DataLoss, "soak driver: %d request messages, script says %d", i, len(sc.Req))
			}
			break
		}
		if err != nil {
			return true, err
		}
		if i >= len(sc.Req) || !bytes.Equal(req.B, soakReq(sc, i)) {
			return true, status.Errorf(codes.DataLoss, "soak driver: request message %d (%d bytes) is not the one sent", i, len(req.B))
		}
		if sc.Echo {
			if err := ss.SendMsg(&gatewaytest.Bytes{B: soakEcho(req.B)}); err != nil {
				return true, err
			}
		}
	}
	for i, n := range sc.Resp {
		if !sleepCtx(ctx, sc.Gap) {
			return true, ctx.Err()
		}
		if err := ss.SendMsg(&gatewaytest.Bytes{B: soakBody(sc.ID, 'r', i, n)}); err != nil {
			return true, err
		}
	}
	return true, soakStatus(sc).Err()
}

func sleepCtx(ctx context.Context, ms int) bool {
	if ms <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// soakCodec passes messages through as bytes (name "proto", as the gateway's).
type soakCodec struct{}

func (soakCodec) Name() string                  { return "proto" }
func (soakCodec) Marshal(v any) ([]byte, error) { return v.(*gatewaytest.Bytes).B, nil }
func (soakCodec) Unmarshal(b []byte, v any) error {
	v.(*gatewaytest.Bytes).B = append([]byte{}, b...)
	return nil
}

// soakSpan is a pull-failure state of a sandbox and when the proxy may
// have held it: from the moment the occurrence was shipped until the next
// state was seen in the proxy's hub (to zero: still current).
type soakSpan struct {
	patch    *driverwire.Patch // nil: no failure
	from, to time.Time
}

// soakCall is one call in flight, for the watchdog.
type soakCall struct {
	id     int64
	desc   string
	start  time.Time
	budget time.Duration
	stage  atomic.Value // string
}

type soakRun struct {
	t       *testing.T
	seed    uint64
	drv     *gatewaytest.Driver
	rp      *runningProxy
	col     *testCollector
	conn    *grpc.ClientConn
	toggled []string

	// Direct answers of the driver (no proxy) to Get per id and List.
	raw    map[string]gatewaytest.Response
	rawErr map[string]error

	// toggleMu is held by a toggle from its ship until its state is in
	// spans: a check that finds no matching state waits for it and looks
	// again (the call may have seen the state of a toggle in progress).
	toggleMu sync.Mutex
	clock    time.Time // occurrence times: 2 s apart, so the hub's to-the-second order holds

	mu       sync.Mutex
	toggles  []string // for failure reports
	spans    map[string][]soakSpan
	inflight map[int64]*soakCall
	counts   map[string]int
	failures int

	nextID atomic.Int64
	stuck  atomic.Bool
}

const (
	soakWorkers  = 16
	soakExtra    = 1500 // untoggled sandboxes: List answers of about 230 KB (edited off the reader)
	soakMissing  = "00000000-dead-4000-8000-000000000000"
	soakMaxBytes = 3 << 20
)

// soakUnary and soakStreaming are the methods of forwarded calls: unary
// ones of the layout (the gRPC legs relay them as unary) and unknown ones,
// which both modes relay as streams.
var (
	soakUnary     = []string{gatewaytest.Prefix + "CreateSandbox", gatewaytest.Prefix + "ValidateSandboxCreate", gatewaytest.Prefix + "SoakFuture", gatewaytest.MethodUnknownSv}
	soakStreaming = []string{gatewaytest.Prefix + "SoakFuture", gatewaytest.MethodUnknownSv}
)

// soakSeeds are the seeds a soak test runs: fixed ones by default (so
// `make test` is the same on every clone), the one -soak.seed names, or a
// new random one with -soak.random (`make soak`), printed so that a
// failure can be replayed and kept as a fixed case.
func soakSeeds(t *testing.T, fixed ...uint64) ([]uint64, time.Duration) {
	seeds := fixed
	switch {
	case *soakSeed != 0:
		seeds = []uint64{*soakSeed}
	case *soakRandom:
		seed := uint64(time.Now().UnixNano())
		fmt.Printf("%s: random seed %d (replay: -soak.seed=%d)\n", t.Name(), seed, seed)
		seeds = []uint64{seed}
	}
	d := 2 * time.Second
	if *soakFor > 0 {
		d = *soakFor
	}
	return seeds, d
}

// TestRelaySoak runs the soak for each seed: 2 (the smallest windows) and
// 302906312 (grpc-go's own windows) by default.
func TestRelaySoak(t *testing.T) {
	seeds, d := soakSeeds(t, 2, 302906312)
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("relay soak: -soak.seed=%d -soak.for=%s", seed, d)
			runSoak(t, seed, d)
		})
	}
}

// newSoak starts the driver (with soakHook), the collector and the proxy,
// takes the driver's own Get and List answers, and makes failingID fail.
func newSoak(t *testing.T, seed uint64) *soakRun {
	dir := shortDir(t)
	drv, err := gatewaytest.StartDriverHook(dir+"/driver/driver.sock", soakHook)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drv.Stop)
	s := &soakRun{t: t, seed: seed, drv: drv, raw: map[string]gatewaytest.Response{},
		rawErr: map[string]error{}, spans: map[string][]soakSpan{}, inflight: map[int64]*soakCall{}, counts: map[string]int{}}
	drv.Put(testSandbox(healthyID, "healthy"))
	drv.Put(testSandbox(failingID, "failing"))
	s.toggled = []string{failingID}
	for i := range 3 {
		id := fmt.Sprintf("00000000-0000-4000-9000-%012d", i)
		drv.Put(testSandbox(id, fmt.Sprintf("toggled-%d", i)))
		s.toggled = append(s.toggled, id)
	}
	for i := range soakExtra {
		drv.Put(testSandbox(extraID(i), fmt.Sprintf("sb-%d-%s", i, strings.Repeat("n", 100))))
	}
	s.col = startCollector(t, dir, "")
	s.rp = startProxy(t, proxyConfig(dir, drv.Path, s.col.addr))

	direct := dialT(t, drv.Path)
	for _, id := range []string{healthyID, soakMissing} {
		s.raw[id], s.rawErr[id] = direct.Call(context.Background(), gatewaytest.MethodGet, reqWithUnknown(id))
	}
	for _, id := range s.toggled {
		s.raw[id], s.rawErr[id] = direct.Call(context.Background(), gatewaytest.MethodGet, reqWithUnknown(id))
	}
	s.raw["list"], s.rawErr["list"] = direct.Call(context.Background(), gatewaytest.MethodList, reqWithUnknown())
	s.raw["caps"], s.rawErr["caps"] = direct.Call(context.Background(), gatewaytest.MethodCaps, nil)
	if s.rawErr["list"] != nil {
		t.Fatal(s.rawErr["list"])
	}
	now := time.Now()
	for _, id := range s.toggled {
		s.spans[id] = []soakSpan{{from: now.Add(-time.Hour)}}
	}
	s.clock = now.Add(-time.Hour)
	s.toggle(failingID, true, 1)
	return s
}

// toggler switches pull failures on and off at random until end.
func (s *soakRun) toggler(ctx context.Context, end time.Time) {
	trng := rand.New(rand.NewPCG(s.seed, 0x7066))
	attempts := uint32(2)
	for time.Now().Before(end) && ctx.Err() == nil {
		time.Sleep(time.Duration(20+trng.IntN(200)) * time.Millisecond)
		if ctx.Err() != nil {
			return // the run was stopped (a stall): the test is ending
		}
		id := s.toggled[trng.IntN(len(s.toggled))]
		s.mu.Lock()
		cur := s.spans[id][len(s.spans[id])-1].patch
		s.mu.Unlock()
		attempts++
		s.toggle(id, cur == nil || trng.IntN(2) == 0, attempts)
	}
}

func runSoak(t *testing.T, seed uint64, d time.Duration) {
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	s := newSoak(t, seed)
	direct := dialT(t, s.drv.Path)

	// The gateway's connection: small fixed windows (every large message
	// needs many WINDOW_UPDATEs) or grpc-go's own (BDP growth, so SETTINGS
	// changes of the initial window mid-run), by seed.
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(soakCodec{}))}
	small := rng.IntN(2) == 0
	if small {
		opts = append(opts, grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(65535))
	}
	t.Logf("gateway windows: small=%v", small)
	conn, err := grpc.NewClient("unix://"+s.rp.p.cfg.Listen, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.conn = conn

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchCtx, watchCancel := context.WithCancel(ctx)
	watchDone := make(chan error, 1)
	var watchEvents atomic.Int64
	go func() { watchDone <- s.watch(watchCtx, &watchEvents) }()

	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range soakWorkers {
		wrng := rand.New(rand.NewPCG(seed, uint64(w+1)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && ctx.Err() == nil {
				s.oneCall(ctx, wrng)
			}
		}()
	}
	toggleDone := make(chan struct{})
	go func() {
		defer close(toggleDone)
		s.toggler(ctx, end)
	}()
	workersDone := make(chan struct{})
	go func() { wg.Wait(); <-toggleDone; close(workersDone) }()
	s.watchdog(workersDone, cancel)

	if s.stuck.Load() {
		t.FailNow()
	}
	// The connection still carries a fresh call promptly.
	fctx, fcancel := context.WithTimeout(context.Background(), 3*time.Second)
	start := time.Now()
	var resp gatewaytest.Bytes
	err = conn.Invoke(fctx, gatewaytest.MethodCaps, &gatewaytest.Bytes{B: nil}, &resp)
	fcancel()
	if err != nil {
		t.Errorf("a fresh call after the soak: %v (after %s)", err, time.Since(start))
	} else if want, _ := direct.Call(context.Background(), gatewaytest.MethodCaps, nil); !bytes.Equal(resp.B, want.Bodies[0]) {
		t.Errorf("a fresh call after the soak: answer differs from the driver's")
	}
	watchCancel()
	if err := <-watchDone; err != nil {
		t.Errorf("WatchSandboxes stream: %v", err)
	}
	if t.Failed() {
		s.mu.Lock()
		t.Logf("toggles:\n%s", strings.Join(s.toggles, "\n"))
		s.mu.Unlock()
	}
	if watchEvents.Load() == 0 {
		t.Errorf("WatchSandboxes stream delivered nothing")
	}
	if n := s.rp.metric(t, "eventpipe_driver_proxy_unparsed_messages_total"); n != 0 {
		t.Errorf("%v driver messages the proxy could not parse", n)
	}
	s.mu.Lock()
	toggles := 0
	for _, sp := range s.spans {
		toggles += len(sp) - 1
	}
	t.Logf("calls by kind: %v; pull-failure toggles: %d", s.counts, toggles)
	s.mu.Unlock()
}

// toggle switches a sandbox's pull failure on (a new failure with this
// attempt count) or off (the agent container pulled) through the
// collector, and waits until the proxy's hub holds the new state.
func (s *soakRun) toggle(id string, fail bool, attempts uint32) {
	t := s.t
	s.clock = s.clock.Add(2 * time.Second)
	clock := s.clock
	var o *eventpipev1.Occurrence
	if fail {
		o = pullFailed(id, attempts)
	} else {
		o = pulledAgent(id)
	}
	ts := timestamppb.New(clock)
	o.OccurredAt, o.ObservedAt = ts, ts
	if o.PullFailure != nil {
		o.PullFailure.FirstSeen, o.PullFailure.LastSeen = ts, ts
	}
	s.toggleMu.Lock()
	defer s.toggleMu.Unlock()
	s.mu.Lock()
	prev := s.spans[id][len(s.spans[id])-1].patch
	s.mu.Unlock()
	from := time.Now()
	s.col.ship(t, o)
	var got *driverwire.Patch
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, ok := s.rp.p.hub.patchFor(id)
		if ok == fail && (!ok || prev == nil || !reflect.DeepEqual(p, *prev)) {
			if ok {
				got = &p
			}
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("toggle %s fail=%v: the proxy's hub did not take it in 10s", id, fail)
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	now := time.Now()
	s.mu.Lock()
	sp := s.spans[id]
	sp[len(sp)-1].to = now
	s.spans[id] = append(sp, soakSpan{patch: got, from: from})
	s.toggles = append(s.toggles, fmt.Sprintf("%s..%s %s fail=%v attempts=%d at=%s", from.Format("15:04:05.000000"), now.Format("15:04:05.000000"), id, fail, attempts, clock.Format("15:04:05")))
	s.mu.Unlock()
}

// patchesDuring returns the pull-failure states id may have had in the
// proxy between from and to.
func (s *soakRun) patchesDuring(id string, from, to time.Time) []*driverwire.Patch {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*driverwire.Patch
	for _, sp := range s.spans[id] {
		if !sp.from.After(to) && (sp.to.IsZero() || !sp.to.Before(from)) {
			out = append(out, sp.patch)
		}
	}
	return out
}

var soakAttempts = regexp.MustCompile(`[0-9]+ attempts`)

func (s *soakRun) spanString(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, sp := range s.spans[id] {
		st := "healthy"
		if sp.patch != nil {
			st = soakAttempts.FindString(sp.patch.ReadySuffix)
		}
		fmt.Fprintf(&b, "\n  %s..%s %s", sp.from.Format("15:04:05.000000"), sp.to.Format("15:04:05.000000"), st)
	}
	return b.String()
}

// watch reads a WatchSandboxes stream (the proxy answers it itself) for
// the whole run, on the same connection.
func (s *soakRun) watch(ctx context.Context, n *atomic.Int64) error {
	st, err := s.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, gatewaytest.MethodWatch)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	if err := st.SendMsg(&gatewaytest.Bytes{B: nil}); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	_ = st.CloseSend()
	for {
		var b gatewaytest.Bytes
		if err := st.RecvMsg(&b); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("after %d events: %w", n.Load(), err)
		}
		n.Add(1)
	}
}

// watchdog waits for the workers; a call that runs past its budget stops
// the run with the stuck calls and every goroutine's stack in the log.
func (s *soakRun) watchdog(done <-chan struct{}, cancel context.CancelFunc) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		now := time.Now()
		var stuck []string
		s.mu.Lock()
		for _, c := range s.inflight {
			if now.Sub(c.start) > c.budget {
				stuck = append(stuck, fmt.Sprintf("call %d %s: %s running, stage %v", c.id, c.desc, now.Sub(c.start).Round(time.Millisecond), c.stage.Load()))
			}
		}
		s.mu.Unlock()
		if len(stuck) == 0 {
			continue
		}
		buf := make([]byte, 8<<20)
		buf = buf[:runtime.Stack(buf, true)]
		s.t.Errorf("seed=%d: %d calls stalled:\n%s\n\ngoroutines:\n%s", s.seed, len(stuck), strings.Join(stuck, "\n"), buf)
		s.stuck.Store(true)
		cancel()
		<-done
		return
	}
}

func (s *soakRun) fail(format string, args ...any) {
	s.mu.Lock()
	s.failures++
	n := s.failures
	s.mu.Unlock()
	if n <= 20 {
		s.t.Errorf("seed=%d: "+format, append([]any{s.seed}, args...)...)
	}
}

// soakSize: mostly small messages, some beyond every window, up to 3 MiB.
func soakSize(r *rand.Rand) int {
	switch p := r.IntN(100); {
	case p < 10:
		return 0
	case p < 45:
		return r.IntN(200)
	case p < 75:
		return r.IntN(16 << 10)
	case p < 92:
		return r.IntN(256 << 10)
	case p < 98:
		return r.IntN(1 << 20)
	default:
		return soakMaxBytes - r.IntN(64<<10)
	}
}

func soakSizes(r *rand.Rand, max int) []int {
	n := r.IntN(max + 1)
	out := make([]int, n)
	total := 0
	for i := range out {
		out[i] = soakSize(r)
		if total += out[i]; total > 8<<20 { // keep one call's memory bounded
			return out[:i]
		}
	}
	return out
}

var soakRepeated = []string{"alpha", "beta", strings.Repeat("gamma", 40), "x y z ~!@#$%^&*()"}

// soakMD is a call's metadata: values repeated across calls (HPACK table
// hits), new names and values (table churn), values larger than the whole
// table, and binary values.
func soakMD(r *rand.Rand, id int64) metadata.MD {
	md := metadata.Pairs("traceparent", fmt.Sprintf("00-%032x-%016x-01", id, r.Uint64()))
	for range r.IntN(5) {
		switch r.IntN(4) {
		case 0:
			md.Append("x-m-rep", soakRepeated[r.IntN(len(soakRepeated))])
		case 1:
			md.Append(fmt.Sprintf("x-m-new-%d", r.IntN(1000)), fmt.Sprintf("v%d-%d", id, r.IntN(1e6)))
		case 2:
			md.Append("x-m-large", strings.Repeat(string(rune('a'+r.IntN(26))), 1+r.IntN(6000)))
		case 3:
			b := make([]byte, r.IntN(300))
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			md.Append("x-m-bin-bin", string(b))
		}
	}
	return md
}

var soakCodes = []codes.Code{codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.Internal,
	codes.Unavailable, codes.ResourceExhausted, codes.Aborted, codes.PermissionDenied}

// oneCall picks a call, runs it through the proxy and checks its answer.
func (s *soakRun) oneCall(ctx context.Context, r *rand.Rand) {
	id := s.nextID.Add(1)
	sc := soakScript{ID: id}
	if r.IntN(4) == 0 {
		sc.Delay = r.IntN(50)
		if r.IntN(10) == 0 {
			sc.Delay = r.IntN(600)
		}
	}
	var kind, method string
	var get string // GetSandbox's id; "list" for ListSandboxes
	switch p := r.IntN(100); {
	case p < 30:
		kind, method = "unary", soakUnary[r.IntN(len(soakUnary))]
		sc.Req, sc.Resp = []int{soakSize(r)}, []int{soakSize(r)}
	case p < 45:
		kind, method = "server-stream", soakStreaming[r.IntN(len(soakStreaming))]
		sc.Req, sc.Resp = []int{soakSize(r)}, soakSizes(r, 20)
		if r.IntN(3) == 0 {
			sc.Gap = r.IntN(20)
		}
	case p < 52:
		kind, method = "client-stream", soakStreaming[r.IntN(len(soakStreaming))]
		sc.Req, sc.Resp = soakSizes(r, 12), []int{soakSize(r)}
	case p < 62:
		kind, method = "bidi", soakStreaming[r.IntN(len(soakStreaming))]
		sc.Req, sc.Echo = soakSizes(r, 12), true
	case p < 85:
		kind, method = "get", gatewaytest.MethodGet
		ids := append([]string{healthyID, soakMissing}, s.toggled...)
		get = ids[r.IntN(len(ids))]
	default:
		kind, method, get = "list", gatewaytest.MethodList, "list"
	}
	if get == "" && r.IntN(5) == 0 {
		sc.Code = int(soakCodes[r.IntN(len(soakCodes))])
		sc.TOnly = r.IntN(2) == 0
		if sc.TOnly || kind == "unary" { // a unary error answer has no message
			sc.Resp = nil
		}
	}
	// Client behaviour: cancel or a deadline at a random point, and slow
	// reading (stop reading for a while so the windows fill).
	var cancelAfter, deadline time.Duration
	switch r.IntN(10) {
	case 0:
		cancelAfter = time.Duration(r.IntN(100)) * time.Millisecond
	case 1:
		deadline = time.Duration(1+r.IntN(300)) * time.Millisecond
	}
	var pauseAt, pauseMS int = -1, 0
	if r.IntN(5) == 0 {
		pauseAt, pauseMS = r.IntN(3), 100+r.IntN(700)
	}
	md := soakMD(r, id)
	js, _ := json.Marshal(sc)
	md.Set("x-soak-script", string(js))
	req := reqWithUnknown(get)
	if get == "" {
		req = nil
	}

	desc := fmt.Sprintf("%s %s script=%s cancel=%s deadline=%s pause=%d@%d", kind, method, js, cancelAfter, deadline, pauseMS, pauseAt)
	if get != "" {
		desc += " sandbox=" + get
	}
	c := &soakCall{id: id, desc: desc, start: time.Now(),
		budget: 20*time.Second + time.Duration(sc.Delay+sc.Gap*len(sc.Resp)+pauseMS)*time.Millisecond}
	c.stage.Store("start")
	s.mu.Lock()
	s.inflight[id] = c
	s.counts[kind]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.inflight, id)
		s.mu.Unlock()
	}()

	cctx, ccancel := context.WithCancel(metadata.NewOutgoingContext(ctx, md))
	defer ccancel()
	if deadline > 0 {
		var dc context.CancelFunc
		cctx, dc = context.WithTimeout(cctx, deadline)
		defer dc()
	}
	if cancelAfter > 0 {
		tm := time.AfterFunc(cancelAfter, ccancel)
		defer tm.Stop()
	}
	interrupted := cancelAfter > 0 || deadline > 0

	start := time.Now()
	var got gatewaytest.Response
	var err error
	if kind == "unary" || ((kind == "get" || kind == "list") && r.IntN(2) == 0) {
		c.stage.Store("invoke")
		var resp gatewaytest.Bytes
		in := req
		if kind == "unary" {
			in = soakBody(id, 'q', 0, sc.Req[0])
		}
		err = s.conn.Invoke(cctx, method, &gatewaytest.Bytes{B: in}, &resp, grpc.Header(&got.Header), grpc.Trailer(&got.Trailer))
		if err == nil {
			got.Bodies = [][]byte{resp.B}
		}
	} else {
		got, err = s.stream(cctx, c, method, sc, req, pauseAt, pauseMS)
	}
	if ctx.Err() != nil {
		return // the watchdog stopped the run
	}
	c.stage.Store("check")
	if code := status.Code(err); interrupted && (code == codes.Canceled || code == codes.DeadlineExceeded) {
		s.checkBodies(id, desc, sc, get, got, start, true)
		return
	}
	if get != "" {
		if !proto.Equal(status.Convert(err).Proto(), status.Convert(s.rawErr[get]).Proto()) {
			s.fail("call %d %s: status %v, the driver's %v", id, desc, err, s.rawErr[get])
			return
		}
		if err == nil && !sameMD(got.Header, md) {
			s.fail("call %d %s: response headers %v do not echo the call's metadata", id, desc, got.Header)
		}
	} else {
		var want error
		if st := soakStatus(sc); st != nil {
			want = st.Err()
		}
		if !proto.Equal(status.Convert(err).Proto(), status.Convert(want).Proto()) {
			s.fail("call %d %s: status %v, want %v", id, desc, err, want)
			return
		}
		if !sc.TOnly && !sameMD(got.Header, md) {
			s.fail("call %d %s: response headers %v do not echo the call's metadata", id, desc, got.Header)
		}
		if !sc.TOnly && (len(got.Trailer.Get("x-soak-trailer")) != 1 || got.Trailer.Get("x-soak-trailer")[0] != fmt.Sprint(id)) {
			s.fail("call %d %s: trailers %v", id, desc, got.Trailer)
		}
	}
	s.checkBodies(id, desc, sc, get, got, start, false)
}

// sameMD: the driver's response headers echo every x-m- value of the call.
func sameMD(hdr, sent metadata.MD) bool {
	for k, vs := range sent {
		if strings.HasPrefix(k, "x-m-") && !reflect.DeepEqual(hdr.Get("x-echo-"+k), vs) {
			return false
		}
	}
	return true
}

// stream runs a call as a stream, with an optional pause in reading
// (before response message pauseAt) so that the windows fill.
func (s *soakRun) stream(ctx context.Context, c *soakCall, method string, sc soakScript, req []byte, pauseAt, pauseMS int) (gatewaytest.Response, error) {
	var out gatewaytest.Response
	c.stage.Store("open")
	st, err := s.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return out, err
	}
	recv := func() error {
		if len(out.Bodies) == pauseAt {
			c.stage.Store("paused")
			time.Sleep(time.Duration(pauseMS) * time.Millisecond)
		}
		c.stage.Store(fmt.Sprintf("recv %d", len(out.Bodies)))
		var b gatewaytest.Bytes
		if err := st.RecvMsg(&b); err != nil {
			return err
		}
		out.Bodies = append(out.Bodies, b.B)
		return nil
	}
	finish := func(err error) (gatewaytest.Response, error) {
		if errors.Is(err, io.EOF) {
			err = nil
		}
		out.Header, _ = st.Header()
		out.Trailer = st.Trailer()
		return out, err
	}
	switch {
	case req != nil: // Get or List as a stream
		if err := st.SendMsg(&gatewaytest.Bytes{B: req}); err != nil {
			return finish(drain(st, recv))
		}
	case sc.Echo:
		for i, n := range sc.Req {
			c.stage.Store(fmt.Sprintf("send %d", i))
			if err := st.SendMsg(&gatewaytest.Bytes{B: soakBody(sc.ID, 'q', i, n)}); err != nil {
				return finish(drain(st, recv))
			}
			if err := recv(); err != nil {
				return finish(err)
			}
		}
	default:
		for i, n := range sc.Req {
			c.stage.Store(fmt.Sprintf("send %d", i))
			if err := st.SendMsg(&gatewaytest.Bytes{B: soakBody(sc.ID, 'q', i, n)}); err != nil {
				return finish(drain(st, recv))
			}
		}
	}
	_ = st.CloseSend()
	return finish(drain(st, recv))
}

func drain(_ grpc.ClientStream, recv func() error) error {
	for {
		if err := recv(); err != nil {
			return err
		}
	}
}

// checkBodies compares the response messages with what the driver sent
// (forwarded calls) or its answer as the proxy may have edited it (Get and
// List); partial: the call was interrupted, a prefix is enough.
func (s *soakRun) checkBodies(id int64, desc string, sc soakScript, get string, got gatewaytest.Response, start time.Time, partial bool) {
	var want [][]byte
	switch {
	case get != "":
		want = s.raw[get].Bodies
	case sc.TOnly:
	case sc.Echo:
		for i, n := range sc.Req {
			want = append(want, soakEcho(soakBody(sc.ID, 'q', i, n)))
		}
	default:
		for i, n := range sc.Resp {
			want = append(want, soakBody(sc.ID, 'r', i, n))
		}
	}
	if len(got.Bodies) > len(want) || (!partial && len(got.Bodies) != len(want)) {
		s.fail("call %d %s: %d response messages, want %d", id, desc, len(got.Bodies), len(want))
		return
	}
	for i, b := range got.Bodies {
		if get == "" {
			if !bytes.Equal(b, want[i]) {
				s.fail("call %d %s: response message %d differs (%d bytes, want %d; first difference at %d)", id, desc, i, len(b), len(want[i]), firstDiff(b, want[i]))
			}
			continue
		}
		end := time.Now()
		msg := s.checkEdited(get, b, want[i], start, end)
		if msg != "" {
			s.toggleMu.Lock() // a toggle in progress during the call is in spans now
			s.toggleMu.Unlock()
			msg = s.checkEdited(get, b, want[i], start, end)
		}
		if msg != "" {
			s.fail("call %d %s: %s (%d bytes, the driver's %d)", id, desc, msg, len(b), len(want[i]))
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// checkEdited: a Get or List answer is the driver's with each sandbox
// either as the driver sent it or as driverwire edits it for a state the
// sandbox had while the call ran; every other byte is the driver's.
func (s *soakRun) checkEdited(get string, got, raw []byte, from, to time.Time) string {
	gf, err := soakFields(got)
	if err != nil {
		return fmt.Sprintf("answer does not parse: %v", err)
	}
	rf, _ := soakFields(raw)
	if len(gf) != len(rf) {
		return fmt.Sprintf("answer has %d fields, the driver's %d", len(gf), len(rf))
	}
	for i := range rf {
		if bytes.Equal(gf[i].all, rf[i].all) {
			continue
		}
		if rf[i].num != 1 || gf[i].num != 1 {
			return fmt.Sprintf("field %d (number %d) differs from the driver's", i, rf[i].num)
		}
		sid, _ := driverwire.SandboxID(rf[i].val)
		ok := false
		for _, p := range s.patchesDuring(sid, from, to) {
			if p == nil {
				continue
			}
			want, err := driverwire.PatchSandbox(rf[i].val, *p)
			if err == nil && bytes.Equal(want, gf[i].val) {
				ok = true
				break
			}
		}
		if !ok {
			gs, _ := gatewaytest.DecodeSandbox(gf[i].val)
			ws, _ := gatewaytest.DecodeSandbox(rf[i].val)
			now, ok := s.rp.p.hub.patchFor(sid)
			return fmt.Sprintf("hub now: %v %s\n got %+v\n driver %+v\n call %s..%s\n spans %s\n states %d: sandbox %s (field %d) is neither the driver's nor its edit for a state it had during the call", ok, soakAttempts.FindString(now.ReadySuffix), gs, ws, from.Format("15:04:05.000000"), to.Format("15:04:05.000000"), s.spanString(sid), len(s.patchesDuring(sid, from, to)), sid, i)
		}
	}
	return ""
}

type soakField struct {
	num      protowire.Number
	val, all []byte
}

func soakFields(b []byte) ([]soakField, error) {
	var out []soakField
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		f := soakField{num: num, all: b[:n+m]}
		if typ == protowire.BytesType {
			f.val, _ = protowire.ConsumeBytes(b[n:])
		}
		out = append(out, f)
		b = b[n+m:]
	}
	return out, nil
}
