package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/eventpipe/eventpipe/agent"
	"github.com/eventpipe/eventpipe/api/cliflag"
	"github.com/eventpipe/eventpipe/api/config"
)

func init() {
	register("agent", command{
		summary: "watch Events cluster-wide, attribute them and ship them to the collector",
		run:     runAgent,
	})
}

func runAgent(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventpipe agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		configPath  = fs.String("config", "", "agent config file (YAML); flags below override it")
		kubeconfig  = fs.String("kubeconfig", "", "path to a kubeconfig (default: in-cluster config when in a pod, else $KUBECONFIG or ~/.kube/config)")
		kubeContext = fs.String("context", "", "kubeconfig context to use")
		server      = fs.String("server", "", "Kubernetes API server URL (overrides the kubeconfig's)")
		collector   = fs.String("collector", "", "collector Ingest address host:port (collector.address)")
		cluster     = fs.String("cluster", "", "cluster name stamped on every occurrence (cluster)")
		insecure    = fs.Bool("insecure", false, "plaintext gRPC to the collector (collector.insecure)")
		caFile      = fs.String("ca", "", "CA bundle to verify the collector (collector.ca_file)")
		certFile    = fs.String("cert", "", "client certificate for mTLS (collector.cert_file)")
		keyFile     = fs.String("key", "", "client key for mTLS (collector.key_file)")
		tokenFile   = fs.String("token-file", "", "bearer token file for the collector (collector.token_file)")
		serverName  = fs.String("server-name", "", "TLS server name of the collector (collector.server_name)")
		leaderElect = fs.Bool("leader-elect", true, "campaign for a Lease; only the leader watches (leader_election.enabled)")
		leaseNS     = fs.String("lease-namespace", "", "namespace of the Lease (leader_election.namespace)")
		leaseName   = fs.String("lease-name", "", "name of the Lease (leader_election.name)")
		identity    = fs.String("identity", "", "leader-election identity (default hostname_pid)")
		listen      = fs.String("listen", "", "address for /metrics, /healthz, /readyz (http.listen; default :9464)")
		logLevel    = fs.String("log-level", "info", "debug, info, warn or error")
		checkOnly   = fs.Bool("check-config", false, "validate the configuration and exit")
		offline     = fs.Bool("offline", false, "with --check-config: do not look at the files the config names (mounted secrets) nor at the cluster, so CI can check a chart-rendered config")
		cpuProfile  = fs.String("cpu-profile", "", "write a CPU profile to this file until the agent stops (benchmarks)")
		memProfile  = fs.String("mem-profile", "", "write a heap profile to this file when the agent stops (benchmarks)")
	)
	// The spellings before the CLI had one vocabulary (issue 22): kept so
	// older manifests start, with a warning.
	for _, old := range []string{"insecure", "ca", "cert", "key", "token-file", "server-name"} {
		cliflag.Deprecated(fs, "collector-"+old, old, stderr)
	}
	if exit, ok := parseFlags(fs, "agent", args, stderr); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "eventpipe agent: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *offline && !*checkOnly {
		fmt.Fprintln(stderr, "eventpipe agent: --offline goes with --check-config")
		return 2
	}
	config.SetOffline(*offline)
	cfg := agent.NewDefaultConfig()
	if *configPath != "" {
		var err error
		if cfg, err = agent.LoadConfig(*configPath); err != nil {
			lines := strings.Split(err.Error(), "\n")
			fmt.Fprintf(stderr, "eventpipe agent: %s\n", lines[0])
			for _, line := range lines[1:] {
				fmt.Fprintf(stderr, "  %s\n", line)
			}
			return 2
		}
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "collector":
			// The flag names one collector and replaces the file's list.
			cfg.Collector.Address, cfg.Collector.Addresses = *collector, nil
		case "cluster":
			cfg.Cluster = *cluster
		case "insecure":
			cfg.Collector.Insecure = *insecure
		case "ca":
			cfg.Collector.CAFile = *caFile
		case "cert":
			cfg.Collector.CertFile = *certFile
		case "key":
			cfg.Collector.KeyFile = *keyFile
		case "token-file":
			cfg.Collector.TokenFile = *tokenFile
		case "server-name":
			cfg.Collector.ServerName = *serverName
		case "leader-elect":
			cfg.LeaderElection.Enabled = *leaderElect
		case "lease-namespace":
			cfg.LeaderElection.Namespace = *leaseNS
		case "lease-name":
			cfg.LeaderElection.Name = *leaseName
		case "identity":
			cfg.LeaderElection.Identity = *identity
		case "listen":
			cfg.HTTP.Listen = *listen
		}
	})
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "eventpipe agent: invalid configuration:\n")
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "  %s\n", line)
		}
		return 2
	}
	if *offline {
		fmt.Fprintln(stdout, "configuration ok (offline: files and cluster not checked)")
		return 0
	}
	restCfg, err := kubeConfig(*kubeconfig, *kubeContext, *server)
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe agent: %v\n", err)
		return 2
	}
	if *checkOnly {
		fmt.Fprintln(stdout, "configuration ok")
		return 0
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "eventpipe agent: --log-level: %v\n", err)
		return 2
	}
	logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})).With("component", "agent")
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a, err := agent.New(cfg, restCfg, agent.Options{Logger: logger, Registerer: reg, Gatherer: reg})
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe agent: %v\n", err)
		return 1
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "eventpipe agent: --cpu-profile: %v\n", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "eventpipe agent: --cpu-profile: %v\n", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		defer func() {
			f, err := os.Create(*memProfile)
			if err != nil {
				logger.Error("write heap profile", "err", err)
				return
			}
			defer f.Close()
			if err := pprof.WriteHeapProfile(f); err != nil {
				logger.Error("write heap profile", "err", err)
			}
		}()
	}
	logger.Info("agent starting", "cluster", cfg.Cluster, "collector", cfg.Collector.Address, "collectors", cfg.Collector.Addresses, "leader_election", cfg.LeaderElection.Enabled)
	if err := a.Run(ctx); err != nil {
		logger.Error("agent stopped with an error", "err", err)
		return 1
	}
	logger.Info("agent stopped")
	return 0
}

// kubeConfig loads the client configuration like kubectl: an explicit
// --kubeconfig, else the in-cluster config when running in a pod, else
// $KUBECONFIG / ~/.kube/config.
func kubeConfig(path, context, server string) (*rest.Config, error) {
	if path == "" && os.Getenv("KUBECONFIG") == "" && context == "" {
		if c, err := rest.InClusterConfig(); err == nil {
			if server != "" {
				c.Host = server
			}
			return c, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	if server != "" {
		overrides.ClusterInfo.Server = server
	}
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	return c, nil
}
