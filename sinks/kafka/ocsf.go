package kafka

import (
	"encoding/json"
	"runtime/debug"
	"strings"
	"sync"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// OCSF value format (value_format: ocsf): one OCSF 1.8.0 event per
// occurrence, for archives read by security tooling next to OpenShell's own
// audit log, which OpenShell writes in OCSF too.
//
// Class: Application Lifecycle (class_uid 6002, category Application
// Activity 6). A Kubernetes Event about a sandbox reports a step in the life
// of the sandbox's workload (scheduled, image pulled or not, started,
// killed, restarted), which is what this class describes; OpenShell's
// supervisor reports its own sandbox start and stop with the same class, so
// one query over the class finds both. The other candidates fit worse:
// Detection Finding is for security findings, API Activity for calls made
// by an actor, and Base Event says nothing. Why each field is filled the way
// it is: docs/ocsf.md.
const (
	OCSFVersion       = "1.8.0"
	OCSFClassUID      = 6002
	OCSFClassName     = "Application Lifecycle"
	OCSFCategoryUID   = 6
	OCSFCategoryName  = "Application Activity"
	ContentOCSF       = "application/json; profile=ocsf-1.8.0"
	ocsfProductName   = "eventpipe"
	ocsfProductVendor = "eventpipe"
	ocsfSandboxVendor = "OpenShell"
	ocsfLogName       = "kubernetes_events"
)

// Activity ids of the Application Lifecycle class (OCSF 1.8.0).
const (
	OCSFActivityUnknown = 0
	OCSFActivityInstall = 1
	OCSFActivityRemove  = 2
	OCSFActivityStart   = 3
	OCSFActivityStop    = 4
	OCSFActivityRestart = 5
	OCSFActivityOther   = 99
)

// ocsfActivityNames are the captions of the activity ids.
var ocsfActivityNames = map[int]string{
	OCSFActivityUnknown: "Unknown", OCSFActivityInstall: "Install", OCSFActivityRemove: "Remove",
	OCSFActivityStart: "Start", OCSFActivityStop: "Stop", OCSFActivityRestart: "Restart",
	OCSFActivityOther: "Other",
}

// Severity and status ids (base event attributes, OCSF 1.8.0).
const (
	OCSFSeverityInformational = 1
	OCSFSeverityLow           = 2
	OCSFSeverityMedium        = 3
	OCSFSeverityHigh          = 4
	OCSFStatusUnknown         = 0
	OCSFStatusSuccess         = 1
	OCSFStatusFailure         = 2
)

var ocsfSeverityNames = map[int]string{1: "Informational", 2: "Low", 3: "Medium", 4: "High"}
var ocsfStatusNames = map[int]string{0: "Unknown", 1: "Success", 2: "Failure"}

// ocsfActivity maps an Event reason to the lifecycle step it reports. The
// reasons are kubelet's, the scheduler's, the volume controllers' and the
// Agent Sandbox controller's; anything else is Other.
func ocsfActivity(o *eventpipev1.Occurrence) int {
	switch o.GetReason() {
	case "Scheduled", "FailedScheduling", "Pulling", "Pulled", "Failed", "ErrImagePull",
		"ImagePullBackOff", "InspectFailed", "ErrImageNeverPull", "Created", "Started",
		"FailedCreatePodSandBox", "FailedMount", "FailedAttachVolume", "SuccessfulAttachVolume",
		"ProvisioningFailed", "ProvisioningSucceeded", "FailedCreate", "SuccessfulCreate",
		"PodCreated":
		return OCSFActivityStart
	case "BackOff":
		if strings.Contains(o.GetMessage(), "restarting") {
			return OCSFActivityRestart
		}
		return OCSFActivityStart
	case "Killing", "Stopped", "Preempting", "Evicted", "PodDeleted", "SuccessfulDelete":
		return OCSFActivityStop
	}
	return OCSFActivityOther
}

func ocsfSeverityStatus(o *eventpipev1.Occurrence) (severity, status int) {
	// A pull failure is a failed start whatever the Event's type says
	// (kubelet reports some back-offs as Normal).
	if pf := o.GetPullFailure(); pf != nil {
		if pf.GetDisposition() == eventpipev1.DispositionPersistent {
			return OCSFSeverityHigh, OCSFStatusFailure
		}
		return OCSFSeverityMedium, OCSFStatusFailure
	}
	switch o.GetType() {
	case "Normal":
		return OCSFSeverityInformational, OCSFStatusSuccess
	case "Warning":
		return OCSFSeverityMedium, OCSFStatusFailure
	}
	return OCSFSeverityLow, OCSFStatusUnknown
}

// The OCSF objects eventpipe fills. Field names are OCSF attribute names.
type (
	ocsfEvent struct {
		ClassUID     int           `json:"class_uid"`
		ClassName    string        `json:"class_name"`
		CategoryUID  int           `json:"category_uid"`
		CategoryName string        `json:"category_name"`
		ActivityID   int           `json:"activity_id"`
		ActivityName string        `json:"activity_name"`
		TypeUID      int           `json:"type_uid"`
		TypeName     string        `json:"type_name"`
		Time         int64         `json:"time"`
		SeverityID   int           `json:"severity_id"`
		Severity     string        `json:"severity"`
		StatusID     int           `json:"status_id"`
		Status       string        `json:"status"`
		StatusCode   string        `json:"status_code,omitempty"`
		StatusDetail string        `json:"status_detail,omitempty"`
		Message      string        `json:"message"`
		Count        int32         `json:"count,omitempty"`
		Metadata     ocsfMetadata  `json:"metadata"`
		App          ocsfProduct   `json:"app"`
		Container    *ocsfContainr `json:"container,omitempty"`
		Unmapped     ocsfUnmapped  `json:"unmapped"`
	}
	ocsfMetadata struct {
		Version        string      `json:"version"`
		Product        ocsfProduct `json:"product"`
		Profiles       []string    `json:"profiles"`
		UID            string      `json:"uid"`
		CorrelationUID string      `json:"correlation_uid,omitempty"`
		EventCode      string      `json:"event_code,omitempty"`
		LogName        string      `json:"log_name"`
		LoggedTime     int64       `json:"logged_time,omitempty"`
		OriginalTime   string      `json:"original_time,omitempty"`
	}
	ocsfProduct struct {
		Name       string `json:"name"`
		VendorName string `json:"vendor_name"`
		Version    string `json:"version,omitempty"`
		UID        string `json:"uid,omitempty"`
	}
	ocsfContainr struct {
		Name  string     `json:"name"`
		UID   string     `json:"uid,omitempty"`
		Image *ocsfImage `json:"image,omitempty"`
	}
	ocsfImage struct {
		Name string `json:"name"`
	}
	// ocsfUnmapped holds what OCSF has no attribute for, under eventpipe's
	// own names (the same as the JSON value format's).
	ocsfUnmapped struct {
		EventID            string                 `json:"event_id"`
		Cluster            string                 `json:"cluster,omitempty"`
		Namespace          string                 `json:"namespace,omitempty"`
		Type               string                 `json:"type,omitempty"`
		Reason             string                 `json:"reason,omitempty"`
		ReportingComponent string                 `json:"reporting_component,omitempty"`
		InvolvedObject     *eventpipev1.ObjectRef `json:"involved_object,omitempty"`
		Sandbox            *eventpipev1.Sandbox   `json:"sandbox,omitempty"`
		Attribution        string                 `json:"attribution,omitempty"`
		Role               string                 `json:"role,omitempty"`
		Container          string                 `json:"container,omitempty"`
		ImageRole          string                 `json:"image_role,omitempty"`
		PullFailure        *ocsfPullFailure       `json:"pull_failure,omitempty"`
		Progress           *eventpipev1.Progress  `json:"progress,omitempty"`
		MessageTruncated   bool                   `json:"message_truncated,omitempty"`
	}
	ocsfPullFailure struct {
		Category    string `json:"category"`
		Image       string `json:"image,omitempty"`
		Disposition string `json:"disposition,omitempty"`
		Attempts    uint32 `json:"attempts,omitempty"`
		Detail      string `json:"detail,omitempty"`
	}
)

var productVersion = sync.OnceValue(func() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "unknown"
})

// OCSF returns the OCSF 1.8.0 Application Lifecycle event for o.
func OCSF(o *eventpipev1.Occurrence) ocsfEvent {
	activity := ocsfActivity(o)
	severity, status := ocsfSeverityStatus(o)
	ev := ocsfEvent{
		ClassUID:     OCSFClassUID,
		ClassName:    OCSFClassName,
		CategoryUID:  OCSFCategoryUID,
		CategoryName: OCSFCategoryName,
		ActivityID:   activity,
		ActivityName: ocsfActivityNames[activity],
		TypeUID:      OCSFClassUID*100 + activity,
		TypeName:     OCSFClassName + ": " + ocsfActivityNames[activity],
		Time:         o.GetOccurredAt().AsTime().UnixMilli(),
		SeverityID:   severity,
		Severity:     ocsfSeverityNames[severity],
		StatusID:     status,
		Status:       ocsfStatusNames[status],
		StatusCode:   o.GetReason(),
		Message:      o.GetMessage(),
		Count:        o.GetCount(),
		Metadata: ocsfMetadata{
			Version:        OCSFVersion,
			Product:        ocsfProduct{Name: ocsfProductName, VendorName: ocsfProductVendor, Version: productVersion()},
			Profiles:       []string{"container"},
			UID:            o.GetEventId(),
			CorrelationUID: o.GetSandbox().GetId(),
			EventCode:      o.GetReason(),
			LogName:        ocsfLogName,
		},
		Unmapped: ocsfUnmapped{
			EventID:            o.GetEventId(),
			Cluster:            o.GetCluster(),
			Namespace:          o.GetNamespace(),
			Type:               o.GetType(),
			Reason:             o.GetReason(),
			ReportingComponent: o.GetReportingComponent(),
			InvolvedObject:     o.GetInvolvedObject(),
			Attribution:        o.GetAttribution(),
			Role:               o.GetRole(),
			Container:          o.GetContainer(),
			ImageRole:          o.GetImageRole(),
			Progress:           o.GetProgress(),
			MessageTruncated:   o.GetMessageTruncated(),
		},
	}
	if t := o.GetObservedAt(); t != nil {
		ev.Metadata.LoggedTime = t.AsTime().UnixMilli()
	}
	if t := o.GetOccurredAt(); t != nil {
		ev.Metadata.OriginalTime = t.AsTime().UTC().Format("2006-01-02T15:04:05.000000000Z07:00")
	}
	if pf := o.GetPullFailure(); pf != nil {
		ev.StatusDetail = pf.GetCategory()
		ev.Unmapped.PullFailure = &ocsfPullFailure{
			Category: pf.GetCategory(), Image: pf.GetImage(), Disposition: pf.GetDisposition(),
			Attempts: pf.GetAttempts(), Detail: pf.GetDetail(),
		}
	}
	if sb := o.GetSandbox(); sb.GetId() != "" {
		// The sandbox is the application whose lifecycle this is, named as
		// OpenShell's own audit events name it in their container object.
		ev.Unmapped.Sandbox = sb
		name := sb.GetName()
		if name == "" {
			name = sb.GetCrName()
		}
		ev.App = ocsfProduct{Name: name, UID: sb.GetId(), VendorName: ocsfSandboxVendor}
		ev.Container = &ocsfContainr{Name: name, UID: sb.GetId()}
		if img := o.GetImage(); img != "" {
			ev.Container.Image = &ocsfImage{Name: img}
		}
	} else {
		// No sandbox: the application is the Kubernetes object itself.
		ref := o.GetInvolvedObject()
		ev.App = ocsfProduct{Name: ref.GetKind() + "/" + ref.GetName(), UID: ref.GetUid(), VendorName: "Kubernetes"}
	}
	return ev
}

// AppendOCSF appends the OCSF JSON value of o to b.
func AppendOCSF(b []byte, o *eventpipev1.Occurrence) ([]byte, error) {
	v, err := json.Marshal(OCSF(o))
	if err != nil {
		return b, err
	}
	return append(b, v...), nil
}
