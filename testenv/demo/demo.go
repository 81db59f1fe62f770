package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/eventpipe/eventpipe/agent"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/diagnosis"
	"github.com/eventpipe/eventpipe/sinks/file"
	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/osdriver"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// DefaultScenarios are the testenv/osdriver scenarios Run creates by
// default: the two seeds (their pulls fail in the hollow node's kubelet),
// blockers the scheduler and the controller-manager write themselves, and a
// healthy sandbox.
var DefaultScenarios = []string{"img-missing", "sup-bad", "pvc-unbound", "no-cpu", "taint", "selector", "healthy"}

// Config says what to run.
type Config struct {
	// Kubeconfig, when set, runs against that cluster (read-only) instead
	// of starting the loopback control plane; Context picks a context.
	Kubeconfig string
	Context    string
	// Gateway is the gateway id whose sandboxes the view shows (default
	// "openshell", the Helm chart's default).
	Gateway string
	// DataDir holds the collector's log, the file sink, the tokens and the
	// logs. Default: a temporary directory removed when Run returns.
	DataDir string
	// BinDir holds etcd, kube-apiserver, kubeparts and the Agent Sandbox
	// controller (default: $EVENTPIPE_BIN_DIR, else <repo root>/.bin);
	// missing ones are built there.
	BinDir string
	// Scenarios are the testenv/osdriver scenarios created in the control
	// plane of its own (default DefaultScenarios), each in Mode (default
	// managed). That control plane runs the writers (testenv/kube
	// AllWriters: kube-scheduler, kube-controller-manager, the Agent
	// Sandbox controller) and one hollow node (a real kubelet), and the
	// sandboxes are created as the OpenShell driver would: every Event and
	// condition shown is written by a Kubernetes component.
	Scenarios []string
	Mode      scenario.Mode
	// Out receives the view. Terminal redraws it in place every Refresh
	// (default 1s); otherwise a new view is printed whenever a diagnosis
	// changes.
	Out      io.Writer
	Terminal bool
	Refresh  time.Duration
	// CLI is the eventpipe command the view's "try" line names, so that
	// the line runs as printed: make run passes the binary it built
	// ($(BIN)/eventpipe, an absolute path). Default "eventpipe" (on PATH).
	CLI string
}

func (c *Config) defaults() {
	if c.CLI == "" {
		c.CLI = "eventpipe"
	}
	if c.Gateway == "" {
		c.Gateway = scenario.DefaultGateway
	}
	if c.Scenarios == nil && c.Kubeconfig == "" {
		c.Scenarios = DefaultScenarios
	}
	if c.Mode == "" {
		c.Mode = scenario.ModeManaged
	}
	if c.Refresh <= 0 {
		c.Refresh = time.Second
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
}

// Run runs the pipeline until ctx ends or a component fails (see the
// package doc). It returns nil after a clean stop on ctx.
func Run(ctx context.Context, cfg Config) (err error) {
	cfg.defaults()
	if len(cfg.Scenarios) > 0 && cfg.Kubeconfig != "" {
		return errors.New("scenarios are created in the control plane of its own: not with a kubeconfig")
	}
	for _, s := range cfg.Scenarios {
		if known := osdriver.Names(); !slices.Contains(known, s) {
			return fmt.Errorf("unknown scenario %q (known: %s)", s, strings.Join(known, ", "))
		}
	}
	d := &demo{cfg: cfg, out: cfg.Out, start: time.Now()}
	dir := cfg.DataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "eventpipe-run-"); err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		defer func() {
			if rmErr := os.RemoveAll(dir); rmErr != nil && err == nil {
				err = fmt.Errorf("remove data dir: %w", rmErr)
			}
		}()
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	d.dir = dir
	logFile, err := os.OpenFile(filepath.Join(dir, "eventpipe.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	defer logFile.Close()
	d.logger = slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))
	err = d.run(ctx)
	what := "agent and collector"
	if d.cluster != nil {
		what = "agent, collector and control plane"
		if stopErr := d.cluster.Stop(); stopErr != nil {
			d.printf("stop the control plane: %v\n", stopErr)
			if err == nil {
				err = fmt.Errorf("stop the control plane: %w", stopErr)
			}
		}
	}
	if err == nil {
		d.printf("stopped: %s (data directory %s)\n", what, d.keptOrRemoved())
	}
	return err
}

type demo struct {
	cfg    Config
	out    io.Writer
	dir    string
	logger *slog.Logger
	start  time.Time

	outMu sync.Mutex // serializes writes to out

	cluster   *kube.Cluster
	coll      *collector.Collector
	ag        *agent.Agent
	agentReg  *prometheus.Registry
	watcher   *diagnosis.Watcher
	readerTok string

	mu       sync.Mutex
	played   []string // "name: description (namespace, id; written by ...)"
	playErr  error
	playDone bool
}

func (d *demo) printf(format string, a ...any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	fmt.Fprintf(d.out, format, a...)
}

func (d *demo) run(ctx context.Context) error {
	cfg := d.cfg
	var restCfg *rest.Config
	if cfg.Kubeconfig == "" {
		d.printf("eventpipe: the whole pipeline on this machine, on a control plane of its own (nothing else is touched)\n")
		binDir, err := ensureBinaries(ctx, cfg.BinDir, d.printf)
		if err != nil {
			return err
		}
		t0 := time.Now()
		cl, err := kube.StartProcess(ctx, kube.Options{Dir: filepath.Join(d.dir, "cluster"), BinDir: binDir, Logger: d.logger, Writers: kube.AllWriters})
		if err != nil {
			return fmt.Errorf("start the control plane: %w", err)
		}
		d.cluster = cl // Run stops it after everything that uses it
		etcdPID, apiPID := cl.PIDs()
		d.printf("  control plane  kube-apiserver %s (pid %d), etcd %s (pid %d): ready in %s\n",
			cl.URL(), apiPID, cl.EtcdURL(), etcdPID, time.Since(t0).Round(time.Millisecond))
		pids := cl.WriterPIDs()
		names := slices.Sorted(maps.Keys(pids))
		for i, n := range names {
			names[i] = fmt.Sprintf("%s (pid %d)", n, pids[n])
		}
		d.printf("  writers        %s\n", strings.Join(names, ", "))
		t1 := time.Now()
		node, err := osdriver.StartNode(ctx, cl)
		if err != nil {
			return fmt.Errorf("start the hollow node: %w", err)
		}
		d.printf("  node           %s: a real kubelet (pid %d) with eventpipe's CRI, Ready in %s (log %s)\n",
			node.Name(), node.PID(), time.Since(t1).Round(time.Millisecond), filepath.Join(node.Dir(), "kubelet.log"))
		d.printf("  kubeconfig     %s (admin; kubectl --kubeconfig %s get events -A)\n", cl.Kubeconfig(), cl.Kubeconfig())
		restCfg = cl.AgentConfig()
	} else {
		d.printf("eventpipe: the pipeline on this machine against the cluster of %s (read-only: list and watch)\n", cfg.Kubeconfig)
		rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: cfg.Kubeconfig}
		c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: cfg.Context}).ClientConfig()
		if err != nil {
			return fmt.Errorf("kubeconfig %s: %w", cfg.Kubeconfig, err)
		}
		restCfg = c
		d.printf("  cluster        %s\n", c.Host)
	}

	if err := d.startCollector(); err != nil {
		return err
	}
	collCtx, stopColl := context.WithCancel(context.WithoutCancel(ctx))
	collDone := make(chan error, 1)
	go func() { collDone <- d.coll.Run(collCtx) }()
	stopCollector := func() error {
		stopColl()
		return <-collDone
	}
	// Ingress first on the way down: the agent and the view, then the
	// collector.
	inner, cancelInner := context.WithCancel(ctx)
	defer cancelInner()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	defer func() {
		cancelInner()
		wg.Wait()
	}()

	if err := d.startAgent(restCfg); err != nil {
		_ = stopCollector()
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := d.ag.Run(inner); err != nil && inner.Err() == nil {
			errs <- fmt.Errorf("agent: %w", err)
		}
	}()
	conn, err := d.readerConn()
	if err != nil {
		cancelInner()
		wg.Wait()
		_ = stopCollector()
		return err
	}
	defer conn.Close()
	d.watcher, err = diagnosis.NewWatcher(eventpipev1.NewFollowClient(conn),
		&eventpipev1.FollowRequest{GatewayId: cfg.Gateway, Tail: 10_000}, diagnosis.WatchOptions{Logger: d.logger})
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := d.watcher.Run(inner); err != nil {
			errs <- fmt.Errorf("follow stream: %w", err)
		}
	}()
	d.printf("  collector      gRPC %s (Ingest, Follow; tokens), durable log %s\n", d.coll.GRPCAddr(), filepath.Join(d.dir, "log"))
	d.printf("  agent          as %s (least privilege: list/watch)\n", d.agentIdentity())
	d.printf("  data, logs     %s\n", d.dir)
	if d.cluster != nil && len(cfg.Scenarios) > 0 {
		d.printf("  creating       %s as the OpenShell driver would (%s mode); the kubelet, scheduler and controllers write the rest\n", strings.Join(cfg.Scenarios, ", "), cfg.Mode)
		drv, err := osdriver.New(d.cluster.AdminConfig())
		if err != nil {
			return err
		}
		// After the view: a scenario's webhook server must answer for as
		// long as the controller retries.
		defer func() {
			if err := drv.Close(); err != nil {
				d.logger.Warn("stop the scenarios' servers", "err", err)
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.createSandboxes(inner, drv)
		}()
	}
	d.printf("  Ctrl-C stops everything.\n\n")

	viewErr := d.view(inner, errs)
	cancelInner()
	wg.Wait()
	// The view's last word: where the data went, as it stands at the end.
	d.printf("\n%s", d.dataTextFinal(true))
	if err := stopCollector(); err != nil && viewErr == nil {
		viewErr = fmt.Errorf("collector: %w", err)
	}
	return viewErr
}

func (d *demo) keptOrRemoved() string {
	if d.cfg.DataDir == "" {
		return d.dir + " removed"
	}
	return d.dir + " kept"
}

func (d *demo) agentIdentity() string {
	if d.cluster != nil {
		return kube.AgentUser
	}
	return "the kubeconfig's user"
}

// randomToken returns a bearer token for the collector's tokens file.
func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func (d *demo) startCollector() error {
	agentTok, err := randomToken()
	if err != nil {
		return err
	}
	if d.readerTok, err = randomToken(); err != nil {
		return err
	}
	tokens := fmt.Sprintf("- {token: %s, name: demo-agent, role: agent, clusters: [local, make-run]}\n- {token: %s, name: demo-reader, role: reader, workspaces: [\"*\"]}\n", agentTok, d.readerTok)
	for name, content := range map[string]string{"tokens.yaml": tokens, "agent.token": agentTok + "\n", "reader.token": d.readerTok + "\n"} {
		if err := os.WriteFile(filepath.Join(d.dir, name), []byte(content), 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen, cfg.HTTP.Listen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = 3 * time.Second
	cfg.Store.Dir = filepath.Join(d.dir, "log")
	cfg.Auth.TokensFile = filepath.Join(d.dir, "tokens.yaml")
	fc := file.NewDefaultConfig()
	fc.Path = d.fileSinkPath()
	rc := sinks.NewDefaultRunnerConfig("file")
	cfg.Sinks = []collector.SinkConfig{{Name: "file", Type: collector.SinkFile, File: &fc, Batch: rc.Batch, Retry: rc.Retry, CommitInterval: rc.CommitInterval}}
	c, err := collector.New(cfg, d.logger.With("component", "collector"), prometheus.NewRegistry())
	if err != nil {
		return fmt.Errorf("collector: %w", err)
	}
	d.coll = c
	return nil
}

func (d *demo) fileSinkPath() string { return filepath.Join(d.dir, "events.jsonl") }

func (d *demo) startAgent(restCfg *rest.Config) error {
	cfg := agent.NewDefaultConfig()
	cfg.Cluster = "local"
	if d.cluster != nil {
		cfg.Cluster = "make-run"
	}
	cfg.Collector.Address = d.coll.GRPCAddr()
	cfg.Collector.Insecure = true // loopback
	cfg.Collector.TokenFile = filepath.Join(d.dir, "agent.token")
	cfg.LeaderElection.Enabled = false // read-only: no Lease
	cfg.HTTP.Listen = "127.0.0.1:0"
	d.agentReg = prometheus.NewRegistry()
	a, err := agent.New(cfg, restCfg, agent.Options{Logger: d.logger.With("component", "agent"), Registerer: d.agentReg, Gatherer: d.agentReg})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	d.ag = a
	return nil
}

type readerToken string

func (t readerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}
func (readerToken) RequireTransportSecurity() bool { return false }

func (d *demo) readerConn() (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(d.coll.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(readerToken(d.readerTok)))
	if err != nil {
		return nil, fmt.Errorf("follow client: %w", err)
	}
	return conn, nil
}

func (d *demo) setPlayErr(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.playErr == nil {
		d.playErr = err
	}
	d.playDone = true
}

// ensureBinaries returns the directory holding etcd, kube-apiserver,
// kubeparts and agent-sandbox-controller, building them with
// testenv/build/build.sh when missing and showing the build's progress and
// duration.
func ensureBinaries(ctx context.Context, binDir string, printf func(string, ...any)) (string, error) {
	if binDir == "" {
		binDir = os.Getenv(kube.BinDirEnv)
	}
	root, rootErr := kube.RepoRoot()
	if binDir == "" {
		if rootErr != nil {
			return "", fmt.Errorf("find the control plane binaries (set %s): %w", kube.BinDirEnv, rootErr)
		}
		binDir = filepath.Join(root, ".bin")
	}
	names := []string{"etcd", "kube-apiserver", "kubeparts", "agent-sandbox-controller"}
	missing := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return executable(filepath.Join(binDir, n)) })
	if len(missing) == 0 {
		printf("  control plane  binaries in %s\n", binDir)
		return binDir, nil
	}
	if rootErr != nil {
		return "", fmt.Errorf("build the control plane into %s: %w", binDir, rootErr)
	}
	printf("  building       %s into %s with testenv/build/build.sh (first run only; a cold build takes 15-20 minutes on 2 cores)\n", strings.Join(missing, ", "), binDir)
	t0 := time.Now()
	if err := runBuild(ctx, filepath.Join(root, "testenv", "build", "build.sh"), root, binDir, printf); err != nil {
		return "", err
	}
	printf("  built          in %s\n", time.Since(t0).Round(time.Second))
	return binDir, nil
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
