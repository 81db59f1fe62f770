package kwire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"
)

// sandboxFixtures are Sandbox CRs as JSON (shapes from the OpenShell facts).
func sandboxFixtures() map[string]string {
	return map[string]string{
		"managed": `{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"Sandbox","metadata":{"name":"img-missing","namespace":"` + seedNS + `",
			"uid":"` + seedCRUID + `","resourceVersion":"5280","generation":1,"creationTimestamp":"2026-10-29T10:10:30Z",
			"labels":{"openshell.ai/sandbox-id":"` + seedID + `","openshell.ai/sandbox-name":"img-missing","openshell.ai/sandbox-workspace":"repro","openshell.ai/managed-by":"openshell","openshell.ai/gateway-id":"openshell","app":"x"},
			"annotations":{"openshell.ai/sandbox-id":"` + seedID + `","openshell.ai/sandbox-name":"img-missing","openshell.ai/sandbox-workspace":"repro","other":"y"},
			"managedFields":[{"manager":"openshell-gateway","operation":"Apply","apiVersion":"agents.x-k8s.io/v1beta1","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{}}}]},
			"spec":{"podTemplate":{"spec":{"containers":[{"name":"agent","image":"` + seedImage + `"}]}}},
			"status":{"conditions":[{"type":"Ready","status":"False","reason":"DependenciesNotReady","message":"Pod exists with phase: Pending; init container \"workspace-init\" is waiting: ImagePullBackOff","lastTransitionTime":"2026-10-29T10:10:40Z","observedGeneration":1}]}}`,
		"shared-pod-name": `{"apiVersion":"agents.x-k8s.io/v1alpha1","kind":"Sandbox","metadata":{"name":"repro--img-missing","namespace":"openshell","uid":"u2","resourceVersion":"9",
			"annotations":{"agents.x-k8s.io/pod-name":"img-missing-pod","openshell.io/sandbox-id":"` + seedID + `"},
			"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"owner","uid":"cm","controller":true},{"apiVersion":"v1","kind":"Secret","name":"s","uid":"s"}]},
			"status":{"conditions":[{"type":"Ready","status":"True"},"not-an-object",{"type":7,"status":null,"reason":"R","message":"ünïcode"}]}}`,
		"bare":            `{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"Sandbox","metadata":{"name":"b","namespace":"n"}}`,
		"empty-pod-name":  `{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"Sandbox","metadata":{"name":"e","annotations":{"agents.x-k8s.io/pod-name":""}},"status":{}}`,
		"null-conditions": `{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"Sandbox","metadata":{"name":"e"},"status":{"conditions":null}}`,
	}
}

func TestDecodeSandboxJSONEquivalence(t *testing.T) {
	fx := sandboxFixtures()
	for oname, o := range optionSets() {
		for _, name := range sortedNames(fx) {
			var u unstructured.Unstructured
			if err := u.UnmarshalJSON([]byte(fx[name])); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			want := refOf(o).sandbox(&u)
			got, err := DecodeSandboxJSON([]byte(fx[name]), o, podNameAnn)
			if err != nil {
				t.Fatalf("%s/%s: %v", oname, name, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s/%s:\n got %+v\nwant %+v", oname, name, got, want)
			}
		}
	}
	got, err := DecodeSandboxJSON([]byte(fx["shared-pod-name"]), nil, podNameAnn)
	if err != nil || got.PodName != "img-missing-pod" || len(got.Conditions) != 2 || got.Conditions[1].Message != "ünïcode" || got.Conditions[1].Type != "" {
		t.Errorf("shared: %+v %v", got, err)
	}
	if _, err := DecodeSandboxJSON([]byte(`{"metadata":`), nil, podNameAnn); err == nil {
		t.Error("truncated JSON accepted")
	}
}

// A JSON watch stream as the API server writes it for a CR, and a list.
func TestJSONStreams(t *testing.T) {
	fx := sandboxFixtures()
	names := sortedNames(fx)
	info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	var buf bytes.Buffer
	enc := restclientwatch.NewEncoder(streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&buf), info.StreamSerializer.Serializer),
		unstructured.UnstructuredJSONScheme)
	var objs []*unstructured.Unstructured
	for _, n := range names {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON([]byte(fx[n])); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, u)
		if err := enc.Encode(&watch.Event{Type: watch.Added, Object: u}); err != nil {
			t.Fatal(err)
		}
	}
	bm := &unstructured.Unstructured{}
	bm.SetAPIVersion("agents.x-k8s.io/v1beta1")
	bm.SetKind("Sandbox")
	bm.SetResourceVersion("12345")
	bm.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
	if err := enc.Encode(&watch.Event{Type: watch.Bookmark, Object: bm}); err != nil {
		t.Fatal(err)
	}
	st := &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version: 1 (5)"}
	stJSON, _ := json.Marshal(st)
	stObj := &unstructured.Unstructured{}
	if err := stObj.UnmarshalJSON(stJSON); err != nil {
		t.Fatal(err)
	}
	if err := enc.Encode(&watch.Event{Type: watch.Error, Object: stObj}); err != nil {
		t.Fatal(err)
	}

	dec := json.NewDecoder(&buf)
	for i := 0; i < len(names)+2; i++ {
		var msg json.RawMessage
		if err := dec.Decode(&msg); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		typ, obj, err := DecodeWatchEventJSON(msg)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case i < len(names):
			got, err := DecodeSandboxJSON(obj, &MetaOptions{KeepPrefixes: keepPrefix}, podNameAnn)
			if err != nil {
				t.Fatal(err)
			}
			want := refConv{keepPrefixes: keepPrefix, podNameAnn: podNameAnn}.sandbox(objs[i])
			if typ != "ADDED" || !reflect.DeepEqual(got, want) {
				t.Errorf("%s: %s\n got %+v\nwant %+v", names[i], typ, got, want)
			}
		case i == len(names):
			rv, end, err := BookmarkInfoJSON(obj)
			if typ != "BOOKMARK" || rv != "12345" || !end || err != nil {
				t.Errorf("bookmark: %s %q %v %v", typ, rv, end, err)
			}
		default:
			s, err := DecodeStatusJSON(obj)
			if typ != "ERROR" || err != nil || s.Code != 410 || !s.Expired() || s.Message != st.Message {
				t.Errorf("error event: %s %+v %v", typ, s, err)
			}
		}
	}

	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "SandboxList"}}
	list.SetResourceVersion("4242")
	list.SetContinue("tok")
	for _, u := range objs {
		list.Items = append(list.Items, *u)
	}
	lb, err := list.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	lm, err := ListItemsJSON(lb, func(item []byte) error {
		got, err := DecodeSandboxJSON(item, nil, podNameAnn)
		if err != nil {
			return err
		}
		if got.Name != objs[i].GetName() || got.UID != string(objs[i].GetUID()) {
			t.Errorf("item %d: %+v", i, got)
		}
		i++
		return nil
	})
	if err != nil || lm != (ListMeta{ResourceVersion: "4242", Continue: "tok"}) || i != len(objs) {
		t.Errorf("list: %+v %v %d", lm, err, i)
	}
}

func TestStatusJSONAndDiscovery(t *testing.T) {
	in := metav1.Status{Code: 400, Reason: metav1.StatusReasonBadRequest, Message: "sendInitialEvents is forbidden",
		Details: &metav1.StatusDetails{RetryAfterSeconds: 2, Causes: []metav1.StatusCause{{Type: metav1.CauseTypeFieldValueNotSupported, Message: "m", Field: "sendInitialEvents"}}}}
	b, _ := json.Marshal(in)
	s, err := DecodeStatusJSON(b)
	want := &Status{Code: 400, Reason: "BadRequest", Message: in.Message, RetryAfterSeconds: 2, Causes: []Cause{{Type: "FieldValueNotSupported", Message: "m", Field: "sendInitialEvents"}}}
	if err != nil || !equalStatus(s, want) {
		t.Errorf("got %+v %v", s, err)
	}
	rl := metav1.APIResourceList{GroupVersion: "agents.x-k8s.io/v1beta1", APIResources: []metav1.APIResource{{Name: "sandboxes", Kind: "Sandbox", Namespaced: true}, {Name: "sandboxes/status", Kind: "Sandbox"}}}
	b, _ = json.Marshal(rl)
	names, err := DecodeAPIResourceNamesJSON(b)
	if err != nil || !reflect.DeepEqual(names, []string{"sandboxes", "sandboxes/status"}) {
		t.Errorf("discovery: %v %v", names, err)
	}
	for _, bad := range []string{`{"type":"ADDED"}`, `{"object":{}}`, `[`, `{"type":"ADDED","object":null}`} {
		if _, _, err := DecodeWatchEventJSON([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
