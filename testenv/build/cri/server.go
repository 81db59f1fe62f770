package cri

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Versions the runtime reports (the node's containerRuntimeVersion).
var runtimeVersions = map[string]string{Containerd: "v2.1.4", CRIO: "1.36.0"}

// imageSize is what every pulled image weighs (busybox:1.36's size).
const imageSize = 2155861

// Server is the runtime and image service of one hollow node.
type Server struct {
	log *slog.Logger

	mu         sync.Mutex
	cfg        *configFile
	sandboxes  map[string]*sandbox
	containers map[string]*container
	images     map[string]*runtimeapi.Image // by id
	nextIP     int
	stopped    bool
	timers     map[string]*time.Timer // container id -> its exit

	grpc   *grpc.Server
	wg     sync.WaitGroup
	procs  sync.WaitGroup // container processes' reapers
	stream *streamServer  // port-forward (Serve starts it)

	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer
}

type sandbox struct {
	status *runtimeapi.PodSandboxStatus
	logDir string
	ports  []*runtimeapi.PortMapping // the pod's declared ports
}

type container struct {
	status    *runtimeapi.ContainerStatus
	config    *runtimeapi.ContainerConfig
	sandboxID string
	rule      ContainerRule
	hasRule   bool
	run       string   // a ProcessRule's executable: a real process
	proc      *process // that process, once started
}

// New returns a Server reading its behaviour from configPath. The file is
// read now (an invalid one is an error) and again whenever it changes.
func New(configPath string, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cf, err := loadConfigFile(configPath)
	if err != nil {
		return nil, err
	}
	s := &Server{log: log, cfg: cf, sandboxes: map[string]*sandbox{}, containers: map[string]*container{},
		images: map[string]*runtimeapi.Image{}, timers: map[string]*time.Timer{}}
	s.grpc = grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(s.grpc, s)
	runtimeapi.RegisterImageServiceServer(s.grpc, s)
	return s, nil
}

// Serve listens on the unix socket path (removing a stale one) and serves
// until Stop. It returns once the listener is up; errors of the serving
// loop are logged.
func (s *Server) Serve(socketPath string) error {
	if err := os.Remove(socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	l, err := net.Listen("unix", socketPath)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socketPath, err)
	}
	stream, err := startStreamServer(s, &s.wg, s.log)
	if err != nil {
		l.Close()
		return err
	}
	s.mu.Lock()
	s.stream = stream
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.grpc.Serve(l); err != nil {
			s.log.Error("CRI server stopped", "err", err)
		}
	}()
	return nil
}

// Stop ends the gRPC and streaming servers, every pending container exit
// and every container process (SIGKILL), and returns once they are
// reaped.
func (s *Server) Stop() {
	s.mu.Lock()
	s.stopped = true
	for id, t := range s.timers {
		t.Stop()
		delete(s.timers, id)
	}
	var procs []*process
	for _, c := range s.containers {
		if c.proc != nil {
			procs = append(procs, c.proc)
		}
	}
	stream := s.stream
	s.mu.Unlock()
	for _, p := range procs {
		p.stop(0)
	}
	s.procs.Wait()
	s.grpc.Stop()
	if stream != nil {
		stream.stop()
	}
	s.wg.Wait()
}

// config returns the current behaviour (read again if the file changed).
// Callers hold s.mu.
func (s *Server) config() *Config {
	if err := s.cfg.reload(); err != nil {
		s.log.Error("runtime config not reloaded; keeping the last good one", "err", err)
	}
	return &s.cfg.cfg
}

func newID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ---- runtime service ----

// Version reports the runtime the node imitates.
func (s *Server) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	s.mu.Lock()
	name := s.config().runtimeName()
	s.mu.Unlock()
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: name,
		RuntimeVersion: runtimeVersions[name], RuntimeApiVersion: "v1"}, nil
}

// Status: runtime and network ready.
func (s *Server) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}}, nil
}

// RuntimeConfig: the cgroup driver the kubelet should use.
func (s *Server) RuntimeConfig(context.Context, *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	return &runtimeapi.RuntimeConfigResponse{Linux: &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS}}, nil
}

// UpdateRuntimeConfig accepts the pod CIDR.
func (s *Server) UpdateRuntimeConfig(context.Context, *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
}

// RunPodSandbox creates a ready sandbox with an address of its own.
func (s *Server) RunPodSandbox(_ context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	cfg := req.GetConfig()
	if cfg.GetMetadata() == nil {
		return nil, status.Error(codes.InvalidArgument, "sandbox config metadata is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextIP++
	id := newID()
	s.sandboxes[id] = &sandbox{logDir: cfg.GetLogDirectory(), ports: cfg.GetPortMappings(), status: &runtimeapi.PodSandboxStatus{
		Id:        id,
		Metadata:  cfg.GetMetadata(),
		State:     runtimeapi.PodSandboxState_SANDBOX_READY,
		CreatedAt: time.Now().UnixNano(),
		Network:   &runtimeapi.PodSandboxNetworkStatus{Ip: fmt.Sprintf("10.88.%d.%d", s.nextIP/250, s.nextIP%250+2)},
		// The kubelet compares the namespace options it asked for with
		// these; a difference makes it recreate the sandbox forever.
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{
			Options: cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()}},
		Labels:         cfg.GetLabels(),
		Annotations:    cfg.GetAnnotations(),
		RuntimeHandler: req.GetRuntimeHandler(),
	}}
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

// StopPodSandbox stops the sandbox and every container in it.
func (s *Server) StopPodSandbox(_ context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	s.mu.Lock()
	sb, ok := s.sandboxes[req.GetPodSandboxId()]
	if !ok {
		s.mu.Unlock()
		// Both runtimes answer a stop of an unknown sandbox with success.
		return &runtimeapi.StopPodSandboxResponse{}, nil
	}
	var procs []*process
	for id, c := range s.containers {
		if c.sandboxID == sb.status.Id && c.status.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			if c.proc != nil {
				procs = append(procs, c.proc)
				continue
			}
			s.exitLocked(id, 137, "Error")
		}
	}
	sb.status.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	s.mu.Unlock()
	// The kubelet stopped the containers with their grace period first;
	// what still runs now is killed, as a runtime kills the pod's cgroup.
	for _, p := range procs {
		p.stop(0)
	}
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

// RemovePodSandbox removes the sandbox and its containers.
func (s *Server) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	if _, err := s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: req.GetPodSandboxId()}); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, c := range s.containers {
		if c.sandboxID == req.GetPodSandboxId() {
			s.removeContainerLocked(id)
		}
	}
	delete(s.sandboxes, req.GetPodSandboxId())
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

// PodSandboxStatus returns one sandbox.
func (s *Server) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[req.GetPodSandboxId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find sandbox: not found")
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: proto.Clone(sb.status).(*runtimeapi.PodSandboxStatus)}, nil
}

// ListPodSandbox lists sandboxes matching the filter.
func (s *Server) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f := req.GetFilter()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*runtimeapi.PodSandbox
	for id, sb := range s.sandboxes {
		if f.GetId() != "" && f.GetId() != id ||
			f.GetState() != nil && f.GetState().GetState() != sb.status.State ||
			!labelsMatch(f.GetLabelSelector(), sb.status.Labels) {
			continue
		}
		out = append(out, &runtimeapi.PodSandbox{Id: id, Metadata: sb.status.Metadata, State: sb.status.State,
			CreatedAt: sb.status.CreatedAt, Labels: sb.status.Labels, Annotations: sb.status.Annotations,
			RuntimeHandler: sb.status.RuntimeHandler})
	}
	return &runtimeapi.ListPodSandboxResponse{Items: out}, nil
}

func labelsMatch(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// CreateContainer creates a container whose behaviour is fixed now, from
// the first matching ContainerRule.
func (s *Server) CreateContainer(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	cfg := req.GetConfig()
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[req.GetPodSandboxId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "failed to get sandbox %q: not found", req.GetPodSandboxId())
	}
	id := newID()
	meta := sb.status.Metadata
	image := specImage(cfg)
	rule, has := s.config().containerRule(meta.GetNamespace(), meta.GetName(), cfg.GetMetadata().GetName(), image)
	run := s.config().processRun(meta.GetNamespace(), meta.GetName(), cfg.GetMetadata().GetName(), image)
	var logPath string
	if sb.logDir != "" && cfg.GetLogPath() != "" {
		logPath = filepath.Join(sb.logDir, cfg.GetLogPath())
		// The runtime, not the kubelet, creates the log file; the kubelet
		// reads it for FallbackToLogsOnError and rotates it.
		if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err == nil {
			if f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640); err == nil {
				f.Close()
			}
		}
	}
	s.containers[id] = &container{sandboxID: sb.status.Id, config: cfg, run: run, rule: rule, hasRule: has, status: &runtimeapi.ContainerStatus{
		Id:          id,
		Metadata:    cfg.GetMetadata(),
		Image:       cfg.GetImage(),
		ImageRef:    s.imageIDLocked(cfg.GetImage().GetImage()),
		CreatedAt:   time.Now().UnixNano(),
		State:       runtimeapi.ContainerState_CONTAINER_CREATED,
		Labels:      cfg.GetLabels(),
		Annotations: cfg.GetAnnotations(),
		LogPath:     logPath,
		Mounts:      cfg.GetMounts(),
	}}
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

// specImage is the image a container's rules name: the kubelet names the
// image by the id its pull returned; the reference the pod spec wrote comes
// beside it.
func specImage(cfg *runtimeapi.ContainerConfig) string {
	if image := cfg.GetImage().GetUserSpecifiedImage(); image != "" {
		return image
	}
	return cfg.GetImage().GetImage()
}

// StartContainer runs the container and, when its rule says so, schedules
// its process's exit.
func (s *Server) StartContainer(_ context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.containers[req.GetContainerId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", req.GetContainerId())
	}
	if c.status.State != runtimeapi.ContainerState_CONTAINER_CREATED {
		return nil, status.Errorf(codes.Unknown, "container %q is in %s state", c.status.Id, c.status.State)
	}
	if c.run != "" {
		if s.stopped {
			return nil, status.Error(codes.Unavailable, "runtime is stopping")
		}
		// The pod's address becomes one on the host's loopback
		// (127.88.x.y for 10.88.x.y), where proxyPorts serves its ports.
		if sb := s.sandboxes[c.sandboxID]; sb != nil {
			sb.status.Network = &runtimeapi.PodSandboxNetworkStatus{Ip: strings.Replace(sb.status.Network.GetIp(), "10.88.", "127.88.", 1)}
		}
		if err := s.startProcessLocked(c); err != nil {
			return nil, status.Errorf(codes.Unknown, "failed to create containerd task: %v", err)
		}
	}
	c.status.State = runtimeapi.ContainerState_CONTAINER_RUNNING
	c.status.StartedAt = time.Now().UnixNano()
	if c.run == "" && c.hasRule && c.rule.ExitAfter.Duration > 0 && !s.stopped {
		id, code, reason := c.status.Id, c.rule.ExitCode, "Error"
		switch {
		case c.rule.OOMKilled:
			code, reason = 137, "OOMKilled"
		case code == 0:
			reason = "Completed"
		}
		s.timers[id] = time.AfterFunc(c.rule.ExitAfter.Duration, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(s.timers, id)
			s.exitLocked(id, code, reason)
		})
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

// exitLocked ends a running container's process.
func (s *Server) exitLocked(id string, code int32, reason string) {
	c, ok := s.containers[id]
	if !ok || c.status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return
	}
	if t := s.timers[id]; t != nil {
		t.Stop()
		delete(s.timers, id)
	}
	c.status.State = runtimeapi.ContainerState_CONTAINER_EXITED
	c.status.FinishedAt = time.Now().UnixNano()
	c.status.ExitCode = code
	c.status.Reason = reason
}

// StopContainer stops a running container. A real process (a rule's Run)
// gets SIGTERM, then SIGKILL when the request's timeout (the pod's grace
// period) passes, and ends with its own status. An imitated one is killed:
// exit code 137 (a shell or sleep as PID 1 ignores SIGTERM until the grace
// period ends), reason Error.
func (s *Server) StopContainer(_ context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	s.mu.Lock()
	c, ok := s.containers[req.GetContainerId()]
	if !ok {
		s.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", req.GetContainerId())
	}
	if p := c.proc; p != nil && c.status.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
		s.mu.Unlock()
		p.stop(time.Duration(req.GetTimeout()) * time.Second)
		return &runtimeapi.StopContainerResponse{}, nil
	}
	s.exitLocked(req.GetContainerId(), 137, "Error")
	s.mu.Unlock()
	return &runtimeapi.StopContainerResponse{}, nil
}

// RemoveContainer forgets a container (and its pending exit).
func (s *Server) RemoveContainer(_ context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeContainerLocked(req.GetContainerId())
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (s *Server) removeContainerLocked(id string) {
	if c := s.containers[id]; c != nil && c.proc != nil && c.status.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
		// Removing a running container kills it (its reaper still runs).
		_ = syscall.Kill(-c.proc.cmd.Process.Pid, syscall.SIGKILL)
	}
	if t := s.timers[id]; t != nil {
		t.Stop()
		delete(s.timers, id)
	}
	delete(s.containers, id)
}

// ListContainers lists containers matching the filter.
func (s *Server) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f := req.GetFilter()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*runtimeapi.Container
	for id, c := range s.containers {
		if f.GetId() != "" && f.GetId() != id ||
			f.GetPodSandboxId() != "" && f.GetPodSandboxId() != c.sandboxID ||
			f.GetState() != nil && f.GetState().GetState() != c.status.State ||
			!labelsMatch(f.GetLabelSelector(), c.status.Labels) {
			continue
		}
		out = append(out, &runtimeapi.Container{Id: id, PodSandboxId: c.sandboxID, Metadata: c.status.Metadata,
			Image: c.status.Image, ImageRef: c.status.ImageRef, State: c.status.State, CreatedAt: c.status.CreatedAt,
			Labels: c.status.Labels, Annotations: c.status.Annotations})
	}
	return &runtimeapi.ListContainersResponse{Containers: out}, nil
}

// ContainerStatus returns one container.
func (s *Server) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.containers[req.GetContainerId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", req.GetContainerId())
	}
	return &runtimeapi.ContainerStatusResponse{Status: proto.Clone(c.status).(*runtimeapi.ContainerStatus)}, nil
}

// UpdateContainerResources accepts any resources.
func (s *Server) UpdateContainerResources(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	return &runtimeapi.UpdateContainerResourcesResponse{}, nil
}

// ReopenContainerLog: the log file stays where it is.
func (s *Server) ReopenContainerLog(context.Context, *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	return &runtimeapi.ReopenContainerLogResponse{}, nil
}

// ExecSync answers a command run in a running container (exec probes)
// from the ExecRules of the container's rule in the current config (read
// again if it changed), so a probe's answer can change while the container
// runs, as a real program's does when the file it checks appears; how the
// container ends stays what its rule said when it was created. Other
// commands exit 0.
func (s *Server) ExecSync(_ context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.containers[req.GetContainerId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", req.GetContainerId())
	}
	if c.status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil, status.Errorf(codes.Unknown, "container %q is in %s state", c.status.Id, c.status.State)
	}
	rule := c.rule
	if sb, ok := s.sandboxes[c.sandboxID]; ok {
		meta := sb.status.Metadata
		rule, _ = s.config().containerRule(meta.GetNamespace(), meta.GetName(), c.config.GetMetadata().GetName(), specImage(c.config))
	}
	e, _ := rule.execRule(req.GetCmd())
	return &runtimeapi.ExecSyncResponse{Stdout: []byte(e.Stdout), Stderr: []byte(e.Stderr), ExitCode: e.ExitCode}, nil
}

// ListContainerStats: no process, no usage (the kubelet's stats come from
// its fake cAdvisor).
func (s *Server) ListContainerStats(context.Context, *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	return &runtimeapi.ListContainerStatsResponse{}, nil
}

// ListPodSandboxStats: as ListContainerStats.
func (s *Server) ListPodSandboxStats(context.Context, *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	return &runtimeapi.ListPodSandboxStatsResponse{}, nil
}

// ListMetricDescriptors: none.
func (s *Server) ListMetricDescriptors(context.Context, *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	return &runtimeapi.ListMetricDescriptorsResponse{}, nil
}

// ListPodSandboxMetrics: none.
func (s *Server) ListPodSandboxMetrics(context.Context, *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	return &runtimeapi.ListPodSandboxMetricsResponse{}, nil
}

// ---- image service ----

func imageID(normalized string) string {
	sum := sha256.Sum256([]byte(normalized))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// imageIDLocked returns the id of a pulled image by reference or id, "" if
// it is not on the node.
func (s *Server) imageIDLocked(image string) string {
	if img, ok := s.images[image]; ok {
		return img.Id
	}
	r, err := parseRef(image)
	if err != nil {
		return ""
	}
	if img, ok := s.images[imageID(r.normalized())]; ok {
		return img.Id
	}
	return ""
}

// ListImages lists pulled images.
func (s *Server) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*runtimeapi.Image, 0, len(s.images))
	for _, img := range s.images {
		out = append(out, proto.Clone(img).(*runtimeapi.Image))
	}
	return &runtimeapi.ListImagesResponse{Images: out}, nil
}

// ImageStatus returns a pulled image, or none (so the kubelet pulls it).
func (s *Server) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.imageIDLocked(req.GetImage().GetImage())
	if id == "" {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return &runtimeapi.ImageStatusResponse{Image: proto.Clone(s.images[id]).(*runtimeapi.Image)}, nil
}

// PullImage ends as the first matching ImageRule says, after its delay.
func (s *Server) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	image := req.GetImage().GetImage()
	s.mu.Lock()
	cfg := s.config()
	rule, _ := cfg.imageRule(image)
	runtime := cfg.runtimeName()
	s.mu.Unlock()
	if d := rule.Delay.Duration; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if rule.Pull != "" && rule.Pull != PullOK {
		err := pullError(runtime, image, rule)
		s.log.Info("pull failed as configured", "image", image, "outcome", rule.Pull)
		return nil, err
	}
	r, err := parseRef(image)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "eventpipe testenv CRI: %v", err)
	}
	id := imageID(r.normalized())
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[id]
	if !ok {
		img = &runtimeapi.Image{Id: id, Size: imageSize, Spec: &runtimeapi.ImageSpec{Image: id}}
		s.images[id] = img
	}
	if tagged := r.repo() + ":" + r.tag; r.tag != "" && !contains(img.RepoTags, tagged) {
		img.RepoTags = append(img.RepoTags, tagged)
	}
	digest := r.repo() + "@" + r.digest
	if r.digest == "" {
		digest = r.repo() + "@" + id
	}
	if !contains(img.RepoDigests, digest) {
		img.RepoDigests = append(img.RepoDigests, digest)
	}
	return &runtimeapi.PullImageResponse{ImageRef: id}, nil
}

// RemoveImage forgets an image.
func (s *Server) RemoveImage(_ context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id := s.imageIDLocked(req.GetImage().GetImage()); id != "" {
		delete(s.images, id)
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

// ImageFsInfo: an image filesystem holding the pulled images.
func (s *Server) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	s.mu.Lock()
	n := uint64(len(s.images))
	s.mu.Unlock()
	fs := &runtimeapi.FilesystemUsage{Timestamp: time.Now().UnixNano(),
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: "/var/lib/containerd"},
		UsedBytes:  &runtimeapi.UInt64Value{Value: n * imageSize},
		InodesUsed: &runtimeapi.UInt64Value{Value: n * 100}}
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{fs},
		ContainerFilesystems: []*runtimeapi.FilesystemUsage{fs}}, nil
}
