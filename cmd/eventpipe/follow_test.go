//go:build !agentonly

package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
)

// Seed shapes: the image-pull issue's sandbox img-missing in managed
// workspace repro, gateway id openshell (Helm default).
const (
	fSandboxID = "2ff21e26-1a7b-49a2-a640-14ae153f93ea"
	fNamespace = "openshell-openshell-repro"
	fImage     = "docker.io/library/busybox:0.0.0-does-not-exist"

	fAgentToken  = "agent-token-0123456789"
	fReaderRepro = "reader-repro-0123456789"
	fReaderOther = "reader-other-0123456789"
	fTokensYAML  = `- {token: agent-token-0123456789, name: agent-a, role: agent, clusters: ["*"]}
- {token: reader-repro-0123456789, name: alice, role: reader, workspaces: [repro]}
- {token: reader-other-0123456789, name: bob, role: reader, workspaces: [other]}
`
)

// fixture is a real collector on 127.0.0.1:0 with its log and tokens file in
// a temp dir, and token files for the command's --token-file.
type fixture struct {
	c *collector.Collector
	// ingestCreds is the agent's transport (default plaintext).
	ingestCreds credentials.TransportCredentials
	dir         string
	addr        string
	cancel      context.CancelFunc
	done        chan error
}

func startFollowCollector(t *testing.T, dir, listen string, mods ...func(*collector.Config)) *fixture {
	t.Helper()
	tokens := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokens, []byte(fTokensYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"repro.token": fReaderRepro, "other.token": fReaderOther, "agent.token": fAgentToken, "wrong.token": "not-a-known-token-0123456789"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen = listen
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = 2 * time.Second
	cfg.Store.Dir = filepath.Join(dir, "log")
	cfg.Auth.TokensFile = tokens
	for _, m := range mods {
		m(&cfg)
	}
	c, err := collector.New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("collector.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fixture{c: c, dir: dir, addr: c.GRPCAddr(), cancel: cancel, done: make(chan error, 1)}
	go func() { f.done <- c.Run(ctx) }()
	return f
}

// stop ends the collector and waits for it (before goleak looks).
func (f *fixture) stop(t *testing.T) {
	t.Helper()
	if f.cancel == nil {
		return
	}
	f.cancel()
	f.cancel = nil
	select {
	case err := <-f.done:
		if err != nil {
			t.Errorf("collector Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("collector did not stop")
	}
}

func (f *fixture) token(name string) string { return filepath.Join(f.dir, name+".token") }

type bearerToken string

func (b bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearerToken) RequireTransportSecurity() bool { return false }

// testPKI writes a CA, a server certificate for collector.eventpipe.svc
// (not for 127.0.0.1, so --server-name matters) and a client certificate
// with CN alice-cli into dir.
func testPKI(t *testing.T, dir string) (caFile, serverCert, serverKey, clientCert, clientKey string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "eventpipe test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(serial int64, cn string, dns []string, usage x509.ExtKeyUsage, name string) (string, string) {
		k := newKey()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".crt", "CERTIFICATE", der), write(name+".key", "PRIVATE KEY", kb)
	}
	caFile = write("ca.crt", "CERTIFICATE", caDER)
	serverCert, serverKey = leaf(2, "collector", []string{"collector.eventpipe.svc"}, x509.ExtKeyUsageServerAuth, "server")
	clientCert, clientKey = leaf(3, "alice-cli", nil, x509.ExtKeyUsageClientAuth, "client")
	return caFile, serverCert, serverKey, clientCert, clientKey
}

// ingest ships occurrences through the real Ingest service as the agent
// does and waits for the acknowledgement.
func (f *fixture) ingest(t *testing.T, seq uint64, rv string, occs ...*eventpipev1.Occurrence) {
	t.Helper()
	creds := f.ingestCreds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(creds), grpc.WithPerRPCCredentials(bearerToken(fAgentToken)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := eventpipev1.NewIngestClient(conn).Ship(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&eventpipev1.Batch{Seq: seq, Cluster: "kind-koinon-osrepro", Stream: collector.DefaultStream, ResourceVersion: rv, Occurrences: occs}); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	acks := 0
	for {
		_, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("ship: %v", err)
		}
		acks++
	}
	if acks != 1 {
		t.Fatalf("got %d acks, want 1", acks)
	}
}

var fT0 = time.Date(2026, 10, 29, 10, 10, 36, 0, time.UTC) // 1793268636

// fOcc is an occurrence of sandbox img-missing as enrich emits it.
func fOcc(n int, at time.Duration, typ, reason, component, container, msg string) *eventpipev1.Occurrence {
	ts := timestamppb.New(fT0.Add(at))
	o := &eventpipev1.Occurrence{
		SchemaVersion: eventpipev1.SchemaVersion,
		EventId:       fmt.Sprintf("0c6f5a7e-5d7b-4e0b-9d1b-2f0b7b3c9a%02d/%d", n, 4460+n),
		OccurredAt:    ts,
		ObservedAt:    ts,
		Cluster:       "kind-koinon-osrepro",
		Namespace:     fNamespace,
		Event: &eventpipev1.EventRef{Name: fmt.Sprintf("img-missing.1873a3f1c2d4e5%02d", n),
			Uid: fmt.Sprintf("0c6f5a7e-5d7b-4e0b-9d1b-2f0b7b3c9a%02d", n), ResourceVersion: fmt.Sprint(4460 + n), ApiVersion: "v1"},
		InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", ApiVersion: "v1", Namespace: fNamespace, Name: "img-missing",
			Uid: "876414ec-8379-42b9-8deb-a047f4214891"},
		Type:               typ,
		Reason:             reason,
		Message:            msg,
		Count:              1,
		ReportingComponent: component,
		ReportingInstance:  "koinon-osrepro-control-plane",
		Sandbox: &eventpipev1.Sandbox{Id: fSandboxID, Name: "img-missing", Workspace: "repro", GatewayId: "openshell",
			CrNamespace: fNamespace, CrName: "img-missing"},
		Attribution: eventpipev1.AttributionOwnerChain,
		Role:        eventpipev1.RoleWorkload,
	}
	if container != "" {
		o.Container = container
		o.InvolvedObject.FieldPath = "spec.initContainers{" + container + "}"
	}
	return o
}

func withPull(o *eventpipev1.Occurrence, count int32, attempts uint32) *eventpipev1.Occurrence {
	o.Count = count
	o.Image, o.ImageRole = fImage, eventpipev1.ImageRoleWorkload
	o.PullFailure = &eventpipev1.PullFailure{Category: eventpipev1.CategoryNotFound, Image: fImage, Disposition: eventpipev1.DispositionRetrying,
		Attempts: attempts, FirstSeen: timestamppb.New(fT0.Add(2 * time.Second)), LastSeen: o.OccurredAt,
		Detail: fImage + ": not found", Source: eventpipev1.PullSourceEvent}
	return o
}

// seedOccurrences: the img-missing story (cursors 1, 2, 3, 6), an
// unattributed kube-system event (4) and a sandbox of workspace other (5).
func seedOccurrences() []*eventpipev1.Occurrence {
	pullMsg := `Failed to pull image "` + fImage + `": rpc error: code = NotFound desc = failed to pull and unpack image "` + fImage + `": failed to resolve reference "` + fImage + `": ` + fImage + `: not found`
	sched := fOcc(1, 0, "Normal", "Scheduled", "default-scheduler", "", "Successfully assigned openshell-openshell-repro/img-missing to koinon-osrepro-control-plane")
	pulling := fOcc(2, 1120*time.Millisecond, "Normal", "Pulling", "kubelet", "workspace-init", `Pulling image "`+fImage+`"`)
	pulling.Image, pulling.ImageRole = fImage, eventpipev1.ImageRoleWorkload
	failed := withPull(fOcc(3, 2250*time.Millisecond, "Warning", "Failed", "kubelet", "workspace-init", pullMsg), 1, 1)
	unattributed := &eventpipev1.Occurrence{SchemaVersion: 1, EventId: "5b1e0f6a-0000-4000-8000-000000000001/90", OccurredAt: timestamppb.New(fT0), ObservedAt: timestamppb.New(fT0),
		Cluster: "kind-koinon-osrepro", Namespace: "kube-system", Type: "Normal", Reason: "LeaderElection", Message: "koinon-osrepro-control-plane became leader",
		InvolvedObject: &eventpipev1.ObjectRef{Kind: "Lease", Namespace: "kube-system", Name: "kube-scheduler"}, Count: 1,
		Attribution: eventpipev1.AttributionNone, Role: eventpipev1.RoleNone}
	other := fOcc(5, 3*time.Second, "Normal", "Pulled", "kubelet", "agent", "Successfully pulled image \"ghcr.io/example/agent:1.2.3\" in 1.2s")
	other.EventId = "9d9d9d9d-0000-4000-8000-000000000005/5000"
	other.Sandbox = &eventpipev1.Sandbox{Id: "7e1d1c9a-6a43-4d8e-b7c4-3e2f2a1b0c9d", Name: "fine", Workspace: "other", GatewayId: "openshell"}
	backoff := withPull(fOcc(6, 16*time.Second, "Normal", "BackOff", "kubelet", "workspace-init", `Back-off pulling image "`+fImage+`"`), 4, 4)
	return []*eventpipev1.Occurrence{sched, pulling, failed, unattributed, other, backoff}
}

// The exact text lines of cursors 1, 2, 3 and 6.
const (
	wantLine1 = `[1793268636.000] [sched  ] [INFO ] [pod/img-missing] Successfully assigned openshell-openshell-repro/img-missing to koinon-osrepro-control-plane reason=Scheduled cursor=1`
	wantLine2 = `[1793268637.120] [kubelet] [INFO ] [workload/workspace-init] Pulling image "docker.io/library/busybox:0.0.0-does-not-exist" reason=Pulling image=docker.io/library/busybox:0.0.0-does-not-exist cursor=2`
	wantLine3 = `[1793268638.250] [kubelet] [WARN ] [workload/workspace-init] workload image docker.io/library/busybox:0.0.0-does-not-exist: not_found (docker.io/library/busybox:0.0.0-does-not-exist: not found) reason=Failed image=docker.io/library/busybox:0.0.0-does-not-exist pull=not_found disposition=retrying cursor=3`
	wantLine6 = `[1793268652.000] [kubelet] [WARN ] [workload/workspace-init] workload image docker.io/library/busybox:0.0.0-does-not-exist: not_found (docker.io/library/busybox:0.0.0-does-not-exist: not found) reason=BackOff image=docker.io/library/busybox:0.0.0-does-not-exist pull=not_found disposition=retrying count=4 cursor=6`
)

func lines(ls ...string) string {
	if len(ls) == 0 {
		return ""
	}
	return strings.Join(ls, "\n") + "\n"
}

func TestFollowCommandReplay(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := startFollowCollector(t, t.TempDir(), "127.0.0.1:0")
	defer f.stop(t)
	f.ingest(t, 1, "4471", seedOccurrences()...)
	conn := []string{"--collector", f.addr, "--insecure", "--token-file", f.token("repro")}

	cases := []struct {
		name       string
		args       []string
		wantOut    string
		wantStderr string
	}{
		{"sandbox tail replay", []string{"--sandbox", fSandboxID, "--no-follow"},
			lines(wantLine1, wantLine2, wantLine3, wantLine6), "last cursor 6 (resume with --after 6)"},
		{"tail 2", []string{"--sandbox", fSandboxID, "--tail", "2", "--no-follow"},
			lines(wantLine3, wantLine6), "--after 6"},
		{"resume after cursor 2", []string{"--sandbox", fSandboxID, "--after", "2", "--no-follow"},
			lines(wantLine3, wantLine6), "--after 6"},
		{"resume at the end", []string{"--sandbox", fSandboxID, "--after", "6", "--no-follow"},
			"", "--after 6"},
		{"workspace and name", []string{"--workspace", "repro", "--name", "img-missing", "--tail", "1", "--no-follow"},
			lines(wantLine6), "--after 6"},
		{"workspace adds the sandbox name", []string{"--workspace", "repro", "--tail", "1", "--no-follow"},
			lines(strings.Replace(wantLine6, " image=", " sandbox=img-missing image=", 1)), "--after 6"},
		// The reader of repro never sees workspace other's sandbox (cursor 5).
		{"gateway scoped to the reader's workspaces", []string{"--gateway", "openshell", "--tail", "10", "--no-follow", "-o", "text"},
			lines(
				strings.Replace(wantLine1, " cursor=", " sandbox=img-missing cursor=", 1),
				strings.Replace(wantLine2, " image=", " sandbox=img-missing image=", 1),
				strings.Replace(wantLine3, " image=", " sandbox=img-missing image=", 1),
				strings.Replace(wantLine6, " image=", " sandbox=img-missing image=", 1)), "--after 6"},
		{"unknown sandbox", []string{"--sandbox", "00000000-0000-4000-8000-000000000000", "--no-follow"},
			"", "--after 6"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := runFollow(context.Background(), append(append([]string{}, conn...), tc.args...), nil, &out, &errb)
			if code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
			}
			if out.String() != tc.wantOut {
				t.Errorf("stdout:\n%s\nwant:\n%s", out.String(), tc.wantOut)
			}
			if !strings.Contains(errb.String(), tc.wantStderr) {
				t.Errorf("stderr lacks %q:\n%s", tc.wantStderr, errb.String())
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		var out, errb bytes.Buffer
		args := append(append([]string{}, conn...), "--sandbox", fSandboxID, "--tail", "2", "--no-follow", "--output", "json")
		if code := runFollow(context.Background(), args, nil, &out, &errb); code != 0 {
			t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
		}
		seed := seedOccurrences()
		want := []*eventpipev1.FollowResponse{{Cursor: 3, Occurrence: seed[2]}, {Cursor: 6, Occurrence: seed[5]}}
		got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		if len(got) != len(want) {
			t.Fatalf("got %d lines, want %d:\n%s", len(got), len(want), out.String())
		}
		for i, l := range got {
			var raw map[string]any
			if err := json.Unmarshal([]byte(l), &raw); err != nil {
				t.Fatalf("line %d is not JSON: %v\n%s", i, err, l)
			}
			occ, _ := raw["occurrence"].(map[string]any)
			if raw["cursor"] != fmt.Sprint(want[i].Cursor) || occ["event_id"] == nil || occ["pull_failure"] == nil {
				t.Errorf("line %d lacks cursor/proto names: %s", i, l)
			}
			var m eventpipev1.FollowResponse
			if err := protojson.Unmarshal([]byte(l), &m); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(&m, want[i]) {
				t.Errorf("line %d = %v, want %v", i, &m, want[i])
			}
		}
	})
}

func TestFollowCommandFlagErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no selector", nil, "no selector: pass exactly one of --sandbox ID, --workspace WS [--name NAME], --gateway ID"},
		{"two selectors", []string{"--sandbox", fSandboxID, "--gateway", "openshell"}, "more than one selector"},
		{"three selectors", []string{"--sandbox", fSandboxID, "--workspace", "repro", "--gateway", "openshell"}, "more than one selector"},
		{"name without workspace", []string{"--sandbox", fSandboxID, "--name", "img-missing"}, "--name needs --workspace"},
		{"bad output", []string{"--sandbox", fSandboxID, "-o", "yaml"}, `--output must be text or json, got "yaml"`},
		{"cert without key", []string{"--sandbox", fSandboxID, "--cert", "c.pem"}, "--cert and --key go together"},
		{"insecure with ca", []string{"--sandbox", fSandboxID, "--insecure", "--ca", "ca.pem"}, "--insecure (plaintext) cannot be combined"},
		{"positional sandbox", []string{"img-missing"}, "unexpected arguments"},
		{"unknown flag", []string{"--follow"}, "flag provided but not defined: -follow"},
		{"missing token file", []string{"--sandbox", fSandboxID, "--token-file", "/nonexistent/reader.token"}, "--token-file: open /nonexistent/reader.token"},
		{"bad tail", []string{"--sandbox", fSandboxID, "--tail", "-1"}, "invalid value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := runFollow(context.Background(), tc.args, nil, &out, &errb); code != 2 {
				t.Errorf("exit %d, want 2; stderr:\n%s", code, errb.String())
			}
			if !strings.Contains(errb.String(), tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, errb.String())
			}
			if out.Len() != 0 {
				t.Errorf("stdout not empty: %q", out.String())
			}
		})
	}
	var out, errb bytes.Buffer
	if code := realMain([]string{"follow", "--help"}, nil, &out, &errb); code != 0 || !strings.Contains(errb.String(), "--workspace WS [--name NAME]") {
		t.Errorf("--help: exit %d\n%s", code, errb.String())
	}
}

func TestFollowCommandRefusals(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := startFollowCollector(t, t.TempDir(), "127.0.0.1:0")
	defer f.stop(t)
	f.ingest(t, 1, "4471", seedOccurrences()...)
	dead := deadAddr(t)

	cases := []struct {
		name  string
		args  []string
		code  int
		wants []string
	}{
		{"no token", []string{"--collector", f.addr, "--insecure", "--sandbox", fSandboxID, "--no-follow"}, exitRefused,
			[]string{"the collector refused the credentials: pass --token-file"}},
		{"wrong token", []string{"--collector", f.addr, "--insecure", "--token-file", f.token("wrong"), "--sandbox", fSandboxID}, exitRefused,
			[]string{"the collector refused the credentials: pass --token-file", f.token("wrong"), "unknown bearer token"}},
		{"workspace not granted", []string{"--collector", f.addr, "--insecure", "--token-file", f.token("other"), "--workspace", "repro"}, exitRefused,
			[]string{`does not allow these credentials to follow workspace "repro"`, `"bob" may not follow workspace "repro"`}},
		{"agent token", []string{"--collector", f.addr, "--insecure", "--token-file", f.token("agent"), "--sandbox", fSandboxID}, exitRefused,
			[]string{"does not allow these credentials to follow sandbox " + fSandboxID, "needs role reader"}},
		{"tail above the maximum", []string{"--collector", f.addr, "--insecure", "--token-file", f.token("repro"), "--sandbox", fSandboxID, "--tail", "20000"}, 2,
			[]string{"the collector refused the request: tail 20000 exceeds the maximum 10000"}},
		{"resume beyond the log", []string{"--collector", f.addr, "--insecure", "--token-file", f.token("repro"), "--sandbox", fSandboxID, "--after", "99"}, exitUsage,
			[]string{"cannot resume after cursor 99", "run again without --after"}},
		{"not reachable", []string{"--collector", dead, "--insecure", "--token-file", f.token("repro"), "--sandbox", fSandboxID, "--no-follow"}, exitUnreachable,
			[]string{"collector at " + dead + " is not reachable"}},
		{"TLS against plaintext", []string{"--collector", f.addr, "--token-file", f.token("repro"), "--sandbox", fSandboxID, "--no-follow"}, exitUnreachable,
			[]string{"collector at " + f.addr + " is not reachable", "pass --insecure"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var out, errb bytes.Buffer
			if code := runFollow(ctx, tc.args, nil, &out, &errb); code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, errb.String())
			}
			for _, w := range tc.wants {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, errb.String())
				}
			}
			if out.Len() != 0 {
				t.Errorf("stdout not empty: %q", out.String())
			}
			t.Logf("stderr: %s", errb.String())
		})
	}
}

// waitFor polls a buffer until it contains want.
func waitFor(t *testing.T, b *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(b.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %q in:\n%s", want, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Live: tail, then new events as they are ingested; the collector restarts
// under the command, which reconnects and resumes by cursor without
// repeating or skipping; Ctrl-C ends it with exit 0 and the resume cursor.
func TestFollowCommandLiveReconnectInterrupt(t *testing.T) {
	defer goleak.VerifyNone(t)
	oldMin := followBackoffMin
	followBackoffMin = 50 * time.Millisecond
	defer func() { followBackoffMin = oldMin }()

	dir := t.TempDir()
	f := startFollowCollector(t, dir, "127.0.0.1:0")
	defer func() { f.stop(t) }()
	f.ingest(t, 1, "4471", seedOccurrences()...)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- runFollow(ctx, []string{"--collector", f.addr, "--insecure", "--token-file", f.token("repro"),
			"--sandbox", fSandboxID, "--tail", "1"}, nil, &out, &errb)
	}()
	waitFor(t, &out, wantLine6)

	live := withPull(fOcc(7, 26*time.Second, "Normal", "BackOff", "kubelet", "workspace-init", `Back-off pulling image "`+fImage+`"`), 5, 5)
	live.PullFailure.Disposition = eventpipev1.DispositionPersistent
	f.ingest(t, 2, "4480", live)
	wantLive := `[1793268662.000] [kubelet] [WARN ] [workload/workspace-init] workload image docker.io/library/busybox:0.0.0-does-not-exist: not_found (docker.io/library/busybox:0.0.0-does-not-exist: not found) reason=BackOff image=docker.io/library/busybox:0.0.0-does-not-exist pull=not_found disposition=persistent count=5 cursor=7`
	waitFor(t, &out, wantLive)

	// Restart the collector on the same address and data directory.
	addr := f.addr
	f.stop(t)
	waitFor(t, &errb, "will resume after cursor 7 in")
	f = startFollowCollector(t, dir, addr)
	after := fOcc(8, 40*time.Second, "Warning", "Failed", "kubelet", "workspace-init", "Error: ImagePullBackOff")
	f.ingest(t, 3, "4490", after)
	wantAfter := `[1793268676.000] [kubelet] [WARN ] [workload/workspace-init] Error: ImagePullBackOff reason=Failed cursor=8`
	waitFor(t, &out, wantAfter)

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d after Ctrl-C; stderr:\n%s", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("follow did not stop on cancel")
	}
	if want := lines(wantLine6, wantLive, wantAfter); out.String() != want {
		t.Errorf("stdout:\n%s\nwant (no repeats, no gaps):\n%s", out.String(), want)
	}
	if !strings.Contains(errb.String(), "last cursor 8 (resume with --after 8)") {
		t.Errorf("stderr lacks the resume cursor:\n%s", errb.String())
	}
}

// Resuming from a cursor that retention has removed warns how many records
// were lost, then prints what is still stored.
func TestFollowCommandResumeBehindRetention(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := startFollowCollector(t, t.TempDir(), "127.0.0.1:0", func(c *collector.Config) {
		c.Store.SegmentBytes = 4 << 10
		c.Store.Retention.MaxBytes = 8 << 10
	})
	defer f.stop(t)
	for b := range 20 {
		var occs []*eventpipev1.Occurrence
		for i := range 10 {
			o := fOcc(10*b+i, time.Duration(10*b+i)*time.Second, "Normal", "BackOff", "kubelet", "workspace-init", `Back-off pulling image "`+fImage+`"`)
			occs = append(occs, withPull(o, int32(10*b+i+1), uint32(10*b+i+1)))
		}
		f.ingest(t, uint64(b+1), fmt.Sprint(5000+b), occs...)
	}
	if _, err := f.c.Store().ApplyRetention(); err != nil {
		t.Fatal(err)
	}
	first, last := f.c.Store().Bounds()
	if first <= 2 {
		t.Fatalf("retention removed nothing (bounds %d..%d)", first, last)
	}
	var out, errb bytes.Buffer
	code := runFollow(context.Background(), []string{"--collector", f.addr, "--insecure", "--token-file", f.token("repro"),
		"--sandbox", fSandboxID, "--after", "1", "--no-follow"}, nil, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
	}
	want := fmt.Sprintf("eventpipe follow: WARNING: %d log records after cursor 1 were removed by the collector's retention before being read; events of this selection may be missing from the output\n", first-2)
	if !strings.HasPrefix(errb.String(), want) {
		t.Errorf("stderr:\n%s\nwant first line:\n%s", errb.String(), want)
	}
	got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if uint64(len(got)) != last-first+1 || !strings.HasSuffix(got[0], fmt.Sprintf(" cursor=%d", first)) {
		t.Errorf("got %d lines starting with %q; want %d from cursor %d", len(got), got[0], last-first+1, first)
	}
	if !strings.Contains(errb.String(), fmt.Sprintf("resume with --after %d", last)) {
		t.Errorf("stderr lacks the resume cursor %d:\n%s", last, errb.String())
	}
}

// scriptedFollow is a Follow server that plays one scripted reply per call,
// for what a real collector does only under load: DataLoss mid-stream.
type scriptedFollow struct {
	eventpipev1.UnimplementedFollowServer
	reqs  chan *eventpipev1.FollowRequest
	calls []func(eventpipev1.Follow_FollowServer) error
}

func (s *scriptedFollow) Follow(req *eventpipev1.FollowRequest, st eventpipev1.Follow_FollowServer) error {
	n := len(s.reqs)
	s.reqs <- req
	if n >= len(s.calls) {
		return status.Error(codes.Internal, "unscripted call")
	}
	return s.calls[n](st)
}

// A DataLoss mid-stream is reported with its count and the stream resumes
// from the cursor the collector named; the resubscription's header counts
// that loss again, so only the extra record is reported.
func TestFollowCommandDataLoss(t *testing.T) {
	defer goleak.VerifyNone(t)
	seed := seedOccurrences()
	srv := &scriptedFollow{reqs: make(chan *eventpipev1.FollowRequest, 10), calls: []func(eventpipev1.Follow_FollowServer) error{
		func(st eventpipev1.Follow_FollowServer) error {
			st.SendHeader(metadata.Pairs(collector.HeaderLostRecords, "0", collector.HeaderLastCursor, "3"))
			if err := st.Send(&eventpipev1.FollowResponse{Cursor: 3, Occurrence: seed[2]}); err != nil {
				return err
			}
			return status.Error(codes.DataLoss, "120 log records after cursor 40 were removed by retention before they were read; resume with after_cursor=40 to continue (the loss is reported again in the eventpipe-lost-records header)")
		},
		func(st eventpipev1.Follow_FollowServer) error {
			st.SendHeader(metadata.Pairs(collector.HeaderLostRecords, "121", collector.HeaderLastCursor, "170"))
			st.SetTrailer(metadata.Pairs(collector.HeaderLostRecords, "121"))
			return st.Send(&eventpipev1.FollowResponse{Cursor: 162, Occurrence: seed[5]})
		},
	}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	eventpipev1.RegisterFollowServer(gs, srv)
	go gs.Serve(lis)
	defer gs.Stop()

	var out, errb bytes.Buffer
	code := runFollow(context.Background(), []string{"--collector", lis.Addr().String(), "--insecure", "--sandbox", fSandboxID, "--no-follow"}, nil, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
	}
	close(srv.reqs)
	var reqs []string
	for r := range srv.reqs {
		reqs = append(reqs, fmt.Sprintf("tail=%d after=%d no_follow=%v", r.GetTail(), r.GetAfterCursor(), r.GetNoFollow()))
	}
	if got, want := strings.Join(reqs, "; "), "tail=50 after=0 no_follow=true; tail=0 after=40 no_follow=true"; got != want {
		t.Errorf("requests: %s\nwant:      %s", got, want)
	}
	wantErr := "eventpipe follow: WARNING: 120 log records after cursor 40 were removed by the collector's retention before being read; events of this selection may be missing from the output\n" +
		"eventpipe follow: WARNING: another 1 log record after cursor 40 was removed by the collector's retention before being read; events of this selection may be missing from the output\n" +
		"eventpipe follow: last cursor 170 (resume with --after 170)\n"
	if errb.String() != wantErr {
		t.Errorf("stderr:\n%s\nwant:\n%s", errb.String(), wantErr)
	}
	if want := lines(wantLine3, strings.Replace(wantLine6, "cursor=6", "cursor=162", 1)); out.String() != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", out.String(), want)
	}
}

// Untrusted cluster text stays on one line and out of the terminal's
// control; unusual shapes still get a target and a source.
func TestFormatFollowLine(t *testing.T) {
	at := timestamppb.New(time.Date(2026, 10, 29, 10, 10, 36, 7_000_000, time.UTC))
	cases := []struct {
		name string
		occ  *eventpipev1.Occurrence
		want string
	}{
		{"newline and escape sequence in the message",
			&eventpipev1.Occurrence{OccurredAt: at, Type: "Warning", Reason: "Failed", ReportingComponent: "kubelet",
				Message: "line one\nline two \x1b[31mred\x1b[0m\ttab", InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", Name: "p"}},
			`[1793268636.007] [kubelet] [WARN ] [pod/p] line one\nline two \x1b[31mred\x1b[0m tab reason=Failed cursor=9` + "\n"},
		{"long component, sandbox CR, truncated message",
			&eventpipev1.Occurrence{OccurredAt: at, Type: "Normal", Reason: "SandboxReady", ReportingComponent: "agent-sandbox-controller",
				Message: "Pod exists with phase: Pending", MessageTruncated: true, Role: eventpipev1.RoleSandbox,
				InvolvedObject: &eventpipev1.ObjectRef{Kind: "Sandbox", Name: "img-missing"}},
			`[1793268636.007] [k8s    ] [INFO ] [sandbox/img-missing] Pod exists with phase: Pending [truncated] reason=SandboxReady cursor=9` + "\n"},
		{"supervisor image, value with a space, no object",
			&eventpipev1.Occurrence{OccurredAt: at, Type: "Warning", Reason: "Failed", Role: eventpipev1.RoleSupervisor, Container: "supervisor",
				ImageRole: eventpipev1.ImageRoleSupervisor, Image: "ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist",
				PullFailure: &eventpipev1.PullFailure{Category: eventpipev1.CategoryNotFound, Disposition: "a b"}},
			`[1793268636.007] [k8s    ] [WARN ] [supervisor/supervisor] supervisor image ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist: not_found reason=Failed image=ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist pull=not_found disposition="a b" cursor=9` + "\n"},
		{"an unrecognised cause: the runtime's words, how it was decided, how sure",
			&eventpipev1.Occurrence{OccurredAt: at, Type: "Warning", Reason: "Failed", Role: eventpipev1.RoleWorkload, Container: "agent",
				ImageRole: eventpipev1.ImageRoleWorkload, Image: "r.example.com/app:1",
				PullFailure: &eventpipev1.PullFailure{Category: eventpipev1.CategoryUnrecognised, Detail: "the flux capacitor is misaligned",
					DecidedBy: eventpipev1.DecidedByTextRule, Confidence: eventpipev1.ConfidenceWeak, Disposition: eventpipev1.DispositionRetrying}},
			`[1793268636.007] [k8s    ] [WARN ] [workload/agent] workload image r.example.com/app:1: unrecognised (the flux capacitor is misaligned) reason=Failed image=r.example.com/app:1 pull=unrecognised confidence=weak decided_by=text_rule disposition=retrying cursor=9` + "\n"},
		{"no object at all", &eventpipev1.Occurrence{OccurredAt: at, Reason: "X"},
			`[1793268636.007] [k8s    ] [INFO ] [-] reason=X cursor=9` + "\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := formatFollowLine(&eventpipev1.FollowResponse{Cursor: 9, Occurrence: tc.occ}, false)
			if got != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// TLS flags against a collector with a CA-signed certificate and mTLS:
// a reader token over TLS, a client certificate mapped to role reader, and
// the hints for the two usual mistakes.
func TestFollowCommandTLS(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	caFile, srvCert, srvKey, cliCert, cliKey := testPKI(t, dir)
	f := startFollowCollector(t, dir, "127.0.0.1:0", func(c *collector.Config) {
		c.GRPC.TLS = collector.TLSConfig{CertFile: srvCert, KeyFile: srvKey, ClientCAFile: caFile}
		c.Auth.Identities = []collector.Identity{{Name: "alice-cli", Role: "reader", Workspaces: []string{"repro"}}}
	})
	defer f.stop(t)
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(caFile)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA: %v", err)
	}
	f.ingestCreds = credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "collector.eventpipe.svc", MinVersion: tls.VersionTLS12})
	f.ingest(t, 1, "4471", seedOccurrences()...)

	base := []string{"--collector", f.addr, "--sandbox", fSandboxID, "--tail", "1", "--no-follow"}
	cases := []struct {
		name  string
		args  []string
		code  int
		out   string
		wants string
	}{
		{"token over TLS", []string{"--ca", caFile, "--server-name", "collector.eventpipe.svc", "--token-file", f.token("repro")}, 0, lines(wantLine6), "--after 6"},
		{"client certificate", []string{"--ca", caFile, "--server-name", "collector.eventpipe.svc", "--cert", cliCert, "--key", cliKey}, 0, lines(wantLine6), "--after 6"},
		{"unknown CA", []string{"--server-name", "collector.eventpipe.svc", "--token-file", f.token("repro")}, exitUnreachable, "", "pass --ca with the CA"},
		{"name mismatch", []string{"--ca", caFile, "--token-file", f.token("repro")}, exitUnreachable, "", "pass --server-name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := runFollow(context.Background(), append(append([]string{}, base...), tc.args...), nil, &out, &errb)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, errb.String())
			}
			if out.String() != tc.out {
				t.Errorf("stdout:\n%s\nwant:\n%s", out.String(), tc.out)
			}
			if !strings.Contains(errb.String(), tc.wants) {
				t.Errorf("stderr lacks %q:\n%s", tc.wants, errb.String())
			}
			t.Logf("stderr: %s", errb.String())
		})
	}
}

// From collectors in Kafka mode the command keeps the position each
// message carries, resumes with it (beside the cursor) after a broken
// stream, and prints it on exit for --after-position.
func TestFollowCommandResumesByPosition(t *testing.T) {
	defer goleak.VerifyNone(t)
	oldMin := followBackoffMin
	followBackoffMin = 20 * time.Millisecond
	defer func() { followBackoffMin = oldMin }()
	seed := seedOccurrences()
	p0, p1, p2 := []byte{1, 0, 1, 0, 7}, []byte{1, 0, 1, 0, 8}, []byte{1, 0, 1, 0, 9}
	sent := make(chan struct{})
	srv := &scriptedFollow{reqs: make(chan *eventpipev1.FollowRequest, 10), calls: []func(eventpipev1.Follow_FollowServer) error{
		func(st eventpipev1.Follow_FollowServer) error {
			st.SendHeader(metadata.Pairs(collector.HeaderLostRecords, "0", collector.HeaderLastCursor, "0", collector.HeaderLastPosition, string(p0)))
			if err := st.Send(&eventpipev1.FollowResponse{Cursor: 3, Occurrence: seed[2], Position: p1, Partition: 4}); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "replica killed")
		},
		func(st eventpipev1.Follow_FollowServer) error {
			st.SendHeader(metadata.Pairs(collector.HeaderLostRecords, "0", collector.HeaderLastCursor, "0", collector.HeaderLastPosition, string(p0)))
			if err := st.Send(&eventpipev1.FollowResponse{Cursor: 6, Occurrence: seed[5], Position: p2, Partition: 1}); err != nil {
				return err
			}
			close(sent)
			<-st.Context().Done()
			return nil
		},
	}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	eventpipev1.RegisterFollowServer(gs, srv)
	go gs.Serve(lis)
	defer gs.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- runFollow(ctx, []string{"--collector", lis.Addr().String(), "--insecure", "--workspace", "repro"}, nil, &out, &errb)
	}()
	select {
	case <-sent:
	case <-time.After(20 * time.Second):
		t.Fatalf("no resubscription; stderr:\n%s", errb.String())
	}
	waitFor(t, &out, "cursor=6")
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
	}
	close(srv.reqs)
	var reqs []*eventpipev1.FollowRequest
	for r := range srv.reqs {
		reqs = append(reqs, r)
	}
	if len(reqs) != 2 || len(reqs[0].GetAfterPosition()) != 0 || reqs[0].GetTail() != 50 {
		t.Fatalf("first request %v", reqs)
	}
	if r := reqs[1]; !bytes.Equal(r.GetAfterPosition(), p1) || r.GetAfterCursor() != 3 || r.GetTail() != 0 {
		t.Errorf("resume request: after_position %v after_cursor %d tail %d, want %v, 3, 0", r.GetAfterPosition(), r.GetAfterCursor(), r.GetTail(), p1)
	}
	want := "last position AQABAAk (resume with --after-position AQABAAk)"
	if !strings.Contains(errb.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, errb.String())
	}
	// And --after-position sends it back.
	o := followOptions{afterPosition: "AQABAAk", workspace: "repro", addr: "x:1", output: "text"}
	if p := o.validate(); len(p) != 0 {
		t.Fatalf("validate: %v", p)
	}
	f := &follower{opts: o}
	if r := f.request(); !bytes.Equal(r.GetAfterPosition(), p2) || r.GetTail() != 0 {
		t.Errorf("--after-position request: %v", r)
	}
}

// With several --collector addresses (Kafka mode replicas), a stream broken
// by its replica going away resumes on the next replica of the list, from
// the last position, and says so in Kafka mode's words (a position, not a
// cursor).
func TestFollowCommandFailsOverToTheNextCollector(t *testing.T) {
	defer goleak.VerifyNone(t)
	oldMin := followBackoffMin
	followBackoffMin = 20 * time.Millisecond
	defer func() { followBackoffMin = oldMin }()
	seed := seedOccurrences()
	p0, p1, p2 := []byte{1, 0, 1, 0, 7}, []byte{1, 0, 1, 0, 8}, []byte{1, 0, 1, 0, 9}
	serve := func(srv *scriptedFollow) (*grpc.Server, string) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		eventpipev1.RegisterFollowServer(gs, srv)
		go gs.Serve(lis)
		return gs, lis.Addr().String()
	}
	killed := make(chan struct{})
	a := &scriptedFollow{reqs: make(chan *eventpipev1.FollowRequest, 10), calls: []func(eventpipev1.Follow_FollowServer) error{
		func(st eventpipev1.Follow_FollowServer) error {
			st.SendHeader(metadata.Pairs(collector.HeaderLostRecords, "0", collector.HeaderLastCursor, "0", collector.HeaderLastPosition, string(p0)))
			if err := st.Send(&eventpipev1.FollowResponse{Cursor: 3, Occurrence: seed[2], Position: p1, Partition: 4}); err != nil {
				return err
			}
			<-killed
			return status.Error(codes.Unavailable, "replica killed")
		},
	}}
	sent := make(chan struct{})
	b := &scriptedFollow{reqs: make(chan *eventpipev1.FollowRequest, 10), calls: []func(eventpipev1.Follow_FollowServer) error{
		func(st eventpipev1.Follow_FollowServer) error {
			st.SendHeader(metadata.Pairs(collector.HeaderLostRecords, "0", collector.HeaderLastCursor, "0", collector.HeaderLastPosition, string(p0)))
			if err := st.Send(&eventpipev1.FollowResponse{Cursor: 6, Occurrence: seed[5], Position: p2, Partition: 1}); err != nil {
				return err
			}
			close(sent)
			<-st.Context().Done()
			return nil
		},
	}}
	gsA, addrA := serve(a)
	gsB, addrB := serve(b)
	defer gsB.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- runFollow(ctx, []string{"--collector", addrA + "," + addrB, "--insecure", "--workspace", "repro"}, nil, &out, &errb)
	}()
	waitFor(t, &out, "cursor=3")
	// Replica A goes away for good: its port refuses from now on.
	close(killed)
	gsA.Stop()
	select {
	case <-sent:
	case <-time.After(20 * time.Second):
		t.Fatalf("no resubscription on the second collector; stderr:\n%s", errb.String())
	}
	waitFor(t, &out, "cursor=6")
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
	}
	close(b.reqs)
	r, ok := <-b.reqs
	if !ok || !bytes.Equal(r.GetAfterPosition(), p1) || r.GetTail() != 0 {
		t.Fatalf("request on the second collector: %v, want after_position %v", r, p1)
	}
	if !strings.Contains(errb.String(), "will resume from the last position") || strings.Contains(errb.String(), "after cursor") {
		t.Errorf("stderr does not speak of a position:\n%s", errb.String())
	}
}
