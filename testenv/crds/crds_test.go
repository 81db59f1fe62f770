package crds

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestEmbeddedSandboxCRD(t *testing.T) {
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || objs[0].GetName() != "sandboxes."+Group {
		t.Fatalf("embedded CRDs: %d, first %q", len(objs), objs[0].GetName())
	}
	versions, _, _ := unstructured.NestedSlice(objs[0].Object, "spec", "versions")
	got := map[string][2]bool{}
	for _, v := range versions {
		m := v.(map[string]any)
		if _, ok, _ := unstructured.NestedMap(m, "subresources", "status"); !ok {
			t.Errorf("version %v has no status subresource", m["name"])
		}
		// The YAML aliases must have expanded into a real schema per version.
		if _, ok, _ := unstructured.NestedMap(m, "schema", "openAPIV3Schema", "properties", "status", "properties", "conditions"); !ok {
			t.Errorf("version %v has no status.conditions schema", m["name"])
		}
		got[m["name"].(string)] = [2]bool{m["served"].(bool), m["storage"].(bool)}
	}
	want := map[string][2]bool{SandboxV1beta1.Version: {true, true}, SandboxV1alpha1.Version: {true, false}}
	if len(got) != len(want) || got["v1beta1"] != want["v1beta1"] || got["v1alpha1"] != want["v1alpha1"] {
		t.Errorf("versions (served, storage) = %v, want %v", got, want)
	}
}
