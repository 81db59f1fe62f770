// Package registrytest serves go-containerregistry's in-process registry
// behind token auth, the way ghcr.io and Docker Hub answer, for tests of
// registry checks (package verify) and of what uses them.
package registrytest

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
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry is go-containerregistry's in-process registry behind a
// token-auth front, the way ghcr.io and Docker Hub answer: every /v2/ call
// needs a bearer token from /token (anonymous or with basic credentials),
// and a few repositories answer as a registry does when it refuses:
//
//	private/*    401 unless the token is alice's
//	forbidden/*  403 DENIED for alice, 401 anonymously
//	limited/*    429 with RateLimit-Limit and Retry-After
//	slow/*       no answer until the client gives up
type Registry struct {
	srv *httptest.Server
	// Host is host:port (loopback: reached over plain HTTP).
	Host string
	// Calls counts /v2/ requests other than the version check.
	Calls atomic.Int64
}

const (
	// User and Password: the one credential the registry accepts.
	User, Password      = "alice", "s3cret"
	aliceToken, anonTok = "tok-alice", "tok-anonymous"
)

// New starts a registry for the test; it stops when the test ends.
func New(t testing.TB) *Registry {
	t.Helper()
	backend := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	tr := &Registry{}
	mux := http.NewServeMux()
	mux.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		tok := anonTok
		if u, p, ok := r.BasicAuth(); ok {
			if u != User || p != Password {
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
			tr.Calls.Add(1)
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
	tr.Host = strings.TrimPrefix(tr.srv.URL, "http://")
	return tr
}

// Push writes an image or an index under repo:tag with the credential.
func (tr *Registry) Push(t testing.TB, ref string, w remote.Taggable) {
	t.Helper()
	r, err := name.ParseReference(tr.Host + "/" + ref)
	if err != nil {
		t.Fatal(err)
	}
	auth := remote.WithAuth(&authn.Basic{Username: User, Password: Password})
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

// ImageFor is a random one-layer image whose config says os/arch.
func ImageFor(t testing.TB, os, arch string) v1.Image {
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
