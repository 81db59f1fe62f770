package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
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
func (h *harness) runProcess(t *testing.T, pod string, args []string, mounts []*runtimeapi.Mount, ports ...int32) (string, string, string) {
	t.Helper()
	id, sb, log := h.createProcess(t, pod, args, mounts, ports...)
	if _, err := h.rt.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	return id, sb, log
}

// createProcess creates (not starts) the container runProcess runs.
func (h *harness) createProcess(t *testing.T, pod string, args []string, mounts []*runtimeapi.Mount, ports ...int32) (string, string, string) {
	t.Helper()
	ctx := context.Background()
	logDir := filepath.Join(h.dir, "logs", pod)
	var pms []*runtimeapi.PortMapping
	for _, p := range ports {
		pms = append(pms, &runtimeapi.PortMapping{Protocol: runtimeapi.Protocol_TCP, ContainerPort: p})
	}
	sb, err := h.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod, Namespace: "ns", Uid: "u-" + pod}, LogDirectory: logDir, PortMappings: pms}})
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

// servePart: the test binary as a process container's entrypoint: it
// answers "hello" on 0.0.0.0:PORT until SIGTERM.
const servePart = "cri-test-serve"

func serveHello(port string) int {
	l, err := net.Listen("tcp", "0.0.0.0:"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("listening")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hello"))
			c.Close()
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	return 0
}

// TestProcessNetwork: a process container has a network of its own: its
// port is not the host's, and the pod's declared port answers at the
// pod's IP (the server's proxy dials into the namespace). Many dials leave
// the process running: the dialing thread goes back to the host's
// namespace instead of ending (ending it would fire the Pdeathsig of a
// process it forked).
func TestProcessNetwork(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, fmt.Sprintf(`{"processes": [{"image": "example.com/shell:*", "run": %q}]}`, self))
	ports, err := freePort(t)
	if err != nil {
		t.Fatal(err)
	}
	id, sb, logPath := h.runProcess(t, "net", []string{servePart, strconv.Itoa(ports)}, nil, int32(ports))
	waitFile(t, logPath, "listening")
	st, err := h.rt.PodSandboxStatus(context.Background(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb})
	if err != nil {
		t.Fatal(err)
	}
	podAddr := net.JoinHostPort(st.Status.Network.Ip, strconv.Itoa(ports))
	for i := 0; i < 50; i++ {
		c, err := net.Dial("tcp", podAddr)
		if err != nil {
			t.Fatalf("dial %d to the pod's address %s: %v", i, podAddr, err)
		}
		b, _ := io.ReadAll(c)
		c.Close()
		if string(b) != "hello" {
			t.Fatalf("dial %d: read %q, want hello", i, b)
		}
	}
	if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(ports))); err == nil {
		c.Close()
		t.Errorf("the process's port answers on the host's 127.0.0.1")
	}
	if st := h.status(t, id); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("after the dials: %s exit %d, want running", st.State, st.ExitCode)
	}
}

// freePort returns a port free on the host's 127.0.0.1 now.
func freePort(t *testing.T) (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// A process container outlives the server thread that started it. Pdeathsig
// is sent when the forking thread ends, and Go ends a thread when a
// goroutine locked to it returns (netDial's way out when it cannot go back
// to its namespace, or any library's). Here StartContainer runs on such a
// goroutine, as a gRPC handler could share a thread with one later.
func TestProcessOutlivesTheThreadThatStartedIt(t *testing.T) {
	h := start(t, `{"processes": [{"image": "example.com/shell:*", "run": "/bin/sh"}]}`)
	pidFile := filepath.Join(t.TempDir(), "pid")
	id, _, logPath := h.createProcess(t, "long", []string{"-c", "echo $$ > " + pidFile + "; echo up; exec sleep 600"}, nil)
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // returning locked ends this thread
		_, err := h.srv.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: id})
		started <- err
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	waitFile(t, logPath, "up")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		t.Fatalf("pid file %q: %v", b, err)
	}
	time.Sleep(300 * time.Millisecond) // the thread has ended; a Pdeathsig SIGKILL lands at once
	if !alive(pid) {
		t.Fatalf("process %d was killed when the thread that started it ended", pid)
	}
	if st := h.status(t, id); st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("container %s: %v", id, st.GetState())
	}
}

// The executable runs even when a mount hides the directory it is in, as
// the chart's emptyDir at /tmp hides .bin/eventpipe of a clone under /tmp:
// the init opens it before the mounts.
func TestProcessExecutableUnderAMount(t *testing.T) {
	dir := t.TempDir()
	hidden := filepath.Join(dir, "hidden")
	if err := os.MkdirAll(hidden, 0o755); err != nil {
		t.Fatal(err)
	}
	sh, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hidden, "sh"), sh, 0o755); err != nil {
		t.Fatal(err)
	}
	h := start(t, `{"processes": [{"image": "example.com/shell:*", "run": "`+filepath.Join(hidden, "sh")+`"}]}`)
	empty := t.TempDir()
	_, _, logPath := h.runProcess(t, "hidden", []string{"-c", "echo up; ls " + hidden + "; echo listed; exec sleep 600"},
		[]*runtimeapi.Mount{{HostPath: empty, ContainerPath: hidden}})
	out := waitFile(t, logPath, "listed")
	if !strings.Contains(out, "up") || strings.Contains(out, " sh\n") {
		t.Fatalf("want the process running with its directory hidden by the mount; log:\n%s", out)
	}
}
