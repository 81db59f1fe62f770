package collector

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns PEM cert and key for cn; server certs get 127.0.0.1.
func (ca *testCA) issue(t *testing.T, cn string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, path string, data []byte) string {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestMTLSAuthorization(t *testing.T) {
	dir := t.TempDir()
	ca, other := newCA(t, "eventpipe-test-ca"), newCA(t, "someone-else")
	sc, sk := ca.issue(t, "collector", true)
	cfg := testConfig(t, dir)
	cfg.GRPC.TLS = TLSConfig{
		CertFile:     writeFile(t, filepath.Join(dir, "server.pem"), sc),
		KeyFile:      writeFile(t, filepath.Join(dir, "server-key.pem"), sk),
		ClientCAFile: writeFile(t, filepath.Join(dir, "ca.pem"), ca.pem),
	}
	cfg.Auth.Identities = []Identity{
		{Name: "agent.prod.example", Role: RoleAgent, Clusters: []string{"prod"}},
		{Name: "proxy.ws1.example", Role: RoleReader, Workspaces: []string{"ws1"}},
	}
	r := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
	connWith := func(issuer *testCA, cn, token string) *grpc.ClientConn {
		tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if issuer != nil {
			c, k := issuer.issue(t, cn, false)
			pair, err := tls.X509KeyPair(c, k)
			if err != nil {
				t.Fatal(err)
			}
			// Always present it, even when the server's CA list does not
			// name its issuer (the client would otherwise stay silent).
			tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
		}
		opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}
		if token != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
		}
		conn, err := grpc.NewClient(r.c.GRPCAddr(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}

	agent := connWith(ca, "agent.prod.example", "")
	if _, err := ship(t, ctx, agent, batch(1, "prod", "5", occ("m/1", "sb-1", "ws1", "one", "gw"), occ("m/2", "sb-2", "ws2", "two", "gw"))); err != nil {
		t.Fatalf("agent certificate may ingest: %v", err)
	}
	reader := connWith(ca, "proxy.ws1.example", "")
	got, err := follow(t, ctx, reader, &eventpipev1.FollowRequest{GatewayId: "gw", Tail: 10, NoFollow: true}, 0)
	if err != nil || ids(got) != "m/1" {
		t.Fatalf("reader certificate of ws1: %q, %v; want only m/1", ids(got), err)
	}
	if _, err := follow(t, ctx, reader, &eventpipev1.FollowRequest{Workspace: "ws2", NoFollow: true}, 0); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reader of ws1 following ws2: %v", err)
	}
	if _, err := ship(t, ctx, reader, batch(1, "prod", "6")); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reader certificate ingesting: %v, want PermissionDenied", err)
	}
	if _, err := eventpipev1.NewIngestClient(connWith(ca, "stranger.example", "")).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("unmapped certificate: %v, want PermissionDenied", err)
	}
	// TLS without a client certificate: a bearer token still works (tokens
	// file configured), nothing at all does not.
	if _, err := eventpipev1.NewIngestClient(connWith(nil, "", agentToken)).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"}); err != nil {
		t.Fatalf("token over TLS: %v", err)
	}
	if _, err := eventpipev1.NewIngestClient(connWith(nil, "", "")).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no credentials over TLS: %v, want Unauthenticated", err)
	}
	// A certificate from another CA fails the handshake.
	if _, err := eventpipev1.NewIngestClient(connWith(other, "agent.prod.example", "")).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("foreign certificate: %v, want Unavailable (handshake refused)", err)
	}
	if got := counterValue(t, r.reg, "eventpipe_collector_auth_failures_total", map[string]string{"reason": authUnknownIdentity}); got != 1 {
		t.Errorf("unknown_identity failures = %v, want 1", got)
	}
}

func TestTokenLookupIsExact(t *testing.T) {
	tt := newTokenTable([]TokenEntry{{Token: "abcdefghijklmnop", Name: "a", Role: RoleAgent}, {Token: "abcdefghijklmnopq", Name: "b", Role: RoleAgent}})
	for tok, want := range map[string]string{"abcdefghijklmnop": "a", "abcdefghijklmnopq": "b", "abcdefghijklmno": "", "": "", "ABCDEFGHIJKLMNOP": ""} {
		p := tt.lookup(tok)
		got := ""
		if p != nil {
			got = p.Name
		}
		if got != want {
			t.Errorf("lookup(%q) = %q, want %q", tok, got, want)
		}
	}
}

func TestInsecureModeAllowsAnonymous(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Auth = AuthConfig{Insecure: true}
	r := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := dial(t, r.c.GRPCAddr(), "")
	if _, err := ship(t, ctx, conn, batch(1, "dev", "1", occ("i/1", "sb", "ws9", "n", "gw"))); err != nil {
		t.Fatal(err)
	}
	got, err := follow(t, ctx, conn, &eventpipev1.FollowRequest{Workspace: "ws9", Tail: 1, NoFollow: true}, 0)
	if err != nil || ids(got) != "i/1" {
		t.Fatalf("insecure follow: %q, %v", ids(got), err)
	}
}

// lockedBuffer collects log output written by the collector's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// An agent credential writes only the clusters it was granted: agent B can
// neither ship occurrences for cluster A (as the batch's cluster, or as an
// occurrence's own cluster inside its batch) nor read or move cluster A's
// resume cursor. Each refusal is PermissionDenied, counted and logged, and
// stores nothing. Real collector, real gRPC on loopback.
func TestAgentTokenBoundToItsClusters(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.Auth.TokensFile = writeFile(t, filepath.Join(dir, "bound-tokens.yaml"), []byte(
		`- {token: agent-a-token-0123456789, name: agent-a, role: agent, clusters: [cluster-a]}
- {token: agent-b-token-0123456789, name: agent-b, role: agent, clusters: [cluster-b]}
`))
	var logs lockedBuffer
	reg := prometheus.NewRegistry()
	c, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := dial(t, c.GRPCAddr(), "agent-a-token-0123456789")
	b := dial(t, c.GRPCAddr(), "agent-b-token-0123456789")
	cursor := func(conn *grpc.ClientConn, cluster string) (string, error) {
		resp, err := eventpipev1.NewIngestClient(conn).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: cluster, Stream: DefaultStream})
		return resp.GetResourceVersion(), err
	}

	if _, err := ship(t, ctx, a, batch(1, "cluster-a", "10", occ("a/1", "sb-a", "ws1", "n", "gw"))); err != nil {
		t.Fatalf("agent A writing cluster A: %v", err)
	}
	if rv, err := cursor(a, "cluster-a"); err != nil || rv != "10" {
		t.Fatalf("agent A reading its cursor: %q, %v", rv, err)
	}

	// B's batch for cluster A.
	if _, err := ship(t, ctx, b, batch(1, "cluster-a", "999", occ("forged/1", "sb-a", "ws1", "n", "gw"))); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("agent B writing cluster A: %v, want PermissionDenied", err)
	}
	// B's own batch first (acknowledged), then one for cluster A on the same
	// stream: the stream ends there.
	acks, err := ship(t, ctx, b,
		batch(1, "cluster-b", "20", occ("b/1", "sb-b", "ws1", "n", "gw")),
		batch(2, "cluster-a", "1000", occ("forged/2", "sb-a", "ws1", "n", "gw")))
	if status.Code(err) != codes.PermissionDenied || len(acks) != 1 || acks[0].GetSeq() != 1 {
		t.Fatalf("agent B, own batch then cluster A's: acks %v, %v; want one ack then PermissionDenied", acks, err)
	}
	// An occurrence naming cluster A inside B's batch for cluster B.
	smuggled := occ("forged/3", "sb-a", "ws1", "n", "gw")
	smuggled.Cluster = "cluster-a"
	if _, err := ship(t, ctx, b, batch(1, "cluster-b", "21", smuggled)); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("agent B smuggling a cluster A occurrence: %v, want PermissionDenied", err)
	}
	// B may not read A's cursor either.
	if _, err := cursor(b, "cluster-a"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("agent B reading cluster A's cursor: %v, want PermissionDenied", err)
	}

	// Nothing of B's reached cluster A: its cursor did not move, the log
	// holds only A's occurrence and B's first.
	if rv, err := cursor(a, "cluster-a"); err != nil || rv != "10" {
		t.Fatalf("cluster A's cursor after B's attempts: %q, %v; want 10", rv, err)
	}
	if rv, err := cursor(b, "cluster-b"); err != nil || rv != "20" {
		t.Fatalf("cluster B's cursor: %q, %v; want 20", rv, err)
	}
	recs, _, err := c.Store().Read(ctx, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	var stored []string
	for _, r := range recs {
		stored = append(stored, r.Occurrence.GetEventId()+"@"+r.Occurrence.GetCluster())
	}
	if strings.Join(stored, ",") != "a/1@cluster-a,b/1@cluster-b" {
		t.Fatalf("log holds %v, want only a/1@cluster-a and b/1@cluster-b", stored)
	}
	if got := counterValue(t, reg, "eventpipe_collector_auth_failures_total", map[string]string{"reason": authCluster}); got != 4 {
		t.Errorf("cluster_not_granted refusals = %v, want 4", got)
	}
	if n := strings.Count(logs.String(), "refused: agent wrote a cluster it was not granted"); n != 4 || !strings.Contains(logs.String(), "caller=agent-b cluster=cluster-a") {
		t.Errorf("%d refusals logged, want 4 naming agent-b and cluster-a:\n%s", n, logs.String())
	}
}

// An mTLS identity is bound the same way as a token.
func TestIdentityClustersValidated(t *testing.T) {
	cfg := NewDefaultConfig()
	cfg.Store.Dir = "/tmp/x"
	cfg.GRPC.TLS = TLSConfig{CertFile: "testdata/ca.pem", KeyFile: "testdata/ca.pem", ClientCAFile: "testdata/ca.pem"}
	cfg.Auth.Identities = []Identity{
		{Name: "agent-1", Role: RoleAgent},
		{Name: "agent-2", Role: RoleAgent, Clusters: []string{"CHANGE-ME", "", "prod", "prod"}},
		{Name: "reader", Role: RoleReader, Workspaces: []string{"*"}, Clusters: []string{"prod"}},
	}
	err := cfg.Validate()
	for _, want := range []string{
		`auth.identities[0].clusters: an agent needs the clusters it may write`,
		`auth.identities[1].clusters[0]: "CHANGE-ME" is the placeholder of the shipped manifests`,
		`auth.identities[1].clusters[1]: must not be empty`,
		`auth.identities[1].clusters[3]: duplicate "prod"`,
		`auth.identities[2].clusters: only an agent has clusters`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
}

// A tokens file without a token locks every caller out: refused at start
// like a malformed file, and refused at reload (the running tokens stay).
func TestEmptyTokensFileRefused(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"empty.yaml": "", "comments.yaml": "# nothing yet\n", "list.yaml": "[]\n", "empty.csv": "# token,name,role,scopes\n",
	} {
		path := writeFile(t, filepath.Join(dir, name), []byte(content))
		if _, err := LoadTokens(path); err == nil || !strings.Contains(err.Error(), "holds no token: every caller would be refused") {
			t.Errorf("%s: %v", name, err)
		}
		cfg := testConfig(t, dir)
		cfg.Auth.TokensFile = path
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "auth.tokens_file: tokens file "+path+" holds no token") {
			t.Errorf("%s: Validate: %v", name, err)
		}
	}

	// Hot reload: the file is emptied under a running collector.
	cfg := testConfig(t, dir)
	cfgPath := writeFile(t, filepath.Join(dir, "collector.yaml"), []byte(fmt.Sprintf(
		"grpc: {listen: \"127.0.0.1:0\", shutdown_grace: 2s}\nhttp: {listen: \"127.0.0.1:0\"}\nauth: {tokens_file: %q}\nstore: {dir: %q}\n",
		cfg.Auth.TokensFile, cfg.Store.Dir)))
	loaded, err := LoadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	r := startCollector(t, loaded, WithConfigPath(cfgPath))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Rewritten every half second: the watcher may not be set up yet when
	// Run has just started, and the debounce needs a quiet 250ms.
	var last time.Time
	eventually(t, "refused tokens reload", func() bool {
		if time.Since(last) > 500*time.Millisecond {
			renameWrite(t, cfg.Auth.TokensFile, "# rotated: nothing here yet\n")
			last = time.Now()
		}
		return counterValue(t, r.reg, "eventpipe_collector_config_reloads_total", map[string]string{"result": "failed"}) >= 1
	})
	if _, err := eventpipev1.NewIngestClient(dial(t, r.c.GRPCAddr(), agentToken)).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"}); err != nil {
		t.Fatalf("the running tokens were dropped by an empty tokens file: %v", err)
	}
}
