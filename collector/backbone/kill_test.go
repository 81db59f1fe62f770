package backbone

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/kafka"
	"github.com/eventpipe/eventpipe/sinks/kafka/kafkatest"
)

// Environment of the replica helper process (TestKillReplicaHelper).
const (
	envReplica      = "EVENTPIPE_KILLTEST_REPLICA"
	envBrokers      = "EVENTPIPE_KILLTEST_BROKERS"
	envTransactions = "EVENTPIPE_KILLTEST_TRANSACTIONS"
	envName         = "EVENTPIPE_KILLTEST_NAME"
	envStatusDir    = "EVENTPIPE_KILLTEST_STATUS"
	// EVENTPIPE_TEST_TRANSACTIONS=off runs the kill test with
	// backbone.transactions.enabled: false, to show that it then fails.
	envTestTransactions = "EVENTPIPE_TEST_TRANSACTIONS"
	killTopic           = "kill.backbone"
	archiveTopic        = "kill.archive"
)

func killConfig(brokers []string, txn bool) Config {
	cfg := NewDefaultConfig()
	cfg.Brokers = brokers
	cfg.Topic = killTopic
	cfg.CursorTopic = "kill.cursors"
	cfg.CreateTopics = true
	cfg.Partitions = 6
	cfg.ReplicationFactor = 3
	cfg.SessionTimeout = 6 * time.Second
	cfg.Transactions.Enabled = txn
	if txn {
		cfg.Transactions.ID = "kill-writer"
	}
	return cfg
}

// TestKillReplicaHelper is not a test: run by TestKafkaSinkExactlyOnceThroughReplicaKill
// as a collector replica's sink side (a member of the archive sink's
// consumer group), until it is SIGKILLed.
func TestKillReplicaHelper(t *testing.T) {
	if os.Getenv(envReplica) == "" {
		t.Skip("helper process of TestKafkaSinkExactlyOnceThroughReplicaKill")
	}
	cfg := killConfig(strings.Split(os.Getenv(envBrokers), ","), os.Getenv(envTransactions) == "on")
	cfg.ClientID = os.Getenv(envName) // the test finds the busiest replica by it
	kcfg := kafka.NewDefaultConfig()
	kcfg.Brokers, kcfg.Topic = cfg.Brokers, archiveTopic
	ks, err := kafka.New(kcfg, slog.New(slog.NewTextHandler(os.Stderr, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	rc := sinks.NewDefaultRunnerConfig("archive")
	rc.Batch.MaxRecords, rc.Batch.MaxWait = 50, 20*time.Millisecond
	rc.CommitInterval = 2 * time.Second
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	g, err := NewGroupSinks(cfg, []GroupSink{{Runner: rc, Pusher: ks}}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() { // how many partitions this replica owns, for the test to pick whom to kill
		for ctx.Err() == nil {
			n := 0
			for _, st := range g.Status() {
				n += len(st.Partitions)
			}
			_ = os.WriteFile(filepath.Join(os.Getenv(envStatusDir), os.Getenv(envName)), []byte(strconv.Itoa(n)), 0o600)
			time.Sleep(100 * time.Millisecond)
		}
	}()
	fmt.Println("replica running")
	_ = g.Run(ctx)
}

// startSinkReplica runs the helper as a child process.
func startSinkReplica(t *testing.T, brokers []string, txn bool, name, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillReplicaHelper$", "-test.count=1")
	on := "off"
	if txn {
		on = "on"
	}
	cmd.Env = append(os.Environ(), envReplica+"=1", envBrokers+"="+strings.Join(brokers, ","), envTransactions+"="+on, envName+"="+name, envStatusDir+"="+dir)
	if testing.Verbose() {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// TestKafkaSinkExactlyOnceThroughReplicaKill: three replica processes
// deliver the backbone to a Kafka archive topic as one consumer group
// under a steady flow (3,000 occurrences at about 500/s, each batch
// committed to the group at most once a second); one replica is SIGKILLed
// mid-flow and a new one started in its place. A read_committed reader of
// the archive finds every occurrence exactly once: the killed replica's
// pushed-but-uncommitted batches were in open transactions, aborted when
// the partitions' next owners fenced it. With transactions off
// (EVENTPIPE_TEST_TRANSACTIONS=off) the same run repeats the killed
// replica's last second of pushes and the test fails.
func TestKafkaSinkExactlyOnceThroughReplicaKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts replica processes")
	}
	txn := os.Getenv(envTestTransactions) != "off"
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, archiveTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	cfg := killConfig(brokers, txn)
	w, err := NewWriter(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := w.CheckTopics(ctx); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	names := []string{"replica-0", "replica-1", "replica-2"}
	replicas := map[string]*exec.Cmd{}
	for _, name := range names {
		replicas[name] = startSinkReplica(t, brokers, txn, name, dir)
	}

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
			id := fmt.Sprintf("kill-%05d", i)
			occs = append(occs, occ(id, fmt.Sprintf("sb-%02d", i%24)))
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
			// The replica that owns the most partitions now is SIGKILLed:
			// it has pushed up to commit_interval's worth of each without
			// committing. A new replica takes its place.
			killed = true
			name := busiestMember(t, dir, names)
			if err := replicas[name].Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			t.Logf("SIGKILLed %s after %d occurrences", name, n+batch)
			replicas[name+"-new"] = startSinkReplica(t, brokers, txn, name+"-new", dir)
		}
	}
	t.Logf("%d occurrences acknowledged in %s", total, time.Since(start).Round(time.Millisecond))

	// Wait until the archive holds every id (read_committed), then for
	// stragglers a little longer, and count.
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.FetchIsolationLevel(kgo.ReadCommitted())}
	count := func() (map[string]int, int) {
		recs, err := kafkatest.ReadTopic(ctx, opts, archiveTopic)
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
		return counts, len(recs)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		counts, _ := count()
		missing := 0
		for _, id := range ids {
			if counts[id] == 0 {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d occurrences never reached the archive", missing, total)
		}
		time.Sleep(time.Second)
	}
	time.Sleep(3 * time.Second) // a late duplicate would land now
	counts, n := count()
	dups := 0
	for _, n := range counts {
		dups += n - 1
	}
	t.Logf("transactions %v: archive holds %d records, %d distinct, %d duplicates", txn, n, len(counts), dups)
	if dups > 0 {
		t.Errorf("%d duplicate records in the archive topic (read_committed) after a replica kill", dups)
	}
	for _, p := range replicas {
		_ = p.Process.Signal(syscall.SIGTERM)
	}
}

// busiestMember is the name of the replica that owns the most backbone
// partitions, as each replica reports in its status file.
func busiestMember(t *testing.T, dir string, names []string) string {
	t.Helper()
	best, most := "", 0
	for _, name := range names {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if n > most {
			best, most = name, n
		}
	}
	if best == "" {
		t.Fatal("no replica owns a partition of the archive group")
	}
	return best
}
