package gatewaytest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Service and method names of the compute driver protocol.
const (
	Service         = "openshell.compute.v1.ComputeDriver"
	Prefix          = "/" + Service + "/"
	MethodWatch     = Prefix + "WatchSandboxes"
	MethodGet       = Prefix + "GetSandbox"
	MethodList      = Prefix + "ListSandboxes"
	MethodCaps      = Prefix + "GetCapabilities"
	MethodStop      = Prefix + "StopSandbox"
	MethodUnknown   = Prefix + "DescribeSandboxFuture" // an RPC no layout defines
	MethodUnknownSv = "/openshell.compute.v2.ComputeDriverNext/Chat"
)

// Methods lists every RPC of the pinned layout.
var Methods = []string{"GetCapabilities", "GetGatewayListenerRequirements", "ValidateSandboxCreate",
	"GetSandbox", "ListSandboxes", "CreateSandbox", "StopSandbox", "StartSandbox", "DeleteSandbox",
	"WatchSandboxes", "EnsureWorkspace", "DeleteWorkspace"}

// Driver is a compute driver for tests: it serves the protocol on a Unix
// socket from an in-memory sandbox list, the way openshell-driver-kubernetes
// behaves where the proxy can tell: Ready=False conditions it rewrites
// itself, its own "kubernetes" platform events, unknown fields at every
// level, response headers and trailers, error statuses with details, and
// any method (unknown ones are echoed). It is safe for concurrent use.
type Driver struct {
	Path string

	mu        sync.Mutex
	srv       *grpc.Server
	sandboxes map[string]Sandbox
	order     []string
	watchers  map[chan []byte]struct{}
	lastMD    map[string]metadata.MD
	stopped   chan struct{}
	opts      []grpc.ServerOption
	hook      Hook
}

// Hook sees every call before the driver does (StartDriverHook): it
// answers the call itself (handled true, its error is the call's status)
// or lets the driver answer (handled false; it may have slept first, to
// play a slow driver, but must not have read or sent anything).
type Hook func(method string, ss grpc.ServerStream) (handled bool, err error)

// rawCodec is the test parts' pass-through codec.
type rawCodec struct{}

// Bytes is one raw message.
type Bytes struct{ B []byte }

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) {
	return v.(*Bytes).B, nil
}
func (rawCodec) Unmarshal(b []byte, v any) error {
	v.(*Bytes).B = append([]byte(nil), b...)
	return nil
}

// StartDriver listens on path (its directory is created 0700) and serves
// until Stop. opts are added to the gRPC server's (a benchmark uses them to
// play a driver with other HTTP/2 settings).
func StartDriver(path string, opts ...grpc.ServerOption) (*Driver, error) {
	return StartDriverHook(path, nil, opts...)
}

// StartDriverHook is StartDriver with a Hook in front of the driver's own
// answers (the relay soak scripts its calls through it).
func StartDriverHook(path string, hook Hook, opts ...grpc.ServerOption) (*Driver, error) {
	d := &Driver{Path: path, sandboxes: map[string]Sandbox{}, watchers: map[chan []byte]struct{}{},
		lastMD: map[string]metadata.MD{}, opts: opts, hook: hook}
	return d, d.Start()
}

// Start (re)starts serving; the sandboxes are kept, as a restarted driver
// relists them from Kubernetes.
func (d *Driver) Start() error {
	if err := os.MkdirAll(filepath.Dir(d.Path), 0o700); err != nil {
		return err
	}
	_ = os.Remove(d.Path)
	l, err := net.Listen("unix", d.Path)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(d.handle)}, d.opts...)...)
	d.mu.Lock()
	d.srv = srv
	d.stopped = make(chan struct{})
	d.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
	return nil
}

// Stop ends every stream and closes the socket (a driver that died).
func (d *Driver) Stop() {
	d.mu.Lock()
	srv, stopped := d.srv, d.stopped
	d.srv = nil
	d.mu.Unlock()
	if srv != nil {
		close(stopped)
		srv.Stop()
	}
}

// Put adds or replaces a sandbox and sends its snapshot to every watcher.
func (d *Driver) Put(s Sandbox) {
	d.mu.Lock()
	if _, ok := d.sandboxes[s.ID]; !ok {
		d.order = append(d.order, s.ID)
	}
	d.sandboxes[s.ID] = s
	d.mu.Unlock()
	d.broadcast(EncodeWatchSandbox(s))
}

// Delete removes a sandbox and tells every watcher.
func (d *Driver) Delete(id string) {
	d.mu.Lock()
	delete(d.sandboxes, id)
	for i, x := range d.order {
		if x == id {
			d.order = append(d.order[:i], d.order[i+1:]...)
			break
		}
	}
	d.mu.Unlock()
	d.broadcast(EncodeWatchDeleted(id))
}

// Platform sends a platform event of the driver's own to every watcher
// (shared mode: source "kubernetes", the driver's progress keys).
func (d *Driver) Platform(id string, pe PlatformEvent) { d.broadcast(EncodeWatchPlatform(id, pe)) }

// Watchers is the number of open WatchSandboxes streams.
func (d *Driver) Watchers() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.watchers)
}

// LastMetadata is the request metadata of the last call of method.
func (d *Driver) LastMetadata(method string) metadata.MD {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastMD[method].Copy()
}

// ClearMetadata forgets the request metadata of every call so far.
func (d *Driver) ClearMetadata() {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.lastMD)
}

func (d *Driver) broadcast(b []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for ch := range d.watchers {
		select {
		case ch <- b:
		default: // a stuck watcher; tests keep reading
		}
	}
}

func (d *Driver) handle(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	if d.hook != nil {
		if handled, err := d.hook(method, ss); handled {
			return err
		}
	}
	ctx := ss.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	d.mu.Lock()
	d.lastMD[method] = md.Copy()
	stopped := d.stopped
	d.mu.Unlock()

	hdr := metadata.Pairs("x-driver-method", method)
	for k, vs := range md {
		if strings.HasPrefix(k, ":") || k == "content-type" || k == "user-agent" {
			continue
		}
		hdr.Append("x-echo-"+k, vs...)
	}
	if _, ok := ctx.Deadline(); ok {
		hdr.Set("x-driver-deadline", "set")
	} else {
		hdr.Set("x-driver-deadline", "none")
	}
	ss.SetTrailer(metadata.Pairs("x-driver-trailer", "t:"+method, "x-driver-trailer-bin", string([]byte{0, 1, 2, 255})))

	switch method {
	case MethodWatch:
		var req Bytes
		if err := ss.RecvMsg(&req); err != nil {
			return err
		}
		if err := ss.SendHeader(hdr); err != nil {
			return err
		}
		ch := make(chan []byte, 4096)
		d.mu.Lock()
		snaps := make([][]byte, 0, len(d.order))
		for _, id := range d.order {
			snaps = append(snaps, EncodeWatchSandbox(d.sandboxes[id]))
		}
		d.watchers[ch] = struct{}{}
		d.mu.Unlock()
		defer func() {
			d.mu.Lock()
			delete(d.watchers, ch)
			d.mu.Unlock()
		}()
		for _, s := range snaps {
			if err := ss.SendMsg(&Bytes{s}); err != nil {
				return err
			}
		}
		for {
			select {
			case b := <-ch:
				if err := ss.SendMsg(&Bytes{b}); err != nil {
					return err
				}
			case <-ctx.Done():
				return ctx.Err()
			case <-stopped:
				return status.Error(codes.Unavailable, "driver stopping")
			}
		}
	case MethodGet, MethodList, MethodCaps, MethodStop:
		var req Bytes
		if err := ss.RecvMsg(&req); err != nil {
			return err
		}
		_ = ss.SetHeader(hdr)
		resp, err := d.unary(method, req.B)
		if err != nil {
			return err
		}
		return ss.SendMsg(&Bytes{resp})
	}
	// Every other method, known or not, unary or streaming: echo each
	// request with a field appended.
	if err := ss.SendHeader(hdr); err != nil {
		return err
	}
	for {
		var req Bytes
		err := ss.RecvMsg(&req)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp := unknown(append([]byte(nil), req.B...), 906, "echo:"+method)
		if err := ss.SendMsg(&Bytes{resp}); err != nil {
			return err
		}
	}
}

func (d *Driver) unary(method string, req []byte) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch method {
	case MethodCaps:
		b := str(nil, 1, "kubernetes")
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
		return unknown(b, 907, "caps-unknown"), nil
	case MethodGet:
		fs, err := split(req)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "bad request: %v", err)
		}
		var id, name string
		for _, f := range fs {
			switch f.num {
			case 1:
				id = string(f.v)
			case 2:
				name = string(f.v)
			}
		}
		for _, x := range d.order {
			s := d.sandboxes[x]
			if (id != "" && s.ID == id) || (id == "" && name != "" && s.Name == name) {
				return unknown(msg(nil, 1, EncodeSandbox(s)), 908, "get-unknown"), nil
			}
		}
		st, _ := status.New(codes.NotFound, fmt.Sprintf("sandbox %q not found", id+name)).
			WithDetails(wrapperspb.String("detail: no such sandbox " + id + name))
		return nil, st.Err()
	case MethodList:
		var b []byte
		for _, x := range d.order {
			b = msg(b, 1, EncodeSandbox(d.sandboxes[x]))
		}
		return unknown(b, 909, "list-unknown"), nil
	case MethodStop:
		st, _ := status.New(codes.FailedPrecondition, "sandbox is deleting").
			WithDetails(wrapperspb.String("precondition detail"))
		return nil, st.Err()
	}
	return nil, status.Error(codes.Unimplemented, method)
}

// WaitWatchers waits until n WatchSandboxes streams are open.
func (d *Driver) WaitWatchers(ctx context.Context, n int) error {
	for d.Watchers() != n {
		select {
		case <-ctx.Done():
			return fmt.Errorf("driver has %d watchers, want %d: %w", d.Watchers(), n, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}
