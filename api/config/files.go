package config

import (
	"fmt"
	"os"
	"sync/atomic"
)

// offline, when set, makes CheckFile and CheckReadable accept every file
// name without touching the file system.
var offline atomic.Bool

// SetOffline switches file checks off (true) or on for the whole process.
// It is a process-wide switch because every Validate in the tree has no
// options to thread it through; only `--check-config --offline` sets it, in a
// process that validates and exits. Offline, a config rendered for a
// cluster (naming secrets mounted only in the pod) can be checked in CI:
// everything but the files' presence is still checked.
func SetOffline(b bool) { offline.Store(b) }

// Offline reports whether file checks are off.
func Offline() bool { return offline.Load() }

// CheckFile reports why the file name (a certificate, key, token) cannot be
// used: it does not exist, or it is a directory. "" is no file, no problem.
func CheckFile(name string) error {
	if name == "" || offline.Load() {
		return nil
	}
	st, err := os.Stat(name)
	if err != nil {
		return err
	}
	if st.IsDir() {
		return fmt.Errorf("%q is a directory", name)
	}
	return nil
}

// CheckReadable is CheckFile that also opens the file (a password file that
// exists but is not readable by the process is as good as missing).
func CheckReadable(name string) error {
	if name == "" || offline.Load() {
		return nil
	}
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	return f.Close()
}
