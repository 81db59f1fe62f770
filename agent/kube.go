package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/eventpipe/eventpipe/agent/internal/kwire"
	"github.com/eventpipe/eventpipe/api/buildinfo"
)

// kubeClient is the agent's whole view of the Kubernetes API: LIST, WATCH
// and GET over plain HTTP, authenticated by client-go's transport (kubeconfig
// or in-cluster credentials, exec plugins, rotated tokens, TLS), with the
// bodies decoded by kwire straight into enrich's small types.
//
// Why not client-go's typed clientset and informers: they decode every object
// into its full typed struct (a Pod is several KB) and informers keep a whole
// first listing before a transform can strip it, which is most of the agent's
// CPU and memory (bench/agent.md). The agent reads four kinds and a handful of
// fields; decoding just those is cheaper by an order of magnitude.
type kubeClient struct {
	http      *http.Client
	base      *url.URL
	userAgent string
	// limiter paces requests (rest.Config QPS/Burst, as client-go's REST
	// client does); nil when QPS is negative (no limit). Watches are
	// long-lived, so this matters for paginated LISTs and retries.
	limiter flowcontrol.RateLimiter
	// maxFrame bounds one watch frame or list body (a corrupt length must
	// not become a huge allocation).
	maxFrame int
}

const (
	acceptProtobuf = "application/vnd.kubernetes.protobuf, application/json"
	acceptJSON     = "application/json"
	// maxListBody bounds one LIST page; a page of 500 Pods is a few MB.
	maxListBody = 512 << 20
	// maxWatchFrame bounds one watch notification (an object is at most
	// ~1.5 MiB in etcd; the envelope adds little).
	maxWatchFrame = 16 << 20
	// maxErrorBody bounds the body read for an error Status.
	maxErrorBody = 1 << 20
)

func newKubeClient(cfg *rest.Config) (*kubeClient, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes http client: %w", err)
	}
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes server url: %w", err)
	}
	ua := cfg.UserAgent
	if ua == "" {
		ua = buildinfo.UserAgent("agent")
	}
	kc := &kubeClient{http: hc, base: base, userAgent: ua, maxFrame: maxWatchFrame}
	if cfg.QPS >= 0 {
		qps, burst := cfg.QPS, cfg.Burst
		if qps == 0 {
			qps = rest.DefaultQPS
		}
		if burst <= 0 {
			burst = rest.DefaultBurst
		}
		kc.limiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	}
	return kc, nil
}

// apiResource names one collection. Built-in kinds are read as protobuf,
// custom resources as JSON (the only encoding CRDs serve).
type apiResource struct {
	group, version, resource string
	json                     bool
	// namespace narrows the path to one namespace ("" all).
	namespace string
}

func (r apiResource) path() string {
	ns := ""
	if r.namespace != "" {
		ns = "/namespaces/" + url.PathEscape(r.namespace)
	}
	if r.group == "" {
		return "/api/" + r.version + ns + "/" + r.resource
	}
	return "/apis/" + r.group + "/" + r.version + ns + "/" + r.resource
}

func (r apiResource) String() string {
	if r.group == "" {
		return r.version + "/" + r.resource
	}
	return r.group + "/" + r.version + "/" + r.resource
}

func (r apiResource) accept() string {
	if r.json {
		return acceptJSON
	}
	return acceptProtobuf
}

// listOptions are the query parameters of a LIST or WATCH.
type listOptions struct {
	resourceVersion      string
	resourceVersionMatch string
	continueToken        string
	limit                int64
	watch                bool
	sendInitialEvents    bool
	allowBookmarks       bool
	timeoutSeconds       int64
	// fieldSelector narrows a LIST or WATCH ("metadata.name=x": one
	// object, which RBAC then authorizes by resourceNames).
	fieldSelector string
}

func (o listOptions) query() url.Values {
	q := url.Values{}
	if o.resourceVersion != "" {
		q.Set("resourceVersion", o.resourceVersion)
	}
	if o.resourceVersionMatch != "" {
		q.Set("resourceVersionMatch", o.resourceVersionMatch)
	}
	if o.continueToken != "" {
		q.Set("continue", o.continueToken)
	}
	if o.limit > 0 {
		q.Set("limit", strconv.FormatInt(o.limit, 10))
	}
	if o.watch {
		q.Set("watch", "true")
	}
	if o.sendInitialEvents {
		q.Set("sendInitialEvents", "true")
	}
	if o.allowBookmarks {
		q.Set("allowWatchBookmarks", "true")
	}
	if o.timeoutSeconds > 0 {
		q.Set("timeoutSeconds", strconv.FormatInt(o.timeoutSeconds, 10))
	}
	if o.fieldSelector != "" {
		q.Set("fieldSelector", o.fieldSelector)
	}
	return q
}

// apiError is a refusal by the API server: its Status, or the HTTP code
// alone when the body was not a Status.
type apiError struct {
	op     string // "list v1/pods", "watch v1/events", ...
	code   int32
	reason string
	msg    string
	causes []kwire.Cause
}

func (e *apiError) Error() string {
	s := fmt.Sprintf("%s: %d", e.op, e.code)
	if e.reason != "" {
		s += " " + e.reason
	}
	if e.msg != "" {
		s += ": " + e.msg
	}
	return s
}

func statusError(op string, st *kwire.Status) *apiError {
	return &apiError{op: op, code: st.Code, reason: st.Reason, msg: st.Message, causes: st.Causes}
}

func asAPIError(err error) (*apiError, bool) {
	var ae *apiError
	ok := errors.As(err, &ae)
	return ae, ok
}

// isExpired: the resourceVersion (or continue token) is too old: relist.
func isExpired(err error) bool {
	ae, ok := asAPIError(err)
	return ok && (ae.code == http.StatusGone || ae.reason == "Expired" || ae.reason == "Gone")
}

func isNotFound(err error) bool {
	ae, ok := asAPIError(err)
	return ok && (ae.code == http.StatusNotFound || ae.reason == "NotFound")
}

func isBadRequest(err error) bool {
	ae, ok := asAPIError(err)
	return ok && (ae.code == http.StatusBadRequest || ae.reason == "BadRequest")
}

func isInvalid(err error) bool {
	ae, ok := asAPIError(err)
	return ok && (ae.code == http.StatusUnprocessableEntity || ae.reason == "Invalid")
}

// isWatchListRefusal: the server does not support sendInitialEvents.
func isWatchListRefusal(err error) bool {
	ae, ok := asAPIError(err)
	if !ok {
		return false
	}
	for _, c := range ae.causes {
		if c.Field == "sendInitialEvents" {
			return true
		}
	}
	return false
}

// do sends a request and returns the response when its status is 2xx; any
// other status becomes an *apiError decoded from the body.
func (c *kubeClient) do(ctx context.Context, op, method, path string, q url.Values, accept string, body []byte) (*http.Response, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = q.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	if c.limiter != nil {
		if err := c.limiter.Wait(ctx); err != nil {
			return nil, fmt.Errorf("%s: client rate limit: %w", op, err)
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	req.Header.Set("Accept", accept)
	req.Header.Set("User-Agent", c.userAgent)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return nil, responseError(op, resp, b)
}

// responseError decodes the Status of a refused request; a body that is not
// a Status still yields the HTTP code.
func responseError(op string, resp *http.Response, b []byte) error {
	var st *kwire.Status
	var derr error
	if isProtobuf(resp.Header.Get("Content-Type")) {
		var kind string
		var raw []byte
		if _, kind, raw, derr = kwire.Unwrap(b); derr == nil && kind == "Status" {
			st, derr = kwire.DecodeStatus(raw)
		}
	} else {
		st, derr = kwire.DecodeStatusJSON(b)
	}
	if derr == nil && st != nil && st.Code != 0 {
		return statusError(op, st)
	}
	msg := strings.TrimSpace(string(b))
	if len(msg) > 256 {
		msg = msg[:256] + "..."
	}
	return &apiError{op: op, code: int32(resp.StatusCode), reason: http.StatusText(resp.StatusCode), msg: msg}
}

func isProtobuf(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/vnd.kubernetes.protobuf"
}

// list reads one page of res and calls item for each object's raw bytes
// (the kind's protobuf message, or its JSON object), valid only during the
// call. buf is reused for the body when it is large enough.
func (c *kubeClient) list(ctx context.Context, res apiResource, opts listOptions, buf *bytes.Buffer, item func(raw []byte) error) (kwire.ListMeta, error) {
	op := "list " + res.String()
	opts.watch = false
	resp, err := c.do(ctx, op, http.MethodGet, res.path(), opts.query(), res.accept(), nil)
	if err != nil {
		return kwire.ListMeta{}, err
	}
	defer resp.Body.Close()
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, maxListBody+1)); err != nil {
		return kwire.ListMeta{}, fmt.Errorf("%s: read body: %w", op, err)
	}
	if buf.Len() > maxListBody {
		return kwire.ListMeta{}, fmt.Errorf("%s: body larger than %d bytes: lower watch.list_page_size", op, maxListBody)
	}
	var lm kwire.ListMeta
	if isProtobuf(resp.Header.Get("Content-Type")) {
		_, _, raw, err := kwire.Unwrap(buf.Bytes())
		if err != nil {
			return kwire.ListMeta{}, fmt.Errorf("%s: %w", op, err)
		}
		lm, err = kwire.ListItems(raw, item)
		if err != nil {
			return kwire.ListMeta{}, fmt.Errorf("%s: %w", op, err)
		}
	} else {
		lm, err = kwire.ListItemsJSON(buf.Bytes(), item)
		if err != nil {
			return kwire.ListMeta{}, fmt.Errorf("%s: %w", op, err)
		}
	}
	return lm, nil
}

// getJSON reads a small JSON document (discovery, a Lease).
func (c *kubeClient) getJSON(ctx context.Context, path string) ([]byte, error) {
	op := "get " + path
	resp, err := c.do(ctx, op, http.MethodGet, path, nil, acceptJSON, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody*8))
	if err != nil {
		return nil, fmt.Errorf("%s: read body: %w", op, err)
	}
	return b, nil
}

// watchStream reads the notifications of one watch.
type watchStream struct {
	op    string
	body  io.ReadCloser
	pb    bool
	br    *bufio.Reader
	frame []byte
	dec   *json.Decoder
	raw   json.RawMessage
	max   int
}

// Watch notification types.
const (
	watchAdded    = "ADDED"
	watchModified = "MODIFIED"
	watchDeleted  = "DELETED"
	watchBookmark = "BOOKMARK"
	watchError    = "ERROR"
)

// watch opens a watch on res; the caller must close the stream.
func (c *kubeClient) watch(ctx context.Context, res apiResource, opts listOptions) (*watchStream, error) {
	op := "watch " + res.String()
	opts.watch = true
	resp, err := c.do(ctx, op, http.MethodGet, res.path(), opts.query(), res.accept(), nil)
	if err != nil {
		return nil, err
	}
	s := &watchStream{op: op, body: resp.Body, max: c.maxFrame}
	if isProtobuf(resp.Header.Get("Content-Type")) {
		s.pb = true
		s.br = bufio.NewReaderSize(resp.Body, 64<<10)
	} else {
		s.dec = json.NewDecoder(resp.Body)
	}
	return s, nil
}

// next returns the next notification: its type and the object's raw bytes
// (protobuf message of the kind, or JSON object), valid until the next call.
// io.EOF means the server ended the watch (its timeout). An ERROR
// notification is returned as an *apiError.
func (s *watchStream) next() (typ string, obj []byte, err error) {
	if s.pb {
		s.frame, err = kwire.ReadFrame(s.br, s.frame, s.max)
		if err != nil {
			return "", nil, s.readErr(err)
		}
		typ, obj, err = kwire.DecodeWatchEvent(s.frame)
	} else {
		s.raw = s.raw[:0]
		if err = s.dec.Decode(&s.raw); err != nil {
			return "", nil, s.readErr(err)
		}
		typ, obj, err = kwire.DecodeWatchEventJSON(s.raw)
	}
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", s.op, err)
	}
	if typ == watchError {
		var st *kwire.Status
		if s.pb {
			st, err = kwire.DecodeStatus(obj)
		} else {
			st, err = kwire.DecodeStatusJSON(obj)
		}
		if err != nil {
			return "", nil, fmt.Errorf("%s: undecodable error notification: %w", s.op, err)
		}
		return "", nil, statusError(s.op, st)
	}
	return typ, obj, nil
}

// buffered reports whether the next notification can be read without
// waiting for the network (for the protobuf stream; JSON always says no).
func (s *watchStream) buffered() bool {
	return s.pb && s.br.Buffered() > 0
}

func (s *watchStream) readErr(err error) error {
	if errors.Is(err, io.EOF) {
		return io.EOF
	}
	return fmt.Errorf("%s: %w", s.op, err)
}

func (s *watchStream) close() { _ = s.body.Close() }

// bookmarkInfo reads a bookmark's resourceVersion and whether it marks the
// end of a watch-list's initial events.
func (s *watchStream) bookmarkInfo(obj []byte) (string, bool, error) {
	if s.pb {
		return kwire.BookmarkInfo(obj)
	}
	return kwire.BookmarkInfoJSON(obj)
}
