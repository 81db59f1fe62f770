package main

// The hollow kubelet: the kubelet's own code (k8s.io/kubernetes/pkg/kubelet,
// started through cmd/kubelet/app.RunKubelet) with the dependencies of
// pkg/kubemark's hollow node (a fake cAdvisor, the stub container manager,
// fake mounter and OS), except:
//   - Events: the real broadcaster and recorder of cmd/kubelet (kubemark
//     sets a record.FakeRecorder, which drops them), sending to the
//     apiserver through their own client (QPS 50, burst 100, the kubelet's
//     defaults), so the correlator aggregates and rate-limits as on a node;
//   - probes: the real prober (kubemark sets a fake), so exec probes run
//     through the CRI's ExecSync;
//   - the runtime: eventpipe's CRI (testenv/build/cri) on a unix socket,
//     reached through the kubelet's real CRI client (k8s.io/cri-client), so
//     gRPC codes and error text arrive as from containerd or CRI-O.

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	noopoteltrace "go.opentelemetry.io/otel/trace/noop"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	v1core "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	certutil "k8s.io/client-go/util/cert"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	"k8s.io/kubernetes/pkg/kubelet"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	containertest "k8s.io/kubernetes/pkg/kubelet/container/testing"
	"k8s.io/kubernetes/pkg/kubelet/server"
	kubeletutil "k8s.io/kubernetes/pkg/kubelet/util"
	"k8s.io/kubernetes/pkg/util/oom"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/configmap"
	"k8s.io/kubernetes/pkg/volume/csi"
	"k8s.io/kubernetes/pkg/volume/downwardapi"
	"k8s.io/kubernetes/pkg/volume/emptydir"
	"k8s.io/kubernetes/pkg/volume/hostpath"
	"k8s.io/kubernetes/pkg/volume/local"
	"k8s.io/kubernetes/pkg/volume/projected"
	"k8s.io/kubernetes/pkg/volume/secret"
	"k8s.io/kubernetes/pkg/volume/util/hostutil"
	"k8s.io/kubernetes/pkg/volume/util/subpath"
	"k8s.io/mount-utils"

	"github.com/eventpipe/eventpipe/testenv/build/cri"

	cadvisorapi "github.com/google/cadvisor/lib/model"
)

func init() {
	register("hollow-kubelet", runHollowKubelet)
	// The CRI starts a process container through this part (a new mount
	// namespace needs a fresh process; see cri.InitPart).
	register(cri.InitPart, cri.ContainerInit)
}

// nodeFlags is one hollow node's identity and shape, fixed at start.
type nodeFlags struct {
	name, kubeconfig, dir, runtimeConfig string
	cpu, memory                          string
	pods, port                           int
	labels, taints, extended             string
}

func runHollowKubelet(args []string) int {
	var nf nodeFlags
	fs := flag.NewFlagSet("hollow-kubelet", flag.ContinueOnError)
	fs.StringVar(&nf.name, "name", "", "node name (required)")
	fs.StringVar(&nf.kubeconfig, "kubeconfig", "", "kubeconfig of the apiserver (required)")
	fs.StringVar(&nf.dir, "dir", "", "this node's directory: kubelet root, pod logs, CRI socket (required)")
	fs.StringVar(&nf.runtimeConfig, "runtime-config", "", "JSON behaviour of the CRI (testenv/build/cri.Config; required, read again when it changes)")
	fs.StringVar(&nf.cpu, "cpu", "4", "CPU capacity")
	fs.StringVar(&nf.memory, "memory", "8Gi", "memory capacity")
	fs.IntVar(&nf.pods, "pods", 110, "pod capacity")
	fs.IntVar(&nf.port, "port", 0, "the kubelet's HTTPS port on 127.0.0.1 (logs, port-forward); 0: no server")
	fs.StringVar(&nf.labels, "labels", "", "extra node labels k=v,k2=v2")
	fs.StringVar(&nf.taints, "taints", "", "taints to register with, key=value:Effect,...")
	fs.StringVar(&nf.extended, "extended-resources", "", "device-plugin resources name=quantity,... (nvidia.com/gpu=1)")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if nf.name == "" || nf.kubeconfig == "" || nf.dir == "" || nf.runtimeConfig == "" {
		fmt.Fprintln(os.Stderr, "hollow-kubelet: --name, --kubeconfig, --dir and --runtime-config are required")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := hollowKubelet(ctx, nf); err != nil {
		fmt.Fprintln(os.Stderr, "hollow-kubelet:", err)
		return 1
	}
	return 0
}

func hollowKubelet(ctx context.Context, nf nodeFlags) error {
	dir, err := filepath.Abs(nf.dir)
	if err != nil {
		return err
	}
	cpu, err := resource.ParseQuantity(nf.cpu)
	if err != nil {
		return fmt.Errorf("--cpu: %w", err)
	}
	mem, err := resource.ParseQuantity(nf.memory)
	if err != nil {
		return fmt.Errorf("--memory: %w", err)
	}
	labels, err := parsePairs(nf.labels)
	if err != nil {
		return fmt.Errorf("--labels: %w", err)
	}
	taints, err := parseTaints(nf.taints)
	if err != nil {
		return fmt.Errorf("--taints: %w", err)
	}
	extended := v1.ResourceList{}
	ext, err := parsePairs(nf.extended)
	if err != nil {
		return fmt.Errorf("--extended-resources: %w", err)
	}
	for k, v := range ext {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return fmt.Errorf("--extended-resources %s: %w", k, err)
		}
		extended[v1.ResourceName(k)] = q
	}
	for _, d := range []string{"root", "pod-logs", "static-pods"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}

	// The runtime first: the kubelet's CRI client dials it at start.
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("part", "cri")
	rt, err := cri.New(nf.runtimeConfig, logger)
	if err != nil {
		return err
	}
	socket := filepath.Join(dir, "cri.sock")
	if err := rt.Serve(socket); err != nil {
		return err
	}
	defer rt.Stop()
	endpoint := "unix://" + socket

	restConfig, err := clientcmd.BuildConfigFromFlags("", nf.kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	restConfig.UserAgent = "kubelet/" + nf.name
	restConfig.ContentType = "application/vnd.kubernetes.protobuf"
	restConfig.QPS, restConfig.Burst = 50, 100 // the kubelet's kubeAPIQPS/Burst defaults
	client, err := clientset.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	f, c, err := kubeletConfig(nf.name, dir, endpoint, nf.pods, labels, taints)
	if err != nil {
		return err
	}
	var tlsOptions *server.TLSOptions
	if nf.port > 0 {
		if tlsOptions, err = kubeletServing(dir); err != nil {
			return err
		}
		c.EnableServer, c.Port = true, int32(nf.port)
	}
	hb := *restConfig
	hb.QPS = -1
	hb.Timeout = c.NodeStatusUpdateFrequency.Duration
	heartbeat, err := clientset.NewForConfig(&hb)
	if err != nil {
		return err
	}
	ev := *restConfig
	ev.QPS, ev.Burst = float32(c.EventRecordQPS), int(c.EventBurst)
	eventClient, err := v1core.NewForConfig(&ev)
	if err != nil {
		return err
	}

	runtimeService, err := remote.NewRemoteRuntimeServiceBuilder().WithEndpoint(endpoint).
		WithConnectionTimeout(15 * time.Second).Build(ctx)
	if err != nil {
		return fmt.Errorf("CRI runtime client: %w", err)
	}
	imageService, err := remote.NewRemoteImageServiceBuilder().WithEndpoint(endpoint).
		WithConnectionTimeout(15 * time.Second).Build(ctx)
	if err != nil {
		return fmt.Errorf("CRI image client: %w", err)
	}
	var containerManager cm.ContainerManager = cm.NewStubContainerManager()
	if len(extended) > 0 {
		containerManager = cm.NewStubContainerManagerWithDevicePluginResource(extended)
	}
	deps := &kubelet.Dependencies{
		KubeClient:                client,
		HeartbeatClient:           heartbeat,
		EventClient:               eventClient,
		RemoteRuntimeService:      runtimeService,
		RemoteImageService:        imageService,
		CAdvisorInterface:         &machine{Fake: cadvisortest.Fake{NodeName: nf.name}, cores: int(cpu.Value()), memory: uint64(mem.Value())},
		OSInterface:               &containertest.FakeOS{},
		ContainerManager:          containerManager,
		VolumePlugins:             volumePlugins(),
		OOMAdjuster:               oom.NewFakeOOMAdjuster(),
		Mounter:                   &mount.FakeMounter{},
		Subpather:                 &subpath.FakeSubpath{},
		HostUtil:                  hostutil.NewFakeHostUtil(nil),
		PodStartupLatencyTracker:  kubeletutil.NewPodStartupLatencyTracker(),
		NodeStartupLatencyTracker: kubeletutil.NewNodeStartupLatencyTracker(klog.FromContext(ctx)),
		TracerProvider:            noopoteltrace.NewTracerProvider(),
		TLSOptions:                tlsOptions,
		// Auth stays nil: the server checks no client (see kubeletServing).
		// Recorder and ProbeManager stay nil: RunKubelet then makes the
		// real event recorder (to EventClient) and NewMainKubelet the real
		// prober.
	}
	if err := kubeletapp.RunKubelet(ctx, &options.KubeletServer{KubeletFlags: *f, KubeletConfiguration: *c}, deps); err != nil {
		return fmt.Errorf("run kubelet: %w", err)
	}
	if nf.port > 0 {
		go nodeAddress(ctx, client, nf.name)
	}
	<-ctx.Done()
	return nil
}

// nodeAddress gives the Node its address, 127.0.0.1 (InternalIP), where
// the kubelet's server listens, as a cloud controller manager gives a
// node its addresses. The kubelet refuses a loopback --node-ip ("nodeIP
// can't be loopback address", logged on every status update) and then
// leaves the addresses alone; without --node-ip it would publish the
// host's interface address, where nothing of the test listens.
func nodeAddress(ctx context.Context, client clientset.Interface, name string) {
	patch := []byte(`{"status":{"addresses":[{"type":"InternalIP","address":"127.0.0.1"},{"type":"Hostname","address":"` + name + `"}]}}`)
	for {
		_, err := client.CoreV1().Nodes().PatchStatus(ctx, name, patch)
		if err == nil {
			return
		}
		klog.FromContext(ctx).V(2).Info("node address not set yet", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// kubeletServing is the kubelet server's TLS: a self-signed certificate
// for 127.0.0.1, made at start as the kubelet does without --tls-cert-file
// (the apiserver, started without --kubelet-certificate-authority, does
// not verify it). The server gets no authenticator or authorizer
// (Dependencies.Auth nil: every request is served): test-only, and it
// listens on 127.0.0.1 only, where everything is the test's.
func kubeletServing(dir string) (*server.TLSOptions, error) {
	crt, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		return nil, fmt.Errorf("kubelet serving certificate: %w", err)
	}
	certs := filepath.Join(dir, "serving")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return nil, err
	}
	o := &server.TLSOptions{CertFile: filepath.Join(certs, "kubelet.crt"), KeyFile: filepath.Join(certs, "kubelet.key"), MinVersion: tls.VersionTLS12}
	if err := os.WriteFile(o.CertFile, crt, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(o.KeyFile, key, 0o600); err != nil {
		return nil, err
	}
	return o, nil
}

// kubeletConfig is pkg/kubemark's hollow kubelet configuration (the
// kubelet's defaults with its overrides), kept in dir, serving (when
// hollowKubelet turns it on with a port of the node's own: nodes share
// one host) on 127.0.0.1, its node address, with the debugging handlers
// (container logs, port-forward) on; the cluster DNS a real cluster has (without
// it the kubelet warns MissingClusterDNS on every pod) and the CRI socket.
func kubeletConfig(name, dir, endpoint string, pods int, labels map[string]string, taints []v1.Taint) (*options.KubeletFlags, *kubeletconfig.KubeletConfiguration, error) {
	f := options.NewKubeletFlags()
	f.RootDirectory = filepath.Join(dir, "root")
	f.HostnameOverride = name
	f.MinimumGCAge = metav1.Duration{Duration: time.Minute}
	f.MaxContainerCount = 100
	f.MaxPerPodContainerCount = 2
	f.NodeLabels = labels
	// The apiserver reaches the kubelet at its InternalIP
	// (--kubelet-preferred-address-types): the host's loopback.
	f.NodeIP = "127.0.0.1"

	c, err := options.NewKubeletConfiguration()
	if err != nil {
		return nil, nil, err
	}
	c.ContainerRuntimeEndpoint = endpoint
	c.ImageServiceEndpoint = endpoint
	c.StaticPodURL = ""
	c.EnableServer = false
	c.Address = "127.0.0.1"
	c.ReadOnlyPort = 0
	c.StaticPodPath = filepath.Join(dir, "static-pods")
	c.PodLogsDir = filepath.Join(dir, "pod-logs")
	c.FileCheckFrequency.Duration = 20 * time.Second
	c.HTTPCheckFrequency.Duration = 20 * time.Second
	c.NodeStatusUpdateFrequency.Duration = 10 * time.Second
	c.NodeStatusReportFrequency.Duration = 5 * time.Minute
	c.SyncFrequency.Duration = 10 * time.Second
	c.EvictionPressureTransitionPeriod.Duration = 5 * time.Minute
	c.MaxPods = int32(pods)
	c.PodsPerCore = 0
	c.ClusterDNS = []string{"10.96.0.10"}
	c.ClusterDomain = "cluster.local"
	c.ImageGCHighThresholdPercent = 90
	c.ImageGCLowThresholdPercent = 80
	c.ProviderID = "eventpipe-testenv://" + name
	c.VolumeStatsAggPeriod.Duration = time.Minute
	c.CgroupRoot = ""
	c.CPUCFSQuota = true
	c.EnableControllerAttachDetach = false
	c.EnableDebuggingHandlers = true
	c.CgroupsPerQOS = false
	c.HairpinMode = kubeletconfig.HairpinVeth
	c.MaxOpenFiles = 1024
	c.RegistryBurst = 10
	c.RegistryPullQPS = 5.0
	c.ResolverConfig = ""
	c.KubeletCgroups = "/kubelet"
	c.SerializeImagePulls = true
	c.SystemCgroups = ""
	c.ProtectKernelDefaults = false
	c.RegisterWithTaints = taints
	c.RegisterNode = true
	c.LocalStorageCapacityIsolation = true
	return f, c, nil
}

// volumePlugins are the in-tree plugins a pod of the tests can name; the
// secret, configMap and projected plugins fetch from the apiserver, so a
// missing Secret fails in the kubelet's own volume manager (FailedMount).
func volumePlugins() []volume.VolumePlugin {
	var all []volume.VolumePlugin
	all = append(all, emptydir.ProbeVolumePlugins()...)
	all = append(all, hostpath.FakeProbeVolumePlugins(volume.VolumeConfig{})...)
	all = append(all, secret.ProbeVolumePlugins()...)
	all = append(all, downwardapi.ProbeVolumePlugins()...)
	all = append(all, configmap.ProbeVolumePlugins()...)
	all = append(all, projected.ProbeVolumePlugins()...)
	all = append(all, local.ProbeVolumePlugins()...)
	all = append(all, csi.ProbeVolumePlugins()...)
	return all
}

// machine is the fake cAdvisor with this node's CPU and memory.
type machine struct {
	cadvisortest.Fake
	cores  int
	memory uint64
}

// MachineInfo reports the node's capacity.
func (m *machine) MachineInfo(logger klog.Logger) (*cadvisorapi.MachineInfo, error) {
	mi, err := m.Fake.MachineInfo(logger)
	if err != nil {
		return nil, err
	}
	mi.NumCores, mi.MemoryCapacity = m.cores, m.memory
	return mi, nil
}

func parsePairs(s string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", kv)
		}
		out[k] = v
	}
	return out, nil
}

func parseTaints(s string) ([]v1.Taint, error) {
	if s == "" {
		return nil, nil
	}
	var out []v1.Taint
	for _, t := range strings.Split(s, ",") {
		kv, effect, ok := strings.Cut(t, ":")
		if !ok {
			return nil, fmt.Errorf("%q is not key[=value]:Effect", t)
		}
		k, v, _ := strings.Cut(kv, "=")
		switch e := v1.TaintEffect(effect); e {
		case v1.TaintEffectNoSchedule, v1.TaintEffectPreferNoSchedule, v1.TaintEffectNoExecute:
			out = append(out, v1.Taint{Key: k, Value: v, Effect: e})
		default:
			return nil, errors.New("unknown taint effect " + effect)
		}
	}
	return out, nil
}
