package kafka

import (
	"encoding/json"
	"regexp"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/eventpipe/eventpipe/api/buildinfo"
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
// Agent Sandbox controller's, and the container waiting reasons of
// eventpipe's pod status diagnosis; no reason is Unknown, any other is Other
// (whose activity_name is then the reason itself, as OCSF asks of Other).
func ocsfActivity(o *eventpipev1.Occurrence) int {
	switch o.GetReason() {
	case "Scheduled", "FailedScheduling", "Pulling", "Pulled", "Failed", "ErrImagePull",
		"ImagePullBackOff", "InspectFailed", "ErrImageNeverPull", "Created", "Started",
		"FailedCreatePodSandBox", "FailedMount", "FailedAttachVolume", "SuccessfulAttachVolume",
		"ProvisioningFailed", "ProvisioningSucceeded", "FailedCreate", "SuccessfulCreate",
		"PodCreated", "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
		"InvalidImageName":
		return OCSFActivityStart
	case "CrashLoopBackOff":
		return OCSFActivityRestart
	case "":
		return OCSFActivityUnknown
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

// ocsfSeverityStatus derives severity, status and status_detail. A pull
// failure or a blocker is a failed start whatever the Event's type says
// (kubelet reports some back-offs as Normal): High when it is persistent
// (retrying will not fix it), else Medium, with the pull-failure category
// or the blocker's cause as the detail.
func ocsfSeverityStatus(o *eventpipev1.Occurrence) (severity, status int, detail string) {
	disposition := ""
	switch {
	case o.GetPullFailure() != nil:
		disposition, detail = o.GetPullFailure().GetDisposition(), o.GetPullFailure().GetCategory()
	case o.GetBlocker() != nil:
		disposition, detail = o.GetBlocker().GetDisposition(), o.GetBlocker().GetCause()
	default:
		switch o.GetType() {
		case "Normal":
			return OCSFSeverityInformational, OCSFStatusSuccess, ""
		case "Warning":
			return OCSFSeverityMedium, OCSFStatusFailure, ""
		}
		return OCSFSeverityLow, OCSFStatusUnknown, ""
	}
	if disposition == eventpipev1.DispositionPersistent {
		return OCSFSeverityHigh, OCSFStatusFailure, detail
	}
	return OCSFSeverityMedium, OCSFStatusFailure, detail
}

// The OCSF objects eventpipe fills. Field names are OCSF attribute names;
// docs/ocsf.md says where each field of the occurrence goes and why.
type (
	ocsfEvent struct {
		ClassUID     int          `json:"class_uid"`
		ClassName    string       `json:"class_name"`
		CategoryUID  int          `json:"category_uid"`
		CategoryName string       `json:"category_name"`
		ActivityID   int          `json:"activity_id"`
		ActivityName string       `json:"activity_name"`
		TypeUID      int          `json:"type_uid"`
		TypeName     string       `json:"type_name"`
		Time         int64        `json:"time"`
		SeverityID   int          `json:"severity_id"`
		Severity     string       `json:"severity"`
		StatusID     int          `json:"status_id"`
		Status       string       `json:"status"`
		StatusCode   string       `json:"status_code,omitempty"`
		StatusDetail string       `json:"status_detail,omitempty"`
		Message      string       `json:"message"`
		Count        int32        `json:"count,omitempty"`
		Metadata     ocsfMetadata `json:"metadata"`
		App          ocsfProduct  `json:"app"`
		Device       *ocsfDevice  `json:"device,omitempty"`
		Unmapped     ocsfUnmapped `json:"unmapped"`
	}
	ocsfMetadata struct {
		Version          string      `json:"version"`
		Product          ocsfProduct `json:"product"`
		Profiles         []string    `json:"profiles,omitempty"`
		UID              string      `json:"uid"`
		OriginalEventUID string      `json:"original_event_uid,omitempty"`
		CorrelationUID   string      `json:"correlation_uid,omitempty"`
		EventCode        string      `json:"event_code,omitempty"`
		LogName          string      `json:"log_name"`
		LoggedTime       int64       `json:"logged_time,omitempty"`
		OriginalTime     string      `json:"original_time,omitempty"`
		IsTruncated      bool        `json:"is_truncated,omitempty"`
	}
	ocsfProduct struct {
		Name       string `json:"name"`
		VendorName string `json:"vendor_name"`
		Version    string `json:"version,omitempty"`
		UID        string `json:"uid,omitempty"`
	}
	// ocsfDevice is the node the kubelet that reported the event runs on
	// (host profile); it carries the container (the container profile of
	// the endpoint object).
	ocsfDevice struct {
		TypeID    int            `json:"type_id"`
		Type      string         `json:"type"`
		Name      string         `json:"name"`
		Container *ocsfContainer `json:"container,omitempty"`
	}
	ocsfContainer struct {
		Name         string     `json:"name"`
		PodUUID      string     `json:"pod_uuid,omitempty"`
		Orchestrator string     `json:"orchestrator"`
		Image        *ocsfImage `json:"image,omitempty"`
	}
	ocsfImage struct {
		UID  string `json:"uid"`
		Name string `json:"name"`
	}
	// ocsfUnmapped holds every field of the occurrence OCSF has no
	// attribute for, under eventpipe's own names (those of the JSON value
	// format), and copies of the ones whose OCSF attribute changes their
	// form (the sandbox in app, times in milliseconds).
	ocsfUnmapped struct {
		SchemaVersion      uint32           `json:"schema_version,omitempty"`
		EventID            string           `json:"event_id"`
		ObservedAt         string           `json:"observed_at,omitempty"`
		Cluster            string           `json:"cluster,omitempty"`
		Namespace          string           `json:"namespace,omitempty"`
		Event              *ocsfEventRef    `json:"event,omitempty"`
		InvolvedObject     *ocsfObjectRef   `json:"involved_object,omitempty"`
		Type               string           `json:"type,omitempty"`
		Reason             string           `json:"reason,omitempty"`
		MessageTruncated   bool             `json:"message_truncated,omitempty"`
		ReportingComponent string           `json:"reporting_component,omitempty"`
		ReportingInstance  string           `json:"reporting_instance,omitempty"`
		Action             string           `json:"action,omitempty"`
		Sandbox            *ocsfSandbox     `json:"sandbox,omitempty"`
		Attribution        string           `json:"attribution,omitempty"`
		Role               string           `json:"role,omitempty"`
		Container          string           `json:"container,omitempty"`
		Image              string           `json:"image,omitempty"`
		ImageRole          string           `json:"image_role,omitempty"`
		PullFailure        *ocsfPullFailure `json:"pull_failure,omitempty"`
		Progress           *ocsfProgress    `json:"progress,omitempty"`
		Blocker            *ocsfBlocker     `json:"blocker,omitempty"`
	}
	ocsfEventRef struct {
		Name            string `json:"name,omitempty"`
		UID             string `json:"uid,omitempty"`
		ResourceVersion string `json:"resource_version,omitempty"`
		APIVersion      string `json:"api_version,omitempty"`
	}
	ocsfObjectRef struct {
		Kind       string `json:"kind,omitempty"`
		APIVersion string `json:"api_version,omitempty"`
		Namespace  string `json:"namespace,omitempty"`
		Name       string `json:"name,omitempty"`
		UID        string `json:"uid,omitempty"`
		FieldPath  string `json:"field_path,omitempty"`
	}
	ocsfSandbox struct {
		ID          string `json:"id,omitempty"`
		Name        string `json:"name,omitempty"`
		Workspace   string `json:"workspace,omitempty"`
		GatewayID   string `json:"gateway_id,omitempty"`
		CRNamespace string `json:"cr_namespace,omitempty"`
		CRName      string `json:"cr_name,omitempty"`
		DeletedAt   string `json:"deleted_at,omitempty"`
	}
	ocsfPullFailure struct {
		Category    string `json:"category"`
		Image       string `json:"image,omitempty"`
		Disposition string `json:"disposition,omitempty"`
		Attempts    uint32 `json:"attempts,omitempty"`
		FirstSeen   string `json:"first_seen,omitempty"`
		LastSeen    string `json:"last_seen,omitempty"`
		Detail      string `json:"detail,omitempty"`
		Source      string `json:"source,omitempty"`
		DecidedBy   string `json:"decided_by,omitempty"`
		Confidence  string `json:"confidence,omitempty"`
	}
	ocsfProgress struct {
		CompleteStep  string `json:"complete_step,omitempty"`
		CompleteLabel string `json:"complete_label,omitempty"`
		ActiveStep    string `json:"active_step,omitempty"`
		ActiveDetail  string `json:"active_detail,omitempty"`
	}
	ocsfBlocker struct {
		Kind        string `json:"kind"`
		Cause       string `json:"cause,omitempty"`
		Object      string `json:"object,omitempty"`
		Container   string `json:"container,omitempty"`
		Disposition string `json:"disposition,omitempty"`
		Attempts    uint32 `json:"attempts,omitempty"`
		FirstSeen   string `json:"first_seen,omitempty"`
		LastSeen    string `json:"last_seen,omitempty"`
		Detail      string `json:"detail,omitempty"`
		Source      string `json:"source,omitempty"`
		Fix         string `json:"fix,omitempty"`
		ExitCode    int32  `json:"exit_code,omitempty"`
		HasExitCode bool   `json:"has_exit_code,omitempty"`
		DecidedBy   string `json:"decided_by,omitempty"`
		Confidence  string `json:"confidence,omitempty"`
	}
)

// ocsfTime is a time of the occurrence in the unmapped members: RFC 3339
// UTC with nanoseconds, as in the JSON value format ("" when unset).
func ocsfTime(t *timestamppb.Timestamp) string {
	if t == nil {
		return ""
	}
	return t.AsTime().UTC().Format(time.RFC3339Nano)
}

// OCSF returns the OCSF 1.8.0 Application Lifecycle event for o.
func OCSF(o *eventpipev1.Occurrence) ocsfEvent {
	activity := ocsfActivity(o)
	activityName := ocsfActivityNames[activity]
	if activity == OCSFActivityOther {
		// Other: the activity name is the source's own word for it.
		activityName = o.GetReason()
	}
	severity, status, detail := ocsfSeverityStatus(o)
	ev := ocsfEvent{
		ClassUID:     OCSFClassUID,
		ClassName:    OCSFClassName,
		CategoryUID:  OCSFCategoryUID,
		CategoryName: OCSFCategoryName,
		ActivityID:   activity,
		ActivityName: activityName,
		TypeUID:      OCSFClassUID*100 + activity,
		TypeName:     OCSFClassName + ": " + ocsfActivityNames[activity],
		Time:         o.GetOccurredAt().AsTime().UnixMilli(),
		SeverityID:   severity,
		Severity:     ocsfSeverityNames[severity],
		StatusID:     status,
		Status:       ocsfStatusNames[status],
		StatusCode:   o.GetReason(),
		StatusDetail: detail,
		Message:      o.GetMessage(),
		Count:        o.GetCount(),
		Metadata: ocsfMetadata{
			Version:          OCSFVersion,
			Product:          ocsfProduct{Name: ocsfProductName, VendorName: ocsfProductVendor, Version: buildinfo.Version()},
			UID:              o.GetEventId(),
			OriginalEventUID: o.GetEvent().GetUid(),
			CorrelationUID:   o.GetSandbox().GetId(),
			EventCode:        o.GetReason(),
			LogName:          ocsfLogName,
			IsTruncated:      o.GetMessageTruncated(),
		},
		Unmapped: ocsfUnmapped{
			SchemaVersion:      o.GetSchemaVersion(),
			EventID:            o.GetEventId(),
			ObservedAt:         ocsfTime(o.GetObservedAt()),
			Cluster:            o.GetCluster(),
			Namespace:          o.GetNamespace(),
			Type:               o.GetType(),
			Reason:             o.GetReason(),
			MessageTruncated:   o.GetMessageTruncated(),
			ReportingComponent: o.GetReportingComponent(),
			ReportingInstance:  o.GetReportingInstance(),
			Action:             o.GetAction(),
			Attribution:        o.GetAttribution(),
			Role:               o.GetRole(),
			Container:          o.GetContainer(),
			Image:              o.GetImage(),
			ImageRole:          o.GetImageRole(),
		},
	}
	if t := o.GetObservedAt(); t != nil {
		ev.Metadata.LoggedTime = t.AsTime().UnixMilli()
	}
	if t := o.GetOccurredAt(); t != nil {
		ev.Metadata.OriginalTime = t.AsTime().UTC().Format("2006-01-02T15:04:05.000000000Z07:00")
	}
	if e := o.GetEvent(); e != nil {
		ev.Unmapped.Event = &ocsfEventRef{Name: e.GetName(), UID: e.GetUid(), ResourceVersion: e.GetResourceVersion(), APIVersion: e.GetApiVersion()}
	}
	if r := o.GetInvolvedObject(); r != nil {
		ev.Unmapped.InvolvedObject = &ocsfObjectRef{Kind: r.GetKind(), APIVersion: r.GetApiVersion(), Namespace: r.GetNamespace(),
			Name: r.GetName(), UID: r.GetUid(), FieldPath: r.GetFieldPath()}
	}
	if p := o.GetProgress(); p != nil {
		ev.Unmapped.Progress = &ocsfProgress{CompleteStep: p.GetCompleteStep(), CompleteLabel: p.GetCompleteLabel(),
			ActiveStep: p.GetActiveStep(), ActiveDetail: p.GetActiveDetail()}
	}
	if pf := o.GetPullFailure(); pf != nil {
		ev.Unmapped.PullFailure = &ocsfPullFailure{
			Category: pf.GetCategory(), Image: pf.GetImage(), Disposition: pf.GetDisposition(), Attempts: pf.GetAttempts(),
			FirstSeen: ocsfTime(pf.GetFirstSeen()), LastSeen: ocsfTime(pf.GetLastSeen()), Detail: pf.GetDetail(), Source: pf.GetSource(),
			DecidedBy: pf.GetDecidedBy(), Confidence: pf.GetConfidence(),
		}
	}
	if bl := o.GetBlocker(); bl != nil {
		ev.Unmapped.Blocker = &ocsfBlocker{
			Kind: bl.GetKind(), Cause: bl.GetCause(), Object: bl.GetObject(), Container: bl.GetContainer(),
			Disposition: bl.GetDisposition(), Attempts: bl.GetAttempts(), FirstSeen: ocsfTime(bl.GetFirstSeen()),
			LastSeen: ocsfTime(bl.GetLastSeen()), Detail: bl.GetDetail(), Source: bl.GetSource(), Fix: bl.GetFix(),
			ExitCode: bl.GetExitCode(), HasExitCode: bl.GetHasExitCode(),
			DecidedBy: bl.GetDecidedBy(), Confidence: bl.GetConfidence(),
		}
	}
	if sb := o.GetSandbox(); sb != nil {
		ev.Unmapped.Sandbox = &ocsfSandbox{ID: sb.GetId(), Name: sb.GetName(), Workspace: sb.GetWorkspace(),
			GatewayID: sb.GetGatewayId(), CRNamespace: sb.GetCrNamespace(), CRName: sb.GetCrName(), DeletedAt: ocsfTime(sb.GetDeletedAt())}
	}
	ev.App = ocsfApp(o)
	if d := ocsfNode(o); d != nil {
		ev.Device = d
		ev.Metadata.Profiles = []string{"host", "container"}
	}
	return ev
}

// ocsfApp is the application whose lifecycle the event reports: the
// sandbox, else the Kubernetes object the event is about.
func ocsfApp(o *eventpipev1.Occurrence) ocsfProduct {
	if sb := o.GetSandbox(); sb.GetId() != "" {
		name := sb.GetName()
		if name == "" {
			name = sb.GetCrName()
		}
		return ocsfProduct{Name: name, UID: sb.GetId(), VendorName: ocsfSandboxVendor}
	}
	ref := o.GetInvolvedObject()
	app := ocsfProduct{UID: ref.GetUid(), VendorName: "Kubernetes"}
	if ref.GetName() != "" {
		app.Name = ref.GetKind() + "/" + ref.GetName()
	}
	if app.Name == "" && app.UID == "" {
		app.Name = "unknown" // the product object needs a name or a uid
	}
	return app
}

// ocsfNode is the device of a container event the kubelet reported: the
// node (the kubelet's instance), with the container named by the event.
// Other reporters (the scheduler, controllers, eventpipe's own pod status
// diagnosis) run elsewhere than the container, so their events carry no
// device and the container stays in unmapped.
func ocsfNode(o *eventpipev1.Occurrence) *ocsfDevice {
	node, name := o.GetReportingInstance(), o.GetContainer()
	if o.GetReportingComponent() != "kubelet" || node == "" || name == "" {
		return nil
	}
	c := &ocsfContainer{Name: name, Orchestrator: "Kubernetes"}
	if ref := o.GetInvolvedObject(); ref.GetKind() == "Pod" && uuidRE.MatchString(ref.GetUid()) {
		c.PodUUID = ref.GetUid()
	}
	// The image object needs the image's unique id: only a reference
	// pinned by digest has one. A tag alone stays in unmapped.image.
	if img := o.GetImage(); img != "" {
		if at := strings.LastIndexByte(img, '@'); at > 0 && digestRE.MatchString(img[at+1:]) {
			c.Image = &ocsfImage{UID: img[at+1:], Name: img}
		}
	}
	return &ocsfDevice{TypeID: 0, Type: "Unknown", Name: node, Container: c}
}

var (
	uuidRE   = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	digestRE = regexp.MustCompile(`^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}$`)
)

// AppendOCSF appends the OCSF JSON value of o to b.
func AppendOCSF(b []byte, o *eventpipev1.Occurrence) ([]byte, error) {
	v, err := json.Marshal(OCSF(o))
	if err != nil {
		return b, err
	}
	return append(b, v...), nil
}
