// Command image builds eventpipe's container image without a container
// daemon (make image): a static eventpipe binary on an empty base, user
// 65532, CA roots, OCI labels, eventpipe as the entrypoint, every timestamp
// the commit time, so the same source gives the same digest. It writes an
// image tarball (docker load / podman load) and optionally an OCI image
// layout, and pushes to a registry when asked (credentials from the docker
// config, as docker login writes them).
//
// Dockerfile beside this file does the same for Docker users (not tested
// here: there is no Docker daemon on the build machines).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		out      = flag.String("out", "", "write the image tarball here (docker load / podman load)")
		layoutTo = flag.String("layout", "", "also write an OCI image layout into this directory")
		pushTo   = flag.String("push", "", "push to this reference, e.g. registry.example.com/eventpipe:0.1.0")
		repo     = flag.String("repo", "ghcr.io/eventpipe/eventpipe", "repository named in the tarball")
		arch     = flag.String("arch", "amd64", "GOARCH of the binary and the image")
		ver      = flag.String("version", "", "version (default: the chart's appVersion)")
		setVer   = flag.String("set-version", "", "write this version into the chart and the kustomization, then exit (make version)")
		release  = flag.Bool("release", false, "make release: check -version across the tree, push the linux/amd64+arm64 image index to -repo:<version> and the chart to -chart-dest")
		chartTo  = flag.String("chart-dest", "", "with -release: where the chart goes, oci://host/path")
		helm     = flag.String("helm", "helm", "with -release: the helm binary")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root := filepath.Clean(filepath.Join(wd, "..", ".."))
	if *setVer != "" {
		return SetVersion(root, *setVer)
	}
	o, err := Defaults(ctx, Options{Root: root, Version: *ver, Arch: *arch, Log: os.Stderr})
	if err != nil {
		return err
	}
	if *release {
		if *ver == "" || *chartTo == "" {
			return fmt.Errorf("-release needs -version and -chart-dest")
		}
		r := Release{Options: o, Repo: *repo, ChartDest: *chartTo, Helm: *helm}
		idx, chart, err := r.Run(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("pushed %s:%s (index %s: linux/%s)\npushed chart %s/eventpipe:%s (%s)\n",
			*repo, o.Version, idx, strings.Join(ReleaseArches, ", linux/"), *chartTo, o.Version, chart)
		return nil
	}
	img, err := Build(ctx, o)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	if *out != "" {
		tag, err := name.NewTag(*repo + ":" + o.Version)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
			return err
		}
		if err := tarball.WriteToFile(*out, tag, img); err != nil {
			return fmt.Errorf("write %s: %w", *out, err)
		}
		fmt.Printf("wrote %s (%s)\n", *out, tag)
	}
	if *layoutTo != "" {
		p, err := layout.Write(*layoutTo, empty.Index)
		if err != nil {
			return err
		}
		if err := p.AppendImage(img); err != nil {
			return fmt.Errorf("write layout %s: %w", *layoutTo, err)
		}
		fmt.Printf("wrote OCI layout %s\n", *layoutTo)
	}
	if *pushTo != "" {
		ref, err := name.ParseReference(*pushTo)
		if err != nil {
			return err
		}
		if err := push(ctx, ref, img); err != nil {
			return err
		}
		fmt.Printf("pushed %s@%s\n", ref.Context(), digest)
	}
	fmt.Printf("eventpipe %s revision %s created %s\ndigest %s\n", o.Version, o.Revision, o.Created.Format("2006-01-02T15:04:05Z"), digest)
	return nil
}

// push writes img to ref with the docker config's credentials.
func push(ctx context.Context, ref name.Reference, img v1.Image) error {
	if err := remote.Write(ref, img, remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}
