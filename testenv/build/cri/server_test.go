package cri

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == InitPart { // a process container's start
		os.Exit(ContainerInit(os.Args[2:]))
	}
	if len(os.Args) > 2 && os.Args[1] == servePart { // a process container of TestProcessNetwork
		os.Exit(serveHello(os.Args[2]))
	}
	goleak.VerifyTestMain(m)
}

type harness struct {
	srv     *Server
	dir     string
	cfgPath string
	rt      runtimeapi.RuntimeServiceClient
	img     runtimeapi.ImageServiceClient
}

// start serves a Server with config on a unix socket and dials it as the
// kubelet does (gRPC over unix).
func start(t *testing.T, config string) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{dir: dir, cfgPath: filepath.Join(dir, "runtime.json")}
	h.write(t, config)
	s, err := New(h.cfgPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "cri.sock")
	if err := s.Serve(sock); err != nil {
		t.Fatal(err)
	}
	h.srv = s
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); s.Stop() })
	h.rt, h.img = runtimeapi.NewRuntimeServiceClient(conn), runtimeapi.NewImageServiceClient(conn)
	return h
}

func (h *harness) write(t *testing.T, config string) {
	t.Helper()
	if err := os.WriteFile(h.cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (h *harness) pull(image string) error {
	_, err := h.img.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	return err
}

// container creates a sandbox for pod ns/pod and starts container name in
// it, as the kubelet does: it pulls the image and creates the container
// with the image id the pull returned and the reference the pod spec
// wrote.
func (h *harness) container(t *testing.T, ns, pod, name, image string) string {
	t.Helper()
	ctx := context.Background()
	pulled, err := h.img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := h.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod, Namespace: ns, Uid: "u-" + pod}}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := h.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name},
			Image: &runtimeapi.ImageSpec{Image: pulled.ImageRef, UserSpecifiedImage: image}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		t.Fatal(err)
	}
	return c.ContainerId
}

func (h *harness) status(t *testing.T, id string) *runtimeapi.ContainerStatus {
	t.Helper()
	r, err := h.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status
}

func TestPull(t *testing.T) {
	h := start(t, `{"images": [
		{"image": "docker.io/library/busybox:0.0.0-does-not-exist", "pull": "not_found"},
		{"image": "ghcr.io/acme/slow:1", "delay": "300ms"},
		{"image": "quay.io/acme/private:1", "pull": "unauthorized"}]}`)
	cases := []struct {
		image    string
		code     codes.Code
		contains string
		minDelay time.Duration
	}{
		// The rule names the normalised reference; the pod spec the short one.
		{"busybox:0.0.0-does-not-exist", codes.NotFound, "docker.io/library/busybox:0.0.0-does-not-exist: not found", 0},
		{"quay.io/acme/private:1", codes.Unknown, ": 401 Unauthorized", 0},
		{"ghcr.io/acme/slow:1", codes.OK, "", 300 * time.Millisecond},
		{"nginx:1.25", codes.OK, "", 0}, // no rule: the pull succeeds
	}
	for _, tc := range cases {
		t.Run(tc.image, func(t *testing.T) {
			begin := time.Now()
			err := h.pull(tc.image)
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.contains) {
				t.Fatalf("pull: %v, want code %s containing %q", err, tc.code, tc.contains)
			}
			if took := time.Since(begin); took < tc.minDelay {
				t.Errorf("answered after %v, want at least %v", took, tc.minDelay)
			}
			is, err := h.img.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: tc.image}})
			if err != nil {
				t.Fatal(err)
			}
			if present := is.Image != nil; present != (tc.code == codes.OK) {
				t.Errorf("image present after pull: %v", present)
			}
		})
	}
}

// TestConfigReload: a changed file changes the next pull (a registry that
// comes back), and a broken file keeps the last good behaviour.
func TestConfigReload(t *testing.T) {
	h := start(t, `{"images": [{"image": "ghcr.io/acme/app:1", "pull": "connection_refused"}]}`)
	if err := h.pull("ghcr.io/acme/app:1"); err == nil || !strings.Contains(err.Error(), "connect: connection refused") {
		t.Fatalf("first pull: %v", err)
	}
	h.write(t, `{"runtime": "cri-o", "images": [{"image": "ghcr.io/acme/app:1", "pull": "rate_limited"}]}`)
	if err := h.pull("ghcr.io/acme/app:1"); err == nil || !strings.Contains(err.Error(), "reading manifest 1 in ghcr.io/acme/app: too many requests") {
		t.Fatalf("after reload: %v", err)
	}
	h.write(t, `{"images": [{"image": "ghcr.io/acme/app:1", "pull": "no-such-outcome"}]}`)
	if err := h.pull("ghcr.io/acme/app:1"); err == nil || !strings.Contains(err.Error(), "too many requests") {
		t.Fatalf("after a broken file: %v (want the last good behaviour)", err)
	}
}

func TestContainerExits(t *testing.T) {
	h := start(t, `{"containers": [
		{"container": "crash", "exitAfter": "50ms", "exitCode": 2},
		{"pod": "oom-*", "exitAfter": "50ms", "oomKilled": true},
		{"container": "done", "exitAfter": "50ms"},
		{"image": "docker.io/library/busybox:exits-4", "exitAfter": "50ms", "exitCode": 4},
		{"container": "probed", "exec": [{"command": ["cat", "/tmp/ready"], "exitCode": 1, "stderr": "cat: can't open '/tmp/ready': No such file or directory"}]}]}`)
	cases := []struct {
		pod, name, image string
		running          bool
		code             int32
		reason           string
	}{
		{"p1", "crash", "busybox:1.36", false, 2, "Error"},
		{"oom-7", "main", "busybox:1.36", false, 137, "OOMKilled"},
		{"p2", "done", "busybox:1.36", false, 0, "Completed"},
		{"p3", "probed", "busybox:1.36", true, 0, ""},
		{"p4", "other", "busybox:1.36", true, 0, ""},
		// By image: the kubelet names the image by the id its pull
		// returned; the rule names the pod spec's reference (normalised).
		{"p5", "by-image", "busybox:exits-4", false, 4, "Error"},
	}
	ids := map[string]string{}
	for _, tc := range cases {
		ids[tc.name] = h.container(t, "ns", tc.pod, tc.name, tc.image)
	}
	time.Sleep(300 * time.Millisecond)
	for _, tc := range cases {
		st := h.status(t, ids[tc.name])
		running := st.State == runtimeapi.ContainerState_CONTAINER_RUNNING
		if running != tc.running || st.ExitCode != tc.code || st.Reason != tc.reason {
			t.Errorf("%s: state %s exit %d reason %q, want running=%v exit %d reason %q", tc.name, st.State, st.ExitCode, st.Reason, tc.running, tc.code, tc.reason)
		}
	}
	ex, err := h.rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: ids["probed"], Cmd: []string{"cat", "/tmp/ready"}})
	if err != nil || ex.ExitCode != 1 || !strings.Contains(string(ex.Stderr), "No such file") {
		t.Errorf("exec probe: %v %v", ex, err)
	}
	ex, err = h.rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: ids["probed"], Cmd: []string{"true"}})
	if err != nil || ex.ExitCode != 0 {
		t.Errorf("unmatched exec: %v %v", ex, err)
	}
	// The probe passes once the config says so, in the running container
	// (a user's fix: the file it reads now exists).
	h.write(t, `{"containers": [{"container": "probed", "exec": [{"command": ["cat", "/tmp/ready"], "stdout": "ok"}]}]}`)
	ex, err = h.rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: ids["probed"], Cmd: []string{"cat", "/tmp/ready"}})
	if err != nil || ex.ExitCode != 0 || string(ex.Stdout) != "ok" {
		t.Errorf("exec probe after the config changed: %v %v", ex, err)
	}
	if _, err := h.rt.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: ids["other"]}); err != nil {
		t.Fatal(err)
	}
	if st := h.status(t, ids["other"]); st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 137 {
		t.Errorf("stopped container: %s exit %d", st.State, st.ExitCode)
	}
}

func TestParseConfigErrors(t *testing.T) {
	_, err := ParseConfig([]byte(`{"runtime": "docker", "images": [{"image": "", "pull": "gone"}],
		"containers": [{"oomKilled": true, "exec": [{}]}]}`))
	for _, want := range []string{`runtime: "docker"`, "images[0].image: required", `images[0].pull: "gone"`,
		"containers[0].oomKilled: needs exitAfter", "containers[0].exec[0].command: required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if _, err := ParseConfig([]byte(`{"imagez": []}`)); err == nil {
		t.Error("unknown field accepted")
	}
}
