package verify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Answers of a check: what the registry said. The list is fixed (it is the
// answer label of the metrics).
const (
	// AnswerExists: the reference resolves (for the platform asked, when one was).
	AnswerExists = "exists"
	// AnswerTagNotFound: the repository exists, the tag (or digest) does not.
	AnswerTagNotFound = "tag_not_found"
	// AnswerRepoNotFound: the registry says the repository does not exist.
	AnswerRepoNotFound = "repository_not_found"
	// AnswerUnauthorized: 401. Asked anonymously, many registries answer
	// so for a repository that does not exist too, so it establishes
	// not_found_or_unauthorized then, and unauthorized with credentials.
	AnswerUnauthorized = "unauthorized"
	// AnswerDenied: 403, the credentials lack pull access.
	AnswerDenied = "denied"
	// AnswerRateLimited: 429 Too Many Requests.
	AnswerRateLimited = "rate_limited"
	// AnswerPlatformMissing: the image exists, but not for the platform asked.
	AnswerPlatformMissing = "platform_missing"
	// AnswerUnreachable: no answer that says anything about the image
	// (DNS, connect, TLS, a 5xx): inconclusive.
	AnswerUnreachable = "unreachable"
	// AnswerTimeout: the check ran past Config.Timeout: inconclusive.
	AnswerTimeout = "timeout"
	// AnswerInvalidReference: the reference does not parse; nothing was asked.
	AnswerInvalidReference = "invalid_reference"
	// AnswerThrottled: over this Verifier's own per-registry rate: nothing was asked.
	AnswerThrottled = "throttled"
)

// Answers lists every answer (the metrics' label values).
var Answers = []string{AnswerExists, AnswerTagNotFound, AnswerRepoNotFound, AnswerUnauthorized, AnswerDenied,
	AnswerRateLimited, AnswerPlatformMissing, AnswerUnreachable, AnswerTimeout, AnswerInvalidReference, AnswerThrottled}

// Result is one check's answer.
type Result struct {
	// Image is the reference asked, normalised (registry, repository, tag or digest).
	Image      string `json:"image"`
	Registry   string `json:"registry,omitempty"`
	Repository string `json:"repository,omitempty"`
	// Platform asked ("os/arch[/variant]"), when one was.
	Platform string `json:"platform,omitempty"`
	Answer   string `json:"answer"`
	// Category is the pull-failure category the answer establishes
	// (eventpipev1.Category*), empty when it establishes none.
	Category string `json:"category,omitempty"`
	// Detail says what the registry answered, for humans.
	Detail string `json:"detail"`
	// Tags: the repository's newest tags by version order (registries
	// give no dates), when the tag was not found.
	Tags []string `json:"tags,omitempty"`
	// Platforms the image index carries, when it is an index.
	Platforms []string `json:"platforms,omitempty"`
	// Limit and RetryAfter: the registry's RateLimit-Limit and Retry-After
	// headers on a 429, when it sent them.
	Limit      string `json:"limit,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
	// Anonymous is set when no credential was sent.
	Anonymous bool      `json:"anonymous"`
	CheckedAt time.Time `json:"checked_at"`
	// Cached is set when the answer came from the cache, not a call.
	Cached bool `json:"cached,omitempty"`
}

// Conclusive reports whether the answer establishes a cause.
func (r Result) Conclusive() bool { return r.Category != "" }

// Confidence is how sure the established cause is (eventpipev1.Confidence*):
// certain for every answer that names it, likely for a 401 to an anonymous
// caller (a private repository and a missing one look the same then).
func (r Result) Confidence() string {
	switch {
	case !r.Conclusive():
		return ""
	case r.Category == eventpipev1.CategoryNotFoundOrUnauthorized:
		return eventpipev1.ConfidenceLikely
	}
	return eventpipev1.ConfidenceCertain
}

// Apply upgrades a pull failure's diagnosis with a conclusive answer, in
// the same fields (category, detail, decided_by registry, confidence): the
// registry's words replace the runtime's. It reports whether it changed
// pf; an inconclusive answer leaves it as it was.
func (r Result) Apply(pf *eventpipev1.PullFailure) bool {
	if pf == nil || !r.Conclusive() {
		return false
	}
	if r.Category == eventpipev1.CategoryNotFoundOrUnauthorized &&
		(pf.Category == eventpipev1.CategoryUnauthorized || pf.Category == eventpipev1.CategoryNotFound) {
		return false // an anonymous 401 says less than the diagnosis already does
	}
	pf.Category, pf.Detail = r.Category, r.Detail
	pf.DecidedBy, pf.Confidence = eventpipev1.DecidedByRegistry, r.Confidence()
	if r.Category == eventpipev1.CategoryRateLimited {
		pf.Disposition = eventpipev1.DispositionRetrying // the limit resets
	} else {
		pf.Disposition = eventpipev1.DispositionPersistent // retrying will not change the registry's answer
	}
	return true
}

// Config is what an operator writes (YAML) for registry checks.
type Config struct {
	// Timeout bounds one check (every request it makes, token exchange included).
	Timeout time.Duration `yaml:"timeout"`
	// CacheTTL: an answer is reused this long for the same reference,
	// platform and credential.
	CacheTTL time.Duration `yaml:"cache_ttl"`
	// CacheMax bounds the cached answers (the oldest go first).
	CacheMax int `yaml:"cache_max"`
	// RatePerRegistry: checks per second per registry host, with Burst
	// at once; a check over it is not made (AnswerThrottled).
	RatePerRegistry float64 `yaml:"rate_per_registry"`
	Burst           int     `yaml:"burst"`
	// MaxTags: how many of a repository's newest tags a tag_not_found
	// answer names.
	MaxTags int `yaml:"max_tags"`
	// InsecureRegistries are reached over plain HTTP (host or host:port).
	// Loopback and RFC 1918 addresses are always.
	InsecureRegistries []string `yaml:"insecure_registries"`
}

// NewDefaultConfig: a 10 s bound, answers kept 10 minutes, one check a
// second per registry with a burst of 5.
func NewDefaultConfig() Config {
	return Config{Timeout: 10 * time.Second, CacheTTL: 10 * time.Minute, CacheMax: 4096, RatePerRegistry: 1, Burst: 5, MaxTags: 5}
}

// Validate reports every problem, each with its YAML path under prefix
// (e.g. "verify.").
func (c Config) Validate(prefix string) error {
	var errs []error
	add := func(path, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s%s: %s", prefix, path, fmt.Sprintf(format, a...)))
	}
	if c.Timeout <= 0 {
		add("timeout", "must be positive, got %s", c.Timeout)
	}
	if c.CacheTTL <= 0 {
		add("cache_ttl", "must be positive, got %s", c.CacheTTL)
	}
	if c.CacheMax < 1 {
		add("cache_max", "must be at least 1, got %d", c.CacheMax)
	}
	if c.RatePerRegistry <= 0 {
		add("rate_per_registry", "must be positive, got %g", c.RatePerRegistry)
	}
	if c.Burst < 1 {
		add("burst", "must be at least 1, got %d", c.Burst)
	}
	if c.MaxTags < 0 {
		add("max_tags", "must not be negative, got %d", c.MaxTags)
	}
	for i, r := range c.InsecureRegistries {
		if strings.TrimSpace(r) == "" || strings.Contains(r, "/") {
			add(fmt.Sprintf("insecure_registries[%d]", i), "must be a host or host:port, got %q", r)
		}
	}
	return errors.Join(errs...)
}

// Options are the values of a Verifier that come from code.
type Options struct {
	// Keychain finds credentials per registry; nil asks anonymously.
	Keychain authn.Keychain
	// Transport is the HTTP transport (nil: http.DefaultTransport).
	Transport http.RoundTripper
	Logger    *slog.Logger
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Verifier checks image references against their registries.
type Verifier struct {
	cfg       Config
	keychain  authn.Keychain
	transport http.RoundTripper
	log       *slog.Logger
	now       func() time.Time
	m         *metrics

	mu    sync.Mutex
	cache map[string]Result
	order []string // cache keys, oldest first
	// verified keeps each cache key's last conclusive answer, however old,
	// until a newer conclusive answer replaces it or the key is evicted:
	// what a failure is shown while its image is asked again.
	verified map[string]Result
	limiters map[string]*rate.Limiter
}

// New validates cfg and builds a Verifier.
func New(cfg Config, opts Options) (*Verifier, error) {
	if err := cfg.Validate(""); err != nil {
		return nil, fmt.Errorf("verify config: %w", err)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	v := &Verifier{cfg: cfg, keychain: opts.Keychain, transport: opts.Transport, log: opts.Logger, now: opts.Now, m: m,
		cache: map[string]Result{}, verified: map[string]Result{}, limiters: map[string]*rate.Limiter{}}
	if v.transport == nil {
		v.transport = http.DefaultTransport
	}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	if v.now == nil {
		v.now = time.Now
	}
	return v, nil
}

// Check asks the registry about image (as the kubelet names it) for
// platform ("os/arch[/variant]", "" for any). It never returns an error:
// what went wrong is the answer.
func (v *Verifier) Check(ctx context.Context, image, platform string) Result {
	ref, err := v.parse(image)
	if err != nil {
		v.m.checks.WithLabelValues(AnswerInvalidReference).Inc()
		return Result{Image: image, Platform: platform, Answer: AnswerInvalidReference, Detail: err.Error(), CheckedAt: v.now()}
	}
	reg := ref.Context().RegistryStr()
	anonymous := v.anonymous(ref)
	key := ref.Name() + "|" + platform
	now := v.now()
	v.mu.Lock()
	if r, ok := v.cache[key]; ok && now.Sub(r.CheckedAt) < v.cfg.CacheTTL {
		v.mu.Unlock()
		v.m.cacheHits.Inc()
		r.Cached = true
		return r
	}
	lim := v.limiters[reg]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(v.cfg.RatePerRegistry), v.cfg.Burst)
		v.limiters[reg] = lim
	}
	allowed := lim.AllowN(now, 1)
	v.mu.Unlock()
	if !allowed {
		v.m.checks.WithLabelValues(AnswerThrottled).Inc()
		return Result{Image: ref.Name(), Registry: reg, Repository: ref.Context().RepositoryStr(), Platform: platform,
			Answer: AnswerThrottled, Anonymous: anonymous, CheckedAt: now,
			Detail: fmt.Sprintf("not asked: more than %g checks a second to %s (verify.rate_per_registry)", v.cfg.RatePerRegistry, reg)}
	}

	start := time.Now()
	r := v.ask(ctx, ref, platform, anonymous)
	r.CheckedAt = v.now()
	v.m.calls.WithLabelValues(r.Answer).Inc()
	v.m.checks.WithLabelValues(r.Answer).Inc()
	v.m.duration.Observe(time.Since(start).Seconds())
	v.log.Debug("registry check", "image", r.Image, "platform", platform, "answer", r.Answer, "took", time.Since(start))

	v.mu.Lock()
	if _, ok := v.cache[key]; !ok {
		v.order = append(v.order, key)
	}
	v.cache[key] = r
	if r.Conclusive() {
		v.verified[key] = r
	}
	for len(v.order) > v.cfg.CacheMax {
		delete(v.cache, v.order[0])
		delete(v.verified, v.order[0])
		v.order = v.order[1:]
	}
	v.mu.Unlock()
	return r
}

// Cached returns the cached answer for image and platform when it is
// fresh, without asking anyone: what a hot path may call.
func (v *Verifier) Cached(image, platform string) (Result, bool) {
	ref, err := v.parse(image)
	if err != nil {
		return Result{}, false
	}
	now := v.now()
	v.mu.Lock()
	r, ok := v.cache[ref.Name()+"|"+platform]
	v.mu.Unlock()
	if !ok || now.Sub(r.CheckedAt) >= v.cfg.CacheTTL {
		return Result{}, false
	}
	v.m.cacheHits.Inc()
	r.Cached = true
	return r, true
}

// LastVerified returns the last conclusive answer for image and platform
// whatever its age (kept until a newer conclusive answer replaces it), so
// a failure whose fresh answer is not in yet, or was inconclusive (a
// timeout, a throttled check), is not shown with less than the registry
// already said. Asks no one.
func (v *Verifier) LastVerified(image, platform string) (Result, bool) {
	ref, err := v.parse(image)
	if err != nil {
		return Result{}, false
	}
	v.mu.Lock()
	r, ok := v.verified[ref.Name()+"|"+platform]
	v.mu.Unlock()
	if ok {
		r.Cached = true
	}
	return r, ok
}

func (v *Verifier) parse(image string) (name.Reference, error) {
	ref, err := name.ParseReference(image)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", image, err)
	}
	if slices.Contains(v.cfg.InsecureRegistries, ref.Context().RegistryStr()) {
		if ref, err = name.ParseReference(image, name.Insecure); err != nil {
			return nil, fmt.Errorf("parse %q: %w", image, err)
		}
	}
	return ref, nil
}

func (v *Verifier) anonymous(ref name.Reference) bool {
	if v.keychain == nil {
		return true
	}
	a, err := v.keychain.Resolve(ref.Context())
	return err != nil || a == authn.Anonymous
}

// ask makes the calls of one check: the manifest, then (when it is not
// there) the tag list, or (when a platform is asked) the index or config.
func (v *Verifier) ask(ctx context.Context, ref name.Reference, platform string, anonymous bool) Result {
	ctx, cancel := context.WithTimeout(ctx, v.cfg.Timeout)
	defer cancel()
	repo := ref.Context()
	r := Result{Image: ref.Name(), Registry: repo.RegistryStr(), Repository: repo.RepositoryStr(), Platform: platform, Anonymous: anonymous}
	hdr := &rateHeaders{base: v.transport}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(hdr),
		remote.WithUserAgent("eventpipe-verify"),
		// One attempt: a retry is the next check, after the cache entry expires.
		remote.WithRetryBackoff(remote.Backoff{Steps: 1}),
	}
	if v.keychain != nil {
		opts = append(opts, remote.WithAuthFromKeychain(v.keychain))
	}
	desc, err := remote.Get(ref, opts...)
	if err != nil {
		v.classify(ctx, &r, err, hdr)
		if r.Answer == AnswerTagNotFound {
			v.listTags(ctx, &r, ref, opts, hdr)
		}
		return r
	}
	if platform == "" {
		r.Answer, r.Detail = AnswerExists, fmt.Sprintf("%s exists in %s", what(ref), repoName(ref))
		return r
	}
	want, err := v1.ParsePlatform(platform)
	if err != nil {
		r.Answer, r.Detail = AnswerExists, fmt.Sprintf("%s exists in %s (platform %q not understood: not compared)", what(ref), repoName(ref), platform)
		return r
	}
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		var im *v1.IndexManifest
		if err == nil {
			im, err = idx.IndexManifest()
		}
		if err != nil {
			v.classify(ctx, &r, err, hdr)
			return r
		}
		found := false
		for _, m := range im.Manifests {
			if m.Platform == nil || m.Platform.OS == "unknown" { // attestations
				continue
			}
			r.Platforms = append(r.Platforms, m.Platform.String())
			if m.Platform.Satisfies(*want) {
				found = true
			}
		}
		if !found {
			r.Answer, r.Category = AnswerPlatformMissing, eventpipev1.CategoryPlatformMismatch
			r.Detail = fmt.Sprintf("%s of %s carries %s, not %s", what(ref), repoName(ref), strings.Join(r.Platforms, ", "), platform)
			return r
		}
		r.Answer, r.Detail = AnswerExists, fmt.Sprintf("%s exists in %s for %s", what(ref), repoName(ref), platform)
		return r
	}
	img, err := desc.Image()
	var cf *v1.ConfigFile
	if err == nil {
		cf, err = img.ConfigFile()
	}
	if err != nil {
		v.classify(ctx, &r, err, hdr)
		return r
	}
	have := v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
	r.Platforms = []string{have.String()}
	if !have.Satisfies(*want) {
		r.Answer, r.Category = AnswerPlatformMissing, eventpipev1.CategoryPlatformMismatch
		r.Detail = fmt.Sprintf("%s of %s is a single image for %s, not %s", what(ref), repoName(ref), have.String(), platform)
		return r
	}
	r.Answer, r.Detail = AnswerExists, fmt.Sprintf("%s exists in %s for %s", what(ref), repoName(ref), platform)
	return r
}

// classify turns a failed call into an answer.
func (v *Verifier) classify(ctx context.Context, r *Result, err error, hdr *rateHeaders) {
	var te *transport.Error
	switch {
	case errors.As(err, &te):
		switch te.StatusCode {
		case http.StatusNotFound:
			if hasCode(te, transport.NameUnknownErrorCode) {
				r.Answer, r.Category = AnswerRepoNotFound, eventpipev1.CategoryNotFound
				r.Detail = fmt.Sprintf("repository %s does not exist in %s", r.Repository, r.Registry)
				return
			}
			r.Answer, r.Category = AnswerTagNotFound, eventpipev1.CategoryNotFound
			return
		case http.StatusUnauthorized:
			r.Answer = AnswerUnauthorized
			if r.Anonymous {
				r.Category = eventpipev1.CategoryNotFoundOrUnauthorized
				r.Detail = fmt.Sprintf("%s refuses anonymous reads of %s (401): the repository is private, or does not exist", r.Registry, r.Repository)
			} else {
				r.Category = eventpipev1.CategoryUnauthorized
				r.Detail = fmt.Sprintf("%s refuses the credentials for %s (401)", r.Registry, r.Repository)
			}
			return
		case http.StatusForbidden:
			r.Answer, r.Category = AnswerDenied, eventpipev1.CategoryUnauthorized
			r.Detail = fmt.Sprintf("%s denies pulls of %s to these credentials (403)", r.Registry, r.Repository)
			return
		case http.StatusTooManyRequests:
			r.Answer, r.Category = AnswerRateLimited, eventpipev1.CategoryRateLimited
			r.Limit, r.RetryAfter = hdr.limit, hdr.retryAfter
			r.Detail = fmt.Sprintf("%s answered 429 Too Many Requests", r.Registry)
			if r.Limit != "" {
				r.Detail += "; limit " + r.Limit
			}
			if r.RetryAfter != "" {
				r.Detail += "; retry after " + r.RetryAfter
			}
			return
		}
		r.Answer = AnswerUnreachable
		r.Detail = fmt.Sprintf("%s answered %d: %s", r.Registry, te.StatusCode, oneLine(te.Error()))
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		r.Answer = AnswerTimeout
		r.Detail = fmt.Sprintf("%s did not answer within %s", r.Registry, v.cfg.Timeout)
	default:
		r.Answer = AnswerUnreachable
		r.Detail = fmt.Sprintf("could not ask %s: %s", r.Registry, oneLine(err.Error()))
	}
}

// listTags completes a tag_not_found answer with the repository's newest
// tags, or turns it into repository_not_found when the list says so.
func (v *Verifier) listTags(ctx context.Context, r *Result, ref name.Reference, opts []remote.Option, hdr *rateHeaders) {
	tags, err := remote.List(ref.Context(), opts...)
	if err != nil {
		var te *transport.Error
		if errors.As(err, &te) && te.StatusCode == http.StatusNotFound {
			r.Answer = AnswerRepoNotFound
			r.Detail = fmt.Sprintf("repository %s does not exist in %s", r.Repository, r.Registry)
			return
		}
		r.Detail = fmt.Sprintf("%s does not exist in %s (its tags could not be listed: %s)", what(ref), repoName(ref), oneLine(err.Error()))
		return
	}
	if len(tags) == 0 {
		r.Detail = fmt.Sprintf("%s does not exist in %s, which has no tags", what(ref), repoName(ref))
		return
	}
	r.Tags = newestTags(tags, v.cfg.MaxTags)
	r.Detail = fmt.Sprintf("%s does not exist in %s", what(ref), repoName(ref))
	if len(r.Tags) > 0 {
		r.Detail += fmt.Sprintf("; newest tags by version (of %d): %s", len(tags), strings.Join(r.Tags, ", "))
	}
}

func hasCode(te *transport.Error, code transport.ErrorCode) bool {
	for _, d := range te.Errors {
		if d.Code == code {
			return true
		}
	}
	return false
}

// what names the tag or digest of ref.
func what(ref name.Reference) string {
	if d, ok := ref.(name.Digest); ok {
		return "digest " + d.DigestStr()
	}
	return "tag " + ref.Identifier()
}

func repoName(ref name.Reference) string { return ref.Context().Name() }

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// rateHeaders is a per-check transport that remembers the rate-limit
// headers of a 429 (go-containerregistry's error keeps no response).
type rateHeaders struct {
	base       http.RoundTripper
	mu         sync.Mutex
	limit      string
	retryAfter string
}

func (h *rateHeaders) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := h.base.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		h.mu.Lock()
		h.limit = firstHeader(resp.Header, "RateLimit-Limit", "X-RateLimit-Limit")
		h.retryAfter = resp.Header.Get("Retry-After")
		h.mu.Unlock()
	}
	return resp, err
}

func firstHeader(h http.Header, names ...string) string {
	for _, n := range names {
		if v := h.Get(n); v != "" {
			return v
		}
	}
	return ""
}
