package store

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/file"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

// storeLog adapts the store to sinktest.Log: the sink contract then runs
// over the real log (segments, persisted cursors, real retention) instead of
// the in-memory one. Each occurrence is appended on its own, one second
// apart on the store's clock, so that retention by age can remove whole
// segments up to a given offset.
type storeLog struct {
	*Store
	clock *fakeClock
}

var (
	_ sinktest.Log         = (*storeLog)(nil)
	_ sinktest.Retainer    = (*storeLog)(nil)
	_ sinktest.LossCounter = (*storeLog)(nil)
)

func (l *storeLog) Append(ctx context.Context, occs []*eventpipev1.Occurrence) error {
	for _, o := range occs {
		l.clock.Add(time.Second)
		if _, err := l.Store.Append(ctx, "contract", "events", "", []*eventpipev1.Occurrence{o}); err != nil {
			return err
		}
	}
	return nil
}

// Retain ages out, with the store's own retention, every segment whose last
// record is at or before upTo.
func (l *storeLog) Retain(upTo uint64) uint64 {
	var cutoff time.Time
	for _, seg := range l.wal().Segments() {
		if seg.Last <= upTo {
			cutoff = seg.ModTime
		}
	}
	if cutoff.IsZero() {
		return 0
	}
	if now := cutoff.Add(l.cfg.Retention.MaxAge + time.Millisecond); now.After(l.clock.Now()) {
		l.clock.Add(now.Sub(l.clock.Now()))
	}
	if _, err := l.ApplyRetention(); err != nil {
		return 0
	}
	first, _ := l.Bounds()
	return first - 1
}

func (l *storeLog) LostBy(consumer string) uint64 { return l.Lost()[consumer] }

// failingFS makes the file sink's writes fail with ENOSPC during an outage.
type failingFS struct {
	file.OSFS
	mu   sync.Mutex
	full bool
}

func (f *failingFS) OpenFile(name string, flag int, perm os.FileMode) (file.File, error) {
	of, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &failingFile{File: of, fs: f}, nil
}

type failingFile struct {
	file.File
	fs *failingFS
}

func (f *failingFile) Write(b []byte) (int, error) {
	f.fs.mu.Lock()
	full := f.fs.full
	f.fs.mu.Unlock()
	if full {
		return 0, syscall.ENOSPC
	}
	return f.File.Write(b)
}

// The sink contract (sinks/sinktest) over the real store and the real file
// sink: every scenario (outage, refusals, random failures, restart from the
// persisted cursor, retention by whole segments, shared records) must hold
// on the log the collector really runs, and the store's count of records a
// consumer lost to retention must agree with the runner's.
func TestSinkContractOverTheStore(t *testing.T) {
	sinktest.RunContract(t, sinktest.Harness{
		Name:    "file",
		Records: 200,
		NewLog: func(t *testing.T) sinktest.Log {
			clock := newClock()
			cfg := testConfig(t.TempDir())
			cfg.SegmentBytes = 4 << 10
			cfg.Fsync = false // the contract is about delivery, not power loss
			return &storeLog{Store: mustOpen(t, cfg, options{now: clock.Now}), clock: clock}
		},
		NewTarget: func(t *testing.T) *sinktest.Target {
			fs := &failingFS{}
			cfg := file.NewDefaultConfig()
			cfg.Path = filepath.Join(t.TempDir(), "out", "events.jsonl")
			cfg.MaxBytes = 64 << 10
			cfg.MaxFiles = 1000
			var mu sync.Mutex
			var last *file.Sink
			return &sinktest.Target{
				NewPusher: func() (sinks.Pusher, error) {
					s, err := file.New(cfg, nil, prometheus.NewRegistry(), file.WithFS(fs))
					mu.Lock()
					last = s
					mu.Unlock()
					return s, err
				},
				Delivered: func(context.Context) ([]string, error) {
					mu.Lock()
					s := last
					mu.Unlock()
					return deliveredIDs(s.Files())
				},
				Outage: func(t *testing.T) func() {
					fs.mu.Lock()
					fs.full = true
					fs.mu.Unlock()
					return func() { fs.mu.Lock(); fs.full = false; fs.mu.Unlock() }
				},
			}
		},
	})
}

// deliveredIDs reads the event_id of every line of the file sink's files.
func deliveredIDs(files []string) ([]string, error) {
	var ids []string
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
		for sc.Scan() {
			var o eventpipev1.Occurrence
			if err := protojson.Unmarshal(sc.Bytes(), &o); err != nil {
				f.Close()
				return nil, err
			}
			ids = append(ids, o.GetEventId())
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return ids, nil
}
