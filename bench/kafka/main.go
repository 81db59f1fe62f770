// Command kafka-bench measures the collector in Kafka mode (log: kafka,
// issue 14) on a three-broker kfake cluster in this process:
//
//   - ingest: synthetic agents ship batches and time each one from its
//     send to its acknowledgement, which in Kafka mode comes only after
//     Kafka acknowledged every record (acks=all) and the stream's cursor;
//     with 1, 2, 3 ... collector replicas (-replicas), the agents spread
//     over them as a Service would;
//   - lag: a live ingest paced at -rate occurrences/s while one sink
//     consumer group (backbone.GroupSinks, as each replica runs it, with a
//     counting sink) follows the backbone topic; sampled every 500 ms: the
//     group's lag as Kafka sees it (end offsets less committed offsets),
//     the records produced but not yet delivered, and ingest-to-delivery
//     latency.
//
// -target collector runs real collectors (collector.New with log: kafka,
// token auth, gRPC on loopback) and ships over the real Ingest API;
// -target writer calls backbone.Writer.Append directly (the write path
// without gRPC). Everything, brokers included, shares this machine's
// cores: the figures bound eventpipe's own overhead, not a Kafka
// cluster's (bench/kafka.md).
//
//	go run ./bench/kafka                                    # the runs of bench/kafka.md
//	go run ./bench/kafka -phase ingest -replicas 1,3 -occurrences 300000
//	go run ./bench/kafka -phase lag -replicas 3 -rate 50000 -duration 30s
//	go run ./bench/kafka -phase lag -replicas 1,3 -rate 3000 -duration 15s -sink kafka   # the archive producer, transactions off and on
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/backbone"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/kafka"
	"github.com/eventpipe/eventpipe/sinks/kafka/kafkatest"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kafka-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	target      string
	phase       string
	replicas    []int
	agents      int
	batch       int
	window      int
	occurrences int
	partitions  int
	rate        int
	duration    time.Duration
	runs        int
	txn         bool // backbone.transactions.enabled for this run
	txnModes    []bool
	sink        string // the lag phase's sink: counting or kafka
}

func run() error {
	var o options
	var replicas string
	flag.StringVar(&o.target, "target", "collector", "collector: real collectors over gRPC; writer: backbone.Writer.Append directly")
	flag.StringVar(&o.phase, "phase", "all", "ingest, lag or all")
	flag.StringVar(&replicas, "replicas", "1,2,3", "collector replica counts to measure, comma-separated")
	flag.IntVar(&o.agents, "agents", 6, "agent streams (each its own cluster), spread round-robin over the replicas")
	flag.IntVar(&o.batch, "batch", 500, "occurrences per batch")
	flag.IntVar(&o.window, "window", 8, "batches in flight per agent (the collector's grpc.ingest_pipeline)")
	flag.IntVar(&o.occurrences, "occurrences", 300_000, "occurrences per ingest run")
	flag.IntVar(&o.partitions, "partitions", 12, "partitions of the backbone topic")
	flag.IntVar(&o.rate, "rate", 50_000, "target ingest rate of the lag phase (occurrences/s)")
	flag.DurationVar(&o.duration, "duration", 30*time.Second, "length of the lag phase's live ingest")
	flag.IntVar(&o.runs, "runs", 3, "runs of each measurement")
	txnModes := flag.String("transactions", "off,on", "backbone.transactions.enabled values to measure, comma-separated (each run of each replica count goes through them in turn)")
	flag.StringVar(&o.sink, "sink", "counting", "the lag phase's sink: counting (counts in memory) or kafka (the real Kafka sink to an archive topic on the same brokers, transactional with the backbone's transactions)")
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
	for _, f := range strings.Split(replicas, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-replicas %q: want counts >= 1", replicas)
		}
		o.replicas = append(o.replicas, n)
	}
	for _, f := range strings.Split(*txnModes, ",") {
		switch strings.TrimSpace(f) {
		case "on":
			o.txnModes = append(o.txnModes, true)
		case "off":
			o.txnModes = append(o.txnModes, false)
		default:
			return fmt.Errorf("-transactions %q: want on and/or off", *txnModes)
		}
	}
	if o.sink != "counting" && o.sink != "kafka" {
		return fmt.Errorf("-sink %q: want counting or kafka", o.sink)
	}
	if o.agents < 1 || o.batch < 1 || o.window < 1 || o.runs < 1 {
		return fmt.Errorf("-agents, -batch, -window and -runs must be at least 1")
	}
	fmt.Printf("machine: %d CPUs (GOMAXPROCS %d), %s; kfake 3 brokers, %d partitions, replication 3; target %s; load %s\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), o.partitions, o.target, loadAvg())
	// Runs go round the replica counts (1, 2, 3, 1, 2, 3, ...), so a change
	// of the machine's load during the set falls on every count alike.
	for _, phase := range []string{"ingest", "lag"} {
		if o.phase != phase && o.phase != "all" {
			continue
		}
		for i := 1; i <= o.runs; i++ {
			for _, r := range o.replicas {
				for _, txn := range o.txnModes {
					run := ingestRun
					if phase == "lag" {
						run = lagRun
					}
					o.txn = txn
					if err := run(o, r, i); err != nil {
						return fmt.Errorf("%s, %d replica(s), transactions %v, run %d: %w", phase, r, txn, i, err)
					}
				}
			}
		}
	}
	return nil
}

// env is one run's brokers and collector replicas.
type env struct {
	cluster  *kfake.Cluster
	cfg      backbone.Config
	replicas []replica
	stop     []func()
}

// replica is one collector replica as an agent sees it: something that
// acknowledges a batch once Kafka holds it.
type replica interface {
	// ship opens one agent stream; send/recv as Ingest.Ship.
	ship(ctx context.Context) (stream, error)
}

type stream interface {
	send(b *eventpipev1.Batch) error
	// recv returns the next acknowledged batch's seq and stored count.
	recv() (seq uint64, stored int, err error)
	close()
}

func newEnv(o options, replicas int) (*env, error) {
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		return nil, err
	}
	e := &env{cluster: c}
	e.stop = append(e.stop, c.Close)
	cfg := backbone.NewDefaultConfig()
	cfg.Conn.Brokers = c.ListenAddrs()
	cfg.CreateTopics = true
	cfg.Partitions = o.partitions
	cfg.ReplicationFactor = 3
	cfg.Transactions.Enabled = o.txn
	e.cfg = cfg
	for i := range replicas {
		var r replica
		var stop func()
		var err error
		switch o.target {
		case "writer":
			wcfg := cfg
			if wcfg.Transactions.Enabled {
				wcfg.Transactions.ID = fmt.Sprintf("bench-writer-%d", i)
			}
			r, stop, err = startWriter(wcfg)
		case "collector":
			r, stop, err = startCollector(cfg, o, i)
		default:
			err = fmt.Errorf("-target %q: collector or writer", o.target)
		}
		if err != nil {
			e.close()
			return nil, fmt.Errorf("replica %d: %w", i, err)
		}
		e.replicas = append(e.replicas, r)
		e.stop = append(e.stop, stop)
	}
	return e, nil
}

func (e *env) close() {
	for i := len(e.stop) - 1; i >= 0; i-- {
		e.stop[i]()
	}
}

// writerReplica is backbone.Writer as the collector's ingest uses it: one
// Append per batch, the batch's cursor written after its records.
type writerReplica struct{ w *backbone.Writer }

func startWriter(cfg backbone.Config) (replica, func(), error) {
	w, err := backbone.NewWriter(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.CheckTopics(ctx); err != nil {
		w.Close()
		return nil, nil, err
	}
	return writerReplica{w}, w.Close, nil
}

type ack struct {
	seq    uint64
	stored int
	err    error
}

type writerStream struct {
	w    *backbone.Writer
	ctx  context.Context
	acks chan ack
	wg   sync.WaitGroup
}

func (r writerReplica) ship(ctx context.Context) (stream, error) {
	return &writerStream{w: r.w, ctx: ctx, acks: make(chan ack, 1024)}, nil
}

// send appends in its own goroutine: the caller's window bounds how many
// are in flight, as the collector's ingest_pipeline does.
func (s *writerStream) send(b *eventpipev1.Batch) error {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		res, err := s.w.Append(s.ctx, b.GetCluster(), b.GetStream(), b.GetResourceVersion(), b.GetOccurrences())
		s.acks <- ack{seq: b.GetSeq(), stored: res.Stored, err: err}
	}()
	return nil
}

func (s *writerStream) recv() (uint64, int, error) {
	a := <-s.acks
	return a.seq, a.stored, a.err
}

func (s *writerStream) close() { s.wg.Wait() }

// result is one ingest's figures.
type result struct {
	occurrences int
	elapsed     time.Duration
	lat         []time.Duration
	cpu         time.Duration
}

func (r result) p(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.lat[int(q*float64(len(r.lat)-1))].Round(10 * time.Microsecond)
}

// agentPlan says what one agent ships: batches of o.batch, at most
// o.window in flight, and (paced) not before start + n*interval.
type agentPlan struct {
	id       int
	batches  int
	interval time.Duration // 0: as fast as acknowledgements allow
	start    time.Time
	// acked is called with each acknowledged batch's size.
	acked func(n int)
}

// shipAgent runs one agent stream against r and returns each batch's
// send-to-ack latency.
func shipAgent(ctx context.Context, r replica, o options, p agentPlan) ([]time.Duration, error) {
	st, err := r.ship(ctx)
	if err != nil {
		return nil, err
	}
	defer st.close()
	gen := sinktest.NewGenerator(uint64(p.id+1), "")
	pool := make([][]*eventpipev1.Occurrence, 8)
	for i := range pool {
		pool[i] = gen.Batch(o.batch)
	}
	sent := make([]time.Time, p.batches+1)
	var sentMu sync.Mutex
	window := make(chan struct{}, o.window)
	lat := make([]time.Duration, 0, p.batches)
	recvDone := make(chan error, 1)
	go func() {
		for range p.batches {
			seq, stored, err := st.recv()
			if err != nil {
				recvDone <- fmt.Errorf("agent %d: ack: %w", p.id, err)
				return
			}
			sentMu.Lock()
			lat = append(lat, time.Since(sent[seq]))
			sentMu.Unlock()
			if stored != o.batch {
				recvDone <- fmt.Errorf("agent %d: batch %d: stored %d of %d", p.id, seq, stored, o.batch)
				return
			}
			if p.acked != nil {
				p.acked(stored)
			}
			<-window
		}
		recvDone <- nil
	}()
	cluster := fmt.Sprintf("bench-%d", p.id)
	for n := 1; n <= p.batches; n++ {
		if p.interval > 0 {
			if d := time.Until(p.start.Add(time.Duration(n-1) * p.interval)); d > 0 {
				time.Sleep(d)
			}
		}
		select {
		case window <- struct{}{}:
		case err := <-recvDone:
			return nil, err
		}
		occs := pool[n%len(pool)]
		now := timestamppb.Now()
		for i, oc := range occs {
			oc.EventId = fmt.Sprintf("%s/%d/%d", cluster, n, i)
			oc.Cluster = cluster
			oc.ObservedAt = now // the lag phase's sink measures delivery from here
		}
		sentMu.Lock()
		sent[n] = time.Now()
		sentMu.Unlock()
		if err := st.send(&eventpipev1.Batch{Seq: uint64(n), Cluster: cluster, Stream: "events", ResourceVersion: strconv.Itoa(n), Occurrences: occs}); err != nil {
			return nil, fmt.Errorf("agent %d: send: %w", p.id, err)
		}
	}
	return lat, <-recvDone
}

// shipAll runs o.agents agents, agent i on replica i % len(replicas).
func shipAll(ctx context.Context, e *env, o options, batchesPerAgent int, interval time.Duration, acked func(int)) (result, error) {
	var res result
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, o.agents)
	cpu0 := sinktest.CPUTime()
	start := time.Now()
	for a := range o.agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat, err := shipAgent(ctx, e.replicas[a%len(e.replicas)], o, agentPlan{id: a, batches: batchesPerAgent, interval: interval, start: start, acked: acked})
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			res.lat = append(res.lat, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return res, err
	}
	res.elapsed = time.Since(start)
	res.cpu = sinktest.CPUTime() - cpu0
	res.occurrences = batchesPerAgent * o.agents * o.batch
	slices.Sort(res.lat)
	return res, nil
}

func ingestRun(o options, replicas, run int) error {
	e, err := newEnv(o, replicas)
	if err != nil {
		return err
	}
	defer e.close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	before := loadAvg()
	res, err := shipAll(ctx, e, o, max(o.occurrences/o.agents/o.batch, 1), 0, nil)
	if err != nil {
		return err
	}
	end, err := topicTotal(ctx, e.cfg)
	if err != nil {
		return err
	}
	if end != int64(res.occurrences) {
		return fmt.Errorf("the backbone topic holds %d records, %d were acknowledged", end, res.occurrences)
	}
	fmt.Printf("ingest replicas=%d transactions=%v run=%d: %d occurrences, %d agents, batch %d, window %d: %.2fs, %.0f occurrences/s; ack p50 %s p99 %s max %s; CPU %.1f µs/occurrence (all in this process); topic holds %d; load %s -> %s\n",
		replicas, o.txn, run, res.occurrences, o.agents, o.batch, o.window, res.elapsed.Seconds(), float64(res.occurrences)/res.elapsed.Seconds(),
		res.p(0.50), res.p(0.99), res.p(1), float64(res.cpu.Microseconds())/float64(res.occurrences), end, before, loadAvg())
	return nil
}

// topicTotal is the number of occurrences in the backbone topic, read as
// a read_committed consumer reads them.

func topicTotal(ctx context.Context, cfg backbone.Config) (int64, error) {
	// Read as a read_committed consumer: with transactions, markers take
	// offsets too, so the end offsets would overcount.
	var n int64
	err := kafkatest.EachRecord(ctx, []kgo.Opt{kgo.SeedBrokers(cfg.Conn.Brokers...), kgo.FetchIsolationLevel(kgo.ReadCommitted())},
		cfg.Topic, func(*kgo.Record) { n++ })
	return n, err
}

// countingSink delivers nothing anywhere: it counts each occurrence by its
// event_id ("bench-<agent>/<batch>/<i>", see shipAgent), so a loss or a
// duplicate shows, and records how long after its batch was sent each
// occurrence reached it.
type countingSink struct {
	batches, batch int // per agent; occurrences per batch
	delivered      atomic.Int64
	mu             sync.Mutex
	seen           []uint8 // deliveries per occurrence
	bad            int     // event_ids the harness did not send
	lat            []time.Duration
}

func newCountingSink(agents, batches, batch int) *countingSink {
	return &countingSink{batches: batches, batch: batch, seen: make([]uint8, agents*batches*batch)}
}

func (s *countingSink) index(id string) (int, bool) {
	f := strings.Split(strings.TrimPrefix(id, "bench-"), "/")
	if len(f) != 3 {
		return 0, false
	}
	a, err1 := strconv.Atoi(f[0])
	n, err2 := strconv.Atoi(f[1])
	i, err3 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil || err3 != nil || n < 1 || n > s.batches || i < 0 || i >= s.batch {
		return 0, false
	}
	x := (a*s.batches+n-1)*s.batch + i
	return x, x >= 0 && x < len(s.seen)
}

func (s *countingSink) Push(_ context.Context, batch []sinks.Record) error {
	now := time.Now()
	s.mu.Lock()
	for _, r := range batch {
		s.lat = append(s.lat, now.Sub(r.Occurrence.GetObservedAt().AsTime()))
		if x, ok := s.index(r.Occurrence.GetEventId()); ok {
			if s.seen[x] < 255 {
				s.seen[x]++
			}
		} else {
			s.bad++
		}
	}
	s.mu.Unlock()
	s.delivered.Add(int64(len(batch)))
	return nil
}

// check counts the occurrences never delivered and those delivered more
// than once.
func (s *countingSink) check() (missing, duplicated, bad int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.seen {
		switch {
		case c == 0:
			missing++
		case c > 1:
			duplicated++
		}
	}
	return missing, duplicated, s.bad
}

// countingKafka is the real Kafka sink, counted: a batch counts as
// delivered when the sink acknowledged it (with transactions, when its
// transaction, offset included, committed), so the exactly-once check and
// the ingest-to-sink latency cover the archive producer.
type countingKafka struct {
	*kafka.Sink
	count *countingSink
}

func (k *countingKafka) Push(ctx context.Context, batch []sinks.Record) error {
	if err := k.Sink.Push(ctx, batch); err != nil {
		return err
	}
	return k.count.Push(ctx, batch)
}

// Transactional keeps GroupSinks' consume-transform-produce path.
func (k *countingKafka) Transactional(src sinks.TxnSource) (sinks.TxnPusher, error) {
	tp, err := k.Sink.Transactional(src)
	if err != nil {
		return nil, err
	}
	return &countingTxn{TxnPusher: tp, count: k.count}, nil
}

type countingTxn struct {
	sinks.TxnPusher
	count *countingSink
}

func (t *countingTxn) Push(ctx context.Context, batch []sinks.Record) error {
	if err := t.TxnPusher.Push(ctx, batch); err != nil {
		return err
	}
	return t.count.Push(ctx, batch)
}

func lagRun(o options, replicas, run int) error {
	e, err := newEnv(o, replicas)
	if err != nil {
		return err
	}
	defer e.close()
	ctx, cancel := context.WithTimeout(context.Background(), o.duration+10*time.Minute)
	defer cancel()

	// One sink, one consumer group, one member per replica.
	batches := max(int(float64(o.rate)*o.duration.Seconds())/o.agents/o.batch, 1)
	sink := newCountingSink(o.agents, batches, o.batch)
	rc := sinks.NewDefaultRunnerConfig("bench")
	rc.Batch.MaxRecords = 1000
	rc.Batch.MaxWait = 50 * time.Millisecond
	gctx, gstop := context.WithCancel(ctx)
	var gwg sync.WaitGroup
	var regs []*prometheus.Registry
	for range replicas {
		reg := prometheus.NewRegistry()
		regs = append(regs, reg)
		var pusher sinks.Pusher = sink
		if o.sink == "kafka" {
			// One Kafka sink per replica, as each collector has its own.
			kc := kafka.NewDefaultConfig()
			kc.Conn.Brokers, kc.Topic = e.cfg.Conn.Brokers, "bench.archive"
			kc.CreateTopic.Enabled = true
			ks, err := kafka.New(kc, nil, reg)
			if err != nil {
				gstop()
				return err
			}
			defer ks.Close()
			pusher = &countingKafka{Sink: ks, count: sink}
		}
		g, err := backbone.NewGroupSinks(e.cfg, []backbone.GroupSink{{Runner: rc, Pusher: pusher}}, nil, reg)
		if err != nil {
			gstop()
			return err
		}
		gwg.Add(1)
		go func() { defer gwg.Done(); _ = g.Run(gctx) }()
	}
	defer func() { gstop(); gwg.Wait() }()
	group := e.cfg.GroupName(backbone.SinkConsumer(rc.Name))

	cl, err := kgo.NewClient(kgo.SeedBrokers(e.cfg.Conn.Brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	committedLag := func() (int64, int64, error) {
		sctx, c := context.WithTimeout(ctx, 5*time.Second)
		defer c()
		ends, err := adm.ListEndOffsets(sctx, e.cfg.Topic)
		if err != nil {
			return 0, 0, err
		}
		offs, err := adm.FetchOffsets(sctx, group)
		if err != nil {
			return 0, 0, err
		}
		var end, lag int64
		ends.Each(func(lo kadm.ListedOffset) {
			end += lo.Offset
			c := int64(0)
			if or, ok := offs.Lookup(lo.Topic, lo.Partition); ok && or.At >= 0 {
				c = or.At
			}
			lag += lo.Offset - c
		})
		return end, lag, nil
	}

	// Ingest starts once the group is stable with every replica a member,
	// so the figures are of following, not of joining.
	for deadline := time.Now().Add(2 * time.Minute); ; {
		gs, err := adm.DescribeGroups(ctx, group)
		if err == nil {
			if g, ok := gs[group]; ok && g.State == "Stable" && len(g.Members) == replicas {
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consumer group %s not stable with %d members after 2 minutes (%v)", group, replicas, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var acked atomic.Int64
	interval := time.Duration(float64(time.Second) * float64(o.batch*o.agents) / float64(o.rate))
	before := loadAvg()
	type sample struct {
		at                     time.Duration
		produced, committedLag int64
		undelivered, delivered int64
	}
	var samples []sample
	sampleDone := make(chan struct{})
	stopSampling := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(sampleDone)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
			}
			end, lag, err := committedLag()
			if err != nil {
				continue
			}
			d := sink.delivered.Load()
			samples = append(samples, sample{at: time.Since(start), produced: end, committedLag: lag, undelivered: end - d, delivered: d})
		}
	}()
	res, err := shipAll(ctx, e, o, batches, interval, func(n int) { acked.Add(int64(n)) })
	if err != nil {
		close(stopSampling)
		<-sampleDone
		return err
	}
	ingestEnd := time.Since(start)
	total := int64(res.occurrences)
	// Drain: until every occurrence is delivered and committed. With
	// transactions each partition's log ends with a commit marker, which
	// takes an offset that no record follows, so the committed offset can
	// stay one short of the end per partition.
	drainStart := time.Now()
	markers := int64(0)
	if o.txn {
		markers = int64(o.partitions)
	}
	for {
		_, lag, err := committedLag()
		if err == nil && sink.delivered.Load() >= total && lag <= markers {
			break
		}
		if time.Since(drainStart) > 2*time.Minute {
			close(stopSampling)
			<-sampleDone
			missing, dup, _ := sink.check()
			return fmt.Errorf("after 2 minutes of drain: delivered %d of %d (%d never, %d more than once), committed lag %d; consumer counters %s",
				sink.delivered.Load(), total, missing, dup, lag, counters(regs))
		}
		time.Sleep(100 * time.Millisecond)
	}
	drain := time.Since(drainStart)
	close(stopSampling)
	<-sampleDone
	if missing, dup, bad := sink.check(); sink.delivered.Load() != total || missing+dup+bad > 0 {
		return fmt.Errorf("delivered %d, ingested %d: %d never delivered, %d more than once, %d unknown (each must be delivered exactly once); consumer counters %s",
			sink.delivered.Load(), total, missing, dup, bad, counters(regs))
	}
	// Figures over the live-ingest samples only (the drain is reported apart).
	var lagC, lagU []int64
	for _, s := range samples {
		if s.at <= ingestEnd {
			lagC = append(lagC, s.committedLag)
			lagU = append(lagU, s.undelivered)
		}
	}
	slices.Sort(lagC)
	slices.Sort(lagU)
	sink.mu.Lock()
	lat := slices.Clone(sink.lat)
	sink.mu.Unlock()
	slices.Sort(lat)
	pq := func(v []int64, q float64) int64 {
		if len(v) == 0 {
			return 0
		}
		return v[int(q*float64(len(v)-1))]
	}
	pd := func(q float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(q*float64(len(lat)-1))].Round(time.Millisecond)
	}
	rate := float64(total) / ingestEnd.Seconds()
	fmt.Printf("lag replicas=%d transactions=%v sink=%s run=%d: target %d/s, sustained %.0f/s (%d occurrences in %.1fs, %d agents, batch %d); ack p50 %s p99 %s; sink group lag (Kafka, committed) p50 %d p99 %d max %d records; produced-not-delivered p50 %d p99 %d max %d (%.2fs / %.2fs / %.2fs of ingest); ingest-to-sink p50 %s p99 %s max %s; drained %.2fs after the last ack; %d delivered exactly once; CPU during the ingest %.1f µs/occurrence (agents, collectors, consumers, brokers); load %s -> %s\n",
		replicas, o.txn, o.sink, run, o.rate, rate, total, ingestEnd.Seconds(), o.agents, o.batch, res.p(0.5), res.p(0.99),
		pq(lagC, 0.5), pq(lagC, 0.99), pq(lagC, 1), pq(lagU, 0.5), pq(lagU, 0.99), pq(lagU, 1),
		float64(pq(lagU, 0.5))/rate, float64(pq(lagU, 0.99))/rate, float64(pq(lagU, 1))/rate,
		pd(0.5), pd(0.99), pd(1), drain.Seconds(), total, float64(res.cpu.Microseconds())/float64(total), before, loadAvg())
	return nil
}

// loadAvg is the 1-minute load average: the machine is shared.
func loadAvg() string {
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

// counters sums the consumers' counters over the replicas' registries: what
// they sent, filtered, dropped, lost, and what the dedupe window dropped.
func counters(regs []*prometheus.Registry) string {
	sum := map[string]float64{}
	for _, reg := range regs {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if c := m.GetCounter(); c != nil {
					sum[mf.GetName()] += c.GetValue()
				}
			}
		}
	}
	var parts []string
	for _, n := range []string{"eventpipe_sink_sent_records_total", "eventpipe_sink_filtered_records_total", "eventpipe_sink_failed_records_total",
		"eventpipe_sink_lost_records_total", "eventpipe_collector_backbone_duplicates_dropped_total", "eventpipe_collector_backbone_undecodable_records_total",
		"eventpipe_collector_backbone_dedupe_seeded_records_total", "eventpipe_collector_backbone_dedupe_evictions_total", "eventpipe_sink_cursor_commits_total"} {
		parts = append(parts, fmt.Sprintf("%s=%.0f", strings.TrimPrefix(n, "eventpipe_"), sum[n]))
	}
	return strings.Join(parts, " ")
}
