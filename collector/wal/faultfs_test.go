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
	crashed    bool // every write and fsync fails (the process "died")
	crashSync  bool // the next fsync fails and sets crashed
	syncs      atomic.Int64
	writes     atomic.Int64
	// durable: per file, the size at its last successful fsync (what a
	// power cut would keep for certain).
	durable map[string]int64
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
	return &faultFile{File: file, fs: f, name: name}, nil
}

type faultFile struct {
	File
	fs   *faultFS
	name string
}

func (f *faultFile) Write(b []byte) (int, error) {
	f.fs.mu.Lock()
	fail, short := f.fs.failWrite || f.fs.crashed, f.fs.shortWrite
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
	fail := f.fs.failSync || f.fs.crashed || f.fs.crashSync
	if f.fs.crashSync {
		f.fs.crashed = true
	}
	f.fs.mu.Unlock()
	f.fs.syncs.Add(1)
	if fail {
		return errInjected
	}
	st, err := f.File.Stat()
	if err != nil {
		return err
	}
	if err := f.File.Sync(); err != nil {
		return err
	}
	f.fs.mu.Lock()
	if f.fs.durable == nil {
		f.fs.durable = map[string]int64{}
	}
	f.fs.durable[f.name] = st.Size()
	f.fs.mu.Unlock()
	return nil
}
