package kube

import "syscall"

// sysProcAttr puts the child in its own process group (so stop can signal
// every process it spawned) and has the kernel kill it when the test binary
// dies, even by SIGKILL or a -timeout panic that skips cleanups.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
