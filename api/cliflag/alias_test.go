package cliflag

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

func TestDeprecated(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		ca       string
		insecure bool
		set      []string // flags fs.Visit reports (the alias too, when used)
		warns    int
	}{
		{"new spelling, no warning", []string{"--ca", "a.pem"}, "a.pem", false, []string{"ca"}, 0},
		{"old spelling sets the new flag", []string{"--collector-ca", "b.pem"}, "b.pem", false, []string{"ca", "collector-ca"}, 1},
		{"old boolean without a value", []string{"--collector-insecure"}, "", true, []string{"collector-insecure", "insecure"}, 1},
		{"old boolean with =false", []string{"--collector-insecure=false"}, "", false, []string{"collector-insecure", "insecure"}, 1},
		{"last one wins", []string{"--collector-ca", "b.pem", "--ca", "c.pem"}, "c.pem", false, []string{"ca", "collector-ca"}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var warn bytes.Buffer
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(&warn)
			ca := fs.String("ca", "", "")
			insecure := fs.Bool("insecure", false, "")
			Deprecated(fs, "collector-ca", "ca", &warn)
			Deprecated(fs, "collector-insecure", "insecure", &warn)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if *ca != tc.ca || *insecure != tc.insecure {
				t.Errorf("ca=%q insecure=%v, want %q %v", *ca, *insecure, tc.ca, tc.insecure)
			}
			var set []string
			fs.Visit(func(f *flag.Flag) { set = append(set, f.Name) })
			if strings.Join(set, ",") != strings.Join(tc.set, ",") {
				t.Errorf("set flags %v, want %v", set, tc.set)
			}
			if n := strings.Count(warn.String(), "is deprecated, use --"); n != tc.warns {
				t.Errorf("%d warnings, want %d: %q", n, tc.warns, warn.String())
			}
		})
	}
}

func TestOutput(t *testing.T) {
	for in, want := range map[string]string{"table": "text", "text": "text", "json": "json", "yaml": "yaml"} {
		if got := Output(in); got != want {
			t.Errorf("Output(%q) = %q, want %q", in, got, want)
		}
	}
}
