package eventpipev1

import "strings"

// SchemaVersion is the current value of Occurrence.schema_version.
const SchemaVersion = 1

// Values of Occurrence.role.
const (
	RoleWorkload   = "workload"
	RoleSupervisor = "supervisor"
	RoleSandbox    = "sandbox"
	RoleVolume     = "volume"
	RoleNone       = "none"
)

// Values of Occurrence.image_role.
const (
	ImageRoleWorkload   = "workload"
	ImageRoleSupervisor = "supervisor"
	ImageRoleBootstrap  = "bootstrap"
	ImageRoleInit       = "init"
	// ImageRolePodSandbox: the pod sandbox ("pause") image the runtime
	// needs before any container of the pod (FailedCreatePodSandBox).
	ImageRolePodSandbox = "pod_sandbox"
	ImageRoleUnknown    = "unknown"
)

// Values of Occurrence.attribution: which rule tied the event to its sandbox.
const (
	AttributionNone              = "none"
	AttributionSandboxAnnotation = "sandbox_annotation"
	AttributionSandboxLabel      = "sandbox_label"
	AttributionPodAnnotation     = "pod_annotation"
	AttributionPodLabel          = "pod_label"
	AttributionBoundaryPair      = "boundary_pair_label"
	AttributionSupervisorName    = "supervisor_name"
	AttributionOwnerChain        = "owner_chain"
	AttributionPodName           = "pod_name"
	AttributionPVCOwner          = "pvc_owner"
	AttributionPVCName           = "pvc_name"
)

// Values of PullFailure.category.
const (
	CategoryNotFound               = "not_found"
	CategoryUnauthorized           = "unauthorized"
	CategoryNotFoundOrUnauthorized = "not_found_or_unauthorized"
	CategoryRegistryUnreachable    = "registry_unreachable"
	CategoryTLSError               = "tls_error"
	CategoryRateLimited            = "rate_limited"
	CategoryInvalidReference       = "invalid_reference"
	CategoryNeverPull              = "never_pull"
	CategoryPlatformMismatch       = "platform_mismatch"
	CategoryNodeStorage            = "node_storage"
	CategoryPolicyRejected         = "policy_rejected"
	CategoryTimeout                = "timeout"
	// CategoryKubeletThrottled: the kubelet's own pull rate limit
	// (registryPullQPS/registryBurst, "pull QPS exceeded"); no request
	// reached a registry. A registry's 429 is CategoryRateLimited.
	CategoryKubeletThrottled = "kubelet_throttled"
	// CategoryRuntimeStore: the node's image store failed (snapshotter,
	// layer unpack, content store, overlay2 metadata, image inspect): the
	// image exists and was fetched or is present, the node cannot use it.
	// Also the container runtime not answering the kubelet at all (its CRI
	// socket refused or gone, the Docker daemon down): a node-side runtime
	// failure where no registry was asked. Disk full is CategoryNodeStorage.
	// Persistent after repeated failures: a damaged store fails every retry
	// until someone acts on the node.
	CategoryRuntimeStore = "runtime_store"
	// CategoryUnsupportedFormat: the image exists and the registry serves
	// it, but in a manifest format the node's runtime no longer pulls
	// (Docker image manifest v2 schema 1, disabled in containerd 2.0 and
	// removed in 2.1, disabled in Docker Engine 26). Only a rebuilt or
	// re-pushed image (schema 2 or OCI) or another tag fixes it, so it is
	// persistent. Not platform_mismatch (the platform is not the problem)
	// nor policy_rejected (no signature or admission policy is involved).
	// Likewise other forms the runtime refuses: a manifest over
	// containerd's size limit, encrypted layers or a layer media type it
	// has no processor for (zstd on an old containerd), an artifact that
	// is no image (a Helm chart under the name).
	CategoryUnsupportedFormat = "unsupported_format"
	// CategoryUnknown: the message carries no cause at all (a bare
	// "Back-off pulling image", "image pull failed for unknown error").
	CategoryUnknown = "unknown"
	// CategoryUnrecognised: the message carries the runtime's words for a
	// cause, but no rule can say which with confidence: rules that point
	// at different causes matched, only a weak fragment matched, or none
	// did. detail holds the runtime's words; there is no fix, because a
	// guessed one would send the user down the wrong path. Confidence is
	// ConfidenceWeak.
	CategoryUnrecognised = "unrecognised"
)

// PullCategories lists every value of PullFailure.category this build
// writes, so that each consumer (fix texts, the gateway's condition
// reasons) can test that it covers all of them.
var PullCategories = []string{
	CategoryNotFound, CategoryUnauthorized, CategoryNotFoundOrUnauthorized, CategoryRegistryUnreachable,
	CategoryTLSError, CategoryRateLimited, CategoryInvalidReference, CategoryNeverPull,
	CategoryPlatformMismatch, CategoryNodeStorage, CategoryPolicyRejected, CategoryTimeout,
	CategoryKubeletThrottled, CategoryRuntimeStore, CategoryUnsupportedFormat, CategoryUnknown,
	CategoryUnrecognised,
}

// Values of PullFailure.decided_by and Blocker.decided_by: what the
// category or cause was decided from. A cause decided from more evidence
// (the cluster around the failure, the registry's own answer) replaces
// one decided from less, in the same fields of a later occurrence.
const (
	// DecidedByTextRule: a rule over the Event's reason and message (or a
	// container status's reason and message), in enrich.
	DecidedByTextRule = "text_rule"
	// DecidedByClusterContext: what the cluster says around the failure
	// (other Events, other pods' pulls of the image, the pod's pull
	// secrets by name), read by the agent.
	DecidedByClusterContext = "cluster_context"
	// DecidedByRegistry: the registry was asked and its answer decided
	// (the diagnosis is verified).
	DecidedByRegistry = "registry"
)

// Values of PullFailure.confidence and Blocker.confidence: how sure the
// decision is, on a fixed three-step scale.
const (
	// ConfidenceCertain: the evidence names the cause: a structured
	// field (a container's terminated reason, an Event reason that means
	// one cause), a rule specific to one cause that no other rule
	// contradicts, or a registry answer (404 for the manifest, 429).
	ConfidenceCertain = "certain"
	// ConfidenceLikely: one cause is indicated, but by words or evidence
	// other causes can share, or only after a documented precedence
	// between rules that matched together (the node's disk before the
	// registry's "not found"), or by a fallback rule (an Event reason
	// whose message named no cause).
	ConfidenceLikely = "likely"
	// ConfidenceWeak: nothing decides. The category is unknown (the
	// message names no cause) or unrecognised (the words do not decide
	// between causes), and no fix is given.
	ConfidenceWeak = "weak"
)

// Values of PullFailure.disposition.
const (
	DispositionRetrying   = "retrying"
	DispositionPersistent = "persistent"
)

// Values of PullFailure.source and Blocker.source.
const (
	PullSourceEvent     = "event"
	PullSourcePodStatus = "pod_status"
	// PullSourceSandboxCondition: a blocker read from the Sandbox CR's
	// Ready condition (see ReasonSandboxConditionCleared).
	PullSourceSandboxCondition = "sandbox_condition"
)

// The sandbox condition occurrence: the Agent Sandbox controller writes no
// Event when the API server refuses the pod it creates (a ResourceQuota,
// an admission webhook, Pod Security), only the Sandbox's Ready condition:
// status False, reason ReconcilerError, "Error seen: " and the API
// server's words. The agent reads that condition from its Sandbox cache
// and writes an occurrence when it starts saying so (type Warning, the
// condition's reason and message, a create_refused blocker with source
// PullSourceSandboxCondition) and when it stops (type Normal, the new
// Ready reason and message, or ReasonSandboxConditionCleared when the
// condition is gone, and no blocker: readers end the refusal). It is no
// Kubernetes Event: involved_object the CR, reporting_component
// ComponentAgent, event_id "sandbox-condition/<CR uid>/<resourceVersion>".
const (
	SandboxConditionEventIDPrefix = "sandbox-condition/"
	ReasonSandboxConditionCleared = "ReadyConditionRemoved"
)

// IsSandboxCondition reports whether o is the agent's sandbox condition
// occurrence.
func IsSandboxCondition(o *Occurrence) bool {
	return strings.HasPrefix(o.GetEventId(), SandboxConditionEventIDPrefix) && o.GetReportingComponent() == ComponentAgent
}

// The deletion occurrence: the agent writes one when it sees a Sandbox CR
// deleted (by its watch, or by a relisting that no longer has it), so every
// reader learns that the sandbox id is gone and a new sandbox of the same
// name (a new id) is its replacement. It is no Kubernetes Event: its
// event_id is "sandbox-deleted/<CR uid>", involved_object the CR,
// reporting_component ComponentAgent, type Normal, sandbox.deleted_at set.
const (
	ReasonSandboxDeleted = "SandboxDeleted"
	ComponentAgent       = "eventpipe-agent"
	// DeletionEventIDPrefix starts the event_id of a deletion occurrence.
	DeletionEventIDPrefix = "sandbox-deleted/"
)

// IsSandboxDeletion reports whether o is the agent's deletion occurrence
// of its sandbox (not a Kubernetes Event that happens to use the reason).
func IsSandboxDeletion(o *Occurrence) bool {
	return o.GetReason() == ReasonSandboxDeleted && o.GetReportingComponent() == ComponentAgent &&
		o.GetSandbox().GetDeletedAt() != nil
}

// The container readiness occurrence: a readiness or startup probe that
// passes again writes no Event and restarts nothing, so no Started follows
// and nothing else says that the probe's blocker is over. The agent reads
// the container's ready flag from its pod cache and writes one of these
// for a container that has a readiness or startup probe, of a pod
// attributed to a sandbox, when it sees the container ready and did not
// before: ready in a version of the pod after one where it was not, ready
// in a pod it sees for the first time after it started watching (a new
// pod, or every pod of its first listing, since what it reported before
// its start is unknown to it). Never once per pod update. It is no
// Kubernetes Event: type Normal, reason ReasonContainerReady,
// reporting_component ComponentAgent, involved_object the pod with the
// container's field path, attributed like an Event about that container,
// event_id "container-ready/<pod uid>/<pod resourceVersion>/<container>"
// (the same pod version seen twice is the same occurrence). Readers end
// that container's readiness and startup probe blockers with it.
const (
	ReasonContainerReady        = "ContainerReady"
	ContainerReadyEventIDPrefix = "container-ready/"
)

// IsContainerReady reports whether o is the agent's container readiness
// occurrence (not a Kubernetes Event that happens to use the reason).
func IsContainerReady(o *Occurrence) bool {
	return strings.HasPrefix(o.GetEventId(), ContainerReadyEventIDPrefix) && o.GetReportingComponent() == ComponentAgent &&
		o.GetReason() == ReasonContainerReady
}

// The supervisor-image check occurrence: the agent (verify.supervisor)
// writes one when the answer about the OpenShell gateway's supervisor image
// changes: at start, when the image setting changes, when the registry
// answers otherwise. It is no Kubernetes Event and belongs to no sandbox:
// its sandbox carries only gateway_id, its involved_object is the gateway's
// Deployment or StatefulSet, reporting_component ComponentAgent, image the
// supervisor image, image_role ImageRoleSupervisor; type Warning with
// reason ReasonSupervisorImageUnavailable and a pull_failure (the cause
// the registry established) when the image cannot be pulled, type Normal
// with ReasonSupervisorImageVerified when it can. Its event_id starts
// with SupervisorCheckEventIDPrefix. A Follow of a gateway's sandboxes
// carries it, so `eventpipe diagnose --supervisor` shows a bad supervisor
// image before any sandbox failed on it.
const (
	ReasonSupervisorImageUnavailable = "SupervisorImageUnavailable"
	ReasonSupervisorImageVerified    = "SupervisorImageVerified"
	SupervisorCheckEventIDPrefix     = "supervisor-image/"
)

// IsSupervisorCheck reports whether o is the agent's supervisor-image
// check occurrence.
func IsSupervisorCheck(o *Occurrence) bool {
	return strings.HasPrefix(o.GetEventId(), SupervisorCheckEventIDPrefix) && o.GetReportingComponent() == ComponentAgent &&
		o.GetSandbox().GetId() == ""
}

// Gateway progress steps and labels (openshell.progress.* keys).
const (
	StepRequestingSandbox = "requesting_sandbox"
	StepPullingImage      = "pulling_image"
	StepStartingSandbox   = "starting_sandbox"
)

// Values of Blocker.kind: what keeps a sandbox's pod from running, other
// than an image pull.
const (
	BlockerKindUnschedulable = "unschedulable"  // the scheduler finds no node
	BlockerKindVolume        = "volume"         // a volume is not bound, attached or mounted
	BlockerKindCreateRefused = "create_refused" // the API server refuses to create the pod
	BlockerKindContainer     = "container"      // a container cannot start, or starts and dies
)

// Values of Blocker.cause.
const (
	// unschedulable
	BlockerInsufficientResources = "insufficient_resources" // no node has the CPU, memory, GPU or pods free
	BlockerUntoleratedTaint      = "untolerated_taint"      // nodes carry a taint the pod does not tolerate
	BlockerNodeSelectorMismatch  = "node_selector_mismatch" // no node matches the node selector or affinity
	BlockerPodAffinity           = "pod_affinity"           // pod affinity or anti-affinity rules exclude the nodes
	BlockerUnboundPVC            = "unbound_pvc"            // a PersistentVolumeClaim the pod needs is not bound
	BlockerVolumeNodeAffinity    = "volume_node_affinity"   // the pod's volume is tied to other nodes or zones
	BlockerNodesUnavailable      = "nodes_unavailable"      // nodes are cordoned, not ready or under pressure
	// The pod's topologySpreadConstraints leave no node: placing it on any
	// node would exceed a constraint's maxSkew, or the nodes lack the
	// constraint's topology key. Not pod_affinity: the fix is in another
	// field of the pod spec (maxSkew, whenUnsatisfiable) or in adding nodes
	// to the zone or domain that is short.
	BlockerTopologySpread = "topology_spread" // the pod's topology spread constraints leave no node
	// volume
	BlockerNoStorageClass       = "no_storage_class"        // the claim names no class and the cluster has no default
	BlockerStorageClassNotFound = "storage_class_not_found" // the claim names a class that does not exist
	BlockerProvisioningFailed   = "provisioning_failed"     // the provisioner failed to create the volume
	BlockerAttachFailed         = "attach_failed"           // the volume cannot be attached to the node
	BlockerMountTimeout         = "mount_timeout"           // kubelet timed out waiting for the volumes
	BlockerMountFailed          = "mount_failed"            // mounting the volume failed
	BlockerSecretNotFound       = "secret_not_found"        // a Secret the pod mounts or reads does not exist
	BlockerConfigMapNotFound    = "configmap_not_found"     // a ConfigMap the pod mounts or reads does not exist
	// create_refused
	BlockerQuotaExceeded         = "quota_exceeded"          // a ResourceQuota refuses the pod
	BlockerWebhookDenied         = "webhook_denied"          // an admission webhook denies the pod
	BlockerWebhookFailed         = "webhook_failed"          // an admission webhook cannot be called
	BlockerPodSecurity           = "pod_security"            // Pod Security admission (or PSP) refuses the pod
	BlockerLimitRange            = "limit_range"             // the pod's requests or limits are outside a LimitRange
	BlockerServiceAccountMissing = "service_account_missing" // the pod's ServiceAccount does not exist
	// The namespace is being deleted: NamespaceLifecycle admission refuses
	// every new object in it ("unable to create new content in namespace
	// <ns> because it is being terminated") until it is gone. None of the
	// causes above says that, and the fix is elsewhere (another namespace,
	// or the namespace's finalizers).
	BlockerNamespaceTerminating = "namespace_terminating" // the pod's namespace is being deleted
	// container
	BlockerCrashLoop   = "crash_loop"    // the container exits and kubelet backs off restarting it
	BlockerOOMKilled   = "oom_killed"    // the container was killed for exceeding its memory
	BlockerExitError   = "exit_error"    // the container exits with a non-zero code
	BlockerStartFailed = "start_failed"  // the runtime cannot start the container
	BlockerKeyNotFound = "key_not_found" // a key the container reads is missing from a Secret or ConfigMap
	// A probe keeps failing (or cannot run: "probe errored"), so the
	// container never becomes Ready (readiness), is restarted (liveness)
	// or never finishes starting (startup). One failed probe is transient
	// and no blocker: it becomes one once it failed as often as the
	// kubelet's default failureThreshold (3) within the window.
	BlockerReadinessProbe = "readiness_probe_failed"
	BlockerLivenessProbe  = "liveness_probe_failed"
	BlockerStartupProbe   = "startup_probe_failed"
	// volume: the claim waits on an external provisioner (its
	// StorageClass's CSI driver) that has not created the volume for
	// longer than the documented time (enrich: 5 minutes): the
	// provisioner is missing, not running or not registered. Before that,
	// ExternalProvisioning is normal progress and no blocker.
	BlockerProvisionerWaiting = "provisioner_waiting"
	// any kind
	BlockerUnknown = "unknown"
	// BlockerUnrecognised: the kind is known but the words do not decide
	// the cause (rules for different causes matched, or only a weak
	// fragment): detail holds the runtime's words and fix is empty.
	BlockerUnrecognised = "unrecognised"
)

// BlockerCauses lists every value of Blocker.cause this build writes, so
// that each consumer (the gateway's condition reasons) can test that it
// covers all of them.
var BlockerCauses = []string{
	BlockerInsufficientResources, BlockerUntoleratedTaint, BlockerNodeSelectorMismatch, BlockerPodAffinity,
	BlockerUnboundPVC, BlockerVolumeNodeAffinity, BlockerNodesUnavailable, BlockerTopologySpread,
	BlockerNoStorageClass, BlockerStorageClassNotFound, BlockerProvisioningFailed, BlockerAttachFailed,
	BlockerMountTimeout, BlockerMountFailed, BlockerSecretNotFound, BlockerConfigMapNotFound,
	BlockerQuotaExceeded, BlockerWebhookDenied, BlockerWebhookFailed, BlockerPodSecurity,
	BlockerLimitRange, BlockerServiceAccountMissing, BlockerNamespaceTerminating,
	BlockerCrashLoop, BlockerOOMKilled, BlockerExitError, BlockerStartFailed, BlockerKeyNotFound,
	BlockerReadinessProbe, BlockerLivenessProbe, BlockerStartupProbe,
	BlockerProvisionerWaiting, BlockerUnknown, BlockerUnrecognised,
}
