package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		wantCode   int
		wantJSON   bool
		wantStderr string
	}{
		{args: []string{"--version"}},
		{args: []string{"version"}},
		{args: []string{"version", "-o", "text"}},
		{args: []string{"version", "-o", "json"}, wantJSON: true},
		{args: []string{"version", "--output=json"}, wantJSON: true},
		{args: []string{"version", "-o", "yaml"}, wantCode: 2, wantStderr: `-o "yaml": want text or json`},
		{args: []string{"version", "extra"}, wantCode: 2, wantStderr: "unexpected arguments"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := realMain(tc.args, nil, &out, &errOut)
			if code != tc.wantCode || !strings.Contains(errOut.String(), tc.wantStderr) {
				t.Fatalf("exit %d, stderr %q; want exit %d, stderr with %q", code, errOut.String(), tc.wantCode, tc.wantStderr)
			}
			switch {
			case tc.wantCode != 0:
				if out.Len() != 0 {
					t.Errorf("stdout %q on a usage error", out.String())
				}
			case tc.wantJSON:
				// A test binary has no stamped version: the fallbacks show.
				var v map[string]string
				if err := json.Unmarshal(out.Bytes(), &v); err != nil {
					t.Fatalf("not JSON: %v: %q", err, out.String())
				}
				if v["version"] != "dev" || v["revision"] == "" || !strings.HasPrefix(v["go_version"], "go1.") || len(v) != 3 {
					t.Errorf("printed %q", out.String())
				}
			default:
				if got := out.String(); !strings.HasPrefix(got, "eventpipe dev (revision ") || !strings.Contains(got, "go1.") {
					t.Errorf("printed %q", got)
				}
			}
		})
	}
}
