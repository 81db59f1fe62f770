package kube

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

var updateRuntimeJSON = flag.Bool("update-runtime-json", false,
	"rewrite ../build/cri/testdata/kube-runtime-config.json from fullRuntimeConfig")

// criRuntimeJSON is the runtime config this module writes with every field
// set; the CRI's own test (testenv/build/cri, TestKubeRuntimeConfigInStep)
// decodes it strictly into its types and checks that it holds every key
// they read. The two modules cannot share the types, so this file keeps
// them in step.
var criRuntimeJSON = filepath.Join("..", "build", "cri", "testdata", "kube-runtime-config.json")

// fullRuntimeConfig sets every field of RuntimeConfig and its rules, and
// names every pull outcome once.
func fullRuntimeConfig() RuntimeConfig {
	rc := RuntimeConfig{
		Runtime: "cri-o",
		Images: []ImageRule{{Image: "registry.example:5000/team/app:1.2", Pull: PullIOTimeout,
			Delay: Duration(1500 * time.Millisecond), Addr: "10.0.0.9:5000", Platform: "linux/arm64"}},
		Containers: []ContainerRule{{Namespace: "ns", Pod: "agent-*", Container: "agent", Image: "busybox:1",
			ExitAfter: Duration(2 * time.Second), ExitCode: 137, OOMKilled: true,
			Exec: []ExecRule{{Command: []string{"cat", "/ready"}, ExitCode: 1, Stdout: "out", Stderr: "err"}}}},
		Processes: []ProcessRule{{Namespace: "eventpipe", Pod: "ep-*", Container: "collector", Image: "ghcr.io/eventpipe/eventpipe:0.1.0",
			Run: "/usr/local/bin/eventpipe"}},
	}
	for _, p := range []string{PullOK, PullNotFound, PullUnauthorized, PullRateLimited, PullTLS, PullDNS,
		PullConnectionRefused, PullPlatformMismatch} { // PullIOTimeout above
		rc.Images = append(rc.Images, ImageRule{Image: "busybox:" + p, Pull: p})
	}
	return rc
}

// unsetFields lists the fields of v that are zero, by Go path; of a slice
// it checks the first element.
func unsetFields(v reflect.Value, path string) []string {
	switch v.Kind() {
	case reflect.Struct:
		var out []string
		for i := 0; i < v.NumField(); i++ {
			p := path + "." + v.Type().Field(i).Name
			if v.Field(i).IsZero() {
				out = append(out, p)
				continue
			}
			out = append(out, unsetFields(v.Field(i), p)...)
		}
		return out
	case reflect.Slice:
		if v.Len() > 0 {
			return unsetFields(v.Index(0), path+"[0]")
		}
	}
	return nil
}

// TestRuntimeConfigForTheCRI: fullRuntimeConfig sets every field (a field
// added to RuntimeConfig or a rule fails here until it is set), and its
// JSON is the CRI's test file, which
//
//	go test -run TestRuntimeConfigForTheCRI ./testenv/kube -args -update-runtime-json
//
// rewrites; the CRI's test then refuses a field its types lack.
func TestRuntimeConfigForTheCRI(t *testing.T) {
	rc := fullRuntimeConfig()
	if unset := unsetFields(reflect.ValueOf(rc), "RuntimeConfig"); len(unset) > 0 {
		t.Errorf("fullRuntimeConfig leaves %v unset: set them, so the CRI's test sees them", unset)
	}
	b, err := json.MarshalIndent(rc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	if *updateRuntimeJSON {
		if err := os.WriteFile(criRuntimeJSON, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, err := os.ReadFile(criRuntimeJSON)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(old, b) {
		t.Errorf("%s is not the JSON of fullRuntimeConfig (rerun with -update-runtime-json, then test the CRI: %s):\n%s",
			criRuntimeJSON, "cd testenv/build && go test -run TestKubeRuntimeConfigInStep ./cri", fmt.Sprintf("have:\n%s\nwant:\n%s", old, b))
	}
}
