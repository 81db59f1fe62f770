package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/testenv/evbin"
)

// releaseLDFlags are the linker flags of the release build, read from
// deploy/image/build.go (the tested build) so that this test links exactly
// what a release links; the Dockerfile must stamp the same variables.
func releaseLDFlags(t *testing.T, root, version, revision string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(root, "deploy", "image", "build.go"))
	if err != nil {
		t.Fatal(err)
	}
	pkg := regexp.MustCompile(`buildinfoPkg\s*=\s*"([^"]+)"`).FindSubmatch(src)
	format := regexp.MustCompile(`ldflags := fmt\.Sprintf\("([^"]+)", buildinfoPkg, o\.Version, buildinfoPkg, o\.Revision\)`).FindSubmatch(src)
	if pkg == nil || format == nil {
		t.Fatal("deploy/image/build.go: the ldflags of BuildBinary are no longer where this test reads them")
	}
	docker, err := os.ReadFile(filepath.Join(root, "deploy", "image", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"version=${VERSION}", "revision=${REVISION}"} {
		if !strings.Contains(string(docker), "-X "+string(pkg[1])+"."+v) {
			t.Errorf("deploy/image/Dockerfile does not stamp %s.%s", pkg[1], v)
		}
	}
	return fmt.Sprintf(string(format[1]), pkg[1], version, pkg[1], revision)
}

// TestReleaseBuildReportsItsVersion: a binary linked with the release
// flags reports the release version everywhere: `eventpipe version`, the
// OCSF metadata.product.version and the eventpipe-version header of the
// Kafka sink, the Loki sink's User-Agent. (Before api/buildinfo the
// flags stamped package main only, and OCSF said "(devel)".)
func TestReleaseBuildReportsItsVersion(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	const version, revision = "9.8.7-release-test", "0123456789abcdef0123456789abcdef01234567"
	ldflags := releaseLDFlags(t, root, version, revision)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	exe := filepath.Join(dir, "eventpipe")
	// The release's link flags on the compile every test binary shares
	// (testenv/evbin: the release's -trimpath, no cgo).
	if err := evbin.Build(ctx, root, exe, "-ldflags", ldflags); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, exe, "version").CombinedOutput()
	if want := "eventpipe " + version + " (revision " + revision + ", go"; err != nil || !strings.HasPrefix(string(out), want) {
		t.Errorf("eventpipe version: %q (%v), want %q...", out, err, want)
	}
	for pkg, test := range map[string]string{"./sinks/kafka": "TestBuildVersionInRecords", "./sinks/loki": "TestUserAgentIsTheBuildVersion", "./collector/backbone": "TestBuildVersionInBackboneRecords"} {
		bin := filepath.Join(dir, filepath.Base(pkg)+".test")
		if err := evbin.Go(ctx, root, "test", "-c", "-ldflags", ldflags, "-o", bin, pkg); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, bin, "-test.run", "^"+test+"$", "-test.count", "1", "-test.v")
		cmd.Dir = filepath.Join(root, pkg)
		cmd.Env = append(os.Environ(), "EVENTPIPE_WANT_VERSION="+version)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: "+test) {
			t.Errorf("%s %s in the release build: %v\n%s", pkg, test, err, out)
		}
	}
}
