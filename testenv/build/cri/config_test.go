package cri

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
)

// kubeRuntimeJSON is the runtime config testenv/kube (the main module)
// writes with every field of its copy of these types set
// (TestRuntimeConfigForTheCRI there rewrites it).
const kubeRuntimeJSON = "testdata/kube-runtime-config.json"

// jsonKeys lists the JSON key paths type t reads ("images[].pull"); a type
// with its own UnmarshalJSON (Duration) is one value.
func jsonKeys(t reflect.Type, prefix string, out map[string]bool) {
	if reflect.PointerTo(t).Implements(reflect.TypeFor[json.Unmarshaler]()) {
		return
	}
	switch t.Kind() {
	case reflect.Slice:
		jsonKeys(t.Elem(), prefix+"[]", out)
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			out[prefix+"."+name] = true
			jsonKeys(t.Field(i).Type, prefix+"."+name, out)
		}
	}
}

// documentKeys lists the key paths a decoded JSON document holds.
func documentKeys(v any, prefix string, out map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			out[prefix+"."+k] = true
			documentKeys(e, prefix+"."+k, out)
		}
	case []any:
		for _, e := range v {
			documentKeys(e, prefix+"[]", out)
		}
	}
}

// TestKubeRuntimeConfigInStep: the main module's copy of the runtime config
// types (testenv/kube RuntimeConfig and its rules; the modules cannot share
// a package) writes what Config reads. The file it writes with every field
// set parses strictly here (a field only that side has is an unknown
// field), holds every key Config reads (a field only this side has is
// missing) and names exactly the pull outcomes this side knows.
func TestKubeRuntimeConfigInStep(t *testing.T) {
	b, err := os.ReadFile(kubeRuntimeJSON)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		t.Fatalf("%s (testenv/kube's RuntimeConfig) does not parse strictly: %v", kubeRuntimeJSON, err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	have, want := map[string]bool{}, map[string]bool{}
	documentKeys(doc, "", have)
	jsonKeys(reflect.TypeFor[Config](), "", want)
	var missing []string
	for k := range want {
		if !have[k] {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%s lacks %v: testenv/kube's RuntimeConfig cannot write them (add them there, set them in fullRuntimeConfig)",
			kubeRuntimeJSON, missing)
	}
	var pulls []string
	for _, r := range c.Images {
		pulls = append(pulls, r.Pull)
	}
	sort.Strings(pulls)
	known := slices.Clone(pullOutcomes)
	sort.Strings(known)
	if !slices.Equal(pulls, known) {
		t.Errorf("testenv/kube names the pull outcomes %v, this package %v", pulls, known)
	}
}
