package kwire

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Object shapes from the image-pull seed (/work/shared/seeds: OpenShell
// 0.1.6, managed mode, Helm-default gateway id "openshell") and the
// OpenShell facts (labels, annotations, container names).
const (
	seedNS        = "openshell-openshell-repro"
	seedID        = "2ff21e26-1a7b-49a2-a640-14ae153f93ea"
	seedCRUID     = "876414ec-8379-42b9-8deb-a047f4214891"
	seedPodUID    = "d9710c1d-2d01-4940-95b4-71b07f1976ff"
	seedImage     = "docker.io/library/busybox:0.0.0-does-not-exist"
	seedBootImage = "ghcr.io/nvidia/openshell/sandbox:0.1.6"
	seedSupImage  = "ghcr.io/nvidia/openshell/supervisor:0.1.6"
	seedNode      = "osrepro-control-plane"
	seedBackOff   = `Back-off pulling image "docker.io/library/busybox:0.0.0-does-not-exist": ErrImagePull: rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": failed to resolve reference "docker.io/library/busybox:0.0.0-does-not-exist": docker.io/library/busybox:0.0.0-does-not-exist: not found`
	seedFailed    = `Failed to pull image "docker.io/library/busybox:0.0.0-does-not-exist": rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": failed to resolve reference "docker.io/library/busybox:0.0.0-does-not-exist": docker.io/library/busybox:0.0.0-does-not-exist: not found`
	seedErrPull   = `rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": failed to resolve reference "docker.io/library/busybox:0.0.0-does-not-exist": docker.io/library/busybox:0.0.0-does-not-exist: not found`
	seedCRIO      = `rpc error: code = Unknown desc = initializing source docker://quay.io/okd/scos-content@sha256:637140d5811ea5f3ebbf1f0185ef4e98085236684337f2aabc4fa6bbffe1b305: reading manifest sha256:637140d5811ea5f3ebbf1f0185ef4e98085236684337f2aabc4fa6bbffe1b305 in quay.io/okd/scos-content: manifest unknown`
	podNameAnn    = "agents.x-k8s.io/pod-name"
)

var (
	t0         = time.Date(2026, 10, 29, 10, 10, 36, 0, time.UTC)
	tNanos     = time.Date(2026, 10, 29, 10, 11, 2, 123456789, time.UTC)
	keepPrefix = []string{"openshell.ai/", "openshell.io/", "agents.x-k8s.io/"}
	yes, no    = true, false
)

func crOwner(controller *bool) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: "img-missing", UID: seedCRUID, Controller: controller, BlockOwnerDeletion: &yes}}
}

// managedFields makes metadata as heavy as the API server's: skipped by kwire.
func managedFields() []metav1.ManagedFieldsEntry {
	return []metav1.ManagedFieldsEntry{{
		Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &metav1.Time{Time: t0},
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:lastTransitionTime":{}}}}}`)},
		Subresource: "status",
	}}
}

func kubeletEvent(name, pod, fieldPath, typ, reason, msg string, count int32) *corev1.Event {
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: seedNS, Name: name, UID: types.UID("ev-" + name), ResourceVersion: "5310",
			CreationTimestamp: metav1.NewTime(t0), ManagedFields: managedFields()},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: seedNS, Name: pod, UID: seedPodUID, APIVersion: "v1", ResourceVersion: "5302", FieldPath: fieldPath},
		Reason:         reason, Message: msg, Source: corev1.EventSource{Component: "kubelet", Host: seedNode},
		FirstTimestamp: metav1.NewTime(t0), LastTimestamp: metav1.NewTime(t0.Add(95 * time.Second)), Count: count, Type: typ,
		ReportingController: "kubelet", ReportingInstance: seedNode,
	}
}

// eventFixtures are named core/v1 Events covering every field DecodeEvent reads.
func eventFixtures() map[string]*corev1.Event {
	big := strings.Repeat("x", 1<<20-3) + "end"
	evs := map[string]*corev1.Event{
		"pulling": kubeletEvent("img-missing.18a2f0c1a1", "img-missing", "spec.initContainers{workspace-init}", "Normal", "Pulling",
			`Pulling image "docker.io/library/busybox:0.0.0-does-not-exist"`, 1),
		"failed":     kubeletEvent("img-missing.18a2f0c1a2", "img-missing", "spec.initContainers{workspace-init}", "Warning", "Failed", seedFailed, 3),
		"errpull":    kubeletEvent("img-missing.18a2f0c1a3", "img-missing", "spec.initContainers{workspace-init}", "Warning", "Failed", "Error: ErrImagePull", 3),
		"backoff":    kubeletEvent("img-missing.18a2f0c1a4", "img-missing", "spec.initContainers{workspace-init}", "Normal", "BackOff", seedBackOff, 12),
		"crio":       kubeletEvent("scos.18a2f0c1a5", "scos", "spec.containers{agent}", "Warning", "Failed", seedCRIO, 1),
		"unicode":    kubeletEvent("u.1", "img-missing", "spec.containers{agent}", "Warning", "Failed", "échec: 拉取镜像失败 🚫 \"ghcr.io/ø/ü:1\"", 2),
		"invalidutf": kubeletEvent("u.2", "img-missing", "spec.containers{agent}", "Warning", "Failed", "bad \xff\xfe\x80 bytes \xc3", 2),
		"big":        kubeletEvent("big.1", "img-missing", "spec.containers{agent}", "Warning", "Failed", big, 1),
		"empty":      {},
		"zero-times": {ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "z", UID: "z-uid", ResourceVersion: "7"}, Reason: "Created", Type: "Normal"},
		"pre-1970": {ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "old", UID: "old-uid", ResourceVersion: "8"},
			FirstTimestamp: metav1.NewTime(time.Unix(-86400*365, 0)), LastTimestamp: metav1.NewTime(time.Unix(-1, 0)),
			EventTime: metav1.NewMicroTime(time.Unix(-5, 999999999)), Count: -3},
		// Written through events.k8s.io by the Agent Sandbox controller:
		// eventTime set, no first/lastTimestamp, reporting fields only.
		"events.k8s.io": {
			ObjectMeta: metav1.ObjectMeta{Namespace: seedNS, Name: "img-missing.18a2f0c2b7e4f001", UID: "ev-sbx-1", ResourceVersion: "5333",
				Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"c": "d"}},
			InvolvedObject: corev1.ObjectReference{Kind: "Sandbox", Namespace: seedNS, Name: "img-missing", UID: seedCRUID, APIVersion: "agents.x-k8s.io/v1beta1"},
			Reason:         "DependenciesNotReady", Message: `Pod exists with phase: Pending; init container "workspace-init" is waiting: ImagePullBackOff`,
			EventTime: metav1.NewMicroTime(tNanos), Type: "Warning", Action: "Reconcile",
			ReportingController: "agents.x-k8s.io/sandbox-controller", ReportingInstance: "agent-sandbox-controller-7d9f-abcde",
			Related: &corev1.ObjectReference{Kind: "Pod", Namespace: seedNS, Name: "img-missing"},
		},
		"series": {
			ObjectMeta:     metav1.ObjectMeta{Namespace: seedNS, Name: "img-missing.18a2f0c2b7e4f002", UID: "ev-sbx-2", ResourceVersion: "5400"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: seedNS, Name: "img-missing", UID: seedPodUID, APIVersion: "v1", FieldPath: "spec.containers{agent}"},
			Reason:         "BackOff", Message: seedBackOff, Type: "Warning", Count: 1, Action: "Pulling",
			EventTime: metav1.NewMicroTime(tNanos), Series: &corev1.EventSeries{Count: 17, LastObservedTime: metav1.NewMicroTime(tNanos.Add(31*time.Minute + 987654321))},
			ReportingController: "kubelet", ReportingInstance: seedNode,
		},
		"series-empty": {
			ObjectMeta: metav1.ObjectMeta{Namespace: seedNS, Name: "s0", UID: "s0"}, Count: 4, Series: &corev1.EventSeries{},
		},
		"source-and-reporting": {
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "n.1", UID: "n1"}, Count: 2,
			Source:              corev1.EventSource{Component: "default-scheduler"},
			ReportingController: "other", ReportingInstance: "host-from-reporting",
			FirstTimestamp: metav1.NewTime(tNanos), LastTimestamp: metav1.NewTime(tNanos),
		},
	}
	return evs
}
