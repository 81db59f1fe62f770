package kwire

import (
	"encoding/json"
	"strings"

	"github.com/eventpipe/eventpipe/enrich"
)

// The JSON forms serve the Sandbox CR (custom resources have no protobuf
// encoding) and discovery: low volume, so encoding/json is used. Objects
// are read member by member through maps because encoding/json matches
// struct fields case-insensitively while the API machinery (and so the
// typed/unstructured path kwire must equal) matches keys exactly.

func jsonError(what string, err error) error {
	return &Error{Path: what, Msg: err.Error()}
}

// object is a JSON object's members by exact key; null gives an empty one.
type object map[string]json.RawMessage

func parseObject(b []byte, what string) (object, error) {
	var o object
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, jsonError(what, err)
	}
	return o, nil
}

// into decodes member key (absent or null: v is left as is) into v.
func (o object) into(key string, v any, what string) error {
	m, ok := o[key]
	if !ok {
		return nil
	}
	if err := json.Unmarshal(m, v); err != nil {
		return jsonError(what+"."+key, err)
	}
	return nil
}

// obj returns member key as an object (absent or null: empty).
func (o object) obj(key, what string) (object, error) {
	m, ok := o[key]
	if !ok {
		return nil, nil
	}
	return parseObject(m, what+"."+key)
}

// strs decodes the string members keys[i] into dst[i].
func (o object) strs(what string, keys []string, dst ...*string) error {
	for i, k := range keys {
		if err := o.into(k, dst[i], what); err != nil {
			return err
		}
	}
	return nil
}

// DecodeWatchEventJSON decodes one JSON watch event {"type": ..., "object":
// {...}}. object is the object's JSON (a copy).
func DecodeWatchEventJSON(b []byte) (typ string, object []byte, err error) {
	o, err := parseObject(b, "WatchEvent")
	if err != nil {
		return "", nil, err
	}
	if err := o.into("type", &typ, "WatchEvent"); err != nil {
		return "", nil, err
	}
	if typ == "" {
		return "", nil, &Error{Path: "WatchEvent", Msg: "no type"}
	}
	obj := o["object"]
	if len(obj) == 0 || string(obj) == "null" {
		return "", nil, &Error{Path: "WatchEvent", Msg: "no object"}
	}
	return eventTypeString(typ), obj, nil
}

func eventTypeString(s string) string { return eventType([]byte(s)) }

// ListItemsJSON decodes a JSON list {"metadata": {...}, "items": [...]} and
// calls item with each item's JSON, in order. An error from item stops the
// walk and is returned as is.
func ListItemsJSON(b []byte, item func(raw []byte) error) (ListMeta, error) {
	o, err := parseObject(b, "List")
	if err != nil {
		return ListMeta{}, err
	}
	md, err := o.obj("metadata", "List")
	if err != nil {
		return ListMeta{}, err
	}
	var lm ListMeta
	if err := md.strs("List.metadata", []string{"resourceVersion", "continue"}, &lm.ResourceVersion, &lm.Continue); err != nil {
		return ListMeta{}, err
	}
	var items []json.RawMessage
	if err := o.into("items", &items, "List"); err != nil {
		return ListMeta{}, err
	}
	for _, it := range items {
		if err := item(it); err != nil {
			return ListMeta{}, err
		}
	}
	return lm, nil
}

// DecodeStatusJSON decodes a JSON metav1.Status (an error response body or
// an ERROR watch event's object).
func DecodeStatusJSON(b []byte) (*Status, error) {
	o, err := parseObject(b, "Status")
	if err != nil {
		return nil, err
	}
	s := &Status{}
	if err := o.into("code", &s.Code, "Status"); err != nil {
		return nil, err
	}
	if err := o.strs("Status", []string{"reason", "message"}, &s.Reason, &s.Message); err != nil {
		return nil, err
	}
	d, err := o.obj("details", "Status")
	if err != nil {
		return nil, err
	}
	if err := d.into("retryAfterSeconds", &s.RetryAfterSeconds, "Status.details"); err != nil {
		return nil, err
	}
	var causes []object
	if err := d.into("causes", &causes, "Status.details"); err != nil {
		return nil, err
	}
	for _, c := range causes {
		var cs Cause
		if err := c.strs("Status.details.causes", []string{"reason", "message", "field"}, &cs.Type, &cs.Message, &cs.Field); err != nil {
			return nil, err
		}
		s.Causes = append(s.Causes, cs)
	}
	return s, nil
}

// BookmarkInfoJSON is BookmarkInfo for a JSON object.
func BookmarkInfoJSON(b []byte) (resourceVersion string, initialEventsEnd bool, err error) {
	o, err := parseObject(b, "bookmark")
	if err != nil {
		return "", false, err
	}
	md, err := o.obj("metadata", "bookmark")
	if err != nil {
		return "", false, err
	}
	var ann map[string]string
	if err := md.into("resourceVersion", &resourceVersion, "bookmark.metadata"); err != nil {
		return "", false, err
	}
	if err := md.into("annotations", &ann, "bookmark.metadata"); err != nil {
		return "", false, err
	}
	return resourceVersion, ann[InitialEventsEndAnnotation] == "true", nil
}

// DecodeSandboxJSON decodes an Agent Sandbox CR (JSON) into what enrich
// reads: metadata (labels/annotations filtered by o), apiVersion, PodName
// (the podNameAnnotation's value, else the CR name) and status.conditions
// (non-string condition fields read as "", non-object entries skipped, as
// the unstructured path did). Metadata of the wrong JSON type is an error.
func DecodeSandboxJSON(b []byte, o *MetaOptions, podNameAnnotation string) (*enrich.Sandbox, error) {
	const what = "Sandbox"
	u, err := parseObject(b, what)
	if err != nil {
		return nil, err
	}
	var apiVersion string
	if err := u.into("apiVersion", &apiVersion, what); err != nil {
		return nil, err
	}
	md, err := u.obj("metadata", what)
	if err != nil {
		return nil, err
	}
	var m enrich.Meta
	var ns string
	if err := md.strs(what+".metadata", []string{"name", "namespace", "uid", "resourceVersion"}, &m.Name, &ns, &m.UID, &m.ResourceVersion); err != nil {
		return nil, err
	}
	m.Namespace = o.internString(ns)
	var labels, ann map[string]string
	if err := md.into("labels", &labels, what+".metadata"); err != nil {
		return nil, err
	}
	if err := md.into("annotations", &ann, what+".metadata"); err != nil {
		return nil, err
	}
	m.Labels, m.Annotations = o.keepMap(labels), o.keepMap(ann)
	var owners []object
	if err := md.into("ownerReferences", &owners, what+".metadata"); err != nil {
		return nil, err
	}
	for _, r := range owners {
		var ow enrich.Owner
		var av, kind string
		var controller *bool
		if err := r.strs(what+".metadata.ownerReferences", []string{"apiVersion", "kind", "name", "uid"}, &av, &kind, &ow.Name, &ow.UID); err != nil {
			return nil, err
		}
		if err := r.into("controller", &controller, what+".metadata.ownerReferences"); err != nil {
			return nil, err
		}
		ow.APIVersion, ow.Kind, ow.Controller = o.internString(av), o.internString(kind), controller != nil && *controller
		m.Owners = append(m.Owners, ow)
	}
	s := &enrich.Sandbox{Meta: m, APIVersion: o.internString(apiVersion), PodName: m.Name}
	if v := ann[podNameAnnotation]; v != "" {
		s.PodName = v
	}
	status, err := u.obj("status", what)
	if err != nil {
		return nil, err
	}
	var conds []any
	if c, ok := status["conditions"]; ok {
		// Not a list: no conditions, as unstructured.NestedSlice says.
		_ = json.Unmarshal(c, &conds)
	}
	for _, ci := range conds {
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

func (o *MetaOptions) keepMap(m map[string]string) enrich.Pairs {
	if o == nil {
		return nil
	}
	var buf [8]enrich.Pair
	out := buf[:0]
	for k, v := range m {
		for _, p := range o.KeepPrefixes {
			if strings.HasPrefix(k, p) {
				if o.Intern != nil && k != "" {
					k = o.Intern([]byte(k))
				}
				if v != "" {
					v = o.internSmall([]byte(v))
				}
				out = setPair(out, k, v)
				break
			}
		}
	}
	return finishPairs(out)
}

// DecodeAPIResourceNamesJSON returns the resource names of a discovery
// APIResourceList (e.g. "sandboxes", "sandboxes/status").
func DecodeAPIResourceNamesJSON(b []byte) ([]string, error) {
	o, err := parseObject(b, "APIResourceList")
	if err != nil {
		return nil, err
	}
	var rs []object
	if err := o.into("resources", &rs, "APIResourceList"); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		var name string
		if err := r.into("name", &name, "APIResourceList.resources"); err != nil {
			return nil, err
		}
		out = append(out, name)
	}
	return out, nil
}
