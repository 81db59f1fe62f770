package file

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// faultFS is the real file system with switchable failures.
type faultFS struct {
	OSFS
	mu sync.Mutex
	// writeErr fails every write; shortWrite writes half then fails;
	// syncErr fails fsync.
	writeErr, syncErr error
	shortWrite        bool
}

func (f *faultFS) set(fn func(*faultFS)) { f.mu.Lock(); fn(f); f.mu.Unlock() }

func (f *faultFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	of, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: of, fs: f}, nil
}

type faultFile struct {
	*os.File
	fs *faultFS
}

func (f *faultFile) Write(b []byte) (int, error) {
	f.fs.mu.Lock()
	werr, short := f.fs.writeErr, f.fs.shortWrite
	f.fs.mu.Unlock()
	if short {
		n, _ := f.File.Write(b[:len(b)/2])
		return n, syscall.ENOSPC
	}
	if werr != nil {
		return 0, werr
	}
	return f.File.Write(b)
}

func (f *faultFile) Sync() error {
	f.fs.mu.Lock()
	err := f.fs.syncErr
	f.fs.mu.Unlock()
	if err != nil {
		return err
	}
	return f.File.Sync()
}

// readIDs reads every line of every kept file, checking each is one JSON
// object that protojson parses back into an occurrence.
func readIDs(t testing.TB, s *Sink) ([]string, error) {
	var ids []string
	for _, name := range s.Files() {
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
				t.Errorf("%s: bad line %.80q: %v", name, sc.Text(), err)
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

func TestContract(t *testing.T) {
	sinktest.RunContract(t, sinktest.Harness{
		Name: "file",
		NewTarget: func(t *testing.T) *sinktest.Target {
			fs := &faultFS{}
			cfg := NewDefaultConfig()
			cfg.Path = filepath.Join(t.TempDir(), "out", "events.jsonl")
			cfg.MaxBytes = 64 << 10 // rotate during the scenarios
			cfg.MaxFiles = 1000
			var last *Sink
			var mu sync.Mutex
			return &sinktest.Target{
				NewPusher: func() (sinks.Pusher, error) {
					s, err := New(cfg, nil, prometheus.NewRegistry(), WithFS(fs))
					mu.Lock()
					last = s
					mu.Unlock()
					return s, err
				},
				Delivered: func(context.Context) ([]string, error) {
					mu.Lock()
					s := last
					mu.Unlock()
					return readIDs(t, s)
				},
				Outage: func(t *testing.T) func() {
					fs.set(func(f *faultFS) { f.shortWrite = true })
					return func() { fs.set(func(f *faultFS) { f.shortWrite = false }) }
				},
			}
		},
	})
}

func push(t *testing.T, s *Sink, occs []*eventpipev1.Occurrence) error {
	t.Helper()
	var b []sinks.Record
	for i, o := range occs {
		b = append(b, sinks.Record{Offset: uint64(i + 1), Occurrence: o})
	}
	return s.Push(context.Background(), b)
}

func TestFailedWritesRollBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*faultFS)
	}{
		{"short write", func(f *faultFS) { f.shortWrite = true }},
		{"write error", func(f *faultFS) { f.writeErr = syscall.EIO }},
		{"fsync error", func(f *faultFS) { f.syncErr = syscall.EIO }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := &faultFS{}
			cfg := NewDefaultConfig()
			cfg.Path = filepath.Join(t.TempDir(), "e.jsonl")
			s, err := New(cfg, nil, nil, WithFS(fs))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			g := sinktest.NewGenerator(1, "rb-")
			if err := push(t, s, g.Batch(10)); err != nil {
				t.Fatal(err)
			}
			fs.set(tc.set)
			err = push(t, s, g.Batch(10))
			if err == nil || sinks.IsPermanent(err) {
				t.Fatalf("push during failure = %v, want a retryable error", err)
			}
			if !errors.Is(err, syscall.EIO) && !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("error does not carry the cause: %v", err)
			}
			ids, err := readIDs(t, s)
			if err != nil || len(ids) != 10 {
				t.Fatalf("after the failed push the file holds %d lines (%v), want the 10 synced ones", len(ids), err)
			}
			fs.set(func(f *faultFS) { f.writeErr, f.syncErr, f.shortWrite = nil, nil, false })
			if err := push(t, s, g.Batch(5)); err != nil {
				t.Fatalf("push after recovery: %v", err)
			}
			if ids, _ := readIDs(t, s); len(ids) != 15 {
				t.Errorf("%d lines after recovery, want 15", len(ids))
			}
		})
	}
}

func TestRotationKeepsMaxFiles(t *testing.T) {
	cfg := NewDefaultConfig()
	cfg.Path = filepath.Join(t.TempDir(), "e.jsonl")
	cfg.MaxBytes = MinMaxBytes
	cfg.MaxFiles = 2
	reg := prometheus.NewRegistry()
	s, err := New(cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g := sinktest.NewGenerator(2, "rot-")
	for i := 0; i < 90; i++ {
		if err := push(t, s, g.Batch(1)); err != nil {
			t.Fatal(err)
		}
	}
	files := s.Files()
	if len(files) != 3 || files[0] != cfg.Path+".2" || files[2] != cfg.Path {
		t.Fatalf("files = %v, want .2, .1 and the active file", files)
	}
	for _, f := range files {
		fi, _ := os.Stat(f)
		if fi.Size() > cfg.MaxBytes {
			t.Errorf("%s is %d bytes, over max_bytes %d", f, fi.Size(), cfg.MaxBytes)
		}
	}
	if _, err := os.Stat(cfg.Path + ".3"); !os.IsNotExist(err) {
		t.Error("a third rotated file was kept")
	}
	ids, err := readIDs(t, s)
	if err != nil {
		t.Fatal(err)
	}
	// The newest lines are the last pushed, in order.
	if ids[len(ids)-1] == "" || !strings.HasPrefix(ids[len(ids)-1], "rot-") {
		t.Errorf("last id %q", ids[len(ids)-1])
	}
}

func TestLineFormatAndHostileInput(t *testing.T) {
	cfg := NewDefaultConfig()
	cfg.Path = filepath.Join(t.TempDir(), "e.jsonl")
	cfg.MaxBytes = 8 << 20
	s, err := New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g := sinktest.NewGenerator(3, "fmt-")
	occs := append(g.Batch(3), sinktest.Hostile("hostile-")...)
	occs = append(occs, nil) // a record without occurrence: refused, not a crash
	err = push(t, s, occs)
	var pe *sinks.PartialError
	if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[len(occs)-1] == nil {
		t.Fatalf("push = %v, want a PartialError for the nil record only", err)
	}
	data, err := os.ReadFile(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("%d lines, want 6 (newlines inside fields must be escaped)", len(lines))
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"event_id", "occurred_at", "involved_object", "schema_version"} {
		if _, ok := first[k]; !ok {
			t.Errorf("line lacks %q (proto names): %s", k, lines[0])
		}
	}
	if strings.Contains(lines[0], ": ") || strings.Contains(lines[0], ", ") {
		t.Errorf("line is not compact: %s", lines[0])
	}
	var big, bad eventpipev1.Occurrence
	if err := protojson.Unmarshal([]byte(lines[3]), &big); err != nil || len(big.GetMessage()) != 1<<20 {
		t.Errorf("1 MiB message: %v, %d bytes", err, len(big.GetMessage()))
	}
	if err := protojson.Unmarshal([]byte(lines[4]), &bad); err != nil || bad.GetMessage() != "bad\uFFFD\uFFFD\uFFFD(utf8" {
		t.Errorf("invalid UTF-8 line: %v, message %q", err, bad.GetMessage())
	}
}

func TestTornTailIsCutOnOpen(t *testing.T) {
	cfg := NewDefaultConfig()
	cfg.Path = filepath.Join(t.TempDir(), "e.jsonl")
	if err := os.WriteFile(cfg.Path, []byte("{\"event_id\":\"a/1\"}\n{\"event_id\":\"a/2\",\"mess"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := push(t, s, sinktest.NewGenerator(4, "torn-").Batch(1)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	ids, err := readIDs(t, s)
	if err != nil || len(ids) != 2 || ids[0] != "a/1" {
		t.Fatalf("ids = %v (%v)", ids, err)
	}
	if err := push(t, s, nil); err == nil {
		t.Error("push after close succeeded")
	}
}

func TestConfigValidate(t *testing.T) {
	err := Config{Path: "", MaxBytes: 10, MaxFiles: 0}.Validate()
	for _, want := range []string{"path:", "max_bytes:", "max_files:"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
	c := NewDefaultConfig()
	c.Path = "/var/lib/eventpipe/events.jsonl"
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
	if _, err := New(Config{}, nil, nil); err == nil {
		t.Error("New accepted an invalid config")
	}
}
