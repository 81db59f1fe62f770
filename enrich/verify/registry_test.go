package verify

import (
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/eventpipe/eventpipe/enrich/verify/registrytest"
)

// keychain answers every registry with one credential.
type keychain struct{ user, pass string }

func (k keychain) Resolve(authn.Resource) (authn.Authenticator, error) {
	return &authn.Basic{Username: k.user, Password: k.pass}, nil
}

// seeded is a test registry holding the images the tests ask about.
func seeded(t *testing.T) *registrytest.Registry {
	t.Helper()
	tr := registrytest.New(t)
	amd := registrytest.ImageFor(t, "linux", "amd64")
	for _, tag := range []string{"1.0.0", "1.2.0-rc1", "1.2.0", "1.10.0", "1.9.3", "latest"} {
		tr.Push(t, "public/app:"+tag, amd)
	}
	tr.Push(t, "private/app:1.0", amd)
	tr.Push(t, "public/single-arm:1.0", registrytest.ImageFor(t, "linux", "arm64"))
	// A one-platform index (what a single-arch buildx push makes).
	idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{
		Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}},
	})
	tr.Push(t, "public/one-platform:2.0", idx)
	return tr
}
