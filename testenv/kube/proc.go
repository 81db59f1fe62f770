package kube

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// process is one child (etcd, kube-apiserver, a writer) in its own process group.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{} // closed when Wait returned
	waitErr error
}

// startProcess starts path with args, its output appended to logPath.
func startProcess(name, path string, args []string, dir, logPath string) (*process, error) {
	return startProcessEnv(name, path, args, nil, dir, logPath)
}

// startProcessEnv is startProcess with env added to this process's
// environment.
func startProcessEnv(name, path string, args, env []string, dir, logPath string) (*process, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = lf
	cmd.Stderr = lf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: lf, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// pid returns the process id (also its process group id).
func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended, with its wait error.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, SIGKILL after grace, and waits
// until the leader has been reaped and the group is empty.
func (p *process) stop(grace time.Duration) error {
	pgid := p.pid()
	if ok, _ := p.exited(); !ok {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				return fmt.Errorf("stop %s (pid %d): still running 30s after SIGKILL", p.name, pgid)
			}
		}
	}
	// Children the leader left behind (none expected) share the group.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for groupAlive(pgid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("stop %s: process group %d still has members", p.name, pgid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// groupAlive reports whether any process is left in process group pgid.
func groupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// ProcessAlive reports whether pid names a live (not zombie) process.
// Exported for tests that check nothing outlives a Cluster.
func ProcessAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// The state follows the ")" that ends the command name.
	for i := len(st) - 1; i >= 0; i-- {
		if st[i] == ')' {
			return i+2 >= len(st) || st[i+2] != 'Z'
		}
	}
	return true
}
