package file

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/internal/jsonenc"
	"github.com/eventpipe/eventpipe/sinks/internal/promreg"
)

// Config is the file sink's YAML section.
type Config struct {
	// Path of the active file; rotated files are Path.1 ... Path.N.
	Path string `yaml:"path" json:"path"`
	// MaxBytes: rotate before a batch would take the file over this size.
	MaxBytes int64 `yaml:"max_bytes" json:"max_bytes"`
	// MaxFiles: rotated files kept besides the active one.
	MaxFiles int `yaml:"max_files" json:"max_files"`
	// ResendWindow is how many of the last written event_ids the sink
	// remembers (read back from the kept files at start) so that a record
	// pushed again is not appended twice. It must cover what a runner can
	// push again: what it pushed since its last commit (commit_interval's
	// worth of records, summed over the partitions a Kafka-mode replica
	// delivers).
	ResendWindow int `yaml:"resend_window" json:"resend_window"`
}

// Defaults.
const (
	DefaultMaxBytes = 100 << 20
	DefaultMaxFiles = 5
	// MinMaxBytes keeps rotation from running on every batch.
	MinMaxBytes = 4 << 10
	// MaxMaxFiles bounds the rename chain of one rotation.
	MaxMaxFiles = 1000
	// DefaultResendWindow covers 65 s of commits at 1,000 occurrences/s
	// with the default commit_interval of 1 s, for a few MB of ids and
	// a read-back of the files' last 65,536 lines at start.
	DefaultResendWindow = 65536
	// MaxResendWindow bounds the memory and start-up read of the window.
	MaxResendWindow = 1 << 22
)

// NewDefaultConfig returns the defaults; Path has none and must be set.
func NewDefaultConfig() Config {
	return Config{MaxBytes: DefaultMaxBytes, MaxFiles: DefaultMaxFiles, ResendWindow: DefaultResendWindow}
}

// Validate reports every problem with its YAML path (path, max_bytes,
// max_files, resend_window).
func (c Config) Validate() error {
	var errs []error
	if c.Path == "" {
		errs = append(errs, errors.New("path: must be set"))
	} else if filepath.Base(c.Path) == "." || filepath.Base(c.Path) == string(filepath.Separator) {
		errs = append(errs, fmt.Errorf("path: %q does not name a file", c.Path))
	}
	if c.MaxBytes < MinMaxBytes {
		errs = append(errs, fmt.Errorf("max_bytes: must be at least %d, got %d", MinMaxBytes, c.MaxBytes))
	}
	if c.MaxFiles < 1 || c.MaxFiles > MaxMaxFiles {
		errs = append(errs, fmt.Errorf("max_files: must be between 1 and %d, got %d", MaxMaxFiles, c.MaxFiles))
	}
	if c.ResendWindow < 1 || c.ResendWindow > MaxResendWindow {
		errs = append(errs, fmt.Errorf("resend_window: must be between 1 and %d, got %d", MaxResendWindow, c.ResendWindow))
	}
	return errors.Join(errs...)
}

// FS is the part of the file system the sink uses; tests inject faults
// through it. OSFS is the real one.
type FS interface {
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	Rename(oldpath, newpath string) error
	Remove(name string) error
	MkdirAll(path string, perm os.FileMode) error
	// SyncDir fsyncs a directory so renames and creations are durable.
	SyncDir(path string) error
}

// File is an open file of an FS.
type File interface {
	io.Writer
	Sync() error
	Truncate(size int64) error
	Seek(offset int64, whence int) (int64, error)
	Stat() (os.FileInfo, error)
	Close() error
}

// OSFS is the operating system's file system.
type OSFS struct{}

func (OSFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	return os.OpenFile(name, flag, perm)
}
func (OSFS) Rename(o, n string) error                     { return os.Rename(o, n) }
func (OSFS) Remove(name string) error                     { return os.Remove(name) }
func (OSFS) MkdirAll(path string, perm os.FileMode) error { return os.MkdirAll(path, perm) }
func (OSFS) SyncDir(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Option changes how New builds a Sink.
type Option func(*Sink)

// WithFS makes the sink use fs instead of the real file system.
func WithFS(fs FS) Option { return func(s *Sink) { s.fs = fs } }

// Sink writes batches to the file. It implements sinks.Pusher and is safe
// for concurrent use (pushes are serialised).
type Sink struct {
	cfg Config
	fs  FS
	log *slog.Logger
	m   *metrics

	mu     sync.Mutex
	f      File  // nil when closed or after a failure
	size   int64 // bytes in f known to be synced
	closed bool
	buf    bytes.Buffer
	// seen holds the event_ids of the last ResendWindow lines written;
	// pending those of the batch being written.
	seen      *written
	pending   []string
	inPending map[string]struct{}
}

type metrics struct {
	bytes, rotations, encodeErrors, repeats, torn prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	var err error
	reg1 := func(c prometheus.Counter) prometheus.Counter {
		got, e := promreg.Register(reg, c)
		if e != nil && err == nil {
			err = e
		}
		return got
	}
	m := &metrics{
		bytes: reg1(prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_sink_file_written_bytes_total", Help: "Bytes written and synced by file sinks."})),
		rotations: reg1(prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_sink_file_rotations_total", Help: "Rotations of file sinks' files."})),
		encodeErrors: reg1(prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_sink_file_encode_errors_total", Help: "Records file sinks could not encode (refused permanently)."})),
		repeats: reg1(prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_sink_file_repeated_records_total",
			Help: "Records pushed again whose event_id the file already holds (a resend after a restart or a lost commit): not written twice."})),
		torn: reg1(prometheus.NewCounter(prometheus.CounterOpts{
			Name: "eventpipe_sink_file_torn_lines_total",
			Help: "Incomplete last lines cut from a file found torn at open (a crash in the middle of a write); their records are pushed again."})),
	}
	return m, err
}

// New validates cfg, creates the directory and opens (or creates) the file
// for appending. logger and reg may be nil.
func New(cfg Config, logger *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("file sink config: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("file sink: register metrics: %w", err)
	}
	s := &Sink{cfg: cfg, fs: OSFS{}, log: logger.With("path", cfg.Path), m: m}
	for _, o := range opts {
		o(s)
	}
	if err := s.fs.MkdirAll(filepath.Dir(cfg.Path), 0o750); err != nil {
		return nil, fmt.Errorf("file sink: create directory: %w", err)
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	seen, n, err := seedWritten(s.Files(), cfg.ResendWindow)
	if err != nil {
		s.f.Close()
		return nil, fmt.Errorf("file sink: %w", err)
	}
	s.seen, s.inPending = seen, map[string]struct{}{}
	if n > 0 {
		s.log.Info("file sink: read back the event_ids of the last lines written", "lines", n)
	}
	return s, nil
}

// open opens the active file and positions at its end. The file's current
// size is trusted: lines written by an earlier process were synced before
// it acknowledged them, and a torn tail is cut back to the last newline.
func (s *Sink) open() error {
	f, err := s.fs.OpenFile(s.cfg.Path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("file sink: open %s: %w", s.cfg.Path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("file sink: stat %s: %w", s.cfg.Path, err)
	}
	size := fi.Size()
	if size > 0 {
		if good, err := lastNewline(f, size); err != nil {
			f.Close()
			return fmt.Errorf("file sink: read tail of %s: %w", s.cfg.Path, err)
		} else if good != size {
			s.log.Warn("file sink: cutting a torn last line", "bytes", size-good)
			s.m.torn.Inc()
			if err := f.Truncate(good); err != nil {
				f.Close()
				return fmt.Errorf("file sink: cut torn tail of %s: %w", s.cfg.Path, err)
			}
			size = good
		}
	}
	if _, err := f.Seek(size, io.SeekStart); err != nil {
		f.Close()
		return fmt.Errorf("file sink: seek %s: %w", s.cfg.Path, err)
	}
	if size == 0 {
		// The file may have just been created: make its directory entry
		// durable too, or a crash could lose a file whose lines were synced.
		if err := s.fs.SyncDir(filepath.Dir(s.cfg.Path)); err != nil {
			f.Close()
			return fmt.Errorf("file sink: sync directory of %s: %w", s.cfg.Path, err)
		}
	}
	s.f, s.size = f, size
	return nil
}

// lastNewline returns the offset just after the last '\n' in the file's
// tail (0 if the file holds none in its last 1 MiB... then the whole file
// is a torn line only if it has no newline at all).
func lastNewline(f File, size int64) (int64, error) {
	ra, ok := f.(io.ReaderAt)
	if !ok {
		return size, nil
	}
	const chunk = 64 << 10
	end := size
	for end > 0 {
		start := max(end-chunk, 0)
		b := make([]byte, end-start)
		if _, err := ra.ReadAt(b, start); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			return start + int64(i) + 1, nil
		}
		end = start
	}
	return 0, nil
}

// Push implements sinks.Pusher.
func (s *Sink) Push(ctx context.Context, batch []sinks.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		// Retryable: closing the sink must never drop what the runner holds.
		return errors.New("file sink is closed")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.buf.Reset()
	s.pending = s.pending[:0]
	clear(s.inPending)
	var failed map[int]error
	for i, r := range batch {
		if id := r.Occurrence.GetEventId(); id != "" && (s.seen.has(id) || s.isPending(id)) {
			s.m.repeats.Inc()
			continue
		}
		if err := s.encode(r); err != nil {
			s.m.encodeErrors.Inc()
			if failed == nil {
				failed = map[int]error{}
			}
			failed[i] = err
		}
	}
	if s.buf.Len() > 0 {
		if err := s.write(s.buf.Bytes()); err != nil {
			return err
		}
		for _, id := range s.pending {
			s.seen.add(id)
		}
	}
	if s.buf.Cap() > 16<<20 {
		s.buf = bytes.Buffer{} // do not keep a huge batch's buffer
	}
	if failed != nil {
		return &sinks.PartialError{Failed: failed}
	}
	return nil
}

func (s *Sink) isPending(id string) bool { _, ok := s.inPending[id]; return ok }

func (s *Sink) encode(r sinks.Record) error {
	if r.Occurrence == nil {
		return fmt.Errorf("offset %d: no occurrence", r.Offset)
	}
	b, err := jsonenc.AppendProtoJSON(s.buf.AvailableBuffer(), r.Occurrence)
	if err != nil {
		return fmt.Errorf("encode event %q: %w", r.Occurrence.GetEventId(), err)
	}
	s.buf.Write(append(b, '\n'))
	if id := r.Occurrence.GetEventId(); id != "" {
		s.pending = append(s.pending, id)
		s.inPending[id] = struct{}{}
	}
	return nil
}

// write appends b and syncs, rotating first when needed. On failure the
// file is rolled back to its last synced size (or reopened later) and a
// retryable error is returned.
func (s *Sink) write(b []byte) error {
	if s.f == nil {
		if err := s.open(); err != nil {
			return err
		}
	}
	if s.size > 0 && s.size+int64(len(b)) > s.cfg.MaxBytes {
		if err := s.rotate(); err != nil {
			return err
		}
	}
	n, err := s.f.Write(b)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	if err == nil {
		err = s.f.Sync()
	}
	if err != nil {
		s.rollback()
		return fmt.Errorf("file sink: write %s: %w", s.cfg.Path, err)
	}
	s.size += int64(len(b))
	s.m.bytes.Add(float64(len(b)))
	return nil
}

// rollback cuts the file back to its last synced size so that no torn or
// unsynced line stays behind, then closes it; the next push reopens.
func (s *Sink) rollback() {
	if err := s.f.Truncate(s.size); err != nil {
		s.log.Error("file sink: roll back a failed write", "err", err)
	} else if err := s.f.Sync(); err != nil {
		s.log.Error("file sink: sync after roll back", "err", err)
	}
	if err := s.f.Close(); err != nil {
		s.log.Debug("file sink: close after a failed write", "err", err)
	}
	s.f = nil
}

func (s *Sink) rotated(i int) string { return fmt.Sprintf("%s.%d", s.cfg.Path, i) }

// rotate renames PATH.i to PATH.i+1 (the oldest beyond max_files is
// removed), PATH to PATH.1, and opens a new PATH.
func (s *Sink) rotate() error {
	if err := s.f.Close(); err != nil {
		s.log.Warn("file sink: close before rotation", "err", err)
	}
	s.f = nil
	if err := s.fs.Remove(s.rotated(s.cfg.MaxFiles)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("file sink: remove oldest rotated file: %w", err)
	}
	for i := s.cfg.MaxFiles - 1; i >= 1; i-- {
		if err := s.fs.Rename(s.rotated(i), s.rotated(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("file sink: rotate %s: %w", s.rotated(i), err)
		}
	}
	if err := s.fs.Rename(s.cfg.Path, s.rotated(1)); err != nil {
		return fmt.Errorf("file sink: rotate %s: %w", s.cfg.Path, err)
	}
	if err := s.fs.SyncDir(filepath.Dir(s.cfg.Path)); err != nil {
		return fmt.Errorf("file sink: sync directory after rotation: %w", err)
	}
	s.m.rotations.Inc()
	s.log.Info("file sink rotated", "kept", s.cfg.MaxFiles)
	return s.open()
}

// Files returns the sink's files that exist, oldest first (rotated files,
// then the active one): what a reader goes through to see everything kept.
func (s *Sink) Files() []string {
	var out []string
	for i := s.cfg.MaxFiles; i >= 1; i-- {
		if _, err := os.Stat(s.rotated(i)); err == nil {
			out = append(out, s.rotated(i))
		}
	}
	if _, err := os.Stat(s.cfg.Path); err == nil {
		out = append(out, s.cfg.Path)
	}
	return out
}

// Close closes the file. Pushes after Close fail (retryably).
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	if err != nil {
		return fmt.Errorf("file sink: close %s: %w", s.cfg.Path, err)
	}
	return nil
}
