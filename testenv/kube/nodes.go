package kube

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NodeSpec is a Node as a kubelet registers it: what kube-scheduler places
// pods by (capacity, labels, taints).
type NodeSpec struct {
	Name   string
	CPU    string // capacity, e.g. "4"
	Memory string // capacity, e.g. "8Gi"
	Pods   int    // capacity in pods; 0 means 110, the kubelet's default
	Labels map[string]string
	Taints []corev1.Taint
}

// RegisterNode creates a Ready Node the way a kubelet registers itself
// (the object, then its status), for clusters without a kubelet: the
// scheduler's decisions on it are real, but nothing runs the pods bound to
// it, so no container Event follows Scheduled. An existing node of that
// name is left as it is.
func RegisterNode(ctx context.Context, cs kubernetes.Interface, spec NodeSpec) error {
	if spec.Name == "" || spec.CPU == "" || spec.Memory == "" {
		return fmt.Errorf("register node: name, cpu and memory are required (got %+v)", spec)
	}
	cpu, err := resource.ParseQuantity(spec.CPU)
	if err != nil {
		return fmt.Errorf("register node %s: cpu: %w", spec.Name, err)
	}
	mem, err := resource.ParseQuantity(spec.Memory)
	if err != nil {
		return fmt.Errorf("register node %s: memory: %w", spec.Name, err)
	}
	pods := spec.Pods
	if pods == 0 {
		pods = 110
	}
	labels := map[string]string{
		"kubernetes.io/hostname": spec.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
	}
	for k, v := range spec.Labels {
		labels[k] = v
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: spec.Taints},
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", spec.Name, err)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    cpu,
		corev1.ResourceMemory: mem,
		corev1.ResourcePods:   resource.MustParse(strconv.Itoa(pods)),
	}
	now := metav1.NewTime(time.Now())
	created.Status = corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: spec.Name}},
		NodeInfo:  corev1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", KubeletVersion: "v1.37.2"},
	}
	updated, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("register node %s: status: %w", spec.Name, err)
	}
	// The TaintNodesByCondition admission plugin gives every new node the
	// not-ready taint; the node lifecycle controller lifts it once the
	// kubelet reports Ready. That controller is not run (it would mark a
	// node without heartbeats unreachable), so its step is done here.
	var taints []corev1.Taint
	for _, t := range updated.Spec.Taints {
		if t.Key != corev1.TaintNodeNotReady {
			taints = append(taints, t)
		}
	}
	if len(taints) != len(updated.Spec.Taints) {
		updated.Spec.Taints = taints
		if _, err := cs.CoreV1().Nodes().Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("register node %s: lift the not-ready taint: %w", spec.Name, err)
		}
	}
	return nil
}
