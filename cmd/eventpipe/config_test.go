//go:build !agentonly

package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// deadAddr is a loopback address nothing listens on: one bound and closed.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// withEnv points getenv at env for the test.
func withEnv(t *testing.T, env map[string]string) {
	t.Helper()
	old := getenv
	getenv = func(k string) string { return env[k] }
	t.Cleanup(func() { getenv = old })
}

// TestConfigContextsDriveFollow: a context set and used with eventpipe
// config is what follow dials with no connection flags; EVENTPIPE_* beats
// the context and a flag beats both (against a real collector).
func TestConfigContextsDriveFollow(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := startFollowCollector(t, t.TempDir(), "127.0.0.1:0")
	defer f.stop(t)
	f.ingest(t, 1, "4471", seedOccurrences()...)
	dead := deadAddr(t)

	xdg := t.TempDir()
	env := map[string]string{"XDG_CONFIG_HOME": xdg}
	withEnv(t, env)
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := realMain(args, nil, &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, _, errs := run("config", "set-context", "local", "--collector", f.addr, "--insecure", "--token-file", f.token("repro")); code != 0 {
		t.Fatalf("set-context: exit %d: %s", code, errs)
	}
	if code, _, errs := run("config", "set-context", "broken", "--collector", dead, "--insecure"); code != 0 {
		t.Fatalf("set-context: exit %d: %s", code, errs)
	}
	path := filepath.Join(xdg, "eventpipe", "config.yaml")
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("context file %s: %v %v, want mode 0600", path, st, err)
	}
	if code, out, _ := run("config", "get-contexts"); code != 0 || !strings.Contains(out, "*        local") || !strings.Contains(out, dead) {
		t.Errorf("get-contexts (exit %d), want local current and broken listed:\n%s", code, out)
	}
	if code, _, errs := run("config", "use-context", "nope"); code != exitUsage || !strings.Contains(errs, `no context "nope"`) {
		t.Errorf("use-context nope: exit %d: %s", code, errs)
	}

	follow := []string{"follow", "--sandbox", fSandboxID, "--tail", "1", "--no-follow"}
	for _, tc := range []struct {
		name string
		use  string
		env  map[string]string
		args []string
		code int
	}{
		{"the current context", "local", nil, nil, exitOK},
		{"another current context", "broken", nil, nil, exitUnreachable},
		{"--context over the current one", "broken", nil, []string{"--context", "local"}, exitOK},
		{"EVENTPIPE_COLLECTOR over the context", "local", map[string]string{"EVENTPIPE_COLLECTOR": dead}, nil, exitUnreachable},
		{"a flag over EVENTPIPE_COLLECTOR", "local", map[string]string{"EVENTPIPE_COLLECTOR": dead}, []string{"--collector", f.addr}, exitOK},
		{"EVENTPIPE_TOKEN_FILE over the context", "local", map[string]string{"EVENTPIPE_TOKEN_FILE": f.token("wrong")}, nil, exitRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, _, errs := run("config", "use-context", tc.use); code != 0 {
				t.Fatalf("use-context: exit %d: %s", code, errs)
			}
			for k, v := range tc.env {
				env[k] = v
			}
			defer func() {
				for k := range tc.env {
					delete(env, k)
				}
			}()
			var out, errb bytes.Buffer
			code := realMain(append(append([]string{}, follow...), tc.args...), nil, &out, &errb)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, errb.String())
			}
			if tc.code == exitOK && out.String() != lines(wantLine6) {
				t.Errorf("stdout %q, want %q", out.String(), lines(wantLine6))
			}
		})
	}
}
