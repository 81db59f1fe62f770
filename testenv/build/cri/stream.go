package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-streaming/pkg/streaming"
	remotecommand "k8s.io/cri-streaming/pkg/streaming/remotecommand"
)

// streamServer is the runtime's streaming endpoint (k8s.io/cri-streaming,
// the library containerd and CRI-O serve it with): the kubelet asks the
// CRI for a URL (PortForward), then proxies the client's SPDY or
// WebSocket stream to it. It listens on 127.0.0.1 only and has no
// authentication of its own: the kubelet hands out single-use tokens.
type streamServer struct {
	srv  streaming.Server
	http *http.Server
}

func startStreamServer(s *Server, wg *sync.WaitGroup, log *slog.Logger) (*streamServer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("streaming server: %w", err)
	}
	cfg := streaming.DefaultConfig
	cfg.Addr = l.Addr().String()
	cfg.BaseURL = &url.URL{Scheme: "http", Host: l.Addr().String()}
	srv, err := streaming.NewServer(cfg, streamRuntime{s})
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("streaming server: %w", err)
	}
	ss := &streamServer{srv: srv, http: &http.Server{Handler: srv}}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := ss.http.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("streaming server stopped", "err", err)
		}
	}()
	return ss, nil
}

func (ss *streamServer) stop() { _ = ss.http.Close() }

// PortForward returns the URL the kubelet proxies a port-forward to.
func (s *Server) PortForward(_ context.Context, req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	s.mu.Lock()
	sb, ok := s.sandboxes[req.GetPodSandboxId()]
	stream := s.stream
	s.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "failed to find sandbox %q: not found", req.GetPodSandboxId())
	}
	if sb.status.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, status.Errorf(codes.FailedPrecondition, "sandbox %q is not running", req.GetPodSandboxId())
	}
	if stream == nil {
		return nil, status.Error(codes.Unavailable, "streaming server not started")
	}
	return stream.srv.GetPortForward(req)
}

// streamRuntime carries out the streams. Only port-forward is served:
// exec and attach need a process the runtime controls a terminal of.
type streamRuntime struct{ s *Server }

func (streamRuntime) Exec(context.Context, string, []string, io.Reader, io.WriteCloser, io.WriteCloser, bool, <-chan remotecommand.TerminalSize) error {
	return errors.New("eventpipe testenv CRI: exec is not supported")
}

func (streamRuntime) Attach(context.Context, string, io.Reader, io.WriteCloser, io.WriteCloser, bool, <-chan remotecommand.TerminalSize) error {
	return errors.New("eventpipe testenv CRI: attach is not supported")
}

// PortForward connects the stream to the port on 127.0.0.1 in the
// network namespace of the sandbox's running process container, as
// containerd does in the pod's namespace.
func (r streamRuntime) PortForward(ctx context.Context, podSandboxID string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	pid := 0
	r.s.mu.Lock()
	for _, c := range r.s.containers {
		if c.sandboxID == podSandboxID && c.proc != nil && c.status.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			pid = c.proc.cmd.Process.Pid
		}
	}
	r.s.mu.Unlock()
	if pid == 0 {
		return fmt.Errorf("sandbox %s has no running process to forward port %d to", podSandboxID, port)
	}
	conn, err := netDial(ctx, pid, net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("port-forward to sandbox %s port %d: %w", podSandboxID, port, err)
	}
	defer conn.Close()
	// Until the process's side ends (the client's end half-closes it), or
	// the kubelet ends the stream; the deferred closes end both copies.
	replied := make(chan struct{})
	go func() {
		_, _ = io.Copy(conn, stream)
		_ = conn.(*net.TCPConn).CloseWrite()
	}()
	go func() { _, _ = io.Copy(stream, conn); close(replied) }()
	select {
	case <-replied:
	case <-ctx.Done():
	}
	return nil
}
