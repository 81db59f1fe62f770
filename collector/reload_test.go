package collector

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// renameWrite replaces path the way editors and kubectl do: write a temp
// file beside it, then rename over.
func renameWrite(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp~"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

const reloadConfig = `
grpc: {listen: "127.0.0.1:0", max_recv_bytes: %d}
http: {listen: "127.0.0.1:0"}
auth: {tokens_file: %q}
store: {dir: %q}
sinks:
  - name: archive
    type: file
    file: {path: %q}
    batch: {max_records: 100, max_wait: 20ms}
    filter: {types: [%s]}
`

// Sink filters and tokens change with the files, without a restart and
// without dropping an open stream; other changes are reported as needing a
// restart; a broken file changes nothing.
func TestHotReload(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.yaml")
	writeFile(t, tokens, []byte(tokensFileYML))
	jsonl := filepath.Join(dir, "events.jsonl")
	cfgPath := filepath.Join(dir, "collector.yaml")
	write := func(maxRecv int, types string) string {
		return fmt.Sprintf(reloadConfig, maxRecv, tokens, filepath.Join(dir, "log"), jsonl, types)
	}
	writeFile(t, cfgPath, []byte(write(1<<20, "Warning")))
	cfg, err := LoadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	r := startCollector(t, cfg, WithConfigPath(cfgPath))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addr := r.c.GRPCAddr()
	agent := dial(t, addr, agentToken)

	// A live follow stream that must survive both reloads.
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	live, err := eventpipev1.NewFollowClient(dial(t, addr, readerWS1)).Follow(lctx, &eventpipev1.FollowRequest{Workspace: "ws1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := live.Header(); err != nil {
		t.Fatal(err)
	}

	warn := occ("w/1", "sb-1", "ws1", "one", "gw")
	warn.Type = "Warning"
	if _, err := ship(t, ctx, agent, batch(1, "prod", "1", occ("n/1", "sb-1", "ws1", "one", "gw"), warn)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Warning in the file sink", func() bool { return readJSONL(t, jsonl)["w/1"] == 1 })
	if readJSONL(t, jsonl)["n/1"] != 0 {
		t.Fatal("filter types: [Warning] let a Normal event through")
	}

	// Filter reload: Normal events now pass.
	renameWrite(t, cfgPath, write(1<<20, "Warning, Normal"))
	eventually(t, "filter reload", func() bool {
		return counterValue(t, r.reg, "eventpipe_collector_config_reloads_total", map[string]string{"result": "applied"}) >= 1
	})
	if _, err := ship(t, ctx, agent, batch(1, "prod", "2", occ("n/2", "sb-1", "ws1", "one", "gw"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Normal event after the reload", func() bool { return readJSONL(t, jsonl)["n/2"] == 1 })

	// Tokens reload: a new agent token works, a removed reader token does not.
	renameWrite(t, tokens, `- {token: agent-token-0123456789, name: agent-a, role: agent, clusters: ["*"]}
- {token: new-agent-token-0123456789, name: agent-b, role: agent, clusters: ["*"]}
- {token: reader-ws1-0123456789, name: reader-ws1, role: reader, workspaces: [ws1]}
`)
	eventually(t, "the new token", func() bool {
		_, err := eventpipev1.NewIngestClient(dial(t, addr, "new-agent-token-0123456789")).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"})
		return err == nil
	})
	if _, err := follow(t, ctx, dial(t, addr, readerAll), &eventpipev1.FollowRequest{Workspace: "ws1", NoFollow: true}, 0); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("removed token: %v, want Unauthenticated", err)
	}

	// A change that needs a restart is reported, not applied.
	renameWrite(t, cfgPath, write(2<<20, "Warning, Normal"))
	eventually(t, "restart_required", func() bool {
		return counterValue(t, r.reg, "eventpipe_collector_config_reloads_total", map[string]string{"result": "restart_required"}) >= 1
	})
	// A broken file is refused and changes nothing.
	renameWrite(t, cfgPath, "grpc: [not, a, map]\n")
	eventually(t, "refused reload", func() bool {
		return counterValue(t, r.reg, "eventpipe_collector_config_reloads_total", map[string]string{"result": "failed"}) >= 1
	})
	if _, err := eventpipev1.NewIngestClient(agent).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"}); err != nil {
		t.Fatalf("after a refused reload: %v", err)
	}

	// The live stream saw everything of ws1, in order, across the reloads.
	if _, err := ship(t, ctx, agent, batch(1, "prod", "3", occ("after/1", "sb-1", "ws1", "one", "gw"))); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"n/1", "w/1", "n/2", "after/1"} {
		m, err := live.Recv()
		if err != nil || m.GetOccurrence().GetEventId() != want {
			t.Fatalf("live stream: %v, %v; want %s", m, err, want)
		}
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.Sinks = []SinkConfig{fileSink("archive", filepath.Join(dir, "events.jsonl"))}
	r := startCollector(t, cfg)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + r.c.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d: %s", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := ship(t, ctx, dial(t, r.c.GRPCAddr(), agentToken), batch(1, "prod", "1", occ("h/1", "sb", "ws1", "n", "gw"))); err != nil {
		t.Fatal(err)
	}
	_, body := get("/metrics")
	for _, name := range []string{
		"eventpipe_collector_ingested_occurrences_total 1",
		"eventpipe_collector_deduplicated_occurrences_total",
		"eventpipe_collector_ingest_batches_total 1",
		"eventpipe_collector_ack_latency_seconds_bucket",
		"eventpipe_collector_follow_subscribers 0",
		`eventpipe_collector_auth_failures_total{reason="bad_token"} 0`,
		`eventpipe_sink_sent_records_total{sink="archive"}`,
		`eventpipe_sink_lag_records{sink="archive"}`,
	} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %q", name)
		}
	}
	if !strings.Contains(body, "eventpipe_collector_log_") {
		t.Errorf("/metrics lacks the store's series (eventpipe_collector_log_*)")
	}
}

// tlsConn dials addr over TLS trusting roots, presenting cert when given
// and a bearer token when given.
func tlsConn(t *testing.T, addr string, roots *x509.CertPool, cert *tls.Certificate, token string) *grpc.ClientConn {
	t.Helper()
	tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// The server certificate and the client CA are renewed in place (as
// cert-manager does): new handshakes get the new certificate and are
// verified against the new CA, an open Ship stream keeps flowing on its
// connection, and a half-done rotation (a key that does not match the new
// certificate yet) keeps the previous pair serving.
func TestTLSReloadKeepsStreams(t *testing.T) {
	dir := t.TempDir()
	ca1, ca2 := newCA(t, "ca-2025"), newCA(t, "ca-2026")
	s1c, s1k := ca1.issue(t, "collector", true)
	cfg := testConfig(t, dir)
	certFile := writeFile(t, filepath.Join(dir, "tls.crt"), s1c)
	keyFile := writeFile(t, filepath.Join(dir, "tls.key"), s1k)
	caFile := writeFile(t, filepath.Join(dir, "ca.crt"), ca1.pem)
	cfg.GRPC.TLS = TLSConfig{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile}
	cfg.Auth.Identities = []Identity{{Name: "agent.prod.example", Role: RoleAgent, Clusters: []string{"prod"}}}
	r := startCollector(t, cfg)
	addr := r.c.GRPCAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool := func(ca *testCA) *x509.CertPool {
		p := x509.NewCertPool()
		p.AppendCertsFromPEM(ca.pem)
		return p
	}
	clientCert := func(ca *testCA) *tls.Certificate {
		c, k := ca.issue(t, "agent.prod.example", false)
		pair, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return &pair
	}
	getCursor := func(conn *grpc.ClientConn) error {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		defer ccancel()
		_, err := eventpipev1.NewIngestClient(conn).GetCursor(cctx, &eventpipev1.GetCursorRequest{Cluster: "prod"})
		return err
	}
	cert1 := clientCert(ca1)

	// A stream opened with the first certificate and CA.
	old := tlsConn(t, addr, pool(ca1), cert1, "")
	stream, err := eventpipev1.NewIngestClient(old).Ship(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(seq uint64) {
		t.Helper()
		if err := stream.Send(batch(seq, "prod", fmt.Sprint(seq), occ(fmt.Sprintf("tls/%d", seq), "sb", "ws1", "n", "gw"))); err != nil {
			t.Fatalf("send %d: %v", seq, err)
		}
		ack, err := stream.Recv()
		if err != nil || ack.GetSeq() != seq || ack.GetStored() != 1 {
			t.Fatalf("ack %d: %v, %v", seq, ack, err)
		}
	}
	send(1)

	// Half a rotation: the new certificate with the old key. Refused; the
	// old pair keeps serving new handshakes.
	s2c, s2k := ca2.issue(t, "collector", true)
	renameWrite(t, certFile, string(s2c))
	if err := getCursor(tlsConn(t, addr, pool(ca1), cert1, "")); err != nil {
		t.Fatalf("after a half rotation, the old certificate should still serve: %v", err)
	}
	if got := counterValue(t, r.reg, "eventpipe_collector_tls_reloads_total", map[string]string{"result": "failed"}); got != 1 {
		t.Errorf("tls reloads failed = %v, want 1", got)
	}
	send(2)

	// The rotation completes: key, then the client CA.
	renameWrite(t, keyFile, string(s2k))
	renameWrite(t, caFile, string(ca2.pem))
	cert2 := clientCert(ca2)
	if err := getCursor(tlsConn(t, addr, pool(ca2), cert2, "")); err != nil {
		t.Fatalf("new certificate and CA: %v", err)
	}
	// The old server certificate is no longer presented, and a client
	// certificate of the old CA no longer verifies.
	if err := getCursor(tlsConn(t, addr, pool(ca1), cert1, "")); status.Code(err) != codes.Unavailable {
		t.Fatalf("client trusting only the old CA: %v, want Unavailable (handshake refused)", err)
	}
	if err := getCursor(tlsConn(t, addr, pool(ca2), cert1, "")); status.Code(err) != codes.Unavailable {
		t.Fatalf("client certificate of the old CA: %v, want Unavailable (handshake refused)", err)
	}
	if got := counterValue(t, r.reg, "eventpipe_collector_tls_reloads_total", map[string]string{"result": "applied"}); got != 1 {
		t.Errorf("tls reloads applied = %v, want 1", got)
	}
	leaf, _ := x509.ParseCertificate(mustPEMBlock(t, s2c))
	if got := counterValue(t, r.reg, "eventpipe_collector_tls_cert_expiry_timestamp_seconds", nil); got != float64(leaf.NotAfter.Unix()) {
		t.Errorf("cert expiry gauge = %v, want %d", got, leaf.NotAfter.Unix())
	}

	// The stream opened before the rotation still flows, on the same
	// connection (a reconnect trusting only the old CA would now fail).
	send(3)
	send(4)
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("stream end: %v", err)
	}
}

func mustPEMBlock(t *testing.T, data []byte) []byte {
	t.Helper()
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatal("no PEM block")
	}
	return b.Bytes
}
