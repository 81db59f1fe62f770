package victorialogs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Version is the VictoriaLogs release the helper builds when the binary is
// missing; FallbackVersion is tried when the module proxy does not serve it.
const (
	Version         = "v1.52.2"
	FallbackVersion = "v1.52.1"
	modulePath      = "github.com/VictoriaMetrics/VictoriaLogs/app/victoria-logs"
	binaryName      = "victoria-logs"
	repoModule      = "github.com/eventpipe/eventpipe"
)

// Server is one victoria-logs process on a loopback port with its own data
// directory. Its address and data survive Stop/Restart, so an outage drill
// sees the same endpoint and the data pushed before the outage.
type Server struct {
	t       testing.TB
	bin     string
	dataDir string
	logPath string
	addr    string // 127.0.0.1:port

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	logFile *os.File
}

// Start finds (or builds) victoria-logs, starts it on a loopback port of its
// choosing and waits until it answers /health. The process is stopped on cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatalf("victoria-logs binary: %v", err)
	}
	dir := t.TempDir()
	s := &Server{
		t:       t,
		bin:     bin,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "victoria-logs.log"),
	}
	t.Cleanup(s.Stop)
	// Port 0: the server binds a port of its choosing and reports it (a
	// port picked free here could be taken by someone else before the
	// server binds it).
	s.addr = "127.0.0.1:0"
	if err := s.start(); err != nil {
		t.Fatalf("victoria-logs: start: %v", err)
	}
	return s
}

// URL is the server's base URL (http://127.0.0.1:PORT).
func (s *Server) URL() string { return "http://" + s.addr }

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.addr }

// PushURL is the Loki push endpoint. VictoriaLogs parses a JSON line into
// fields unless told not to; tests add ?disable_message_parsing=1 through
// the sink's extra query parameters to keep the line intact as _msg.
func (s *Server) PushURL() string { return s.URL() + "/insert/loki/api/v1/push" }

// Stop stops the process (SIGTERM, then SIGKILL after 10 s) and waits for it.
// Safe to call more than once and on a stopped server.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

// Restart starts the process again on the same address and data directory.
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	s.stopLocked()
	s.mu.Unlock()
	// The old socket may linger for a moment; the address is ours, so wait.
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := s.start()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("victoria-logs: restart on %s: %v", s.addr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Running reports whether the process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// CPUTime is the CPU time (user+system) the running process used so far,
// read from /proc; zero when it is not running. Benchmarks use it to tell
// the server's share of the work from the client's.
func (s *Server) CPUTime() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the ")" that closes the command name: state is field 3,
	// utime and stime are fields 14 and 15, in clock ticks (100 Hz on Linux).
	rest := string(b)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("already running")
	}
	if err := os.MkdirAll(s.dataDir, 0o755); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	lf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	st, err := lf.Stat()
	if err != nil {
		lf.Close()
		return fmt.Errorf("log file: %w", err)
	}
	logFrom := st.Size()
	// INFO, for the line that names the address served.
	cmd := exec.Command(s.bin,
		"-storageDataPath="+s.dataDir,
		"-httpListenAddr="+s.addr,
		"-loggerLevel=INFO",
		"-retentionPeriod=100y",
	)
	cmd.Stdout = lf
	cmd.Stderr = lf
	// Pdeathsig: a test binary killed by a timeout takes the server with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("exec %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited, s.logFile = cmd, exited, lf

	deadline := time.Now().Add(20 * time.Second)
	client := &http.Client{Timeout: time.Second}
	// /health is asked only once this process has said which address it
	// serves: on a restart, another server that took the port meanwhile
	// could otherwise answer for it.
	served := false
	for {
		select {
		case <-exited:
			s.cmd = nil
			lf.Close()
			return fmt.Errorf("exited early: %s", s.logTail())
		default:
		}
		if !served {
			if addr := servedAddr(s.logPath, logFrom); addr != "" {
				switch {
				case strings.HasSuffix(s.addr, ":0"):
					s.addr = addr // the first start: nobody has read it yet
				case addr != s.addr:
					s.stopLocked()
					return fmt.Errorf("serves %s, not %s", addr, s.addr)
				}
				served = true
			}
		}
		if !served {
			if time.Now().After(deadline) {
				s.stopLocked()
				return fmt.Errorf("did not log the address it serves in 20s: %s", s.logTail())
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		resp, err := client.Get(s.URL() + "/health")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			s.stopLocked()
			return fmt.Errorf("not ready after 20s: %s", s.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) stopLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
	s.cmd = nil
	if s.logFile != nil {
		s.logFile.Close()
		s.logFile = nil
	}
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// Query runs a LogsQL query against /select/logsql/query and returns one
// map per log entry (VictoriaLogs answers JSON lines). Recent pushes become
// visible after about a second; use WaitFor to poll.
func (s *Server) Query(ctx context.Context, logsql string) ([]map[string]any, error) {
	form := url.Values{"query": {logsql}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/select/logsql/query", strings.NewReader(form.Encode()))
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("query: status %d: %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	var out []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 64<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("query: decode row: %w", err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("query: read: %w", err)
	}
	return out, nil
}

// Flush makes everything pushed so far queryable now
// (/internal/force_flush) instead of after about a second.
func (s *Server) Flush(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+"/internal/force_flush", nil)
	if err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("flush: status %d", resp.StatusCode)
	}
	return nil
}

// WaitFor flushes and polls Query until it returns at least want rows or ctx
// ends, and returns the last rows it saw.
func (s *Server) WaitFor(ctx context.Context, logsql string, want int) ([]map[string]any, error) {
	for {
		_ = s.Flush(ctx)
		rows, err := s.Query(ctx, logsql)
		if err == nil && len(rows) >= want {
			return rows, nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return rows, err
			}
			return rows, fmt.Errorf("wait for %d rows of %q: got %d: %w", want, logsql, len(rows), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// servedAddr is the address of the "started server at http://ADDR/" line
// written to the log at path past offset from ("" before it was written).
func servedAddr(path string, from int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) <= from {
		return ""
	}
	const marker = "started server at http://"
	for _, line := range strings.Split(string(b[from:]), "\n") {
		if _, rest, ok := strings.Cut(line, marker); ok {
			if addr, _, ok := strings.Cut(rest, "/"); ok {
				return addr
			}
		}
	}
	return ""
}

var (
	buildMu sync.Mutex
)

// Binary returns the path of victoria-logs in $EVENTPIPE_BIN_DIR, else in
// <repo root>/.bin, building it there with `go install` when it is missing,
// so `go test` alone never has to skip.
func Binary() (string, error) {
	dir := os.Getenv("EVENTPIPE_BIN_DIR")
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, ".bin")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, binaryName)
	buildMu.Lock()
	defer buildMu.Unlock()
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("bin dir: %w", err)
	}
	// Test binaries of several packages run in parallel: one builds, the
	// others wait for it.
	lock, err := os.OpenFile(filepath.Join(dir, ".victoria-logs.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("build lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("build lock: %w", err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, nil // built by another process meanwhile
	}
	var errs []error
	for _, v := range []string{Version, FallbackVersion} {
		cmd := exec.Command("go", "install", modulePath+"@"+v)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-trimpath")
		out, err := cmd.CombinedOutput()
		if err == nil {
			if v != Version {
				fmt.Fprintf(os.Stderr, "victorialogs: %s is not served, built %s instead: pin it in the Makefile\n", Version, v)
			}
			return bin, nil
		}
		errs = append(errs, fmt.Errorf("go install %s@%s: %w: %s", modulePath, v, err, lastLines(out, 10)))
	}
	return "", errors.Join(errs...)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// repoRoot walks up from the working directory to the go.mod of the
// eventpipe module.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modulePathOf(b) == repoModule {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s above the working directory", repoModule)
		}
		dir = parent
	}
}

func modulePathOf(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "module"); ok {
			rest = strings.TrimSpace(rest)
			if uq, err := strconv.Unquote(rest); err == nil {
				return uq
			}
			return rest
		}
	}
	return ""
}
