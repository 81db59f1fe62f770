// Command collector-bench measures the collector end to end over gRPC on
// loopback: ingest-to-acknowledge throughput and latency with the durable
// log fsyncing (the production setting), and follow fan-out to many live
// subscribers. It runs a real collector in-process (store in a temp dir,
// token auth) and real gRPC clients; both share the machine's cores.
//
//	go run ./bench/collector                      # defaults used in bench/collector.md
//	go run ./bench/collector -occurrences 1000000 -agents 4 -batch 1000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/file"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

const (
	agentToken  = "bench-agent-token-0123456789"
	readerToken = "bench-reader-token-0123456789"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "collector-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	occurrences, batch, agents, window int
	subscribers, fanoutOccurrences     int
	fsync, fileSink                    bool
	dir                                string
}

func run() error {
	var o options
	flag.IntVar(&o.occurrences, "occurrences", 500_000, "occurrences to ingest in the throughput phase")
	flag.IntVar(&o.batch, "batch", 500, "occurrences per batch")
	flag.IntVar(&o.agents, "agents", 1, "concurrent Ship streams (agents)")
	flag.IntVar(&o.window, "window", 8, "batches in flight per stream (collector grpc.ingest_pipeline is set to match)")
	flag.IntVar(&o.subscribers, "subscribers", 100, "live Follow subscribers in the fan-out phase (0 skips it)")
	flag.IntVar(&o.fanoutOccurrences, "fanout-occurrences", 50_000, "occurrences ingested during the fan-out phase")
	flag.BoolVar(&o.fsync, "fsync", true, "fsync the log (durability on)")
	flag.BoolVar(&o.fileSink, "file-sink", false, "also run the file sink (JSON lines, fsync) during ingest")
	flag.StringVar(&o.dir, "dir", "", "data directory (default: a new temp dir, removed after)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
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

	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "collector-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	tokens := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokens, []byte(fmt.Sprintf("- {token: %s, name: bench-agent, role: agent, clusters: [\"*\"]}\n- {token: %s, name: bench-reader, role: reader, workspaces: [\"*\"]}\n", agentToken, readerToken)), 0o600); err != nil {
		return err
	}
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen, cfg.HTTP.Listen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.GRPC.IngestPipeline = o.window
	cfg.Auth.TokensFile = tokens
	cfg.Store.Dir = filepath.Join(dir, "log")
	cfg.Store.Fsync = o.fsync
	cfg.Follow.MaxTail = 1
	if o.fileSink {
		fc := file.NewDefaultConfig()
		fc.Path = filepath.Join(dir, "events.jsonl")
		fc.MaxBytes = 1 << 30
		d := sinks.NewDefaultRunnerConfig("file")
		d.Batch.MaxRecords = 5000
		cfg.Sinks = []collector.SinkConfig{{Name: "file", Type: collector.SinkFile, File: &fc, Batch: d.Batch, Retry: d.Retry}}
	}
	c, err := collector.New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "collector:", err)
		}
	}()

	fmt.Printf("machine: %d CPUs (GOMAXPROCS %d), %s; fsync=%v file_sink=%v; load average %s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), o.fsync, o.fileSink, loadAvg())

	cpu0 := sinktest.CPUTime()
	res, err := ingest(ctx, c.GRPCAddr(), o, o.occurrences, "tp")
	if err != nil {
		return fmt.Errorf("ingest phase: %w", err)
	}
	cpu := sinktest.CPUTime() - cpu0
	fmt.Printf("ingest: %d occurrences in %d batches of %d over %d stream(s), window %d: %.2fs, %.0f occurrences/s; ack latency p50 %s p99 %s max %s\n",
		res.occurrences, res.batches, o.batch, o.agents, o.window, res.elapsed.Seconds(), float64(res.occurrences)/res.elapsed.Seconds(),
		res.p(0.50), res.p(0.99), res.p(1))
	fmt.Printf("ingest CPU (collector + bench clients, this process): %.2fs = %.1fµs per occurrence; load average before/after: %s\n",
		cpu.Seconds(), float64(cpu.Microseconds())/float64(res.occurrences), loadAvg())

	if o.subscribers > 0 {
		if err := fanout(ctx, c.GRPCAddr(), o); err != nil {
			return fmt.Errorf("fan-out phase: %w", err)
		}
	}
	return nil
}

type ingestResult struct {
	occurrences, batches int
	// matching: occurrences of the generator's gateway (what a gateway
	// subscriber receives).
	matching int
	elapsed  time.Duration
	lat      []time.Duration
}

func (r ingestResult) p(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	i := int(q * float64(len(r.lat)-1))
	return r.lat[i].Round(10 * time.Microsecond)
}

func dial(addr, token string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearer(token)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// ingest ships total occurrences over o.agents streams, each with o.window
// batches in flight, and measures each batch from Send to its Ack.
func ingest(ctx context.Context, addr string, o options, total int, prefix string) (ingestResult, error) {
	perAgent := total / o.agents / o.batch
	var mu sync.Mutex
	var res ingestResult
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, o.agents)
	for a := range o.agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat, matching, err := agent(ctx, addr, o, a, perAgent, prefix)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			res.lat = append(res.lat, lat...)
			res.matching += matching
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return res, err
	}
	res.elapsed = time.Since(start)
	res.batches = perAgent * o.agents
	res.occurrences = res.batches * o.batch
	slices.Sort(res.lat)
	return res, nil
}

func agent(ctx context.Context, addr string, o options, id, batches int, prefix string) ([]time.Duration, int, error) {
	conn, err := dial(addr, agentToken)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close()
	st, err := eventpipev1.NewIngestClient(conn).Ship(ctx)
	if err != nil {
		return nil, 0, err
	}
	// A pool of realistic batches, re-sent with fresh event_ids (the proto
	// is serialised by Send, so mutating it afterwards is safe).
	gen := sinktest.NewGenerator(uint64(id+1), "")
	pool := make([][]*eventpipev1.Occurrence, 16)
	match := make([]int, len(pool))
	for i := range pool {
		pool[i] = gen.Batch(o.batch)
		for _, oc := range pool[i] {
			if oc.GetSandbox().GetGatewayId() == sinktest.SeedGatewayID && oc.GetSandbox().GetId() != "" {
				match[i]++
			}
		}
	}
	matching := 0
	sent := make([]time.Time, batches+1)
	window := make(chan struct{}, o.window)
	lat := make([]time.Duration, 0, batches)
	recvDone := make(chan error, 1)
	go func() {
		for range batches {
			ack, err := st.Recv()
			if err != nil {
				recvDone <- fmt.Errorf("recv ack: %w", err)
				return
			}
			lat = append(lat, time.Since(sent[ack.GetSeq()]))
			if int(ack.GetStored()) != o.batch {
				recvDone <- fmt.Errorf("batch %d: stored %d of %d", ack.GetSeq(), ack.GetStored(), o.batch)
				return
			}
			<-window
		}
		recvDone <- nil
	}()
	for n := 1; n <= batches; n++ {
		select {
		case window <- struct{}{}:
		case err := <-recvDone:
			return nil, 0, err
		}
		occs := pool[n%len(pool)]
		matching += match[n%len(pool)]
		for i, oc := range occs {
			oc.EventId = fmt.Sprintf("%s-%d-%d-%d", prefix, id, n, i)
		}
		sent[n] = time.Now()
		if err := st.Send(&eventpipev1.Batch{Seq: uint64(n), Cluster: "bench", Stream: "events", ResourceVersion: fmt.Sprint(n), Occurrences: occs}); err != nil {
			return nil, 0, fmt.Errorf("send: %w", err)
		}
	}
	err = <-recvDone
	st.CloseSend()
	return lat, matching, err
}

// fanout starts o.subscribers live Follow streams on the generator's
// gateway (every attributed occurrence matches), ingests, and measures how
// long until every subscriber has received every matching occurrence.
func fanout(ctx context.Context, addr string, o options) error {
	conn, err := dial(addr, readerToken)
	if err != nil {
		return err
	}
	defer conn.Close()
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	var received atomic.Int64
	type sub struct {
		n    int
		last time.Time
		err  error
	}
	subs := make([]*sub, o.subscribers)
	var wg sync.WaitGroup
	ready := make(chan struct{}, o.subscribers)
	for i := range subs {
		subs[i] = &sub{}
		s := subs[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := eventpipev1.NewFollowClient(conn).Follow(fctx, &eventpipev1.FollowRequest{GatewayId: sinktest.SeedGatewayID})
			if err != nil {
				s.err = err
				ready <- struct{}{}
				return
			}
			_, s.err = st.Header()
			ready <- struct{}{}
			for {
				if _, err := st.Recv(); err != nil {
					if !errors.Is(err, io.EOF) && fctx.Err() == nil {
						s.err = err
					}
					return
				}
				s.n++
				s.last = time.Now()
				received.Add(1)
			}
		}()
	}
	for range subs {
		<-ready
	}
	for _, s := range subs {
		if s.err != nil {
			return s.err
		}
	}
	start := time.Now()
	res, err := ingest(ctx, addr, options{batch: o.batch, agents: 1, window: o.window}, o.fanoutOccurrences, "fan")
	if err != nil {
		return err
	}
	ingestDone := time.Since(start)
	perSub := res.matching
	deadline := time.Now().Add(5 * time.Minute)
	for received.Load() < int64(perSub*o.subscribers) {
		if time.Now().After(deadline) {
			return fmt.Errorf("after 5 minutes subscribers received %d of %d", received.Load(), perSub*o.subscribers)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // anything beyond would be a bug
	stop()
	wg.Wait()
	var lastAt time.Time
	for i, s := range subs {
		if s.n != perSub {
			return fmt.Errorf("subscriber %d received %d, want %d", i, s.n, perSub)
		}
		if s.err != nil {
			return fmt.Errorf("subscriber %d: %w", i, s.err)
		}
		if s.last.After(lastAt) {
			lastAt = s.last
		}
	}
	all := lastAt.Sub(start)
	fmt.Printf("fan-out: %d subscribers x %d matching occurrences (of %d ingested, ingest took %.2fs at %.0f/s, ack p99 %s): all delivered after %.2fs, %.0f deliveries/s in total, %.0f/s per subscriber\n",
		o.subscribers, perSub, res.occurrences, ingestDone.Seconds(), float64(res.occurrences)/ingestDone.Seconds(), res.p(0.99),
		all.Seconds(), float64(perSub*o.subscribers)/all.Seconds(), float64(perSub)/all.Seconds())
	return nil
}

// loadAvg is the 1-minute load average: the machine is shared, so the
// figures say how busy it was.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
