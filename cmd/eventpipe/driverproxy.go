//go:build !agentonly

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/eventpipe/eventpipe/api/cliflag"
	"github.com/eventpipe/eventpipe/api/config"
	"github.com/eventpipe/eventpipe/sinks/gateway"
)

func init() {
	register("driver-proxy", command{
		summary: "run between the OpenShell gateway and its compute driver: pull-failure conditions and platform events",
		run:     runDriverProxy,
	})
}

const driverProxyUsage = `Usage:
  eventpipe driver-proxy [--config FILE] [flags]

Listens on the Unix socket the OpenShell gateway dials
(OPENSHELL_COMPUTE_DRIVER_SOCKET) and forwards every RPC to the real
openshell-driver-kubernetes socket, adding eventpipe's platform events and a
condition while something blocks a sandbox (ImagePulled, PodScheduled,
VolumesReady, PodCreated or ContainersRunning =False). Flags override
the config file. The collector being down never stops driver traffic.

Example (all three containers of the gateway pod run as the same uid):
  eventpipe driver-proxy --listen /var/run/openshell-compute/proxy/proxy.sock \
      --driver /var/run/openshell-compute/driver/driver.sock \
      --gateway openshell --collector collector.eventpipe:7070 \
      --ca /etc/eventpipe/ca.pem --token-file /etc/eventpipe/reader.token

Flags:
`

func runDriverProxy(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventpipe driver-proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "driver-proxy YAML config file")
	check := fs.Bool("check-config", false, "validate the config and flags and the files they name, print every problem, and exit")
	offline := fs.Bool("offline", false, "with --check-config: do not look at the files the config names (mounted secrets), so CI can check a rendered config")
	listen := fs.String("listen", "", "Unix socket the gateway dials (config: listen)")
	driver := fs.String("driver", "", "the real driver's Unix socket (config: driver)")
	gatewayID := fs.String("gateway", "", "this gateway's id, openshell.ai/gateway-id (config: gateway_id)")
	addr := fs.String("collector", "", "collector gRPC address host:port (config: collector.address)")
	tokenFile := fs.String("token-file", "", "bearer token with role reader (config: collector.token_file)")
	caFile := fs.String("ca", "", "CA bundle for the collector's certificate (config: collector.ca_file)")
	certFile := fs.String("cert", "", "client certificate for mTLS (config: collector.cert_file)")
	keyFile := fs.String("key", "", "client key for mTLS (config: collector.key_file)")
	serverName := fs.String("server-name", "", "TLS server name of the collector (config: collector.server_name)")
	insecure := fs.Bool("insecure", false, "plaintext gRPC to the collector (config: collector.insecure)")
	relay := fs.String("relay", "", "ignored, with a warning: the proxy has one relay since 2026-12-04 (kept so older command lines still start)")
	stateFile := fs.String("state-file", "", "where the delivered follow cursor is kept across restarts (config: follow.state_file)")
	metricsAddr := fs.String("metrics-listen", "", "serve /metrics, /healthz and /readyz on this address (empty: off; the gateway pod's probes use them)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	procs := fs.Int("gomaxprocs", 1, "cores (Go Ps) the proxy runs on; 0: Go's default. Unless given, a GOMAXPROCS environment variable wins (see sinks/gateway/README.md, Performance)")
	cpuProfile := fs.String("cpu-profile", "", "write a CPU profile of the whole run to this file (for bench/gateway)")
	fs.Usage = func() {
		fmt.Fprint(stderr, driverProxyUsage)
		fs.PrintDefaults()
	}
	cliflag.Deprecated(fs, "gateway-id", "gateway", stderr)
	if exit, ok := parseFlags(fs, "driver-proxy", args, stderr); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "eventpipe driver-proxy: unexpected arguments %q\n", fs.Args())
		return 2
	}
	logger, ok := newLogger(stderr, "driver-proxy", *logLevel, *logFormat)
	if !ok {
		return 2
	}
	if *offline && !*check {
		fmt.Fprintln(stderr, "eventpipe driver-proxy: --offline goes with --check-config")
		return 2
	}
	config.SetOffline(*offline)

	cfg := gateway.NewDefaultConfig()
	if *configPath != "" {
		var err error
		if cfg, err = gateway.LoadConfig(*configPath); err != nil {
			fmt.Fprintf(stderr, "eventpipe driver-proxy: %v\n", err)
			return 2
		}
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&cfg.Listen, *listen)
	set(&cfg.Driver, *driver)
	set(&cfg.GatewayID, *gatewayID)
	set(&cfg.Collector.Address, *addr)
	set(&cfg.Collector.TokenFile, *tokenFile)
	set(&cfg.Collector.CAFile, *caFile)
	set(&cfg.Collector.CertFile, *certFile)
	set(&cfg.Collector.KeyFile, *keyFile)
	set(&cfg.Collector.ServerName, *serverName)
	set(&cfg.Follow.StateFile, *stateFile)
	set(&cfg.Relay, *relay)
	if *insecure {
		cfg.Collector.Insecure = true
	}
	where := "flags"
	if *configPath != "" {
		where = *configPath + " and flags"
	}
	err := cfg.Validate()
	if *check {
		// The proxy starts with files missing (it fails open); a check
		// says so.
		err = errors.Join(err, cfg.CheckFiles())
	}
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe driver-proxy: invalid config (%s):\n", where)
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "  %s\n", line)
		}
		return 2
	}
	if *check {
		for _, d := range cfg.Deprecations() {
			fmt.Fprintf(stderr, "eventpipe driver-proxy: warning: %s\n", d)
		}
		if *offline {
			fmt.Fprintf(stdout, "config (%s) is valid (offline: the files it names not checked)\n", where)
			return 0
		}
		fmt.Fprintf(stdout, "config (%s) is valid\n", where)
		return 0
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	p, err := gateway.New(cfg, logger, reg)
	if err != nil {
		logger.Error("driver proxy failed to start", "err", err)
		return 1
	}
	if *metricsAddr != "" {
		l, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			logger.Error("metrics listener", "err", err)
			return 1
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("/readyz", proxyReadyz(p.Ready()))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
	}
	procsSet := false
	fs.Visit(func(f *flag.Flag) { procsSet = procsSet || f.Name == "gomaxprocs" })
	if n := proxyProcs(procsSet, *procs, os.Getenv("GOMAXPROCS")); n > 0 {
		runtime.GOMAXPROCS(n)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "eventpipe driver-proxy: --cpu-profile: %v\n", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "eventpipe driver-proxy: --cpu-profile: %v\n", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	if err := p.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		logger.Error("driver proxy failed", "err", err)
		return 1
	}
	return 0
}

// proxyReadyz answers 200 once the proxy's socket listens (the gateway
// can dial it), 503 before. The collector is not part of it: driver
// traffic flows while the collector is down, and an unready proxy would
// only take the gateway's pod out of its Service.
func proxyReadyz(ready <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-ready:
			fmt.Fprintln(w, "ok")
		default:
			http.Error(w, "the proxy's socket is not listening yet", http.StatusServiceUnavailable)
		}
	}
}

// proxyProcs is the GOMAXPROCS the proxy sets (0: leave Go's). One P by
// default: a forwarded call passes through five goroutines, and with more
// Ps each hand-off can wake another thread (futex, epoll, spinning), which
// costs more than the call's own work (bench/gateway.md). A GOMAXPROCS
// environment variable is kept unless --gomaxprocs is given.
func proxyProcs(flagSet bool, flagValue int, env string) int {
	if !flagSet && env != "" {
		return 0
	}
	return max(flagValue, 0)
}
