package kafka

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
)

func ocsfCases() map[string]*eventpipev1.Occurrence {
	pulled := seedOccurrence()
	pulled.Reason, pulled.Type, pulled.PullFailure = "Pulled", "Normal", nil
	pulled.Message = `Successfully pulled image "python:3.12" in 2.1s`
	pulled.Container, pulled.Image = "agent", "docker.io/library/python:3.12"
	persistent := seedOccurrence()
	persistent.Type, persistent.Reason = "Warning", "Failed"
	persistent.PullFailure.Disposition = eventpipev1.DispositionPersistent
	killing := seedOccurrence()
	killing.Reason, killing.Type, killing.PullFailure = "Killing", "Normal", nil
	crash := seedOccurrence()
	crash.Type, crash.Reason, crash.PullFailure = "Warning", "BackOff", nil
	crash.Message = "Back-off restarting failed container agent in pod img-missing"
	orphan := seedOccurrence()
	orphan.Sandbox, orphan.Attribution, orphan.Image, orphan.PullFailure = nil, eventpipev1.AttributionNone, "", nil
	orphan.Reason, orphan.Type = "NodeNotReady", "Warning"
	orphan.ReportingComponent, orphan.Container = "node-controller", ""
	digest := seedOccurrence()
	digest.Reason, digest.Type, digest.PullFailure = "Pulled", "Normal", nil
	digest.Container, digest.Image = "agent", "ghcr.io/nvidia/openshell/sandbox-base@sha256:6d3c5c1f4f0e7b0a3b2e9f8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e"
	digest.Message = `Container image "` + digest.Image + `" already present on machine`
	crashLoop := seedOccurrence()
	crashLoop.Type, crashLoop.Reason, crashLoop.PullFailure = "Warning", "BackOff", nil
	crashLoop.Container, crashLoop.Message = "agent", "Back-off restarting failed container agent in pod img-missing_openshell-openshell-repro"
	crashLoop.Blocker = &eventpipev1.Blocker{Kind: "container", Cause: "crash_loop", Object: "Pod/img-missing", Container: "agent",
		Disposition: eventpipev1.DispositionPersistent, Attempts: 7, Source: eventpipev1.PullSourceEvent}
	unschedulable := seedOccurrence()
	unschedulable.Type, unschedulable.Reason, unschedulable.PullFailure = "Warning", "FailedScheduling", nil
	unschedulable.ReportingComponent, unschedulable.ReportingInstance, unschedulable.Container = "default-scheduler", "", ""
	unschedulable.Message = "0/3 nodes are available: 3 Insufficient memory. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
	unschedulable.Blocker = &eventpipev1.Blocker{Kind: "unschedulable", Cause: "insufficient_resources", Object: "Pod/img-missing",
		Disposition: eventpipev1.DispositionRetrying, Attempts: 1, Source: eventpipev1.PullSourceEvent}
	return map[string]*eventpipev1.Occurrence{
		"seed pull backoff": seedOccurrence(), "pulled": pulled, "persistent failure": persistent,
		"killing": killing, "crash loop": crash, "no sandbox": orphan, "pulled by digest": digest,
		"persistent crash loop blocker": crashLoop, "unschedulable blocker": unschedulable,
	}
}

// TestOCSFValidatorCatches: the schema validator fails on each way an
// event can break the schema, including the ways this encoder once did.
func TestOCSFValidatorCatches(t *testing.T) {
	s, class := ocsfClass(t)
	b, err := AppendOCSF(nil, ocsfCases()["pulled by digest"])
	if err != nil {
		t.Fatal(err)
	}
	if errs := s.validate(class, decodeNumbers(t, b).(map[string]any)); len(errs) > 0 {
		t.Fatalf("the unbroken event is invalid: %v\n%s", errs, b)
	}
	for name, breakIt := range map[string]func(v map[string]any){
		"missing app":  func(v map[string]any) { delete(v, "app") },
		"bad activity": func(v map[string]any) { v["activity_id"] = json.Number("42") },
		"activity 99 as Other": func(v map[string]any) {
			v["activity_id"], v["activity_name"], v["type_uid"] = json.Number("99"), "Other", json.Number("600299")
		},
		"type_uid mismatch":      func(v map[string]any) { v["type_uid"] = json.Number("600299") },
		"unknown attribute":      func(v map[string]any) { v["sandbox_id"] = "x" },
		"severity caption":       func(v map[string]any) { v["severity"] = "Warning" },
		"time as a string":       func(v map[string]any) { v["time"] = "2026-12-01T14:00:00Z" },
		"metadata version":       func(v map[string]any) { delete(v["metadata"].(map[string]any), "version") },
		"container in the class": func(v map[string]any) { v["container"] = map[string]any{"name": "agent"} },
		"profile not included": func(v map[string]any) {
			v["metadata"].(map[string]any)["profiles"] = []any{"host", "container", "cloud"}
		},
		"profile not declared": func(v map[string]any) { delete(v["metadata"].(map[string]any), "profiles") },
		"image without uid": func(v map[string]any) {
			delete(v["device"].(map[string]any)["container"].(map[string]any)["image"].(map[string]any), "uid")
		},
		"device without type_id": func(v map[string]any) { delete(v["device"].(map[string]any), "type_id") },
		"deprecated attribute": func(v map[string]any) {
			v["device"].(map[string]any)["container"].(map[string]any)["image"].(map[string]any)["tag"] = "0.1.4"
		},
		"pod_uuid not a uuid": func(v map[string]any) {
			v["device"].(map[string]any)["container"].(map[string]any)["pod_uuid"] = "img-missing"
		},
		"unknown object attribute": func(v map[string]any) { v["device"].(map[string]any)["container"].(map[string]any)["pod"] = "x" },
		"profiles not an array":    func(v map[string]any) { v["metadata"].(map[string]any)["profiles"] = "host" },
	} {
		v := decodeNumbers(t, b).(map[string]any)
		breakIt(v)
		if errs := s.validate(class, v); len(errs) == 0 {
			t.Errorf("validator accepted an event with %s", name)
		}
	}
}

// TestOCSFFields: the values a reader relies on: activity, severity and
// status (derived from a pull failure's or a blocker's disposition), the
// sandbox as the application, the kubelet's node as the device with the
// container, the image object only for a digest-pinned image.
func TestOCSFFields(t *testing.T) {
	cases := ocsfCases()
	type want struct {
		activity, severity, status int
		detail, activityName       string
	}
	wants := map[string]want{
		"seed pull backoff":             {OCSFActivityStart, OCSFSeverityMedium, OCSFStatusFailure, "not_found", "Start"},
		"pulled":                        {OCSFActivityStart, OCSFSeverityInformational, OCSFStatusSuccess, "", "Start"},
		"pulled by digest":              {OCSFActivityStart, OCSFSeverityInformational, OCSFStatusSuccess, "", "Start"},
		"persistent failure":            {OCSFActivityStart, OCSFSeverityHigh, OCSFStatusFailure, "not_found", "Start"},
		"killing":                       {OCSFActivityStop, OCSFSeverityInformational, OCSFStatusSuccess, "", "Stop"},
		"crash loop":                    {OCSFActivityRestart, OCSFSeverityMedium, OCSFStatusFailure, "", "Restart"},
		"persistent crash loop blocker": {OCSFActivityRestart, OCSFSeverityHigh, OCSFStatusFailure, "crash_loop", "Restart"},
		"unschedulable blocker":         {OCSFActivityStart, OCSFSeverityMedium, OCSFStatusFailure, "insufficient_resources", "Start"},
		"no sandbox":                    {OCSFActivityOther, OCSFSeverityMedium, OCSFStatusFailure, "", "NodeNotReady"},
	}
	for name, o := range cases {
		ev := OCSF(o)
		w, ok := wants[name]
		if !ok {
			t.Fatalf("no expectation for case %s", name)
		}
		if ev.ActivityID != w.activity || ev.ActivityName != w.activityName || ev.SeverityID != w.severity ||
			ev.StatusID != w.status || ev.StatusDetail != w.detail {
			t.Errorf("%s: activity %d %q severity %d status %d detail %q, want %+v", name, ev.ActivityID, ev.ActivityName,
				ev.SeverityID, ev.StatusID, ev.StatusDetail, w)
		}
		if ev.Metadata.UID != o.GetEventId() || ev.Unmapped.EventID != o.GetEventId() {
			t.Errorf("%s: metadata.uid %q, want the event_id", name, ev.Metadata.UID)
		}
		if ev.Time != o.GetOccurredAt().AsTime().UnixMilli() || ev.Message != o.GetMessage() {
			t.Errorf("%s: time %d message %q", name, ev.Time, ev.Message)
		}
		if sb := o.GetSandbox(); sb != nil {
			if ev.App.UID != sb.GetId() || ev.App.Name != sb.GetName() || ev.Metadata.CorrelationUID != sb.GetId() {
				t.Errorf("%s: app %+v: the sandbox must be the application", name, ev.App)
			}
		} else if ev.App.VendorName != "Kubernetes" || ev.App.Name != "Pod/img-missing" {
			t.Errorf("%s: an occurrence of no sandbox has app %+v", name, ev.App)
		}
		kubeletContainer := o.GetReportingComponent() == "kubelet" && o.GetContainer() != ""
		switch {
		case !kubeletContainer && ev.Device != nil:
			t.Errorf("%s: device %+v for an event no kubelet reported about a container", name, ev.Device)
		case kubeletContainer && (ev.Device == nil || ev.Device.Name != o.GetReportingInstance() || ev.Device.Container == nil ||
			ev.Device.Container.Name != o.GetContainer() || ev.Device.Container.PodUUID != o.GetInvolvedObject().GetUid()):
			t.Errorf("%s: device %+v, want the node %s with container %s of pod %s", name, ev.Device, o.GetReportingInstance(),
				o.GetContainer(), o.GetInvolvedObject().GetUid())
		case kubeletContainer && (ev.Device.Container.Image != nil) != strings.Contains(o.GetImage(), "@sha256:"):
			t.Errorf("%s: container.image %+v for image %s: only a digest gives the image its uid", name, ev.Device.Container.Image, o.GetImage())
		}
		if (ev.Device != nil) != (len(ev.Metadata.Profiles) > 0) {
			t.Errorf("%s: profiles %v with device %+v", name, ev.Metadata.Profiles, ev.Device)
		}
	}
	if img := OCSF(cases["pulled by digest"]).Device.Container.Image; img == nil || img.UID != "sha256:6d3c5c1f4f0e7b0a3b2e9f8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e" {
		t.Errorf("image object %+v, want the digest as its uid", img)
	}
	if bl := OCSF(cases["persistent crash loop blocker"]).Unmapped.Blocker; bl == nil || bl.Cause != "crash_loop" || bl.Disposition != eventpipev1.DispositionPersistent {
		t.Errorf("blocker lost in unmapped: %+v", bl)
	}
}

// TestOCSFOnTheWire: the sink with value_format ocsf writes one valid OCSF
// event per occurrence to a real Kafka-protocol broker, with the same key
// and CloudEvents headers as the other formats.
func TestOCSFOnTheWire(t *testing.T) {
	schema, class := ocsfClass(t)
	b := startBroker(t)
	cfg := testConfig(b.addr(), "ocsf-archive")
	cfg.ValueFormat = FormatOCSF
	s, err := New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var batch []sinks.Record
	base := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i, o := range ocsfCases() {
		o = proto.Clone(o).(*eventpipev1.Occurrence)
		o.EventId = fmt.Sprintf("uid-%s/%d", strings.ReplaceAll(i, " ", "-"), len(batch))
		o.OccurredAt = timestamppb.New(base.Add(time.Duration(len(batch)) * time.Second))
		batch = append(batch, sinks.Record{Offset: uint64(len(batch) + 1), Occurrence: o})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Push(ctx, batch); err != nil {
		t.Fatal(err)
	}
	msgs, err := readTopic(ctx, nil, b.addr(), cfg.Topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != len(batch) {
		t.Fatalf("%d records, want %d", len(msgs), len(batch))
	}
	seen := map[string]bool{}
	for _, m := range msgs {
		v, ok := decodeNumbers(t, m.Value).(map[string]any)
		if !ok {
			t.Fatalf("value is not a JSON object: %s", m.Value)
		}
		if errs := schema.validate(class, v); len(errs) > 0 {
			t.Errorf("%s: %s", header(m, "ce_id"), strings.Join(errs, "; "))
		}
		uid := v["metadata"].(map[string]any)["uid"].(string)
		if header(m, "ce_id") != uid || header(m, "content-type") != ContentOCSF {
			t.Errorf("headers ce_id %q content-type %q for metadata.uid %q", header(m, "ce_id"), header(m, "content-type"), uid)
		}
		seen[uid] = true
	}
	if len(seen) != len(batch) {
		t.Errorf("%d distinct events, want %d", len(seen), len(batch))
	}
}
