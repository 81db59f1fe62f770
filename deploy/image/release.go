package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ReleaseArches are the architectures of a release's image index.
var ReleaseArches = []string{"amd64", "arm64"}

// ReleaseVersion is what a release may be called: x.y.z, optionally
// -alpha.N, -beta.N or -rc.N (deploy/openshell.ReleaseImage accepts the
// same, so a release binary knows its image). Never "latest".
var ReleaseVersion = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-(alpha|beta|rc)\.[0-9]+)?$`)

// BuildIndex builds the image for every arch and assembles an OCI image
// index of them (platform linux/<arch> each), annotated like the images.
func BuildIndex(ctx context.Context, o Options, arches []string) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var adds []mutate.IndexAddendum
	for _, arch := range arches {
		oa := o
		oa.Arch = arch
		img, err := Build(ctx, oa)
		if err != nil {
			return nil, fmt.Errorf("linux/%s: %w", arch, err)
		}
		adds = append(adds, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	idx = mutate.AppendManifests(idx, adds...)
	return mutate.Annotations(idx, Labels(o)).(v1.ImageIndex), nil
}

// pushIndex writes the index and its images to ref with the docker
// config's credentials (as docker login writes them).
func pushIndex(ctx context.Context, ref name.Reference, idx v1.ImageIndex, opts ...remote.Option) error {
	opts = append([]remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithContext(ctx)}, opts...)
	if err := remote.WriteIndex(ref, idx, opts...); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// CheckVersion: every place that names the release version says version
// (one version scheme): the chart's version and
// appVersion (the image tag the chart and the raw manifests default to),
// the kustomization's eventpipe image tag, the raw manifests' images and
// a CHANGELOG section.
func CheckVersion(root, version string) error {
	if !ReleaseVersion.MatchString(version) {
		return fmt.Errorf("version %q is not x.y.z (optionally -alpha.N, -beta.N, -rc.N)", version)
	}
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return ""
		}
		return string(b)
	}
	var errs []error
	chart := read("deploy/helm/eventpipe/Chart.yaml")
	for _, key := range []string{"version", "appVersion"} {
		m := regexp.MustCompile(`(?m)^` + key + `:\s*"?([^"\s]+)"?`).FindStringSubmatch(chart)
		if m == nil || m[1] != version {
			errs = append(errs, fmt.Errorf("deploy/helm/eventpipe/Chart.yaml %s is %q, want %q", key, first(m), version))
		}
	}
	kust := read("deploy/openshell/kustomization.yaml")
	if m := regexp.MustCompile(`(?m)name: eventpipe\n\s+newName: \S+.*\n\s+newTag: "?([^"\s]+)"?`).FindStringSubmatch(kust); m == nil || m[1] != version {
		errs = append(errs, fmt.Errorf("deploy/openshell/kustomization.yaml eventpipe newTag is %q, want %q", first(m), version))
	}
	for _, f := range []string{"deploy/agent/deployment.yaml", "deploy/collector/statefulset.yaml", "deploy/collector/kafka/deployment.yaml"} {
		for _, m := range regexp.MustCompile(`image: ghcr\.io/eventpipe/eventpipe:(\S+)`).FindAllStringSubmatch(read(f), -1) {
			if m[1] != version {
				errs = append(errs, fmt.Errorf("%s names image tag %q, want %q (make manifests)", f, m[1], version))
			}
		}
	}
	if !strings.Contains(read("CHANGELOG.md"), "\n## ["+version+"]") {
		errs = append(errs, fmt.Errorf("CHANGELOG.md has no section \"## [%s]\"", version))
	}
	if len(errs) > 0 {
		errs = append(errs, fmt.Errorf("set them with `make version VERSION=%s` (then write the CHANGELOG section) and commit", version))
	}
	return errors.Join(errs...)
}

func first(m []string) string {
	if len(m) < 2 {
		return ""
	}
	return m[1]
}

// SetVersion writes version into the chart (version, appVersion) and the
// kustomization's eventpipe image tag; `make version` then re-renders the
// raw manifests from the chart.
func SetVersion(root, version string) error {
	if !ReleaseVersion.MatchString(version) {
		return fmt.Errorf("version %q is not x.y.z (optionally -alpha.N, -beta.N, -rc.N)", version)
	}
	edit := func(rel string, re *regexp.Regexp, repl string) error {
		p := filepath.Join(root, rel)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out := re.ReplaceAll(b, []byte(repl))
		if bytes.Equal(out, b) && !bytes.Contains(b, []byte(version)) {
			return fmt.Errorf("%s: %s not found", rel, re)
		}
		return os.WriteFile(p, out, 0o644)
	}
	if err := edit("deploy/helm/eventpipe/Chart.yaml", regexp.MustCompile(`(?m)^version:.*$`), "version: "+version); err != nil {
		return err
	}
	if err := edit("deploy/helm/eventpipe/Chart.yaml", regexp.MustCompile(`(?m)^appVersion:.*$`), `appVersion: "`+version+`"`); err != nil {
		return err
	}
	return edit("deploy/openshell/kustomization.yaml", regexp.MustCompile(`(?m)(name: eventpipe\n\s+newName: \S+.*\n\s+newTag: )\S+`), "${1}"+version)
}

// Helm runs the helm binary with its config, cache and data in a
// temporary directory, plus the registry config (helm registry login)
// when HELM_REGISTRY_CONFIG names one. It returns what helm printed on
// stdout.
func Helm(ctx context.Context, helm string, args ...string) ([]byte, error) {
	out, _, err := runHelm(ctx, helm, args...)
	return out, err
}

func runHelm(ctx context.Context, helm string, args ...string) (stdout, stderr []byte, err error) {
	home, err := os.MkdirTemp("", "eventpipe-release-helm-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(home)
	cmd := exec.CommandContext(ctx, helm, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), errb.Bytes(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), errb.Bytes(), nil
}

// PackageChart packages the chart into dir (helm package; the chart's
// version is the release's, CheckVersion makes sure) and returns the file.
func PackageChart(ctx context.Context, helm, root, version, dir string) (string, error) {
	if _, err := Helm(ctx, helm, "package", filepath.Join(root, "deploy", "helm", "eventpipe"), "--destination", dir); err != nil {
		return "", err
	}
	p := filepath.Join(dir, "eventpipe-"+version+".tgz")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("helm package wrote no %s: %w", filepath.Base(p), err)
	}
	return p, nil
}

// PushChart pushes the packaged chart to an OCI registry (oci://host/path:
// the chart lands at host/path/eventpipe:<version>). plainHTTP is for a
// registry on loopback without TLS (the tests').
func PushChart(ctx context.Context, helm, tgz, dest string, plainHTTP bool) (string, error) {
	args := []string{"push", tgz, dest}
	if plainHTTP {
		args = append(args, "--plain-http")
	}
	stdout, stderr, err := runHelm(ctx, helm, args...)
	if err != nil {
		return "", err
	}
	// helm push prints "Pushed: <ref>" and "Digest: sha256:..." (on stderr).
	out := append(stdout, stderr...)
	m := regexp.MustCompile(`Digest: (sha256:[0-9a-f]{64})`).FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("helm push printed no digest:\n%s", out)
	}
	return string(m[1]), nil
}

// Release is `make release`: the version checked across the tree, the
// image index (ReleaseArches) pushed to Repo:Version, the chart packaged
// and pushed to ChartDest.
type Release struct {
	Options            // Version must be set; Arch is ignored
	Repo      string   // e.g. ghcr.io/eventpipe/eventpipe
	ChartDest string   // e.g. oci://ghcr.io/eventpipe/charts
	Helm      string   // the helm binary
	PlainHTTP bool     // registry on loopback without TLS (tests)
	Arches    []string // default ReleaseArches
	Remote    []remote.Option
}

// Run performs the release and returns the digests of the image index and
// of the chart's manifest.
func (r Release) Run(ctx context.Context) (index, chart v1.Hash, err error) {
	if err := CheckVersion(r.Root, r.Version); err != nil {
		return index, chart, err
	}
	arches := r.Arches
	if len(arches) == 0 {
		arches = ReleaseArches
	}
	var nameOpts []name.Option
	if r.PlainHTTP {
		nameOpts = append(nameOpts, name.Insecure)
	}
	ref, err := name.ParseReference(r.Repo+":"+r.Version, nameOpts...)
	if err != nil {
		return index, chart, err
	}
	idx, err := BuildIndex(ctx, r.Options, arches)
	if err != nil {
		return index, chart, err
	}
	if err := pushIndex(ctx, ref, idx, r.Remote...); err != nil {
		return index, chart, err
	}
	if index, err = idx.Digest(); err != nil {
		return index, chart, err
	}
	dir, err := os.MkdirTemp("", "eventpipe-chart-")
	if err != nil {
		return index, chart, err
	}
	defer os.RemoveAll(dir)
	tgz, err := PackageChart(ctx, r.Helm, r.Root, r.Version, dir)
	if err != nil {
		return index, chart, err
	}
	d, err := PushChart(ctx, r.Helm, tgz, r.ChartDest, r.PlainHTTP)
	if err != nil {
		return index, chart, err
	}
	chart, err = v1.NewHash(d)
	return index, chart, err
}
