// Command demo is `make run`: the whole eventpipe pipeline on this machine
// (testenv/demo). Kept out of the eventpipe binary, which stays free of the
// test control plane and the scenario player.
//
//	go run ./testenv/cmd/demo                                  # embedded: own control plane, writers, hollow node, seed scenarios
//	go run ./testenv/cmd/demo --kubeconfig ~/.kube/config      # a real cluster, read-only
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/eventpipe/eventpipe/testenv/demo"
	"github.com/eventpipe/eventpipe/testenv/osdriver"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `Usage: demo [flags]   (make run)

Runs the whole pipeline on this machine and shows what its users see.

Without --kubeconfig: starts a control plane of its own on 127.0.0.1 (etcd,
kube-apiserver, kube-scheduler, kube-controller-manager, the Agent Sandbox
controller and one hollow node: a real kubelet with eventpipe's CRI; built
into .bin/ on first use), a collector (durable log, file sink, Follow stream)
and the agent under its least-privilege token, creates the scenarios'
sandboxes as the OpenShell driver creates them (namespace, Sandbox CR,
supervisor pod): the seeds (workload image missing, supervisor image with a
bad tag), an unbound workspace claim (no StorageClass), pods the scheduler
cannot place and a healthy sandbox, and shows each sandbox's live diagnosis
and where the data went. Every Event and condition shown is written by a
Kubernetes component. It never touches any other cluster ($KUBECONFIG is
ignored).

With --kubeconfig FILE: the same collector and agent against that cluster,
read-only (the agent lists and watches; leader election is off), showing the
sandboxes of --gateway. Nothing is played.

Ctrl-C stops everything; no process is left behind.

Exit status: 0 stopped by Ctrl-C, 1 a component failed, 2 bad flags.

Flags:
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg demo.Config
	var scen, mode string
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "run against this cluster (read-only) instead of a control plane of its own")
	fs.StringVar(&cfg.Context, "context", "", "with --kubeconfig: the context to use")
	fs.StringVar(&cfg.Gateway, "gateway", scenario.DefaultGateway, "show the sandboxes of this gateway id")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "keep the log, file sink, tokens and logs here (default: a temporary directory removed on exit)")
	fs.StringVar(&cfg.BinDir, "bin-dir", "", "where the control plane's binaries are (and are built); default $EVENTPIPE_BIN_DIR, else .bin")
	fs.StringVar(&scen, "scenarios", strings.Join(demo.DefaultScenarios, ","), "sandboxes to create, comma-separated: "+strings.Join(osdriver.Names(), ", "))
	fs.StringVar(&mode, "mode", string(scenario.ModeManaged), "workspace mode of the scenarios: managed, shared or operator")
	fs.StringVar(&cfg.CLI, "cli", "eventpipe", "the eventpipe binary the printed commands name (make run passes the one it built)")
	plain := fs.Bool("plain", false, "print a new view on every change instead of redrawing the terminal")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo: unexpected arguments %q\n", fs.Args())
		return 2
	}
	m, err := scenario.ParseMode(mode)
	if err != nil {
		fmt.Fprintf(stderr, "demo: --mode: %v\n", err)
		return 2
	}
	cfg.Mode = m
	if cfg.Kubeconfig == "" && scen != "" {
		cfg.Scenarios = strings.Split(scen, ",")
	}
	if cfg.Kubeconfig != "" && scen != strings.Join(demo.DefaultScenarios, ",") {
		fmt.Fprintln(stderr, "demo: --scenarios creates sandboxes in the control plane of its own; with --kubeconfig nothing is created")
		return 2
	}
	if cfg.Context != "" && cfg.Kubeconfig == "" {
		fmt.Fprintln(stderr, "demo: --context needs --kubeconfig")
		return 2
	}
	cfg.Out = stdout
	cfg.Terminal = !*plain && isTerminal(stdout)
	if err := demo.Run(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 1
	}
	return 0
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
