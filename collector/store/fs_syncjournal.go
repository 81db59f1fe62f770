//go:build drill_syncjournal

package store

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/eventpipe/eventpipe/collector/wal"
)

// Built only with the drill_syncjournal tag (bench/drills' power-cut drill;
// never in a product build). When EVENTPIPE_DRILL_SYNC_JOURNAL names a
// file, every successful fsync of a store file appends "<size> <path>" to
// it. After a SIGKILL the drill cuts every segment back to its last synced
// size: what a power cut keeps for certain. A SIGKILL alone keeps the page
// cache, so it cannot show an acknowledgement given before the fsync.
func defaultFS() wal.FS {
	path := os.Getenv("EVENTPIPE_DRILL_SYNC_JOURNAL")
	if path == "" {
		return wal.OSFS{}
	}
	return &journalFS{journal: path}
}

type journalFS struct {
	wal.OSFS
	journal string
	mu      sync.Mutex
	f       *os.File
}

func (j *journalFS) OpenFile(name string, flag int, perm os.FileMode) (wal.File, error) {
	f, err := j.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(name)
	if err != nil {
		abs = name
	}
	return &journalFile{File: f, fs: j, path: abs}, nil
}

// note appends one line with one write (O_APPEND), so a SIGKILL never
// leaves half a line.
func (j *journalFS) note(path string, size int64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		f, err := os.OpenFile(j.journal, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("sync journal: %w", err)
		}
		j.f = f
	}
	_, err := fmt.Fprintf(j.f, "%d %s\n", size, path)
	return err
}

type journalFile struct {
	wal.File
	fs   *journalFS
	path string
}

func (f *journalFile) Sync() error {
	if err := f.File.Sync(); err != nil {
		return err
	}
	st, err := f.File.Stat()
	if err != nil {
		return err
	}
	return f.fs.note(f.path, st.Size())
}
