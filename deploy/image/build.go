package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The image's fixed facts.
const (
	BinaryPath = "/usr/local/bin/eventpipe"
	CAFile     = "/etc/ssl/certs/ca-certificates.crt"
	UID        = 65532
	Source     = "https://github.com/eventpipe/eventpipe"
)

// Options say what to build. Zero fields are filled by Defaults.
type Options struct {
	Root     string    // repository root
	Version  string    // default: the chart's appVersion
	Revision string    // default: git rev-parse HEAD (+ "-dirty" with local changes)
	Created  time.Time // default: the commit time of HEAD (SOURCE_DATE_EPOCH wins)
	Arch     string    // default amd64
	Go       string    // the go command, default "go"
	Log      io.Writer
}

// Defaults fills the zero fields of o from the repository.
func Defaults(ctx context.Context, o Options) (Options, error) {
	if o.Go == "" {
		o.Go = "go"
	}
	if o.Arch == "" {
		o.Arch = "amd64"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Version == "" {
		b, err := os.ReadFile(filepath.Join(o.Root, "deploy", "helm", "eventpipe", "Chart.yaml"))
		if err != nil {
			return o, fmt.Errorf("read the chart's appVersion: %w", err)
		}
		m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?`).FindSubmatch(b)
		if m == nil {
			return o, errors.New("deploy/helm/eventpipe/Chart.yaml has no appVersion")
		}
		o.Version = string(m[1])
	}
	if o.Revision == "" {
		rev, err := git(ctx, o.Root, "rev-parse", "HEAD")
		if err != nil {
			return o, err
		}
		if st, err := git(ctx, o.Root, "status", "--porcelain", "--untracked-files=no"); err == nil && st != "" {
			rev += "-dirty"
		}
		o.Revision = rev
	}
	if o.Created.IsZero() {
		if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
			sec, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return o, fmt.Errorf("SOURCE_DATE_EPOCH: %w", err)
			}
			o.Created = time.Unix(sec, 0).UTC()
		} else {
			ct, err := git(ctx, o.Root, "log", "-1", "--format=%ct")
			if err != nil {
				return o, err
			}
			sec, err := strconv.ParseInt(ct, 10, 64)
			if err != nil {
				return o, fmt.Errorf("commit time %q: %w", ct, err)
			}
			o.Created = time.Unix(sec, 0).UTC()
		}
	}
	return o, nil
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// buildinfoPkg holds the version and revision every part of eventpipe
// reports (eventpipe version, OCSF metadata, Kafka headers, user agents).
const buildinfoPkg = "github.com/eventpipe/eventpipe/api/buildinfo"

// BuildBinary builds cmd/eventpipe as a static, reproducible binary: no cgo,
// -trimpath, no VCS stamping, an empty build id, version and revision set.
func BuildBinary(ctx context.Context, o Options, out string) error {
	ldflags := fmt.Sprintf("-s -w -buildid= -X %s.version=%s -X %s.revision=%s", buildinfoPkg, o.Version, buildinfoPkg, o.Revision)
	cmd := exec.CommandContext(ctx, o.Go, "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, "./cmd/eventpipe")
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.Arch, "GOFLAGS=-mod=readonly")
	cmd.Stdout, cmd.Stderr = o.Log, o.Log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/eventpipe: %w", err)
	}
	return nil
}

// CABundle is the Mozilla root set of golang.org/x/crypto/x509roots/fallback
// (pinned by go.sum, so every machine writes the same file) as PEM.
func CABundle() []byte {
	var b bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			// A distrust-after constraint cannot be expressed in a PEM file:
			// leave such roots out rather than trust them unconditionally.
			continue
		}
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate})
	}
	return b.Bytes()
}

// Build builds the binary and assembles the image on an empty base: one
// layer with the binary, the CA roots and passwd/group entries for the
// non-root user; a config with a numeric user, the entrypoint and the OCI
// labels; every timestamp set to o.Created.
func Build(ctx context.Context, o Options) (v1.Image, error) {
	tmp, err := os.MkdirTemp("", "eventpipe-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "eventpipe")
	if err := BuildBinary(ctx, o, bin); err != nil {
		return nil, err
	}
	binData, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	layerTar, err := rootfs(o.Created, binData)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: o.Created},
			CreatedBy: "deploy/image: eventpipe " + o.Version,
			Comment:   "static eventpipe binary, CA roots, passwd/group",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = o.Arch
	cf.Created = v1.Time{Time: o.Created}
	cf.Author = ""
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", UID, UID),
		Entrypoint: []string{BinaryPath},
		WorkingDir: "/",
		Env: []string{
			"PATH=/usr/local/bin",
			"SSL_CERT_FILE=" + CAFile,
		},
		Labels: Labels(o),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return img, nil
}

// Labels are the image's OCI annotations (as config labels).
func Labels(o Options) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "eventpipe",
		"org.opencontainers.image.description": "eventpipe agent and collector: Kubernetes Events about OpenShell sandboxes, stored and delivered",
		"org.opencontainers.image.source":      Source,
		"org.opencontainers.image.url":         Source,
		"org.opencontainers.image.revision":    o.Revision,
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.created":     o.Created.UTC().Format(time.RFC3339),
	}
}

// rootfs is the layer's tar: directories, files and their owners, all with
// mtime created, in a fixed order.
func rootfs(created time.Time, binary []byte) ([]byte, error) {
	type entry struct {
		name string
		mode int64
		uid  int
		data []byte
		dir  bool
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, UID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", UID)
	entries := []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(CAFile, "/"), mode: 0o644, data: CABundle()},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: UID, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/local/", mode: 0o755, dir: true},
		{name: "usr/local/bin/", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(BinaryPath, "/"), mode: 0o755, data: binary},
		{name: "var/", mode: 0o755, dir: true},
		{name: "var/lib/", mode: 0o755, dir: true},
		{name: "var/lib/eventpipe/", mode: 0o750, uid: UID, dir: true},
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: created, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if !e.dir {
			if _, err := tw.Write(e.data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
