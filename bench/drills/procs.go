package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/eventpipe/eventpipe/testenv/freeport"
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
	"time"
)

// lockedBuffer collects a child's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tail returns the last n lines.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freeAddr picks a loopback address for a child's listener (testenv/freeport:
// outside the ephemeral range, so no outgoing connection takes it first).
func freeAddr() (string, error) { return freeport.Addr() }

// collectorProc is the real `eventpipe collector` binary as a child
// process. Each start appends its stderr to log (kept for the report).
type collectorProc struct {
	bin, config        string
	grpcAddr, httpAddr string
	log                *lockedBuffer
	env                []string // added to the environment of every start

	cmd  *exec.Cmd
	done chan error
}

// start runs the collector and waits until /readyz answers 200. It fails
// (with the child's last log lines) when the process exits first.
func (c *collectorProc) start(ctx context.Context) error {
	c.cmd = exec.Command(c.bin, "collector", "--config", c.config)
	c.cmd.Stderr = c.log
	if len(c.env) > 0 {
		c.cmd.Env = append(os.Environ(), c.env...)
	}
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("start collector: %w", err)
	}
	c.done = make(chan error, 1)
	cmd, done := c.cmd, c.done
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := client.Get("http://" + c.httpAddr + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			c.kill()
			return fmt.Errorf("collector not ready after 60s:\n%s", tail(c.log.String(), 20))
		}
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("collector exited before it was ready (%v):\n%s", err, tail(c.log.String(), 20))
		case <-ctx.Done():
			c.kill()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startExpectFailure runs the collector and expects it to exit non-zero
// before it becomes ready; it returns the log lines of that run.
func (c *collectorProc) startExpectFailure(ctx context.Context) (string, error) {
	before := len(c.log.String())
	err := c.start(ctx)
	if err == nil {
		c.stop()
		return "", errors.New("the collector started")
	}
	out := c.log.String()[before:]
	if c.cmd.ProcessState == nil || c.cmd.ProcessState.ExitCode() == 0 {
		return out, fmt.Errorf("the collector did not exit with an error: %w", err)
	}
	return out, nil
}

func (c *collectorProc) running() bool {
	return c.cmd != nil && c.cmd.ProcessState == nil
}

// kill sends SIGKILL and waits.
func (c *collectorProc) kill() {
	if !c.running() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	err := <-c.done
	c.done <- err
}

// stop sends SIGTERM and waits (SIGKILL after 30 s).
func (c *collectorProc) stop() error {
	if !c.running() {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.done:
		c.done <- err
		return err
	case <-time.After(30 * time.Second):
		c.kill()
		return errors.New("collector did not stop within 30s of SIGTERM")
	}
}

// ready reports /readyz == 200.
func (c *collectorProc) ready() bool {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + c.httpAddr + "/readyz")
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// metric sums the samples of a metric whose label set contains every
// "k=\"v\"" in labels. A missing metric is 0.
func (c *collectorProc) metric(name string, labels ...string) (float64, error) {
	return scrape(c.httpAddr, name, labels...)
}

// scrape sums the samples of a metric on http://addr/metrics whose label
// set contains every "k=\"v\"" in labels. A missing metric is 0.
func scrape(addr, name string, labels ...string) (float64, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		var lbl string
		switch {
		case strings.HasPrefix(rest, "{"):
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			lbl, rest = rest[1:end], rest[end+1:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // a longer name with the same prefix
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(lbl, l) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		sum += v
	}
	return sum, sc.Err()
}

// mustMetric is metric with a scrape error turned into -1 (shown as such).
func (c *collectorProc) mustMetric(name string, labels ...string) float64 {
	v, err := c.metric(name, labels...)
	if err != nil {
		return -1
	}
	return v
}

// vlProc is a victoria-logs child (the Loki stand-in) on a fixed loopback
// address and data directory, so it can be stopped and started again.
type vlProc struct {
	bin, dir, addr string
	log            *os.File
	cmd            *exec.Cmd
	exited         chan struct{}
}

func newVL(bin, dir string) (*vlProc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lf, err := os.Create(filepath.Join(dir, "victoria-logs.log"))
	if err != nil {
		return nil, err
	}
	p := &vlProc{bin: bin, dir: dir, log: lf}
	var lastErr error
	for range 5 {
		if p.addr, err = freeAddr(); err != nil {
			return nil, err
		}
		if lastErr = p.start(); lastErr == nil {
			return p, nil
		}
	}
	return nil, fmt.Errorf("victoria-logs: %w", lastErr)
}

func (p *vlProc) url() string { return "http://" + p.addr }

func (p *vlProc) start() error {
	cmd := exec.Command(p.bin, "-storageDataPath="+filepath.Join(p.dir, "data"), "-httpListenAddr="+p.addr,
		"-loggerLevel=WARN", "-retentionPeriod=100y")
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec %s: %w", p.bin, err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	exited := p.exited
	go func() { _ = cmd.Wait(); close(exited) }()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			return errors.New("exited early")
		default:
		}
		if resp, err := client.Get(p.url() + "/health"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			p.kill()
			return errors.New("not healthy after 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill stops the server the hard way (a crashed Loki).
func (p *vlProc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}

// stop stops the server with SIGTERM (it flushes what it accepted).
func (p *vlProc) stop() error {
	if p.cmd == nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.kill()
		return errors.New("victoria-logs did not stop within 30s of SIGTERM")
	}
	p.cmd = nil
	return nil
}

func (p *vlProc) close() {
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		p.cmd = nil
	}
	p.log.Close()
}

// query runs a LogsQL query and returns the JSON lines of the answer.
func (p *vlProc) query(ctx context.Context, q string) ([][]byte, error) {
	if req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url()+"/internal/force_flush", nil); err == nil {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	form := url.Values{"query": {q}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url()+"/select/logsql/query", strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("query: status %d: %s", resp.StatusCode, b)
	}
	var out [][]byte
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			out = append(out, append([]byte(nil), sc.Bytes()...))
		}
	}
	return out, sc.Err()
}
