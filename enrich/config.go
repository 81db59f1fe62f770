package enrich

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Config is what a user writes (YAML) to tune enrich. Every OpenShell
// identifier that attribution relies on is a field here, defaulting to both
// generations documented in openshell-facts.md, so a renamed label or
// container does not need a new release.
type Config struct {
	// Cluster is stamped on every occurrence.
	Cluster string `json:"cluster" yaml:"cluster"`
	// MaxMessageBytes bounds Occurrence.message; longer messages are cut at a
	// UTF-8 boundary and end with TruncationMarker. Default 4096.
	MaxMessageBytes int `json:"maxMessageBytes" yaml:"maxMessageBytes"`
	// PersistentAfter is how many failures (for a cause retrying will not
	// fix) make a pull failure "persistent". Default 3.
	PersistentAfter int `json:"persistentAfter" yaml:"persistentAfter"`
	// PersistentWindow: failures further apart than this start a new count.
	// Default 10m.
	PersistentWindow time.Duration `json:"persistentWindow" yaml:"persistentWindow"`
	// TrackerCapacity bounds the per-(pod, container) pull state; the least
	// recently used entry is evicted. Default 50000.
	TrackerCapacity int `json:"trackerCapacity" yaml:"trackerCapacity"`
	// Rules holds the OpenShell identifiers attribution reads.
	Rules Rules `json:"rules" yaml:"rules"`
}

// Rules are the label/annotation keys, name prefixes and container names of
// the attribution rules. Lists are tried in order (newer generation first).
type Rules struct {
	// Annotation/label keys carrying the sandbox id, name, workspace and
	// gateway id, on Sandbox CRs, pods and managed namespaces.
	SandboxIDKeys   []string `json:"sandboxIDKeys" yaml:"sandboxIDKeys"`
	SandboxNameKeys []string `json:"sandboxNameKeys" yaml:"sandboxNameKeys"`
	WorkspaceKeys   []string `json:"workspaceKeys" yaml:"workspaceKeys"`
	GatewayIDKeys   []string `json:"gatewayIDKeys" yaml:"gatewayIDKeys"`
	// BoundaryPairLabels carry the sandbox id (lowercase) on newer pods.
	BoundaryPairLabels []string `json:"boundaryPairLabels" yaml:"boundaryPairLabels"`
	// SupervisorLabels mark a supervisor pod (key=value), in addition to
	// SupervisorPodPrefix.
	SupervisorLabels map[string]string `json:"supervisorLabels" yaml:"supervisorLabels"`
	// SupervisorPodPrefix: a Pod named <prefix><uuid> is the supervisor of
	// sandbox <uuid> (kind Pod only: Secrets share the prefix).
	SupervisorPodPrefix string `json:"supervisorPodPrefix" yaml:"supervisorPodPrefix"`
	// SandboxGroup and SandboxKind identify the Agent Sandbox CR.
	SandboxGroup string `json:"sandboxGroup" yaml:"sandboxGroup"`
	SandboxKind  string `json:"sandboxKind" yaml:"sandboxKind"`
	// PodNameAnnotation on a CR overrides the workload pod's name.
	PodNameAnnotation string `json:"podNameAnnotation" yaml:"podNameAnnotation"`
	// PVCPrefix: a PVC named <prefix><CR name> belongs to that CR.
	PVCPrefix string `json:"pvcPrefix" yaml:"pvcPrefix"`
	// SharedNamespaces hold sandboxes of many workspaces, named
	// <workspace><SharedSeparator><name>.
	SharedNamespaces []string `json:"sharedNamespaces" yaml:"sharedNamespaces"`
	SharedSeparator  string   `json:"sharedSeparator" yaml:"sharedSeparator"`
	// ManagedNamespaceLabels mark a managed workspace namespace (key=value);
	// its workspace comes from WorkspaceKeys. A namespace that is neither
	// shared nor managed is an operator-mode namespace named after its
	// workspace.
	ManagedNamespaceLabels map[string]string `json:"managedNamespaceLabels" yaml:"managedNamespaceLabels"`
	// Containers whose image is the sandbox's workload image, the supervisor
	// image, or the bootstrap image. Other init containers are "init".
	WorkloadImageContainers   []string `json:"workloadImageContainers" yaml:"workloadImageContainers"`
	SupervisorImageContainers []string `json:"supervisorImageContainers" yaml:"supervisorImageContainers"`
	BootstrapImageContainers  []string `json:"bootstrapImageContainers" yaml:"bootstrapImageContainers"`
	// ProgressContainer is the workload container whose Pulled completes
	// pulling_image and whose Started completes starting_sandbox.
	ProgressContainer string `json:"progressContainer" yaml:"progressContainer"`
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
			// (openshell-facts.md); add others here if a release needs them.
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
		add("maxMessageBytes", "must be at least %d, got %d", len(TruncationMarker)+16, c.MaxMessageBytes)
	}
	if c.PersistentAfter < 1 {
		add("persistentAfter", "must be at least 1, got %d", c.PersistentAfter)
	}
	if c.PersistentWindow <= 0 {
		add("persistentWindow", "must be positive, got %s", c.PersistentWindow)
	}
	if c.TrackerCapacity < 1 {
		add("trackerCapacity", "must be at least 1, got %d", c.TrackerCapacity)
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
	nonEmptyList("rules.sandboxIDKeys", r.SandboxIDKeys)
	nonEmptyList("rules.sandboxNameKeys", r.SandboxNameKeys)
	nonEmptyList("rules.workspaceKeys", r.WorkspaceKeys)
	nonEmptyList("rules.gatewayIDKeys", r.GatewayIDKeys)
	for i, s := range r.BoundaryPairLabels {
		if strings.TrimSpace(s) == "" {
			add(fmt.Sprintf("rules.boundaryPairLabels[%d]", i), "must not be empty")
		}
	}
	for k := range r.SupervisorLabels {
		if strings.TrimSpace(k) == "" {
			add("rules.supervisorLabels", "keys must not be empty")
		}
	}
	for k := range r.ManagedNamespaceLabels {
		if strings.TrimSpace(k) == "" {
			add("rules.managedNamespaceLabels", "keys must not be empty")
		}
	}
	if r.SandboxGroup == "" {
		add("rules.sandboxGroup", "must not be empty")
	}
	if r.SandboxKind == "" {
		add("rules.sandboxKind", "must not be empty")
	}
	if r.SharedSeparator == "" && len(r.SharedNamespaces) > 0 {
		add("rules.sharedSeparator", "must not be empty when rules.sharedNamespaces is set")
	}
	if r.ProgressContainer == "" {
		add("rules.progressContainer", "must not be empty")
	}
	return errors.Join(errs...)
}
