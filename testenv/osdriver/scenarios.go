package osdriver

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// The node the scenarios are placed on. It carries a taint every scenario
// tolerates except "taint", so that one scenario alone meets an untolerated
// taint while the others fit (or do not fit for their own reason only).
const (
	NodeName    = "node-1"
	TaintKey    = "eventpipe.test/dedicated"
	TaintValue  = "sandboxes"
	PoolLabel   = "eventpipe.test/pool"
	PoolPresent = "general"
	PoolMissing = "gpu"
)

// The workload images of scenarios crash-loop (its agent exits with code
// 1 a second after each start) and oom (OOM-killed a second after each
// start); Node's runtime keys on them.
const (
	ImageCrashLoop = scenario.ImageCrashingAgent
	ImageOOM       = "ghcr.io/example/memory-hungry-agent:2.0"
)

// The readiness probe of scenario unready, which the node's runtime
// answers with a failure.
var readinessProbe = &corev1.Probe{
	ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/ready"}}},
	PeriodSeconds: 2, FailureThreshold: 1,
}

// Node is the hollow node the scenarios expect (see StartNode): its
// capacity, label and taint are what the scheduling scenarios miss, and its
// runtime fails the pulls of the seeds' images the way containerd 2.x does
// for a tag that does not exist. The workload pod's init containers finish
// after a second, as OpenShell's do once they have copied their files, so
// that a pod whose images pull goes on to run its agent. The agent of
// image ImageCrashLoop exits with code 1 a second after each start, the
// one of ImageOOM is OOM-killed, and every other agent fails the
// readiness probe of scenario unready (until PassReadiness).
func Node() kube.NodeConfig {
	finish := func(name string) kube.ContainerRule {
		return kube.ContainerRule{Container: name, ExitAfter: kube.Duration(time.Second)}
	}
	return kube.NodeConfig{
		Name: NodeName, CPU: "4", Memory: "8Gi",
		Labels: map[string]string{PoolLabel: PoolPresent},
		Taints: []corev1.Taint{{Key: TaintKey, Value: TaintValue, Effect: corev1.TaintEffectNoSchedule}},
		Runtime: kube.RuntimeConfig{
			Images: []kube.ImageRule{
				{Image: scenario.ImageMissing, Pull: kube.PullNotFound},
				{Image: scenario.SupervisorImageBad, Pull: kube.PullNotFound},
			},
			Containers: []kube.ContainerRule{
				finish(scenario.ContainerSandboxBootstrap),
				finish(scenario.ContainerSupervisorInstall),
				finish(scenario.ContainerWorkspaceInit),
				// By image, as a real node's program decides how it ends:
				// pod names depend on the mode and the workspace (shared
				// "<workspace>--<name>"), the image is the sandbox's own.
				{Image: ImageCrashLoop, Container: scenario.ContainerAgent, ExitAfter: kube.Duration(time.Second), ExitCode: 1},
				{Image: ImageOOM, Container: scenario.ContainerAgent, ExitAfter: kube.Duration(time.Second), OOMKilled: true},
				{Container: scenario.ContainerAgent, Exec: []kube.ExecRule{{Command: readinessProbe.Exec.Command, ExitCode: 1,
					Stderr: "cat: can't open '/tmp/ready': No such file or directory"}}},
			},
		},
	}
}

// PassReadiness fixes scenario unready as its user would (the file the
// probe reads now exists): n's runtime answers the readiness probe with
// success from its next run on, the rest of Node's runtime unchanged. The
// kubelet then marks the agent container ready, which no Event reports.
func PassReadiness(n *kube.Node) error {
	rc := Node().Runtime
	for i := range rc.Containers {
		for j := range rc.Containers[i].Exec {
			if e := &rc.Containers[i].Exec[j]; slices.Equal(e.Command, readinessProbe.Exec.Command) {
				e.ExitCode, e.Stderr, e.Stdout = 0, "", ""
			}
		}
	}
	if err := n.SetRuntime(rc); err != nil {
		return fmt.Errorf("osdriver: pass the readiness probe: %w", err)
	}
	return nil
}

// StartNode starts Node on the cluster (a real kubelet; see
// kube.Cluster.AddNode). The cluster needs the writers (kube.AllWriters):
// the node lifecycle controller lifts the node's not-ready taint and the
// scheduler places the pods.
func StartNode(ctx context.Context, c *kube.Cluster) (*kube.Node, error) {
	n, err := c.AddNode(ctx, Node())
	if err != nil {
		return nil, fmt.Errorf("osdriver: %w", err)
	}
	return n, nil
}

var tolerateNode = []corev1.Toleration{{Key: TaintKey, Operator: corev1.TolerationOpEqual, Value: TaintValue, Effect: corev1.TaintEffectNoSchedule}}

// Scenario is one sandbox whose trouble (or health) a real writer reports.
type Scenario struct {
	Name        string
	Description string
	// Writers names the components whose writing the scenario shows.
	Writers string
	build   func(Params) (Sandbox, error)
	// setup runs before the sandbox is created (a volume, a quota).
	setup func(ctx context.Context, d *Driver, s Sandbox) error
}

// Params places a scenario: the workspace mode and workspace name (default
// managed and the scenario's name, so scenarios do not share a namespace in
// managed mode).
type Params struct {
	Mode      scenario.Mode
	Workspace string
}

// Scenarios are the scenarios by name.
var Scenarios = map[string]Scenario{}

// Names lists the scenarios, sorted.
func Names() []string {
	out := make([]string, 0, len(Scenarios))
	for n := range Scenarios {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func add(s Scenario) { Scenarios[s.Name] = s }

func init() {
	add(Scenario{Name: "img-missing", Description: "the workload image's tag does not exist (seed img-missing)",
		Writers: "kube-scheduler (Scheduled), kubelet (Pulling, Failed, BackOff), Agent Sandbox controller (Ready)",
		build: func(p Params) (Sandbox, error) {
			s := p.sandbox("img-missing")
			s.Image = scenario.ImageMissing
			return s, nil
		}, setup: provision})
	add(Scenario{Name: "sup-bad", Description: "the supervisor image's tag does not exist (seed sup-bad)",
		Writers: "kube-scheduler (Scheduled), kubelet (Pulling, Failed, BackOff on the supervisor pod; Pulled, Started on the workload pod), Agent Sandbox controller (Ready)",
		build: func(p Params) (Sandbox, error) {
			s := p.sandbox("sup-bad")
			s.SupervisorImage = scenario.SupervisorImageBad
			return s, nil
		}, setup: provision})
	add(Scenario{Name: "healthy", Description: "nothing blocks it",
		Writers: "kube-scheduler (Scheduled), kubelet (Pulled, Created, Started), Agent Sandbox controller (Ready)",
		build:   func(p Params) (Sandbox, error) { return p.sandbox("healthy"), nil }, setup: provision})
	add(Scenario{Name: "pvc-unbound", Description: "the workspace claim names no StorageClass and the cluster has no default one",
		Writers: "persistentvolume-controller (FailedBinding), kube-scheduler (FailedScheduling: unbound claim)",
		build:   func(p Params) (Sandbox, error) { return p.sandbox("pvc-unbound"), nil }})
	add(Scenario{Name: "no-cpu", Description: "the agent requests more CPU than any node has",
		Writers: "kube-scheduler (FailedScheduling: Insufficient cpu)",
		build: func(p Params) (Sandbox, error) {
			s := p.sandbox("no-cpu")
			s.NoWorkspaceClaim = true // no volume race (see noClaim)
			s.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")}
			return s, nil
		}})
	add(Scenario{Name: "no-memory", Description: "the agent requests more memory than any node has",
		Writers: "kube-scheduler (FailedScheduling: Insufficient memory)",
		build: func(p Params) (Sandbox, error) {
			s := p.sandbox("no-memory")
			s.NoWorkspaceClaim = true // no volume race (see noClaim)
			s.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Gi")}
			return s, nil
		}})
	add(Scenario{Name: "taint", Description: "the only node has a taint the sandbox does not tolerate",
		Writers: "kube-scheduler (FailedScheduling: untolerated taint)",
		build: func(p Params) (Sandbox, error) {
			s := p.sandbox("taint")
			s.NoWorkspaceClaim = true // no volume race (see noClaim)
			s.Tolerations = nil
			return s, nil
		}})
	add(Scenario{Name: "selector", Description: "the pod template selects a node pool no node belongs to",
		Writers: "kube-scheduler (FailedScheduling: node affinity/selector)",
		build: func(p Params) (Sandbox, error) {
			s := p.sandbox("selector")
			s.NoWorkspaceClaim = true // no volume race (see noClaim)
			s.NodeSelector = map[string]string{PoolLabel: PoolMissing}
			return s, nil
		}})
	add(Scenario{Name: "no-gpu", Description: "the agent asks for a GPU and no node has one",
		Writers: "kube-scheduler (FailedScheduling: Insufficient nvidia.com/gpu)",
		build: func(p Params) (Sandbox, error) {
			s := p.sandbox("no-gpu")
			s.NoWorkspaceClaim = true // no volume race (see noClaim)
			gpu := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
			s.Requests, s.Limits = gpu, gpu
			return s, nil
		}})
	add(Scenario{Name: "no-secret", Description: "the pod mounts a Secret that does not exist",
		Writers: "kube-scheduler (Scheduled), kubelet (FailedMount), Agent Sandbox controller (Ready)",
		build: func(p Params) (Sandbox, error) {
			s := p.sandbox("no-secret")
			s.Volumes = []corev1.Volume{{Name: "credentials", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: "sandbox-credentials"}}}}
			return s, nil
		}, setup: provision})
	add(Scenario{Name: "crash-loop", Description: "the agent exits with code 1 a second after each start",
		Writers: "kube-scheduler (Scheduled), kubelet (Started, BackOff; container status), Agent Sandbox controller (Ready)",
		build: func(p Params) (Sandbox, error) {
			s := p.sandbox("crash-loop")
			s.Image = ImageCrashLoop
			return s, nil
		}, setup: provision})
	add(Scenario{Name: "oom", Description: "the agent is OOM-killed a second after each start",
		Writers: "kube-scheduler (Scheduled), kubelet (Started, BackOff; container status OOMKilled), Agent Sandbox controller (Ready)",
		build: func(p Params) (Sandbox, error) {
			s := p.sandbox("oom")
			s.Image = ImageOOM
			return s, nil
		}, setup: provision})
	add(Scenario{Name: "unready", Description: "the agent's readiness probe fails",
		Writers: "kube-scheduler (Scheduled), kubelet (Unhealthy), Agent Sandbox controller (Ready: Pod is Running but not Ready)",
		build: func(p Params) (Sandbox, error) {
			s := p.sandbox("unready")
			s.ReadinessProbe = readinessProbe
			return s, nil
		}, setup: provision})
	add(Scenario{Name: "quota", Description: "a ResourceQuota of the workspace allows no pod",
		Writers: "kube-apiserver quota admission, through the Agent Sandbox controller (Ready: ReconcilerError)",
		build: func(p Params) (Sandbox, error) {
			if p.Mode == scenario.ModeShared {
				return Sandbox{}, fmt.Errorf("scenario quota needs a namespace of its own: managed or operator mode")
			}
			s := p.sandbox("quota")
			// No supervisor pod: the quota would refuse it first, and
			// the driver would fail, not the controller.
			s.Generation = scenario.Older
			return s, nil
		}, setup: func(ctx context.Context, d *Driver, s Sandbox) error {
			if err := d.EnsureNamespace(ctx, s.Sandbox); err != nil {
				return err
			}
			q := &corev1.ResourceQuota{
				ObjectMeta: metav1.ObjectMeta{Name: "sandbox-pods", Namespace: s.Namespace()},
				Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}},
			}
			if _, err := d.cs.CoreV1().ResourceQuotas(s.Namespace()).Create(ctx, q, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("osdriver: quota in %s: %w", s.Namespace(), err)
			}
			return provision(ctx, d, s)
		}})
	add(Scenario{Name: "webhook", Description: "a validating admission webhook denies the sandbox's workload pod",
		Writers: "kube-apiserver's ValidatingAdmissionWebhook calling a webhook server of ours (HTTPS on 127.0.0.1), through the Agent Sandbox controller (Ready: ReconcilerError)",
		build:   func(p Params) (Sandbox, error) { return p.sandbox("webhook"), nil },
		setup: func(ctx context.Context, d *Driver, s Sandbox) error {
			if err := d.denyWorkloadPod(ctx, s); err != nil {
				return err
			}
			return provision(ctx, d, s)
		}})
}

// Scenario webhook's webhook: its name (in the API server's denial) and
// its reason.
const (
	WebhookName    = "sandbox-policy.eventpipe.test"
	WebhookMessage = "policy sandbox-images: images must come from registry.eventpipe.test"
)

// denyWorkloadPod starts a webhook server in this process and registers
// it to deny the workload pod of s: the pods with its sandbox id, except
// the supervisor pod (the driver's own, which the webhook lets through so
// that the controller's pod alone is refused). The Driver stops it on
// Close.
func (d *Driver) denyWorkloadPod(ctx context.Context, s Sandbox) error {
	w, err := kube.StartDenyWebhook(kube.DenyWebhookConfig{Name: WebhookName, Message: WebhookMessage,
		ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "openshell.ai/sandbox-id", Operator: metav1.LabelSelectorOpIn, Values: []string{s.ID}},
			{Key: "openshell.ai/component", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"supervisor"}},
		}}})
	if err != nil {
		return fmt.Errorf("osdriver: %w", err)
	}
	d.mu.Lock()
	d.webhooks = append(d.webhooks, w)
	d.mu.Unlock()
	if err := w.Register(ctx, d.cs); err != nil {
		return fmt.Errorf("osdriver: %w", err)
	}
	// The API server takes a moment to call a new configuration: wait
	// until a dry run of a pod like the workload pod is denied, so that
	// the controller's first try already is.
	if err := d.EnsureNamespace(ctx, s.Sandbox); err != nil {
		return err
	}
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "webhook-probe-", Namespace: s.Namespace(), Labels: map[string]string{"openshell.ai/sandbox-id": s.ID}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: scenario.ContainerAgent, Image: s.Image}}},
	}
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		_, err := d.cs.CoreV1().Pods(s.Namespace()).Create(wait, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), `admission webhook "`+WebhookName+`" denied`) {
			return nil
		}
		select {
		case <-wait.Done():
			return fmt.Errorf("osdriver: webhook %s not called by the API server within a minute (last: %v)", WebhookName, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// noClaim: the scheduling scenarios have no workspace claim. With one, the
// scheduler can try the pod before the PersistentVolume controller has
// bound the claim to its volume ("pod has unbound immediate
// PersistentVolumeClaims"), and then leave the pod in its unschedulable
// queue for minutes before it tries again and writes the real cause: seen
// here with kube-scheduler v1.37.2, which makes the scenario's first
// blocker a race.

func provision(ctx context.Context, d *Driver, s Sandbox) error {
	return d.ProvisionWorkspace(ctx, s.Sandbox)
}

func (p Params) sandbox(name string) Sandbox {
	if p.Mode == "" {
		p.Mode = scenario.ModeManaged
	}
	if p.Workspace == "" {
		p.Workspace = name
	}
	sb := scenario.NewSandbox(name, p.Workspace, p.Mode)
	sb.Node = "" // the scheduler places the pods
	return Sandbox{Sandbox: sb, Tolerations: tolerateNode}
}

// Build returns the sandbox of the named scenario.
func Build(name string, p Params) (Scenario, Sandbox, error) {
	sc, ok := Scenarios[name]
	if !ok {
		return Scenario{}, Sandbox{}, fmt.Errorf("unknown scenario %q (known: %v)", name, Names())
	}
	s, err := sc.build(p)
	if err != nil {
		return Scenario{}, Sandbox{}, err
	}
	return sc, s, nil
}

// Run builds the named scenario, sets up what it needs and creates its
// sandbox as the driver does. The node must run (StartNode).
func (d *Driver) Run(ctx context.Context, name string, p Params) (Sandbox, error) {
	sc, s, err := Build(name, p)
	if err != nil {
		return Sandbox{}, err
	}
	if sc.setup != nil {
		if err := sc.setup(ctx, d, s); err != nil {
			return Sandbox{}, err
		}
	}
	if _, err := d.Create(ctx, s); err != nil {
		return Sandbox{}, err
	}
	return s, nil
}
