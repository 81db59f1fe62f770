package loki

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/eventpipe/eventpipe/api/buildinfo"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/internal/jsonenc"
)

// Sink pushes batches to a Loki push endpoint. It implements sinks.Pusher;
// the shared runner does batching, retry and the cursor.
type Sink struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	client  *http.Client
	url     string
	labeler *labeler
	// now is the clock; replaced in tests.
	now func() time.Time

	bufs sync.Pool // *[]byte

	// streams caches label strings by label set: a batch has far fewer
	// streams than entries, and rendering one costs allocations.
	streamsMu sync.Mutex
	streams   map[uint64][]cachedStream
}

// cachedStream is one label set and its rendered stream selector.
type cachedStream struct {
	pairs []labelPair
	str   string
}

// maxCachedStreams bounds the stream cache; it is emptied when full (label
// values are bounded, so this only happens with many clusters or
// namespaces).
const maxCachedStreams = 4096

// stream returns the stream selector of pairs and a copy of pairs that
// entries may keep, from the cache when this label set was seen before.
// s.streamsMu is held.
func (s *Sink) stream(pairs []labelPair) ([]labelPair, string) {
	h := hashPairs(pairs)
	for _, c := range s.streams[h] {
		if slices.Equal(c.pairs, pairs) {
			return c.pairs, c.str
		}
	}
	if len(s.streams) >= maxCachedStreams || s.streams == nil {
		s.streams = make(map[uint64][]cachedStream, 64)
	}
	c := cachedStream{pairs: slices.Clone(pairs), str: labelString(pairs)}
	s.streams[h] = append(s.streams[h], c)
	return c.pairs, c.str
}

// hashPairs is FNV-1a over the names and values, each followed by a 0xff
// separator (not valid in UTF-8, so no two label sets run together).
func hashPairs(pairs []labelPair) uint64 {
	h := uint64(14695981039346656037)
	add := func(v string) {
		for i := 0; i < len(v); i++ {
			h = (h ^ uint64(v[i])) * 1099511628211
		}
		h = (h ^ 0xff) * 1099511628211
	}
	for _, p := range pairs {
		add(p.name)
		add(p.value)
	}
	return h
}

// New checks cfg and builds a Sink. logger and reg may be nil.
func New(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("loki sink config: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	u, _ := url.Parse(cfg.URL) // validated
	if len(cfg.QueryParams) > 0 {
		q := u.Query()
		for _, k := range sortedKeys(cfg.QueryParams) {
			q.Set(k, cfg.QueryParams[k])
		}
		u.RawQuery = q.Encode()
	}
	tlsCfg, err := buildTLS(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("loki sink tls: %w", err)
	}
	if err := checkAuthFiles(cfg.Auth); err != nil {
		return nil, fmt.Errorf("loki sink auth: %w", err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	tr.MaxIdleConnsPerHost = 4
	m := newMetrics()
	if err := m.register(reg); err != nil {
		return nil, fmt.Errorf("loki sink metrics: %w", err)
	}
	return &Sink{
		cfg:     cfg,
		log:     logger,
		m:       m,
		client:  &http.Client{Transport: tr, Timeout: cfg.Timeout},
		url:     u.String(),
		labeler: newLabeler(cfg.Labels),
		now:     time.Now,
	}, nil
}

// Close releases idle connections. Push must not be called after Close.
func (s *Sink) Close() error {
	s.client.CloseIdleConnections()
	return nil
}

func buildTLS(c TLSConfig) (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         c.ServerName,
		InsecureSkipVerify: c.InsecureSkipVerify, //nolint:gosec // opt-in, validated against ca_file
	}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s: no PEM certificate found", c.CAFile)
		}
		cfg.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func checkAuthFiles(a AuthConfig) error {
	for _, f := range []string{a.PasswordFile, a.BearerTokenFile} {
		if f == "" {
			continue
		}
		if _, err := readSecret(f); err != nil {
			return err
		}
	}
	return nil
}

func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read secret: %w", err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("secret file %s is empty", path)
	}
	if strings.ContainsAny(v, "\r\n") {
		return "", fmt.Errorf("secret file %s holds more than one line", path)
	}
	return v, nil
}

// Push sends batch to Loki: one request per tenant; entries within a stream
// sorted by time. See the package doc for how each answer is classified.
func (s *Sink) Push(ctx context.Context, batch []sinks.Record) error {
	if len(batch) == 0 {
		return nil
	}
	// One clock reading per Push: a re-stamped entry keeps the same
	// timestamp through the splits of a 400, so Loki drops the exact
	// duplicates a split re-sends.
	now := s.now()
	failed := map[int]error{}
	bp := s.getBuf()
	defer s.putBuf(bp)
	var entries []entry
	entries, *bp = s.build(batch, now, (*bp)[:0], failed)

	// Group by tenant in order of first appearance.
	var tenants []string
	byTenant := map[string][]*entry{}
	for i := range entries {
		e := &entries[i]
		if _, ok := byTenant[e.tenant]; !ok {
			tenants = append(tenants, e.tenant)
		}
		byTenant[e.tenant] = append(byTenant[e.tenant], e)
	}
	for _, t := range tenants {
		if err := s.pushSplit(ctx, t, byTenant[t], failed); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		// One log line per batch, naming the first refused record.
		first := -1
		for i := range failed {
			if first < 0 || i < first {
				first = i
			}
		}
		s.log.Warn("loki refused occurrences for good; counted and dropped",
			"refused", len(failed), "batch", len(batch), "first_offset", batch[first].Offset,
			"first_event_id", jsonenc.CutUTF8(strings.ToValidUTF8(batch[first].Occurrence.GetEventId(), "?"), 128),
			"first_err", failed[first])
		return &sinks.PartialError{Failed: failed}
	}
	return nil
}

// build turns a batch into entries whose lines live in arena (returned,
// grown). Records that cannot be sent are recorded in failed.
// inWindow reports whether Loki accepts ts as an entry time at now.
func (s *Sink) inWindow(ts, now time.Time) bool {
	return !ts.IsZero() && now.Sub(ts) <= s.cfg.MaxAge && ts.Sub(now) <= s.cfg.MaxFuture
}

// restamp is the entry time of an occurrence whose own time Loki would
// refuse: the moment the agent observed it when Loki accepts that, so a
// resend (after a restart, by another replica) carries the same timestamp
// and Loki can drop it as an exact duplicate; else, only when the
// observation is itself out of the window (the sink was behind longer than
// max_age), the push time.
func (s *Sink) restamp(o *eventpipev1.Occurrence, now time.Time) time.Time {
	if ts := o.GetObservedAt(); ts != nil && ts.IsValid() && (ts.Seconds != 0 || ts.Nanos != 0) && s.inWindow(ts.AsTime(), now) {
		return ts.AsTime()
	}
	return now
}

func (s *Sink) build(batch []sinks.Record, now time.Time, arena []byte, failed map[int]error) ([]entry, []byte) {
	entries := make([]entry, 0, len(batch))
	ends := make([]int, 0, len(batch))
	metas := make([]labelPair, 0, 8*len(batch)) // every entry's metadata, sliced
	var pairs []labelPair
	var lastStream string
	var lastPairs []labelPair
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	for i, rec := range batch {
		o := rec.Occurrence
		if o == nil {
			failed[i] = errors.New("record has no occurrence")
			s.m.refused.WithLabelValues(reasonInvalid).Inc()
			continue
		}
		tenant, err := s.tenant(o.GetSandbox().GetWorkspace())
		if err != nil {
			failed[i] = err
			s.m.refused.WithLabelValues(reasonInvalid).Inc()
			continue
		}
		occurred := occurredAt(o)
		ts := occurred
		if !s.inWindow(ts, now) {
			ts = s.restamp(o, now)
			s.m.restamped.Inc()
		}
		pairs = s.labeler.labels(o, pairs)
		if !slices.Equal(pairs, lastPairs) {
			lastPairs, lastStream = s.stream(pairs)
		}
		arena = appendLine(arena, o, s.cfg.MaxMessageBytes)
		ends = append(ends, len(arena))
		m0 := len(metas)
		metas = appendMetadata(metas, o, occurred)
		entries = append(entries, entry{
			idx:    i,
			tenant: tenant,
			stream: lastStream,
			labels: lastPairs,
			ts:     ts,
			meta:   metas[m0:len(metas):len(metas)],
		})
	}
	// The lines live in one buffer (which may have moved while growing).
	start := 0
	for i := range entries {
		entries[i].line = arena[start:ends[i]:ends[i]]
		start = ends[i]
	}
	return entries, arena[:0]
}

// tenant returns the X-Scope-OrgID for a workspace ("" = no header).
func (s *Sink) tenant(workspace string) (string, error) {
	t := s.cfg.Tenant
	switch {
	case t.Fixed != "":
		return t.Fixed, nil
	case !t.FromWorkspace:
		return "", nil
	case workspace == "":
		return t.Default, nil
	case !validTenant(workspace):
		return "", fmt.Errorf("workspace %q is not a valid Loki tenant ID", jsonenc.CutUTF8(strings.ToValidUTF8(workspace, "?"), 64))
	}
	return workspace, nil
}

func validTenant(s string) bool { return tenantRE.MatchString(s) && s != "." && s != ".." }

// pushSplit sends entries; when Loki refuses the request as invalid (400,
// 413) it splits it in halves until it finds the entries Loki refuses, which
// it records in failed; everything else is delivered. Loki stores the valid
// entries of a refused request anyway, so halves re-send some entries: they
// are exact duplicates (same stream, timestamp and line), which Loki drops.
// Any other error stops the push and is returned for the runner to retry.
func (s *Sink) pushSplit(ctx context.Context, tenant string, entries []*entry, failed map[int]error) error {
	err := s.send(ctx, tenant, entries)
	if err == nil {
		return nil
	}
	var bad *badRequestError
	if !errors.As(err, &bad) {
		return err
	}
	if len(entries) == 1 {
		failed[entries[0].idx] = err
		s.m.refused.WithLabelValues(bad.reason()).Inc()
		return nil
	}
	s.m.splits.Inc()
	mid := len(entries) / 2
	if err := s.pushSplit(ctx, tenant, entries[:mid], failed); err != nil {
		return err
	}
	return s.pushSplit(ctx, tenant, entries[mid:], failed)
}

// badRequestError is a 400 or 413: some entry of the request is invalid.
type badRequestError struct {
	status int
	body   string
}

func (e *badRequestError) Error() string {
	return fmt.Sprintf("loki refused the entry (HTTP %d): %s", e.status, e.body)
}

func (e *badRequestError) reason() string {
	if e.status == http.StatusRequestEntityTooLarge {
		return reasonTooLarge
	}
	return reasonBadRequest
}

func (s *Sink) getBuf() *[]byte {
	if b, ok := s.bufs.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, 64<<10)
	return &b
}

func (s *Sink) putBuf(b *[]byte) {
	if cap(*b) > 16<<20 {
		return // do not keep a huge buffer around after one big batch
	}
	s.bufs.Put(b)
}

// send makes one request of entries for tenant and classifies the answer.
func (s *Sink) send(ctx context.Context, tenant string, entries []*entry) error {
	rawp, zp := s.getBuf(), s.getBuf()
	defer s.putBuf(rawp)
	body, contentType := s.encode(entries, rawp, zp)
	// net/http may still be writing the body after Do returns (a server
	// that answers before reading it all): the pooled buffer goes back only
	// once the transport has closed the body.
	rb := &requestBody{Reader: bytes.NewReader(body), closed: make(chan struct{})}
	defer func() {
		select {
		case <-rb.closed:
			s.putBuf(zp)
		case <-time.After(time.Second):
			// Not closed yet: leave the buffer to the garbage collector.
		}
	}()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, rb)
	if err != nil {
		rb.Close()
		return fmt.Errorf("loki push: %w", err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("User-Agent", buildinfo.UserAgent("loki-sink"))
	if tenant != "" {
		req.Header.Set("X-Scope-OrgID", tenant)
	}
	if err := s.authorize(req); err != nil {
		return err // retryable: a secret file being rotated
	}
	start := time.Now()
	resp, err := s.client.Do(req)
	s.m.duration.Observe(time.Since(start).Seconds())
	if err != nil {
		s.m.requests.WithLabelValues(codeError).Inc()
		if ctx.Err() != nil {
			return fmt.Errorf("loki push: %w", ctx.Err())
		}
		return fmt.Errorf("loki push: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	s.m.requests.WithLabelValues(codeClass(resp.StatusCode)).Inc()
	if resp.StatusCode/100 == 2 {
		s.m.sentBytes.Add(float64(len(body)))
		s.m.sentEntries.Add(float64(len(entries)))
		return nil
	}
	text := sanitizeValue(string(msg), 512)
	switch code := resp.StatusCode; {
	case code == http.StatusBadRequest || code == http.StatusRequestEntityTooLarge:
		return &badRequestError{status: code, body: text}
	case code == http.StatusTooManyRequests:
		return sinks.Throttle(fmt.Errorf("loki push: HTTP 429: %s", text), retryAfter(resp.Header.Get("Retry-After"), s.now()))
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		err := fmt.Errorf("loki push: HTTP %d: Loki refused the credentials (check auth and tenant of the sink): %s", code, text)
		if s.cfg.AuthErrorsPermanent {
			return sinks.Permanent(err)
		}
		s.log.Error("loki refused the credentials; holding the batch until they are fixed", "status", code, "body", text)
		return err
	case code == http.StatusNotFound:
		err := fmt.Errorf("loki push: HTTP 404 at %s: wrong URL (expected the push endpoint, e.g. http://loki:3100/loki/api/v1/push): %s", redactURL(s.url), text)
		if s.cfg.AuthErrorsPermanent {
			return sinks.Permanent(err)
		}
		s.log.Error("loki push endpoint not found; holding the batch until the URL is fixed", "url", redactURL(s.url))
		return err
	case code/100 == 5:
		return fmt.Errorf("loki push: HTTP %d: %s", code, text)
	default:
		// Other 4xx (405, 415, ...): the request can never succeed as sent.
		return sinks.Permanent(fmt.Errorf("loki push: HTTP %d: %s", code, text))
	}
}

// encode builds the request body of entries in the pooled buffers raw and
// z (JSON uses raw only).
func (s *Sink) encode(entries []*entry, raw, z *[]byte) (body []byte, contentType string) {
	streams := groupStreams(entries)
	if s.cfg.Encoding == EncodingJSON {
		// JSON is sent from z so that raw can go back to the pool at once.
		*z = appendPushJSON((*z)[:0], streams)
		return *z, "application/json"
	}
	pb := appendPushProto((*raw)[:0], streams)
	*raw = pb[:0]
	body = snappy.Encode((*z)[:cap(*z)], pb)
	*z = body[:0]
	return body, "application/x-protobuf"
}

// requestBody tells when the transport is done with the request body.
type requestBody struct {
	*bytes.Reader
	once   sync.Once
	closed chan struct{}
}

func (b *requestBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}

func (s *Sink) authorize(req *http.Request) error {
	a := s.cfg.Auth
	switch {
	case a.BearerTokenFile != "":
		tok, err := readSecret(a.BearerTokenFile)
		if err != nil {
			return fmt.Errorf("loki push: bearer token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	case a.Username != "":
		pw := a.Password
		if a.PasswordFile != "" {
			var err error
			if pw, err = readSecret(a.PasswordFile); err != nil {
				return fmt.Errorf("loki push: password: %w", err)
			}
		}
		req.SetBasicAuth(a.Username, pw)
	}
	return nil
}

// retryAfter parses a Retry-After header: delay-seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		if secs < 0 {
			return 0
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
