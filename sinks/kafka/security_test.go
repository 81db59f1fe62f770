package kafka

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
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

func pushSome(t *testing.T, s *Sink, prefix string, n int) error {
	t.Helper()
	g := sinktest.NewGenerator(21, prefix)
	batch := make([]sinks.Record, n)
	for i := range batch {
		batch[i] = sinks.Record{Offset: uint64(i + 1), Occurrence: g.Next()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return s.Push(ctx, batch)
}

func TestSASL(t *testing.T) {
	b := startBroker(t,
		kfake.EnableSASL(),
		kfake.Superuser(MechanismPlain, "alice", "plain-secret"),
		kfake.Superuser(MechanismSCRAMSHA256, "bob", "scram256-secret"),
		kfake.Superuser(MechanismSCRAMSHA512, "carol", "scram512-secret"),
	)
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("scram512-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mech, user, pass, file string
	}{
		{MechanismPlain, "alice", "plain-secret", ""},
		{MechanismSCRAMSHA256, "bob", "scram256-secret", ""},
		{MechanismSCRAMSHA512, "carol", "", pwFile},
	} {
		t.Run(tc.mech, func(t *testing.T) {
			cfg := testConfig(b.addr(), "sasl-"+strings.ToLower(tc.mech))
			cfg.Conn.SASL = SASLConfig{Mechanism: tc.mech, Username: tc.user, Password: tc.pass, PasswordFile: tc.file}
			s, err := New(cfg, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := pushSome(t, s, tc.mech+"-", 20); err != nil {
				t.Fatalf("push with %s: %v", tc.mech, err)
			}
			mech, err := cfg.Conn.SASL.mechanism()
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			msgs, err := readTopic(ctx, []kgo.Opt{kgo.SASL(mech)}, b.addr(), cfg.Topic)
			if err != nil || len(msgs) != 20 {
				t.Fatalf("read back %d records: %v", len(msgs), err)
			}

			// A wrong password is retryable (the data waits in the log until
			// an operator fixes it), never a silent drop.
			bad := cfg
			bad.Conn.SASL.Password, bad.Conn.SASL.PasswordFile = "wrong", ""
			sb, err := New(bad, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			err = pushSome(t, sb, "bad-", 1)
			if err == nil || sinks.IsPermanent(err) {
				t.Fatalf("push with a wrong password = %v, want a retryable error", err)
			}
		})
	}
}

// testPKI writes a CA and a server certificate for 127.0.0.1 into dir.
func testPKI(t *testing.T, dir string) (caFile string, server tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "eventpipe test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kfake"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return caFile, tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}
}

func TestTLSWithCustomCA(t *testing.T) {
	caFile, cert := testPKI(t, t.TempDir())
	b := startBroker(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))

	cfg := testConfig(b.addr(), "tls")
	cfg.Conn.TLS = TLSConfig{Enabled: true, CAFile: caFile}
	s, err := New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := pushSome(t, s, "tls-", 10); err != nil {
		t.Fatalf("push over TLS with the custom CA: %v", err)
	}

	// Without the CA the broker's certificate is refused: the CA file is
	// really what makes it work.
	noCA := cfg
	noCA.Conn.TLS.CAFile = ""
	s2, err := New(noCA, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	err = pushSome(t, s2, "tls-noca-", 1)
	if err == nil {
		t.Fatal("push without the CA succeeded: the broker certificate was not verified")
	}
	if sinks.IsPermanent(err) {
		t.Error("a TLS failure must stay retryable")
	}
}
