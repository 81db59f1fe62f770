//go:build !agentonly

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/eventpipe/eventpipe/api/config"
	"github.com/eventpipe/eventpipe/collector"
)

func init() {
	register("collector", command{
		summary: "run the collector: acknowledged ingest, durable log, sinks, follow stream",
		run:     runCollector,
	})
}

func runCollector(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("collector", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "collector YAML config file (default: a local dev setup under ./eventpipe-data, insecure)")
	check := fs.Bool("check-config", false, "validate the config, print every problem, and exit")
	offline := fs.Bool("offline", false, "with --check-config: do not look at the files the config names (mounted secrets), so CI can check a chart-rendered config")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: eventpipe collector [--config FILE] [flags]")
		fs.PrintDefaults()
	}
	if exit, ok := parseFlags(fs, "collector", args, stderr); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "eventpipe collector: unexpected arguments %q\n", fs.Args())
		return 2
	}
	logger, ok := newLogger(stderr, "collector", *logLevel, *logFormat)
	if !ok {
		return 2
	}

	if *offline && !*check {
		fmt.Fprintln(stderr, "eventpipe collector: --offline goes with --check-config")
		return 2
	}
	config.SetOffline(*offline)
	var cfg collector.Config
	if *configPath == "" {
		cfg = collector.DevConfig()
		logger.Warn("no --config: using the built-in development config (data in ./eventpipe-data, file sink ./eventpipe-data/events.jsonl, loopback listeners, INSECURE: no authentication)")
	} else {
		var err error
		if cfg, err = collector.LoadConfig(*configPath); err != nil {
			lines := strings.Split(err.Error(), "\n")
			fmt.Fprintf(stderr, "eventpipe collector: %s\n", lines[0])
			for _, line := range lines[1:] {
				fmt.Fprintf(stderr, "  %s\n", line)
			}
			return 2
		}
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "eventpipe collector: invalid config %s:\n", orDefault(*configPath))
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "  %s\n", line)
		}
		return 2
	}
	if *check {
		if *offline {
			fmt.Fprintf(stdout, "config %s is valid (offline: the files it names not checked)\n", orDefault(*configPath))
			return 0
		}
		fmt.Fprintf(stdout, "config %s is valid\n", orDefault(*configPath))
		return 0
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var opts []collector.Option
	if *configPath != "" {
		opts = append(opts, collector.WithConfigPath(*configPath))
	}
	c, err := collector.New(cfg, logger, reg, opts...)
	if err != nil {
		logger.Error("collector failed to start", "err", err)
		return 1
	}
	if err := c.Run(ctx); err != nil {
		logger.Error("collector failed", "err", err)
		return 1
	}
	return 0
}

func orDefault(path string) string {
	if path == "" {
		return "(built-in development config)"
	}
	return path
}
