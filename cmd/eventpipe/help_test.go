//go:build !agentonly

package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestHelpCommand: `eventpipe help CMD` prints CMD's own usage on stdout
// (exit 0), not the global command list.
func TestHelpCommand(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		want string // a flag only this command has
	}{
		{"agent", "-token-file"},
		{"collector", "Usage: eventpipe collector"},
		{"config", "eventpipe config set-context NAME"},
		{"diagnose", "-supervisor"},
		{"driver-proxy", "-gomaxprocs"},
		{"enrich", "-persistent-window"},
		{"follow", "-after"},
		{"version", "Usage: eventpipe version"},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := realMain([]string{"help", tc.cmd}, nil, &out, &errOut); code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errOut.String())
			}
			if got := out.String(); !strings.Contains(got, tc.want) || strings.Contains(got, "Commands:") {
				t.Errorf("stdout has not the usage of %s (want %q):\n%s", tc.cmd, tc.want, got)
			}
		})
	}
	for _, args := range [][]string{{"help", "nope"}, {"help", "agent", "collector"}} {
		var out, errOut bytes.Buffer
		if code := realMain(args, nil, &out, &errOut); code != 2 || errOut.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 and an error", args, code, errOut.String())
		}
	}
}

// TestFlagErrorShortUsage: a bad flag prints the error and one line
// pointing at -h (exit 2), not the whole usage that scrolls it away.
func TestFlagErrorShortUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"agent", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"collector", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"driver-proxy", "--gomaxprocs=many"}, `invalid value "many" for flag -gomaxprocs: parse error`},
		{[]string{"enrich", "--persistent-after"}, "flag needs an argument: -persistent-after"},
		{[]string{"version", "-x"}, "flag provided but not defined: -x"},
		{[]string{"diagnose", "sup-bad", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"follow", "--tail", "x"}, `invalid value "x" for flag -tail: parse error`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := realMain(tc.args, strings.NewReader(""), &out, &errOut); code != 2 {
				t.Fatalf("exit %d, want 2; stderr %q", code, errOut.String())
			}
			want := tc.want + "\nRun 'eventpipe " + tc.args[0] + " -h' for its usage.\n"
			if errOut.String() != want || out.Len() != 0 {
				t.Errorf("stderr %q (stdout %q), want exactly %q", errOut.String(), out.String(), want)
			}
		})
	}
	// -h still prints the full usage, exit 0.
	var out, errOut bytes.Buffer
	if code := realMain([]string{"agent", "-h"}, nil, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "-token-file") {
		t.Errorf("agent -h: exit %d, stderr %q", code, errOut.String())
	}
}

// TestDeprecatedSpellings: the spellings from before one CLI vocabulary
// still work, set the flag of the new name, and warn once.
func TestDeprecatedSpellings(t *testing.T) {
	for _, tc := range []struct {
		args []string
		warn string
	}{
		{[]string{"agent", "--collector-insecure", "--collector-token-file", "t", "--no-such-flag"}, "--collector-token-file is deprecated, use --token-file"},
		{[]string{"agent", "--collector-ca", "ca.pem", "--no-such-flag"}, "--collector-ca is deprecated, use --ca"},
		{[]string{"driver-proxy", "--gateway-id", "g", "--no-such-flag"}, "--gateway-id is deprecated, use --gateway"},
	} {
		var out, errOut bytes.Buffer
		realMain(tc.args, nil, &out, &errOut)
		if !strings.Contains(errOut.String(), tc.warn) {
			t.Errorf("%q: stderr %q, want %q", tc.args, errOut.String(), tc.warn)
		}
	}
}
