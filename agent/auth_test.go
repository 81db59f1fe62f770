package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eventpipe/eventpipe/collector"
)

// TestCollectorTokenAuth: the agent authenticates to a collector that
// demands bearer tokens (tokens file, role agent) with collector.tokenFile;
// with a wrong token it gets no cursor and is not ready.
func TestCollectorTokenAuth(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokens, []byte("- {token: agent-token-0123456789abc, name: agent-a, role: agent, clusters: [\"*\"]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = 2 * time.Second
	cfg.Auth.TokensFile = tokens
	cfg.Store.Dir = filepath.Join(dir, "log")
	c, err := collector.New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	tc := &testCollector{c: c, cancel: cancel, done: done}
	t.Cleanup(func() { tc.stop(t) })

	good := filepath.Join(dir, "good-token")
	bad := filepath.Join(dir, "bad-token")
	if err := os.WriteFile(good, []byte("agent-token-0123456789abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("not-the-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	badCfg := testConfig("auth-bad", tc.addr())
	badCfg.Collector.TokenFile = bad
	rb := startAgent(t, badCfg)

	goodCfg := testConfig("auth", tc.addr())
	goodCfg.Collector.TokenFile = good
	startAgent(t, goodCfg)
	g := newLoadGen(t, "load-auth")
	for i := 0; i < 50; i++ {
		if err := g.create(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	checkDelivered(t, tc, g, 60*time.Second)

	if rb.a.Ready() == nil {
		t.Errorf("agent with a wrong token is ready")
	}
	if _, ok := c.Store().ClusterCursor("auth-bad", "events"); ok {
		t.Errorf("agent with a wrong token stored a cursor")
	}
}

// TestCollectorMTLS: the agent verifies the collector's certificate against
// collector.caFile and presents its client certificate (mTLS identity
// mapped to role agent).
func TestCollectorMTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCA(t)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	srvCert, srvKey := issue(t, ca, caKey, "collector", []string{"localhost"}, x509.ExtKeyUsageServerAuth)
	writePEM(t, filepath.Join(dir, "srv.pem"), "CERTIFICATE", srvCert)
	writePEM(t, filepath.Join(dir, "srv-key.pem"), "PRIVATE KEY", srvKey)
	cliCert, cliKey := issue(t, ca, caKey, "eventpipe-agent", nil, x509.ExtKeyUsageClientAuth)
	writePEM(t, filepath.Join(dir, "cli.pem"), "CERTIFICATE", cliCert)
	writePEM(t, filepath.Join(dir, "cli-key.pem"), "PRIVATE KEY", cliKey)

	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = 2 * time.Second
	cfg.GRPC.TLS = collector.TLSConfig{CertFile: filepath.Join(dir, "srv.pem"), KeyFile: filepath.Join(dir, "srv-key.pem"), ClientCAFile: filepath.Join(dir, "ca.pem")}
	cfg.Auth.Identities = []collector.Identity{{Name: "eventpipe-agent", Role: "agent", Clusters: []string{"*"}}}
	cfg.Store.Dir = filepath.Join(dir, "log")
	c, err := collector.New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	tc := &testCollector{c: c, cancel: cancel, done: done}
	t.Cleanup(func() { tc.stop(t) })

	acfg := testConfig("mtls", tc.addr())
	acfg.Collector.Insecure = false
	acfg.Collector.CAFile = filepath.Join(dir, "ca.pem")
	acfg.Collector.ServerName = "localhost"
	acfg.Collector.CertFile = filepath.Join(dir, "cli.pem")
	acfg.Collector.KeyFile = filepath.Join(dir, "cli-key.pem")
	startAgent(t, acfg)
	g := newLoadGen(t, "load-mtls")
	for i := 0; i < 50; i++ {
		if err := g.create(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	checkDelivered(t, tc, g, 60*time.Second)
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, dns []string, usage x509.ExtKeyUsage) (certDER, keyDER []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	certDER, err = x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err = x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return certDER, keyDER
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
