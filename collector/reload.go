package collector

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
)

// reloadDebounce groups the several events an editor's save produces
// (write temp, rename over, chmod) into one reload.
const reloadDebounce = 250 * time.Millisecond

// watchConfig watches the directories of the config file and the tokens
// file (watching the directory survives editors that replace the file by
// rename, and Kubernetes ConfigMap symlink swaps) and reloads on change.
func (c *Collector) watchConfig(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config watcher: %w", err)
	}
	defer w.Close()
	watched := map[string]bool{}
	targets := map[string]bool{}
	add := func(path string) error {
		if path == "" {
			return nil
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return fmt.Errorf("config watcher: %w", err)
		}
		targets[abs] = true
		dir := filepath.Dir(abs)
		if watched[dir] {
			return nil
		}
		if err := w.Add(dir); err != nil {
			return fmt.Errorf("config watcher: watch %s: %w", dir, err)
		}
		watched[dir] = true
		return nil
	}
	if err := add(c.configPath); err != nil {
		return err
	}
	if err := add(c.cfg.Auth.TokensFile); err != nil {
		return err
	}
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			abs, _ := filepath.Abs(ev.Name)
			// ConfigMap volumes swap a ..data symlink: any event in the
			// directory may change what the target resolves to.
			if targets[abs] || filepath.Base(ev.Name) == "..data" {
				timer = time.After(reloadDebounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			c.logger.Warn("config watcher error", "err", err)
		case <-timer:
			timer = nil
			c.reload()
		}
	}
}

// reload re-reads the config file and the tokens file. Sink filters and
// auth (tokens, identities) change in place; open streams keep running
// with their caller's principal, except those whose token or identity was
// removed or given other grants: those end and their callers reconnect. Anything else is logged as requiring a
// restart. An invalid file changes nothing.
func (c *Collector) reload() {
	next, err := LoadConfig(c.configPath)
	if err == nil {
		err = next.Validate()
	}
	if err != nil {
		c.m.reloads.WithLabelValues("failed").Inc()
		c.logger.Error("config reload refused; keeping the running config", "path", c.configPath, "err", err)
		return
	}
	cur := c.cfg

	var tokens []TokenEntry
	if next.Auth.TokensFile != "" {
		if tokens, err = LoadTokens(next.Auth.TokensFile); err != nil {
			c.m.reloads.WithLabelValues("failed").Inc()
			c.logger.Error("tokens reload refused; keeping the running tokens", "err", err)
			return
		}
	}
	// auth.insecure is not switched at run time: that needs a restart.
	newAuth := next.Auth
	newAuth.Insecure = cur.Auth.Insecure
	ended := c.auth.replace(newAuthState(newAuth, tokens))
	applied := []string{fmt.Sprintf("auth (%d tokens, %d identities; %d open streams ended)", len(tokens), len(next.Auth.Identities), ended)}

	byName := map[string]SinkConfig{}
	for _, s := range next.Sinks {
		byName[s.Name] = s
	}
	for i, r := range c.runners {
		s, ok := byName[r.Name()]
		if !ok || reflect.DeepEqual(s.Filter, cur.Sinks[i].Filter) {
			continue
		}
		if err := r.SetFilter(s.Filter); err != nil {
			c.logger.Error("sink filter reload refused", "sink", r.Name(), "err", err)
			continue
		}
		cur.Sinks[i].Filter = s.Filter
		applied = append(applied, "sinks."+r.Name()+".filter")
	}
	var filterRestart []string
	if c.groupSinks != nil {
		// In Kafka mode each partition has its own runner, started by the
		// consumer group: a new filter takes effect at the next start.
		for _, s := range cur.Sinks {
			if n, ok := byName[s.Name]; ok && !reflect.DeepEqual(n.Filter, s.Filter) {
				filterRestart = append(filterRestart, "sinks."+s.Name+".filter (log: kafka)")
			}
		}
	}

	restart := append(restartNeeded(cur, next), filterRestart...)
	cur.Auth = newAuth
	c.cfg = cur
	c.m.reloads.WithLabelValues("applied").Inc()
	c.logger.Info("config reloaded", "applied", applied)
	if len(restart) > 0 {
		c.m.reloads.WithLabelValues("restart_required").Inc()
		c.logger.Warn("config change requires restart; not applied until then", "keys", restart)
	}
}

// restartNeeded lists the keys that differ between a and b other than the
// ones reload applies (sink filters, tokens, identities).
func restartNeeded(a, b Config) []string {
	var keys []string
	if !reflect.DeepEqual(a.GRPC, b.GRPC) {
		keys = append(keys, "grpc")
	}
	if a.Auth.Insecure != b.Auth.Insecure {
		keys = append(keys, "auth.insecure")
	}
	if a.Auth.TokensFile != b.Auth.TokensFile {
		keys = append(keys, "auth.tokens_file (the new file is read, but only the old one is watched)")
	}
	if !reflect.DeepEqual(a.HTTP, b.HTTP) {
		keys = append(keys, "http")
	}
	if a.Log != b.Log {
		keys = append(keys, "log")
	}
	if !reflect.DeepEqual(a.Backbone, b.Backbone) {
		keys = append(keys, "backbone")
	}
	if !reflect.DeepEqual(a.Store, b.Store) {
		keys = append(keys, "store")
	}
	if !reflect.DeepEqual(a.Follow, b.Follow) {
		keys = append(keys, "follow")
	}
	if !reflect.DeepEqual(a.Readiness, b.Readiness) {
		keys = append(keys, "readiness")
	}
	strip := func(ss []SinkConfig) map[string]SinkConfig {
		m := map[string]SinkConfig{}
		for _, s := range ss {
			s.Filter = SinkConfig{}.Filter
			m[s.Name] = s
		}
		return m
	}
	sa, sb := strip(a.Sinks), strip(b.Sinks)
	var changed []string
	for n, s := range sa {
		if t, ok := sb[n]; !ok || !reflect.DeepEqual(s, t) {
			changed = append(changed, "sinks."+n)
		}
	}
	for n := range sb {
		if _, ok := sa[n]; !ok {
			changed = append(changed, "sinks."+n+" (new)")
		}
	}
	sort.Strings(changed)
	return append(keys, changed...)
}

// tlsReloader serves grpc.tls: the server certificate and the client CA
// are re-read when their files change (cert-manager renews them in place;
// a Secret volume swaps a symlink), checked at every TLS handshake by
// stat, so new connections get the new certificate and are verified
// against the new CA while established connections, and their streams,
// keep the session they negotiated. A pair that does not load (a key not
// yet matching its renewed certificate, a half-written file) is refused:
// the previous one keeps serving, the error is logged once per change of
// the files and counted, and the next handshake tries again.
type tlsReloader struct {
	certFile, keyFile, caFile string
	clientAuth                tls.ClientAuthType
	logger                    *slog.Logger
	reloads                   *prometheus.CounterVec

	mu         sync.Mutex
	stamp      string // of the files the current config was loaded from
	failed     string // stamp of the files that last failed to load
	cur        *tls.Config
	certExpiry atomic.Int64 // unix seconds of the served leaf's NotAfter
}

// newTLSReloader loads the files once (an error here fails start-up) and
// registers eventpipe_collector_tls_reloads_total{result} and
// eventpipe_collector_tls_cert_expiry_timestamp_seconds on reg (nil: none).
func newTLSReloader(cfg TLSConfig, clientAuth tls.ClientAuthType, logger *slog.Logger, reg prometheus.Registerer) (*tlsReloader, error) {
	r := &tlsReloader{certFile: cfg.CertFile, keyFile: cfg.KeyFile, caFile: cfg.ClientCAFile, clientAuth: clientAuth, logger: logger}
	r.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "eventpipe_collector_tls_reloads_total",
		Help: "Reloads of the gRPC server certificate and client CA after their files changed, by result (applied, failed: the previous ones keep serving).",
	}, []string{"result"})
	r.reloads.WithLabelValues("applied")
	r.reloads.WithLabelValues("failed")
	expiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "eventpipe_collector_tls_cert_expiry_timestamp_seconds",
		Help: "NotAfter of the gRPC server certificate being served (unix seconds).",
	}, func() float64 { return float64(r.certExpiry.Load()) })
	stamp := r.statFiles()
	tc, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur, r.stamp = tc, stamp
	if reg != nil {
		for _, c := range []prometheus.Collector{r.reloads, expiry} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register tls metrics: %w", err)
			}
		}
	}
	return r, nil
}

// serverConfig is the tls.Config given to gRPC: everything comes from
// GetConfigForClient, per handshake.
func (r *tlsReloader) serverConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: r.forClient}
}

func (r *tlsReloader) forClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	stamp := r.statFiles()
	r.mu.Lock()
	defer r.mu.Unlock()
	if stamp == r.stamp || stamp == r.failed {
		return r.cur, nil
	}
	next, err := r.load()
	if err != nil {
		r.failed = stamp
		r.reloads.WithLabelValues("failed").Inc()
		r.logger.Error("TLS reload refused; the previous certificate and client CA keep serving", "err", err)
		return r.cur, nil
	}
	r.cur, r.stamp, r.failed = next, stamp, ""
	r.reloads.WithLabelValues("applied").Inc()
	leaf := next.Certificates[0].Leaf
	r.logger.Info("TLS certificate and client CA reloaded; new connections use them, open ones keep theirs",
		"subject", leaf.Subject.String(), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
	return r.cur, nil
}

// statFiles identifies the files' current contents without reading them:
// size, modification time and inode (a Secret update swaps the symlink to
// a new file).
func (r *tlsReloader) statFiles() string {
	var b strings.Builder
	for _, f := range []string{r.certFile, r.keyFile, r.caFile} {
		if f == "" {
			continue
		}
		st, err := os.Stat(f)
		if err != nil {
			fmt.Fprintf(&b, "%s:%v;", f, err)
			continue
		}
		var ino uint64
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			ino = sys.Ino
		}
		fmt.Fprintf(&b, "%s:%d:%d:%d;", f, st.Size(), st.ModTime().UnixNano(), ino)
	}
	return b.String()
}

func (r *tlsReloader) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return nil, fmt.Errorf("grpc.tls: load key pair: %w", err)
	}
	if cert.Leaf == nil && len(cert.Certificate) > 0 {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("grpc.tls: parse certificate: %w", err)
		}
	}
	// gRPC needs HTTP/2 negotiated by ALPN: the per-handshake config must
	// say so itself (credentials.NewTLS adds it only to the outer one).
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if r.caFile != "" {
		pem, err := os.ReadFile(r.caFile)
		if err != nil {
			return nil, fmt.Errorf("grpc.tls.client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("grpc.tls.client_ca_file: no PEM certificate in %s", r.caFile)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = r.clientAuth
	}
	r.certExpiry.Store(cert.Leaf.NotAfter.Unix())
	return tc, nil
}
