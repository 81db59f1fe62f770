// Command dev-cluster starts the test control plane for humans: etcd +
// kube-apiserver with the agent's RBAC and the Agent Sandbox CRDs,
// kube-scheduler, kube-controller-manager (testenv/kube's Writers, without
// the Agent Sandbox controller: the played scenarios write what it would)
// and one hollow node whose CRI runs the eventpipe image's collector
// container as BIN/eventpipe (so the chart installs and runs, and `kubectl
// port-forward` reaches it), with a default StorageClass and hostPath
// volumes for its claim. It optionally plays scenarios into it, prints a
// kubeconfig path and waits for Ctrl-C.
//
//	make dev-cluster ARGS="--scenario img-missing --mode managed"
//	make dev-cluster ARGS="--scenario all --mode all --load 200 --rate 500"
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil))
}

type config struct {
	dir        string
	scenarios  []string
	modes      []scenario.Mode
	workspace  string
	generation scenario.Generation
	load       int
	rate       float64
	workers    int
}

func parse(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("dev-cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	var scen, mode, gen string
	fs.StringVar(&c.dir, "dir", "", "keep the cluster's state here (default: a temporary directory removed on exit)")
	fs.StringVar(&scen, "scenario", "", "scenario(s) to play, comma-separated, or \"all\": "+strings.Join(scenario.Names(), ", "))
	fs.StringVar(&mode, "mode", "managed", "workspace mode(s): managed, operator, shared, comma-separated, or \"all\"")
	fs.StringVar(&c.workspace, "workspace", scenario.DefaultWorkspace, "workspace name")
	fs.StringVar(&gen, "generation", "newer", "OpenShell labelling generation: newer or older")
	fs.IntVar(&c.load, "load", 0, "also start this many sandboxes with the load generator")
	fs.Float64Var(&c.rate, "rate", 0, "load generator: target events per second (0: unlimited)")
	fs.IntVar(&c.workers, "workers", 16, "load generator: client goroutines")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var problems []error
	switch scen {
	case "":
	case "all":
		c.scenarios = scenario.Names()
	default:
		for _, s := range strings.Split(scen, ",") {
			if _, ok := scenario.Named[s]; !ok {
				problems = append(problems, fmt.Errorf("--scenario: unknown %q (known: %s)", s, strings.Join(scenario.Names(), ", ")))
			}
			c.scenarios = append(c.scenarios, s)
		}
	}
	if mode == "all" {
		c.modes = scenario.Modes
	} else {
		for _, m := range strings.Split(mode, ",") {
			pm, err := scenario.ParseMode(m)
			if err != nil {
				problems = append(problems, fmt.Errorf("--mode: %w", err))
			}
			c.modes = append(c.modes, pm)
		}
	}
	switch gen {
	case "newer":
		c.generation = scenario.Newer
	case "older":
		c.generation = scenario.Older
	default:
		problems = append(problems, fmt.Errorf("--generation: want newer or older, got %q", gen))
	}
	if c.workspace == "" {
		problems = append(problems, errors.New("--workspace: must not be empty"))
	}
	if c.load < 0 || c.rate < 0 || c.workers <= 0 {
		problems = append(problems, errors.New("--load and --rate must be >= 0, --workers > 0"))
	}
	return c, errors.Join(problems...)
}

// run returns the exit status. ready, when set, is called once the cluster
// is up and the scenarios are played (tests use it to stop the command).
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready func()) int {
	c, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "dev-cluster:", err)
		return 2
	}
	dir := c.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "eventpipe-dev-cluster-"); err != nil {
			fmt.Fprintln(stderr, "dev-cluster:", err)
			return 1
		}
		defer os.RemoveAll(dir)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	start := time.Now()
	cl, err := kube.StartProcess(ctx, kube.Options{Dir: dir, Logger: logger,
		Writers: kube.Writers{Scheduler: true, ControllerManager: true}})
	if err != nil {
		fmt.Fprintln(stderr, "dev-cluster:", err)
		return 1
	}
	defer func() {
		if err := cl.Stop(); err != nil {
			fmt.Fprintln(stderr, "dev-cluster: stop:", err)
		}
	}()
	fmt.Fprintf(stdout, "control plane ready in %v: kube-apiserver %s, etcd %s, kube-scheduler, kube-controller-manager\n",
		time.Since(start).Round(time.Millisecond), cl.URL(), cl.EtcdURL())
	start = time.Now()
	node, err := startNode(ctx, cl, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "dev-cluster:", err)
		return 1
	}
	fmt.Fprintf(stdout, "node %s Ready in %v: a real kubelet with eventpipe's CRI; containers of %s named %s run as %s\n",
		node.Name(), time.Since(start).Round(time.Millisecond), eventpipeImage, collectorContainer, filepath.Join(cl.BinDir(), "eventpipe"))
	if err := devStorage(ctx, cl, stdout); err != nil {
		fmt.Fprintln(stderr, "dev-cluster:", err)
		return 1
	}
	if err := play(ctx, cl, c, stdout); err != nil {
		fmt.Fprintln(stderr, "dev-cluster:", err)
		return 1
	}
	fmt.Fprintf(stdout, "\nexport KUBECONFIG=%s\n", cl.Kubeconfig())
	fmt.Fprintf(stdout, "contexts: admin (current, system:masters), agent (%s, the agent's RBAC)\n", kube.AgentUser)
	fmt.Fprintln(stdout, "logs and state:", cl.Dir())
	fmt.Fprintln(stdout, "press Ctrl-C to stop")
	if ready != nil {
		ready()
	}
	<-ctx.Done()
	fmt.Fprintln(stdout, "stopping")
	return 0
}

// The chart's collector container: its image (any tag) runs as
// BIN/eventpipe on the hollow node. Its other containers (the agent's
// DaemonSet has no controller here) are not run as processes.
const (
	eventpipeImage     = "ghcr.io/eventpipe/eventpipe:*"
	collectorContainer = "collector"
	// devNode is not the scenarios' node (kind-control-plane): their pods
	// are bound there by name and never run.
	devNode = "dev-node"
)

func startNode(ctx context.Context, cl *kube.Cluster, stdout io.Writer) (*kube.Node, error) {
	bin := filepath.Join(cl.BinDir(), "eventpipe")
	if _, err := os.Stat(bin); err != nil {
		// make dev-cluster builds it first; without it the collector's
		// container fails to start (RunContainerError), visibly.
		fmt.Fprintf(stdout, "note: %s missing (make build): the chart's collector container cannot start\n", bin)
	}
	return cl.AddNode(ctx, kube.NodeConfig{Name: devNode, Runtime: kube.RuntimeConfig{
		Processes: []kube.ProcessRule{{Container: collectorContainer, Image: eventpipeImage, Run: bin}},
	}})
}

// devStorage is the storage a dev cluster has: a default StorageClass
// (no provisioner, bound when the pod is scheduled) and hostPath volumes
// under the cluster's directory, each the chart's default size, so the
// collector's claim binds (one volume per release: claims are kept on
// uninstall).
func devStorage(ctx context.Context, cl *kube.Cluster, stdout io.Writer) error {
	cs, err := kubernetes.NewForConfig(cl.AdminConfig())
	if err != nil {
		return err
	}
	wait := storagev1.VolumeBindingWaitForFirstConsumer
	class := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: storageClass,
			Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: &wait,
	}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("storage class: %w", err)
	}
	for i := 1; i <= volumes; i++ {
		path := filepath.Join(cl.Dir(), "volumes", fmt.Sprintf("pv-%d", i))
		if err := os.MkdirAll(path, 0o755); err != nil {
			return err
		}
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("dev-pv-%d", i)},
			Spec: corev1.PersistentVolumeSpec{
				StorageClassName:              storageClass,
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(volumeSize)},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}},
			},
		}
		if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("volume %s: %w", pv.Name, err)
		}
	}
	fmt.Fprintf(stdout, "storage: default StorageClass %s, %d hostPath volumes of %s under %s\n",
		storageClass, volumes, volumeSize, filepath.Join(cl.Dir(), "volumes"))
	return nil
}

const (
	storageClass = "dev-hostpath"
	volumes      = 3
	volumeSize   = "10Gi" // the chart's collector.persistence.size
)

func play(ctx context.Context, cl *kube.Cluster, c config, stdout io.Writer) error {
	if len(c.scenarios) == 0 && c.load == 0 {
		return nil
	}
	clients, err := scenario.NewClients(cl.AdminConfig())
	if err != nil {
		return err
	}
	for _, name := range c.scenarios {
		for _, mode := range c.modes {
			sc, err := scenario.Build(name, scenario.Params{Mode: mode, Workspace: c.workspace, Generation: c.generation})
			if err != nil {
				return err
			}
			res, err := scenario.Play(ctx, clients, sc)
			if err != nil {
				return err
			}
			sb := sc.Sandboxes[0]
			fmt.Fprintf(stdout, "played %-22s %-8s namespace %-28s sandbox %s (id %s): %d events\n",
				name, mode, sb.Namespace(), sb.CRName(), sb.ID, len(res.Events))
		}
	}
	if c.load > 0 {
		r, err := scenario.Load(ctx, clients, scenario.LoadOptions{Sandboxes: c.load, Rate: c.rate, Workers: c.workers,
			Mode: c.modes[0], Workspace: c.workspace + "-load"})
		fmt.Fprintln(stdout, "load:", r)
		if err != nil {
			return err
		}
	}
	return nil
}
