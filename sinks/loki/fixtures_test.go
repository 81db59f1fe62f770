package loki

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
)

// pullFailure is a real kubelet Failed event (ErrImagePull of a workload
// image that does not exist), as enrich emits it.
func pullFailure(sandboxID string, n int, at time.Time) *eventpipev1.Occurrence {
	img := "docker.io/library/busybox:0.0.0-does-not-exist"
	return &eventpipev1.Occurrence{
		SchemaVersion: 1,
		EventId:       fmt.Sprintf("7f1c2d3e-0000-4000-8000-%012d/%d", n, 1000+n),
		OccurredAt:    timestamppb.New(at),
		ObservedAt:    timestamppb.New(at.Add(150 * time.Millisecond)),
		Cluster:       "kind-osrepro",
		Namespace:     "openshell-openshell-repro",
		Event: &eventpipev1.EventRef{
			Name: fmt.Sprintf("img-missing.18a2b3c4d5e6f%03d", n%1000), Uid: fmt.Sprintf("7f1c2d3e-0000-4000-8000-%012d", n),
			ResourceVersion: fmt.Sprint(1000 + n), ApiVersion: "v1",
		},
		InvolvedObject: &eventpipev1.ObjectRef{
			Kind: "Pod", ApiVersion: "v1", Namespace: "openshell-openshell-repro", Name: "img-missing",
			Uid: "876414ec-8379-42b9-8deb-a047f4214891", FieldPath: "spec.initContainers{workspace-init}",
		},
		Type:               "Warning",
		Reason:             "Failed",
		Message:            `Failed to pull image "` + img + `": rpc error: code = NotFound desc = failed to pull and unpack image "` + img + `": failed to resolve reference "` + img + `": ` + img + `: not found`,
		Count:              int32(1 + n%5),
		ReportingComponent: "kubelet",
		ReportingInstance:  "osrepro-control-plane",
		Sandbox: &eventpipev1.Sandbox{
			Id: sandboxID, Name: "img-missing", Workspace: "repro", GatewayId: "gw-1",
			CrNamespace: "openshell-openshell-repro", CrName: "img-missing",
		},
		Attribution: eventpipev1.AttributionPodAnnotation,
		Role:        eventpipev1.RoleWorkload,
		Container:   "workspace-init",
		Image:       img,
		ImageRole:   eventpipev1.ImageRoleWorkload,
		PullFailure: &eventpipev1.PullFailure{
			Category: eventpipev1.CategoryNotFound, Image: img, Disposition: eventpipev1.DispositionRetrying,
			Attempts: 1, FirstSeen: timestamppb.New(at), LastSeen: timestamppb.New(at),
			Detail: img + ": not found", Source: eventpipev1.PullSourceEvent,
		},
	}
}

// scheduled is an unattributed Normal event from the scheduler.
func scheduled(n int, at time.Time) *eventpipev1.Occurrence {
	return &eventpipev1.Occurrence{
		SchemaVersion:      1,
		EventId:            fmt.Sprintf("0a0b0c0d-1111-4000-8000-%012d/%d", n, 5000+n),
		OccurredAt:         timestamppb.New(at),
		ObservedAt:         timestamppb.New(at),
		Cluster:            "kind-osrepro",
		Namespace:          "default",
		InvolvedObject:     &eventpipev1.ObjectRef{Kind: "Pod", ApiVersion: "v1", Namespace: "default", Name: fmt.Sprintf("web-%d", n), Uid: "1d7c2f0e-5b6a-4c3d-9e8f-0a1b2c3d4e5f"},
		Type:               "Normal",
		Reason:             "Scheduled",
		Message:            fmt.Sprintf("Successfully assigned default/web-%d to osrepro-control-plane", n),
		Count:              1,
		ReportingComponent: "default-scheduler",
		Attribution:        eventpipev1.AttributionNone,
		Role:               eventpipev1.RoleNone,
	}
}

func records(occs ...*eventpipev1.Occurrence) []sinks.Record {
	out := make([]sinks.Record, len(occs))
	for i, o := range occs {
		out[i] = sinks.Record{Offset: uint64(i + 1), Occurrence: o}
	}
	return out
}
