package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// startCollectorChild runs `eventpipe collector` as a process in Kafka
// mode against brokers, so a test can SIGKILL it: nothing is flushed,
// closed or handed over. Its metrics and readiness are read over HTTP
// (child.metric, child.ready).
func startCollectorChild(t *testing.T, dir, name string, brokers []string) (*child, string) {
	t.Helper()
	bin := eventpipeBinary(t)
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	cfg := fmt.Sprintf(`log: kafka
backbone:
  brokers: [%s]
  create_topics: true
  partitions: 6
  replication_factor: 3
  produce_timeout: 5s
grpc:
  listen: %s
  shutdown_grace: 2s
http:
  listen: %s
auth:
  insecure: true
`, strings.Join(brokers, ", "), grpcAddr, httpAddr)
	cfgPath := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "collector", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start collector %s: %v", name, err)
	}
	c := &child{name: name, cmd: cmd, metrics: httpAddr, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		lf.Close()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("collector %s log (tail):\n%s", name, tail(string(b), 3000))
		}
	})
	return c, grpcAddr
}

// TestKafkaBackboneSurvivesCollectorKills is the proof of Kafka mode's
// ingest guarantees: three collector processes (log: kafka) over a
// three-broker kfake cluster, the real agent process with the three
// addresses, the real kube-apiserver. While Events are created, the
// replica the agent ships to is SIGKILLed, then the next one. Every
// created Event's occurrence must be in the backbone topic; duplicates
// (batches Kafka took but whose acknowledgement died with a replica) are
// counted and bounded by what can have been in flight. Then the agent is
// SIGKILLed too and restarted: it must resume from the cursor the last
// replica reads from Kafka (written by replicas since killed), without
// relisting (eventpipe_agent_relists_total stays 0). Each kill happens
// while Kafka refuses writes, so the killed replica holds batches Kafka
// has not taken.
func TestKafkaBackboneSurvivesCollectorKills(t *testing.T) {
	n, rate := 4500, 300
	if testing.Short() {
		n = 2400 // still enough for both kills to fall under load
	}
	dir := t.TempDir()
	kc, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()
	// While refuse is set the brokers answer every produce with
	// NOT_ENOUGH_REPLICAS (a partition below min.insync.replicas): the
	// moment of each kill, so the killed replica holds batches Kafka has
	// not taken. A replica that acknowledged before Kafka did would lose
	// them with its process.
	var refuse atomic.Bool
	kc.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		req := kr.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.NotEnoughReplicas.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})

	cols := make([]*child, 3)
	addrs := make([]string, 3)
	for i := range cols {
		cols[i], addrs[i] = startCollectorChild(t, dir, fmt.Sprintf("collector-%d", i), brokers)
	}
	for _, c := range cols {
		waitFor(t, 60*time.Second, c.name+" ready", func() (bool, string) { return c.ready(), "" })
	}

	const batchSize, inFlight = 100, 4
	agentCfg := filepath.Join(dir, "agent.yaml")
	// hold.max_age 1s: the load's Events name pods that do not exist, so
	// each is held (and holds the cursor back) until then.
	if err := os.WriteFile(agentCfg, []byte(fmt.Sprintf(`cluster: kafka-proof
collector:
  addresses: [%s]
ship:
  batch_size: %d
  max_in_flight: %d
  backoff_initial: 100ms
hold:
  max_age: 1s
`, strings.Join(addrs, ", "), batchSize, inFlight)), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", agentCfg, "--leader-elect=false"}
	a := startChild(t, dir, "agent-1", args...)
	waitFor(t, 60*time.Second, "agent ready", func() (bool, string) { return a.ready(), "" })

	alive := func() []int {
		var out []int
		for i, c := range cols {
			select {
			case <-c.done:
			default:
				out = append(out, i)
			}
		}
		return out
	}
	cursor := func() (string, error) {
		var lastErr error
		for _, i := range alive() {
			conn := dialInsecure(t, addrs[i])
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := eventpipev1.NewIngestClient(conn).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "kafka-proof"})
			cancel()
			conn.Close()
			if err == nil {
				return resp.GetResourceVersion(), nil
			}
			lastErr = err
		}
		return "", lastErr
	}
	// The initial listing (what earlier tests left in the cluster) is over
	// once a cursor is in Kafka.
	var cursor0 string
	waitFor(t, 120*time.Second, "a cursor in Kafka", func() (bool, string) {
		rv, err := cursor()
		cursor0 = rv
		return rv != "", fmt.Sprint(err)
	})

	g := newLoadGen(t, "kafka-proof")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	loadDone := make(chan error, 1)
	go func() { loadDone <- g.run(ctx, n, rate, 8) }()

	// killActive SIGKILLs the live replica that received the most batches
	// since the last look: the one the agent ships to.
	seen := make([]float64, 3)
	killActive := func(round int) {
		t.Helper()
		var best int = -1
		var bestGain float64
		waitFor(t, 30*time.Second, "batches arriving at a replica", func() (bool, string) {
			best, bestGain = -1, 0
			for _, i := range alive() {
				v, err := cols[i].metric("eventpipe_collector_ingest_batches_total", "")
				if err != nil {
					continue
				}
				if gain := v - seen[i]; gain > bestGain {
					best, bestGain = i, gain
				}
			}
			return best >= 0, ""
		})
		for _, i := range alive() {
			seen[i], _ = cols[i].metric("eventpipe_collector_ingest_batches_total", "")
		}
		refuse.Store(true)
		time.Sleep(700 * time.Millisecond)
		cols[best].kill()
		refuse.Store(false)
		t.Logf("kill %d: SIGKILLed %s with %d Events created", round, cols[best].name, len(g.created()))
	}
	waitFor(t, 60*time.Second, "the load to be acknowledged in part", func() (bool, string) {
		rv, _ := cursor()
		return rv != cursor0, rv
	})
	time.Sleep(time.Second)
	killActive(1)
	time.Sleep(2 * time.Second)
	killActive(2)
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}

	got, records := waitAllInTopic(t, brokers, g, 60*time.Second)
	created := len(g.created())
	dups := records - len(got)
	t.Logf("%d Events created, %d distinct event_ids in the backbone topic, %d records (%d duplicates)", created, len(got), records, dups)
	if len(got) != created {
		t.Errorf("%d distinct event_ids in the topic, %d Events created", len(got), created)
	}
	if limit := 2 * inFlight * batchSize; dups > limit {
		t.Errorf("%d duplicates, more than the %d that can have been in flight at two kills", dups, limit)
	}
	if n, err := a.metric("eventpipe_agent_relists_total", ""); err != nil || n != 1 {
		t.Errorf("agent relisted %v times (err %v), want 1 (its start only): a collector failover must not cost a relist", n, err)
	}

	// The agent dies too; its successor asks the last replica where to
	// resume, which reads the cursor topic.
	rvBefore, err := cursor()
	if err != nil {
		t.Fatal(err)
	}
	a.kill()
	b := startChild(t, dir, "agent-2", args...)
	waitFor(t, 60*time.Second, "restarted agent ready", func() (bool, string) { return b.ready(), "" })
	if err := g.run(ctx, 100, 200, 4); err != nil {
		t.Fatal(err)
	}
	waitAllInTopic(t, brokers, g, 60*time.Second)
	if n, err := b.metric("eventpipe_agent_relists_total", ""); err != nil || n != 0 {
		t.Errorf("restarted agent relisted %v times (err %v), want 0: it must resume from the cursor held in Kafka (%s)", n, err, rvBefore)
	}
}

// dialInsecure is a plaintext gRPC connection to a collector.
func dialInsecure(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}
