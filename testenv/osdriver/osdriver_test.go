package osdriver

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// The CR carries what the Agent Sandbox controller needs to make the
// workload pod OpenShell makes: the init containers, the agent, the
// sandbox id on the pod, the scheduling asks, and the workspace claim.
func TestDriverCR(t *testing.T) {
	for _, tc := range []struct {
		name     string
		scenario string
		mode     scenario.Mode
		check    func(t *testing.T, s Sandbox, pod corev1.PodTemplateSpec, cr *unstructured.Unstructured)
	}{
		{"seed, managed", "img-missing", scenario.ModeManaged, func(t *testing.T, s Sandbox, pod corev1.PodTemplateSpec, cr *unstructured.Unstructured) {
			if cr.GetNamespace() != "openshell-openshell-img-missing" || cr.GetName() != "img-missing" {
				t.Errorf("CR %s/%s", cr.GetNamespace(), cr.GetName())
			}
			if got := pod.Spec.Containers[0]; got.Name != scenario.ContainerAgent || got.Image != scenario.ImageMissing {
				t.Errorf("agent container %+v", got)
			}
			if len(pod.Spec.InitContainers) != 2 || pod.Spec.InitContainers[1].Name != scenario.ContainerWorkspaceInit || pod.Spec.InitContainers[1].Image != scenario.ImageMissing {
				t.Errorf("init containers %+v", pod.Spec.InitContainers)
			}
			if pod.Annotations["openshell.ai/sandbox-id"] != s.ID || pod.Labels["openshell.ai/sandbox-id"] != s.ID {
				t.Errorf("pod template metadata %+v", pod.ObjectMeta)
			}
			if len(pod.Spec.Tolerations) != 1 || pod.Spec.Tolerations[0].Key != TaintKey {
				t.Errorf("tolerations %+v", pod.Spec.Tolerations)
			}
			claims, _, _ := unstructured.NestedSlice(cr.Object, "spec", "volumeClaimTemplates")
			if len(claims) != 1 {
				t.Errorf("claim templates %v", claims)
			}
		}},
		{"shared names", "no-cpu", scenario.ModeShared, func(t *testing.T, s Sandbox, pod corev1.PodTemplateSpec, cr *unstructured.Unstructured) {
			if cr.GetNamespace() != "openshell" || cr.GetName() != "no-cpu--no-cpu" {
				t.Errorf("CR %s/%s", cr.GetNamespace(), cr.GetName())
			}
			if q := pod.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]; q.String() != "64" {
				t.Errorf("cpu request %s", q.String())
			}
		}},
		{"taint tolerates nothing", "taint", scenario.ModeManaged, func(t *testing.T, s Sandbox, pod corev1.PodTemplateSpec, cr *unstructured.Unstructured) {
			if len(pod.Spec.Tolerations) != 0 {
				t.Errorf("tolerations %+v", pod.Spec.Tolerations)
			}
		}},
		{"selector", "selector", scenario.ModeManaged, func(t *testing.T, s Sandbox, pod corev1.PodTemplateSpec, cr *unstructured.Unstructured) {
			if pod.Spec.NodeSelector[PoolLabel] != PoolMissing {
				t.Errorf("node selector %v", pod.Spec.NodeSelector)
			}
		}},
		{"gpu: request and limit", "no-gpu", scenario.ModeManaged, func(t *testing.T, s Sandbox, pod corev1.PodTemplateSpec, cr *unstructured.Unstructured) {
			r := pod.Spec.Containers[0].Resources
			if q, l := r.Requests["nvidia.com/gpu"], r.Limits["nvidia.com/gpu"]; q.String() != "1" || l.String() != "1" {
				t.Errorf("gpu request %s, limit %s", q.String(), l.String())
			}
		}},
		{"secret volume mounted into the agent", "no-secret", scenario.ModeManaged, func(t *testing.T, s Sandbox, pod corev1.PodTemplateSpec, cr *unstructured.Unstructured) {
			if v := pod.Spec.Volumes; len(v) != 1 || v[0].Secret == nil || v[0].Secret.SecretName != "sandbox-credentials" {
				t.Errorf("volumes %+v", v)
			}
			if m := pod.Spec.Containers[0].VolumeMounts; len(m) != 1 || m[0].Name != "credentials" {
				t.Errorf("agent mounts %+v", m)
			}
		}},
		{"readiness probe", "unready", scenario.ModeManaged, func(t *testing.T, s Sandbox, pod corev1.PodTemplateSpec, cr *unstructured.Unstructured) {
			if p := pod.Spec.Containers[0].ReadinessProbe; p == nil || p.Exec == nil || p.Exec.Command[0] != "cat" {
				t.Errorf("readiness probe %+v", p)
			}
		}},
		{"quota: older generation, no supervisor pod", "quota", scenario.ModeOperator, func(t *testing.T, s Sandbox, pod corev1.PodTemplateSpec, cr *unstructured.Unstructured) {
			if s.HasSupervisorPod() || pod.Annotations["openshell.io/sandbox-id"] != s.ID {
				t.Errorf("generation: supervisor pod %v, annotations %v", s.HasSupervisorPod(), pod.Annotations)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, s, err := Build(tc.scenario, Params{Mode: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			cr, err := s.DriverCR()
			if err != nil {
				t.Fatal(err)
			}
			m, _, _ := unstructured.NestedMap(cr.Object, "spec", "podTemplate")
			var pod corev1.PodTemplateSpec
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &pod); err != nil {
				t.Fatal(err)
			}
			if cr.GetAPIVersion() != "agents.x-k8s.io/v1beta1" || pod.Spec.NodeName != "" {
				t.Errorf("apiVersion %s, nodeName %q", cr.GetAPIVersion(), pod.Spec.NodeName)
			}
			tc.check(t, s, pod, cr)
		})
	}
	if _, _, err := Build("quota", Params{Mode: scenario.ModeShared}); err == nil {
		t.Error("quota in shared mode: no error")
	}
}

// The node's runtime ends the agent of crash-loop and oom by the
// sandbox's image, whatever the pod is called: in shared mode the pod is
// named "<workspace>--<name>", and a workspace of another name must crash
// all the same. rule is the first rule that matches (the CRI's order,
// testenv/build/cri: empty fields match anything, Pod may end in "*").
func TestNodeRulesFollowTheImage(t *testing.T) {
	rule := func(ns, pod, container, image string) kube.ContainerRule {
		for _, r := range Node().Runtime.Containers {
			if r.Namespace != "" && r.Namespace != ns ||
				r.Pod != "" && r.Pod != pod && !(strings.HasSuffix(r.Pod, "*") && strings.HasPrefix(pod, strings.TrimSuffix(r.Pod, "*"))) ||
				r.Container != "" && r.Container != container || r.Image != "" && r.Image != image {
				continue
			}
			return r
		}
		return kube.ContainerRule{}
	}
	for _, p := range []Params{{Mode: scenario.ModeManaged}, {Mode: scenario.ModeShared}, {Mode: scenario.ModeShared, Workspace: "team-a"}, {Mode: scenario.ModeManaged, Workspace: "team-a"}} {
		for _, tc := range []struct {
			scenario string
			code     int32
			oom      bool
		}{{"crash-loop", 1, false}, {"oom", 0, true}, {"healthy", 0, false}} {
			_, s, err := Build(tc.scenario, p)
			if err != nil {
				t.Fatal(err)
			}
			r := rule(s.Namespace(), s.PodName(), scenario.ContainerAgent, s.Image)
			crashes := r.ExitAfter > 0
			if crashes != (tc.scenario != "healthy") || r.ExitCode != tc.code || r.OOMKilled != tc.oom {
				t.Errorf("%s in %s mode, workspace %q (pod %s): the agent's rule %+v", tc.scenario, p.Mode, p.Workspace, s.PodName(), r)
			}
			if init := rule(s.Namespace(), s.PodName(), scenario.ContainerWorkspaceInit, s.Image); init.ExitAfter == 0 || init.ExitCode != 0 || init.OOMKilled {
				t.Errorf("%s: workspace-init (same image) does not finish: %+v", tc.scenario, init)
			}
		}
	}
}
