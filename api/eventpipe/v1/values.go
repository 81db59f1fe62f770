package eventpipev1

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
	// Disk full is CategoryNodeStorage.
	CategoryRuntimeStore = "runtime_store"
	CategoryUnknown      = "unknown"
)

// Values of PullFailure.disposition.
const (
	DispositionRetrying   = "retrying"
	DispositionPersistent = "persistent"
)

// Values of PullFailure.source.
const (
	PullSourceEvent     = "event"
	PullSourcePodStatus = "pod_status"
)

// Gateway progress steps and labels (openshell.progress.* keys).
const (
	StepRequestingSandbox = "requesting_sandbox"
	StepPullingImage      = "pulling_image"
	StepStartingSandbox   = "starting_sandbox"
)
