package wal

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
)

// faultFS is the real file system with switchable faults on writes and
// fsyncs of files it opened.
type faultFS struct {
	OSFS
	mu         sync.Mutex
	failWrite  bool
	shortWrite bool // write half of the buffer and report an error-free short count
	failSync   bool
	syncs      atomic.Int64
	writes     atomic.Int64
}

var errInjected = errors.New("injected fault")

func (f *faultFS) set(fn func(*faultFS)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *faultFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	file, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f}, nil
}

type faultFile struct {
	File
	fs *faultFS
}

func (f *faultFile) Write(b []byte) (int, error) {
	f.fs.mu.Lock()
	fail, short := f.fs.failWrite, f.fs.shortWrite
	f.fs.mu.Unlock()
	f.fs.writes.Add(1)
	switch {
	case fail:
		return 0, errInjected
	case short && len(b) > 1:
		return f.File.Write(b[:len(b)/2])
	}
	return f.File.Write(b)
}

func (f *faultFile) Sync() error {
	f.fs.mu.Lock()
	fail := f.fs.failSync
	f.fs.mu.Unlock()
	f.fs.syncs.Add(1)
	if fail {
		return errInjected
	}
	return f.File.Sync()
}
