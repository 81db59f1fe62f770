package osdriver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// SandboxGVR is the Sandbox resource the driver writes (v1beta1, the only
// version Agent Sandbox v1.0.1 serves).
var SandboxGVR = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}

// Sandbox is one sandbox to create: its identity and images (the embedded
// scenario.Sandbox) and what its pod template asks of a node.
type Sandbox struct {
	scenario.Sandbox
	// Requests and Limits are the agent container's resources (none when
	// nil; an extended resource such as nvidia.com/gpu needs both).
	Requests, Limits corev1.ResourceList
	// ReadinessProbe is the agent container's readiness probe (none when
	// nil).
	ReadinessProbe *corev1.Probe
	// Volumes are added to the pod template and mounted into the agent
	// container at /mnt/<name>.
	Volumes []corev1.Volume
	// NodeSelector and Tolerations go into the workload pod template.
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
	// NoWorkspaceClaim leaves out the workspace volume claim template.
	NoWorkspaceClaim bool
	// StorageClassName is the workspace claim's class; nil names none
	// (the cluster's default class applies, if it has one).
	StorageClassName *string
}

// Driver creates sandboxes through an admin client. It owns what a
// scenario starts in this process (a webhook server): Close stops it.
type Driver struct {
	cs  kubernetes.Interface
	dyn dynamic.Interface

	mu       sync.Mutex
	webhooks []*kube.DenyWebhook
}

// Close stops the webhook servers the scenarios started and removes their
// configurations from the cluster (best effort: a cluster being stopped
// may not answer).
func (d *Driver) Close() error {
	d.mu.Lock()
	ws := d.webhooks
	d.webhooks = nil
	d.mu.Unlock()
	var errs []error
	for _, w := range ws {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = w.Unregister(ctx, d.cs)
		cancel()
		if err := w.Close(); err != nil {
			errs = append(errs, fmt.Errorf("osdriver: %w", err))
		}
	}
	return errors.Join(errs...)
}

// New returns a Driver for cfg.
func New(cfg *rest.Config) (*Driver, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("osdriver: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("osdriver: %w", err)
	}
	return &Driver{cs: cs, dyn: dyn}, nil
}

// Clientset is the driver's client, for tests that read back what the
// writers wrote.
func (d *Driver) Clientset() kubernetes.Interface { return d.cs }

// Create makes the namespace, the Sandbox CR and (newer generation) the
// supervisor pod, and returns the CR as created.
func (d *Driver) Create(ctx context.Context, s Sandbox) (*unstructured.Unstructured, error) {
	if err := d.EnsureNamespace(ctx, s.Sandbox); err != nil {
		return nil, err
	}
	obj, err := s.DriverCR()
	if err != nil {
		return nil, err
	}
	cr, err := d.dyn.Resource(SandboxGVR).Namespace(s.Namespace()).Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cr, err = d.dyn.Resource(SandboxGVR).Namespace(s.Namespace()).Get(ctx, s.CRName(), metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("osdriver: sandbox %s/%s: %w", s.Namespace(), s.CRName(), err)
	}
	if s.HasSupervisorPod() {
		pod := s.SupervisorPod(string(cr.GetUID()))
		// The scheduler places it (the scenario player names a node).
		pod.Spec.NodeName = ""
		pod.Spec.Tolerations = s.Tolerations
		if err := d.createPod(ctx, pod); err != nil {
			return nil, err
		}
	}
	return cr, nil
}

// EnsureNamespace creates the sandbox's namespace if it does not exist:
// with the driver's labels in managed mode, bare otherwise (an operator's).
func (d *Driver) EnsureNamespace(ctx context.Context, s scenario.Sandbox) error {
	_, err := d.cs.CoreV1().Namespaces().Create(ctx, s.NamespaceObject(), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("osdriver: namespace %s: %w", s.Namespace(), err)
	}
	return nil
}

// createPod creates pod, retrying while ServiceAccount admission refuses it
// because the namespace's default service account is not made yet.
func (d *Driver) createPod(ctx context.Context, pod *corev1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		_, err := d.cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		if !noServiceAccountYet(err) {
			return fmt.Errorf("osdriver: pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("osdriver: pod %s/%s: %w (last: %v)", pod.Namespace, pod.Name, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func noServiceAccountYet(err error) bool {
	var se apierrors.APIStatus
	return errors.As(err, &se) && apierrors.IsForbidden(err) && strings.Contains(err.Error(), "service account")
}

// DriverCR returns the Sandbox custom resource the driver writes: the
// scenario's identity (labels, annotations, name) with a pod template the
// Agent Sandbox controller turns into the workload pod (init containers,
// the agent container, the sandbox id on the pod) and the workspace claim
// template.
func (s Sandbox) DriverCR() (*unstructured.Unstructured, error) {
	cr := s.Sandbox.CR()
	cr.SetAPIVersion(SandboxGVR.GroupVersion().String())
	pod := s.Sandbox.WorkloadPod("")
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{}, Annotations: pod.Annotations},
		Spec: corev1.PodSpec{
			InitContainers: pod.Spec.InitContainers,
			Containers:     pod.Spec.Containers,
			NodeSelector:   s.NodeSelector,
			Tolerations:    s.Tolerations,
		},
	}
	for k, v := range pod.Labels {
		// The controller sets its own name-hash label.
		if k != "agents.x-k8s.io/sandbox-name-hash" {
			tmpl.Labels[k] = v
		}
	}
	for k, v := range cr.GetLabels() {
		tmpl.Labels[k] = v
	}
	agent := &tmpl.Spec.Containers[0]
	agent.Resources.Requests, agent.Resources.Limits = s.Requests, s.Limits
	agent.ReadinessProbe = s.ReadinessProbe
	for _, v := range s.Volumes {
		tmpl.Spec.Volumes = append(tmpl.Spec.Volumes, v)
		agent.VolumeMounts = append(agent.VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: "/mnt/" + v.Name})
	}
	podTemplate, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&tmpl)
	if err != nil {
		return nil, fmt.Errorf("osdriver: pod template of %s: %w", s.CRName(), err)
	}
	spec := map[string]any{"podTemplate": podTemplate}
	if !s.NoWorkspaceClaim {
		claim := map[string]any{
			"metadata": map[string]any{"name": "workspace"},
			"spec": map[string]any{
				"accessModes": []any{"ReadWriteOnce"},
				"resources":   map[string]any{"requests": map[string]any{"storage": "1Gi"}},
			},
		}
		if s.StorageClassName != nil {
			claim["spec"].(map[string]any)["storageClassName"] = *s.StorageClassName
		}
		spec["volumeClaimTemplates"] = []any{claim}
	}
	cr.Object["spec"] = spec
	return cr, nil
}

// WorkspaceVolume returns a PersistentVolume pre-bound to the sandbox's
// workspace claim, as an administrator provisions one by hand: the
// PersistentVolume controller binds the two. Without it (and without a
// provisioner) the claim stays Pending and the pod unschedulable.
func WorkspaceVolume(s scenario.Sandbox) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + strings.ToLower(s.ID)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: s.Namespace(), Name: s.PVCName()},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/eventpipe-testenv/" + strings.ToLower(s.ID)},
			},
		},
	}
}

// ProvisionWorkspace creates WorkspaceVolume(s).
func (d *Driver) ProvisionWorkspace(ctx context.Context, s scenario.Sandbox) error {
	_, err := d.cs.CoreV1().PersistentVolumes().Create(ctx, WorkspaceVolume(s), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("osdriver: volume for %s: %w", s.PVCName(), err)
	}
	return nil
}
