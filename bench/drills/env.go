package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/testenv/evbin"
	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/victorialogs"
)

// Options shape one run of the suite.
type Options struct {
	Full bool      // the long form (10-minute outages, 100,000 records behind)
	Only []string  // drill names to run; empty: all
	Dir  string    // work directory (a temp dir when empty)
	Log  io.Writer // progress
	// Tags are extra build tags for the eventpipe binary: a planted bug
	// (plant_offsetreuse, plant_ackbeforefsync, plant_nodedupe; see
	// bench/drills.md) that some drill must then fail on.
	Tags []string
}

// env is what every drill shares: the eventpipe binary, one
// VictoriaLogs (Loki API) and one kfake cluster.
type env struct {
	opts  Options
	dir   string
	bin   string
	vl    *vlProc
	kafka *kfake.Cluster
	k     *kubeEnv // started by the first agent drill
	// kafkaDown makes the broker drop every request (connections closed).
	kafkaDown atomic.Bool
}

func (e *env) logf(format string, args ...any) {
	if e.opts.Log != nil {
		fmt.Fprintf(e.opts.Log, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
	}
}

// pick returns the short or the full value.
func pick[T any](e *env, short, full T) T {
	if e.opts.Full {
		return full
	}
	return short
}

func newEnv(ctx context.Context, opts Options) (*env, error) {
	e := &env{opts: opts, dir: opts.Dir}
	root, err := kube.RepoRoot()
	if err != nil {
		return nil, err
	}
	e.bin = filepath.Join(e.dir, "eventpipe")
	// drill_syncjournal: the store journals its fsyncs when the power-cut
	// drill asks (collector/store/fs_syncjournal.go); otherwise the binary
	// is the product's.
	tags := strings.Join(append([]string{"drill_syncjournal"}, opts.Tags...), ",")
	if err := evbin.Build(ctx, root, e.bin, "-tags", tags); err != nil {
		return nil, err
	}
	vlBin, err := victorialogs.Binary()
	if err != nil {
		return nil, fmt.Errorf("victoria-logs binary (set EVENTPIPE_BIN_DIR): %w", err)
	}
	if e.vl, err = newVL(vlBin, filepath.Join(e.dir, "victoria-logs")); err != nil {
		return nil, err
	}
	e.kafka, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0), kfake.AllowAutoTopicCreation())
	if err != nil {
		e.vl.close()
		return nil, fmt.Errorf("kfake: %w", err)
	}
	// "Kafka down": while kafkaDown is set every request fails and its
	// connection is closed, as when the broker is unreachable.
	e.kafka.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		if e.kafkaDown.Load() {
			return nil, errors.New("drill: broker down"), true
		}
		return nil, nil, false
	})
	return e, nil
}

func (e *env) close() {
	if e.k != nil {
		_ = e.k.c.Stop()
	}
	if e.kafka != nil {
		e.kafka.Close()
	}
	if e.vl != nil {
		e.vl.close()
	}
}

// colOpts selects a collector's sinks and store.
type colOpts struct {
	storeDir       string // default <dir>/store
	lokiURL        string // default the shared VictoriaLogs
	storeExtra     string // more store keys, YAML flow form ("k: v, ...")
	fileMaxWait    string // the file sink's batch.max_wait (default 50ms)
	loki, kafka    bool
	acceptDataLoss bool
}

// pipeline is one drill's collector (real binary), its sinks and its agent.
type pipeline struct {
	e     *env
	name  string
	dir   string
	o     colOpts
	col   *collectorProc
	file  string // the file sink's path
	topic string
	ship  *shipper

	stopShip, stopGen context.CancelFunc
	shipDone, genDone chan struct{}
}

func (e *env) newPipeline(name string, o colOpts) (*pipeline, error) {
	dir := filepath.Join(e.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if o.storeDir == "" {
		o.storeDir = filepath.Join(dir, "store")
	}
	grpcAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p := &pipeline{e: e, name: name, dir: dir, o: o, file: filepath.Join(dir, "events.jsonl"), topic: "drill-" + name,
		col: &collectorProc{bin: e.bin, config: filepath.Join(dir, "collector.yaml"), grpcAddr: grpcAddr, httpAddr: httpAddr, log: &lockedBuffer{}}}
	if err := p.writeConfig(); err != nil {
		return nil, err
	}
	p.ship = newShipper(grpcAddr, name, name, 50)
	p.ship.ackTimeout = pick(e, 5*time.Second, 10*time.Second)
	return p, nil
}

func (p *pipeline) writeConfig() error {
	extra := ""
	if p.o.storeExtra != "" {
		extra = ", " + p.o.storeExtra
	}
	fileMaxWait := p.o.fileMaxWait
	if fileMaxWait == "" {
		fileMaxWait = "50ms"
	}
	lokiURL := p.o.lokiURL
	if lokiURL == "" {
		lokiURL = p.e.vl.url()
	}
	cfg := fmt.Sprintf(`grpc: {listen: %q, shutdown_grace: 5s}
http: {listen: %q}
auth: {insecure: true}
store: {dir: %q, accept_data_loss: %v%s}
sinks:
  - name: file
    type: file
    file: {path: %q, max_bytes: 1073741824}
    batch: {max_records: 1000, max_wait: %s}
    retry: {initial: 100ms, max: 1s}
`, p.col.grpcAddr, p.col.httpAddr, p.o.storeDir, p.o.acceptDataLoss, extra, p.file, fileMaxWait)
	if p.o.loki {
		cfg += fmt.Sprintf(`  - name: loki
    type: loki
    loki:
      url: %q
      query_params: {disable_message_parsing: "1"}
      labels: {static: {drill: %q}}
    batch: {max_records: 1000, max_wait: 100ms}
    retry: {initial: 100ms, max: 1s}
`, lokiURL+"/insert/loki/api/v1/push", p.name)
	}
	if p.o.kafka {
		cfg += fmt.Sprintf(`  - name: kafka
    type: kafka
    kafka: {brokers: [%q], topic: %q, write_timeout: 5s, create_topic: {enabled: true, partitions: 1, replication_factor: 1}}
    batch: {max_records: 1000, max_wait: 100ms}
    retry: {initial: 100ms, max: 1s}
`, p.e.kafka.ListenAddrs()[0], p.topic)
	}
	return os.WriteFile(p.col.config, []byte(cfg), 0o600)
}

// startLoad starts the agent: shipping, and one batch every interval.
func (p *pipeline) startLoad(ctx context.Context, interval time.Duration) {
	sctx, stopShip := context.WithCancel(ctx)
	p.stopShip = stopShip
	p.shipDone = make(chan struct{})
	go func() { p.ship.run(sctx); close(p.shipDone) }()
	if interval > 0 {
		p.startGen(sctx, interval)
	}
}

// startGen generates one batch every interval until stopGeneration.
func (p *pipeline) startGen(ctx context.Context, interval time.Duration) {
	gctx, stopGen := context.WithCancel(ctx)
	done := make(chan struct{})
	p.stopGen, p.genDone = stopGen, done
	go func() { p.ship.generate(gctx, interval); close(done) }()
}

// stopGeneration stops the generator and waits until it added its last
// batch, so that what was created is final.
func (p *pipeline) stopGeneration() {
	if p.stopGen != nil {
		p.stopGen()
		<-p.genDone
		p.stopGen = nil
	}
}

func (p *pipeline) close() {
	p.stopGeneration()
	if p.stopShip != nil {
		p.stopShip()
		<-p.shipDone
		p.stopShip = nil
	}
	p.col.kill()
	_ = os.WriteFile(filepath.Join(p.dir, "collector.log"), []byte(p.col.log.String()), 0o644)
}

// sinkNames are the sinks this pipeline has.
func (p *pipeline) sinkNames() []string {
	out := []string{"file"}
	if p.o.loki {
		out = append(out, "loki")
	}
	if p.o.kafka {
		out = append(out, "kafka")
	}
	return out
}

func (p *pipeline) read(ctx context.Context, sink string) (copies, error) {
	switch sink {
	case "file":
		return readFileSink(p.file)
	case "loki":
		return readLoki(ctx, p.e.vl, p.name)
	case "kafka":
		return readKafka(ctx, []string{p.e.kafka.ListenAddrs()[0]}, p.topic)
	}
	return nil, fmt.Errorf("unknown sink %q", sink)
}

// finish stops generating, waits until everything generated is
// acknowledged, then waits for each sink to hold every acknowledged
// occurrence and reports it. Recover is measured from healed (the end of
// the fault) to the moment the sink held everything.
func (p *pipeline) finish(ctx context.Context, healed time.Time) ([]SinkResult, error) {
	p.stopGeneration()
	if err := p.ship.waitAcked(ctx, pick(p.e, 90*time.Second, 10*time.Minute)); err != nil {
		return nil, fmt.Errorf("agent: %w\ncollector log:\n%s", err, tail(p.col.log.String(), 15))
	}
	created, acked := p.ship.createdIDs(), p.ship.ackedIDs()
	var out []SinkResult
	for _, sink := range p.sinkNames() {
		r, err := p.waitSink(ctx, sink, healed, created, acked)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func (p *pipeline) waitSink(ctx context.Context, sink string, healed time.Time, created, acked map[string]bool) (SinkResult, error) {
	deadline := time.Now().Add(pick(p.e, 90*time.Second, 10*time.Minute))
	poll := map[string]time.Duration{"file": 100 * time.Millisecond, "loki": time.Second, "kafka": time.Second}[sink]
	for {
		got, err := p.read(ctx, sink)
		if err != nil && time.Now().After(deadline) {
			return SinkResult{}, fmt.Errorf("read %s: %w", sink, err)
		}
		if err == nil {
			r := tally(p.name, sink, created, acked, got)
			// Done when the sink holds everything but what it counted
			// as lost (retention).
			lost, merr := p.col.metric("eventpipe_sink_lost_records_total", fmt.Sprintf(`sink=%q`, sink))
			if r.Lost <= int(lost) || time.Now().After(deadline) {
				r.Recover = time.Since(healed)
				st := p.ship.stats()
				r.Note = fmt.Sprintf("agent re-sent %d, collector deduplicated %d, reconnects %d", st.Resent, st.Dups, st.Reconnects)
				if merr != nil {
					r.Err = merr.Error()
				}
				r.Explained = int(lost)
				if r.Lost > 0 {
					r.Note += fmt.Sprintf("; missing e.g. %v", missing(acked, got, 3))
				}
				if r.Unknown > 0 {
					r.Note += fmt.Sprintf("; never generated e.g. %v", unknown(created, got, 3))
				}
				return r, nil
			}
		}
		select {
		case <-ctx.Done():
			return SinkResult{}, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// follower is a Follow subscriber (the CLI's path) that reconnects with
// its last cursor.
type follower struct {
	addr, workspace string
	got             atomic.Pointer[copies]
	offs            map[string]uint64 // event_id -> highest cursor it came with (run's goroutine; read after run)
	n               atomic.Int64      // records received
	cursor          atomic.Uint64
	reconnects      atomic.Int64
}

func newFollower(addr, workspace string) *follower {
	f := &follower{addr: addr, workspace: workspace, offs: map[string]uint64{}}
	c := copies{}
	f.got.Store(&c)
	return f
}

// run follows until ctx ends: first with after_cursor after, or, when it
// is 0, a replay of the last tail records. Reconnects resume from the last
// cursor received. Only run's goroutine writes got; read it after run
// returned.
func (f *follower) run(ctx context.Context, after uint64, tail uint32) {
	f.cursor.Store(after)
	got := *f.got.Load()
	for ctx.Err() == nil {
		conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return
		}
		st, err := eventpipev1.NewFollowClient(conn).Follow(ctx, &eventpipev1.FollowRequest{Workspace: f.workspace, AfterCursor: f.cursor.Load(), Tail: tail})
		for err == nil {
			var resp *eventpipev1.FollowResponse
			if resp, err = st.Recv(); err != nil {
				break
			}
			if o := resp.GetOccurrence(); o != nil {
				got[o.GetEventId()] = append(got[o.GetEventId()], o.GetObservedAt().AsTime().Format(time.RFC3339Nano))
				f.offs[o.GetEventId()] = max(f.offs[o.GetEventId()], resp.GetCursor())
				f.n.Add(1)
			}
			if resp.GetCursor() > 0 {
				f.cursor.Store(resp.GetCursor())
			}
		}
		conn.Close()
		f.reconnects.Add(1)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}
