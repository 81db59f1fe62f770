//go:build !agentonly

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/eventpipe/eventpipe/api/buildinfo"
	"github.com/eventpipe/eventpipe/deploy/openshell"
)

func init() {
	register("post-render", command{
		summary: "Helm post-renderer for the OpenShell chart: run the driver proxy in the gateway pod",
		run:     runPostRender,
	})
}

const postRenderUsage = `Usage:
  eventpipe post-render --collector HOST:PORT [flags] < manifests.yaml > patched.yaml

A Helm post-renderer for the OpenShell chart: reads the rendered manifests on
stdin and writes them with the gateway pod running the gateway, eventpipe's
driver proxy (metrics and probes on --metrics-port) and
openshell-driver-kubernetes (deploy/openshell/README.md). No Go needed:

  helm upgrade --install openshell <chart> -n openshell -f my-values.yaml \
    --post-renderer eventpipe --post-renderer-args post-render \
    --post-renderer-args --collector=eventpipe-collector.eventpipe.svc:7070

Flags:
`

func runPostRender(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventpipe post-render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o openshell.Options
	o.AddFlags(fs, openshell.ReleaseImage(buildinfo.Version()))
	fs.Usage = func() {
		fmt.Fprint(stderr, postRenderUsage)
		fs.PrintDefaults()
	}
	if exit, ok := parseFlags(fs, "post-render", args, stderr); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "eventpipe post-render: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := o.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "eventpipe post-render: %s\n", line)
		}
		return 2
	}
	in, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe post-render: read stdin: %v\n", err)
		return 1
	}
	out, err := openshell.Render(in, o)
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe post-render: %v\n", err)
		return 1
	}
	if _, err := stdout.Write(out); err != nil {
		fmt.Fprintf(stderr, "eventpipe post-render: write: %v\n", err)
		return 1
	}
	return 0
}
