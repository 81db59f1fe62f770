package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/eventpipe/eventpipe/agent"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// endToEnd: Events created in the real kube-apiserver as fast as it takes
// them (-workers goroutines), about the pods of 20 healthy sandboxes; the
// latency is from the create call's return (the Event exists) to the
// platform event's receipt by the gateway client through agent,
// collector and proxy. With -hollow-nodes the Events are written by the
// components that write them instead (see hollowLoad).
func (e *env) endToEnd() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var kw kube.Writers
	if *hollowNodes > 0 {
		kw = kube.AllWriters
	}
	cl, err := kube.StartProcess(ctx, kube.Options{Dir: filepath.Join(e.dir, "kube"), StartTimeout: 3 * time.Minute,
		Logger: slog.New(slog.DiscardHandler), Writers: kw})
	if err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	defer cl.Stop()

	acfg := agent.NewDefaultConfig()
	acfg.Cluster = "bench"
	acfg.Collector.Address = e.col.GRPCAddr()
	acfg.Collector.Insecure = true
	acfg.HTTP.Listen = ""
	acfg.LeaderElection.Enabled = false
	// The agent's shipping defaults (flush_interval 200ms, flush_when_idle
	// on): the figure is what a default install gets. -agent-flush-interval
	// reproduces the earlier runs (20ms, before flush_when_idle existed).
	if *agentFlushInterval > 0 {
		acfg.Ship.FlushInterval = *agentFlushInterval
	}
	acfg.Ship.FlushWhenIdle = *agentFlushWhenIdle
	ag, err := agent.New(acfg, cl.AgentConfig(), agent.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	agDone := make(chan error, 1)
	go func() { agDone <- ag.Run(ctx) }()
	defer func() { cancel(); <-agDone }()

	// Sandboxes (namespace, CR, pods) for attribution.
	clients, err := scenario.NewClients(cl.AdminConfig())
	if err != nil {
		return err
	}
	type pod struct{ ns, name, uid string }
	var pods []pod
	healthy, creators := 20, *workers
	if *hollowNodes > 0 {
		healthy, creators = 0, 0 // the load mode's sandboxes and Events are the writers'
	}
	for i := range healthy {
		s, err := scenario.Build("healthy", scenario.Params{Mode: scenario.ModeManaged, Workspace: fmt.Sprintf("bench%d", i)})
		if err != nil {
			return err
		}
		res, err := scenario.Play(ctx, clients, s)
		if err != nil {
			return err
		}
		sb := s.Events()[0].Sandbox
		pods = append(pods, pod{sb.Namespace(), sb.PodName(), res.UIDs["Pod "+sb.Namespace()+"/"+sb.PodName()]})
	}
	for ag.Ready() != nil {
		time.Sleep(100 * time.Millisecond)
	}

	p, err := e.startProxy("e2e")
	if err != nil {
		return err
	}
	defer p.stop()
	c, err := dialPeer(p.sock)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := waitServing(c, 10*time.Second); err != nil {
		return err
	}
	w, err := c.Watch(ctx)
	if err != nil {
		return err
	}
	// Receipt times by event_id (Event UID/resourceVersion: one per
	// occurrence; the scenarios' own events arrive too and are ignored:
	// they were not created below).
	var recvMu sync.Mutex
	recv := map[string]time.Time{}
	var dups atomic.Int64
	go func() {
		for {
			ev, err := w.Recv()
			if err != nil {
				return
			}
			if ev.Platform == nil {
				continue
			}
			now := time.Now()
			id := ev.Platform.Metadata["eventpipe.event_id"]
			recvMu.Lock()
			if _, ok := recv[id]; ok {
				dups.Add(1)
			} else {
				recv[id] = now
			}
			recvMu.Unlock()
		}
	}()
	// The same occurrences read straight from the collector's Follow
	// stream (in this process, the proxy's selector): receipt there minus
	// creation is the apiserver + agent + collector part; the gateway
	// client's receipt minus this is the proxy's part (both clocks are
	// this process's).
	var folMu sync.Mutex
	fol := map[string]time.Time{}
	observed := map[string]time.Time{} // the agent's watch receipt (observed_at)
	fconn, err := grpc.NewClient(e.col.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer fconn.Close()
	fs, err := eventpipev1.NewFollowClient(fconn).Follow(ctx, &eventpipev1.FollowRequest{GatewayId: "openshell"})
	if err != nil {
		return err
	}
	go func() {
		for {
			m, err := fs.Recv()
			if err != nil {
				return
			}
			now := time.Now()
			folMu.Lock()
			id := m.GetOccurrence().GetEventId()
			fol[id] = now
			observed[id] = m.GetOccurrence().GetObservedAt().AsTime()
			folMu.Unlock()
		}
	}()
	var createdMu sync.Mutex
	created := map[string]time.Time{} // event_id -> create call return (load mode: the harness's watch receipt)
	what := map[string]string{}       // load mode: event_id -> "writer reason kind"

	kc, err := kubernetes.NewForConfig(cl.AdminConfig())
	if err != nil {
		return err
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(*e2eFor)
	if *hollowNodes > 0 {
		if err := hollowLoad(ctx, cl, kc, func(id string, at time.Time, w string) {
			createdMu.Lock()
			created[id] = at
			what[id] = w
			createdMu.Unlock()
			total.Add(1)
		}); err != nil {
			return err
		}
	}
	for wk := range creators {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				pd := pods[(wk+i)%len(pods)]
				now := metav1.NewTime(time.Now())
				ev := &corev1.Event{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x%02d", pd.name, time.Now().UnixNano(), wk), Namespace: pd.ns},
					InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: pd.ns, Name: pd.name, UID: types.UID(pd.uid),
						APIVersion: "v1", FieldPath: "spec.containers{agent}"},
					Reason: "Started", Message: "Started container agent", Type: corev1.EventTypeNormal,
					Source:         corev1.EventSource{Component: "kubelet", Host: "node-1"},
					FirstTimestamp: now, LastTimestamp: now, Count: 1,
				}
				out, err := kc.CoreV1().Events(pd.ns).Create(ctx, ev, metav1.CreateOptions{})
				if err != nil {
					continue
				}
				done := time.Now()
				createdMu.Lock()
				created[string(out.UID)+"/"+out.ResourceVersion] = done
				createdMu.Unlock()
				total.Add(1)
			}
		}()
	}
	wg.Wait()
	rate := float64(total.Load()) / e2eFor.Seconds()
	count := func() (lat []time.Duration, missing []string) {
		recvMu.Lock()
		defer recvMu.Unlock()
		for uid, c := range created {
			r, ok := recv[uid]
			if !ok {
				missing = append(missing, uid)
				continue
			}
			lat = append(lat, max(r.Sub(c), 0))
		}
		return lat, missing
	}
	deadline := time.Now().Add(60 * time.Second)
	lat, missing := count()
	for len(missing) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		lat, missing = count()
	}
	if *hollowNodes > 0 {
		fmt.Printf("e2e: %d Event changes written by the kubelets, scheduler and controllers in %s (%.0f/s), %d received by the gateway client, %d duplicates\n",
			total.Load(), *e2eFor, rate, len(lat), dups.Load())
	} else {
		fmt.Printf("e2e: %d Events created in %s (%.0f/s, %d workers), %d received by the gateway client, %d duplicates\n",
			total.Load(), *e2eFor, rate, *workers, len(lat), dups.Load())
	}
	if len(missing) > 0 {
		// Where were they lost: before the collector, or after it?
		stored := map[string]bool{}
		for from := uint64(1); ; {
			recs, _, err := e.col.Store().Read(ctx, from, 4096)
			if err != nil || len(recs) == 0 {
				break
			}
			for _, r := range recs {
				stored[r.Occurrence.GetEventId()] = true
				from = r.Offset + 1
			}
		}
		atCollector := 0
		for _, uid := range missing {
			if stored[uid] {
				atCollector++
			}
		}
		fmt.Printf("e2e: %d Events never reached the gateway client (%d of them are in the collector's log), e.g. %s\n", len(missing), atCollector, missing[0])
		if len(what) > 0 {
			byWhat := map[string]int{}
			for _, id := range missing {
				byWhat[what[id]]++
			}
			fmt.Printf("e2e: not at the gateway client, by writer, reason and object: %v\n", byWhat)
		}
	}
	from := "Event created"
	if *hollowNodes > 0 {
		from = "Event change seen by the harness's watch"
	}
	fmt.Printf("e2e latency (%s -> gateway client): %s\n", from, summaryMS(lat))
	if len(what) > 0 {
		byWhat := map[string]int{}
		createdMu.Lock()
		for _, w := range what {
			byWhat[w]++
		}
		createdMu.Unlock()
		fmt.Printf("e2e load: Event changes by writer, reason and object: %v\n", byWhat)
	}
	var toCol, toAgent, agentToCol, proxyLeg []time.Duration
	recvMu.Lock()
	folMu.Lock()
	for uid, c := range created {
		f, ok := fol[uid]
		if !ok {
			continue
		}
		toCol = append(toCol, max(f.Sub(c), 0))
		o := observed[uid]
		toAgent = append(toAgent, max(o.Sub(c), 0))
		if o.Before(c) {
			o = c // the watch delivered it before the create call returned
		}
		agentToCol = append(agentToCol, f.Sub(o))
		if r, ok := recv[uid]; ok {
			proxyLeg = append(proxyLeg, r.Sub(f))
		}
	}
	folMu.Unlock()
	recvMu.Unlock()
	fmt.Printf("e2e part 1 (%s -> collector Follow reader in process): %s\n", from, summaryMS(toCol))
	fmt.Printf("e2e part 1a (%s -> agent's watch receipt, observed_at): %s\n", from, summaryMS(toAgent))
	fmt.Printf("e2e part 1b (agent's watch receipt -> collector Follow reader: agent batch, ship, collector fsync, Follow): %s\n", summaryMS(agentToCol))
	fmt.Printf("e2e part 2 (collector Follow reader -> gateway client, through the proxy): %s\n", summaryMS(proxyLeg))
	fmt.Printf("e2e latency p99: %.1fms\n", float64(pct(lat, .99))/float64(time.Millisecond))
	return nil
}
