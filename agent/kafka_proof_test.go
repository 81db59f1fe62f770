package agent

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/collector/backbone"
	"github.com/eventpipe/eventpipe/testenv/scenario"
	"github.com/eventpipe/eventpipe/testenv/victorialogs"
)

// startCollectorChild runs `eventpipe collector` as a process in Kafka
// mode against brokers, so a test can SIGKILL it: nothing is flushed,
// closed or handed over. It listens on ports it chooses (127.0.0.1:0),
// read from its "collector started" log line (a port picked here and closed
// again could be taken by another process on this shared machine before
// the child binds it), and returns once /readyz answers, with its gRPC
// address. Its metrics and readiness are read over HTTP (child.metric,
// child.ready). extra is appended to its configuration (sinks; backbone
// settings are not repeated there: see session_timeout below).
func startCollectorChild(t *testing.T, dir, name string, brokers []string, extra string) (*child, string) {
	t.Helper()
	cfg := fmt.Sprintf(`log: kafka
backbone:
  brokers: [%s]
  create_topics: true
  partitions: 6
  replication_factor: 3
  produce_timeout: 5s
  session_timeout: 6s
grpc:
  listen: 127.0.0.1:0
  shutdown_grace: 2s
http:
  listen: 127.0.0.1:0
auth:
  insecure: true
%s`, strings.Join(brokers, ", "), extra)
	cfgPath := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c, from := spawn(t, dir, "collector", name, 3000, "collector", "--config", cfgPath, "--log-format", "json")
	started := c.waitLogged(t, from, "collector started")
	c.metrics = started["http"]
	waitFor(t, 60*time.Second, name+" ready", func() (bool, string) {
		select {
		case <-c.done:
			b, _ := os.ReadFile(c.log)
			t.Fatalf("%s exited before it was ready; log:\n%s", name, tail(string(b), 2000))
		default:
		}
		return c.ready(), ""
	})
	return c, started["grpc"]
}

// TestKafkaBackboneSurvivesCollectorKills is the proof of Kafka mode's
// guarantees end to end: three collector processes (log: kafka) over a
// three-broker kfake cluster, each running a Loki sink (a real
// VictoriaLogs) as a member of the sink's consumer group; the real agent
// process with the three addresses; the real kube-apiserver with sandboxes
// the Events are about; a Follow stream by workspace, the way the gateway
// proxy follows. While Events are created, the replica the agent ships to
// (also the one followed, and a sink group member mid-push) is SIGKILLed,
// then the next one; the follower resumes on a live replica with its last
// position. The first kill falls while Kafka refuses writes and Loki is
// down; the second while cursor writes wait, so the agent resends batches
// Kafka stored and the backbone holds copies (see killActive).
//
// Checked: every created Event's occurrence is in the backbone topic
// (duplicates there bounded by what can have been in flight), in Loki and
// in the follow stream; the follow stream repeats nothing (a resume by
// position with a seeded window delivers exactly once,
// docs/kafka-consumers.md "Positions"); Loki's duplicate rows stay within
// what a lost partition can redeliver (docs/kafka-consumers.md
// "Rebalance": what was pushed since the last commit, at most
// commit_interval's worth); and the agent did not relist. Then the agent
// is SIGKILLed too and restarted: it must resume from the cursor the last
// replica reads from Kafka (written by replicas since killed), without
// relisting (eventpipe_agent_relists_total stays 0).
func TestKafkaBackboneSurvivesCollectorKills(t *testing.T) {
	start := time.Now()
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
	//
	// While holdCursor is set, produces to the cursor topic wait (a slow
	// broker for it): the replica has then written batches to the backbone
	// but not acknowledged them to the agent, and a kill makes the agent
	// resend them, so the backbone holds copies the consumers' windows
	// must drop (bench/kafka-dedupe.md, run 2).
	var refuse, holdCursor atomic.Bool
	var cursorTopicID [16]byte // set before holdCursor is first set
	kc.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		req := kr.(*kmsg.ProduceRequest)
		if holdCursor.Load() {
			for _, rt := range req.Topics {
				if rt.Topic == backbone.DefaultCursorTopic || rt.TopicID == cursorTopicID {
					kc.SleepControl(func() {
						for holdCursor.Load() {
							time.Sleep(10 * time.Millisecond)
						}
					})
					break
				}
			}
		}
		if !refuse.Load() {
			return nil, nil, false
		}
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

	vl := victorialogs.Start(t)
	// commit_interval 1s (the default, spelled out: the Loki bound below
	// depends on it).
	const commitInterval = time.Second
	sinkCfg := fmt.Sprintf(`sinks:
  - name: loki
    type: loki
    loki:
      url: %s
      query_params: {disable_message_parsing: "1"}
      timeout: 2s
    commit_interval: %s
    retry: {initial: 100ms, max: 1s}
`, vl.PushURL(), commitInterval)
	cols := make([]*child, 3)
	addrs := make([]string, 3)
	for i := range cols {
		cols[i], addrs[i] = startCollectorChild(t, dir, fmt.Sprintf("collector-%d", i), brokers, sinkCfg)
	}

	// Sandboxes for the Events to be about, so they are attributed and a
	// workspace Follow selects them; 24 spread the load over the six
	// partitions (keyed by sandbox id), so every replica's sink partitions
	// see traffic. A fresh workspace per run: the apiserver outlives it.
	workspace := "kproof-" + scenario.NewUUID()[:8]
	clients, err := scenario.NewClients(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	sbs := make([]scenario.Sandbox, 24)
	sb := scenario.NewBuilder("kafka-proof-sandboxes", "the sandboxes the load's Events are about")
	for i := range sbs {
		sbs[i] = scenario.NewSandbox(fmt.Sprintf("kp-%02d", i), workspace, scenario.ModeManaged)
		if i == 0 {
			sb.Namespace(sbs[0])
		}
		sb.SandboxCR(sbs[i]).WorkloadPod(sbs[i])
	}
	sc, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := scenario.Play(context.Background(), clients, sc); err != nil {
		t.Fatal(err)
	}

	const batchSize, inFlight = 100, 4
	agentCfg := filepath.Join(dir, "agent.yaml")
	// hold.max_age 1s: an Event that names an object the agent does not
	// know yet is held (and holds the cursor back) until then.
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

	// active is the live replica that received the most batches since the
	// last look: the one the agent ships to.
	seen := make([]float64, 3)
	active := func() int {
		t.Helper()
		best := -1
		waitFor(t, 30*time.Second, "batches arriving at a replica", func() (bool, string) {
			var bestGain float64
			best = -1
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
		return best
	}

	// Follow the workspace on the replica the agent ships to (the first
	// one killed), from the live end, and resume elsewhere by position.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fl := &proofFollower{ws: workspace, addrs: addrs, alive: alive, ids: map[string]int{}}
	followDone := make(chan struct{})
	go func() { defer close(followDone); fl.run(ctx, active()) }()
	waitFor(t, 30*time.Second, "the follow stream to start", func() (bool, string) { return fl.started(), fl.lastErr() })

	g := newLoadGen(t, sbs[0].Namespace())
	for _, s := range sbs {
		g.pods = append(g.pods, s.PodName())
	}
	loadDone := make(chan error, 1)
	go func() { loadDone <- g.run(ctx, n, rate, 8) }()

	// killActive SIGKILLs the replica the agent ships to.
	//
	// The first kill (refuseAndLokiDown) falls while Kafka refuses writes,
	// so the replica dies holding batches Kafka has not taken, and while
	// Loki is down, so its sink members die retrying a push Loki never
	// took: one that committed before Loki acknowledged would lose those
	// records (its successor starts at the commit).
	//
	// The second (holdCursor) falls while cursor writes wait, so the
	// replica dies holding acknowledgements of batches Kafka stored: the
	// agent resends them and the backbone holds copies. Loki is up: the
	// sink members die with pushes Loki took whose offsets may not be
	// committed yet.
	id, err := topicIDOf(ctx, brokers, backbone.DefaultCursorTopic)
	if err != nil {
		t.Fatal(err)
	}
	cursorTopicID = id
	killActive := func(round int, refuseAndLokiDown bool) {
		t.Helper()
		best := active()
		if refuseAndLokiDown {
			// Loki goes down while records still flow for longer than a
			// sink batch's max_wait (1s), so every member has a batch
			// Loki refused and retries it; then Kafka refuses too.
			vl.Stop()
			time.Sleep(1500 * time.Millisecond)
			refuse.Store(true)
		} else {
			holdCursor.Store(true)
		}
		time.Sleep(700 * time.Millisecond)
		cols[best].kill()
		refuse.Store(false)
		holdCursor.Store(false)
		if refuseAndLokiDown {
			vl.Restart()
		}
		t.Logf("kill %d: SIGKILLed %s with %d Events created, refused and Loki down %v (%v)", round, cols[best].name, len(g.created()), refuseAndLokiDown, time.Since(start).Round(time.Millisecond))
	}
	waitFor(t, 60*time.Second, "the load to be acknowledged in part", func() (bool, string) {
		rv, _ := cursor()
		return rv != cursor0, rv
	})
	time.Sleep(time.Second)
	killActive(1, true)
	time.Sleep(2 * time.Second)
	killActive(2, false)
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

	// The consumers. want is every occurrence created, before and after
	// the agent's restart.
	want := g.created()
	missingFrom := func(have map[string]int) (int, string) {
		missing, first := 0, ""
		for id := range want {
			if have[id] == 0 {
				missing++
				first = id
			}
		}
		return missing, first
	}
	// Follow: the stream resumed by position must hold every occurrence,
	// and none twice (the resume seeds its window).
	waitFor(t, 30*time.Second, "every created Event in the follow stream", func() (bool, string) {
		m, first := missingFrom(fl.snapshot())
		return m == 0, fmt.Sprintf("%d of %d missing (e.g. %s); last error %s", m, len(want), first, fl.lastErr())
	})
	cancel()
	<-followDone
	fids := fl.snapshot()
	followRaw, followDups := 0, 0
	for id, c := range fids {
		followRaw += c
		followDups += c - 1
		if !want[id] {
			t.Errorf("follow stream delivered %s, which was never created", id)
		}
	}
	resumes, path := fl.resumes()
	t.Logf("follow: %d messages for %d event ids, %d repeated event_ids before dedupe; %d resubscriptions by position, on replicas %v", followRaw, len(fids), followDups, resumes, path)
	if len(path) < 2 {
		t.Errorf("the follow stream stayed on collector-%d: its replica was not killed, a resume on another replica was not exercised", path[0])
	}
	if followDups != 0 {
		t.Errorf("follow stream repeated %d occurrences: a resume by position must deliver each exactly once", followDups)
	}

	// Loki: every occurrence, duplicates within what lost partitions can
	// redeliver. A SIGKILLed member's partitions are lost, not revoked: its
	// successor starts at the last commit and pushes again what the dead
	// one pushed since (at most commit_interval's worth; the window does
	// not drop those, they come after the committed offset). What reaches
	// a partition in one commit_interval is bounded here by the load's rate
	// plus the agent's in-flight batches resent at once after a failover.
	lctx, lcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer lcancel()
	var lokiIDs map[string]int
	var rows []map[string]any
	for {
		rows, err = vl.WaitFor(lctx, `{job="eventpipe"} | fields event_id`, len(want))
		lokiIDs = map[string]int{}
		for _, r := range rows {
			id, _ := r["event_id"].(string)
			lokiIDs[id]++
		}
		m, first := missingFrom(lokiIDs)
		if err != nil {
			t.Fatalf("Loki: %v (%d of %d created occurrences missing, e.g. %s)", err, m, len(want), first)
		}
		if m == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Split: duplicate rows of occurrences the backbone holds more than
	// once (the window should have dropped the copy; only a redelivery of
	// the original can add one) and of the others (redelivery alone).
	lokiDups, lokiDupsOfCopies := 0, 0
	topicIDs, _ := backboneEventIDs(t, brokers, backbone.DefaultTopic, g.ns)
	for id := range want {
		lokiDups += lokiIDs[id] - 1
		if topicIDs[id] > 1 {
			lokiDupsOfCopies += lokiIDs[id] - 1
		}
	}
	allDups := len(rows) - len(lokiIDs)
	// What the windows of the replica still alive dropped (the killed
	// ones' counters died with them).
	var droppedSink, droppedFollow float64
	for _, i := range alive() {
		v, _ := cols[i].metric("eventpipe_collector_backbone_duplicates_dropped_total", `consumer="sink.loki"`)
		droppedSink += v
		v, _ = cols[i].metric("eventpipe_collector_backbone_duplicates_dropped_total", `consumer="follow"`)
		droppedFollow += v
	}
	t.Logf("Loki: %d rows for %d event ids; %d duplicate rows of the %d created occurrences (%d of them of occurrences the backbone holds twice; %d over all rows, the initial listing included); the live replica's windows dropped %v copies (sink) and %v (follow)",
		len(rows), len(lokiIDs), lokiDups, len(want), lokiDupsOfCopies, allDups, droppedSink, droppedFollow)
	if limit := 2 * (int(float64(rate)*commitInterval.Seconds()) + inFlight*batchSize); allDups > limit {
		t.Errorf("Loki holds %d duplicate rows, more than two lost partitions' sets can redeliver (%d: commit_interval at %d/s plus %d in flight, per kill)",
			allDups, limit, rate, inFlight*batchSize)
	}
	t.Logf("proof took %v", time.Since(start).Round(time.Millisecond))
}

// proofFollower follows a workspace on one collector replica, the way the
// gateway proxy does, and when the stream breaks resumes on a live replica
// with the last position it got (or the header's, before any message).
// It counts every occurrence it receives by event_id.
type proofFollower struct {
	ws    string
	addrs []string
	alive func() []int

	mu      sync.Mutex
	ids     map[string]int
	pos     []byte
	ok      bool
	err     error
	resumed int
	path    []int // the replicas subscribed to, in order
}

func (f *proofFollower) run(ctx context.Context, i int) {
	for ctx.Err() == nil {
		f.mu.Lock()
		if len(f.path) == 0 || f.path[len(f.path)-1] != i {
			f.path = append(f.path, i)
		}
		f.mu.Unlock()
		err := f.once(ctx, f.addrs[i])
		if ctx.Err() != nil {
			return
		}
		f.mu.Lock()
		f.err = err
		f.mu.Unlock()
		// Resume on another live replica when this one is gone.
		if live := f.alive(); !slices.Contains(live, i) && len(live) > 0 {
			i = live[0]
		}
		f.mu.Lock()
		f.resumed++
		f.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (f *proofFollower) once(ctx context.Context, addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	f.mu.Lock()
	req := &eventpipev1.FollowRequest{Workspace: f.ws, AfterPosition: f.pos}
	f.mu.Unlock()
	stream, err := eventpipev1.NewFollowClient(conn).Follow(ctx, req)
	if err != nil {
		return err
	}
	hdr, err := stream.Header()
	if err != nil {
		return err
	}
	f.mu.Lock()
	if len(f.pos) == 0 {
		// Nothing received yet: resume from the end as of this
		// subscription, not from the end as of the next one.
		if v := hdr.Get(collector.HeaderLastPosition); len(v) > 0 {
			f.pos = []byte(v[0])
		}
	}
	f.ok = len(f.pos) > 0
	f.mu.Unlock()
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		f.mu.Lock()
		f.ids[m.GetOccurrence().GetEventId()]++
		if p := m.GetPosition(); len(p) > 0 {
			f.pos = p
		}
		f.mu.Unlock()
	}
}

func (f *proofFollower) started() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ok
}

func (f *proofFollower) lastErr() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprint(f.err)
}

// resumes is how many subscriptions followed the first, and the replicas
// they went to.
func (f *proofFollower) resumes() (int, []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resumed, slices.Clone(f.path)
}

func (f *proofFollower) snapshot() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.ids)
}

// topicIDOf is a topic's id (Produce v13 and later name topics by id).
func topicIDOf(ctx context.Context, brokers []string, topic string) ([16]byte, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return [16]byte{}, err
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(mctx, cl)
	if err != nil {
		return [16]byte{}, fmt.Errorf("metadata for %s: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == topic && t.ErrorCode == 0 {
			return t.TopicID, nil
		}
	}
	return [16]byte{}, fmt.Errorf("topic %s not found", topic)
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
