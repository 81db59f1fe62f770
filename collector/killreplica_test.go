package collector

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/backbone"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/kafka"
	"github.com/eventpipe/eventpipe/sinks/kafka/kafkatest"
)

// Environment of a replica process of the kill test (runKillReplica, started
// by TestMain).
const (
	envKillReplica = "EVENTPIPE_KILLTEST_REPLICA" // the replica's slot name
	envKillBrokers = "EVENTPIPE_KILLTEST_BROKERS"
	envKillTxn     = "EVENTPIPE_KILLTEST_TRANSACTIONS"
	envKillDir     = "EVENTPIPE_KILLTEST_DIR"
	// EVENTPIPE_TEST_TRANSACTIONS=off runs the kill test with
	// backbone.transactions.enabled: false, to show that it then fails.
	envTestTransactions = "EVENTPIPE_TEST_TRANSACTIONS"
	killTopic           = "kill.backbone"
	killArchive         = "kill.archive"
	killPartitions      = 6
)

// killReplicaConfig is one replica of the kill test: Kafka mode on the
// test's brokers, the slot's name as its transactional slot, and two sinks
// (each its own consumer group): a Kafka archive topic and a file of its
// own in dir, named after the slot, so a replica restarted in its slot (a
// container restarted in its pod) finds the file it wrote before.
func killReplicaConfig(brokers []string, txn bool, dir, slot string) (Config, error) {
	cfg, err := tokensConfig(dir)
	if err != nil {
		return Config{}, err
	}
	cfg.Store = NewDefaultConfig().Store
	cfg.Log = LogKafka
	bc := backbone.NewDefaultConfig()
	bc.Conn.Brokers = brokers
	bc.Conn.ClientID = slot
	bc.Topic, bc.CursorTopic = killTopic, "kill.cursors"
	bc.CreateTopics = true
	bc.Partitions = killPartitions
	// The restarted replica must rejoin before the group gives up on its
	// predecessor, or the survivors take its partitions (and repeat, in
	// their own files, what it wrote): the default, with room for a slow
	// start on a loaded machine.
	bc.SessionTimeout = backbone.DefaultSessionTimeout
	bc.Transactions.Enabled = txn
	if txn {
		bc.Transactions.ID = slot
	}
	cfg.Backbone = &bc
	fileSc := fileSink("file", filepath.Join(dir, slot+".jsonl"))
	kc := kafka.NewDefaultConfig()
	kc.Conn.Brokers, kc.Topic = brokers, killArchive
	d := sinks.NewDefaultRunnerConfig("archive")
	d.Batch.MaxRecords, d.Batch.MaxWait = 50, 20*time.Millisecond
	archive := SinkConfig{Name: "archive", Type: SinkKafka, Kafka: &kc, Batch: d.Batch, Retry: d.Retry}
	fileSc.Batch.MaxRecords = 50
	// commit_interval 2s: a replica killed under load has pushed up to
	// two seconds' worth of its partitions past its last commit.
	fileSc.CommitInterval, archive.CommitInterval = 2*time.Second, 2*time.Second
	cfg.Sinks = []SinkConfig{fileSc, archive}
	return cfg, nil
}

// runKillReplica is one collector replica of
// TestExactlyOnceAtEverySinkThroughReplicaKill, in a process of its own
// (this test binary, started again with envKillReplica: TestMain), in
// Kafka mode until it is SIGKILLed (or SIGTERMed at the end). It writes its
// gRPC and HTTP addresses to <dir>/addr-<slot>.
func runKillReplica(slot string) error {
	dir := os.Getenv(envKillDir)
	cfg, err := killReplicaConfig(strings.Split(os.Getenv(envKillBrokers), ","), os.Getenv(envKillTxn) == "on", dir, slot)
	if err != nil {
		return err
	}
	c, err := New(cfg, envLogger(), prometheus.NewRegistry())
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	addr := filepath.Join(dir, "addr-"+slot)
	if err := os.WriteFile(addr+".tmp", []byte(c.GRPCAddr()+" "+c.HTTPAddr()), 0o600); err != nil {
		return err
	}
	if err := os.Rename(addr+".tmp", addr); err != nil {
		return err
	}
	return c.Run(ctx)
}

// killReplica is a replica process.
type killReplica struct {
	cmd        *exec.Cmd
	done       chan struct{}
	grpc, http string
}

// startKillReplica runs a replica in slot and waits for its addresses.
func startKillReplica(t *testing.T, brokers []string, txn bool, dir, slot string) *killReplica {
	t.Helper()
	_ = os.Remove(filepath.Join(dir, "addr-"+slot))
	// TestMain runs the replica, never a test (-test.run=^$ should it not).
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	on := "off"
	if txn {
		on = "on"
	}
	cmd.Env = append(os.Environ(), envKillReplica+"="+slot, envKillBrokers+"="+strings.Join(brokers, ","),
		envKillTxn+"="+on, envKillDir+"="+dir)
	if testing.Verbose() {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &killReplica{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(r.done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-r.done })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "addr-"+slot)); err == nil {
			if f := strings.Fields(string(b)); len(f) == 2 {
				r.grpc, r.http = f[0], f[1]
				return r
			}
		}
		select {
		case <-r.done:
			t.Fatalf("replica %s exited before it started", slot)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s did not start within 60s", slot)
		}
	}
}

// TestExactlyOnceAtEverySinkThroughReplicaKill: three collector replica
// processes in Kafka mode deliver the backbone to a Kafka archive topic
// and to a file sink each (two consumer groups), and serve a gateway
// subscriber's Follow stream, under a steady flow (3,000 occurrences at
// about 500/s, sinks committing every 2 s). Half-way, the replica serving
// the Follow stream is SIGKILLed and started again in its slot (same
// transactional slot, same file), as a container restarted in its pod.
// Every acknowledged occurrence is then seen exactly once by
//   - a read_committed reader of the archive topic: the killed replica's
//     pushed-but-uncommitted batches were in open transactions, aborted when
//     the partitions' next owners fenced it;
//   - the file sinks, all files together: the restarted replica's runners
//     push again what it wrote since its last commit, and its file sink
//     skips it by event_id (sinks/file);
//   - the subscriber, which resumes on another replica from its last
//     position.
//
// With transactions off (EVENTPIPE_TEST_TRANSACTIONS=off) the archive
// repeats the killed replica's uncommitted pushes and the test fails.
func TestExactlyOnceAtEverySinkThroughReplicaKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts replica processes")
	}
	txn := os.Getenv(envTestTransactions) != "off"
	kc, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, killArchive))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// The test itself is the ingest side: what Append returns for is
	// acknowledged.
	icfg, err := killReplicaConfig(brokers, txn, dir, "ingest")
	if err != nil {
		t.Fatal(err)
	}
	wcfg := *icfg.Backbone
	w, err := backbone.NewWriter(wcfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.CheckTopics(ctx); err != nil {
		t.Fatal(err)
	}
	slots := []string{"replica-0", "replica-1", "replica-2"}
	replicas := map[string]*killReplica{}
	for _, slot := range slots {
		replicas[slot] = startKillReplica(t, brokers, txn, dir, slot)
	}
	victim := replicas["replica-0"]
	// Kill only once both sinks' groups are settled, every replica
	// delivering its share of the partitions: the victim's pushes past its
	// last commit are then in partitions its restart takes back. Killed
	// while a replica that joined late had not yet taken its share from
	// the victim, the restarted victim would get back only some of them and
	// a survivor would repeat the others in its own file (the limit the
	// file sink documents), which is not what this test is about.
	share := float64(killPartitions / len(slots))
	for _, sink := range []string{"file", "archive"} {
		metric := fmt.Sprintf(`eventpipe_collector_backbone_sink_assigned_partitions{sink=%q}`, sink)
		for _, slot := range slots {
			for deadline := time.Now().Add(90 * time.Second); scrapeGaugeOr(replicas[slot].http, metric) != share; {
				if time.Now().After(deadline) {
					t.Fatalf("%s holds %.0f partitions of the %s sink's group after 90 s, want %.0f", slot, scrapeGaugeOr(replicas[slot].http, metric), sink, share)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}

	// The subscriber follows gateway gw-1 (every partition) on the victim.
	sub := &subscriber{got: map[string]int{}}
	followReq := func() *eventpipev1.FollowRequest { return &eventpipev1.FollowRequest{GatewayId: "gw-1"} }
	firstFollow := make(chan error, 1)
	go func() { firstFollow <- sub.run(ctx, dial(t, victim.grpc, readerWS1), followReq(), 1<<30, nil) }()
	time.Sleep(time.Second) // subscribed (its live stream starts at the ends)

	const total, batch = 3000, 20
	var ids []string
	killed := false
	start := time.Now()
	tick := time.NewTicker(40 * time.Millisecond) // 20 per 40 ms: 500/s
	defer tick.Stop()
	for n := 0; n < total; n += batch {
		<-tick.C
		var occs []*eventpipev1.Occurrence
		for i := n; i < n+batch; i++ {
			id := fmt.Sprintf("c1/kill-%05d/1", i)
			occs = append(occs, occ(id, fmt.Sprintf("sbx-%02d", i%24), "ws1", fmt.Sprintf("demo-%02d", i%24), "gw-1"))
			ids = append(ids, id)
		}
		for {
			if _, err := w.Append(ctx, "c1", "events", fmt.Sprint(n+batch), occs); err == nil {
				break
			} else if ctx.Err() != nil {
				t.Fatal(err)
			}
		}
		if !killed && n+batch >= total/2 {
			killed = true
			if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-victim.done
			t.Logf("SIGKILLed replica-0 after %d occurrences", n+batch)
			replicas["replica-0"] = startKillReplica(t, brokers, txn, dir, "replica-0")
		}
	}
	t.Logf("%d occurrences acknowledged in %s", total, time.Since(start).Round(time.Millisecond))
	if err := <-firstFollow; err == nil {
		t.Fatal("the Follow stream of the killed replica did not break")
	}
	followedBefore := len(sub.order)

	// Archive (read_committed): wait for every id, then for stragglers.
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.FetchIsolationLevel(kgo.ReadCommitted())}
	archived := func() map[string]int {
		recs, err := kafkatest.ReadTopic(ctx, opts, killArchive)
		if err != nil {
			t.Fatal(err)
		}
		counts := map[string]int{}
		for _, r := range recs {
			for _, h := range r.Headers {
				if h.Key == "ce_id" {
					counts[string(h.Value)]++
				}
			}
		}
		return counts
	}
	files := func() map[string]int { return readJSONL(t, filepath.Join(dir, "replica-")) }
	waitAll := func(what string, counts func() map[string]int) {
		t.Helper()
		for deadline := time.Now().Add(90 * time.Second); ; {
			missing := 0
			got := counts()
			for _, id := range ids {
				if got[id] == 0 {
					missing++
				}
			}
			if missing == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d acknowledged occurrences never arrived", what, missing, total)
			}
			time.Sleep(time.Second)
		}
	}
	waitAll("archive topic", archived)
	waitAll("file sinks", files)

	// Follow: resume on another replica from the last position, until
	// every occurrence arrived; then nothing more may come.
	if err := sub.run(ctx, dial(t, replicas["replica-1"].grpc, readerWS1), followReq(), total-len(sub.order), nil); err != nil {
		t.Fatalf("resumed Follow on replica-1 (got %d of %d): %v", len(sub.order), total, err)
	}
	extra := &subscriber{got: map[string]int{}, position: sub.position}
	ectx, ecancel := context.WithTimeout(ctx, 3*time.Second)
	err = extra.run(ectx, dial(t, replicas["replica-1"].grpc, readerWS1), followReq(), 1, nil)
	ecancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("after every occurrence was followed, a resume got %v (%v), want nothing", extra.order, err)
	}
	for id, n := range extra.got {
		sub.got[id] += n
	}

	time.Sleep(3 * time.Second) // a late duplicate in a sink would land now
	dups := func(counts map[string]int) (d, missing int) {
		for _, id := range ids {
			if counts[id] == 0 {
				missing++
			}
		}
		for _, n := range counts {
			d += n - 1
		}
		return d, missing
	}
	type result struct {
		sink          string
		dups, missing int
	}
	var results []result
	for _, s := range []struct {
		name   string
		counts map[string]int
	}{{"archive topic (read_committed)", archived()}, {"file sinks", files()}, {"Follow", sub.got}} {
		d, m := dups(s.counts)
		results = append(results, result{s.name, d, m})
		t.Logf("transactions %v: %s: %d distinct, %d duplicates, %d missing", txn, s.name, len(s.counts), d, m)
	}
	t.Logf("Follow: %d before the kill, resumed on replica-1 for the rest", followedBefore)
	for _, slot := range slots {
		r := replicas[slot]
		t.Logf("%s: file sink skipped %.0f records pushed again; archive partitions %.0f, file partitions %.0f", slot,
			scrapeGaugeOr(r.http, "eventpipe_sink_file_repeated_records_total"),
			scrapeGaugeOr(r.http, `eventpipe_collector_backbone_sink_assigned_partitions{sink="archive"}`),
			scrapeGaugeOr(r.http, `eventpipe_collector_backbone_sink_assigned_partitions{sink="file"}`))
	}
	for _, r := range results {
		if r.dups > 0 || r.missing > 0 {
			t.Errorf("%s: %d duplicates, %d missing after a replica kill", r.sink, r.dups, r.missing)
		}
	}
	for _, r := range replicas {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
	}
}

// scrapeGaugeOr is the value of one series (name with its labels) on the
// replica's /metrics, -1 when it is not (yet) exported or the replica does
// not answer.
func scrapeGaugeOr(httpAddr, series string) float64 {
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return f
			}
		}
	}
	return -1
}
