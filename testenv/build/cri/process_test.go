package cri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// runProcess creates and starts a container as the kubelet does, with a
// log directory, the given args and mounts; it returns the container id,
// its sandbox id and its log file.
func (h *harness) runProcess(t *testing.T, pod string, args []string, mounts []*runtimeapi.Mount) (string, string, string) {
	t.Helper()
	ctx := context.Background()
	logDir := filepath.Join(h.dir, "logs", pod)
	sb, err := h.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod, Namespace: "ns", Uid: "u-" + pod}, LogDirectory: logDir}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := h.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "main"},
			Image:   &runtimeapi.ImageSpec{Image: "sha256:x", UserSpecifiedImage: "example.com/shell:1"},
			Command: []string{"/entrypoint"}, Args: args, Mounts: mounts, LogPath: "main/0.log",
			Envs: []*runtimeapi.KeyValue{{Key: "GREETING", Value: []byte("hello from env")}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		t.Fatal(err)
	}
	return c.ContainerId, sb.PodSandboxId, filepath.Join(logDir, "main", "0.log")
}

func (h *harness) waitState(t *testing.T, id string, want runtimeapi.ContainerState) *runtimeapi.ContainerStatus {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st := h.status(t, id)
		if st.State == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s: state %s, want %s", id, st.State, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitFile(t *testing.T, path, want string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s lacks %q:\n%s", path, want, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestProcessContainer: a container whose rule names an executable runs
// as a real process: args and env as the kubelet sends them, the
// kubelet's mounts at their container paths (under a directory that does
// not exist on the host, which stays untouched), its output in the CRI
// log format; it exits with its own code, and StopContainer ends it with
// SIGTERM.
func TestProcessContainer(t *testing.T) {
	h := start(t, `{"processes": [{"image": "example.com/shell:*", "run": "/bin/sh"}]}`)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "token"), []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	const target = "/var/run/eventpipe-cri-test/secret"
	mounts := []*runtimeapi.Mount{{HostPath: src, ContainerPath: target, Readonly: true}}

	id, _, logPath := h.runProcess(t, "reads", []string{"-c", `echo "$GREETING"; cat ` + target + `/token; echo; echo oops >&2; exit 3`}, mounts)
	st := h.waitState(t, id, runtimeapi.ContainerState_CONTAINER_EXITED)
	if st.ExitCode != 3 || st.Reason != "Error" {
		t.Errorf("exit %d reason %q, want 3 Error", st.ExitCode, st.Reason)
	}
	log := waitFile(t, logPath, "oops")
	for _, want := range []string{" stdout F hello from env\n", " stdout F s3cret\n", " stderr F oops\n"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if _, err := os.Stat(filepath.Dir(target)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the mount point's parent was made on the host: %v", err)
	}

	id, _, logPath = h.runProcess(t, "sleeps", []string{"-c", `trap 'echo term; exit 0' TERM; echo up; while :; do sleep 0.05; done`}, nil)
	waitFile(t, logPath, "up")
	start := time.Now()
	if _, err := h.rt.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 30}); err != nil {
		t.Fatal(err)
	}
	st = h.status(t, id)
	if st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 0 || time.Since(start) > 20*time.Second {
		t.Errorf("after SIGTERM: %s exit %d in %v, want exited 0 at once", st.State, st.ExitCode, time.Since(start))
	}
	waitFile(t, logPath, "stdout F term")

	id, _, logPath = h.runProcess(t, "ignores", []string{"-c", `trap '' TERM; echo up; while :; do sleep 0.05; done`}, nil)
	waitFile(t, logPath, "up")
	if _, err := h.rt.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 1}); err != nil {
		t.Fatal(err)
	}
	if st := h.status(t, id); st.ExitCode != 137 {
		t.Errorf("SIGTERM ignored, grace over: exit %d, want 137 (SIGKILL)", st.ExitCode)
	}
}

// TestStopKillsProcesses: the server's Stop leaves no process behind.
func TestStopKillsProcesses(t *testing.T) {
	h := start(t, `{"processes": [{"image": "example.com/shell:*", "run": "/bin/sh"}]}`)
	pidFile := filepath.Join(t.TempDir(), "pid")
	_, _, logPath := h.runProcess(t, "long", []string{"-c", "echo $$ > " + pidFile + "; echo up; exec sleep 600"}, nil)
	waitFile(t, logPath, "up")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil || !alive(pid) {
		t.Fatalf("process %q not running: %v", b, err)
	}
	h.srv.Stop()
	if alive(pid) {
		t.Errorf("process %d still runs after the server stopped", pid)
	}
}

// TestPortForwardURL: PortForward answers with the streaming server's URL
// for a sandbox it has, NotFound for another; the streaming server serves
// that URL.
func TestPortForwardURL(t *testing.T) {
	h := start(t, `{"processes": [{"image": "example.com/shell:*", "run": "/bin/sh"}]}`)
	_, sb, _ := h.runProcess(t, "pf", []string{"-c", "exec sleep 600"}, nil)
	r, err := h.rt.PortForward(context.Background(), &runtimeapi.PortForwardRequest{PodSandboxId: sb, Port: []int32{7070}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.Url, "http://127.0.0.1:") || !strings.Contains(r.Url, "/portforward/") {
		t.Errorf("url %q", r.Url)
	}
	host := strings.Split(strings.TrimPrefix(r.Url, "http://"), "/")[0]
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Errorf("streaming server at %s: %v", host, err)
	} else {
		c.Close()
	}
	_, err = h.rt.PortForward(context.Background(), &runtimeapi.PortForwardRequest{PodSandboxId: "nope", Port: []int32{7070}})
	if status.Code(err) != codes.NotFound {
		t.Errorf("unknown sandbox: %v, want NotFound", err)
	}
	// The process container's pod has an address on the host's loopback.
	st, err := h.rt.PodSandboxStatus(context.Background(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb})
	if err != nil || !strings.HasPrefix(st.Status.Network.Ip, "127.88.") {
		t.Errorf("sandbox address %v %v, want 127.88.x.y", st, err)
	}
}
