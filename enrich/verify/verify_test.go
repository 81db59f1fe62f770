package verify

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich/verify/registrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newTestVerifier builds a Verifier with its own transport (closed at the
// end, so goleak sees no idle connection) and a registry of its own.
func newTestVerifier(t *testing.T, cfg Config, kc authn.Keychain) (*Verifier, *prometheus.Registry) {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	reg := prometheus.NewRegistry()
	v, err := New(cfg, Options{Keychain: kc, Transport: tr, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return v, reg
}

// TestCheckAnswers asks the in-process registry behind token auth about
// each case a kubelet message can only hint at.
func TestCheckAnswers(t *testing.T) {
	tr := seeded(t)
	alice := keychain{registrytest.User, registrytest.Password}
	bob := keychain{"bob", "wrong"}
	cases := []struct {
		name      string
		kc        authn.Keychain
		image     string
		platform  string
		timeout   time.Duration
		answer    string
		category  string
		detail    []string
		tags      []string
		platforms []string
		limit     string
	}{
		{name: "tag exists", image: "public/app:1.0.0", answer: AnswerExists},
		{name: "tag missing: newest tags by version", image: "public/app:9.9.9", answer: AnswerTagNotFound,
			category: eventpipev1.CategoryNotFound,
			detail:   []string{"tag 9.9.9 does not exist in " + tr.Host + "/public/app", "newest tags by version (of 6): 1.10.0, 1.9.3, 1.2.0, 1.2.0-rc1, 1.0.0"},
			tags:     []string{"1.10.0", "1.9.3", "1.2.0", "1.2.0-rc1", "1.0.0"}},
		{name: "digest missing", image: "public/app@sha256:" + strings.Repeat("ab", 32), answer: AnswerTagNotFound,
			category: eventpipev1.CategoryNotFound, detail: []string{"digest sha256:abab"}},
		{name: "repository missing", image: "public/nothing-here:1.0", answer: AnswerRepoNotFound,
			category: eventpipev1.CategoryNotFound, detail: []string{"repository public/nothing-here does not exist in " + tr.Host}},
		{name: "401 anonymous: private or absent", image: "private/app:1.0", answer: AnswerUnauthorized,
			category: eventpipev1.CategoryNotFoundOrUnauthorized, detail: []string{"refuses anonymous reads of private/app (401)"}},
		{name: "private with credentials", kc: alice, image: "private/app:1.0", answer: AnswerExists},
		{name: "401 with wrong credentials", kc: bob, image: "private/app:1.0", answer: AnswerUnauthorized,
			category: eventpipev1.CategoryUnauthorized, detail: []string{"refuses the credentials for private/app (401)"}},
		{name: "403 denied", kc: alice, image: "forbidden/app:1.0", answer: AnswerDenied,
			category: eventpipev1.CategoryUnauthorized, detail: []string{"denies pulls of forbidden/app to these credentials (403)"}},
		{name: "429 with its limit", image: "limited/app:1.0", answer: AnswerRateLimited,
			category: eventpipev1.CategoryRateLimited, detail: []string{"429 Too Many Requests; limit 100;w=21600; retry after 60"}, limit: "100;w=21600"},
		{name: "one-platform index, node arm64", image: "public/one-platform:2.0", platform: "linux/arm64", answer: AnswerPlatformMissing,
			category: eventpipev1.CategoryPlatformMismatch, detail: []string{"carries linux/amd64, not linux/arm64"}, platforms: []string{"linux/amd64"}},
		{name: "one-platform index, node amd64", image: "public/one-platform:2.0", platform: "linux/amd64", answer: AnswerExists,
			platforms: []string{"linux/amd64"}},
		{name: "single image for another arch", image: "public/single-arm:1.0", platform: "linux/amd64", answer: AnswerPlatformMissing,
			category: eventpipev1.CategoryPlatformMismatch, detail: []string{"single image for linux/arm64, not linux/amd64"}},
		{name: "no answer in time", image: "slow/app:1.0", timeout: 300 * time.Millisecond, answer: AnswerTimeout,
			detail: []string{"did not answer within 300ms"}},
		{name: "invalid reference", image: "Upper/Case::x", answer: AnswerInvalidReference},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := NewDefaultConfig()
			if c.timeout > 0 {
				cfg.Timeout = c.timeout
			}
			v, reg := newTestVerifier(t, cfg, c.kc)
			image := c.image
			if c.answer != AnswerInvalidReference {
				image = tr.Host + "/" + c.image
			}
			start := time.Now()
			r := v.Check(context.Background(), image, c.platform)
			if took := time.Since(start); c.timeout > 0 && took > c.timeout+5*time.Second {
				t.Errorf("check took %s with a %s timeout", took, c.timeout)
			}
			if r.Answer != c.answer || r.Category != c.category {
				t.Fatalf("answer %q category %q, want %q %q (detail %q)", r.Answer, r.Category, c.answer, c.category, r.Detail)
			}
			for _, d := range c.detail {
				if !strings.Contains(r.Detail, d) {
					t.Errorf("detail %q lacks %q", r.Detail, d)
				}
			}
			if c.tags != nil && !slices.Equal(r.Tags, c.tags) {
				t.Errorf("tags %q, want %q", r.Tags, c.tags)
			}
			if c.platforms != nil && !slices.Equal(r.Platforms, c.platforms) {
				t.Errorf("platforms %q, want %q", r.Platforms, c.platforms)
			}
			if r.Limit != c.limit {
				t.Errorf("limit %q, want %q", r.Limit, c.limit)
			}
			if c.answer != AnswerInvalidReference && r.Anonymous != (c.kc == nil) {
				t.Errorf("anonymous %v with keychain %v", r.Anonymous, c.kc)
			}
			pf := &eventpipev1.PullFailure{Category: eventpipev1.CategoryUnknown, Detail: "runtime words"}
			if r.Apply(pf) != r.Conclusive() || (r.Conclusive() && (pf.Category != c.category || pf.DecidedBy != eventpipev1.DecidedByRegistry ||
				pf.Confidence == "" || pf.Detail != r.Detail)) || (!r.Conclusive() && pf.Category != eventpipev1.CategoryUnknown) {
				t.Errorf("Apply: %+v", pf)
			}
			if r.Conclusive() != (c.category != "") {
				t.Errorf("conclusive %v for category %q", r.Conclusive(), c.category)
			}
			called := 1.0
			if c.answer == AnswerInvalidReference {
				called = 0
			}
			if got := testutil.ToFloat64(v.m.calls.WithLabelValues(c.answer)); got != called {
				t.Errorf("registry calls{answer=%s} = %v, want %v", c.answer, got, called)
			}
			if n, err := testutil.GatherAndCount(reg, "eventpipe_verify_registry_call_duration_seconds"); err != nil || n != 1 {
				t.Errorf("duration histogram: %d series, %v", n, err)
			}
		})
	}
}

// TestCacheAndRateLimit: a repeated check is answered from the cache
// without a call; past the per-registry rate a check is not made at all.
func TestCacheAndRateLimit(t *testing.T) {
	tr := seeded(t)
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	cfg := NewDefaultConfig()
	cfg.RatePerRegistry, cfg.Burst, cfg.CacheTTL = 0.1, 2, time.Minute
	v, _ := newTestVerifier(t, cfg, nil)
	v.now = func() time.Time { return now }

	img := tr.Host + "/public/app:9.9.9"
	first := v.Check(context.Background(), img, "")
	calls := tr.Calls.Load()
	if first.Cached || calls == 0 {
		t.Fatalf("first check: cached %v, %d calls", first.Cached, calls)
	}
	for range 5 {
		r := v.Check(context.Background(), img, "")
		if !r.Cached || r.Answer != AnswerTagNotFound {
			t.Fatalf("repeat: cached %v answer %s", r.Cached, r.Answer)
		}
	}
	if got := tr.Calls.Load(); got != calls {
		t.Fatalf("repeats made %d calls", got-calls)
	}
	if got := testutil.ToFloat64(v.m.cacheHits); got != 5 {
		t.Errorf("cache hits %v, want 5", got)
	}

	// Burst 2: the first check took one token, this one the second, the
	// next is refused without a call.
	if r := v.Check(context.Background(), tr.Host+"/public/app:1.0.0", ""); r.Answer != AnswerExists {
		t.Fatalf("second reference: %s (%s)", r.Answer, r.Detail)
	}
	calls = tr.Calls.Load()
	r := v.Check(context.Background(), tr.Host+"/public/app:1.2.0", "")
	if r.Answer != AnswerThrottled || r.Conclusive() {
		t.Fatalf("over the rate: %s", r.Answer)
	}
	if got := tr.Calls.Load(); got != calls {
		t.Fatalf("a throttled check made %d calls", got-calls)
	}
	// Ten seconds later (0.1/s) one more token; the cached answer expires
	// after the TTL and is asked again.
	now = now.Add(10 * time.Second)
	if r := v.Check(context.Background(), tr.Host+"/public/app:1.2.0", ""); r.Answer != AnswerExists || r.Cached {
		t.Fatalf("after refill: %s cached %v", r.Answer, r.Cached)
	}
	now = now.Add(2 * time.Minute)
	if r := v.Check(context.Background(), img, ""); r.Cached {
		t.Fatal("an answer older than cache_ttl was reused")
	}
}

func TestNewestTags(t *testing.T) {
	cases := []struct {
		in   []string
		n    int
		want []string
	}{
		{[]string{"1.9", "1.10", "1.2"}, 5, []string{"1.10", "1.9", "1.2"}},
		{[]string{"v0.1.0", "v0.1.0-rc.2", "v0.1.0-rc.10", "latest", "sha256-abc.sig"}, 5, []string{"v0.1.0", "v0.1.0-rc.10", "v0.1.0-rc.2"}},
		{[]string{"0.0.37", "0.0.36", "dev", "0.0.38-dev.1"}, 2, []string{"dev", "0.0.38-dev.1"}},
	}
	for _, c := range cases {
		if got := newestTags(c.in, c.n); !slices.Equal(got, c.want) {
			t.Errorf("newestTags(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	c := Config{RatePerRegistry: -1, InsecureRegistries: []string{"a/b"}}
	err := c.Validate("verify.")
	for _, want := range []string{"verify.timeout", "verify.cache_ttl", "verify.cache_max", "verify.rate_per_registry", "verify.burst", "verify.insecure_registries[0]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want a problem at %s", err, want)
		}
	}
	if err := NewDefaultConfig().Validate(""); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// TestApplyNeverSaysLess: an anonymous 401 (not_found_or_unauthorized)
// does not replace a diagnosis that already says which of the two it is.
func TestApplyNeverSaysLess(t *testing.T) {
	anon := Result{Answer: AnswerUnauthorized, Category: eventpipev1.CategoryNotFoundOrUnauthorized, Detail: "401"}
	for _, c := range []struct {
		have    string
		applied bool
	}{
		{eventpipev1.CategoryUnauthorized, false},
		{eventpipev1.CategoryNotFound, false},
		{eventpipev1.CategoryUnknown, true},
		{eventpipev1.CategoryNotFoundOrUnauthorized, true},
	} {
		pf := &eventpipev1.PullFailure{Category: c.have, DecidedBy: eventpipev1.DecidedByClusterContext}
		if got := anon.Apply(pf); got != c.applied || (got && pf.DecidedBy != eventpipev1.DecidedByRegistry) || (!got && pf.Category != c.have) {
			t.Errorf("%s: applied %v, now %+v", c.have, got, pf)
		}
	}
}

// failing is a transport that fails every request while down is set.
type failing struct {
	base http.RoundTripper
	down bool
}

func (f *failing) RoundTrip(req *http.Request) (*http.Response, error) {
	if f.down {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	return f.base.RoundTrip(req)
}

// TestLastVerifiedKept: the last conclusive answer outlives its TTL and an
// inconclusive answer after it (unreachable), and is replaced only by a
// newer conclusive one.
func TestLastVerifiedKept(t *testing.T) {
	tr := seeded(t)
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	ft := &failing{base: base}
	now := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	cfg := NewDefaultConfig()
	v, err := New(cfg, Options{Transport: ft, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	image := tr.Host + "/public/app:9.9.9"
	if _, ok := v.LastVerified(image, ""); ok {
		t.Fatal("an answer before any check")
	}
	if r := v.Check(context.Background(), image, ""); r.Answer != AnswerTagNotFound {
		t.Fatalf("first check: %s", r.Answer)
	}
	now = now.Add(cfg.CacheTTL + time.Second)
	ft.down = true
	if r := v.Check(context.Background(), image, ""); r.Answer != AnswerUnreachable {
		t.Fatalf("check while down: %s", r.Answer)
	}
	if r, ok := v.LastVerified(image, ""); !ok || r.Answer != AnswerTagNotFound || !r.Cached {
		t.Errorf("after an inconclusive answer: %v %+v; want the tag_not_found kept", ok, r)
	}
	if r, fresh := v.Cached(image, ""); !fresh || r.Conclusive() {
		t.Errorf("Cached: %v %+v; want the fresh unreachable", fresh, r)
	}
}
