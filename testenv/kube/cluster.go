package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// AgentUser is the user name AgentConfig authenticates as: the service
// account the ClusterRoleBinding in deploy/agent/rbac.yaml names.
const AgentUser = "system:serviceaccount:eventpipe:eventpipe-agent"

// AgentNamespace is the agent's own namespace (its leader-election Role).
const AgentNamespace = "eventpipe"

// Options configures a control plane. The zero value is valid for Start.
type Options struct {
	// Dir holds all state (etcd data, certificates, logs, kubeconfig).
	// Required for StartProcess; Start uses t.TempDir() when empty.
	Dir string
	// BinDir holds etcd and kube-apiserver; default $EVENTPIPE_BIN_DIR, else
	// <repo root>/.bin. Missing binaries are built there.
	BinDir string
	// RBACFile is the agent's RBAC manifest; default
	// <repo root>/deploy/agent/rbac.yaml.
	RBACFile string
	// StartTimeout bounds one attempt to get both processes ready
	// (default 60s; a loaded 2-core machine needs more than the usual 3 s).
	StartTimeout time.Duration
	// APIServerArgs are appended to kube-apiserver's command line.
	APIServerArgs []string
	// Writers are the components started beside kube-apiserver (none by
	// default; see Writers).
	Writers Writers
	// Logger receives progress lines; nil discards them.
	Logger *slog.Logger
}

// Option changes Options for Start.
type Option func(*Options)

// WithDir keeps the cluster's state in dir instead of t.TempDir().
func WithDir(dir string) Option { return func(o *Options) { o.Dir = dir } }

// WithBinDir looks for (and builds) the binaries in dir.
func WithBinDir(dir string) Option { return func(o *Options) { o.BinDir = dir } }

// WithAPIServerArgs appends flags to kube-apiserver's command line.
func WithAPIServerArgs(args ...string) Option {
	return func(o *Options) { o.APIServerArgs = append(o.APIServerArgs, args...) }
}

// WithLogger sets the progress logger.
func WithLogger(l *slog.Logger) Option { return func(o *Options) { o.Logger = l } }

// Cluster is a running etcd + kube-apiserver pair.
type Cluster struct {
	opts   Options
	logger *slog.Logger

	dir            string
	etcdURL        string
	apiserverURL   string
	apiserverPort  int
	caPEM          []byte
	adminToken     string
	agentToken     string
	kubeconfigPath string
	binDir         string
	etcdBin        string
	apiserverBin   string
	apiserverArgs  []string

	mu        sync.Mutex // guards etcd, apiserver, writers, nodes, stopped
	etcd      *process
	apiserver *process
	writers   []*process
	nodes     []*Node // hollow nodes (AddNode)
	stopped   bool

	httpClient *http.Client // admin-authenticated, for /readyz and /metrics
	etcdClient *http.Client
}

// Start starts a control plane for a test and stops it on t.Cleanup. It
// fails the test (t.Fatal) when the control plane cannot start; it never
// skips. On test failure the tails of both logs are written to the test log.
func Start(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	var o Options
	for _, opt := range opts {
		opt(&o)
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute) // includes a cold build
	defer cancel()
	c, err := StartProcess(ctx, o)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("etcd log tail:\n%s", c.logTail(c.etcdLogPath(), 3000))
			t.Logf("kube-apiserver log tail:\n%s", c.logTail(c.apiserverLogPath(), 6000))
			for name := range c.WriterPIDs() {
				t.Logf("%s log tail:\n%s", name, c.WriterLog(name, 4000))
			}
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return c
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// StartProcess starts a control plane outside a test. The caller must call
// Stop. o.Dir is required.
func StartProcess(ctx context.Context, o Options) (*Cluster, error) {
	if o.Dir == "" {
		return nil, errors.New("start control plane: Options.Dir is required")
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 60 * time.Second
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.RBACFile == "" {
		root, err := RepoRoot()
		if err != nil {
			return nil, fmt.Errorf("locate deploy/agent/rbac.yaml: %w", err)
		}
		o.RBACFile = filepath.Join(root, "deploy", "agent", "rbac.yaml")
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create cluster dir: %w", err)
	}
	binDir, err := binaries(ctx, o.BinDir, o.neededBinaries(), func(f string, a ...any) { logger.Info(fmt.Sprintf(f, a...)) })
	if err != nil {
		return nil, err
	}
	etcdBin, apiserverBin := filepath.Join(binDir, "etcd"), filepath.Join(binDir, "kube-apiserver")
	// A free port can be taken between choosing and binding it; retry the
	// whole start with new ports when a process dies early.
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		c := &Cluster{opts: o, logger: logger, binDir: binDir, etcdBin: etcdBin, apiserverBin: apiserverBin,
			dir: filepath.Join(o.Dir, "attempt-"+strconv.Itoa(attempt))}
		start := time.Now()
		err := c.start(ctx)
		if err == nil {
			logger.Info("control plane ready", "apiserver", c.apiserverURL, "etcd", c.etcdURL,
				"took", time.Since(start).Round(time.Millisecond), "kubeconfig", c.kubeconfigPath)
			return c, nil
		}
		_ = c.Stop()
		lastErr = err
		if ctx.Err() != nil {
			break
		}
		logger.Warn("control plane start failed; retrying", "attempt", attempt, "err", err)
	}
	return nil, lastErr
}

func (c *Cluster) start(ctx context.Context) error {
	for _, d := range []string{c.dir, filepath.Join(c.dir, "certs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	// The client ports of etcd and kube-apiserver are picked here: another
	// process can take one before they bind it, and Start then tries
	// again. (etcd's own JSON gateway dials the configured client address,
	// so it cannot be port 0.)
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	c.apiserverPort = ports[1]
	c.apiserverURL = fmt.Sprintf("https://127.0.0.1:%d", c.apiserverPort)

	certPath := filepath.Join(c.dir, "certs", "serving.crt")
	keyPath := filepath.Join(c.dir, "certs", "serving.key")
	if c.caPEM, err = writeServingCert(certPath, keyPath); err != nil {
		return err
	}
	saKey := filepath.Join(c.dir, "certs", "sa.key")
	if err := writeServiceAccountKey(saKey); err != nil {
		return err
	}
	if c.adminToken, err = randomToken(); err != nil {
		return err
	}
	if c.agentToken, err = randomToken(); err != nil {
		return err
	}
	tokens := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n%s,%s,eventpipe-agent-uid,\"system:serviceaccounts,system:serviceaccounts:%s\"\n",
		c.adminToken, c.agentToken, AgentUser, AgentNamespace)
	tokenFile := filepath.Join(c.dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(tokens), 0o600); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.caPEM)
	c.httpClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}
	c.etcdClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}

	// The peer port is etcd's choice (0): a single member has no peers to
	// tell it to. Info level, for the line that says which client address
	// this etcd serves (etcdServing).
	const anyPort = "http://127.0.0.1:0"
	etcdArgs := []string{
		"--name=default",
		"--data-dir=" + filepath.Join(c.dir, "etcd"),
		"--listen-client-urls=" + c.etcdURL,
		"--advertise-client-urls=" + c.etcdURL,
		"--listen-peer-urls=" + anyPort,
		"--initial-advertise-peer-urls=" + anyPort,
		"--initial-cluster=default=" + anyPort,
		"--unsafe-no-fsync",
		"--log-level=info",
	}
	c.mu.Lock()
	c.etcd, err = startProcess("etcd", c.etcdBin, etcdArgs, c.dir, c.etcdLogPath())
	c.mu.Unlock()
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	if err := c.etcdServing(sctx, strings.TrimPrefix(c.etcdURL, "http://")); err != nil {
		return fmt.Errorf("wait for etcd: %w\n%s", err, c.logTail(c.etcdLogPath(), 2000))
	}
	if err := c.waitHTTP(sctx, c.etcd, c.etcdClient, c.etcdURL+"/health", ""); err != nil {
		return fmt.Errorf("wait for etcd: %w\n%s", err, c.logTail(c.etcdLogPath(), 2000))
	}

	// Without a controller-manager no namespace gets its default service
	// account, and ServiceAccount admission would refuse every pod.
	admission := "--disable-admission-plugins=ServiceAccount"
	if c.opts.Writers.ControllerManager {
		admission = "--enable-admission-plugins=ServiceAccount"
	}
	c.apiserverArgs = append([]string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.apiserverPort),
		"--cert-dir=" + filepath.Join(c.dir, "certs"),
		"--tls-cert-file=" + certPath,
		"--tls-private-key-file=" + keyPath,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		"--token-auth-file=" + tokenFile,
		admission,
		"--endpoint-reconciler-type=none",
		// Hollow kubelets serve on 127.0.0.1, their InternalIP; their
		// Hostname (the node name) resolves nowhere.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--allow-privileged=true",
		"--v=1",
	}, c.opts.APIServerArgs...)
	if err := c.startAPIServer(sctx); err != nil {
		return err
	}
	if err := c.writeKubeconfig(); err != nil {
		return err
	}
	if err := c.install(sctx); err != nil {
		return fmt.Errorf("install agent RBAC and CRDs: %w", err)
	}
	// The writers get a deadline of their own: the apiserver's start may
	// have used most of StartTimeout on a loaded machine.
	wctx, wcancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer wcancel()
	return c.startWriters(wctx)
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p, err := startProcess("kube-apiserver", c.apiserverBin, c.apiserverArgs, c.dir, c.apiserverLogPath())
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.apiserver = p
	c.mu.Unlock()
	if err := c.waitHTTP(ctx, p, c.httpClient, c.apiserverURL+"/readyz", c.adminToken); err != nil {
		return fmt.Errorf("wait for kube-apiserver /readyz: %w\n%s", err, c.logTail(c.apiserverLogPath(), 4000))
	}
	return nil
}

// etcdServing waits until etcd's JSON log says it serves clients on addr.
// Only then is an answer on addr this etcd's: when another process took
// the port first, that one (another test's etcd, say) could answer /health
// before this etcd has failed to bind and exited.
func (c *Cluster) etcdServing(ctx context.Context, addr string) error {
	for {
		// Whether etcd had exited is known before the read: a line
		// written just before the exit is still found.
		exited, werr := c.etcd.exited()
		b, err := os.ReadFile(c.etcdLogPath())
		if err != nil {
			return fmt.Errorf("read etcd log: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			var rec struct{ Msg, Address string }
			if json.Unmarshal([]byte(line), &rec) == nil && strings.HasPrefix(rec.Msg, "serving client traffic") && rec.Address == addr {
				return nil
			}
		}
		if exited {
			return fmt.Errorf("etcd exited early: %v", werr)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd did not log that it serves clients on %s: %w", addr, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitHTTP polls url until it answers 200, the process exits, or ctx ends.
func (c *Cluster) waitHTTP(ctx context.Context, p *process, hc *http.Client, url, token string) error {
	var last string
	for {
		if ok, werr := p.exited(); ok {
			return fmt.Errorf("%s exited early: %v", p.name, werr)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("build request: %w", err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("status %d: %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready (last answer: %s): %w", url, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// RestartAPIServer stops kube-apiserver and starts it again on the same port
// with the same flags and storage, then waits for /readyz. Open watches end;
// clients see connection errors while it is down.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	p, stopped := c.apiserver, c.stopped
	c.mu.Unlock()
	if stopped {
		return errors.New("restart kube-apiserver: cluster is stopped")
	}
	if p != nil {
		if err := p.stop(20 * time.Second); err != nil {
			return fmt.Errorf("restart kube-apiserver: %w", err)
		}
	}
	// Its port was free for a moment and may have been taken meanwhile
	// (clients keep the URL, so it cannot move): a few tries while the
	// other holder goes away.
	for attempt := 1; ; attempt++ {
		err := c.startAPIServer(ctx)
		if err == nil {
			return nil
		}
		if attempt == 5 || !strings.Contains(err.Error(), "address already in use") || ctx.Err() != nil {
			return fmt.Errorf("restart kube-apiserver: %w", err)
		}
		c.logger.Warn("kube-apiserver port taken; trying again", "port", c.apiserverPort, "attempt", attempt)
		select {
		case <-ctx.Done():
			return fmt.Errorf("restart kube-apiserver: %w", ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// Stop stops the writers, the hollow nodes, kube-apiserver, then etcd, and
// waits until every process group is gone. It is idempotent.
func (c *Cluster) Stop() error {
	werr := c.stopWriters()
	c.mu.Lock()
	c.stopped = true
	api, etcd, nodes := c.apiserver, c.etcd, c.nodes
	c.apiserver, c.etcd, c.nodes = nil, nil, nil
	c.mu.Unlock()
	errs := []error{werr}
	for _, n := range nodes {
		if n.proc != nil {
			errs = append(errs, n.proc.stop(10*time.Second))
		}
	}
	if api != nil {
		errs = append(errs, api.stop(20*time.Second))
	}
	if etcd != nil {
		errs = append(errs, etcd.stop(10*time.Second))
	}
	for _, hc := range []*http.Client{c.httpClient, c.etcdClient} {
		if hc != nil {
			hc.CloseIdleConnections()
		}
	}
	return errors.Join(errs...)
}

// PIDs returns the process ids of etcd and kube-apiserver (0 when stopped).
func (c *Cluster) PIDs() (etcd, apiserver int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.etcd != nil {
		etcd = c.etcd.pid()
	}
	if c.apiserver != nil {
		apiserver = c.apiserver.pid()
	}
	return etcd, apiserver
}

// URL is kube-apiserver's https base URL.
func (c *Cluster) URL() string { return c.apiserverURL }

// EtcdURL is etcd's client URL.
func (c *Cluster) EtcdURL() string { return c.etcdURL }

// Dir is the directory holding this cluster's state and logs.
func (c *Cluster) Dir() string { return c.dir }

// BinDir is the directory of the binaries the cluster runs (kubectl among
// them, kubeparts' own).
func (c *Cluster) BinDir() string { return c.binDir }

// AdminConfig returns a rest.Config for a system:masters user.
func (c *Cluster) AdminConfig() *rest.Config { return c.config(c.adminToken) }

// AgentConfig returns a rest.Config authenticated as AgentUser, limited by
// the RBAC in deploy/agent/rbac.yaml.
func (c *Cluster) AgentConfig() *rest.Config { return c.config(c.agentToken) }

func (c *Cluster) config(token string) *rest.Config {
	return &rest.Config{
		Host:            c.apiserverURL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), c.caPEM...)},
		QPS:             -1, // no client-side throttling: tests measure the server
		Burst:           -1,
	}
}

// Kubeconfig is the path of a kubeconfig file with contexts "admin"
// (current) and "agent".
func (c *Cluster) Kubeconfig() string { return c.kubeconfigPath }

func (c *Cluster) etcdLogPath() string      { return filepath.Join(c.dir, "etcd.log") }
func (c *Cluster) apiserverLogPath() string { return filepath.Join(c.dir, "kube-apiserver.log") }

func (c *Cluster) logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return tail(b, n)
}
