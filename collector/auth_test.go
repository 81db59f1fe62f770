package collector

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

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
		{Name: "agent.prod.example", Role: RoleAgent},
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
