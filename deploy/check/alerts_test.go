package check

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	"github.com/eventpipe/eventpipe/agent"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/collector/backbone"
	"github.com/eventpipe/eventpipe/deploy/openshell"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/file"
	"github.com/eventpipe/eventpipe/sinks/gateway"
	"github.com/eventpipe/eventpipe/sinks/kafka"
	"github.com/eventpipe/eventpipe/sinks/loki"
	"github.com/eventpipe/eventpipe/testenv/evbin"
)

var (
	catOnce sync.Once
	cat     *Catalogue
	catErr  error
)

// exported builds the catalogue of what eventpipe exports, once:
//   - every descriptor the agent, the collector (store, WAL) and all three
//     sink types register, from the real constructors;
//   - a scrape of /metrics of the real eventpipe binary running as a
//     collector (adds the Go runtime and process metrics it serves).
func exported(t *testing.T) *Catalogue {
	t.Helper()
	catOnce.Do(func() { cat, catErr = buildCatalogue(t.TempDir()) })
	if catErr != nil {
		t.Fatal(catErr)
	}
	return cat
}

func buildCatalogue(dir string) (*Catalogue, error) {
	c := NewCatalogue()
	rec := NewRecorder(c)

	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Store.Dir = filepath.Join(dir, "log")
	// TLS on, so the certificate reload metrics are registered too.
	certFile, keyFile, err := selfSignedCert(dir)
	if err != nil {
		return nil, err
	}
	cfg.GRPC.TLS = collector.TLSConfig{CertFile: certFile, KeyFile: keyFile}
	cfg.Auth.TokensFile = filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(cfg.Auth.TokensFile, []byte("- {token: check-agent-token-0123456789, name: check, role: agent, clusters: [check]}\n"), 0o600); err != nil {
		return nil, err
	}
	d := sinks.NewDefaultRunnerConfig("")
	fc := file.NewDefaultConfig()
	fc.Path = filepath.Join(dir, "events.jsonl")
	lc := loki.NewDefaultConfig()
	lc.URL = "http://127.0.0.1:9/loki/api/v1/push"
	kc := kafka.NewDefaultConfig()
	kc.Conn.Brokers = []string{"127.0.0.1:9"}
	kc.Topic = "eventpipe.check"
	cfg.Sinks = []collector.SinkConfig{
		{Name: "file", Type: collector.SinkFile, File: &fc, Batch: d.Batch, Retry: d.Retry, CommitInterval: d.CommitInterval},
		{Name: "loki", Type: collector.SinkLoki, Loki: &lc, Batch: d.Batch, Retry: d.Retry, CommitInterval: d.CommitInterval},
		{Name: "kafka", Type: collector.SinkKafka, Kafka: &kc, Batch: d.Batch, Retry: d.Retry, CommitInterval: d.CommitInterval},
	}
	col, err := collector.New(cfg, nil, rec)
	if err != nil {
		return nil, fmt.Errorf("collector with every sink: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := col.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return nil, fmt.Errorf("stop collector: %w", err)
	}

	// Kafka mode's parts, from their real constructors (neither contacts
	// the brokers): the backbone writer (produce, cursor metrics) and the
	// read side every backbone consumer shares (duplicates, window).
	bcfg := backbone.NewDefaultConfig()
	bcfg.Conn.Brokers = []string{"127.0.0.1:9"}
	w, err := backbone.NewWriter(bcfg, nil, rec)
	if err != nil {
		return nil, fmt.Errorf("backbone writer: %w", err)
	}
	w.Close()
	if _, err := backbone.NewReadMetrics(rec); err != nil {
		return nil, fmt.Errorf("backbone read metrics: %w", err)
	}
	// The sinks' consumer groups (partitions owned, rebalances): one sink
	// registers every family; nothing is contacted before Run.
	gs := sinks.NewDefaultRunnerConfig("check")
	if _, err := backbone.NewGroupSinks(bcfg, []backbone.GroupSink{{Runner: gs, Pusher: discardPusher{}}}, nil, rec); err != nil {
		return nil, fmt.Errorf("backbone group sinks: %w", err)
	}

	acfg := agent.NewDefaultConfig()
	acfg.Cluster = "check"
	acfg.Collector.Address = "127.0.0.1:9"
	acfg.Collector.Insecure = true
	acfg.HTTP.Listen = ""
	acfg.LeaderElection.Enabled = false
	// New connects to nothing; Run with an ended context returns at once.
	a, err := agent.New(acfg, &rest.Config{Host: "https://127.0.0.1:9"}, agent.Options{Registerer: rec})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	actx, acancel := context.WithCancel(context.Background())
	acancel()
	_ = a.Run(actx)

	// The driver proxy (sinks/gateway), from its real constructor; Run with
	// an ended context listens on its socket and stops at once. A short
	// directory: a Unix socket path has ~100 bytes.
	pdir, err := os.MkdirTemp("", "epx")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(pdir)
	pc := gateway.NewDefaultConfig()
	pc.Listen, pc.Driver, pc.GatewayID = filepath.Join(pdir, "proxy.sock"), filepath.Join(pdir, "driver.sock"), "check"
	pc.Collector.Address, pc.Collector.Insecure = "127.0.0.1:9", true
	px, err := gateway.New(pc, nil, rec)
	if err != nil {
		return nil, fmt.Errorf("driver proxy: %w", err)
	}
	pctx, pcancel := context.WithCancel(context.Background())
	pcancel()
	if err := px.Run(pctx); err != nil && !errors.Is(err, context.Canceled) {
		return nil, fmt.Errorf("stop driver proxy: %w", err)
	}
	if err := c.AddGathered(rec); err != nil {
		return nil, err
	}
	n, err := scrapeBinary(c, dir)
	if err != nil {
		return nil, err
	}
	if n < 20 {
		return nil, fmt.Errorf("the binary's /metrics had only %d families", n)
	}
	return c, nil
}

// discardPusher stands in for a sink in the catalogue: only the metrics
// its consumer group registers are wanted, nothing is ever pushed.
type discardPusher struct{}

func (discardPusher) Push(context.Context, []sinks.Record) error { return nil }

// selfSignedCert writes a loopback certificate and its key into dir.
func selfSignedCert(dir string) (certFile, keyFile string, err error) {
	crt, key, err := selfSigned(&x509.Certificate{Subject: pkix.Name{CommonName: "eventpipe-collector"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, crt, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// selfSigned signs tmpl (its names) with a new P-256 key of its own, valid
// for a day, for serving: the certificate and key in PEM.
func selfSigned(tmpl *x509.Certificate) (crtPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = big.NewInt(1)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage |= x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// scrapeBinary builds cmd/eventpipe, runs `eventpipe collector` on loopback
// and adds its /metrics to c.
func scrapeBinary(c *Catalogue, dir string) (int, error) {
	bin := filepath.Join(dir, "eventpipe")
	if err := evbin.Build(context.Background(), root, bin); err != nil {
		return 0, err
	}
	// The collector binds ports it chooses (127.0.0.1:0) and reports them
	// in its "collector started" line: a port picked here and closed again
	// could be taken by another process before the collector binds it.
	cfgPath := filepath.Join(dir, "collector.yaml")
	cfg := fmt.Sprintf("grpc: {listen: \"127.0.0.1:0\"}\nhttp: {listen: \"127.0.0.1:0\"}\nauth: {insecure: true}\nstore: {dir: %q}\nsinks:\n  - {name: file, type: file, file: {path: %q}}\n",
		filepath.Join(dir, "binlog"), filepath.Join(dir, "bin-events.jsonl"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return 0, err
	}
	cmd := exec.Command(bin, "collector", "--config", cfgPath, "--log-format", "json")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	url, last := "", `no "collector started" line yet`
	for {
		if url == "" {
			if addr := startedHTTPAddr(stderr.String()); addr != "" {
				url = "http://" + addr + "/metrics"
			}
		}
		if url != "" {
			resp, err := http.Get(url)
			if err == nil {
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
				}
				return c.AddScrape(resp.Body)
			}
			last = err.Error()
		}
		select {
		case <-done:
			return 0, fmt.Errorf("the collector binary exited before serving /metrics:\n%s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the collector binary never served /metrics: %s\n%s", last, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startedHTTPAddr is the HTTP address in the "collector started" line of a
// JSON log ("" before it was written).
func startedHTTPAddr(log string) string {
	for _, line := range strings.Split(log, "\n") {
		var rec struct{ Msg, HTTP string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "collector started" {
			return rec.HTTP
		}
	}
	return ""
}

// lockedBuffer is a child's stderr, read while the child writes it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestQueryCheckCanFail: the check refuses what it must (a metric eventpipe
// does not export, a label a metric does not have, a syntax error), so the
// tests below cannot pass vacuously.
func TestQueryCheckCanFail(t *testing.T) {
	c := exported(t)
	for _, q := range []string{
		`rate(eventpipe_agent_no_such_metric_total[5m]) > 0`,
		`eventpipe_sink_lag_seconds{workspace="x"} > 1`,
		`sum(rate(eventpipe_collector_ingested_occurrences_total[5m])`,
		`eventpipe_collector_log_stored_bytes_bucket`,
	} {
		if _, problems := CheckQuery(c, q); len(problems) == 0 {
			t.Errorf("%s passed the check", q)
		}
	}
	if _, problems := CheckQuery(c, `histogram_quantile(0.99, sum by (le) (rate(eventpipe_agent_ship_latency_seconds_bucket{job="x"}[5m])))`); len(problems) > 0 {
		t.Errorf("a valid histogram query failed: %v", problems)
	}
}

// The alerts the operations runbook promises, by variant: the local log's
// (all-on) and Kafka mode's (kafka), where the local log's own are left out.
var requiredAlerts = map[string][]string{
	"all-on": {
		"EventpipeAgentDown", "EventpipeAgentNoLeader", "EventpipeAgentWatchStale", "EventpipeAgentCursorAgeHigh",
		"EventpipeCollectorNotAcknowledging", "EventpipeCollectorDown", "EventpipeCollectorAppendFailing",
		"EventpipeLogRepaired", "EventpipeLogDataLoss", "EventpipeLogDiskNearlyFull", "EventpipeFollowSubscribersCutOff",
		"EventpipeSinkLagging", "EventpipeSinkRecordsLost", "EventpipeSinkRecordsRefused", "EventpipeSinkCursorBeyondLog",
		"EventpipeCollectorRestartRequired",
		"EventpipeDriverProxyDown", "EventpipeDriverProxyDriverErrors", "EventpipeDriverProxyFollowDisconnected",
		"EventpipeDriverProxyPeersRejected", "EventpipeDriverProxyStateWriteFailing",
	},
	"kafka": {
		"EventpipeAgentDown", "EventpipeCollectorNotAcknowledging", "EventpipeCollectorDown",
		"EventpipeBackboneProduceFailing", "EventpipeBackboneProduceErrors", "EventpipeBackboneProduceSlow",
		"EventpipeBackboneCursorUnreadable", "EventpipeBackboneSinkLagGrowing", "EventpipeBackboneDuplicatesHigh",
		"EventpipeBackboneUndecodableRecords", "EventpipeBackboneSinkUnowned", "EventpipeBackboneSinkRebalancing",
		"EventpipeSinkLagging", "EventpipeSinkRecordsLost",
	},
}

// localOnlyAlerts are about the local log's disk and files: not rendered
// in Kafka mode.
var localOnlyAlerts = []string{"EventpipeCollectorAppendFailing", "EventpipeLogRepaired", "EventpipeLogDataLoss", "EventpipeLogDiskNearlyFull"}

// TestPrometheusRule: every alert of the chart's PrometheusRule parses with
// the Prometheus parser, names only series eventpipe exports (or the few
// External ones) with labels they have, carries a severity, a summary and a
// runbook_url whose anchor is a heading of docs/runbooks.md; in both
// collector modes.
func TestPrometheusRule(t *testing.T) {
	c := exported(t)
	anchors := runbookAnchors(t)
	for _, v := range variants() {
		if requiredAlerts[v.name] == nil {
			continue
		}
		t.Run(v.name, func(t *testing.T) { checkPrometheusRule(t, c, anchors, v) })
	}
}

func checkPrometheusRule(t *testing.T, c *Catalogue, anchors map[string]bool, v variant) {
	docs := render(t, v)
	seen := map[string]bool{}
	for _, d := range docs {
		if d.Kind != "PrometheusRule" {
			continue
		}
		groups, _, _ := unstructured.NestedSlice(d.Object, "spec", "groups")
		for _, g := range groups {
			rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
			for _, r := range rules {
				rule := r.(map[string]any)
				name, _ := rule["alert"].(string)
				expr, _ := rule["expr"].(string)
				seen[name] = true
				names, problems := CheckQuery(c, expr)
				for _, p := range problems {
					t.Errorf("alert %s: %s\n%s", name, p, expr)
				}
				if len(names) == 0 && len(problems) == 0 {
					t.Errorf("alert %s selects no series", name)
				}
				labels, _ := rule["labels"].(map[string]any)
				if s := labels["severity"]; s != "warning" && s != "critical" {
					t.Errorf("alert %s: severity %v", name, s)
				}
				ann, _ := rule["annotations"].(map[string]any)
				if ann["summary"] == nil || ann["description"] == nil {
					t.Errorf("alert %s: no summary or description", name)
				}
				rb, _ := ann["runbook_url"].(string)
				_, anchor, _ := strings.Cut(rb, "#")
				if !anchors[anchor] {
					t.Errorf("alert %s: runbook_url %q has no matching heading in docs/runbooks.md", name, rb)
				}
			}
		}
	}
	for _, a := range requiredAlerts[v.name] {
		if !seen[a] {
			t.Errorf("no alert %s", a)
		}
	}
	if kafkaMode(v) {
		for _, a := range localOnlyAlerts {
			if seen[a] {
				t.Errorf("kafka mode has the local log's alert %s", a)
			}
		}
	}
}

// runbookAnchors are GitHub's anchors of the headings of docs/runbooks.md.
func runbookAnchors(t *testing.T) map[string]bool {
	b, err := os.ReadFile(filepath.Join(root, "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	strip := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, l := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(l, "### "); ok {
			out[strings.ReplaceAll(strip.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")] = true
		}
	}
	return out
}

// TestDashboard: every query of the Grafana dashboard parses and names only
// series eventpipe exports, and the chart ships the same file.
func TestDashboard(t *testing.T) {
	c := exported(t)
	b, err := os.ReadFile(filepath.Join(ChartDir(root), "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	queries := 0
	families := map[string]bool{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries++
			names, problems := CheckQuery(c, tg.Expr)
			for _, pr := range problems {
				t.Errorf("panel %q: %s\n%s", p.Title, pr, tg.Expr)
			}
			for _, n := range names {
				families[n] = true
			}
		}
	}
	labelValues := regexp.MustCompile(`label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	for _, v := range dash.Templating.List {
		q, _ := json.Marshal(v.Query)
		for _, m := range labelValues.FindAllStringSubmatch(string(q), -1) {
			if _, ok := c.Lookup(m[1]); !ok {
				t.Errorf("variable %s: %s is not exported", v.Name, m[1])
			}
		}
	}
	if queries < 30 {
		t.Errorf("the dashboard has %d queries", queries)
	}
	t.Logf("%d dashboard queries over %d series names", queries, len(families))

	docs := render(t, variants()[1])
	for _, d := range docs {
		if d.Kind == "ConfigMap" && strings.HasSuffix(d.Name, "-dashboard") {
			data, _ := d.Object["data"].(map[string]any)
			if s, _ := data["eventpipe.json"].(string); strings.TrimSpace(s) != strings.TrimSpace(string(b)) {
				t.Errorf("the dashboard ConfigMap does not hold files/dashboard.json")
			}
			return
		}
	}
	t.Errorf("the all-on variant renders no dashboard ConfigMap")
}

// TestDriverProxyMonitoring: the chart's driver-proxy PodMonitor selects
// the label and scrapes the port `eventpipe post-render` gives the gateway
// pod (rendered here over the post-renderer's test manifests), and the
// dashboard charts every eventpipe_driver_proxy_* family the proxy exports.
func TestDriverProxyMonitoring(t *testing.T) {
	docs := render(t, variants()[1]) // all-on
	pm, ok := find(docs, "PodMonitor", "eventpipe-driver-proxy")
	if !ok {
		t.Fatal("all-on renders no driver-proxy PodMonitor")
	}
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(sel) != 1 || sel[openshell.ProxyPodLabel] != "true" || len(eps) != 1 || eps[0].(map[string]any)["port"] != openshell.ProxyMetricsPortName {
		t.Errorf("PodMonitor selects %v, endpoints %v; want %s=true, port %s", sel, eps, openshell.ProxyPodLabel, openshell.ProxyMetricsPortName)
	}
	if ns, _, _ := unstructured.NestedStringSlice(pm.Object, "spec", "namespaceSelector", "matchNames"); len(ns) != 1 || ns[0] != "openshell" {
		t.Errorf("PodMonitor namespaces %v, want [openshell]", ns)
	}
	in, err := os.ReadFile(filepath.Join(root, "deploy", "openshell", "testdata", "rendered.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := openshell.Render(in, openshell.Options{Collector: "c:7070", ProxyImage: "ghcr.io/eventpipe/eventpipe:0.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	patched, err := SplitDocs(out)
	if err != nil {
		t.Fatal(err)
	}
	labelled, portNamed := false, false
	for _, d := range patched {
		if spec, ok := podSpec(d); ok {
			labels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
			labelled = labels[openshell.ProxyPodLabel] == "true"
			for _, c := range spec.Containers {
				for _, p := range c.Ports {
					portNamed = portNamed || (c.Name == "eventpipe-driver-proxy" && p.Name == openshell.ProxyMetricsPortName)
				}
			}
		}
	}
	if !labelled || !portNamed {
		t.Errorf("post-rendered gateway pod: label %v, port %v", labelled, portNamed)
	}

	c := exported(t)
	b, err := os.ReadFile(filepath.Join(ChartDir(root), "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	proxyFamilies := 0
	for _, n := range c.Names() {
		if !strings.HasPrefix(n, "eventpipe_driver_proxy_") {
			continue
		}
		proxyFamilies++
		if !strings.Contains(string(b), n) {
			t.Errorf("the dashboard does not chart %s", n)
		}
	}
	if proxyFamilies < 15 {
		t.Errorf("the catalogue has %d driver-proxy families: the proxy's metrics are not in it", proxyFamilies)
	}
}
