package verify

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// testRegistry is go-containerregistry's in-process registry behind a
// token-auth front, the way ghcr.io and Docker Hub answer: every /v2/ call
// needs a bearer token from /token (anonymous or with basic credentials),
// and a few repositories answer as a registry does when it refuses:
//
//	private/*    401 unless the token is alice's
//	forbidden/*  403 DENIED for alice, 401 anonymously
//	limited/*    429 with RateLimit-Limit and Retry-After
//	slow/*       no answer until the client gives up
type testRegistry struct {
	srv   *httptest.Server
	host  string
	calls atomic.Int64 // /v2/ requests other than the version check
}

const (
	aliceUser, alicePass = "alice", "s3cret"
	aliceToken, anonTok  = "tok-alice", "tok-anonymous"
)

func newTestRegistry(t *testing.T) *testRegistry {
	t.Helper()
	backend := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	tr := &testRegistry{}
	mux := http.NewServeMux()
	mux.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		tok := anonTok
		if u, p, ok := r.BasicAuth(); ok {
			if u != aliceUser || p != alicePass {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}`)
				return
			}
			tok = aliceToken
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"token":%q,"access_token":%q,"expires_in":300}`, tok, tok)
	})
	mux.HandleFunc("/v2/", func(w http.ResponseWriter, r *http.Request) {
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		challenge := func(code int, errCode, msg string) {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="%s/token",service="test"`, tr.srv.URL))
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"errors":[{"code":%q,"message":%q}]}`, errCode, msg)
		}
		if tok != aliceToken && tok != anonTok {
			challenge(http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
			return
		}
		if r.URL.Path != "/v2/" {
			tr.calls.Add(1)
		}
		repo := strings.TrimPrefix(r.URL.Path, "/v2/")
		switch {
		case strings.HasPrefix(repo, "private/") && tok != aliceToken:
			challenge(http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
			return
		case strings.HasPrefix(repo, "forbidden/"):
			if tok != aliceToken {
				challenge(http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`)
			return
		case strings.HasPrefix(repo, "limited/"):
			w.Header().Set("RateLimit-Limit", "100;w=21600")
			w.Header().Set("Retry-After", "60")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"errors":[{"code":"TOOMANYREQUESTS","message":"You have reached your pull rate limit."}]}`)
			return
		case strings.HasPrefix(repo, "slow/"):
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
			return
		}
		backend.ServeHTTP(w, r)
	})
	tr.srv = httptest.NewServer(mux)
	t.Cleanup(tr.srv.Close)
	tr.host = strings.TrimPrefix(tr.srv.URL, "http://")
	return tr
}

// push writes img (or an index) under repo:tag with alice's credentials.
func (tr *testRegistry) push(t *testing.T, ref string, w remote.Taggable) {
	t.Helper()
	r, err := name.ParseReference(tr.host + "/" + ref)
	if err != nil {
		t.Fatal(err)
	}
	auth := remote.WithAuth(&authn.Basic{Username: aliceUser, Password: alicePass})
	switch x := w.(type) {
	case v1.ImageIndex:
		err = remote.WriteIndex(r, x, auth)
	case v1.Image:
		err = remote.Write(r, x, auth)
	}
	if err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

// imageFor is a random one-layer image whose config says os/arch.
func imageFor(t *testing.T, os, arch string) v1.Image {
	t.Helper()
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = os, arch
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// keychain answers every registry with one credential.
type keychain struct{ user, pass string }

func (k keychain) Resolve(authn.Resource) (authn.Authenticator, error) {
	return &authn.Basic{Username: k.user, Password: k.pass}, nil
}

// seeded is a test registry holding the images the tests ask about.
func seeded(t *testing.T) *testRegistry {
	t.Helper()
	tr := newTestRegistry(t)
	amd := imageFor(t, "linux", "amd64")
	for _, tag := range []string{"1.0.0", "1.2.0-rc1", "1.2.0", "1.10.0", "1.9.3", "latest"} {
		tr.push(t, "public/app:"+tag, amd)
	}
	tr.push(t, "private/app:1.0", amd)
	tr.push(t, "public/single-arm:1.0", imageFor(t, "linux", "arm64"))
	// A one-platform index (what a single-arch buildx push makes).
	idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{
		Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}},
	})
	tr.push(t, "public/one-platform:2.0", idx)
	return tr
}
