package enrich

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Config is what a user writes (YAML) to tune enrich. Every OpenShell
// identifier that attribution relies on is a field here, defaulting to both
// generations documented in docs/openshell.md, so a renamed label or
// container does not need a new release.
type Config struct {
	// Cluster is stamped on every occurrence.
	Cluster string `json:"cluster" yaml:"cluster"`
	// MaxMessageBytes bounds Occurrence.message; longer messages are cut at a
	// UTF-8 boundary and end with TruncationMarker. Default 4096.
	MaxMessageBytes int `json:"max_message_bytes" yaml:"max_message_bytes"`
	// PersistentAfter is how many failures (for a cause retrying will not
	// fix) make a pull failure "persistent". Default 3.
	PersistentAfter int `json:"persistent_after" yaml:"persistent_after"`
	// PersistentWindow: failures further apart than this start a new count.
	// Default 10m.
	PersistentWindow time.Duration `json:"persistent_window" yaml:"persistent_window"`
	// TrackerCapacity bounds the per-(pod, container) pull state; the least
	// recently used entry is evicted. Default 50000.
	TrackerCapacity int `json:"tracker_capacity" yaml:"tracker_capacity"`
	// Rules holds the OpenShell identifiers attribution reads.
	Rules Rules `json:"rules" yaml:"rules"`
}

// Rules are the label/annotation keys, name prefixes and container names of
// the attribution rules. Lists are tried in order (newer generation first).
type Rules struct {
	// Annotation/label keys carrying the sandbox id, name, workspace and
	// gateway id, on Sandbox CRs, pods and managed namespaces.
	SandboxIDKeys   []string `json:"sandbox_id_keys" yaml:"sandbox_id_keys"`
	SandboxNameKeys []string `json:"sandbox_name_keys" yaml:"sandbox_name_keys"`
	WorkspaceKeys   []string `json:"workspace_keys" yaml:"workspace_keys"`
	GatewayIDKeys   []string `json:"gateway_id_keys" yaml:"gateway_id_keys"`
	// BoundaryPairLabels carry the sandbox id (lowercase) on newer pods.
	BoundaryPairLabels []string `json:"boundary_pair_labels" yaml:"boundary_pair_labels"`
	// SupervisorLabels mark a supervisor pod (key=value), in addition to
	// SupervisorPodPrefix.
	SupervisorLabels map[string]string `json:"supervisor_labels" yaml:"supervisor_labels"`
	// SupervisorPodPrefix: a Pod named <prefix><uuid> is the supervisor of
	// sandbox <uuid> (kind Pod only: Secrets share the prefix).
	SupervisorPodPrefix string `json:"supervisor_pod_prefix" yaml:"supervisor_pod_prefix"`
	// SandboxGroup and SandboxKind identify the Agent Sandbox CR.
	SandboxGroup string `json:"sandbox_group" yaml:"sandbox_group"`
	SandboxKind  string `json:"sandbox_kind" yaml:"sandbox_kind"`
	// PodNameAnnotation on a CR overrides the workload pod's name.
	PodNameAnnotation string `json:"pod_name_annotation" yaml:"pod_name_annotation"`
	// PVCPrefix: a PVC named <prefix><CR name> belongs to that CR.
	PVCPrefix string `json:"pvc_prefix" yaml:"pvc_prefix"`
	// SharedNamespaces hold sandboxes of many workspaces, named
	// <workspace><SharedSeparator><name>.
	SharedNamespaces []string `json:"shared_namespaces" yaml:"shared_namespaces"`
	SharedSeparator  string   `json:"shared_separator" yaml:"shared_separator"`
	// ManagedNamespaceLabels mark a managed workspace namespace (key=value);
	// its workspace comes from WorkspaceKeys. A namespace that is neither
	// shared nor managed is an operator-mode namespace named after its
	// workspace.
	ManagedNamespaceLabels map[string]string `json:"managed_namespace_labels" yaml:"managed_namespace_labels"`
	// Containers whose image is the sandbox's workload image, the supervisor
	// image, or the bootstrap image. Other init containers are "init".
	WorkloadImageContainers   []string `json:"workload_image_containers" yaml:"workload_image_containers"`
	SupervisorImageContainers []string `json:"supervisor_image_containers" yaml:"supervisor_image_containers"`
	BootstrapImageContainers  []string `json:"bootstrap_image_containers" yaml:"bootstrap_image_containers"`
	// ProgressContainer is the workload container whose Pulled completes
	// pulling_image and whose Started completes starting_sandbox.
	ProgressContainer string `json:"progress_container" yaml:"progress_container"`
}

// TruncationMarker ends a message cut at Config.MaxMessageBytes.
const TruncationMarker = "…[truncated]"

// NewDefaultConfig returns the defaults: both OpenShell generations, the
// Helm-default shared namespace "openshell".
func NewDefaultConfig() Config {
	return Config{
		MaxMessageBytes:  4096,
		PersistentAfter:  3,
		PersistentWindow: 10 * time.Minute,
		TrackerCapacity:  50000,
		Rules: Rules{
			SandboxIDKeys: []string{"openshell.ai/sandbox-id", "openshell.io/sandbox-id"},
			// Only the sandbox id has an older openshell.io/ form
			// (docs/openshell.md); add others here if a release needs them.
			SandboxNameKeys:     []string{"openshell.ai/sandbox-name"},
			WorkspaceKeys:       []string{"openshell.ai/sandbox-workspace"},
			GatewayIDKeys:       []string{"openshell.ai/gateway-id"},
			BoundaryPairLabels:  []string{"openshell.ai/boundary-pair"},
			SupervisorLabels:    map[string]string{"openshell.ai/component": "supervisor", "openshell.ai/boundary-role": "supervisor"},
			SupervisorPodPrefix: "os-supervisor-",
			SandboxGroup:        "agents.x-k8s.io",
			SandboxKind:         "Sandbox",
			PodNameAnnotation:   "agents.x-k8s.io/pod-name",
			PVCPrefix:           "workspace-",
			SharedNamespaces:    []string{"openshell"},
			SharedSeparator:     "--",
			ManagedNamespaceLabels: map[string]string{
				"openshell.ai/managed-by": "openshell",
			},
			WorkloadImageContainers:   []string{"agent", "workspace-init"},
			SupervisorImageContainers: []string{"supervisor", "openshell-supervisor-install"},
			BootstrapImageContainers:  []string{"openshell-sandbox-bootstrap"},
			ProgressContainer:         "agent",
		},
	}
}

// Validate reports every problem, each with its YAML path.
func (c Config) Validate() error {
	var errs []error
	add := func(path, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, a...)))
	}
	if c.MaxMessageBytes < len(TruncationMarker)+16 {
		add("max_message_bytes", "must be at least %d, got %d", len(TruncationMarker)+16, c.MaxMessageBytes)
	}
	if c.PersistentAfter < 1 {
		add("persistent_after", "must be at least 1, got %d", c.PersistentAfter)
	}
	if c.PersistentWindow <= 0 {
		add("persistent_window", "must be positive, got %s", c.PersistentWindow)
	}
	if c.TrackerCapacity < 1 {
		add("tracker_capacity", "must be at least 1, got %d", c.TrackerCapacity)
	}
	r := c.Rules
	nonEmptyList := func(path string, l []string) {
		if len(l) == 0 {
			add(path, "must list at least one key")
		}
		for i, s := range l {
			if strings.TrimSpace(s) == "" {
				add(fmt.Sprintf("%s[%d]", path, i), "must not be empty")
			}
		}
	}
	nonEmptyList("rules.sandbox_id_keys", r.SandboxIDKeys)
	nonEmptyList("rules.sandbox_name_keys", r.SandboxNameKeys)
	nonEmptyList("rules.workspace_keys", r.WorkspaceKeys)
	nonEmptyList("rules.gateway_id_keys", r.GatewayIDKeys)
	for i, s := range r.BoundaryPairLabels {
		if strings.TrimSpace(s) == "" {
			add(fmt.Sprintf("rules.boundary_pair_labels[%d]", i), "must not be empty")
		}
	}
	for k := range r.SupervisorLabels {
		if strings.TrimSpace(k) == "" {
			add("rules.supervisor_labels", "keys must not be empty")
		}
	}
	for k := range r.ManagedNamespaceLabels {
		if strings.TrimSpace(k) == "" {
			add("rules.managed_namespace_labels", "keys must not be empty")
		}
	}
	if r.SandboxGroup == "" {
		add("rules.sandbox_group", "must not be empty")
	}
	if r.SandboxKind == "" {
		add("rules.sandbox_kind", "must not be empty")
	}
	if r.SharedSeparator == "" && len(r.SharedNamespaces) > 0 {
		add("rules.shared_separator", "must not be empty when rules.shared_namespaces is set")
	}
	if r.ProgressContainer == "" {
		add("rules.progress_container", "must not be empty")
	}
	return errors.Join(errs...)
}
