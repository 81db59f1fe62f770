package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
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
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestImage builds the image twice from the same source (same digest), writes
// it as a tarball, reads the tarball back and checks what a cluster will run:
// the user, the entrypoint, the labels, the CA roots, and that the binary is
// static and prints its stamped version.
func TestImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	o, err := Defaults(ctx, Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	first, err := Build(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first build %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	second, err := Build(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second build %v", time.Since(start).Round(time.Millisecond))
	d1, err := first.Digest()
	if err != nil {
		t.Fatal(err)
	}
	d2, err := second.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if d1 != d2 {
		t.Fatalf("two builds of the same source: %s and %s", d1, d2)
	}
	t.Logf("digest %s (version %s, revision %s, created %s)", d1, o.Version, o.Revision, o.Created)

	path := filepath.Join(t.TempDir(), "image.tar")
	tag, err := name.NewTag("ghcr.io/eventpipe/eventpipe:" + o.Version)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(path, tag, first); err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A docker-load tarball rewrites the manifest in Docker's media types,
	// so its manifest digest differs; the config and the layer are the same.
	c1, _ := first.ConfigName()
	if c, err := img.ConfigName(); err != nil || c != c1 {
		t.Errorf("the tarball's config is %s (%v), want %s", c, err, c1)
	}
	// The OCI layout keeps the manifest: same digest.
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(first); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Digest != d1 {
		t.Errorf("OCI layout index %+v (%v), want one manifest %s", im, err, d1)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (numeric, non-root)", cf.Config.User)
	}
	if strings.Join(cf.Config.Entrypoint, " ") != BinaryPath || len(cf.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want [%s] and no cmd", cf.Config.Entrypoint, cf.Config.Cmd, BinaryPath)
	}
	if cf.OS != "linux" || cf.Architecture != o.Arch {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	want := map[string]string{
		"org.opencontainers.image.source":   "https://github.com/eventpipe/eventpipe",
		"org.opencontainers.image.revision": o.Revision,
		"org.opencontainers.image.version":  o.Version,
		"org.opencontainers.image.created":  o.Created.UTC().Format(time.RFC3339),
	}
	for k, v := range want {
		if cf.Config.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, cf.Config.Labels[k], v)
		}
	}
	if !cf.Created.Time.Equal(o.Created) {
		t.Errorf("created %s, want the commit time %s", cf.Created.Time, o.Created)
	}
	if m, err := img.Manifest(); err != nil || len(m.Layers) != 1 {
		t.Errorf("manifest %+v (%v): want one layer on an empty base", m, err)
	}

	// Push to a registry on loopback (go-containerregistry's registry
	// implementation) and pull the manifest back by tag.
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://")+"/eventpipe:"+o.Version, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := push(ctx, ref, first); err != nil {
		t.Fatal(err)
	}
	if desc, err := remote.Head(ref, remote.WithContext(ctx)); err != nil || desc.Digest != d1 {
		t.Errorf("pushed image: %+v (%v), want digest %s", desc, err, d1)
	}

	files := extract(t, img)
	bin := files[strings.TrimPrefix(BinaryPath, "/")]
	if len(bin) == 0 {
		t.Fatalf("no %s in the image (files: %d)", BinaryPath, len(files))
	}
	checkStatic(t, bin)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(files[strings.TrimPrefix(CAFile, "/")]) || len(pool.Subjects()) < 100 { //nolint:staticcheck // counting roots
		t.Errorf("%s holds %d CA roots", CAFile, len(pool.Subjects()))
	}
	if !strings.Contains(string(files["etc/passwd"]), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd: %q", files["etc/passwd"])
	}

	if runtime.GOOS != "linux" || runtime.GOARCH != o.Arch {
		t.Fatalf("cannot run a linux/%s binary on %s/%s", o.Arch, runtime.GOOS, runtime.GOARCH)
	}
	exe := filepath.Join(t.TempDir(), "eventpipe")
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, exe, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("eventpipe --version: %v\n%s", err, out)
	}
	if wantOut := "eventpipe " + o.Version + " (revision " + o.Revision + ", go"; !strings.HasPrefix(string(out), wantOut) {
		t.Errorf("eventpipe --version printed %q, want %q...", out, wantOut)
	}
}

// extract returns the regular files of the image's filesystem.
func extract(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[strings.TrimPrefix(h.Name, "/")] = b
		}
	}
}

// checkStatic: no program interpreter (PT_INTERP) and no shared library
// (DT_NEEDED), so the binary runs on an empty base.
func checkStatic(t *testing.T, bin []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("the binary is not ELF: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the binary has a PT_INTERP program header (dynamically linked)")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil && !strings.Contains(err.Error(), "no symbol") {
		t.Errorf("read DT_NEEDED: %v", err)
	}
	if len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
}
