package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// The byte relay is the floor of any user-space relay between the gateway
// and the driver: a process that copies each connection's bytes to its own
// driver connection and back, parsing nothing. A frame-level HTTP/2 relay
// would add frame parsing and HPACK decoding to it; the gRPC proxy adds two
// gRPC legs. It only exists to size that choice (-pipe); it edits nothing.

// pipeArg is the first argument that makes this binary the byte relay.
const pipeArg = "pipe-serve"

// pipeServe listens on listen and relays every connection to driver.
func pipeServe(listen, driver string) error {
	_ = os.Remove(listen)
	l, err := net.Listen("unix", listen)
	if err != nil {
		return err
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			d, err := net.Dial("unix", driver)
			if err != nil {
				return
			}
			defer d.Close()
			done := make(chan struct{})
			go func() { _, _ = io.Copy(d, c); d.(*net.UnixConn).CloseWrite(); close(done) }()
			_, _ = io.Copy(c, d)
			c.(*net.UnixConn).CloseWrite()
			<-done
		}()
	}
}

// startPipe runs this binary as the byte relay in a child process.
func (e *env) startPipe() (*proc, error) {
	sock := filepath.Join(e.dir, "pipe", "pipe.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := pinned(self, pipeArg, sock, e.drv.Path)
	// One P like the proxy's default; -proxy-env applies to both (the
	// last value of a key wins).
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	if *proxyEnv != "" {
		cmd.Env = append(cmd.Env, splitEnv(*proxyEnv)...)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return &proc{cmd: cmd, sock: sock}, nil
		}
		if time.Since(start) > 10*time.Second {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, errors.New("byte relay not accepting after 10s")
		}
	}
}

func runPipe(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gateway pipe-serve LISTEN DRIVER")
		return 2
	}
	if err := pipeServe(args[0], args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "pipe-serve:", err)
		return 1
	}
	return 0
}
