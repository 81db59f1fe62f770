package kwire

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
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
	always     = corev1.ContainerRestartPolicyAlways
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

func heavySpec(c corev1.Container) corev1.Container {
	c.Command = []string{"/bin/sh", "-c"}
	c.Args = []string{"exec /opt/openshell/bin/agent --workspace /workspace"}
	c.Env = []corev1.EnvVar{{Name: "OPENSHELL_SANDBOX_ID", Value: seedID}, {Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "workspace", MountPath: "/workspace"}, {Name: "kube-api-access-x7k2p", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	c.ImagePullPolicy = corev1.PullIfNotPresent
	c.TerminationMessagePath = "/dev/termination-log"
	c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-f", "/tmp/ready"}}}, PeriodSeconds: 2}
	return c
}

func waitingStatus(name, image, reason, msg string, restarts int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Image: image, RestartCount: restarts,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}
}

func completedStatus(name, image string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Image: image, ImageID: image + "@sha256:0123456789abcdef", ContainerID: "containerd://abc",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed",
			StartedAt: metav1.NewTime(t0), FinishedAt: metav1.NewTime(t0.Add(time.Second)), ContainerID: "containerd://abc"}}}
}

func podMeta(name, uid, rv string, labels, ann map[string]string, owners []metav1.OwnerReference) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: seedNS, Name: name, UID: types.UID(uid), ResourceVersion: rv, Labels: labels, Annotations: ann,
		OwnerReferences: owners, CreationTimestamp: metav1.NewTime(t0), Finalizers: []string{"openshell.ai/cleanup"}, ManagedFields: managedFields()}
}

// podFixtures are named Pods covering what DecodePod reads.
func podFixtures() map[string]*corev1.Pod {
	workload := &corev1.Pod{
		ObjectMeta: podMeta("img-missing", seedPodUID, "5302",
			map[string]string{"agents.x-k8s.io/sandbox-name-hash": "6f9c2d1e", "openshell.ai/boundary-pair": seedID, "openshell.ai/boundary-role": "workload", "app.kubernetes.io/name": "sandbox"},
			map[string]string{"openshell.ai/sandbox-id": seedID, "kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("{}", 500)},
			crOwner(&yes)),
		Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{{Name: "workspace", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "workspace-img-missing"}}},
				{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}}},
			InitContainers: []corev1.Container{
				heavySpec(corev1.Container{Name: "openshell-sandbox-bootstrap", Image: seedBootImage}),
				heavySpec(corev1.Container{Name: "openshell-supervisor-install", Image: seedSupImage}),
				heavySpec(corev1.Container{Name: "openshell-network-init", Image: seedSupImage}),
				heavySpec(corev1.Container{Name: "workspace-init", Image: seedImage}),
			},
			Containers: []corev1.Container{
				heavySpec(corev1.Container{Name: "agent", Image: seedImage}),
				heavySpec(corev1.Container{Name: "openshell-supervisor-network", Image: seedSupImage}),
			},
			NodeName: seedNode, ServiceAccountName: "default", RestartPolicy: corev1.RestartPolicyAlways,
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}, {Name: ""}, {Name: "mirror-cred"}},
			Tolerations:      []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodPending,
			Conditions: []corev1.PodCondition{{Type: corev1.PodInitialized, Status: corev1.ConditionFalse, Reason: "ContainersNotInitialized", LastTransitionTime: metav1.NewTime(t0)}},
			HostIP:     "172.18.0.2", PodIP: "10.244.0.17", StartTime: &metav1.Time{Time: t0}, QOSClass: corev1.PodQOSBestEffort,
			// Status order differs from spec order on purpose.
			InitContainerStatuses: []corev1.ContainerStatus{
				waitingStatus("workspace-init", seedImage, "ImagePullBackOff", seedBackOff, 0),
				completedStatus("openshell-supervisor-install", seedSupImage),
				completedStatus("openshell-sandbox-bootstrap", seedBootImage),
				completedStatus("openshell-network-init", seedSupImage),
			},
			ContainerStatuses: []corev1.ContainerStatus{
				waitingStatus("openshell-supervisor-network", seedSupImage, "PodInitializing", "", 0),
				waitingStatus("agent", seedImage, "PodInitializing", "", 0),
			},
		},
	}
	older := workload.DeepCopy()
	older.Name, older.UID = "img-missing-old", "old-pod-uid"
	older.Labels = map[string]string{"openshell.ai/sandbox-id": seedID}
	older.Annotations = map[string]string{"openshell.io/sandbox-id": seedID}
	older.Spec.InitContainers = older.Spec.InitContainers[3:]
	older.Status.InitContainerStatuses = []corev1.ContainerStatus{waitingStatus("workspace-init", seedImage, "ErrImagePull", seedErrPull, 0)}

	return map[string]*corev1.Pod{
		"workload": workload,
		"older":    older,
		"supervisor": {
			ObjectMeta: podMeta("os-supervisor-"+seedID, "sup-pod-uid", "5288",
				map[string]string{"openshell.ai/managed-by": "openshell", "openshell.ai/sandbox-id": seedID, "openshell.ai/component": "supervisor",
					"openshell.ai/boundary-pair": seedID, "openshell.ai/boundary-role": "supervisor", "openshell.ai/gateway-id": "openshell"},
				map[string]string{"openshell.ai/sandbox-id": seedID}, crOwner(nil)),
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "supervisor", Image: seedSupImage}}, NodeName: seedNode},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "supervisor", Ready: true, Started: &yes,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t0)}}}}},
		},
		"crashloop": {
			ObjectMeta: podMeta("crash", "crash-uid", "6001", nil, nil,
				[]metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "crash-7d9f", UID: "rs-uid", Controller: &yes}, {APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "cm-uid", Controller: &no}}),
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example.com/app:1.2"}, {Name: "sidecar", Image: "registry.example.com/side:3"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
				{Name: "app", RestartCount: 5, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 2m40s restarting failed container=app pod=crash_default(crash-uid)"}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}},
				{Name: "sidecar", RestartCount: 1, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}},
				{Name: "not-in-spec", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull"}}},
			}},
		},
		"waiting-no-reason": {
			ObjectMeta: podMeta("w", "w-uid", "1", nil, nil, nil),
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}},
			Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{
				{Name: "c", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Message: "no reason given"}}}}},
		},
		"duplicate-statuses": {
			ObjectMeta: podMeta("d", "d-uid", "2", nil, nil, nil),
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}, {Name: "c", Image: "j"}}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
				{Name: "c", RestartCount: 1, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "m1"}}},
				{Name: "c", RestartCount: 2, LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error"}}},
			}},
		},
		"terminated-empty-reason": {
			ObjectMeta: podMeta("t", "t-uid", "3", nil, nil, nil),
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}},
			Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{
				{Name: "c", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled"}}}}},
		},
		"exit-codes": {
			// A negative exit code (Windows' STATUS_CONTROL_C_EXIT) is a
			// 10-byte varint; a running container keeps its last one.
			ObjectMeta: podMeta("x", "x-uid", "5", nil, nil, nil),
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "neg", Image: "i"}, {Name: "run", Image: "i"}, {Name: "big", Image: "i"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
				{Name: "neg", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: -1073741510, Reason: "Error"}}},
				{Name: "run", RestartCount: 3, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}},
				{Name: "big", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 255, Reason: "Error"}}}}},
		},
		"probed": {
			// Readiness, startup and liveness probes; a sidecar init
			// container with a readiness probe; started unset (nil) on
			// one status, false on another.
			ObjectMeta: podMeta("p", "p-uid", "7", nil, nil, nil),
			Spec: corev1.PodSpec{
				InitContainers: []corev1.Container{{Name: "proxy", Image: "i", RestartPolicy: &always,
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(15021)}}}}},
				Containers: []corev1.Container{
					{Name: "web", Image: "i", ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}}}},
					{Name: "slow", Image: "i", StartupProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/started"}}}, FailureThreshold: 30}},
					{Name: "live", Image: "i", LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/healthy"}}}}},
				},
			},
			Status: corev1.PodStatus{Phase: corev1.PodRunning,
				InitContainerStatuses: []corev1.ContainerStatus{{Name: "proxy", Ready: true, Started: &yes,
					State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t0)}}}},
				ContainerStatuses: []corev1.ContainerStatus{
					{Name: "web", Ready: true, Started: &yes, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t0)}}},
					{Name: "slow", Started: &no, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t0)}}},
					{Name: "live", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t0)}}},
				}},
		},
		"no-status": {
			ObjectMeta: podMeta("n", "n-uid", "4", map[string]string{"openshell.ai/sandbox-id": ""}, nil, nil),
			Spec:       corev1.PodSpec{InitContainers: []corev1.Container{{Name: "i"}}, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		},
		"empty": {},
	}
}

func pvcFixtures() map[string]*corev1.PersistentVolumeClaim {
	sc := "standard"
	return map[string]*corev1.PersistentVolumeClaim{
		"workspace": {
			ObjectMeta: metav1.ObjectMeta{Namespace: seedNS, Name: "workspace-img-missing", UID: "pvc-uid", ResourceVersion: "5290",
				Labels: map[string]string{"openshell.ai/sandbox-id": seedID, "app": "x"}, Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes"},
				OwnerReferences: crOwner(&yes), Finalizers: []string{"kubernetes.io/pvc-protection"}, ManagedFields: managedFields()},
			Spec:   corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &sc, VolumeName: "pvc-1234"},
			Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
		},
		"empty": {},
	}
}

func namespaceFixtures() map[string]*corev1.Namespace {
	return map[string]*corev1.Namespace{
		"managed": {
			ObjectMeta: metav1.ObjectMeta{Name: seedNS, UID: "ns-uid", ResourceVersion: "100", Labels: map[string]string{
				"openshell.ai/managed-by": "openshell", "openshell.ai/gateway-id": "openshell", "openshell.ai/sandbox-workspace": "repro",
				"kubernetes.io/metadata.name": seedNS}, ManagedFields: managedFields()},
			Spec:   corev1.NamespaceSpec{Finalizers: []corev1.FinalizerName{corev1.FinalizerKubernetes}},
			Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive},
		},
		"plain": {ObjectMeta: metav1.ObjectMeta{Name: "default", UID: "d", Labels: map[string]string{"kubernetes.io/metadata.name": "default"}}},
	}
}
