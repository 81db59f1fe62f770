package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/eventpipe/eventpipe/sinks"
)

var consumerName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`)

// consumerCursor is a sinks.Cursor persisted as <dir>/cursors/<name>: the
// offset in decimal and a newline, replaced atomically (temp file, fsync,
// rename, directory fsync).
type consumerCursor struct {
	s    *Store
	name string
	path string
}

var (
	_ sinks.Cursor     = (*consumerCursor)(nil)
	_ sinks.LossCursor = (*consumerCursor)(nil)
)

// Cursor returns the persisted cursor of one named consumer (a sink).
func (s *Store) Cursor(consumer string) (sinks.Cursor, error) {
	if !consumerName.MatchString(consumer) || strings.HasSuffix(consumer, ".tmp") {
		return nil, fmt.Errorf("consumer name %q: want 1-128 of [a-zA-Z0-9._-], not ending in .tmp", consumer)
	}
	c := &consumerCursor{s: s, name: consumer, path: filepath.Join(s.cfg.Dir, "cursors", consumer)}
	off, err := c.Load()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if _, ok := s.consumers[consumer]; !ok {
		s.consumers[consumer] = off
	}
	s.mu.Unlock()
	s.m.consumerLost.WithLabelValues(consumer).Add(0)
	return c, nil
}

// Load returns the committed offset, 0 when nothing was committed yet.
func (c *consumerCursor) Load() (uint64, error) {
	f, err := c.s.fs.OpenFile(c.path, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("open cursor %s: %w", c.name, err)
	}
	defer f.Close()
	b := make([]byte, 32)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("read cursor %s: %w", c.name, err)
	}
	off, err := strconv.ParseUint(strings.TrimSpace(string(b[:n])), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cursor %s: corrupt content %q: %w", c.name, b[:n], err)
	}
	return off, nil
}

// Commit durably replaces the offset.
func (c *consumerCursor) Commit(offset uint64) error {
	tmp := c.path + ".tmp"
	f, err := c.s.fs.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("commit cursor %s: %w", c.name, err)
	}
	b := []byte(strconv.FormatUint(offset, 10) + "\n")
	n, err := f.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = c.s.fs.Remove(tmp)
		return fmt.Errorf("commit cursor %s: %w", c.name, err)
	}
	if err := c.s.fs.Rename(tmp, c.path); err != nil {
		return fmt.Errorf("commit cursor %s: rename: %w", c.name, err)
	}
	if err := c.s.fs.SyncDir(filepath.Dir(c.path)); err != nil {
		return fmt.Errorf("commit cursor %s: %w", c.name, err)
	}
	c.s.mu.Lock()
	c.s.consumers[c.name] = offset
	c.s.mu.Unlock()
	return nil
}

// Lost counts n records from offset from that retention removed before the
// consumer read them. The sink runner reports each loss once, as it counts
// it itself (sinks.LossCursor), so the store's per-consumer count and the
// sink's agree.
func (c *consumerCursor) Lost(from, n uint64) {
	c.s.mu.Lock()
	c.s.lost[c.name] += n
	c.s.mu.Unlock()
	c.s.m.consumerLost.WithLabelValues(c.name).Add(float64(n))
}
