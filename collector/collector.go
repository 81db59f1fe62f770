package collector

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/eventpipe/eventpipe/api/config"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/backbone"
	"github.com/eventpipe/eventpipe/collector/store"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/file"
	"github.com/eventpipe/eventpipe/sinks/kafka"
	"github.com/eventpipe/eventpipe/sinks/loki"
)

// Collector composes the durable log, the sink runners, the gRPC server
// (Ingest, Follow) and the HTTP server (metrics, health) under one
// lifecycle: New builds everything and binds the listeners, Run serves
// until its context ends and then shuts down in order.
type Collector struct {
	cfg        Config
	configPath string
	logger     *slog.Logger
	reg        prometheus.Registerer
	m          *metrics

	store *store.Store // nil in Kafka mode
	// backbone replaces the store in Kafka mode (nil otherwise), and
	// groupSinks and kfollow read it in place of the local runners and
	// Follow server.
	backbone   *backbone.Writer
	groupSinks *backbone.GroupSinks
	kfollow    *kafkaFollowServer
	sinkSrc    sinkSource // the log as every runner reads it: one shared decode
	runners    []*sinks.Runner
	closers    []func() error
	auth       *authenticator
	grpc       *grpc.Server
	grpcLis    net.Listener
	http       *http.Server
	httpLis    net.Listener
	ready      *readiness
	// drain is cancelled first on shutdown: streams finish what they hold
	// and end, so GracefulStop does not wait for long-lived streams.
	drain     context.Context
	stopDrain context.CancelFunc
}

// Option changes how New builds a Collector.
type Option func(*Collector)

// WithConfigPath makes Run watch the file (and the tokens file) and apply
// sink filter and token changes without a restart.
func WithConfigPath(path string) Option { return func(c *Collector) { c.configPath = path } }

// New validates cfg, opens the store, builds the sinks and binds the
// listeners. logger and reg may be nil. When reg is also a
// prometheus.Gatherer, /metrics serves it.
func New(cfg Config, logger *slog.Logger, reg prometheus.Registerer, opts ...Option) (_ *Collector, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid collector config:\n%w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Collector{cfg: cfg, logger: logger, reg: reg}
	c.drain, c.stopDrain = context.WithCancel(context.Background())
	for _, o := range opts {
		o(c)
	}
	defer func() {
		if err != nil {
			c.closeAll()
		}
	}()
	if c.m, err = newMetrics(reg); err != nil {
		return nil, err
	}

	var tokens []TokenEntry
	if cfg.Auth.TokensFile != "" {
		if tokens, err = LoadTokens(cfg.Auth.TokensFile); err != nil {
			return nil, err
		}
	}
	c.auth = &authenticator{
		failures: func(r string) { c.m.authFailures.WithLabelValues(r).Inc() },
		revoked:  c.m.streamsRevoked.Inc,
		logger:   logger.With("part", "auth"),
	}
	c.auth.state.Store(newAuthState(cfg.Auth, tokens))
	if cfg.Auth.Insecure {
		logger.Warn("INSECURE MODE: auth.insecure is true; unauthenticated callers may ingest and follow every workspace. Use only for local development.", "grpc_listen", cfg.GRPC.Listen)
		if !config.IsLoopback(cfg.GRPC.Listen) {
			logger.Warn("INSECURE MODE ON A NON-LOOPBACK ADDRESS (auth.allow_insecure_non_loopback): anyone who can reach this address may ingest any cluster and follow every workspace, unauthenticated and in plaintext", "grpc_listen", cfg.GRPC.Listen)
		}
	}
	c.auth.warnWildcards(cfg.Auth, tokens)
	if cfg.Auth.TokensFile != "" && !cfg.GRPC.TLS.Enabled() {
		logger.Warn("bearer tokens are accepted over plaintext gRPC; set grpc.tls unless the network is trusted")
	}

	if cfg.KafkaMode() {
		if err := c.openBackbone(); err != nil {
			return nil, err
		}
		var list []backbone.GroupSink
		for _, sc := range cfg.Sinks {
			p, err := c.newPusher(sc)
			if err != nil {
				return nil, err
			}
			list = append(list, backbone.GroupSink{Runner: sc.RunnerConfig(), Pusher: p})
		}
		if len(list) > 0 {
			if c.groupSinks, err = backbone.NewGroupSinks(*cfg.Backbone, list, logger.With("part", "sinks"), reg); err != nil {
				return nil, err
			}
		}
		if c.kfollow, err = newKafkaFollowServer(*cfg.Backbone, cfg.Follow, logger.With("api", "follow"), c.m, reg, c.drain); err != nil {
			return nil, err
		}
		c.ready = &readiness{log: c.backbone, what: "kafka backbone"}
	} else {
		if c.store, err = store.Open(cfg.Store, logger.With("part", "store"), reg); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		c.sinkSrc = newSinkSource(c.store)
		for _, sc := range cfg.Sinks {
			if err := c.addSink(sc); err != nil {
				return nil, err
			}
		}
		c.ready = &readiness{log: c.store}
	}

	if err := c.buildGRPC(); err != nil {
		return nil, err
	}
	c.buildHTTP()
	if c.grpcLis, err = net.Listen("tcp", cfg.GRPC.Listen); err != nil {
		return nil, fmt.Errorf("listen grpc: %w", err)
	}
	if c.httpLis, err = net.Listen("tcp", cfg.HTTP.Listen); err != nil {
		return nil, fmt.Errorf("listen http: %w", err)
	}
	return c, nil
}

// openBackbone builds the Kafka writer and checks (or creates) its topics:
// a collector that cannot reach the brokers, or finds a topic missing with
// create_topics off, does not start.
func (c *Collector) openBackbone() error {
	w, err := backbone.NewWriter(*c.cfg.Backbone, c.logger.With("part", "backbone"), c.reg)
	if err != nil {
		return err
	}
	c.backbone = w
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Backbone.ProduceTimeout)
	defer cancel()
	if err := w.CheckTopics(ctx); err != nil {
		return err
	}
	return nil
}

// newPusher builds the destination of one sink entry; its Close is run
// when the collector stops.
func (c *Collector) newPusher(sc SinkConfig) (sinks.Pusher, error) {
	slogger := c.logger.With("sink", sc.Name)
	var p sinks.Pusher
	var closeFn func() error
	switch sc.Type {
	case SinkFile:
		s, err := file.New(*sc.File, slogger, c.reg)
		if err != nil {
			return nil, fmt.Errorf("sink %q: %w", sc.Name, err)
		}
		p, closeFn = s, s.Close
	case SinkLoki:
		s, err := loki.New(*sc.Loki, slogger, c.reg)
		if err != nil {
			return nil, fmt.Errorf("sink %q: %w", sc.Name, err)
		}
		p, closeFn = s, s.Close
	case SinkKafka:
		s, err := kafka.New(*sc.Kafka, slogger, c.reg)
		if err != nil {
			return nil, fmt.Errorf("sink %q: %w", sc.Name, err)
		}
		p, closeFn = s, s.Close
	default:
		return nil, fmt.Errorf("sink %q: unknown type %q", sc.Name, sc.Type)
	}
	c.closers = append(c.closers, closeFn)
	return p, nil
}

func (c *Collector) addSink(sc SinkConfig) error {
	p, err := c.newPusher(sc)
	if err != nil {
		return err
	}
	cur, err := c.store.Cursor(sc.Name)
	if err != nil {
		return fmt.Errorf("sink %q: cursor: %w", sc.Name, err)
	}
	r, err := sinks.NewRunner(sc.RunnerConfig(), p, c.sinkSrc, cur, c.logger, c.reg)
	if err != nil {
		return fmt.Errorf("sink %q: %w", sc.Name, err)
	}
	c.runners = append(c.runners, r)
	return nil
}

func (c *Collector) buildGRPC() error {
	cfg := c.cfg.GRPC
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.MaxRecvBytes),
		grpc.MaxSendMsgSize(cfg.MaxSendBytes),
		grpc.ChainUnaryInterceptor(c.auth.unary),
		grpc.ChainStreamInterceptor(c.auth.stream),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if cfg.TLS.Enabled() {
		clientAuth := tls.RequireAndVerifyClientCert
		if c.cfg.Auth.TokensFile != "" {
			// Token holders connect without a certificate.
			clientAuth = tls.VerifyClientCertIfGiven
		}
		// Certificate and client CA are re-read when their files change
		// (reload.go): new handshakes use the new ones.
		tr, err := newTLSReloader(cfg.TLS, clientAuth, c.logger.With("part", "tls"), c.reg)
		if err != nil {
			return err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tr.serverConfig())))
	}
	c.grpc = grpc.NewServer(opts...)
	ingest := &ingestServer{
		logger: c.logger.With("api", "ingest"), m: c.m, pipeline: cfg.IngestPipeline, maxRecv: cfg.MaxRecvBytes, drain: c.drain,
	}
	if c.backbone != nil {
		ingest.log, ingest.maxOcc = backboneLog{c.backbone}, c.backbone.MaxOccurrenceBytes()
		eventpipev1.RegisterIngestServer(c.grpc, ingest)
		eventpipev1.RegisterFollowServer(c.grpc, c.kfollow)
		return nil
	}
	ingest.log = storeLog{c.store}
	eventpipev1.RegisterIngestServer(c.grpc, ingest)
	eventpipev1.RegisterFollowServer(c.grpc, &followServer{
		log: c.store, logger: c.logger.With("api", "follow"), m: c.m,
		chunk: c.cfg.Follow.ReadChunk, maxTail: c.cfg.Follow.MaxTail, maxScan: c.cfg.Follow.MaxTailScan,
		cache: newChunkCache(c.store, c.cfg.Follow.ReadChunk, followCacheChunks), drain: c.drain,
	})
	return nil
}

// followCacheChunks bounds the chunks of decoded records shared by follow
// subscribers (with the default chunk of 512: at most 8192 records).
const followCacheChunks = 16

// GRPCAddr is the bound gRPC address (useful with port 0).
func (c *Collector) GRPCAddr() string { return c.grpcLis.Addr().String() }

// HTTPAddr is the bound HTTP address.
func (c *Collector) HTTPAddr() string { return c.httpLis.Addr().String() }

// Store is the collector's log (for tests and tools in-process); nil in
// Kafka mode.
func (c *Collector) Store() *store.Store { return c.store }

// Runners are the sink runners, in configuration order.
func (c *Collector) Runners() []*sinks.Runner { return c.runners }

func (c *Collector) closeAll() {
	c.stopDrain()
	if c.grpcLis != nil {
		c.grpcLis.Close()
	}
	if c.httpLis != nil {
		c.httpLis.Close()
	}
	for _, f := range c.closers {
		if err := f(); err != nil {
			c.logger.Warn("close sink", "err", err)
		}
	}
	c.closers = nil
	if c.store != nil {
		if err := c.store.Close(); err != nil {
			c.logger.Warn("close store", "err", err)
		}
	}
	if c.kfollow != nil {
		c.kfollow.Close()
		c.kfollow = nil
	}
	if c.backbone != nil {
		c.backbone.Close()
		c.backbone = nil
	}
}

// Run starts the store, then the sinks, then the servers, and blocks until
// ctx ends or a part fails. Shutdown runs in the opposite order: stop
// accepting ingest (GracefulStop, bounded by grpc.shutdown_grace, then
// Stop), stop the HTTP server, let the sinks stop (each flushes what it
// holds), stop the store and close it. Run may be called once.
func (c *Collector) Run(ctx context.Context) error {
	// c.cfg changes on reload: read what Run needs now.
	grace, storeDir, nSinks := c.cfg.GRPC.ShutdownGrace, c.cfg.Store.Dir, len(c.cfg.Sinks)
	if c.backbone != nil {
		storeDir = "kafka:" + c.cfg.Backbone.Topic
	}
	root, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	var errMu sync.Mutex
	var firstErr error
	record := func(part string, err error) {
		if err == nil || errors.Is(err, context.Canceled) {
			return
		}
		errMu.Lock()
		if firstErr == nil {
			firstErr = fmt.Errorf("%s: %w", part, err)
		}
		errMu.Unlock()
		c.logger.Error("collector part failed; shutting down", "part", part, "err", err)
		fail(err)
	}
	// A part that ends before shutdown was asked for is a failure too.
	early := func(part string, err error) {
		if err == nil && root.Err() == nil {
			err = errors.New("stopped unexpectedly")
		}
		record(part, err)
	}

	storeCtx, stopStore := context.WithCancel(context.Background())
	defer stopStore()
	var storeG errgroup.Group
	if c.store != nil {
		storeG.Go(func() error { early("store", c.store.Run(storeCtx)); return nil })
	}

	sinkCtx, stopSinks := context.WithCancel(context.Background())
	defer stopSinks()
	var sinkG errgroup.Group
	for _, r := range c.runners {
		sinkG.Go(func() error { early("sink "+r.Name(), r.Run(sinkCtx)); return nil })
	}
	if c.groupSinks != nil {
		// Each sink is a consumer group member; on stop it commits what
		// its partitions delivered and leaves the groups, so the other
		// replicas take the partitions over at once.
		sinkG.Go(func() error { early("sinks (consumer groups)", c.groupSinks.Run(sinkCtx)); return nil })
	}

	frontCtx, stopFront := context.WithCancel(context.Background())
	defer stopFront()
	var frontG errgroup.Group
	frontG.Go(func() error {
		err := c.grpc.Serve(c.grpcLis)
		if errors.Is(err, grpc.ErrServerStopped) {
			err = nil
		}
		early("grpc server", err)
		return nil
	})
	frontG.Go(func() error {
		err := c.http.Serve(c.httpLis)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		early("http server", err)
		return nil
	})
	if c.configPath != "" {
		frontG.Go(func() error {
			if err := c.watchConfig(frontCtx); err != nil {
				// Reload is a convenience: losing it is logged, not fatal.
				c.logger.Error("config watcher stopped; changes now need a restart", "err", err)
			}
			return nil
		})
	}
	c.logger.Info("collector started", "grpc", c.GRPCAddr(), "http", c.HTTPAddr(), "sinks", nSinks, "store", storeDir)

	<-root.Done()
	c.logger.Info("collector stopping: ingress first", "grace", grace)
	deadline := time.Now().Add(grace)
	stopped := make(chan struct{})
	go func() { c.grpc.GracefulStop(); close(stopped) }()
	c.stopDrain()
	select {
	case <-stopped:
	case <-time.After(grace):
		c.logger.Warn("graceful stop timed out; closing open streams")
		c.grpc.Stop()
		<-stopped
	}
	if c.kfollow != nil {
		// The gRPC server has stopped: every Follow stream has ended.
		c.kfollow.Close()
		c.kfollow = nil
	}
	hctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if err := c.http.Shutdown(hctx); err != nil {
		c.http.Close()
	}
	cancel()
	stopFront()
	frontG.Wait()

	// Flush: nothing new arrives now; give the sinks the rest of the grace
	// (at least a second) to deliver what the log holds, so a restart
	// replays less. Whatever is left stays in the log for next time.
	c.flushSinks(time.Until(deadline))
	stopSinks()
	sinkG.Wait()
	for _, f := range c.closers {
		if err := f(); err != nil {
			c.logger.Warn("close sink", "err", err)
		}
	}
	c.closers = nil

	stopStore()
	storeG.Wait()
	if c.store != nil {
		if err := c.store.Close(); err != nil {
			record("close store", err)
		}
		c.store = nil
	}
	if c.backbone != nil {
		// Every acknowledged batch is in Kafka already: nothing to flush.
		c.backbone.Close()
		c.backbone = nil
	}
	c.logger.Info("collector stopped")
	errMu.Lock()
	defer errMu.Unlock()
	return firstErr
}

// flushSinks waits until every running sink has handled the whole log, or
// until max (at least a second) has passed, and says which did not.
func (c *Collector) flushSinks(max time.Duration) {
	if len(c.runners) == 0 {
		return
	}
	max = time.Duration(math.Max(float64(max), float64(time.Second)))
	// The newest record, not Bounds' last: offsets a repair skipped at the
	// end of the log hold nothing to deliver (issue 21).
	last := c.store.LastRecord()
	deadline := time.Now().Add(max)
	for {
		var behind []string
		for _, r := range c.runners {
			// Handled, not Cursor: a runner commits what it handled when it
			// stops (stopSinks, right after this).
			if st := r.Status(); st.Running && st.Handled < last {
				behind = append(behind, fmt.Sprintf("%s (%d records)", st.Name, last-st.Handled))
			}
		}
		if len(behind) == 0 {
			c.logger.Info("sinks flushed", "offset", last)
			return
		}
		if time.Now().After(deadline) {
			c.logger.Warn("sinks not flushed within the shutdown grace; they resume from their cursors after restart", "behind", behind)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
