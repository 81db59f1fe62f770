package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/eventpipe/eventpipe/sinks/gateway/driverwire"
)

// streamWorkers is the number of goroutines that run calls (see Run).
const streamWorkers = 4

// maxMsgBytes bounds one message either way; the driver's ListSandboxes
// answer grows with the number of sandboxes.
const maxMsgBytes = 64 << 20

// Flow-control windows of both legs, fixed. A fixed window turns off gRPC's
// bandwidth-delay estimator, which otherwise sends a PING (and reads its
// ack) for nearly every message received in call-and-answer traffic: with
// it off the proxy makes about 5 reads a unary call instead of 8
// (bench/gateway.md). On a Unix socket the delay is microseconds, so 1 MiB
// per stream (an 8 MB ListSandboxes answer is eight window updates) and
// 4 MiB per connection lose no throughput.
const (
	streamWindow = 1 << 20
	connWindow   = 4 << 20
)

// frame is one gRPC message. A message the proxy only forwards keeps the
// buffers gRPC read it into (data, one reference held) and is written to
// the other leg from them: no copy, no decoding. A message the proxy reads
// (the three places driverwire edits) is made contiguous with bytes.
type frame struct {
	data mem.BufferSlice // as received; nil once handed on or made contiguous
	b    []byte          // contiguous bytes: edited, spliced, or from bytes()
}

// bytes returns the message as one slice (copying received buffers once;
// the reference on them is released).
func (f *frame) bytes() []byte {
	if f.data != nil {
		f.b = f.data.Materialize()
		f.data.Free()
		f.data = nil
	}
	return f.b
}

// rawCodec moves frames unchanged. It is a gRPC CodecV2: a received
// message keeps gRPC's pooled buffers (reference counted) until the other
// leg has written them, instead of being copied twice per leg. Its name is
// empty, so the driver leg sends the bare "application/grpc" unless the
// call names the gateway's own subtype (contentSubtype): the driver sees
// the content-type the gateway sent.
type rawCodec struct{}

func (rawCodec) Name() string { return "" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	if f.data != nil {
		// gRPC frees what Marshal returns once written: the frame's
		// reference passes to it, so a frame is sent at most once this way.
		d := f.data
		f.data = nil
		return d, nil
	}
	return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	// gRPC frees data when Unmarshal returns: keep our own reference.
	data.Ref()
	f.data, f.b = data, nil
	return nil
}

// Proxy is the transparent ComputeDriver proxy. Build it with New and run it
// with Run.
type Proxy struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	hub     *hub
	driver  *grpc.ClientConn

	ready     chan struct{}
	readyOnce sync.Once
	// stopping is closed when Run's context ends: WatchSandboxes streams
	// end at once (the gateway redials the restarted proxy) while unary
	// calls drain.
	stopping chan struct{}

	stateMu sync.Mutex
	saved   delivered // what the state file says was delivered
}

// New validates cfg and prepares a proxy. Nothing listens or dials until Run.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid driver-proxy config: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, d := range cfg.Deprecations() {
		log.Warn("driver-proxy config: " + d)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	// The driver is a neighbour on a Unix socket: redial it quickly after it
	// restarts (gRPC's default backoff grows to two minutes).
	driver, err := grpc.NewClient("unix://"+cfg.Driver,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
		grpc.WithStaticStreamWindowSize(streamWindow), grpc.WithStaticConnWindowSize(connWindow),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{}),
			grpc.MaxCallRecvMsgSize(maxMsgBytes), grpc.MaxCallSendMsgSize(maxMsgBytes)))
	if err != nil {
		return nil, fmt.Errorf("driver %s: %w", cfg.Driver, err)
	}
	return &Proxy{
		cfg: cfg, log: log, metrics: m, driver: driver,
		hub:   newHub(cfg.Follow, m),
		ready: make(chan struct{}), stopping: make(chan struct{}),
	}, nil
}

// Ready is closed once the socket listens.
func (p *Proxy) Ready() <-chan struct{} { return p.ready }

// Run listens on cfg.Listen, forwards every RPC to the driver, follows the
// collector, and blocks until ctx ends. The collector being down never
// stops or delays driver traffic: the follow loop retries on its own.
func (p *Proxy) Run(ctx context.Context) error {
	defer p.driver.Close()
	saved, err := readState(p.cfg.Follow.StateFile)
	if err != nil {
		p.log.Warn("ignoring the saved follow state", "file", p.cfg.Follow.StateFile, "err", err)
	}
	if len(saved) > 0 {
		p.hub.restoreDelivered(saved)
		p.saved = saved
	}
	ul, err := listenUnix(p.cfg.Listen)
	if err != nil {
		return err
	}
	l := &peerListener{UnixListener: ul, uid: os.Geteuid(), log: p.log, rejected: p.metrics.peerRejected.Inc}
	p.log.Info("driver proxy listening", "listen", p.cfg.Listen, "driver", p.cfg.Driver,
		"gateway_id", p.cfg.GatewayID, "collector", p.cfg.Collector.Address, "layout", p.cfg.Layout)
	p.readyOnce.Do(func() { close(p.ready) })

	g, gctx := errgroup.WithContext(ctx)
	srv := p.newServer()
	g.Go(func() error {
		if err := srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("serve %s: %w", p.cfg.Listen, err)
		}
		return nil
	})
	fctx, fcancel := context.WithCancel(gctx)
	defer fcancel()
	f := newFollower(p.cfg, p.log, p.metrics, p.hub)
	g.Go(func() error { f.run(fctx); return nil })
	g.Go(func() error {
		<-gctx.Done()
		close(p.stopping)
		fcancel()
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(p.cfg.ShutdownGrace):
			srv.Stop()
			<-done
		}
		return nil
	})
	err = g.Wait()
	return err
}

// newServer is the gateway side: a gRPC server whose unknown-service
// handler takes every call.
func (p *Proxy) newServer() *grpc.Server {
	return grpc.NewServer(
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.UnknownServiceHandler(p.handle),
		grpc.MaxRecvMsgSize(maxMsgBytes), grpc.MaxSendMsgSize(maxMsgBytes),
		grpc.StaticStreamWindowSize(streamWindow), grpc.StaticConnWindowSize(connWindow),
		// Calls run on a few long-lived goroutines whose stacks have
		// already grown, instead of a new goroutine (and its stack growth
		// through two gRPC stacks) per call; a WatchSandboxes stream that
		// holds one is covered by gRPC starting a goroutine when all are
		// busy.
		grpc.NumStreamWorkers(streamWorkers),
	)
}

// persistUpTo records, before the events es are sent, that they (and
// everything before them, per partition) were delivered (write-ahead: temp file + rename, no fsync; a killed
// proxy loses nothing written, a crashed node restarts the gateway too).
// So a restarted proxy never sends them again to a gateway that kept
// running; an event cut off between this write and its send is missed by
// that gateway (at most once), not repeated.
func (p *Proxy) persistUpTo(es []*entry) {
	if p.cfg.Follow.StateFile == "" {
		return
	}
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	c, moved := p.saved.advance(es)
	if !moved {
		return
	}
	if err := writeState(p.cfg.Follow.StateFile, c); err != nil {
		p.metrics.stateErrors.Inc()
		p.log.Warn("cannot save the follow state; after a restart the gateway may get recent events again", "file", p.cfg.Follow.StateFile, "err", err)
		return
	}
	p.saved = c
}

// contentSubtype is the gRPC content subtype of the gateway's request
// ("proto" of "application/grpc+proto", "" of "application/grpc"), passed
// to the driver leg so the driver gets the content-type as the gateway sent
// it (gRPC writes the subtype lower-cased; the subtypes gRPC
// implementations send, proto and json, are).
func contentSubtype(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	ct := md.Get("content-type")
	if len(ct) == 0 {
		return ""
	}
	const base = "application/grpc"
	if len(ct[0]) > len(base) && strings.HasPrefix(ct[0], base) && ct[0][len(base)] == '+' {
		return ct[0][len(base)+1:]
	}
	return ""
}

// forwardMD is the request metadata for the driver: everything the gateway
// sent (trace context included) except the HTTP/2 pseudo and transport
// headers gRPC sets itself. FromIncomingContext already returns a copy of
// its own, which is edited in place (no second copy).
func forwardMD(ctx context.Context) metadata.MD {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, k := range []string{":authority", "content-type", "user-agent", "te"} {
		delete(md, k)
	}
	return md
}

// handle forwards one RPC of any method, unary or streaming. Only the
// responses of GetSandbox, ListSandboxes and WatchSandboxes are edited.
func (p *Proxy) handle(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return fmt.Errorf("no method in stream")
	}
	start := time.Now()
	ct := grpc.CallContentSubtype(contentSubtype(ss.Context()))
	octx := metadata.NewOutgoingContext(ss.Context(), forwardMD(ss.Context()))
	halfClosed := false
	if unaryRPCs[method] {
		// The gateway's call context ends the driver call too (cancel,
		// deadline, broken connection): no context of its own needed.
		err := p.unary(octx, ss, method, ct)
		if !errors.Is(err, errNoRequest) {
			p.metrics.rpcs.WithLabelValues(rpcLabel(method), codeLabel(err)).Inc()
			p.metrics.rpcSeconds.WithLabelValues(rpcLabel(method)).Observe(time.Since(start).Seconds())
			return err
		}
		// The gateway sent no request at all: let the driver answer that,
		// through the general path.
		halfClosed = true
	}
	ctx, cancel := context.WithCancel(octx)
	defer cancel()
	cs, err := p.driver.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method, ct)
	if err != nil {
		p.metrics.rpcs.WithLabelValues(rpcLabel(method), "dial_error").Inc()
		return err
	}
	up := &endedStream{ClientStream: cs}
	// Gateway -> driver: requests, then the half-close.
	if halfClosed {
		_ = up.CloseSend()
	} else {
		go p.forwardRequests(ss, up, cancel)
	}
	// The driver's response headers go out before anything else. Header
	// is nil only for the driver's own trailers-only answer; a real header
	// block always holds content-type, so a driver answer of headers then
	// a status stays two blocks here (TestHeadersThenStatusKept).
	if h, _ := up.Header(); len(h) > 0 {
		if err := ss.SendHeader(h); err != nil {
			return err
		}
	}
	var rerr error
	switch method {
	case driverwire.MethodWatchSandboxes:
		connID := uint64(0)
		if pr, ok := peer.FromContext(ss.Context()); ok {
			if a, ok := pr.Addr.(connAddr); ok {
				connID = uint64(a)
			}
		}
		rerr = p.watch(ctx, ss, up, connID)
	default:
		rerr = p.relay(ss, up, method)
	}
	if up.ended.Load() {
		// gRPC's Trailer may be read only once the stream has ended;
		// when the gateway side ended first there is no trailer to pass.
		ss.SetTrailer(up.Trailer())
	}
	p.metrics.rpcs.WithLabelValues(rpcLabel(method), codeLabel(rerr)).Inc()
	if method != driverwire.MethodWatchSandboxes {
		p.metrics.rpcSeconds.WithLabelValues(rpcLabel(method)).Observe(time.Since(start).Seconds())
	}
	return rerr
}

// endedStream notes when RecvMsg has returned an error (the driver's
// stream has ended), after which its Trailer may be read.
type endedStream struct {
	grpc.ClientStream
	ended atomic.Bool
}

func (s *endedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.ended.Store(true)
	}
	return err
}

// errNoRequest: a unary call half-closed without a request.
var errNoRequest = errors.New("no request")

// forwardRequests copies the gateway's requests to the driver, then the
// half-close; a broken gateway side cancels the driver call.
func (p *Proxy) forwardRequests(ss grpc.ServerStream, up grpc.ClientStream, cancel context.CancelFunc) {
	for {
		var f frame
		if err := ss.RecvMsg(&f); err != nil {
			if errors.Is(err, io.EOF) {
				_ = up.CloseSend()
			} else {
				cancel()
			}
			return
		}
		if err := up.SendMsg(&f); err != nil {
			return // the driver's status arrives on RecvMsg
		}
	}
}

// unaryRPCs are the layout's unary methods: they take the short path (one
// Invoke, no stream machinery). Every other method, known or not, is
// forwarded as a bidirectional stream, which carries unary and streaming
// calls alike.
var unaryRPCs = map[string]bool{}

func init() {
	for name := range knownRPCs {
		if name != "WatchSandboxes" {
			unaryRPCs["/"+driverwire.Service+"/"+name] = true
		}
	}
}

// unary forwards one call of a known unary method.
func (p *Proxy) unary(ctx context.Context, ss grpc.ServerStream, method string, ct grpc.CallOption) error {
	var req frame
	if err := ss.RecvMsg(&req); err != nil {
		if errors.Is(err, io.EOF) {
			return errNoRequest
		}
		return err
	}
	var resp frame
	var hdr, trl metadata.MD
	err := p.driver.Invoke(ctx, method, &req, &resp, grpc.Header(&hdr), grpc.Trailer(&trl), ct)
	if len(hdr) > 0 {
		// Set, not sent: gRPC writes them with the answer or the status,
		// in the same flush (one write to the gateway instead of two).
		if herr := ss.SetHeader(hdr); herr != nil {
			return herr
		}
	}
	ss.SetTrailer(trl)
	if err != nil {
		// With headers set (a driver answer that had a header block), gRPC
		// writes them as a block of their own before the status.
		return err
	}
	p.editResponse(method, &resp)
	return ss.SendMsg(&resp)
}

// editResponse applies the blocker patches to a GetSandbox or
// ListSandboxes answer; any other message is left as received.
func (p *Proxy) editResponse(method string, f *frame) {
	switch method {
	case driverwire.MethodGetSandbox:
		if p.hub.anyBlocked() {
			f.b = p.edit(f.bytes(), driverwire.PatchGetSandboxResponse)
		}
	case driverwire.MethodListSandboxes:
		if p.hub.anyBlocked() {
			f.b = p.edit(f.bytes(), driverwire.PatchListSandboxesResponse)
		}
	}
}

// relay copies driver responses to the gateway, editing Get/List answers.
func (p *Proxy) relay(ss grpc.ServerStream, up grpc.ClientStream, method string) error {
	for {
		var f frame
		if err := up.RecvMsg(&f); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		p.editResponse(method, &f)
		if err := ss.SendMsg(&f); err != nil {
			return err
		}
	}
}

// edit applies the active blocker patches; a message driverwire cannot
// parse is forwarded unchanged (fail-open), counted and logged.
func (p *Proxy) edit(b []byte, fn func([]byte, driverwire.PatchFunc) ([]byte, error)) []byte {
	if !p.hub.anyBlocked() {
		return b
	}
	nb, err := fn(b, p.hub.patchFor)
	if err != nil {
		p.metrics.malformed.Inc()
		p.log.Warn("driver message not edited: cannot parse it; forwarded unchanged", "err", err)
		return b
	}
	return nb
}

var knownRPCs = map[string]bool{
	"GetCapabilities": true, "GetGatewayListenerRequirements": true, "ValidateSandboxCreate": true,
	"GetSandbox": true, "ListSandboxes": true, "CreateSandbox": true, "StopSandbox": true,
	"StartSandbox": true, "DeleteSandbox": true, "WatchSandboxes": true, "EnsureWorkspace": true,
	"DeleteWorkspace": true,
}

// rpcLabel keeps the metric label set fixed: methods this build does not
// know are "other".
func rpcLabel(method string) string {
	const prefix = "/" + driverwire.Service + "/"
	if len(method) > len(prefix) && method[:len(prefix)] == prefix && knownRPCs[method[len(prefix):]] {
		return method[len(prefix):]
	}
	return "other"
}
