package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime"

	"github.com/eventpipe/eventpipe/api/buildinfo"
	"github.com/eventpipe/eventpipe/api/cliflag"
)

func init() {
	register("version", command{
		summary: "print the version, revision and Go version (-o json for scripts)",
		run:     runVersion,
	})
}

// versionInfo is `eventpipe version -o json`: the fields of versionString,
// one key each, so a script needs no parsing of the text form.
type versionInfo struct {
	Version   string `json:"version"`
	Revision  string `json:"revision"`
	GoVersion string `json:"go_version"`
}

func currentVersion() versionInfo {
	return versionInfo{Version: buildinfo.Version(), Revision: buildinfo.Revision(), GoVersion: runtime.Version()}
}

// versionString is what `eventpipe --version` prints:
// "eventpipe <version> (revision <commit>, <go version>)". The version and
// revision are api/buildinfo's, stamped at link time by the release
// build (deploy/image), the same ones the sinks report.
func versionString() string {
	v := currentVersion()
	return fmt.Sprintf("eventpipe %s (revision %s, %s)", v.Version, v.Revision, v.GoVersion)
}

func runVersion(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventpipe version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	output := fs.String("output", "text", "output format: text or json")
	fs.StringVar(output, "o", "text", "shorthand for --output")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: eventpipe version [-o text|json]   (also: eventpipe --version)")
		fs.PrintDefaults()
	}
	if exit, ok := parseFlags(fs, "version", args, stderr); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "eventpipe version: unexpected arguments %q\n", fs.Args())
		return 2
	}
	switch cliflag.Output(*output) {
	case "text":
		fmt.Fprintln(stdout, versionString())
	case "json":
		b, err := json.Marshal(currentVersion())
		if err != nil {
			fmt.Fprintf(stderr, "eventpipe version: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s\n", b)
	default:
		fmt.Fprintf(stderr, "eventpipe version: -o %q: want text or json\n", *output)
		return 2
	}
	return 0
}
