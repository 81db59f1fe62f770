package wal

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// memFS is an in-memory FS for tests that open many small logs (the header
// table, the fuzz targets): no disk and no fsync, so thousands of opens
// take seconds. Paths are used as given; directories are implied by the
// files in them.
type memFS struct {
	mu    sync.Mutex
	files map[string]*memData
}

type memData struct {
	mu sync.Mutex
	b  []byte
}

func newMemFS() *memFS { return &memFS{files: map[string]*memData{}} }

// put stores a file's bytes (a copy).
func (m *memFS) put(name string, b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[name] = &memData{b: append([]byte(nil), b...)}
}

// get returns a copy of a file's bytes.
func (m *memFS) get(name string) ([]byte, bool) {
	m.mu.Lock()
	d, ok := m.files[name]
	m.mu.Unlock()
	if !ok {
		return nil, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]byte(nil), d.b...), true
}

func (m *memFS) OpenFile(name string, flag int, _ os.FileMode) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.files[name]
	if !ok {
		if flag&os.O_CREATE == 0 {
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
		}
		d = &memData{}
		m.files[name] = d
	}
	if flag&os.O_TRUNC != 0 {
		d.mu.Lock()
		d.b = nil
		d.mu.Unlock()
	}
	return &memFile{d: d, name: name, appendOnly: flag&os.O_APPEND != 0}, nil
}

func (m *memFS) ReadDir(name string) ([]os.DirEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []os.DirEntry
	for p, d := range m.files {
		if filepath.Dir(p) == filepath.Clean(name) {
			d.mu.Lock()
			out = append(out, fs.FileInfoToDirEntry(memInfo{name: filepath.Base(p), size: int64(len(d.b))}))
			d.mu.Unlock()
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out, nil
}

func (m *memFS) MkdirAll(string, os.FileMode) error { return nil }

func (m *memFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.files[name]; !ok {
		return &fs.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	delete(m.files, name)
	return nil
}

func (m *memFS) Rename(oldpath, newpath string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.files[oldpath]
	if !ok {
		return &fs.PathError{Op: "rename", Path: oldpath, Err: fs.ErrNotExist}
	}
	delete(m.files, oldpath)
	m.files[newpath] = d
	return nil
}

func (m *memFS) SyncDir(string) error { return nil }

// names lists the files under dir whose name has the suffix.
func (m *memFS) names(dir, suffix string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for p := range m.files {
		if filepath.Dir(p) == filepath.Clean(dir) && strings.HasSuffix(p, suffix) {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

type memFile struct {
	d          *memData
	name       string
	pos        int64
	appendOnly bool
}

func (f *memFile) Write(b []byte) (int, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if f.appendOnly {
		f.pos = int64(len(f.d.b))
	}
	if end := f.pos + int64(len(b)); end > int64(len(f.d.b)) {
		f.d.b = append(f.d.b, make([]byte, end-int64(len(f.d.b)))...)
	}
	copy(f.d.b[f.pos:], b)
	f.pos += int64(len(b))
	return len(b), nil
}

func (f *memFile) ReadAt(b []byte, off int64) (int, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if off >= int64(len(f.d.b)) {
		return 0, io.EOF
	}
	n := copy(b, f.d.b[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) Sync() error { return nil }

func (f *memFile) Truncate(size int64) error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if size < int64(len(f.d.b)) {
		f.d.b = f.d.b[:size]
	} else {
		f.d.b = append(f.d.b, make([]byte, size-int64(len(f.d.b)))...)
	}
	return nil
}

func (f *memFile) Seek(offset int64, whence int) (int64, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	switch whence {
	case io.SeekStart:
		f.pos = offset
	case io.SeekCurrent:
		f.pos += offset
	case io.SeekEnd:
		f.pos = int64(len(f.d.b)) + offset
	}
	return f.pos, nil
}

func (f *memFile) Stat() (os.FileInfo, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	return memInfo{name: filepath.Base(f.name), size: int64(len(f.d.b))}, nil
}

func (f *memFile) Close() error { return nil }

type memInfo struct {
	name string
	size int64
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) Mode() fs.FileMode  { return 0o640 }
func (i memInfo) ModTime() time.Time { return time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC) }
func (i memInfo) IsDir() bool        { return false }
func (i memInfo) Sys() any           { return nil }
