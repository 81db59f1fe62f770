package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"k8s.io/client-go/rest"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich"
	"github.com/eventpipe/eventpipe/enrich/verify"
)

// Agent is one replica of the cluster agent. Create it with New and run it
// with Run.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	m        *metrics
	gatherer prometheus.Gatherer

	kc       *kubeClient // Events, Pods, PVCs, Namespaces, Sandboxes, discovery
	conn     *grpc.ClientConn
	ingest   eventpipev1.IngestClient
	identity string

	leading    atomic.Bool
	synced     atomic.Bool
	watchAlive atomic.Int64
	cur        atomic.Pointer[shipper]
	httpAddr   atomic.Pointer[string]
	dead       *deadLetters // kept across terms
	// verifier asks registries (verify.enabled); nil when off.
	verifier *verify.Verifier
}

// Options are the values of an Agent that come from code, not from YAML.
type Options struct {
	Logger *slog.Logger
	// Registerer receives the agent's metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Gatherer serves /metrics (nil: /metrics is not served).
	Gatherer prometheus.Gatherer
}

// New validates cfg and builds the clients. restCfg is the Kubernetes client
// configuration (kubeconfig or in-cluster); it is copied, never modified.
func New(cfg Config, restCfg *rest.Config, opts Options) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	if restCfg == nil {
		return nil, errors.New("agent: no Kubernetes client configuration")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: log, m: m, gatherer: opts.Gatherer}
	a.dead = newDeadLetters(log, m)
	a.cfg.Enrich.Cluster = cfg.Cluster

	counted := wrapCounting(restCfg, m)
	if counted.QPS == 0 {
		counted.QPS, counted.Burst = 50, 100
	}
	wire := rest.CopyConfig(counted)
	wire.DisableCompression = !cfg.Watch.Compression
	if a.kc, err = newKubeClient(wire); err != nil {
		return nil, err
	}
	if a.conn, err = dialCollector(cfg.Collector); err != nil {
		return nil, err
	}
	a.ingest = eventpipev1.NewIngestClient(a.conn)
	if cfg.Verify.Enabled {
		// Anonymous unless the operator granted pull secrets by name.
		vo := verify.Options{Logger: log, Registerer: opts.Registerer}
		if len(cfg.Verify.PullSecrets) > 0 {
			vo.Keychain = newSecretKeychain(a.kc, cfg.Verify.PullSecrets, log, m)
		}
		if a.verifier, err = verify.New(cfg.Verify.Registry, vo); err != nil {
			return nil, err
		}
	}
	a.identity = cfg.LeaderElection.Identity
	if a.identity == "" {
		host, _ := os.Hostname()
		a.identity = fmt.Sprintf("%s_%d", host, os.Getpid())
	}
	a.watchAlive.Store(time.Now().UnixNano())
	return a, nil
}

// Run serves /metrics, /healthz and /readyz and, while this replica leads
// (always, when leader election is off), watches and ships. It returns when
// ctx ends, after every goroutine it started has stopped.
func (a *Agent) Run(ctx context.Context) error {
	defer a.conn.Close()
	g, ctx := errgroup.WithContext(ctx)
	if a.cfg.HTTP.Listen != "" {
		lis, err := net.Listen("tcp", a.cfg.HTTP.Listen)
		if err != nil {
			return fmt.Errorf("agent http listen: %w", err)
		}
		addr := lis.Addr().String()
		a.httpAddr.Store(&addr)
		// The bound address, not the configured one: with port 0 (tests,
		// several agents on one host) this line is where it is found.
		a.log.Info("serving /metrics, /healthz and /readyz", "http", addr)
		srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error {
			if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("agent http: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	g.Go(func() error {
		if !a.cfg.LeaderElection.Enabled {
			return a.lead(ctx)
		}
		return a.elect(ctx)
	})
	return g.Wait()
}

// HTTPAddr is the address /metrics is served on, once Run has started.
func (a *Agent) HTTPAddr() string {
	if p := a.httpAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// elect campaigns for the Lease until ctx ends; each term runs lead.
func (a *Agent) elect(ctx context.Context) error {
	le := a.cfg.LeaderElection
	e := &leaseElector{
		kc: a.kc, namespace: le.Namespace, name: le.Name, identity: a.identity,
		leaseDuration: le.LeaseDuration, renewDeadline: le.RenewDeadline, retryPeriod: le.RetryPeriod,
		log: a.log, now: time.Now,
	}
	e.run(ctx, func(lctx context.Context) {
		a.log.Info("became leader", "identity", a.identity, "lease", le.Namespace+"/"+le.Name)
		if err := a.lead(lctx); err != nil {
			a.log.Error("leader term ended with an error", "err", err)
		}
	})
	return nil
}

// lead runs one term: caches, cursor, watch, processing and shipping. It
// returns when ctx ends (the Lease is lost or the agent stops).
func (a *Agent) lead(ctx context.Context) error {
	a.leading.Store(true)
	a.m.leader.Set(1)
	defer func() {
		a.leading.Store(false)
		a.synced.Store(false)
		a.cur.Store(nil)
		a.m.leader.Set(0)
	}()
	backoff := a.cfg.Watch.BackoffInitial
	for ctx.Err() == nil {
		err := a.term(ctx)
		if ctx.Err() != nil {
			return nil
		}
		a.log.Error("agent term failed; restarting", "err", err, "backoff", backoff)
		if !sleepCtx(ctx, jitter(backoff)) {
			return nil
		}
		backoff = min(backoff*2, a.cfg.Watch.BackoffMax)
	}
	return nil
}

func (a *Agent) term(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := newCaches(ctx, a.cfg, a.kc, a.log, a.m)
	if err != nil {
		return err
	}
	wait, err := c.start(ctx)
	defer func() {
		cancel()
		wait()
	}()
	if err != nil {
		return fmt.Errorf("sync caches: %w", err)
	}
	c.updateGauges()
	enr, err := enrich.New(a.cfg.Enrich, c.lookups())
	if err != nil {
		return err
	}
	startRV, err := a.getCursor(ctx)
	if err != nil {
		return err
	}
	a.log.Info("resuming event watch", "resourceVersion", startRV, "cluster", a.cfg.Cluster)
	a.synced.Store(true)
	a.watchAlive.Store(time.Now().UnixNano())

	queue := newItemQueue(a.cfg.Watch.QueueCapacity)
	sh := newShipper(a.cfg, a.ingest, a.log, a.m, a.dead)
	a.cur.Store(sh)
	w := &watcher{cfg: a.cfg.Watch, kc: a.kc, out: queue, log: a.log, m: a.m, alive: &a.watchAlive}
	p := newProcessor(a.cfg, queue, c, enr, sh, startRV, a.log, a.m)

	g, gctx := errgroup.WithContext(ctx)
	if a.verifier != nil {
		// Registry checks run beside the processor and hand it their
		// occurrences: the event path never waits on a registry.
		checks := make(chan *eventpipev1.Occurrence, 1)
		p.checks = checks
		if vc := a.cfg.Verify; vc.Supervisor.Name != "" {
			sc := &supervisorChecker{cfg: vc.Supervisor, platform: vc.Platform, ttl: vc.Registry.CacheTTL, cluster: a.cfg.Cluster,
				kc: a.kc, v: a.verifier, log: a.log, m: a.m, out: checks, now: time.Now}
			g.Go(func() error { return sc.run(gctx) })
		}
		if a.cfg.Verify.PullFailures {
			p.verify = newPullVerifier(a.verifier, a.cfg.Verify, a.log, a.m, checks)
			g.Go(func() error { return p.verify.run(gctx) })
		}
	}
	g.Go(func() error { return sh.run(gctx) })
	g.Go(func() error { return p.run(gctx) })
	g.Go(func() error { return w.run(gctx, startRV) })
	g.Go(func() error {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-t.C:
				if o := sh.oldestUnacked(); !o.IsZero() {
					a.m.cursorAge.Set(time.Since(o).Seconds())
				} else {
					a.m.cursorAge.Set(0)
				}
			}
		}
	})
	return g.Wait()
}

// getCursor asks the collector where to resume, retrying until ctx ends.
func (a *Agent) getCursor(ctx context.Context) (string, error) {
	backoff := a.cfg.Ship.BackoffInitial
	for {
		cctx, cancel := context.WithTimeout(ctx, a.cfg.Collector.DialTimeout)
		resp, err := a.ingest.GetCursor(cctx, &eventpipev1.GetCursorRequest{Cluster: a.cfg.Cluster, Stream: a.cfg.Collector.Stream})
		cancel()
		if err == nil {
			if !resp.GetFound() {
				return "", nil
			}
			return resp.GetResourceVersion(), nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		a.log.Warn("get cursor from collector failed; retrying", "err", err, "backoff", backoff)
		if !sleepCtx(ctx, jitter(backoff)) {
			return "", ctx.Err()
		}
		backoff = min(backoff*2, a.cfg.Ship.BackoffMax)
	}
}

// Leading reports whether this replica currently watches and ships.
func (a *Agent) Leading() bool { return a.leading.Load() }

// AckedResourceVersion is the cursor of the last batch the collector
// acknowledged in the current term ("" when none).
func (a *Agent) AckedResourceVersion() string {
	if sh := a.cur.Load(); sh != nil {
		if p := sh.ackedRV.Load(); p != nil {
			return *p
		}
	}
	return ""
}

// Ready reports nil when the agent is healthy: a standby replica always is;
// the leader when its caches are synced, its watch is not stale and the
// collector acknowledges in time.
func (a *Agent) Ready() error {
	if a.cfg.LeaderElection.Enabled && !a.leading.Load() {
		return nil
	}
	if !a.synced.Load() {
		return errors.New("caches not synced")
	}
	if age := time.Since(time.Unix(0, a.watchAlive.Load())); age > a.cfg.Watch.StaleAfter {
		return fmt.Errorf("event watch stale: nothing received for %s", age.Round(time.Second))
	}
	if sh := a.cur.Load(); sh != nil {
		if o := sh.oldestUnacked(); !o.IsZero() && time.Since(o) > a.cfg.Ship.AckTimeout {
			return fmt.Errorf("collector has not acknowledged for %s", time.Since(o).Round(time.Second))
		}
	}
	return nil
}

// DeadLetters returns the occurrences refused for good that are still kept
// (oldest first; /debug/deadletter serves them), and how many were
// recorded since start.
func (a *Agent) DeadLetters() ([]DeadLetter, uint64) {
	es, total, _ := a.dead.entries()
	return es, total
}

// Handler serves /metrics (when a Gatherer was given), /healthz, /readyz and
// /debug/deadletter.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	if a.gatherer != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(a.gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := a.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	if a.dead != nil {
		mux.HandleFunc("/debug/deadletter", a.dead.serveHTTP)
	}
	return mux
}
