// Command eventpipe is the one binary of eventpipe. Each subcommand lives in
// its own file and registers itself in init with register.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand. run gets the arguments after the subcommand
// name and returns the process exit status (0 ok, 1 runtime failure, 2 bad
// usage or bad input).
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

func register(name string, c command) { commands[name] = c }

func usage(w io.Writer) {
	fmt.Fprintln(w, "eventpipe carries Kubernetes Events about OpenShell sandboxes to the gateway, Loki and Kafka.")
	fmt.Fprintln(w, "\nUsage:\n  eventpipe <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'eventpipe help <command>' (or 'eventpipe <command> -h') for a command's flags.")
}

// parseFlags parses a command's flags. A full usage is for who asks (-h):
// then fs.Usage prints and ok is false with exit 0. A bad flag prints the
// flag package's one-line error and one line pointing at -h, not the whole
// usage that would scroll the error away (exit 2).
func parseFlags(fs *flag.FlagSet, cmd string, args []string, stderr io.Writer) (exit int, ok bool) {
	full := fs.Usage
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.Usage = full
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return 0, false
	default:
		fmt.Fprintf(stderr, "Run 'eventpipe %s -h' for its usage.\n", cmd)
		return 2, false
	}
}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func realMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || (args[0] == "help" && len(args) == 1) {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" {
		args[0] = "version"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if args[0] == "help" {
		return help(ctx, args[1:], stdout, stderr)
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "eventpipe: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(ctx, args[1:], stdin, stdout, stderr)
}

// help is `eventpipe help CMD`: the usage CMD prints for -h, on stdout (so
// it pages and greps), from the command itself, so the two never differ.
func help(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintf(stderr, "eventpipe help: want one command, got %q\n", args)
		return 2
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "eventpipe help: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(ctx, []string{"-h"}, nil, stdout, stdout)
}
