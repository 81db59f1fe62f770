package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		var out, errOut bytes.Buffer
		if code := realMain([]string{arg}, nil, &out, &errOut); code != 0 {
			t.Fatalf("%s: exit %d, stderr %q", arg, code, errOut.String())
		}
		// A test binary has no stamped version: the fallbacks show.
		if got := out.String(); !strings.HasPrefix(got, "eventpipe dev (revision ") || !strings.Contains(got, "go1.") {
			t.Errorf("%s printed %q", arg, got)
		}
	}
}
