// Command sinks-bench measures the Kafka and Loki sinks following the
// collector's durable log, alone and both together, the way the collector
// runs them: a real collector/store (fsync on, temp dir) is filled with N
// realistic occurrences (sinktest.Generator), then one sinks.Runner per sink
// reads the same log through its own persisted cursor and pushes into a real
// server on loopback:
//
//   - Kafka: an in-process kfake broker (in-memory, 6 partitions), the sink
//     with acks=all and snappy;
//   - Loki: a VictoriaLogs child process (the Loki push API, protobuf +
//     snappy), its data in the temp dir; or, with -loki recv, a minimal
//     push receiver in this process that decodes every push fully and counts
//     the entries (the sink's own cost without a storage engine's).
//
// The runners read the log the way the collector has them read it: through
// one shared source (collector.SinkSource: one read and decode of each
// chunk for all runners), with the collector's default commit_interval;
// -source store and -commit-interval 0 give the older behaviour (each runner
// reads the store itself, a cursor commit after every push).
//
// Each run gets a fresh broker and a fresh VictoriaLogs (or receiver), so
// the delivery check is exact: after the runners reach the head, the topic
// must hold N records and VictoriaLogs (the receiver) must count N entries.
//
// Per sink it prints records/s from the runners' start until that sink had
// handled the whole log; per run the CPU time of this process (runners,
// sinks, store reads, the kfake broker and the Loki receiver, which run
// in-process) and of the VictoriaLogs child (from /proc/<pid>/stat), per
// occurrence delivered.
// Mode "read" runs one runner whose push discards: what reading and decoding
// the log costs each sink before its own encoding.
//
//	go run ./bench/sinks                               # 200,000 occurrences, batches 100,500,1000
//	go run ./bench/sinks -occurrences 50000 -batches 500 -modes both
//	go run ./bench/sinks -batches 1000 -cpuprofile /tmp/sinks.prof
//	go run ./bench/sinks -loki recv                    # the sinks' own capacity
//	go run ./bench/sinks -ingest-rate 50000 -batches 1000 -modes both
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/collector/store"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/kafka"
	"github.com/eventpipe/eventpipe/sinks/loki"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
	"github.com/eventpipe/eventpipe/testenv/victorialogs"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sinks-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	occurrences int
	sandboxes   int
	appendBatch int
	partitions  int
	batches     []int
	modes       []string
	ingestRate  int
	maxWait     time.Duration
	commitEvery time.Duration
	timeout     time.Duration
	dir         string
	loki        string // vl or recv
	source      string // shared or store
}

func run() error {
	var o options
	var batches, modes string
	flag.IntVar(&o.occurrences, "occurrences", 200_000, "occurrences in the log (each run delivers all of them)")
	flag.IntVar(&o.sandboxes, "sandboxes", 200, "distinct sandboxes the generator spreads events over")
	flag.IntVar(&o.appendBatch, "append-batch", 500, "occurrences per store.Append while filling the log")
	flag.IntVar(&o.partitions, "partitions", 6, "partitions of the Kafka topic")
	flag.StringVar(&batches, "batches", "100,500,1000", "runner batch.max_records to measure (comma-separated)")
	flag.StringVar(&modes, "modes", "both,kafka,loki,read", "which sinks run in each measurement: both, kafka, loki, or read (a runner whose push discards: the log read + runner cost alone)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the measurements (not the fill) to this file")
	flag.IntVar(&o.ingestRate, "ingest-rate", 0, "0: the log is filled first and the sinks drain it; >0: each measurement appends N new occurrences at this rate (occurrences/s, store.Append with fsync) while the sinks follow from the head")
	flag.DurationVar(&o.maxWait, "max-wait", 50*time.Millisecond, "runner batch.max_wait")
	flag.DurationVar(&o.commitEvery, "commit-interval", sinks.DefaultCommitInterval, "runner commit_interval (0: commit the cursor after every push)")
	flag.StringVar(&o.loki, "loki", "vl", "Loki destination: vl (a VictoriaLogs child process) or recv (an in-process receiver that decodes and counts: the sink's own cost)")
	flag.StringVar(&o.source, "source", "shared", "what the runners read: shared (the collector's shared source, one decode for all runners) or store (each runner reads and decodes the store itself)")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up on one run after this long")
	flag.StringVar(&o.dir, "dir", "", "work directory (default: a new temp dir, removed after)")
	flag.Parse()
	for _, s := range strings.Split(batches, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || n > sinks.MaxBatchRecords {
			return fmt.Errorf("-batches: bad value %q", s)
		}
		o.batches = append(o.batches, n)
	}
	for _, m := range strings.Split(modes, ",") {
		m = strings.TrimSpace(m)
		if m != "both" && m != "kafka" && m != "loki" && m != "read" {
			return fmt.Errorf("-modes: bad value %q (both, kafka, loki, read)", m)
		}
		o.modes = append(o.modes, m)
	}
	if o.occurrences <= 0 {
		return errors.New("-occurrences must be positive")
	}
	if o.loki != "vl" && o.loki != "recv" {
		return fmt.Errorf("-loki: bad value %q (vl, recv)", o.loki)
	}
	if o.source != "shared" && o.source != "store" {
		return fmt.Errorf("-source: bad value %q (shared, store)", o.source)
	}

	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "sinks-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	vlBin, err := victorialogs.Binary()
	if err != nil {
		return fmt.Errorf("victoria-logs binary: %w", err)
	}

	host, _ := os.Hostname()
	fmt.Printf("machine: %s, %d CPUs, %s %s/%s\n", host, runtime.NumCPU(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Printf("start: %s, load %s\n", time.Now().UTC().Format(time.DateTime), loadavg())
	fmt.Printf("runners: source %s, commit_interval %s, batch.max_wait %s; loki destination %s\n", o.source, o.commitEvery, o.maxWait, o.loki)

	st, err := store.Open(storeConfig(filepath.Join(dir, "log")), nil, nil)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer st.Close()
	if o.ingestRate == 0 {
		if err := fill(st, o); err != nil {
			return err
		}
		_, head := st.Bounds()
		if head != uint64(o.occurrences) {
			return fmt.Errorf("log head is %d, want %d", head, o.occurrences)
		}
	} else {
		fmt.Printf("live: each measurement appends %d new occurrences at %d/s (batches of %d, fsync) while the sinks follow\n",
			o.occurrences, o.ingestRate, o.appendBatch)
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Printf("\n%-6s %-5s %-6s %12s %10s %12s %12s %12s %12s %s\n",
		"batch", "mode", "sink", "occ/s", "seconds", "proc-cpu-s", "vl-cpu-s", "proc-µs/occ", "vl-µs/occ", "load (1m, before → after)")
	var failures []string
	for _, b := range o.batches {
		for _, m := range o.modes {
			res, err := measure(st, vlBin, dir, o, b, m)
			if err != nil {
				failures = append(failures, fmt.Sprintf("batch %d %s: %v", b, m, err))
				fmt.Printf("%-6d %-5s FAILED: %v\n", b, m, err)
				continue
			}
			res.print()
		}
	}
	fmt.Printf("\nend: %s, load %s\n", time.Now().UTC().Format(time.DateTime), loadavg())
	if len(failures) > 0 {
		return fmt.Errorf("%d runs failed:\n  %s", len(failures), strings.Join(failures, "\n  "))
	}
	return nil
}

func storeConfig(dir string) store.Config {
	c := store.NewDefaultConfig()
	c.Dir = dir
	c.Fsync = true
	return c
}

// fill appends the generated occurrences the way the collector does (one
// Append per agent batch, fsync per group commit). Timestamps are moved so
// the last occurrence is now: Loki refuses old samples, and the sink would
// otherwise re-stamp them (a different path from steady operation).
func fill(st *store.Store, o options) error {
	occs, bytes := generate("sinks-bench-", o)
	start := time.Now()
	for i := 0; i < len(occs); i += o.appendBatch {
		if err := appendBatch(st, occs, i, o.appendBatch); err != nil {
			return err
		}
	}
	el := time.Since(start)
	fmt.Printf("log: %d occurrences (%d sandboxes, mean message %d bytes) appended in batches of %d with fsync in %.1fs (%.0f/s)\n",
		len(occs), o.sandboxes, bytes/len(occs), o.appendBatch, el.Seconds(), float64(len(occs))/el.Seconds())
	return nil
}

func generate(prefix string, o options) ([]*eventpipev1.Occurrence, int) {
	g := sinktest.NewGenerator(53, prefix)
	g.Sandboxes = o.sandboxes
	occs := g.Batch(o.occurrences)
	shift := time.Since(occs[len(occs)-1].GetOccurredAt().AsTime())
	var bytes int
	for _, oc := range occs {
		oc.OccurredAt = timestamppb.New(oc.GetOccurredAt().AsTime().Add(shift))
		bytes += len(oc.GetMessage())
	}
	return occs, bytes
}

func appendBatch(st *store.Store, occs []*eventpipev1.Occurrence, i, n int) error {
	end := min(i+n, len(occs))
	res, err := st.Append(context.Background(), "bench", "events", strconv.Itoa(end), occs[i:end])
	if err != nil {
		return fmt.Errorf("append: %w", err)
	}
	if res.Stored != end-i {
		return fmt.Errorf("append: stored %d of %d (duplicates %d)", res.Stored, end-i, res.Duplicates)
	}
	return nil
}

type sinkResult struct {
	name    string
	elapsed time.Duration
	status  sinks.Status
	maxLag  uint64
}

type result struct {
	batch              int
	mode               string
	n                  int
	sinks              []sinkResult
	procCPU, vlCPU     time.Duration
	loadBefore, loadAt string
	ingestRate         int
	ingest             time.Duration
	vl                 bool  // the Loki destination is VictoriaLogs (its CPU is measured)
	decoded, commits   int64 // records the store decoded, cursor commits (all runners)
}

func (r result) print() {
	delivered := float64(r.n * len(r.sinks))
	for _, s := range r.sinks {
		fmt.Printf("%-6d %-5s %-6s %12.0f %10.2f %12.2f %12s %12.1f %12s %s → %s\n",
			r.batch, r.mode, s.name, float64(r.n)/s.elapsed.Seconds(), s.elapsed.Seconds(),
			r.procCPU.Seconds(), vlCol(r.vlCPU.Seconds(), "%.2f", r.mode, r.vl),
			float64(r.procCPU.Microseconds())/delivered, vlCol(float64(r.vlCPU.Microseconds())/float64(r.n), "%.1f", r.mode, r.vl),
			r.loadBefore, r.loadAt)
	}
	fmt.Printf("       log records decoded: %.2f per occurrence; cursor commits: %d (%d runner(s), %.1f per runner-second)\n",
		float64(r.decoded)/float64(r.n), r.commits, len(r.sinks), float64(r.commits)/float64(len(r.sinks))/r.sinks[len(r.sinks)-1].elapsed.Seconds())
	if r.ingestRate > 0 {
		fmt.Printf("       ingest: %d at %.0f/s (asked %d/s) in %.2fs;", r.n, float64(r.n)/r.ingest.Seconds(), r.ingestRate, r.ingest.Seconds())
		for _, s := range r.sinks {
			fmt.Printf(" %s at head %.2fs after the last append, max lag %d records;", s.name, (s.elapsed - r.ingest).Seconds(), s.maxLag)
		}
		fmt.Println()
	}
}

func vlCol(v float64, format, mode string, vl bool) string {
	if !vl || mode != "both" && mode != "loki" {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

// measure runs the sinks of one mode from the head of the log: fresh
// destinations, fresh cursors, every record delivered, then checked.
func measure(st *store.Store, vlBin, dir string, o options, batch int, mode string) (result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	res := result{batch: batch, mode: mode, n: o.occurrences, ingestRate: o.ingestRate, vl: o.loki == "vl"}
	var base uint64 // drain: every sink reads the whole log from offset 1
	var live []*eventpipev1.Occurrence
	if o.ingestRate > 0 {
		_, base = st.Bounds() // live: the sinks follow from the head
		live, _ = generate(fmt.Sprintf("sinks-bench-b%d-%s-", batch, mode), o)
	}
	target := base + uint64(o.occurrences)
	runKafka, runLoki := mode == "both" || mode == "kafka", mode == "both" || mode == "loki"
	tag := fmt.Sprintf("b%d-%s", batch, mode)

	type started struct {
		name   string
		runner *sinks.Runner
		verify func(context.Context) (int, error)
		close  func()
	}
	var ss []started
	defer func() {
		for _, s := range ss {
			s.close()
		}
	}()

	// What every runner of this measurement reads: the collector's shared
	// source, or the store itself; either way the records the store decodes
	// are counted.
	counted := &countingStore{Store: st}
	var src sinks.Source = counted
	if o.source == "shared" {
		src = collector.SinkSource(counted)
	}
	var commits atomic.Int64

	// Destinations first (the VictoriaLogs child runs for every mode, so
	// the machine is the same in each; it is idle when only Kafka runs).
	var vl *vlProc
	var recv *lokiReceiver
	if o.loki == "vl" {
		var err error
		if vl, err = startVL(vlBin, filepath.Join(dir, "vl-"+tag)); err != nil {
			return res, err
		}
		defer vl.stop()
	} else {
		var err error
		if recv, err = startLokiReceiver(); err != nil {
			return res, err
		}
		defer recv.stop()
	}
	if runKafka {
		br, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0), kfake.AllowAutoTopicCreation())
		if err != nil {
			return res, fmt.Errorf("kfake: %w", err)
		}
		addr := br.ListenAddrs()[0]
		cfg := kafka.NewDefaultConfig()
		cfg.Conn.Brokers = []string{addr}
		cfg.Topic = "eventpipe-bench"
		cfg.Compression = kafka.CompressionSnappy
		cfg.CreateTopic = kafka.CreateTopicConfig{Enabled: true, Partitions: o.partitions, ReplicationFactor: 1}
		ks, err := kafka.New(cfg, nil, nil)
		if err != nil {
			br.Close()
			return res, fmt.Errorf("kafka sink: %w", err)
		}
		r, err := newRunner(st, src, &commits, "kafka-"+tag, base, batch, o, ks)
		if err != nil {
			_ = ks.Close()
			br.Close()
			return res, err
		}
		ss = append(ss, started{name: "kafka", runner: r,
			verify: func(ctx context.Context) (int, error) { return countTopic(ctx, addr, cfg.Topic) },
			close:  func() { _ = ks.Close(); br.Close() }})
	}
	if mode == "read" {
		r, err := newRunner(st, src, &commits, "read-"+tag, base, batch, o, discard{})
		if err != nil {
			return res, err
		}
		ss = append(ss, started{name: "read", runner: r,
			verify: func(context.Context) (int, error) { return o.occurrences, nil }, close: func() {}})
	}
	if runLoki {
		cfg := loki.NewDefaultConfig()
		cfg.Encoding = loki.EncodingProtobuf
		verify := recv.count
		if vl != nil {
			cfg.URL = vl.url() + "/insert/loki/api/v1/push"
			cfg.QueryParams = map[string]string{"disable_message_parsing": "1"}
			verify = vl.count
		} else {
			cfg.URL = recv.url()
		}
		ls, err := loki.New(cfg, nil, nil)
		if err != nil {
			return res, fmt.Errorf("loki sink: %w", err)
		}
		r, err := newRunner(st, src, &commits, "loki-"+tag, base, batch, o, ls)
		if err != nil {
			_ = ls.Close()
			return res, err
		}
		ss = append(ss, started{name: "loki", runner: r, verify: verify, close: func() { _ = ls.Close() }})
	}

	runtime.GC()
	res.loadBefore = loadavg1()
	var wg sync.WaitGroup
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make([]error, len(ss))
	counted.decoded.Store(0)
	commits.Store(0)
	start, cpu0, vl0 := time.Now(), sinktest.CPUTime(), vl.cpuTime()
	// A sink is done when it has handled every record (its cursor is
	// committed at the next commit_interval or when it stops).
	for i, s := range ss {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.runner.Run(rctx) }()
	}
	ingestDone := make(chan error, 1)
	if len(live) > 0 {
		go func() {
			for i := 0; i < len(live); i += o.appendBatch {
				if d := time.Until(start.Add(time.Duration(float64(i) / float64(o.ingestRate) * float64(time.Second)))); d > 0 {
					time.Sleep(d)
				}
				if err := appendBatch(st, live, i, o.appendBatch); err != nil {
					ingestDone <- err
					return
				}
			}
			res.ingest = time.Since(start)
			ingestDone <- nil
		}()
	} else {
		ingestDone <- nil
	}
	done := make([]time.Duration, len(ss))
	maxLag := make([]uint64, len(ss))
	for left := len(ss); left > 0; {
		if ctx.Err() != nil {
			stop()
			wg.Wait()
			rs := make([]*sinks.Runner, len(ss))
			for i, s := range ss {
				rs[i] = s.runner
			}
			return res, fmt.Errorf("timed out: %s", statuses(rs))
		}
		for i, s := range ss {
			stt := s.runner.Status()
			if stt.Handled >= base { // before Run loads the cursor, Status shows 0
				maxLag[i] = max(maxLag[i], stt.LagRecords)
			}
			if done[i] == 0 && stt.Handled >= target {
				done[i] = time.Since(start)
				left--
			}
		}
		time.Sleep(500 * time.Microsecond)
	}
	if err := <-ingestDone; err != nil {
		stop()
		wg.Wait()
		return res, fmt.Errorf("ingest: %w", err)
	}
	res.procCPU, res.vlCPU = sinktest.CPUTime()-cpu0, vl.cpuTime()-vl0
	res.decoded, res.commits = counted.decoded.Load(), commits.Load()
	res.loadAt = loadavg1()
	stop()
	wg.Wait()
	for i, s := range ss {
		if errs[i] != nil {
			return res, fmt.Errorf("%s runner: %w", s.name, errs[i])
		}
		stt := s.runner.Status()
		if stt.Sent != uint64(o.occurrences) || stt.Failed != 0 || stt.Lost != 0 {
			return res, fmt.Errorf("%s: status %+v", s.name, stt)
		}
		got, err := s.verify(ctx)
		if err != nil {
			return res, fmt.Errorf("%s: verify: %w", s.name, err)
		}
		if got != o.occurrences {
			return res, fmt.Errorf("%s: destination holds %d records, want %d", s.name, got, o.occurrences)
		}
		res.sinks = append(res.sinks, sinkResult{name: s.name, elapsed: done[i], status: stt, maxLag: maxLag[i]})
	}
	return res, nil
}

// countingStore counts the records the store decodes for the runners.
type countingStore struct {
	*store.Store
	decoded atomic.Int64
}

func (c *countingStore) Read(ctx context.Context, from uint64, max int) ([]sinks.Record, uint64, error) {
	recs, skipped, err := c.Store.Read(ctx, from, max)
	c.decoded.Add(int64(len(recs)))
	return recs, skipped, err
}

// countingCursor counts durable cursor commits.
type countingCursor struct {
	sinks.Cursor
	n *atomic.Int64
}

func (c countingCursor) Commit(off uint64) error {
	c.n.Add(1)
	return c.Cursor.Commit(off)
}

// discard is a Pusher that delivers nothing: with it a runner measures the
// log read (segment read, CRC, record decode) and the runner's own work.
type discard struct{}

func (discard) Push(context.Context, []sinks.Record) error { return nil }

func statuses(rs []*sinks.Runner) string {
	var b strings.Builder
	for _, r := range rs {
		s := r.Status()
		fmt.Fprintf(&b, "[%s cursor %d sent %d err %q] ", s.Name, s.Cursor, s.Sent, s.LastError)
	}
	return b.String()
}

// newRunner builds a runner reading src whose cursor (in st) starts at from
// (the head of the log when the sinks follow a live ingest).
func newRunner(st *store.Store, src sinks.Source, commits *atomic.Int64, name string, from uint64, batch int, o options, p sinks.Pusher) (*sinks.Runner, error) {
	c, err := st.Cursor(name)
	if err != nil {
		return nil, fmt.Errorf("cursor %s: %w", name, err)
	}
	cur := countingCursor{Cursor: c, n: commits}
	if from > 0 {
		if err := cur.Commit(from); err != nil {
			return nil, fmt.Errorf("cursor %s: %w", name, err)
		}
	}
	rc := sinks.NewDefaultRunnerConfig(name)
	rc.Batch.MaxRecords = batch
	rc.Batch.MaxWait = o.maxWait
	rc.CommitInterval = o.commitEvery
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := sinks.NewRunner(rc, p, src, cur, logger, nil)
	if err != nil {
		return nil, fmt.Errorf("runner %s: %w", name, err)
	}
	return r, nil
}

// countTopic sums, over the topic's partitions, the offsets between the
// first and the end: the number of records the broker holds.
func countTopic(ctx context.Context, addr, topic string) (int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return 0, err
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, err
	}
	total := 0
	ends.Each(func(o kadm.ListedOffset) {
		first, _ := starts.Lookup(o.Topic, o.Partition)
		total += int(o.Offset - first.Offset)
	})
	return total, nil
}

// vlProc is a victoria-logs child on a loopback port, started with the same
// flags as testenv/victorialogs (whose Start needs a testing.TB).
type vlProc struct {
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
	log    *os.File
}

func startVL(bin, dir string) (*vlProc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lf, err := os.Create(filepath.Join(dir, "victoria-logs.log"))
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			lf.Close()
			return nil, err
		}
		addr := l.Addr().String()
		l.Close()
		cmd := exec.Command(bin, "-storageDataPath="+filepath.Join(dir, "data"), "-httpListenAddr="+addr,
			"-loggerLevel=WARN", "-retentionPeriod=100y")
		cmd.Stdout, cmd.Stderr = lf, lf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			lf.Close()
			return nil, fmt.Errorf("exec %s: %w", bin, err)
		}
		p := &vlProc{addr: addr, cmd: cmd, exited: make(chan struct{}), log: lf}
		go func() { _ = cmd.Wait(); close(p.exited) }()
		if lastErr = p.waitHealthy(20 * time.Second); lastErr == nil {
			return p, nil
		}
		p.kill()
	}
	lf.Close()
	return nil, fmt.Errorf("victoria-logs: %w", lastErr)
}

func (p *vlProc) url() string { return "http://" + p.addr }

func (p *vlProc) waitHealthy(timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-p.exited:
			return errors.New("exited early")
		default:
		}
		if resp, err := c.Get(p.url() + "/health"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("not healthy after " + timeout.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *vlProc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

func (p *vlProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.kill()
	}
	p.log.Close()
}

// cpuTime reads utime+stime of the child from /proc/<pid>/stat (clock
// ticks of 10 ms).
func (p *vlProc) cpuTime() time.Duration {
	if p == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	rest := string(b)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stm, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+stm) * 10 * time.Millisecond
}

// count flushes and asks VictoriaLogs how many entries it holds.
func (p *vlProc) count(ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url()+"/internal/force_flush", nil)
	if err != nil {
		return 0, err
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	form := url.Values{"query": {"* | stats count() as n"}}
	req, err = http.NewRequestWithContext(ctx, http.MethodPost, p.url()+"/select/logsql/query", strings.NewReader(form.Encode()))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("count query: status %d: %s", resp.StatusCode, body)
	}
	// One JSON line: {"n":"200000"}
	s := string(body)
	i := strings.Index(s, `"n":"`)
	if i < 0 {
		return 0, fmt.Errorf("count query: unexpected answer %q", s)
	}
	s = s[i+5:]
	return strconv.Atoi(s[:strings.IndexByte(s, '"')])
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func loadavg1() string { return strings.Fields(loadavg() + " ?")[0] }
