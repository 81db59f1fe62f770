//go:build !agentonly

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"text/tabwriter"

	"github.com/eventpipe/eventpipe/api/cliconfig"
)

func init() {
	register("config", command{
		summary: "name collectors to follow and diagnose (set-context, use-context, get-contexts), like kubectl's contexts",
		run:     runConfig,
	})
}

const configUsage = `Usage:
  eventpipe config set-context NAME [--collector HOST:PORT] [--ca FILE] [--token-file FILE] [--server-name NAME] [--insecure]
  eventpipe config use-context NAME
  eventpipe config get-contexts
  eventpipe config current-context

Keeps named ways to reach a collector in $XDG_CONFIG_HOME/eventpipe/config.yaml
(else ~/.config/eventpipe/config.yaml; mode 0600), so follow and diagnose need
no connection flags. set-context creates NAME or changes the settings given
(files are stored as absolute paths); the first context set becomes the
current one. For each setting follow and diagnose take, in order: the flag,
the EVENTPIPE_COLLECTOR / EVENTPIPE_CA / EVENTPIPE_TOKEN_FILE /
EVENTPIPE_INSECURE environment variable, the current context (or --context
NAME), the default.

Example:
  eventpipe config set-context kind --collector 127.0.0.1:7070 --ca ca.crt \
      --server-name eventpipe-collector.eventpipe.svc --token-file reader.token
  eventpipe config use-context kind
  eventpipe follow --workspace repro --name img-missing

`

func runConfig(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stderr, configUsage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	path, err := cliconfig.Path(getenv)
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe config: %v\n", err)
		return exitUsage
	}
	file, err := cliconfig.Load(path)
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe config: %v\n", err)
		return exitUsage
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "set-context":
		return configSetContext(file, path, rest, stdout, stderr)
	case "use-context":
		if len(rest) != 1 {
			fmt.Fprintln(stderr, "eventpipe config use-context: want one context name")
			return exitUsage
		}
		if _, ok := file.Contexts[rest[0]]; !ok {
			fmt.Fprintf(stderr, "eventpipe config use-context: no context %q (have %v)\n", rest[0], file.Names())
			return exitUsage
		}
		file.CurrentContext = rest[0]
	case "get-contexts":
		if len(rest) != 0 {
			fmt.Fprintln(stderr, "eventpipe config get-contexts: takes no arguments")
			return exitUsage
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CURRENT\tNAME\tCOLLECTOR\tCA\tTOKEN-FILE\tSERVER-NAME\tINSECURE")
		for _, n := range file.Names() {
			c, cur := file.Contexts[n], ""
			if n == file.CurrentContext {
				cur = "*"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%v\n", cur, n, c.Collector, c.CA, c.TokenFile, c.ServerName, c.Insecure)
		}
		if err := tw.Flush(); err != nil {
			return exitFailed
		}
		return exitOK
	case "current-context":
		if file.CurrentContext == "" {
			fmt.Fprintln(stderr, "eventpipe config: no current context")
			return exitNotFound
		}
		fmt.Fprintln(stdout, file.CurrentContext)
		return exitOK
	default:
		fmt.Fprintf(stderr, "eventpipe config: unknown subcommand %q\nRun 'eventpipe config -h' for its usage.\n", sub)
		return exitUsage
	}
	if err := file.Save(path); err != nil {
		fmt.Fprintf(stderr, "eventpipe config: %v\n", err)
		return exitFailed
	}
	fmt.Fprintf(stdout, "current context: %s (%s)\n", file.CurrentContext, path)
	return exitOK
}

func configSetContext(file *cliconfig.File, path string, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "" || args[0][0] == '-' {
		fmt.Fprintln(stderr, "eventpipe config set-context: want NAME first, then flags")
		return exitUsage
	}
	name := args[0]
	fs := flag.NewFlagSet("eventpipe config set-context", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := file.Contexts[name]
	fs.StringVar(&c.Collector, "collector", c.Collector, "collector gRPC address host:port")
	fs.StringVar(&c.CA, "ca", c.CA, "CA bundle that verifies the collector's certificate")
	fs.StringVar(&c.TokenFile, "token-file", c.TokenFile, "file holding a bearer token with role reader")
	fs.StringVar(&c.ServerName, "server-name", c.ServerName, "TLS server name of the collector")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "plaintext gRPC, no TLS")
	fs.Usage = func() {
		fmt.Fprint(stderr, configUsage)
		fs.PrintDefaults()
	}
	if exit, ok := parseFlags(fs, "config", args[1:], stderr); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "eventpipe config set-context: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	// Files are kept absolute: the context is used from any directory.
	for _, p := range []*string{&c.CA, &c.TokenFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			abs, err := filepath.Abs(*p)
			if err != nil {
				fmt.Fprintf(stderr, "eventpipe config set-context: %v\n", err)
				return exitUsage
			}
			*p = abs
		}
	}
	if c.Insecure && (c.CA != "" || c.ServerName != "") {
		fmt.Fprintln(stderr, "eventpipe config set-context: --insecure (plaintext) cannot be combined with --ca or --server-name")
		return exitUsage
	}
	if file.Contexts == nil {
		file.Contexts = map[string]cliconfig.Context{}
	}
	file.Contexts[name] = c
	if file.CurrentContext == "" {
		file.CurrentContext = name
	}
	if err := file.Save(path); err != nil {
		fmt.Fprintf(stderr, "eventpipe config: %v\n", err)
		return exitFailed
	}
	fmt.Fprintf(stdout, "context %s saved in %s (current: %s)\n", name, path, file.CurrentContext)
	return exitOK
}
