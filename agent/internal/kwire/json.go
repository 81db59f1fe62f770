package kwire

import (
	"encoding/json"
	"strings"

	"github.com/eventpipe/eventpipe/enrich"
)

// The JSON forms serve the Sandbox CR (custom resources have no protobuf
// encoding) and discovery: low volume, so encoding/json is used.

func jsonError(what string, err error) error {
	return &Error{Path: what, Msg: err.Error()}
}

// DecodeWatchEventJSON decodes one JSON watch event {"type": ..., "object":
// {...}}. object is the object's JSON (a copy).
func DecodeWatchEventJSON(b []byte) (typ string, object []byte, err error) {
	var ev struct {
		Type   string          `json:"type"`
		Object json.RawMessage `json:"object"`
	}
	if err := json.Unmarshal(b, &ev); err != nil {
		return "", nil, jsonError("WatchEvent", err)
	}
	if ev.Type == "" {
		return "", nil, &Error{Path: "WatchEvent", Msg: "no type"}
	}
	if len(ev.Object) == 0 || string(ev.Object) == "null" {
		return "", nil, &Error{Path: "WatchEvent", Msg: "no object"}
	}
	return ev.Type, ev.Object, nil
}

// ListItemsJSON decodes a JSON list {"metadata": {...}, "items": [...]} and
// calls item with each item's JSON, in order. An error from item stops the
// walk and is returned as is.
func ListItemsJSON(b []byte, item func(raw []byte) error) (ListMeta, error) {
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
			Continue        string `json:"continue"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return ListMeta{}, jsonError("List", err)
	}
	for _, it := range l.Items {
		if err := item(it); err != nil {
			return ListMeta{}, err
		}
	}
	return ListMeta{ResourceVersion: l.Metadata.ResourceVersion, Continue: l.Metadata.Continue}, nil
}

// DecodeStatusJSON decodes a JSON metav1.Status (an error response body or
// an ERROR watch event's object).
func DecodeStatusJSON(b []byte) (*Status, error) {
	var s struct {
		Code    int32  `json:"code"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
		Details *struct {
			Causes []struct {
				Type    string `json:"reason"`
				Message string `json:"message"`
				Field   string `json:"field"`
			} `json:"causes"`
			RetryAfterSeconds int32 `json:"retryAfterSeconds"`
		} `json:"details"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, jsonError("Status", err)
	}
	out := &Status{Code: s.Code, Reason: s.Reason, Message: s.Message}
	if s.Details != nil {
		out.RetryAfterSeconds = s.Details.RetryAfterSeconds
		for _, c := range s.Details.Causes {
			out.Causes = append(out.Causes, Cause{Type: c.Type, Message: c.Message, Field: c.Field})
		}
	}
	return out, nil
}

// BookmarkInfoJSON is BookmarkInfo for a JSON object.
func BookmarkInfoJSON(b []byte) (resourceVersion string, initialEventsEnd bool, err error) {
	var o struct {
		Metadata struct {
			ResourceVersion string            `json:"resourceVersion"`
			Annotations     map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return "", false, jsonError("bookmark", err)
	}
	return o.Metadata.ResourceVersion, o.Metadata.Annotations[InitialEventsEndAnnotation] == "true", nil
}

type ownerJSON struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
	Controller *bool  `json:"controller"`
}

// DecodeSandboxJSON decodes an Agent Sandbox CR (JSON) into what enrich
// reads: metadata (labels/annotations filtered by o), apiVersion, PodName
// (the podNameAnnotation's value, else the CR name) and status.conditions
// (non-string condition fields read as "", non-object entries skipped).
func DecodeSandboxJSON(b []byte, o *MetaOptions, podNameAnnotation string) (*enrich.Sandbox, error) {
	var u struct {
		APIVersion string `json:"apiVersion"`
		Metadata   struct {
			Name            string            `json:"name"`
			Namespace       string            `json:"namespace"`
			UID             string            `json:"uid"`
			ResourceVersion string            `json:"resourceVersion"`
			Labels          map[string]string `json:"labels"`
			Annotations     map[string]string `json:"annotations"`
			OwnerReferences []ownerJSON       `json:"ownerReferences"`
		} `json:"metadata"`
		Status struct {
			Conditions []any `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(b, &u); err != nil {
		return nil, jsonError("Sandbox", err)
	}
	md := &u.Metadata
	s := &enrich.Sandbox{
		Meta: enrich.Meta{
			Namespace: o.internString(md.Namespace), Name: md.Name, UID: md.UID, ResourceVersion: md.ResourceVersion,
			Labels: o.keepMap(md.Labels), Annotations: o.keepMap(md.Annotations),
		},
		APIVersion: o.internString(u.APIVersion),
		PodName:    md.Name,
	}
	for _, r := range md.OwnerReferences {
		s.Owners = append(s.Owners, enrich.Owner{APIVersion: o.internString(r.APIVersion), Kind: o.internString(r.Kind), Name: r.Name, UID: r.UID,
			Controller: r.Controller != nil && *r.Controller})
	}
	if v := md.Annotations[podNameAnnotation]; v != "" {
		s.PodName = v
	}
	for _, ci := range u.Status.Conditions {
		cm, ok := ci.(map[string]any)
		if !ok {
			continue
		}
		str := func(k string) string { v, _ := cm[k].(string); return v }
		s.Conditions = append(s.Conditions, enrich.Condition{Type: str("type"), Status: str("status"), Reason: str("reason"), Message: str("message")})
	}
	return s, nil
}

func (o *MetaOptions) internString(s string) string {
	if s == "" || o == nil || o.Intern == nil {
		return s
	}
	return o.Intern([]byte(s))
}

func (o *MetaOptions) keepMap(m map[string]string) map[string]string {
	if o == nil {
		return nil
	}
	var out map[string]string
	for k, v := range m {
		for _, p := range o.KeepPrefixes {
			if strings.HasPrefix(k, p) {
				if out == nil {
					out = make(map[string]string, 4)
				}
				if o.Intern != nil && k != "" {
					k = o.Intern([]byte(k))
				}
				if v != "" {
					v = o.internSmall([]byte(v))
				}
				out[k] = v
				break
			}
		}
	}
	return out
}

// DecodeAPIResourceNamesJSON returns the resource names of a discovery
// APIResourceList (e.g. "sandboxes", "sandboxes/status").
func DecodeAPIResourceNamesJSON(b []byte) ([]string, error) {
	var l struct {
		Resources []struct {
			Name string `json:"name"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, jsonError("APIResourceList", err)
	}
	out := make([]string, 0, len(l.Resources))
	for _, r := range l.Resources {
		out = append(out, r.Name)
	}
	return out, nil
}
