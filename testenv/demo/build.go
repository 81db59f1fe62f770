package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// runBuild runs build.sh DEST, showing each of its lines and, while it is
// silent (kube-apiserver compiles for minutes), a heartbeat with the time
// spent. The script runs in its own process group, which is killed when
// ctx ends, and dies with this process (Pdeathsig).
func runBuild(ctx context.Context, script, dir, dest string, printf func(string, ...any)) error {
	cmd := exec.Command(script, dest)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", script, err)
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	lines := make(chan string)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	waited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		pw.Close()
		waited <- err
	}()
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for lines != nil {
		select {
		case l, ok := <-lines:
			if !ok {
				lines = nil
				continue
			}
			printf("    %s\n", l)
		case <-tick.C:
			printf("    ... still building (%s)\n", time.Since(t0).Round(time.Second))
		case <-ctx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	wg.Wait()
	err := <-waited
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the go build it started, if any is left
	if ctx.Err() != nil {
		return fmt.Errorf("build interrupted: %w", ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", script, dest, err)
	}
	return nil
}
