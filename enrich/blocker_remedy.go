package enrich

import (
	"strconv"
	"strings"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// BlockerFix is the short next step for a blocker (Blocker.fix): what to
// change, naming the object and container. It reads only b's kind, cause,
// object, container, detail and exit code.
func BlockerFix(b *eventpipev1.Blocker) string {
	if b == nil {
		return ""
	}
	obj, ctr := b.GetObject(), b.GetContainer()
	name := objectName(obj)
	switch b.GetCause() {
	case eventpipev1.BlockerInsufficientResources:
		return "no node has room for the pod's requests (" + b.GetDetail() + "): lower the sandbox's CPU, memory or GPU requests, or add capacity to the cluster"
	case eventpipev1.BlockerUntoleratedTaint:
		return "the nodes that could run the pod carry a taint it does not tolerate" + taintOf(b.GetDetail()) + ": add the toleration to the sandbox's pod template, or untaint a node"
	case eventpipev1.BlockerNodeSelectorMismatch:
		return "no node matches the pod's node selector or node affinity: fix the selector in the sandbox's pod template, or label a node to match"
	case eventpipev1.BlockerPodAffinity:
		return "the pod's affinity or anti-affinity rules exclude every node: relax the rules or add nodes"
	case eventpipev1.BlockerTopologySpread:
		if containsFold(b.GetDetail(), "missing required label") {
			return "the nodes lack the topology key the pod's topology spread constraints name: label the nodes with that key, or fix the topologyKey in the sandbox's pod template"
		}
		return "placing the pod on any node would break its topology spread constraints (maxSkew): add nodes in the zone or domain that is short, raise maxSkew, or set whenUnsatisfiable: ScheduleAnyway in the sandbox's pod template"
	case eventpipev1.BlockerUnboundPVC:
		if containsFold(b.GetDetail(), "bound to non-existent") {
			return "a PersistentVolumeClaim the pod needs is bound to a PersistentVolume that no longer exists (the claim is Lost): restore the volume, or delete the claim so that a new one is provisioned (its data is gone)"
		}
		return "a PersistentVolumeClaim the pod needs is not bound: check the workspace claim's events (StorageClass, provisioner)"
	case eventpipev1.BlockerVolumeNodeAffinity:
		return "the pod's volume can only be used on other nodes or zones: schedule the sandbox where its volume is, or use a StorageClass with WaitForFirstConsumer"
	case eventpipev1.BlockerNodesUnavailable:
		return "the nodes are cordoned or not ready: uncordon or repair a node"
	case eventpipev1.BlockerNoStorageClass:
		return "the workspace claim " + name + " names no StorageClass and the cluster has no default: mark a StorageClass as default (storageclass.kubernetes.io/is-default-class=true) or set the sandbox's storage class"
	case eventpipev1.BlockerStorageClassNotFound:
		return "StorageClass " + name + " does not exist: create it, or set the sandbox's storage class to one that exists (kubectl get storageclass)"
	case eventpipev1.BlockerProvisioningFailed:
		return "the provisioner could not create the volume" + of(obj) + ": check the provisioner's logs and its cloud permissions"
	case eventpipev1.BlockerAttachFailed:
		return "the volume cannot be attached to the node: if another pod or node still holds it (Multi-Attach), wait for or delete that pod; else check the CSI driver"
	case eventpipev1.BlockerMountTimeout:
		return "kubelet timed out mounting the pod's volumes: look for an earlier FailedMount or FailedAttachVolume that names the cause"
	case eventpipev1.BlockerMountFailed:
		return "mounting a volume failed: check the CSI driver or volume plugin on the node"
	case eventpipev1.BlockerSecretNotFound:
		return "Secret " + name + " does not exist in the sandbox's namespace: create it (e.g. the proxy-auth or TLS secret the gateway expects), or fix the name in the sandbox template"
	case eventpipev1.BlockerConfigMapNotFound:
		return "ConfigMap " + name + " does not exist in the sandbox's namespace: create it, or fix the name in the sandbox template"
	case eventpipev1.BlockerKeyNotFound:
		return obj + " lacks a key the container " + ctr + " reads: add the key, or fix the reference"
	case eventpipev1.BlockerQuotaExceeded:
		return "the namespace's quota" + of(obj) + " refuses the pod: raise the quota, lower the sandbox's requests, or delete unused sandboxes"
	case eventpipev1.BlockerWebhookDenied:
		return "an admission webhook denies the pod (" + b.GetDetail() + "): change the sandbox to satisfy the policy, or ask its owner for an exception"
	case eventpipev1.BlockerWebhookFailed:
		return "an admission webhook cannot be reached, so pods are refused: check the webhook's service and pods"
	case eventpipev1.BlockerPodSecurity:
		return "Pod Security admission refuses the pod (" + b.GetDetail() + "): label the namespace with a level the sandbox needs, or tighten the sandbox's securityContext"
	case eventpipev1.BlockerLimitRange:
		return "the pod's requests or limits are outside the namespace's LimitRange: change the sandbox's resources or the LimitRange"
	case eventpipev1.BlockerServiceAccountMissing:
		return "the pod's ServiceAccount" + of(obj) + " does not exist: create it, or fix the name"
	case eventpipev1.BlockerCrashLoop:
		return "container " + ctr + " keeps exiting and kubelet backs off restarting it: read its logs (kubectl logs --previous -c " + ctr + ")"
	case eventpipev1.BlockerOOMKilled:
		return "container " + ctr + " was killed for exceeding its memory limit: raise the sandbox's memory limit"
	case eventpipev1.BlockerExitError:
		code := ""
		if b.GetHasExitCode() {
			code = " with code " + strconv.Itoa(int(b.GetExitCode()))
		}
		return "container " + ctr + " exits" + code + ": read its logs (kubectl logs --previous -c " + ctr + ")"
	case eventpipev1.BlockerStartFailed:
		if nonRootRefusal(b.GetDetail()) {
			return "kubelet will not start container " + ctr + ": its securityContext requires a non-root user and the image runs as root or as a user name kubelet cannot check (" + b.GetDetail() + "): set runAsUser to a non-zero UID for the container, or use an image whose USER is a numeric non-root UID"
		}
		return "the runtime cannot start container " + ctr + " (" + b.GetDetail() + "): check the image's entrypoint and architecture"
	}
	switch b.GetKind() {
	case eventpipev1.BlockerKindUnschedulable:
		return "the scheduler finds no node for the pod: read the FailedScheduling message"
	case eventpipev1.BlockerKindVolume:
		return "a volume of the pod is not ready: read the claim's and the pod's events"
	case eventpipev1.BlockerKindCreateRefused:
		return "the API server refuses to create the pod: read the controller's FailedCreate message"
	case eventpipev1.BlockerKindContainer:
		return "container " + ctr + " cannot run: read its status and logs"
	}
	return ""
}

// objectName is name of "<Kind>/<name>".
func objectName(obj string) string {
	if i := strings.IndexByte(obj, '/'); i >= 0 {
		return obj[i+1:]
	}
	return obj
}

func of(obj string) string {
	if obj == "" {
		return ""
	}
	return " (" + obj + ")"
}

// taintOf is " ({key: value})" from a scheduler summary, or "".
func taintOf(detail string) string {
	i := strings.IndexByte(detail, '{')
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(detail[i:], '}')
	if j < 0 {
		return ""
	}
	return " (" + detail[i:i+j+1] + ")"
}
