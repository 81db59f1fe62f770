package enrich

import (
	"strconv"
	"strings"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// BlockerFix is the short next step for a blocker (Blocker.fix): what to
// change, naming the object and container. It reads only b's kind, cause,
// object, container, detail and exit code. An unrecognised cause has no
// fix: a guessed one would mislead; the runtime's words are in detail.
func BlockerFix(b *eventpipev1.Blocker) string {
	if b == nil || b.GetCause() == eventpipev1.BlockerUnrecognised {
		return ""
	}
	obj, ctr := b.GetObject(), b.GetContainer()
	name := objectName(obj)
	switch b.GetCause() {
	case eventpipev1.BlockerInsufficientResources:
		if d := b.GetDetail(); !containsFold(d, "insufficient") && !containsFold(d, "too many pods") {
			switch {
			case containsFold(d, "free ports"), containsFold(d, "podfitshostports"):
				return "no node has the host port the pod asks for free (" + d + "): drop hostPort from the sandbox's pod template, or add nodes"
			case containsFold(d, "volume count"), containsFold(d, "volumecount"):
				return "the nodes have reached their limit of attached volumes (" + d + "): add nodes, or free volumes on them"
			case containsFold(d, "free storage"):
				return "no node's storage has room for the pod's volume (" + d + "): lower the workspace size, or add storage capacity"
			case containsFold(d, "allocate all claims"):
				return "no node has the devices the pod's resource claims ask for free (" + d + "): lower the claims, or add devices"
			}
		}
		return "no node has room for the pod's requests (" + b.GetDetail() + "): lower the sandbox's CPU, memory or GPU requests, or add capacity to the cluster"
	case eventpipev1.BlockerUntoleratedTaint:
		return "the nodes that could run the pod carry a taint it does not tolerate" + taintOf(b.GetDetail()) + ": add the toleration to the sandbox's pod template, or untaint a node"
	case eventpipev1.BlockerNodeSelectorMismatch:
		if containsFold(b.GetDetail(), "requested node name") || containsFold(b.GetDetail(), "hostname") {
			return "the pod is pinned to a node (spec.nodeName) that cannot take it: remove nodeName from the sandbox's pod template, or free that node"
		}
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
		if d := b.GetDetail(); containsFold(d, "already bound to a different claim") {
			return "the claim names a PersistentVolume (volumeName) that another claim holds (" + d + "): free the volume, or drop volumeName from the claim"
		} else if containsFold(d, "cannot bind") {
			return "the claim names a PersistentVolume it cannot bind to (" + d + "): fix the claim's volumeName, size, access modes, volume mode or class, or the volume"
		}
		return "a PersistentVolumeClaim the pod needs is not bound: check the workspace claim's events (StorageClass, provisioner)"
	case eventpipev1.BlockerVolumeNodeAffinity:
		return "the pod's volume can only be used on other nodes or zones: schedule the sandbox where its volume is, or use a StorageClass with WaitForFirstConsumer"
	case eventpipev1.BlockerNodesUnavailable:
		if d := b.GetDetail(); containsFold(d, "pressure") || containsFold(d, "out of disk") || containsFold(d, "outofdisk") {
			return "the nodes report memory, disk or PID pressure (" + d + "): free resources on a node, or add nodes"
		}
		return "the nodes are cordoned or not ready: uncordon or repair a node"
	case eventpipev1.BlockerNoStorageClass:
		return "the workspace claim " + name + " names no StorageClass and the cluster has no default: mark a StorageClass as default (storageclass.kubernetes.io/is-default-class=true) or set the sandbox's storage class"
	case eventpipev1.BlockerStorageClassNotFound:
		return "StorageClass " + name + " does not exist: create it, or set the sandbox's storage class to one that exists (kubectl get storageclass)"
	case eventpipev1.BlockerProvisionerWaiting:
		return "the claim has waited more than 5 minutes for provisioner " + name + ", which has not created the volume: check that the CSI driver its StorageClass names is installed and running (its controller pod, CSIDriver object), or use another StorageClass"
	case eventpipev1.BlockerReadinessProbe:
		return "the readiness probe of container " + ctr + " keeps failing, so the sandbox never becomes Ready (" + b.GetDetail() + "): check the probe's path, port and timing in the sandbox's pod template, and the container's logs"
	case eventpipev1.BlockerLivenessProbe:
		return "the liveness probe of container " + ctr + " keeps failing and kubelet restarts it (" + b.GetDetail() + "): check the probe's path and port, raise initialDelaySeconds or failureThreshold if the container starts slowly, and read its logs"
	case eventpipev1.BlockerStartupProbe:
		return "the startup probe of container " + ctr + " keeps failing, so kubelet restarts it before it starts (" + b.GetDetail() + "): raise the startup probe's failureThreshold or periodSeconds, or fix what it checks"
	case eventpipev1.BlockerProvisioningFailed:
		return "the provisioner could not create the volume" + of(obj) + ": check the provisioner's logs and its cloud permissions"
	case eventpipev1.BlockerAttachFailed:
		return "the volume cannot be attached to the node: if another pod or node still holds it (Multi-Attach), wait for or delete that pod; else check the CSI driver"
	case eventpipev1.BlockerMountTimeout:
		return "kubelet timed out mounting the pod's volumes: look for an earlier FailedMount or FailedAttachVolume that names the cause"
	case eventpipev1.BlockerMountFailed:
		if d := b.GetDetail(); containsFold(d, "subpath") {
			return "kubelet cannot prepare a subPath of container " + ctr + "'s volume mounts (" + d + "): check that the subPath exists in the volume, or fix the volumeMount"
		} else if containsFold(d, "object cache") || containsFold(d, " cache: ") || containsFold(d, "not registered") {
			return "kubelet could not read a Secret or ConfigMap of the pod from the API server in time (" + d + "): usually transient; if it persists, check the node's connection to the API server and that the object exists"
		} else if containsFold(d, "cannot find volume") {
			return "container " + ctr + " mounts a volume the pod does not have mounted (" + d + "): look for an earlier FailedMount, or fix the sandbox's volumeMounts"
		}
		return "mounting a volume failed: check the CSI driver or volume plugin on the node"
	case eventpipev1.BlockerSecretNotFound:
		return "Secret " + name + " does not exist in the sandbox's namespace: create it (e.g. the proxy-auth or TLS secret the gateway expects), or fix the name in the sandbox template"
	case eventpipev1.BlockerConfigMapNotFound:
		return "ConfigMap " + name + " does not exist in the sandbox's namespace: create it, or fix the name in the sandbox template"
	case eventpipev1.BlockerKeyNotFound:
		if b.GetKind() == eventpipev1.BlockerKindVolume || ctr == "" {
			// The configmap or secret volume plugin: an item of the volume
			// names the key; the message names neither object nor volume's
			// source.
			return "a Secret or ConfigMap the pod mounts lacks a key its volume's items name (" + b.GetDetail() + "): add the key, or fix the volume's items"
		}
		return obj + " lacks a key the container " + ctr + " reads: add the key, or fix the reference"
	case eventpipev1.BlockerQuotaExceeded:
		switch d := b.GetDetail(); {
		case containsFold(d, "must specify"):
			return "the namespace's quota" + of(obj) + " requires requests or limits the pod does not set (" + d + "): set them on the sandbox's containers, or give the namespace a LimitRange with defaults"
		case containsFold(d, "status unknown for quota"):
			return "the quota" + of(obj) + " has no computed usage yet, so pods are refused: wait for the quota controller (kube-controller-manager), or check that it runs"
		}
		return "the namespace's quota" + of(obj) + " refuses the pod: raise the quota, lower the sandbox's requests, or delete unused sandboxes"
	case eventpipev1.BlockerWebhookDenied:
		if strings.HasPrefix(obj, "AdmissionWebhook/") {
			return "the admission webhook " + name + " denies the pod (" + b.GetDetail() + "): change the sandbox to satisfy its policy, or ask the owner of the webhook configuration that has it (kubectl get validatingwebhookconfigurations,mutatingwebhookconfigurations) for an exception"
		}
		return "an admission webhook denies the pod (" + b.GetDetail() + "): change the sandbox to satisfy the policy, or ask its owner for an exception"
	case eventpipev1.BlockerWebhookFailed:
		if strings.HasPrefix(obj, "AdmissionWebhook/") {
			return "the admission webhook " + name + " cannot be reached, so pods are refused: check the webhook's service and pods"
		}
		return "an admission webhook cannot be reached, so pods are refused: check the webhook's service and pods"
	case eventpipev1.BlockerPodSecurity:
		switch d := b.GetDetail(); {
		case containsFold(d, "security context constraint"), containsFold(d, "securitycontextconstraints"):
			return "OpenShift's SecurityContextConstraints refuse the pod (" + d + "): grant the sandbox's service account an SCC that admits it (oc adm policy add-scc-to-user <scc> -z <serviceaccount>), or tighten the sandbox's securityContext"
		case containsFold(d, "pod security policy"), containsFold(d, "podsecuritypolicy"), containsFold(d, "no providers available"):
			return "PodSecurityPolicy refuses the pod (" + d + "): let the sandbox's service account use a policy that admits it, or tighten the sandbox's securityContext"
		}
		return "Pod Security admission refuses the pod (" + b.GetDetail() + "): label the namespace with a level the sandbox needs, or tighten the sandbox's securityContext"
	case eventpipev1.BlockerLimitRange:
		return "the pod's requests or limits are outside the namespace's LimitRange: change the sandbox's resources or the LimitRange"
	case eventpipev1.BlockerNamespaceTerminating:
		return "namespace " + name + " is being deleted, so no pod can be created in it: create the sandbox in another namespace, or wait until the deletion finishes (check the namespace's finalizers if it hangs)"
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
		if d := b.GetDetail(); containsFold(d, "hook") {
			return "a lifecycle hook of container " + ctr + " fails, so kubelet kills or never starts it (" + d + "): fix the hook's command in the sandbox's pod template, or remove the hook"
		}
		return "the runtime cannot start container " + ctr + " (" + b.GetDetail() + "): check the image's entrypoint and architecture"
	}
	switch b.GetKind() {
	case eventpipev1.BlockerKindUnschedulable:
		return "the scheduler finds no node for the pod: read the FailedScheduling message"
	case eventpipev1.BlockerKindVolume:
		return "a volume of the pod is not ready: read the claim's and the pod's events"
	case eventpipev1.BlockerKindCreateRefused:
		if b.GetSource() == eventpipev1.PullSourceSandboxCondition {
			return "the API server refuses to create the pod: read the message of the Sandbox's Ready condition"
		}
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
