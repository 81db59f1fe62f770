package wal

import (
	"fmt"
	"io"
	"os"
)

// File is the part of *os.File the WAL uses. Tests wrap it to inject short
// writes, failed writes and failed fsyncs.
type File interface {
	io.Writer
	io.ReaderAt
	Sync() error
	Truncate(size int64) error
	Seek(offset int64, whence int) (int64, error)
	Stat() (os.FileInfo, error)
	Close() error
}

// FS is every file-system operation the WAL performs.
type FS interface {
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	ReadDir(name string) ([]os.DirEntry, error)
	MkdirAll(path string, perm os.FileMode) error
	Remove(name string) error
	Rename(oldpath, newpath string) error
	// SyncDir fsyncs a directory so that created, renamed and removed
	// entries are durable.
	SyncDir(name string) error
}

// OSFS is the real file system.
type OSFS struct{}

var _ FS = OSFS{}

// OpenFile opens a file with os.OpenFile.
func (OSFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// ReadDir lists a directory with os.ReadDir.
func (OSFS) ReadDir(name string) ([]os.DirEntry, error) { return os.ReadDir(name) }

// MkdirAll creates a directory with os.MkdirAll.
func (OSFS) MkdirAll(path string, perm os.FileMode) error { return os.MkdirAll(path, perm) }

// Remove removes a file with os.Remove.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// Rename renames a file with os.Rename.
func (OSFS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }

// SyncDir opens a directory and fsyncs it.
func (OSFS) SyncDir(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("open dir: %w", err)
	}
	serr := d.Sync()
	cerr := d.Close()
	if serr != nil {
		return fmt.Errorf("sync dir %s: %w", name, serr)
	}
	return cerr
}
