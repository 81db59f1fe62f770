package check

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// renderNotes renders the chart's NOTES.txt with the given --set values.
// `helm template` never renders NOTES, and `helm install --dry-run` needs
// a cluster: so a copy of the chart gets NOTES.txt as a named template and a
// YAML document that includes it.
func renderNotes(t *testing.T, values []string, set ...string) string {
	t.Helper()
	chart := filepath.Join(t.TempDir(), "eventpipe")
	if err := os.CopyFS(chart, os.DirFS(ChartDir(root))); err != nil {
		t.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(chart, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	tpl := "{{- define \"eventpipe.test.notes\" -}}\n" + string(notes) + "{{- end -}}\n"
	if err := os.WriteFile(filepath.Join(chart, "templates", "_test_notes.tpl"), []byte(tpl), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := "notes: |\n{{ include \"eventpipe.test.notes\" . | indent 2 }}\n"
	if err := os.WriteFile(filepath.Join(chart, "templates", "test-notes.yaml"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"template", "ep", chart, "-n", "eventpipe", "--show-only", "templates/test-notes.yaml"}
	for _, v := range values {
		args = append(args, "-f", v)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := Helm(ctxT(t, 2*time.Minute), root, args...)
	if err != nil {
		t.Fatal(err)
	}
	var d struct{ Notes string }
	if err := yaml.Unmarshal(bytes.TrimPrefix(bytes.TrimSpace(out), []byte("---")), &d); err != nil {
		t.Fatalf("rendered notes: %v\n%s", err, out)
	}
	return d.Notes
}

// notesCommand finds the eventpipe command lines NOTES prints.
var notesCommand = regexp.MustCompile("(?:^|: |`)(eventpipe (?:follow|diagnose|config) [^`]*)")

// TestNotesCommandsParse: every eventpipe command NOTES.txt prints, for TLS
// on and off, with and without readers and a collector, is run through the
// real binary's flag parser as printed (in a directory holding the
// reader.token and ca.crt the earlier steps write): no flag error, no usage
// error (exit 2). With TLS it carries --ca and --server-name, without it
// --insecure; without readers it says how to make one.
func TestNotesCommandsParse(t *testing.T) {
	valuesDir := filepath.Join(root, "deploy", "check", "testdata", "values")
	for _, tc := range []struct {
		name   string
		values []string
		set    []string
		wants  []string
	}{
		{"defaults: TLS by cert-manager, no readers", nil, []string{"cluster=dev"},
			[]string{"--ca ca.crt", "--server-name ep-eventpipe-collector.eventpipe.svc", "port-forward svc/ep-eventpipe-collector 7070:7070",
				"--set 'auth.readers[0].name=me'", "secret ep-eventpipe-collector-tls"}},
		{"TLS off", []string{filepath.Join(valuesDir, "minimal.yaml")}, nil,
			[]string{"--insecure --token-file reader.token", "port-forward"}},
		{"readers and a TLS Secret of one's own", nil, []string{"cluster=dev", "auth.readers[0].name=team-a", "auth.readers[0].workspaces={a}",
			"tls.certManager.enabled=false", "tls.existingSecret=my-ca"},
			[]string{"reader-team-a\\.token", "secret my-ca -o jsonpath='{.data.ca\\.crt}'", "--ca ca.crt"}},
		{"no collector", []string{filepath.Join(valuesDir, "agent-only.yaml")}, nil, []string{"--collector COLLECTOR_HOST:PORT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notes := renderNotes(t, tc.values, tc.set...)
			for _, w := range tc.wants {
				if !strings.Contains(notes, w) {
					t.Errorf("NOTES lack %q:\n%s", w, notes)
				}
			}
			dir := t.TempDir()
			caFile, _, err := selfSignedCert(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(caFile, filepath.Join(dir, "ca.crt")); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "reader.token"), []byte("a-reader-token\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, line := range strings.Split(notes, "\n") {
				m := notesCommand.FindStringSubmatch(strings.TrimSpace(line))
				if m == nil {
					continue
				}
				n++
				args := strings.Fields(m[1])[1:]
				if args[0] == "follow" {
					args = append(args, "--no-follow") // exit after the replay, not retry
				}
				if args[0] == "diagnose" {
					args = append(args, "--timeout", "10s")
				}
				code, out := runCLIIn(t, dir, args...)
				if code == 2 || strings.Contains(out, "flag provided but not defined") || strings.Contains(out, "for its usage") {
					t.Errorf("printed command %q does not parse (exit %d):\n%s", m[1], code, out)
				}
			}
			if n == 0 {
				t.Fatalf("no eventpipe command found in NOTES:\n%s", notes)
			}
		})
	}
}

// runCLIIn runs the binary in dir ("": here), with its context file under
// dir, and returns its exit status and output.
func runCLIIn(t *testing.T, dir string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.CommandContext(ctxT(t, 2*time.Minute), eventpipeBinary(t), args...)
	if dir != "" {
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), out.String()
	}
	t.Fatalf("run eventpipe %q: %v", args, err)
	return 0, ""
}
