//go:build !agentonly

package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

// TestPostRenderCommand: `eventpipe post-render` is the OpenShell
// post-renderer (deploy/openshell) in the binary: Helm runs it with the
// chart's manifests on stdin. A build that is not a release (this test
// binary: version "dev") has no image of its own and needs --proxy-image.
func TestPostRenderCommand(t *testing.T) {
	in, err := os.ReadFile("../../deploy/openshell/testdata/rendered.yaml")
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := realMain(append([]string{"post-render"}, args...), bytes.NewReader(in), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, errs := run("--collector", "eventpipe-collector.eventpipe.svc:7070", "--proxy-image", "registry.example.com/eventpipe:0.3.0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"name: eventpipe-driver-proxy", "image: registry.example.com/eventpipe:0.3.0", "- --metrics-listen", "path: /readyz", "eventpipe.io/driver-proxy: \"true\""} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	code, out, errs = run("--collector", "c:7070")
	if code != 2 || out != "" || !strings.Contains(errs, "--proxy-image is required") {
		t.Errorf("unstamped build without --proxy-image: exit %d, stdout %d bytes, stderr %q", code, len(out), errs)
	}
	var help bytes.Buffer
	if code := helpPostRender(context.Background(), &help); code != 0 || !strings.Contains(help.String(), "--post-renderer eventpipe --post-renderer-args post-render") {
		t.Errorf("help post-render: exit %d\n%s", code, help.String())
	}
}

func helpPostRender(ctx context.Context, out *bytes.Buffer) int {
	return help(ctx, []string{"post-render"}, out, out)
}
