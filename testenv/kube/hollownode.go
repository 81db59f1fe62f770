package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// NodeConfig is one hollow node: a real kubelet (kubeparts hollow-kubelet,
// built by testenv/build) with eventpipe's CRI behind its socket.
type NodeConfig struct {
	// Name is the Node's name (required; a DNS label).
	Name string
	// CPU and Memory are the node's capacity (default "4" and "8Gi"); Pods
	// its pod capacity (default 110).
	CPU, Memory string
	Pods        int
	// Labels are added to the kubelet's own (hostname, os, arch).
	Labels map[string]string
	// Taints the node registers with.
	Taints []corev1.Taint
	// ExtendedResources are device-plugin resources ("nvidia.com/gpu": "1").
	ExtendedResources map[string]string
	// Runtime is the CRI's behaviour; SetRuntime changes it later.
	Runtime RuntimeConfig
}

// RuntimeConfig is the behaviour of a node's CRI. It is the JSON file the
// CRI reads (testenv/build/cri.Config, in the wrapper module, which the
// main module cannot import); the CRI rejects unknown fields, so a
// mismatch fails the node's start. TestRuntimeConfigForTheCRI here and
// TestKubeRuntimeConfigInStep there keep the two copies in step. See that
// package for the semantics.
type RuntimeConfig struct {
	// Runtime is "containerd" (containerd 2.x words; the default) or "cri-o".
	Runtime    string          `json:"runtime,omitempty"`
	Images     []ImageRule     `json:"images,omitempty"`
	Containers []ContainerRule `json:"containers,omitempty"`
	Processes  []ProcessRule   `json:"processes,omitempty"`
}

// Pull outcomes of an ImageRule.
const (
	PullOK                = "ok"
	PullNotFound          = "not_found"
	PullUnauthorized      = "unauthorized"
	PullRateLimited       = "rate_limited"
	PullTLS               = "tls"
	PullDNS               = "dns"
	PullConnectionRefused = "connection_refused"
	PullIOTimeout         = "io_timeout"
	PullPlatformMismatch  = "platform_mismatch"
)

// ImageRule says how pulls of Image (as written or normalised) end.
type ImageRule struct {
	Image    string   `json:"image"`
	Pull     string   `json:"pull,omitempty"`
	Delay    Duration `json:"delay,omitempty"`
	Addr     string   `json:"addr,omitempty"`
	Platform string   `json:"platform,omitempty"`
}

// ContainerRule says how matching containers behave (empty fields match
// any; Pod may end in "*").
type ContainerRule struct {
	Namespace string     `json:"namespace,omitempty"`
	Pod       string     `json:"pod,omitempty"`
	Container string     `json:"container,omitempty"`
	Image     string     `json:"image,omitempty"`
	ExitAfter Duration   `json:"exitAfter,omitempty"`
	ExitCode  int32      `json:"exitCode,omitempty"`
	OOMKilled bool       `json:"oomKilled,omitempty"`
	Exec      []ExecRule `json:"exec,omitempty"`
}

// ProcessRule runs matching containers (fields as ContainerRule's) as
// real processes of the host executable Run, which stands for the image's
// entrypoint: args, env and the kubelet's mounts as the kubelet sends
// them, in a network namespace of its own (its ports reached at the pod's
// IP, 127.88.x.y on the host's loopback, and by port-forward; a Service's
// ClusterIP is not), until the process
// ends or the kubelet stops it (SIGTERM, then SIGKILL after the grace
// period); the node's stop kills what is left.
type ProcessRule struct {
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	Image     string `json:"image,omitempty"`
	Run       string `json:"run"`
}

// ExecRule answers an exec (probe) whose command starts with Command.
type ExecRule struct {
	Command  []string `json:"command"`
	ExitCode int32    `json:"exitCode,omitempty"`
	Stdout   string   `json:"stdout,omitempty"`
	Stderr   string   `json:"stderr,omitempty"`
}

// Duration is written as a Go duration string, as the CRI reads it.
type Duration time.Duration

// MarshalJSON writes "1.5s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Node is a running hollow node.
type Node struct {
	name        string
	dir         string
	runtimePath string
	proc        *process
}

// Name is the Node's name.
func (n *Node) Name() string { return n.name }

// Dir holds the node's kubelet root, pod logs, CRI socket and log.
func (n *Node) Dir() string { return n.dir }

// PID is the kubelet process's id (0 once stopped).
func (n *Node) PID() int {
	if n.proc == nil {
		return 0
	}
	return n.proc.pid()
}

// LogTail returns the end of the kubelet's log (klog and the CRI's lines).
func (n *Node) LogTail(max int) string {
	b, err := os.ReadFile(filepath.Join(n.dir, "kubelet.log"))
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return tail(b, max)
}

// SetRuntime replaces the CRI's behaviour; the next CRI call uses it.
func (n *Node) SetRuntime(rc RuntimeConfig) error { return writeJSONAtomic(n.runtimePath, rc) }

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// maxNodeDir is the longest node directory whose unix sockets fit in
// sun_path (107 bytes and a NUL): the kubelet binds
// root/device-plugins/kubelet.sock and root/pod-resources/<9-10 digits>
// under it, and with a longer path it dies with "bind: invalid argument"
// in its log only.
const maxNodeDir = 107 - len("/root/device-plugins/kubelet.sock")

// checkNodeDir refuses a node directory too long for the kubelet's sockets.
func checkNodeDir(dir string) error {
	if len(dir) > maxNodeDir {
		return fmt.Errorf("node directory %s is %d bytes long: the kubelet's unix sockets under it need it at most %d (use a shorter cluster directory)", dir, len(dir), maxNodeDir)
	}
	return nil
}

// AddNode starts a hollow node against this control plane and waits until
// its Node is Ready. The kubelet authenticates as the admin user (the
// apiserver runs RBAC only, no Node authorizer); its Events carry source
// component "kubelet" and host Name, as on a real node. The node stops with
// the cluster (Stop) or with StopNode.
func (c *Cluster) AddNode(ctx context.Context, nc NodeConfig) (*Node, error) {
	if !dnsLabel.MatchString(nc.Name) {
		return nil, fmt.Errorf("add node: name %q is not a DNS label", nc.Name)
	}
	binDir, err := binaries(ctx, c.binDir, []string{kubepartsBin}, func(f string, a ...any) { c.logger.Info(fmt.Sprintf(f, a...)) })
	if err != nil {
		return nil, fmt.Errorf("add node %s: %w", nc.Name, err)
	}
	bin := filepath.Join(binDir, kubepartsBin)
	dir := filepath.Join(c.dir, "nodes", nc.Name)
	if err := checkNodeDir(dir); err != nil {
		return nil, fmt.Errorf("add node %s: %w", nc.Name, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("add node %s: %w", nc.Name, err)
	}
	n := &Node{name: nc.Name, dir: dir, runtimePath: filepath.Join(dir, "runtime.json")}
	if err := n.SetRuntime(nc.Runtime); err != nil {
		return nil, fmt.Errorf("add node %s: %w", nc.Name, err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := c.writeNodeKubeconfig(kubeconfig); err != nil {
		return nil, fmt.Errorf("add node %s: %w", nc.Name, err)
	}
	// The kubelet's server (container logs, port-forward) on a port of
	// its own: nodes share the host's loopback, which is their address.
	port, err := freePorts(1)
	if err != nil {
		return nil, fmt.Errorf("add node %s: %w", nc.Name, err)
	}
	args := []string{"hollow-kubelet", "--name=" + nc.Name, "--kubeconfig=" + kubeconfig, "--dir=" + dir,
		"--runtime-config=" + n.runtimePath, "--port=" + strconv.Itoa(port[0]), "--v=2"}
	if nc.CPU != "" {
		args = append(args, "--cpu="+nc.CPU)
	}
	if nc.Memory != "" {
		args = append(args, "--memory="+nc.Memory)
	}
	if nc.Pods > 0 {
		args = append(args, "--pods="+strconv.Itoa(nc.Pods))
	}
	if len(nc.Labels) > 0 {
		args = append(args, "--labels="+joinPairs(nc.Labels))
	}
	if len(nc.ExtendedResources) > 0 {
		args = append(args, "--extended-resources="+joinPairs(nc.ExtendedResources))
	}
	if len(nc.Taints) > 0 {
		var ts []string
		for _, t := range nc.Taints {
			kv := t.Key
			if t.Value != "" {
				kv += "=" + t.Value
			}
			ts = append(ts, kv+":"+string(t.Effect))
		}
		args = append(args, "--taints="+strings.Join(ts, ","))
	}
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil, errors.New("add node: cluster is stopped")
	}
	n.proc, err = startProcess("kubelet-"+nc.Name, bin, args, dir, filepath.Join(dir, "kubelet.log"))
	if err == nil {
		c.nodes = append(c.nodes, n)
	}
	c.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("add node %s: %w", nc.Name, err)
	}
	if err := c.waitNodeReady(ctx, n); err != nil {
		return nil, fmt.Errorf("add node %s: %w\n%s", nc.Name, err, n.LogTail(4000))
	}
	return n, nil
}

// StopNode stops one node's kubelet (its Node object stays, and turns
// NotReady after the node monitor grace period when a controller-manager
// runs).
func (c *Cluster) StopNode(n *Node) error {
	c.mu.Lock()
	for i, m := range c.nodes {
		if m == n {
			c.nodes = append(c.nodes[:i], c.nodes[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	if n.proc == nil {
		return nil
	}
	err := n.proc.stop(10 * time.Second)
	n.proc = nil
	return err
}

// Nodes returns the running hollow nodes.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Node(nil), c.nodes...)
}

func (c *Cluster) waitNodeReady(ctx context.Context, n *Node) error {
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return err
	}
	// A cold kubelet on a loaded 2-core machine takes a while to register.
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		if done, werr := n.proc.exited(); done {
			return fmt.Errorf("kubelet exited: %v", werr)
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err == nil {
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready: %w", n.name, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (c *Cluster) writeNodeKubeconfig(path string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["eventpipe-testenv"] = &clientcmdapi.Cluster{Server: c.apiserverURL, CertificateAuthorityData: c.caPEM}
	cfg.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{Token: c.adminToken}
	cfg.Contexts["kubelet"] = &clientcmdapi.Context{Cluster: "eventpipe-testenv", AuthInfo: "kubelet"}
	cfg.CurrentContext = "kubelet"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write node kubeconfig: %w", err)
	}
	return nil
}

func joinPairs(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

// writeJSONAtomic writes v to path through a temp file and a rename, so the
// CRI never reads half a file.
func writeJSONAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}
