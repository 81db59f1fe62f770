package kafka

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
)

// ocsfSchema is the part of the OCSF 1.8.0 schema an Application Lifecycle
// event is checked against: the class's attributes and which are required,
// the enumerations, and the attributes of the objects eventpipe fills. It is
// transcribed from the schema (schema.ocsf.io, version 1.8.0), not generated:
// the schema files cannot be fetched at test time here. "cloud" and "osint"
// are required only by the profiles of those names, which eventpipe does not
// declare; "container" and "namespace_pid" come with the container profile,
// which it does.
var ocsfSchema = struct {
	required, attributes       []string
	profileAttributes          map[string][]string
	activity, severity, status map[int]string
	metadataRequired           []string
	objects                    map[string][]string
}{
	required: []string{"activity_id", "app", "category_uid", "class_uid", "metadata", "severity_id", "time", "type_uid"},
	attributes: strings.Fields(`action action_id activity_id activity_name actor api app attacks authorizations
		category_name category_uid class_name class_uid cloud confidence confidence_id confidence_score count
		device disposition disposition_id duration end_time end_time_dt enrichments firewall_rule is_alert
		malware malware_scan_info message metadata observables osint policy raw_data raw_data_hash raw_data_size
		risk_details risk_level risk_level_id risk_score severity severity_id start_time start_time_dt status
		status_code status_detail status_id time time_dt timezone_offset type_name type_uid unmapped`),
	profileAttributes: map[string][]string{"container": {"container", "namespace_pid"}},
	activity:          map[int]string{0: "Unknown", 1: "Install", 2: "Remove", 3: "Start", 4: "Stop", 5: "Restart", 6: "Enable", 7: "Disable", 8: "Update", 99: "Other"},
	severity:          map[int]string{0: "Unknown", 1: "Informational", 2: "Low", 3: "Medium", 4: "High", 5: "Critical", 6: "Fatal", 99: "Other"},
	status:            map[int]string{0: "Unknown", 1: "Success", 2: "Failure", 99: "Other"},
	metadataRequired:  []string{"product", "version"},
	objects: map[string][]string{
		"metadata": strings.Fields(`correlation_uid data_classification data_classifications debug event_code extension
			extensions is_truncated labels log_format log_level log_name log_provider log_source log_version logged_time
			logged_time_dt loggers modified_time modified_time_dt original_event_uid original_time processed_time
			processed_time_dt product profiles reporter sequence source tags tenant_uid total_queued_duration
			transformation_info_list transmit_time transmit_time_dt type uid untruncated_size version`),
		"product":   strings.Fields(`cpe_name data_classification data_classifications feature lang name path uid url_string vendor_name version`),
		"container": strings.Fields(`hash image labels name network_driver orchestrator pod_uuid runtime size tag tags uid`),
		"image":     strings.Fields(`labels name path tag uid`),
	},
}

// validateOCSF reports every way v breaks the schema subset above.
func validateOCSF(v map[string]any) []string {
	var errs []string
	bad := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
	num := func(key string) (int, bool) {
		f, ok := v[key].(float64)
		if !ok || f != float64(int64(f)) {
			return 0, false
		}
		return int(f), true
	}
	allowed := map[string]bool{}
	for _, a := range ocsfSchema.attributes {
		allowed[a] = true
	}
	meta, _ := v["metadata"].(map[string]any)
	profiles, _ := meta["profiles"].([]any)
	for _, p := range profiles {
		attrs, known := ocsfSchema.profileAttributes[fmt.Sprint(p)]
		if !known {
			bad("metadata.profiles names %v, whose attributes this check does not know", p)
		}
		for _, a := range attrs {
			allowed[a] = true
		}
	}
	for k := range v {
		if !allowed[k] {
			bad("attribute %q is not in class 6002 or a declared profile", k)
		}
	}
	for _, k := range ocsfSchema.required {
		if _, ok := v[k]; !ok {
			bad("required attribute %q missing", k)
		}
	}
	if c, _ := num("class_uid"); c != 6002 || v["class_name"] != "Application Lifecycle" {
		bad("class %v %v", v["class_uid"], v["class_name"])
	}
	if c, _ := num("category_uid"); c != 6 || v["category_name"] != "Application Activity" {
		bad("category %v %v", v["category_uid"], v["category_name"])
	}
	act, ok := num("activity_id")
	if name, known := ocsfSchema.activity[act]; !ok || !known || v["activity_name"] != name {
		bad("activity_id %v / activity_name %v", v["activity_id"], v["activity_name"])
	}
	if tu, ok := num("type_uid"); !ok || tu != 6002*100+act || v["type_name"] != "Application Lifecycle: "+ocsfSchema.activity[act] {
		bad("type_uid %v / type_name %v for activity %d", v["type_uid"], v["type_name"], act)
	}
	if s, ok := num("severity_id"); !ok || ocsfSchema.severity[s] == "" || v["severity"] != ocsfSchema.severity[s] {
		bad("severity_id %v / severity %v", v["severity_id"], v["severity"])
	}
	if _, present := v["status_id"]; present {
		if s, ok := num("status_id"); !ok || ocsfSchema.status[s] == "" || v["status"] != ocsfSchema.status[s] {
			bad("status_id %v / status %v", v["status_id"], v["status"])
		}
	}
	if ms, ok := num("time"); !ok || ms <= 0 {
		bad("time %v is not a positive integer (ms since the epoch)", v["time"])
	}
	if meta == nil {
		return append(errs, "metadata is not an object")
	}
	for _, k := range ocsfSchema.metadataRequired {
		if _, ok := meta[k]; !ok {
			bad("required metadata.%s missing", k)
		}
	}
	if meta["version"] != "1.8.0" {
		bad("metadata.version %v", meta["version"])
	}
	checkObject := func(path, kind string, o any) {
		m, ok := o.(map[string]any)
		if !ok {
			bad("%s is not an object", path)
			return
		}
		known := map[string]bool{}
		for _, a := range ocsfSchema.objects[kind] {
			known[a] = true
		}
		for k := range m {
			if !known[k] {
				bad("%s.%s is not an attribute of %s", path, k, kind)
			}
		}
	}
	checkObject("metadata", "metadata", meta)
	checkObject("metadata.product", "product", meta["product"])
	checkObject("app", "product", v["app"])
	if c, ok := v["container"]; ok {
		checkObject("container", "container", c)
		if img, ok := c.(map[string]any)["image"]; ok {
			checkObject("container.image", "image", img)
		}
	}
	if _, ok := v["unmapped"].(map[string]any); !ok {
		bad("unmapped is not an object")
	}
	sort.Strings(errs)
	return errs
}

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
	return map[string]*eventpipev1.Occurrence{
		"seed pull backoff": seedOccurrence(), "pulled": pulled, "persistent failure": persistent,
		"killing": killing, "crash loop": crash, "no sandbox": orphan,
	}
}

// TestOCSFConformsToTheSchema: every kind of occurrence encodes to a valid
// OCSF 1.8.0 Application Lifecycle event, and the validator itself catches
// what it is meant to catch.
func TestOCSFConformsToTheSchema(t *testing.T) {
	for name, o := range ocsfCases() {
		t.Run(name, func(t *testing.T) {
			b, err := AppendOCSF(nil, o)
			if err != nil {
				t.Fatal(err)
			}
			var v map[string]any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatal(err)
			}
			if errs := validateOCSF(v); len(errs) > 0 {
				t.Fatalf("schema violations:\n%s\n%s", strings.Join(errs, "\n"), b)
			}
		})
	}
	// The validator must fail on broken events.
	b, _ := AppendOCSF(nil, seedOccurrence())
	for name, breakIt := range map[string]func(map[string]any){
		"missing app":       func(v map[string]any) { delete(v, "app") },
		"bad activity":      func(v map[string]any) { v["activity_id"] = 42.0 },
		"type_uid mismatch": func(v map[string]any) { v["type_uid"] = 600299.0 },
		"unknown attribute": func(v map[string]any) { v["sandbox_id"] = "x" },
		"severity caption":  func(v map[string]any) { v["severity"] = "Warning" },
		"metadata version":  func(v map[string]any) { delete(v["metadata"].(map[string]any), "version") },
		"container field":   func(v map[string]any) { v["container"].(map[string]any)["pod"] = "x" },
	} {
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		breakIt(v)
		if errs := validateOCSF(v); len(errs) == 0 {
			t.Errorf("validator accepted an event with %s", name)
		}
	}
}

// TestOCSFFields: the values a reader relies on, filled as OpenShell's own
// audit events fill them (container = the sandbox) and as eventpipe's other
// formats do (event_id, occurrence time).
func TestOCSFFields(t *testing.T) {
	cases := ocsfCases()
	type want struct {
		activity, severity, status int
	}
	wants := map[string]want{
		"seed pull backoff":  {OCSFActivityStart, OCSFSeverityMedium, OCSFStatusFailure},
		"pulled":             {OCSFActivityStart, OCSFSeverityInformational, OCSFStatusSuccess},
		"persistent failure": {OCSFActivityStart, OCSFSeverityHigh, OCSFStatusFailure},
		"killing":            {OCSFActivityStop, OCSFSeverityInformational, OCSFStatusSuccess},
		"crash loop":         {OCSFActivityRestart, OCSFSeverityMedium, OCSFStatusFailure},
		"no sandbox":         {OCSFActivityOther, OCSFSeverityMedium, OCSFStatusFailure},
	}
	for name, o := range cases {
		ev := OCSF(o)
		w := wants[name]
		if ev.ActivityID != w.activity || ev.SeverityID != w.severity || ev.StatusID != w.status {
			t.Errorf("%s: activity %d severity %d status %d, want %+v", name, ev.ActivityID, ev.SeverityID, ev.StatusID, w)
		}
		if ev.Metadata.UID != o.GetEventId() || ev.Unmapped.EventID != o.GetEventId() {
			t.Errorf("%s: metadata.uid %q, want the event_id", name, ev.Metadata.UID)
		}
		if ev.Time != o.GetOccurredAt().AsTime().UnixMilli() || ev.Message != o.GetMessage() {
			t.Errorf("%s: time %d message %q", name, ev.Time, ev.Message)
		}
		if sb := o.GetSandbox(); sb != nil {
			if ev.Container == nil || ev.Container.Name != sb.GetName() || ev.Container.UID != sb.GetId() ||
				ev.App.UID != sb.GetId() || ev.Metadata.CorrelationUID != sb.GetId() {
				t.Errorf("%s: container %+v app %+v: the sandbox must be the container and the app", name, ev.Container, ev.App)
			}
			if o.GetImage() != "" && (ev.Container.Image == nil || ev.Container.Image.Name != o.GetImage()) {
				t.Errorf("%s: container.image %+v, want %s", name, ev.Container.Image, o.GetImage())
			}
		} else if ev.Container != nil || ev.App.VendorName != "Kubernetes" {
			t.Errorf("%s: an occurrence of no sandbox has container %+v app %+v", name, ev.Container, ev.App)
		}
	}
	if pf := OCSF(cases["persistent failure"]).Unmapped.PullFailure; pf == nil || pf.Disposition != eventpipev1.DispositionPersistent || pf.Category != eventpipev1.CategoryNotFound {
		t.Errorf("pull failure lost in unmapped: %+v", pf)
	}
}

// TestOCSFOnTheWire: the sink with value_format ocsf writes one valid OCSF
// event per occurrence to a real Kafka-protocol broker, with the same key
// and CloudEvents headers as the other formats.
func TestOCSFOnTheWire(t *testing.T) {
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
		var v map[string]any
		if err := json.Unmarshal(m.Value, &v); err != nil {
			t.Fatalf("value is not JSON: %v", err)
		}
		if errs := validateOCSF(v); len(errs) > 0 {
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
