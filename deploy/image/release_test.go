package main

import (
	"bytes"
	"context"
	"debug/elf"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// helmBinary is the helm `make chart-tools` builds: $HELM, else
// $EVENTPIPE_BIN_DIR/helm, else <root>/.bin/helm.
func helmBinary(t *testing.T, root string) string {
	t.Helper()
	p := os.Getenv("HELM")
	if p == "" {
		dir := os.Getenv("EVENTPIPE_BIN_DIR")
		if dir == "" {
			dir = filepath.Join(root, ".bin")
		}
		p = filepath.Join(dir, "helm")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("helm not found (%v): run `make chart-tools`", err)
	}
	return p
}

// TestReleaseToRegistry runs `make release` against go-containerregistry's
// registry on loopback and pulls both parts back: the image index holds
// linux/amd64 and linux/arm64, each a static binary of its architecture
// stamped with the release version; the chart comes back from the OCI
// registry with helm pull, its version and appVersion the release's, and
// renders the release's image (no "latest").
func TestReleaseToRegistry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	helm := helmBinary(t, root)
	o, err := Defaults(ctx, Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	start := time.Now()
	r := Release{Options: o, Repo: host + "/eventpipe/eventpipe", ChartDest: "oci://" + host + "/eventpipe/charts", Helm: helm, PlainHTTP: true}
	idxDigest, chartDigest, err := r.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("released %s in %v: index %s, chart %s", o.Version, time.Since(start).Round(time.Second), idxDigest, chartDigest)

	// The image index, pulled back by tag.
	ref, err := name.ParseReference(r.Repo+":"+o.Version, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := idx.Digest(); d != idxDigest {
		t.Errorf("pulled index %s, pushed %s", d, idxDigest)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex || len(im.Manifests) != len(ReleaseArches) || im.Annotations["org.opencontainers.image.version"] != o.Version {
		t.Errorf("index: media type %s, %d manifests, annotations %v", im.MediaType, len(im.Manifests), im.Annotations)
	}
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for _, arch := range ReleaseArches {
		img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithPlatform(v1.Platform{OS: "linux", Architecture: arch}))
		if err != nil {
			t.Fatalf("pull linux/%s: %v", arch, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != arch || cf.Config.Labels["org.opencontainers.image.version"] != o.Version || cf.Config.User != "65532:65532" {
			t.Errorf("linux/%s: config %s/%s, version label %q, user %q", arch, cf.OS, cf.Architecture, cf.Config.Labels["org.opencontainers.image.version"], cf.Config.User)
		}
		bin := extract(t, img)[strings.TrimPrefix(BinaryPath, "/")]
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatalf("linux/%s: the binary is not ELF: %v", arch, err)
		}
		if f.Machine != machine[arch] {
			t.Errorf("linux/%s: the binary is for %s", arch, f.Machine)
		}
		f.Close()
		checkStatic(t, bin)
		if !bytes.Contains(bin, []byte(o.Version)) {
			t.Errorf("linux/%s: the binary does not carry version %s", arch, o.Version)
		}
		if arch == runtime.GOARCH && runtime.GOOS == "linux" {
			exe := filepath.Join(t.TempDir(), "eventpipe")
			if err := os.WriteFile(exe, bin, 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := exec.CommandContext(ctx, exe, "version").Output()
			if err != nil || !strings.HasPrefix(string(out), "eventpipe "+o.Version+" ") {
				t.Errorf("the pulled linux/%s binary: %q (%v)", arch, out, err)
			}
		}
	}

	// The chart, pulled back with helm from the same registry.
	chartRef, err := name.ParseReference(host+"/eventpipe/charts/eventpipe:"+o.Version, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	m, err := remote.Get(chartRef, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if m.Digest != chartDigest {
		t.Errorf("chart manifest %s, helm push said %s", m.Digest, chartDigest)
	}
	if !bytes.Contains(m.Manifest, []byte("application/vnd.cncf.helm.config.v1+json")) || !bytes.Contains(m.Manifest, []byte("application/vnd.cncf.helm.chart.content.v1.tar+gzip")) {
		t.Errorf("the chart is not a Helm OCI artifact:\n%s", m.Manifest)
	}
	dir := t.TempDir()
	if _, err := Helm(ctx, helm, "pull", r.ChartDest+"/eventpipe", "--version", o.Version, "--plain-http", "--destination", dir); err != nil {
		t.Fatal(err)
	}
	tgz := filepath.Join(dir, "eventpipe-"+o.Version+".tgz")
	meta, err := Helm(ctx, helm, "show", "chart", tgz)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nversion: " + o.Version + "\n", "\nappVersion: " + o.Version + "\n"} {
		if !strings.Contains("\n"+string(meta), want) {
			t.Errorf("pulled chart metadata lacks %q:\n%s", strings.TrimSpace(want), meta)
		}
	}
	out, err := Helm(ctx, helm, "template", "eventpipe", tgz, "--set", "cluster=release-check")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "image: ghcr.io/eventpipe/eventpipe:"+o.Version+"\n") || strings.Contains(string(out), ":latest") {
		t.Errorf("the pulled chart does not render the release's image %s", o.Version)
	}
}

// TestCheckVersion: the tree names one version everywhere (the chart's
// version and appVersion, the kustomization, the raw manifests, a
// CHANGELOG section), and a place that differs is named.
func TestCheckVersion(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	o, err := Defaults(context.Background(), Options{Root: root, Revision: "x", Created: time.Unix(0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckVersion(root, o.Version); err != nil {
		t.Errorf("the tree at version %s: %v", o.Version, err)
	}
	for _, bad := range []string{"latest", "v1.2.3", "1.2"} {
		if err := CheckVersion(root, bad); err == nil || !strings.Contains(err.Error(), "is not x.y.z") {
			t.Errorf("version %q: %v", bad, err)
		}
	}
	// A copy of the version files, moved to 1.2.3 by SetVersion (what make
	// version does before it re-renders the manifests): the manifests and
	// the CHANGELOG are then named as behind.
	tmp := t.TempDir()
	for _, f := range []string{"deploy/helm/eventpipe/Chart.yaml", "deploy/openshell/kustomization.yaml", "deploy/agent/deployment.yaml",
		"deploy/collector/statefulset.yaml", "deploy/collector/kafka/deployment.yaml", "CHANGELOG.md"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(tmp, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := SetVersion(tmp, "1.2.3"); err != nil {
		t.Fatal(err)
	}
	err = CheckVersion(tmp, "1.2.3")
	if err == nil {
		t.Fatal("stale manifests and CHANGELOG passed")
	}
	for _, want := range []string{"deploy/agent/deployment.yaml names image tag", "CHANGELOG.md has no section", "make version VERSION=1.2.3"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	for _, notWant := range []string{"Chart.yaml", "kustomization.yaml"} {
		if strings.Contains(err.Error(), notWant) {
			t.Errorf("SetVersion did not set %s:\n%v", notWant, err)
		}
	}
}
