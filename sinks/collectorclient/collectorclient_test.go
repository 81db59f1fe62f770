package collectorclient

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestErrorsNameWhatTheUserWrote: every refusal names the flag or YAML key
// the caller labelled the option with, and an empty token file is refused
// before anything is sent.
func TestErrorsNameWhatTheUserWrote(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.token")
	notPEM := filepath.Join(dir, "ca.pem")
	for _, f := range []struct{ path, body string }{{empty, " \n"}, {notPEM, "not a certificate"}} {
		if err := os.WriteFile(f.path, []byte(f.body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	names := Names{Address: "collector.address", CA: "collector.ca_file", CertKey: "collector.cert_file/key_file", Token: "collector.token_file"}
	cases := []struct {
		name string
		o    Options
		want string
	}{
		{"empty token", Options{Address: "127.0.0.1:1", Insecure: true, TokenFile: empty}, "collector.token_file " + empty + " is empty"},
		{"missing token", Options{Address: "127.0.0.1:1", Insecure: true, TokenFile: filepath.Join(dir, "none")}, "collector.token_file: open "},
		{"CA not PEM", Options{Address: "127.0.0.1:1", CAFile: notPEM}, "collector.ca_file " + notPEM + ": no PEM certificate"},
		{"missing key pair", Options{Address: "127.0.0.1:1", CertFile: filepath.Join(dir, "c.pem"), KeyFile: filepath.Join(dir, "k.pem")}, "collector.cert_file/key_file: open "},
	}
	for _, c := range cases {
		c.o.Names = names
		conn, err := Dial(c.o)
		if err == nil {
			conn.Close()
			t.Errorf("%s: dialled, want an error", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want it to contain %q", c.name, err, c.want)
		}
	}
	good := filepath.Join(dir, "reader.token")
	if err := os.WriteFile(good, []byte("reader-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conn, err := Dial(Options{Address: "127.0.0.1:1", Insecure: true, TokenFile: good, Names: names})
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	md, err := tokenCreds{name: names.Token, path: good}.GetRequestMetadata(t.Context())
	if err != nil || md["authorization"] != "Bearer reader-token-0123456789" {
		t.Fatalf("metadata %v, %v", md, err)
	}
}
