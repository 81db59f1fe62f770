package evbin

import (
	"context"
	"debug/buildinfo"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBuildUsesTheReleaseFlags: the binary Build writes carries the release
// image's settings (no cgo, -trimpath) in its build info. If they drift from
// deploy/image's, the tests' binaries stop sharing the image build's compiles
// and stop being the kind that ships.
func TestBuildUsesTheReleaseFlags(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := filepath.Join(t.TempDir(), "eventpipe")
	if err := Build(ctx, filepath.Join("..", ".."), out); err != nil {
		t.Fatal(err)
	}
	info, err := buildinfo.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range info.Settings {
		got[s.Key] = s.Value
	}
	for key, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true"} {
		if got[key] != want {
			t.Errorf("build setting %s = %q, want %q (all: %v)", key, got[key], want, info.Settings)
		}
	}
}

// TestReleaseBuildHasTheseFlags: deploy/image builds the release with the
// flags Build uses. The day it drops or changes one, this fails instead of
// every cold test run quietly compiling the client stack twice.
func TestReleaseBuildHasTheseFlags(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "deploy", "image", "build.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"build", "-trimpath"`, `"CGO_ENABLED=0"`} {
		if !strings.Contains(string(src), want) {
			t.Errorf("deploy/image/build.go no longer has %s: change testenv/evbin.Build to the release's flags", want)
		}
	}
}

func TestBuildReportsTheCompilerOutput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := Build(ctx, filepath.Join("..", ".."), filepath.Join(t.TempDir(), "eventpipe"), "-tags", "no such tag,")
	if err == nil || !strings.Contains(err.Error(), "go build -trimpath -tags") {
		t.Fatalf("Build with a malformed -tags value: %v, want the failed command and its output", err)
	}
	if err := Build(ctx, "", "x"); err == nil {
		t.Error("Build with no root succeeded")
	}
}
