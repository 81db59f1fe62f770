package loki

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
)

// fakeLoki decodes real push requests (protobuf+snappy or JSON) and, like
// Loki's distributor, stores the valid entries of a request (dropping exact
// duplicates) and answers 400 if any entry was invalid. invalid decides.
type fakeLoki struct {
	mu       sync.Mutex
	invalid  func(line string) bool
	status   int // when non-zero, every request gets this status
	header   http.Header
	stored   map[string]int // "tenant|stream|ts|line" -> times stored
	order    []decodedStream
	requests int
	tenants  []string
	auth     []string
	ctypes   []string
	queries  []string
}

func newFakeLoki() *fakeLoki { return &fakeLoki{stored: map[string]int{}, header: http.Header{}} }

func (f *fakeLoki) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests++
	f.tenants = append(f.tenants, r.Header.Get("X-Scope-OrgID"))
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	f.ctypes = append(f.ctypes, r.Header.Get("Content-Type"))
	f.queries = append(f.queries, r.URL.RawQuery)
	if f.status != 0 {
		for k, v := range f.header {
			w.Header()[k] = v
		}
		w.WriteHeader(f.status)
		fmt.Fprintf(w, "status %d from the fake\n", f.status)
		return
	}
	var streams []decodedStream
	switch r.Header.Get("Content-Type") {
	case "application/x-protobuf":
		raw, err := snappy.Decode(nil, body)
		if err != nil {
			http.Error(w, "snappy: "+err.Error(), 400)
			return
		}
		if streams, err = decodePushBytes(raw); err != nil {
			http.Error(w, "protobuf: "+err.Error(), 400)
			return
		}
	case "application/json":
		var req struct {
			Streams []struct {
				Stream map[string]string `json:"stream"`
				Values [][]any           `json:"values"`
			} `json:"streams"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		for _, s := range req.Streams {
			ds := decodedStream{labels: fmt.Sprint(s.Stream)}
			for _, v := range s.Values {
				ns, _ := strconv.ParseInt(v[0].(string), 10, 64)
				ds.entries = append(ds.entries, decodedEntry{sec: ns / 1e9, nanos: ns % 1e9, line: v[1].(string)})
			}
			streams = append(streams, ds)
		}
	default:
		http.Error(w, "content type", 415)
		return
	}
	bad := 0
	for _, s := range streams {
		for _, e := range s.entries {
			if f.invalid != nil && f.invalid(e.line) {
				bad++
				continue
			}
			f.stored[fmt.Sprintf("%s|%s|%d.%09d|%s", r.Header.Get("X-Scope-OrgID"), s.labels, e.sec, e.nanos, e.line)]++
		}
	}
	f.order = append(f.order, streams...)
	if bad > 0 {
		http.Error(w, fmt.Sprintf("%d entries invalid: line too long", bad), 400)
		return
	}
	w.WriteHeader(204)
}

func newTestSink(t *testing.T, url string, mut func(*Config)) *Sink {
	t.Helper()
	cfg := NewDefaultConfig()
	cfg.URL = url
	cfg.Timeout = 5 * time.Second
	if mut != nil {
		mut(&cfg)
	}
	s, err := New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func counterValue(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	go func() { c.Collect(ch); close(ch) }()
	var sum float64
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		sum += d.GetCounter().GetValue()
	}
	return sum
}

func TestPushProtobufDelivers(t *testing.T) {
	f := newFakeLoki()
	srv := httptest.NewServer(f)
	defer srv.Close()
	s := newTestSink(t, srv.URL+"/loki/api/v1/push", func(c *Config) {
		c.QueryParams = map[string]string{"disable_message_parsing": "1"}
	})
	now := time.Now()
	batch := records(pullFailure("sb-1", 1, now.Add(-time.Second)), scheduled(2, now.Add(-3*time.Second)), pullFailure("sb-1", 3, now.Add(-2*time.Second)))
	if err := s.Push(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	if f.requests != 1 || f.ctypes[0] != "application/x-protobuf" || f.tenants[0] != "" || f.queries[0] != "disable_message_parsing=1" {
		t.Fatalf("requests=%d ctype=%v tenant=%q query=%q", f.requests, f.ctypes, f.tenants, f.queries)
	}
	if len(f.stored) != 3 || len(f.order) != 2 {
		t.Fatalf("stored %d entries in %d streams", len(f.stored), len(f.order))
	}
	// The two pull failures share a stream and are sorted by time.
	ws := f.order[0]
	if !strings.Contains(ws.labels, `workspace="repro"`) || len(ws.entries) != 2 || ws.entries[0].sec*1e9+ws.entries[0].nanos > ws.entries[1].sec*1e9+ws.entries[1].nanos {
		t.Fatalf("stream %+v", ws)
	}
	if !strings.Contains(ws.entries[0].line, `"event_id":"7f1c2d3e-0000-4000-8000-000000000003/1003"`) {
		t.Fatalf("first entry is not the older one: %s", ws.entries[0].line)
	}
	if got := counterValue(t, s.m.sentEntries); got != 3 {
		t.Fatalf("sent entries metric %v", got)
	}
}

func TestPushJSONDelivers(t *testing.T) {
	f := newFakeLoki()
	srv := httptest.NewServer(f)
	defer srv.Close()
	s := newTestSink(t, srv.URL, func(c *Config) { c.Encoding = EncodingJSON })
	if err := s.Push(context.Background(), records(pullFailure("sb-1", 1, time.Now()), scheduled(2, time.Now()))); err != nil {
		t.Fatal(err)
	}
	if f.ctypes[0] != "application/json" || len(f.stored) != 2 {
		t.Fatalf("ctype %v stored %d", f.ctypes, len(f.stored))
	}
}

// TestPushSplitsRefusedRequest: Loki answers 400 when any entry is invalid
// (here: lines of poisoned messages). The sink finds exactly those, reports
// them as a PartialError, and every other entry is stored exactly once.
func TestPushSplitsRefusedRequest(t *testing.T) {
	for _, n := range []int{1, 2, 7, 100, 500} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			f := newFakeLoki()
			f.invalid = func(line string) bool { return strings.Contains(line, "POISON") }
			srv := httptest.NewServer(f)
			defer srv.Close()
			s := newTestSink(t, srv.URL, nil)
			now := time.Now()
			var occs []*eventpipev1.Occurrence
			poisoned := map[int]bool{}
			for i := 0; i < n; i++ {
				o := pullFailure(fmt.Sprintf("sb-%d", i%3), i, now.Add(-time.Duration(i)*time.Millisecond))
				if i%37 == 5 || i == n-1 {
					o.Message = "POISON " + o.Message
					poisoned[i] = true
				}
				occs = append(occs, o)
			}
			err := s.Push(context.Background(), records(occs...))
			var pe *sinks.PartialError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want PartialError", err)
			}
			if len(pe.Failed) != len(poisoned) {
				t.Fatalf("failed %d, want %d", len(pe.Failed), len(poisoned))
			}
			for i, ferr := range pe.Failed {
				if !poisoned[i] || !strings.Contains(ferr.Error(), "HTTP 400") {
					t.Fatalf("index %d failed with %v (poisoned %v)", i, ferr, poisoned[i])
				}
			}
			if len(f.stored) != n-len(poisoned) {
				t.Fatalf("stored %d distinct entries, want %d", len(f.stored), n-len(poisoned))
			}
			// Bounded work: a split costs at most 2 requests per level per bad entry.
			if limit := 1 + 2*len(poisoned)*(bitsLen(n)+1); f.requests > limit {
				t.Fatalf("%d requests for %d entries, %d bad (limit %d)", f.requests, n, len(poisoned), limit)
			}
			if got := counterValue(t, s.m.refused); got != float64(len(poisoned)) {
				t.Fatalf("refused metric %v", got)
			}
		})
	}
}

func bitsLen(n int) int {
	b := 0
	for ; n > 0; n >>= 1 {
		b++
	}
	return b
}

func TestPushErrorClasses(t *testing.T) {
	cases := []struct {
		name       string
		status     int
		header     map[string]string
		mut        func(*Config)
		throttle   time.Duration // -1: not a throttle error
		permanent  bool
		wantSubstr string
	}{
		{name: "429 seconds", status: 429, header: map[string]string{"Retry-After": "7"}, throttle: 7 * time.Second, wantSubstr: "429"},
		{name: "429 no hint", status: 429, throttle: 0, wantSubstr: "429"},
		{name: "503", status: 503, throttle: -1, wantSubstr: "HTTP 503"},
		{name: "500", status: 500, throttle: -1, wantSubstr: "HTTP 500"},
		{name: "401 held", status: 401, throttle: -1, wantSubstr: "credentials"},
		{name: "403 held", status: 403, throttle: -1, wantSubstr: "credentials"},
		{name: "404 held", status: 404, throttle: -1, wantSubstr: "wrong URL"},
		{name: "401 permanent", status: 401, mut: func(c *Config) { c.AuthErrorsPermanent = true }, throttle: -1, permanent: true, wantSubstr: "credentials"},
		{name: "404 permanent", status: 404, mut: func(c *Config) { c.AuthErrorsPermanent = true }, throttle: -1, permanent: true, wantSubstr: "wrong URL"},
		{name: "415", status: 415, throttle: -1, permanent: true, wantSubstr: "HTTP 415"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeLoki()
			f.status = c.status
			for k, v := range c.header {
				f.header.Set(k, v)
			}
			srv := httptest.NewServer(f)
			defer srv.Close()
			s := newTestSink(t, srv.URL, c.mut)
			err := s.Push(context.Background(), records(pullFailure("sb", 1, time.Now())))
			if err == nil || !strings.Contains(err.Error(), c.wantSubstr) {
				t.Fatalf("err = %v, want it to mention %q", err, c.wantSubstr)
			}
			var te *sinks.ThrottleError
			if isT := errors.As(err, &te); isT != (c.throttle >= 0) || (isT && te.RetryAfter != c.throttle) {
				t.Fatalf("throttle: %v (%+v), want %v", isT, te, c.throttle)
			}
			if sinks.IsPermanent(err) != c.permanent {
				t.Fatalf("permanent = %v, want %v", sinks.IsPermanent(err), c.permanent)
			}
			var pe *sinks.PartialError
			if errors.As(err, &pe) {
				t.Fatalf("a whole-request error must not be partial: %v", err)
			}
		})
	}
}

func TestRetryAfterDate(t *testing.T) {
	now := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	if got := retryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now); got != 90*time.Second {
		t.Fatalf("got %v", got)
	}
	for _, v := range []string{"", "-3", "soon", now.Add(-time.Minute).Format(http.TimeFormat)} {
		if got := retryAfter(v, now); got != 0 {
			t.Fatalf("retryAfter(%q) = %v", v, got)
		}
	}
}

func TestPushNetworkErrorIsRetryable(t *testing.T) {
	srv := httptest.NewServer(newFakeLoki())
	url := srv.URL
	srv.Close()
	s := newTestSink(t, url, nil)
	err := s.Push(context.Background(), records(pullFailure("sb", 1, time.Now())))
	var te *sinks.ThrottleError
	if err == nil || sinks.IsPermanent(err) || errors.As(err, &te) {
		t.Fatalf("err = %v, want a plain retryable error", err)
	}
}

func TestPushTenantFromWorkspace(t *testing.T) {
	f := newFakeLoki()
	srv := httptest.NewServer(f)
	defer srv.Close()
	s := newTestSink(t, srv.URL, func(c *Config) {
		c.Tenant = TenantConfig{FromWorkspace: true, Default: "platform"}
	})
	now := time.Now()
	a := pullFailure("sb-a", 1, now)
	b := pullFailure("sb-b", 2, now)
	b.Sandbox.Workspace = "team-b"
	evil := pullFailure("sb-c", 3, now)
	evil.Sandbox.Workspace = "team-b\nX-Scope-OrgID: admin"
	batch := records(a, scheduled(4, now), b, evil, pullFailure("sb-a2", 5, now))
	err := s.Push(context.Background(), batch)
	var pe *sinks.PartialError
	if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[3] == nil {
		t.Fatalf("err = %v, want the invalid workspace (index 3) refused", err)
	}
	if strings.Join(f.tenants, ",") != "repro,platform,team-b" {
		t.Fatalf("tenants %v", f.tenants)
	}
	perTenant := map[string]int{}
	for k := range f.stored {
		perTenant[strings.SplitN(k, "|", 2)[0]]++
	}
	if perTenant["repro"] != 2 || perTenant["platform"] != 1 || perTenant["team-b"] != 1 {
		t.Fatalf("per tenant %v", perTenant)
	}
}

func TestPushTenantFixed(t *testing.T) {
	f := newFakeLoki()
	srv := httptest.NewServer(f)
	defer srv.Close()
	s := newTestSink(t, srv.URL, func(c *Config) { c.Tenant.Fixed = "eventpipe" })
	if err := s.Push(context.Background(), records(pullFailure("a", 1, time.Now()), scheduled(2, time.Now()))); err != nil {
		t.Fatal(err)
	}
	if strings.Join(f.tenants, ",") != "eventpipe" {
		t.Fatalf("tenants %v", f.tenants)
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPushAuth(t *testing.T) {
	f := newFakeLoki()
	srv := httptest.NewServer(f)
	defer srv.Close()
	dir := t.TempDir()
	tok := writeFile(t, dir, "token", "tok-1\n")
	bearer := newTestSink(t, srv.URL, func(c *Config) { c.Auth.BearerTokenFile = tok })
	ctx := context.Background()
	if err := bearer.Push(ctx, records(scheduled(1, time.Now()))); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "token", "tok-2") // rotated: picked up without a restart
	if err := bearer.Push(ctx, records(scheduled(2, time.Now()))); err != nil {
		t.Fatal(err)
	}
	pw := writeFile(t, dir, "pw", "s3cret\n")
	basic := newTestSink(t, srv.URL, func(c *Config) { c.Auth.Username = "loki"; c.Auth.PasswordFile = pw })
	if err := basic.Push(ctx, records(scheduled(3, time.Now()))); err != nil {
		t.Fatal(err)
	}
	want := []string{"Bearer tok-1", "Bearer tok-2", "Basic bG9raTpzM2NyZXQ="}
	if strings.Join(f.auth, ",") != strings.Join(want, ",") {
		t.Fatalf("authorization %q, want %q", f.auth, want)
	}
	// An emptied token file holds the batch (retryable), it does not drop it.
	writeFile(t, dir, "token", "")
	if err := bearer.Push(ctx, records(scheduled(4, time.Now()))); err == nil || sinks.IsPermanent(err) {
		t.Fatalf("empty token: err = %v, want retryable", err)
	}
	// A missing secret file is a start-up error.
	if _, err := New(func() Config {
		c := NewDefaultConfig()
		c.Auth.BearerTokenFile = filepath.Join(dir, "nope")
		return c
	}(), nil, nil); err == nil {
		t.Fatal("missing token file accepted")
	}
}

// TestPushTLSCustomCA: the CA given in tls.ca_file is what makes the
// handshake succeed; without it the same server is refused.
func TestPushTLSCustomCA(t *testing.T) {
	f := newFakeLoki()
	srv := httptest.NewTLSServer(f)
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	caFile := writeFile(t, t.TempDir(), "ca.pem", string(ca))

	without := newTestSink(t, srv.URL, nil)
	err := without.Push(context.Background(), records(scheduled(1, time.Now())))
	if err == nil || !strings.Contains(err.Error(), "certificate") || sinks.IsPermanent(err) {
		t.Fatalf("without CA: err = %v, want a (retryable) certificate error", err)
	}
	with := newTestSink(t, srv.URL, func(c *Config) { c.TLS.CAFile = caFile })
	if err := with.Push(context.Background(), records(scheduled(1, time.Now()))); err != nil {
		t.Fatalf("with CA: %v", err)
	}
	if len(f.stored) != 1 {
		t.Fatalf("stored %d", len(f.stored))
	}
	// A CA file without a certificate is refused at start-up.
	bad := writeFile(t, t.TempDir(), "bad.pem", "not a pem")
	c := NewDefaultConfig()
	c.TLS.CAFile = bad
	if _, err := New(c, nil, nil); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("bad CA: %v", err)
	}
}

func TestPushRestampsOldAndFuture(t *testing.T) {
	f := newFakeLoki()
	srv := httptest.NewServer(f)
	defer srv.Close()
	now := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	s := newTestSink(t, srv.URL, func(c *Config) { c.MaxAge = time.Hour })
	s.now = func() time.Time { return now }
	recent := pullFailure("sb", 1, now.Add(-59*time.Minute))
	old := pullFailure("sb", 2, now.Add(-26*time.Hour))
	future := pullFailure("sb", 3, now.Add(time.Hour))
	noTime := scheduled(4, now)
	noTime.OccurredAt, noTime.ObservedAt = nil, nil
	// An old Event the agent saw only now (a relist after an outage):
	// stamped with its observation, which every resend repeats.
	relisted := pullFailure("sb", 5, now.Add(-26*time.Hour))
	relisted.ObservedAt = timestamppb.New(now.Add(-2 * time.Minute))
	if err := s.Push(context.Background(), records(recent, old, future, noTime, relisted)); err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Time{}
	for _, st := range f.order {
		for _, e := range st.entries {
			var l struct {
				EventID    string `json:"event_id"`
				OccurredAt string `json:"occurred_at"`
			}
			if err := json.Unmarshal([]byte(e.line), &l); err != nil {
				t.Fatal(err)
			}
			got[l.EventID] = time.Unix(e.sec, e.nanos).UTC()
			if l.EventID == old.EventId && l.OccurredAt != "2026-11-28T18:00:00Z" {
				t.Fatalf("old occurrence lost its time in the line: %q", l.OccurredAt)
			}
		}
	}
	if !got[recent.EventId].Equal(now.Add(-59*time.Minute)) || !got[old.EventId].Equal(now) || !got[future.EventId].Equal(now) || !got[noTime.EventId].Equal(now) ||
		!got[relisted.EventId].Equal(now.Add(-2*time.Minute)) {
		t.Fatalf("timestamps %v", got)
	}
	if v := counterValue(t, s.m.restamped); v != 4 {
		t.Fatalf("restamped metric %v", v)
	}
}

func TestPushRefusesNilOccurrenceOnly(t *testing.T) {
	f := newFakeLoki()
	srv := httptest.NewServer(f)
	defer srv.Close()
	s := newTestSink(t, srv.URL, nil)
	batch := records(scheduled(1, time.Now()))
	batch = append(batch, sinks.Record{Offset: 2})
	err := s.Push(context.Background(), batch)
	var pe *sinks.PartialError
	if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[1] == nil || len(f.stored) != 1 {
		t.Fatalf("err = %v stored %d", err, len(f.stored))
	}
}

// TestPushEarlyAnswer: a server that answers before reading a large body
// gets a retryable error, and Push does not stall waiting for the transport
// to release the (pooled) body buffer.
func TestPushEarlyAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable) // body left unread
	}))
	defer srv.Close()
	s := newTestSink(t, srv.URL, nil)
	var occs []*eventpipev1.Occurrence
	for i := 0; i < 20; i++ {
		o := scheduled(i, time.Now())
		o.Message = strings.Repeat(fmt.Sprintf("%x", i*7919), 20_000) // poorly compressible enough
		occs = append(occs, o)
	}
	start := time.Now()
	for i := 0; i < 5; i++ {
		err := s.Push(context.Background(), records(occs...))
		if err == nil || sinks.IsPermanent(err) {
			t.Fatalf("push %d: err = %v, want retryable", i, err)
		}
	}
	// A wait for the body with no bound lasts until the request's timeout
	// (5 s here) ends the transport's write: 25 s for five pushes. The
	// bound is loose so that a loaded machine (one run took over 4 s at
	// load 28) does not fail it; the bounded wait costs at most 1 s a push.
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("5 pushes took %s: the body buffer wait stalled", d)
	}
}
