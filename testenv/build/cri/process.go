package cri

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// InitPart is the subcommand of the server's own executable that starts a
// container's process (kubeparts registers it; the package's tests
// dispatch it from TestMain): it runs in a new mount namespace, binds the
// kubelet's mounts at their container paths and execs the process. A Go
// process cannot enter a new mount namespace itself once its runtime has
// started threads, so the namespace is made by the clone of this child.
const InitPart = "cri-container-init"

// initSpec is what the server tells InitPart (its one argument, JSON).
type initSpec struct {
	Mounts []initMount `json:"mounts"`
	Argv   []string    `json:"argv"`
}

type initMount struct {
	Host      string `json:"host"`
	Container string `json:"container"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
}

// process is a container's running process.
type process struct {
	cmd     *exec.Cmd
	log     *criLog
	proxies []net.Listener // the pod's ports on its address (proxyPorts)
	done    chan struct{}  // closed once the process is reaped and its status set
}

// startProcessLocked starts a container whose rule names an executable.
// The caller holds s.mu.
func (s *Server) startProcessLocked(c *container) error {
	cfg := c.config
	argv := []string{c.run}
	if cmd := cfg.GetCommand(); len(cmd) > 0 {
		// command[0] is the image's entrypoint, which Run stands for.
		argv = append(argv, cmd[1:]...)
	}
	argv = append(argv, cfg.GetArgs()...)
	spec := initSpec{Argv: argv}
	for _, m := range cfg.GetMounts() {
		spec.Mounts = append(spec.Mounts, initMount{Host: m.GetHostPath(), Container: m.GetContainerPath(), ReadOnly: m.GetReadonly()})
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	cmd := exec.Command(self, InitPart, string(b))
	for _, e := range cfg.GetEnvs() {
		cmd.Env = append(cmd.Env, e.GetKey()+"="+string(e.GetValue()))
	}
	if !hasEnv(cmd.Env, "PATH") {
		cmd.Env = append(cmd.Env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	cmd.Dir = "/"
	if wd := cfg.GetWorkingDir(); wd != "" {
		cmd.Dir = "" // set by the init, once the mounts are in place
		cmd.Env = append(cmd.Env, "EVENTPIPE_CRI_WORKDIR="+wd)
	}
	// A network namespace of its own, as a pod has: its ports do not
	// take the host's (kubectl port-forward binds the same numbers on
	// 127.0.0.1); the server reaches them through netDial.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if os.Getuid() != 0 {
		// Without root, a user namespace grants the mount namespace.
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getuid(), HostID: os.Getuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getgid(), HostID: os.Getgid(), Size: 1}}
	}
	l := openCRILog(c.status.LogPath)
	cmd.Stdout, cmd.Stderr = l.stream("stdout"), l.stream("stderr")
	p := &process{cmd: cmd, log: l, done: make(chan struct{})}
	id := c.status.Id
	// Pdeathsig is sent when the thread that forked the process ends,
	// not the server: the process is started from a thread locked to this
	// goroutine, which lives until the process has ended (a locked thread
	// serves no other goroutine, and no other goroutine's exit can end it).
	started := make(chan error, 1)
	s.procs.Add(1)
	go func() {
		defer s.procs.Done()
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine, after the process
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := cmd.Wait()
		s.mu.Lock()
		proxies := p.proxies
		s.mu.Unlock()
		for _, px := range proxies {
			px.Close()
		}
		l.close()
		code, reason := exitStatus(err)
		s.mu.Lock()
		s.exitLocked(id, code, reason)
		s.mu.Unlock()
		close(p.done)
	}()
	if err := <-started; err != nil {
		l.close()
		return fmt.Errorf("start %s: %w", c.run, err)
	}
	c.proc = p
	if sb := s.sandboxes[c.sandboxID]; sb != nil {
		p.proxies = s.proxyPorts(p, sb)
	}
	return nil
}

func hasEnv(env []string, key string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, key+"=") {
			return true
		}
	}
	return false
}

// exitStatus is what containerd reports for a process's end: its exit
// code, or 128+signal when a signal ended it.
func exitStatus(err error) (int32, string) {
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, "Completed"
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int32(ws.Signal()), "Error"
		}
		return int32(exit.ExitCode()), "Error"
	}
	return 128, "Error"
}

// stop sends SIGTERM to the process group, then SIGKILL after grace, and
// waits until the process is reaped. It does not hold s.mu.
func (p *process) stop(grace time.Duration) {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return
	case <-t.C:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// criLog writes a container's output in the CRI log format the kubelet
// reads (`kubectl logs`): "<RFC3339Nano> <stream> F <line>".
type criLog struct {
	mu sync.Mutex
	f  *os.File // nil: no log path, output dropped
	ws []*logStream
}

func openCRILog(path string) *criLog {
	l := &criLog{}
	if path != "" {
		if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640); err == nil {
			l.f = f
		}
	}
	return l
}

func (l *criLog) stream(name string) io.Writer {
	w := &logStream{l: l, name: name}
	l.ws = append(l.ws, w)
	return w
}

func (l *criLog) line(stream, tag string, b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	fmt.Fprintf(l.f, "%s %s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), stream, tag, b)
}

// close writes what is left of unterminated lines and closes the file.
func (l *criLog) close() {
	for _, w := range l.ws {
		w.flush()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// logStream splits one stream's output into lines.
type logStream struct {
	l    *criLog
	name string
	mu   sync.Mutex
	buf  []byte
}

func (w *logStream) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.l.line(w.name, "F", w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) >= 16<<10 { // containerd splits long lines as partial (P)
		w.l.line(w.name, "P", w.buf)
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

func (w *logStream) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.l.line(w.name, "F", w.buf)
		w.buf = nil
	}
}

// ContainerInit is InitPart: in the mount namespace its clone made, it
// binds each mount's host path at its container path (parents first) and
// execs the container's argv with the environment it was given.
func ContainerInit(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, InitPart+": want one argument, the JSON spec")
		return 2
	}
	var spec initSpec
	if err := json.Unmarshal([]byte(args[0]), &spec); err != nil || len(spec.Argv) == 0 {
		fmt.Fprintf(os.Stderr, "%s: bad spec %q: %v\n", InitPart, args[0], err)
		return 2
	}
	if err := loopbackUp(); err != nil {
		fmt.Fprintln(os.Stderr, InitPart+":", err)
		return 128
	}
	// The executable is found and opened before the mounts: a mount may
	// hide it (the chart mounts an emptyDir at /tmp, and a clone under /tmp
	// keeps .bin/eventpipe there). It runs from the open file.
	path, err := exec.LookPath(spec.Argv[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, InitPart+":", err)
		return 127
	}
	bin, err := os.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, InitPart+":", err)
		return 127
	}
	if err := bindMounts(spec.Mounts); err != nil {
		fmt.Fprintln(os.Stderr, InitPart+":", err)
		return 128
	}
	env := os.Environ()
	if wd := os.Getenv("EVENTPIPE_CRI_WORKDIR"); wd != "" {
		if err := os.Chdir(wd); err != nil {
			fmt.Fprintln(os.Stderr, InitPart+":", err)
			return 128
		}
		env = dropEnv(env, "EVENTPIPE_CRI_WORKDIR")
	}
	err = syscall.Exec(fmt.Sprintf("/proc/self/fd/%d", bin.Fd()), spec.Argv, env)
	fmt.Fprintf(os.Stderr, "%s: exec %s: %v\n", InitPart, path, err)
	return 126
}

// loopbackUp brings up lo in the process's new network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// netDial connects to addr inside the network namespace of process pid,
// on a locked thread that enters the namespace, dials (a socket belongs to
// the namespace of the thread that made it) and goes back. The thread must
// go back rather than end: a process started with Pdeathsig gets its
// signal when the thread that forked it ends, and that could be this one.
// Should the way back fail, the thread stays locked and ends with the
// goroutine, as it must not serve others in the wrong namespace.
func netDial(ctx context.Context, pid int, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("own network namespace: %w", err)}
			return
		}
		defer home.Close()
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("network namespace of %d: %w", pid, err)}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("enter network namespace of %d: %w", pid, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// proxyPorts listens on the pod's address for each TCP port the pod
// declares (the sandbox's port mappings) and carries each connection into
// the process's namespace, so the kubelet's HTTP and TCP probes reach it
// at the pod's IP as on a node. The caller holds s.mu.
func (s *Server) proxyPorts(p *process, sb *sandbox) []net.Listener {
	var out []net.Listener
	for _, pm := range sb.ports {
		if pm.GetProtocol() != runtimeapi.Protocol_TCP {
			continue
		}
		port := strconv.Itoa(int(pm.GetContainerPort()))
		l, err := net.Listen("tcp", net.JoinHostPort(sb.status.Network.GetIp(), port))
		if err != nil {
			s.log.Warn("pod port not reachable at the pod's address", "ip", sb.status.Network.GetIp(), "port", port, "err", err)
			continue
		}
		out = append(out, l)
		s.procs.Add(1)
		go func() {
			defer s.procs.Done()
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				s.procs.Add(1)
				go func() {
					defer s.procs.Done()
					defer c.Close()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					in, err := netDial(ctx, p.cmd.Process.Pid, net.JoinHostPort("127.0.0.1", port))
					cancel()
					if err != nil {
						return // refused inside: refused outside
					}
					defer in.Close()
					pipe(c, in, p.done)
				}()
			}
		}()
	}
	return out
}

// pipe copies both ways until either side ends or done closes.
func pipe(a, b net.Conn, done <-chan struct{}) {
	ended := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(a, b); ended <- struct{}{} }()
	go func() { _, _ = io.Copy(b, a); ended <- struct{}{} }()
	select {
	case <-ended:
	case <-done:
	}
	a.Close()
	b.Close()
	<-ended
}

func dropEnv(env []string, key string) []string {
	out := env[:0]
	for _, e := range env {
		if !strings.HasPrefix(e, key+"=") {
			out = append(out, e)
		}
	}
	return out
}

// bindMounts makes the namespace's mounts private (nothing reaches the
// host) and binds every mount. Sources are opened first, so a mount over
// a parent of a later source (an emptyDir at /tmp over a kubelet
// directory under /tmp) does not hide it.
func bindMounts(mounts []initMount) error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	sort.SliceStable(mounts, func(i, j int) bool {
		return strings.Count(filepath.Clean(mounts[i].Container), "/") < strings.Count(filepath.Clean(mounts[j].Container), "/")
	})
	srcs := make([]*os.File, len(mounts))
	for i, m := range mounts {
		f, err := os.OpenFile(m.Host, unix.O_PATH|syscall.O_CLOEXEC, 0)
		if errors.Is(err, os.ErrNotExist) {
			// The hollow kubelet's fake OS makes some of the files it
			// mounts (the termination log) only in memory.
			fmt.Fprintf(os.Stderr, "%s: mount %s: source %s does not exist; not mounted\n", InitPart, m.Container, m.Host)
			continue
		}
		if err != nil {
			return fmt.Errorf("mount %s: source: %w", m.Container, err)
		}
		defer f.Close()
		srcs[i] = f
	}
	for i, m := range mounts {
		if srcs[i] == nil {
			continue
		}
		st, err := srcs[i].Stat()
		if err != nil {
			return fmt.Errorf("mount %s: %w", m.Container, err)
		}
		if err := ensureTarget(filepath.Clean(m.Container), st.IsDir()); err != nil {
			return fmt.Errorf("mount %s: %w", m.Container, err)
		}
		src := fmt.Sprintf("/proc/self/fd/%d", srcs[i].Fd())
		if err := syscall.Mount(src, m.Container, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s at %s: %w", m.Host, m.Container, err)
		}
		if m.ReadOnly {
			if err := syscall.Mount("", m.Container, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
				return fmt.Errorf("remount %s read-only: %w", m.Container, err)
			}
		}
	}
	return nil
}

// ensureTarget makes the mount point exist without writing to the host's
// file system: the deepest existing ancestor is replaced, in this
// namespace only, by a tmpfs that mirrors it (each entry bound back), and
// the missing part is made there.
func ensureTarget(target string, dir bool) error {
	if _, err := os.Stat(target); err == nil {
		return nil
	}
	parent := filepath.Dir(target)
	for {
		if _, err := os.Stat(parent); err == nil {
			break
		}
		parent = filepath.Dir(parent)
	}
	real, err := filepath.EvalSymlinks(parent)
	if err != nil {
		return err
	}
	if err := mirror(real); err != nil {
		return fmt.Errorf("make %s writable: %w", real, err)
	}
	if !dir {
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	}
	return os.MkdirAll(target, 0o755)
}

// mirror puts a tmpfs over dir holding dir's entries, each bound from the
// original (symlinks copied), so new entries can be made under dir.
func mirror(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	orig, err := os.OpenFile(dir, unix.O_PATH|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer orig.Close()
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("mode=%o", st.Mode().Perm())); err != nil {
		return fmt.Errorf("tmpfs: %w", err)
	}
	base := fmt.Sprintf("/proc/self/fd/%d", orig.Fd())
	for _, e := range entries {
		src, dst := filepath.Join(base, e.Name()), filepath.Join(dir, e.Name())
		switch {
		case e.Type()&os.ModeSymlink != 0:
			to, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(to, dst); err != nil {
				return err
			}
			continue
		case e.IsDir():
			if err := os.Mkdir(dst, 0o755); err != nil {
				return err
			}
		default:
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			f.Close()
		}
		if err := syscall.Mount(src, dst, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s back: %w", e.Name(), err)
		}
	}
	return nil
}
