package scenario

import (
	"crypto/rand"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Mode is an OpenShell workspace mode.
type Mode string

// Workspace modes.
const (
	// ModeManaged: one namespace per workspace, openshell-<gateway>-<workspace>.
	ModeManaged Mode = "managed"
	// ModeOperator: the namespace is named after the workspace.
	ModeOperator Mode = "operator"
	// ModeShared: every sandbox in one namespace ("openshell"), CRs named
	// <workspace>--<name>.
	ModeShared Mode = "shared"
)

// Modes lists every workspace mode.
var Modes = []Mode{ModeManaged, ModeOperator, ModeShared}

// ParseMode parses a mode name.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown workspace mode %q (want managed, operator or shared)", s)
}

// Generation selects which of OpenShell's two labelling generations the
// objects carry (see docs/openshell.md).
type Generation int

const (
	// Newer (0.1.6): openshell.ai/ annotations on the pod, boundary-pair
	// labels, a separate supervisor pod os-supervisor-<id>, and a bootstrap
	// init container.
	Newer Generation = iota
	// Older: openshell.io/sandbox-id pod annotation, supervisor installed by
	// the init container openshell-supervisor-install, no supervisor pod.
	Older
)

// Well-known names and images.
const (
	DefaultGateway         = "openshell"
	SharedNamespace        = "openshell"
	DefaultNode            = "kind-control-plane"
	DefaultWorkloadImage   = "ghcr.io/nvidia/openshell-community/sandboxes/base:latest"
	DefaultSupervisorImage = "ghcr.io/nvidia/openshell/supervisor:0.1.6"
	DefaultBootstrapImage  = "ghcr.io/nvidia/openshell/sandbox:0.1.6"

	ContainerAgent             = "agent"
	ContainerWorkspaceInit     = "workspace-init"
	ContainerSupervisorInstall = "openshell-supervisor-install"
	ContainerSandboxBootstrap  = "openshell-sandbox-bootstrap"
	ContainerSupervisor        = "supervisor"

	SandboxAPIVersionV1beta1  = "agents.x-k8s.io/v1beta1"
	SandboxAPIVersionV1alpha1 = "agents.x-k8s.io/v1alpha1"
)

// Sandbox describes one OpenShell sandbox; its methods derive every object
// name the way OpenShell does.
type Sandbox struct {
	ID              string // UUIDv4; NewSandbox makes one
	Name            string // the user's name (openshell sandbox create --name)
	Workspace       string
	Mode            Mode
	Gateway         string
	Generation      Generation
	Image           string // workload image (agent and workspace-init)
	SupervisorImage string
	BootstrapImage  string
	Node            string
	// CRAPIVersion is the version the CR is created through (v1beta1 default).
	CRAPIVersion string
	// PodNameOverride sets the CR annotation agents.x-k8s.io/pod-name.
	PodNameOverride string
}

// NewSandbox returns a sandbox with a fresh id and the defaults filled in.
func NewSandbox(name, workspace string, mode Mode) Sandbox {
	return Sandbox{
		ID: NewUUID(), Name: name, Workspace: workspace, Mode: mode,
		Gateway: DefaultGateway, Generation: Newer,
		Image: DefaultWorkloadImage, SupervisorImage: DefaultSupervisorImage, BootstrapImage: DefaultBootstrapImage,
		Node: DefaultNode, CRAPIVersion: SandboxAPIVersionV1beta1,
	}
}

// NewUUID returns a random UUIDv4 string.
func NewUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Namespace is the namespace the sandbox's objects live in.
func (s Sandbox) Namespace() string {
	switch s.Mode {
	case ModeShared:
		return SharedNamespace
	case ModeOperator:
		return s.Workspace
	default:
		return "openshell-" + s.Gateway + "-" + s.Workspace
	}
}

// CRName is the Sandbox CR's name.
func (s Sandbox) CRName() string {
	if s.Mode == ModeShared {
		return s.Workspace + "--" + s.Name
	}
	return s.Name
}

// PodName is the workload pod's name.
func (s Sandbox) PodName() string {
	if s.PodNameOverride != "" {
		return s.PodNameOverride
	}
	return s.CRName()
}

// SupervisorPodName is the newer generation's supervisor pod name.
func (s Sandbox) SupervisorPodName() string { return "os-supervisor-" + strings.ToLower(s.ID) }

// PVCName is the workspace volume claim's name.
func (s Sandbox) PVCName() string { return "workspace-" + s.CRName() }

// HasSupervisorPod reports whether the generation runs a separate supervisor pod.
func (s Sandbox) HasSupervisorPod() bool { return s.Generation == Newer }

// InitContainers returns the workload pod's init containers, in order, with
// their images.
func (s Sandbox) InitContainers() []corev1.Container {
	if s.Generation == Older {
		return []corev1.Container{
			{Name: ContainerSupervisorInstall, Image: s.SupervisorImage},
			{Name: ContainerWorkspaceInit, Image: s.Image},
		}
	}
	return []corev1.Container{
		{Name: ContainerSandboxBootstrap, Image: s.BootstrapImage},
		{Name: ContainerWorkspaceInit, Image: s.Image},
	}
}

func (s Sandbox) crLabels() map[string]string {
	return map[string]string{
		"openshell.ai/sandbox-id":        s.ID,
		"openshell.ai/sandbox-name":      s.Name,
		"openshell.ai/sandbox-workspace": s.Workspace,
		"openshell.ai/managed-by":        "openshell",
		"openshell.ai/gateway-id":        s.Gateway,
	}
}

// NamespaceObject returns the namespace as OpenShell (managed mode) or an
// operator (operator/shared mode) creates it.
func (s Sandbox) NamespaceObject() *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.Namespace()}}
	if s.Mode == ModeManaged {
		ns.Labels = map[string]string{
			"openshell.ai/managed-by":        "openshell",
			"openshell.ai/gateway-id":        s.Gateway,
			"openshell.ai/sandbox-workspace": s.Workspace,
		}
	}
	return ns
}

// CR returns the Sandbox custom resource.
func (s Sandbox) CR() *unstructured.Unstructured {
	annotations := map[string]any{
		"openshell.ai/sandbox-id":        s.ID,
		"openshell.ai/sandbox-name":      s.Name,
		"openshell.ai/sandbox-workspace": s.Workspace,
	}
	if s.PodNameOverride != "" {
		annotations["agents.x-k8s.io/pod-name"] = s.PodNameOverride
	}
	labels := map[string]any{}
	for k, v := range s.crLabels() {
		labels[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": s.crAPIVersion(),
		"kind":       "Sandbox",
		"metadata": map[string]any{
			"name": s.CRName(), "namespace": s.Namespace(),
			"labels": labels, "annotations": annotations,
		},
		"spec": map[string]any{
			"podTemplate": map[string]any{
				"metadata": map[string]any{"labels": labels},
				"spec": map[string]any{
					"runtimeClassName": "runc",
					"containers":       []any{map[string]any{"name": ContainerAgent, "image": s.Image}},
				},
			},
			"volumeClaimTemplates": []any{map[string]any{
				"metadata": map[string]any{"name": "workspace"},
				"spec": map[string]any{
					"accessModes": []any{"ReadWriteOnce"},
					"resources":   map[string]any{"requests": map[string]any{"storage": "1Gi"}},
				},
			}},
		},
	}}
}

func (s Sandbox) crAPIVersion() string {
	if s.CRAPIVersion == "" {
		return SandboxAPIVersionV1beta1
	}
	return s.CRAPIVersion
}

func (s Sandbox) ownerRef(crUID string, controller bool) metav1.OwnerReference {
	ref := metav1.OwnerReference{APIVersion: s.crAPIVersion(), Kind: "Sandbox", Name: s.CRName(), UID: typesUID(crUID)}
	if controller {
		t := true
		ref.Controller = &t
		ref.BlockOwnerDeletion = &t
	}
	return ref
}

// WorkloadPod returns the workload pod, owned (controller) by the CR with crUID.
func (s Sandbox) WorkloadPod(crUID string) *corev1.Pod {
	labels := map[string]string{"agents.x-k8s.io/sandbox-name-hash": nameHash(s.CRName())}
	annotations := map[string]string{}
	if s.Generation == Newer {
		annotations["openshell.ai/sandbox-id"] = s.ID
		labels["openshell.ai/boundary-pair"] = strings.ToLower(s.ID)
		labels["openshell.ai/boundary-role"] = "workload"
		labels["openshell.ai/managed-by"] = "openshell"
	} else {
		annotations["openshell.io/sandbox-id"] = s.ID
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.PodName(), Namespace: s.Namespace(), Labels: labels, Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{s.ownerRef(crUID, true)},
		},
		Spec: corev1.PodSpec{
			NodeName:       s.Node,
			InitContainers: s.InitContainers(),
			Containers:     []corev1.Container{{Name: ContainerAgent, Image: s.Image}},
			Volumes: []corev1.Volume{{Name: "workspace", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: s.PVCName()},
			}}},
		},
	}
}

// SupervisorPod returns the newer generation's bare supervisor pod, owned
// (not as controller) by the CR with crUID.
func (s Sandbox) SupervisorPod(crUID string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.SupervisorPodName(), Namespace: s.Namespace(),
			Labels: map[string]string{
				"openshell.ai/managed-by":    "openshell",
				"openshell.ai/sandbox-id":    s.ID,
				"openshell.ai/component":     "supervisor",
				"openshell.ai/boundary-pair": strings.ToLower(s.ID),
				"openshell.ai/boundary-role": "supervisor",
				"openshell.ai/gateway-id":    s.Gateway,
			},
			Annotations:     map[string]string{"openshell.ai/sandbox-id": s.ID},
			OwnerReferences: []metav1.OwnerReference{s.ownerRef(crUID, false)},
		},
		Spec: corev1.PodSpec{
			NodeName:   s.Node,
			Containers: []corev1.Container{{Name: ContainerSupervisor, Image: s.SupervisorImage}},
		},
	}
}

// PVC returns the workspace claim, controller-owned by the CR with crUID.
func (s Sandbox) PVC(crUID string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.PVCName(), Namespace: s.Namespace(),
			Labels:          map[string]string{"agents.x-k8s.io/sandbox-name-hash": nameHash(s.CRName())},
			OwnerReferences: []metav1.OwnerReference{s.ownerRef(crUID, true)},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse("1Gi"),
			}},
		},
	}
}

// nameHash mimics the Agent Sandbox controller's name-hash label (an FNV-1a
// of the CR name, hex).
func nameHash(name string) string {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h ^= uint32(name[i])
		h *= 16777619
	}
	return fmt.Sprintf("%08x", h)
}
