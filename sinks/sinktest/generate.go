package sinktest

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Seed identifiers from the image-pull reproduction (seeds/
// image-pull-diagnostics-issue.txt).
const (
	SeedSandboxID   = "2ff21e26-1a7b-49a2-a640-14ae153f93ea"
	SeedSandboxName = "img-missing"
	SeedWorkspace   = "repro"
	SeedNamespace   = "openshell-openshell-repro"
	SeedGatewayID   = "openshell"
	SeedPodUID      = "876414ec-8379-42b9-8deb-a047f4214891"
	SeedBadImage    = "docker.io/library/busybox:0.0.0-does-not-exist"
	SeedGoodImage   = "ghcr.io/nvidia/openshell/sandbox:0.1.6"
	SeedSupervisor  = "ghcr.io/nvidia/openshell/supervisor:0.1.6"
	SeedCluster     = "kind-koinon-osrepro"
	SeedNode        = "koinon-osrepro-control-plane"
)

// Generator makes realistic occurrences: the kubelet and scheduler event
// sequence of sandboxes being created in managed namespaces, some of them
// failing to pull their image like the seed scenario, plus unattributed
// events from other namespaces. It is deterministic for a given seed and
// not safe for concurrent use.
type Generator struct {
	rng    *rand.Rand
	prefix string
	n      uint64
	clock  time.Time
	// Sandboxes is the number of distinct sandboxes events are spread over
	// (the first is always the seed sandbox).
	Sandboxes int
}

// NewGenerator returns a generator whose event_ids start with prefix (so
// several scenarios can share a destination and still be told apart).
func NewGenerator(seed uint64, prefix string) *Generator {
	return &Generator{
		rng:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		prefix:    prefix,
		clock:     time.Date(2026, 10, 29, 10, 10, 32, 0, time.UTC),
		Sandboxes: 8,
	}
}

// Prefix is the event_id prefix of this generator's occurrences.
func (g *Generator) Prefix() string { return g.prefix }

func (g *Generator) uuid() string {
	b := make([]byte, 16)
	for i := range b {
		b[i] = byte(g.rng.UintN(256))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func (g *Generator) sandboxID(i int) string {
	if i == 0 {
		return SeedSandboxID
	}
	// Stable per index, independent of the event stream's randomness.
	r := rand.New(rand.NewPCG(uint64(i), 42))
	b := make([]byte, 16)
	for j := range b {
		b[j] = byte(r.UintN(256))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

type template struct {
	typ, reason, component, fieldPath, message, role, imageRole string
	pull                                                        string // pull failure category, "" if none
}

func kubeletTemplates(image, container, fieldPath string) []template {
	return []template{
		{"Normal", "Scheduled", "default-scheduler", "", "Successfully assigned %NS%/%POD% to " + SeedNode, eventpipev1.RoleWorkload, "", ""},
		{"Normal", "Pulling", "kubelet", fieldPath, fmt.Sprintf("Pulling image %q", image), eventpipev1.RoleWorkload, eventpipev1.ImageRoleWorkload, ""},
		{"Warning", "Failed", "kubelet", fieldPath, fmt.Sprintf("Failed to pull image %q: rpc error: code = NotFound desc = failed to pull and unpack image %q: failed to resolve reference %q: %s: not found", image, image, image, image), eventpipev1.RoleWorkload, eventpipev1.ImageRoleWorkload, eventpipev1.CategoryNotFound},
		{"Warning", "Failed", "kubelet", fieldPath, "Error: ErrImagePull", eventpipev1.RoleWorkload, eventpipev1.ImageRoleWorkload, eventpipev1.CategoryNotFound},
		{"Normal", "BackOff", "kubelet", fieldPath, fmt.Sprintf("Back-off pulling image %q", image), eventpipev1.RoleWorkload, eventpipev1.ImageRoleWorkload, eventpipev1.CategoryNotFound},
		{"Warning", "Failed", "kubelet", fieldPath, "Error: ImagePullBackOff", eventpipev1.RoleWorkload, eventpipev1.ImageRoleWorkload, eventpipev1.CategoryNotFound},
		{"Normal", "Pulled", "kubelet", fieldPath, fmt.Sprintf("Successfully pulled image %q in 1.532s (1.532s including waiting). Image size: 52314021 bytes.", SeedGoodImage), eventpipev1.RoleWorkload, eventpipev1.ImageRoleWorkload, ""},
		{"Normal", "Created", "kubelet", fieldPath, "Created container: " + container, eventpipev1.RoleWorkload, "", ""},
		{"Normal", "Started", "kubelet", fieldPath, "Started container " + container, eventpipev1.RoleWorkload, "", ""},
		{"Warning", "Failed", "kubelet", "spec.containers{supervisor}", "Failed to pull image \"" + SeedSupervisor + "\": rpc error: code = Unknown desc = failed to pull and unpack image: toomanyrequests: You have reached your unauthenticated pull rate limit", eventpipev1.RoleSupervisor, eventpipev1.ImageRoleSupervisor, eventpipev1.CategoryRateLimited},
	}
}

// Next returns a new occurrence with a unique event_id.
func (g *Generator) Next() *eventpipev1.Occurrence {
	g.n++
	g.clock = g.clock.Add(time.Duration(50+g.rng.IntN(950)) * time.Millisecond)
	sb := g.rng.IntN(max(g.Sandboxes, 1))
	eventUID := g.uuid()
	rv := fmt.Sprintf("%d", 1000+g.n)
	id := fmt.Sprintf("%s%s/%s", g.prefix, eventUID, rv)
	at := timestamppb.New(g.clock)
	seen := timestamppb.New(g.clock.Add(35 * time.Millisecond))

	// One in ten events is about something that is not a sandbox.
	if g.rng.IntN(10) == 0 {
		return &eventpipev1.Occurrence{
			SchemaVersion: eventpipev1.SchemaVersion,
			EventId:       id,
			OccurredAt:    at,
			ObservedAt:    seen,
			Cluster:       SeedCluster,
			Namespace:     "kube-system",
			Event:         &eventpipev1.EventRef{Name: "coredns-7db6d8ff4d-x2x5m." + fmt.Sprintf("%x", g.clock.UnixNano()), Uid: eventUID, ResourceVersion: rv, ApiVersion: "v1"},
			InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", ApiVersion: "v1", Namespace: "kube-system",
				Name: "coredns-7db6d8ff4d-x2x5m", Uid: "5b0f3c9e-4a51-4f0c-9a43-2f1e1b8f6d11"},
			Type:               "Warning",
			Reason:             "Unhealthy",
			Message:            "Readiness probe failed: HTTP probe failed with statuscode: 503",
			Count:              int32(1 + g.rng.IntN(20)),
			ReportingComponent: "kubelet",
			ReportingInstance:  SeedNode,
			Attribution:        eventpipev1.AttributionNone,
			Role:               eventpipev1.RoleNone,
		}
	}

	sandboxID := g.sandboxID(sb)
	name := SeedSandboxName
	if sb > 0 {
		name = fmt.Sprintf("agent-%d", sb)
	}
	image := SeedBadImage
	if sb%2 == 1 {
		image = SeedGoodImage
	}
	container, fieldPath := "workspace-init", "spec.initContainers{workspace-init}"
	if g.rng.IntN(2) == 0 {
		container, fieldPath = "agent", "spec.containers{agent}"
	}
	tpls := kubeletTemplates(image, container, fieldPath)
	t := tpls[g.rng.IntN(len(tpls))]
	pod := name
	podUID := SeedPodUID
	attribution := eventpipev1.AttributionOwnerChain
	if t.role == eventpipev1.RoleSupervisor {
		pod = "os-supervisor-" + sandboxID
		container = "supervisor"
		podUID = g.sandboxID(sb + 1000)
		attribution = eventpipev1.AttributionSupervisorName
	}
	if t.fieldPath == "" {
		container = ""
	}
	msg := strings.NewReplacer("%NS%", SeedNamespace, "%POD%", pod).Replace(t.message)
	o := &eventpipev1.Occurrence{
		SchemaVersion: eventpipev1.SchemaVersion,
		EventId:       id,
		OccurredAt:    at,
		ObservedAt:    seen,
		Cluster:       SeedCluster,
		Namespace:     SeedNamespace,
		Event: &eventpipev1.EventRef{Name: fmt.Sprintf("%s.%x", pod, g.clock.UnixNano()), Uid: eventUID,
			ResourceVersion: rv, ApiVersion: "v1"},
		InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", ApiVersion: "v1", Namespace: SeedNamespace,
			Name: pod, Uid: podUID, FieldPath: t.fieldPath},
		Type:               t.typ,
		Reason:             t.reason,
		Message:            msg,
		Count:              int32(1 + g.rng.IntN(5)),
		ReportingComponent: t.component,
		ReportingInstance:  SeedNode,
		Sandbox: &eventpipev1.Sandbox{Id: sandboxID, Name: name, Workspace: SeedWorkspace, GatewayId: SeedGatewayID,
			CrNamespace: SeedNamespace, CrName: name},
		Attribution: attribution,
		Role:        t.role,
		Container:   container,
	}
	if t.imageRole != "" {
		o.ImageRole = t.imageRole
		o.Image = image
		if t.role == eventpipev1.RoleSupervisor {
			o.Image = SeedSupervisor
		}
	}
	if t.pull != "" {
		o.PullFailure = &eventpipev1.PullFailure{
			Category:    t.pull,
			Image:       o.Image,
			Disposition: eventpipev1.DispositionRetrying,
			Attempts:    uint32(1 + g.rng.IntN(6)),
			FirstSeen:   timestamppb.New(g.clock.Add(-90 * time.Second)),
			LastSeen:    at,
			Detail:      o.Image + ": not found",
			Source:      eventpipev1.PullSourceEvent,
		}
		if t.pull == eventpipev1.CategoryRateLimited {
			o.PullFailure.Detail = "toomanyrequests: You have reached your unauthenticated pull rate limit"
		}
	}
	if t.reason == "Pulled" && container == "agent" {
		o.Progress = &eventpipev1.Progress{CompleteStep: eventpipev1.StepPullingImage, CompleteLabel: "Image pulled",
			ActiveStep: eventpipev1.StepStartingSandbox}
	}
	return o
}

// Batch returns n new occurrences.
func (g *Generator) Batch(n int) []*eventpipev1.Occurrence {
	out := make([]*eventpipev1.Occurrence, n)
	for i := range out {
		out[i] = g.Next()
	}
	return out
}

// Hostile returns occurrences that sinks must deliver or count, never crash
// on: a 1 MiB message, invalid UTF-8, and label-like text ("}, newlines,
// quotes, braces) in every string field. id must be unique.
func Hostile(prefix string) []*eventpipev1.Occurrence {
	inject := "x\"}\n{job=\"evil\"}\r\n\t\\\"},{\"stream\":{\"a\":\"b\"}"
	at := timestamppb.New(time.Date(2026, 10, 29, 10, 11, 0, 0, time.UTC))
	mk := func(id, s string) *eventpipev1.Occurrence {
		return &eventpipev1.Occurrence{
			SchemaVersion:      eventpipev1.SchemaVersion,
			EventId:            prefix + id,
			OccurredAt:         at,
			ObservedAt:         at,
			Cluster:            s,
			Namespace:          s,
			Event:              &eventpipev1.EventRef{Name: s, Uid: s, ResourceVersion: s, ApiVersion: s},
			InvolvedObject:     &eventpipev1.ObjectRef{Kind: s, ApiVersion: s, Namespace: s, Name: s, Uid: s, FieldPath: s},
			Type:               s,
			Reason:             s,
			Message:            s,
			Count:              1,
			ReportingComponent: s,
			ReportingInstance:  s,
			Action:             s,
			Sandbox:            &eventpipev1.Sandbox{Id: s, Name: s, Workspace: s, GatewayId: s, CrNamespace: s, CrName: s},
			Attribution:        s,
			Role:               s,
			Container:          s,
			Image:              s,
			ImageRole:          s,
			PullFailure:        &eventpipev1.PullFailure{Category: s, Image: s, Disposition: s, Detail: s, Source: s},
			Progress:           &eventpipev1.Progress{CompleteStep: s, CompleteLabel: s, ActiveStep: s, ActiveDetail: s},
		}
	}
	big := mk("big-message", "big")
	big.Message = strings.Repeat("Back-off pulling image \"x\"; ", (1<<20)/28+1)[:1<<20]
	big.Sandbox = &eventpipev1.Sandbox{Id: SeedSandboxID, Workspace: SeedWorkspace}
	big.Namespace = SeedNamespace
	// Invalid UTF-8 cannot travel in a proto string field through protobuf
	// marshalling, but a Go struct can hold it: sinks must cope.
	bad := mk("invalid-utf8", "bad\xff\xfe\xc3(utf8")
	injected := mk("injection", inject)
	return []*eventpipev1.Occurrence{big, bad, injected}
}
