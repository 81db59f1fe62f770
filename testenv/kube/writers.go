package kube

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Writers selects the Kubernetes components started beside kube-apiserver
// that write the Events and statuses eventpipe reads. The zero value starts
// none (the control plane alone, as most tests want: each writer costs
// memory and CPU on a 2-core machine).
type Writers struct {
	// Scheduler runs kube-scheduler: it binds pods to nodes and writes
	// Scheduled and FailedScheduling Events and the pods' PodScheduled
	// condition.
	Scheduler bool
	// ControllerManager runs kube-controller-manager with the controllers
	// ControllerManagerControllers lists (node lifecycle, volume binding,
	// namespaces, quota, garbage collection, service accounts and their
	// tokens). With
	// it, kube-apiserver's ServiceAccount admission is on, as in a real
	// cluster: a pod is refused until its namespace's default service
	// account exists.
	ControllerManager bool
	// AgentSandbox runs the Agent Sandbox controller, and the CRDs
	// installed are the ones of its module version (Sandbox, and the
	// extensions' SandboxClaim, SandboxTemplate, SandboxWarmPool) instead
	// of testenv/crds: it creates each Sandbox's pod, claims and service
	// and writes the Sandbox's conditions.
	AgentSandbox bool
}

// AllWriters starts every writer.
var AllWriters = Writers{Scheduler: true, ControllerManager: true, AgentSandbox: true}

func (w Writers) any() bool { return w.Scheduler || w.ControllerManager || w.AgentSandbox }

// WithWriters starts the given writers once the apiserver is ready.
func WithWriters(w Writers) Option { return func(o *Options) { o.Writers = w } }

// ControllerManagerControllers are the kube-controller-manager controllers
// a Writers.ControllerManager cluster runs. The node lifecycle controller
// is among them because the apiserver gives every new Node the not-ready
// taint and only that controller lifts it once the kubelet reports Ready:
// without it the scheduler places no pod on a hollow node.
var ControllerManagerControllers = []string{
	"node-lifecycle-controller",
	"persistentvolume-binder-controller",
	"persistentvolumeclaim-protection-controller",
	"persistentvolume-protection-controller",
	"namespace-controller",
	"resourcequota-controller",
	"garbage-collector-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"root-ca-certificate-publisher-controller",
	// The chart's collector on make dev-cluster is a StatefulSet.
	"statefulset-controller",
}

// Binary and part names (see testenv/build/build.sh): kube-scheduler and
// kube-controller-manager are parts of the multi-call binary kubeparts.
const (
	kubepartsBin         = "kubeparts"
	schedulerBin         = "kube-scheduler"
	controllerManagerBin = "kube-controller-manager"
	agentSandboxBin      = "agent-sandbox-controller"
	// AgentSandboxCRDDir is the directory, in the bin directory, holding
	// the CRDs of the Agent Sandbox module the controller was built from.
	AgentSandboxCRDDir = "agent-sandbox-crds"
)

// neededBinaries lists the executables (relative to the bin directory) the
// options need.
func (o Options) neededBinaries() []string {
	names := []string{"etcd", "kube-apiserver"}
	if o.Writers.Scheduler || o.Writers.ControllerManager {
		names = append(names, kubepartsBin)
	}
	if o.Writers.AgentSandbox {
		names = append(names, agentSandboxBin)
	}
	return names
}

// startWriters starts the selected writers and waits until each answers
// its health check.
func (c *Cluster) startWriters(ctx context.Context) error {
	w := c.opts.Writers
	if !w.any() {
		return nil
	}
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	kubeconfig := c.kubeconfigPath
	insecure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// The components' serving certificates are self-signed at start;
		// only their health endpoints on loopback are read.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback health check of a child process
	}}
	defer insecure.CloseIdleConnections()
	type writer struct {
		name, bin string
		args      []string
		env       []string
		health    string
		client    *http.Client
	}
	var ws []writer
	if w.Scheduler {
		port := strconv.Itoa(ports[0])
		ws = append(ws, writer{name: schedulerBin, bin: filepath.Join(c.binDir, kubepartsBin),
			args: c.componentArgs(schedulerBin, port), health: "https://127.0.0.1:" + port + "/healthz", client: insecure})
	}
	if w.ControllerManager {
		port := strconv.Itoa(ports[1])
		ws = append(ws, writer{name: controllerManagerBin, bin: filepath.Join(c.binDir, kubepartsBin), args: append(c.componentArgs(controllerManagerBin, port),
			"--controllers="+strings.Join(ControllerManagerControllers, ","),
			"--service-account-private-key-file="+c.saKeyPath(),
			"--root-ca-file="+c.caPath(),
			"--use-service-account-credentials=false",
			// A claim with no class and no volume is retried on this
			// period; the default (15 s) would make tests wait.
			"--pvclaimbinder-sync-period=2s",
		), health: "https://127.0.0.1:" + port + "/healthz", client: insecure})
	}
	if w.AgentSandbox {
		port := strconv.Itoa(ports[2])
		ws = append(ws, writer{name: agentSandboxBin, bin: filepath.Join(c.binDir, agentSandboxBin), args: []string{
			"--leader-elect=false",
			"--metrics-bind-address=0",
			"--health-probe-bind-address=127.0.0.1:" + port,
		}, env: []string{"KUBECONFIG=" + kubeconfig}, health: "http://127.0.0.1:" + port + "/readyz", client: c.etcdClient})
	}
	for _, wr := range ws {
		p, err := startProcessEnv(wr.name, wr.bin, wr.args, wr.env, c.dir, c.writerLogPath(wr.name))
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.writers = append(c.writers, p)
		c.mu.Unlock()
	}
	for _, wr := range ws {
		c.mu.Lock()
		p := c.writerByName(wr.name)
		c.mu.Unlock()
		if err := c.waitHTTP(ctx, p, wr.client, wr.health, ""); err != nil {
			return fmt.Errorf("wait for %s: %w\n%s", wr.name, err, c.logTail(c.writerLogPath(wr.name), 4000))
		}
	}
	if w.ControllerManager {
		// Ready for pods: ServiceAccount admission refuses a pod until its
		// namespace's default service account exists.
		if err := c.WaitServiceAccount(ctx, metav1.NamespaceDefault); err != nil {
			return fmt.Errorf("wait for kube-controller-manager: %w\n%s", err, c.logTail(c.writerLogPath(controllerManagerBin), 4000))
		}
	}
	return nil
}

// componentArgs are the flags kube-scheduler and kube-controller-manager
// (part name) share: the admin kubeconfig for everything, no leader
// election, health on a loopback port with a self-signed certificate.
func (c *Cluster) componentArgs(part, port string) []string {
	return []string{
		part,
		"--kubeconfig=" + c.kubeconfigPath,
		"--authentication-kubeconfig=" + c.kubeconfigPath,
		"--authorization-kubeconfig=" + c.kubeconfigPath,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + port,
		"--cert-dir=" + filepath.Join(c.dir, part+"-certs"),
		"--v=2",
	}
}

// writerByName returns the running writer process called name; c.mu held.
func (c *Cluster) writerByName(name string) *process {
	for _, p := range c.writers {
		if p.name == name {
			return p
		}
	}
	return nil
}

// WaitServiceAccount waits until the service account controller has made
// namespace's default service account: ServiceAccount admission (on in a
// cluster with Writers.ControllerManager) refuses pods before that.
func (c *Cluster) WaitServiceAccount(ctx context.Context, namespace string) error {
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		_, err := cs.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("service account %s/default: %w (last: %v)", namespace, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WriterPIDs returns the process ids of the running writers by name.
func (c *Cluster) WriterPIDs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, p := range c.writers {
		out[p.name] = p.pid()
	}
	return out
}

// WriterLog returns the tail (last n bytes) of a writer's log, for test
// failure reports.
func (c *Cluster) WriterLog(name string, n int) string {
	return c.logTail(c.writerLogPath(name), n)
}

func (c *Cluster) writerLogPath(name string) string { return filepath.Join(c.dir, name+".log") }
func (c *Cluster) saKeyPath() string                { return filepath.Join(c.dir, "certs", "sa.key") }
func (c *Cluster) caPath() string                   { return filepath.Join(c.dir, "certs", "serving.crt") }

// stopWriters stops every writer (before the apiserver, so none logs a
// stream of connection errors on the way down).
func (c *Cluster) stopWriters() error {
	c.mu.Lock()
	ws := c.writers
	c.writers = nil
	c.mu.Unlock()
	var errs []error
	for _, p := range ws {
		if err := p.stop(15 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("stop writers: %v", errs)
	}
	return nil
}
