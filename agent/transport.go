package agent

import (
	"net/http"
	"strings"

	"k8s.io/client-go/rest"
)

// countingTransport counts every request to the Kubernetes API by verb and
// resource, so "one LIST per kind at start, watches after" can be checked
// from the agent's own metrics.
type countingTransport struct {
	next http.RoundTripper
	m    *metrics
}

func (t *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	verb, resource := classifyRequest(r)
	t.m.apiRequests.WithLabelValues(verb, resource).Inc()
	return t.next.RoundTrip(r)
}

// wrapCounting installs the counting transport on a copy of cfg.
func wrapCounting(cfg *rest.Config, m *metrics) *rest.Config {
	c := rest.CopyConfig(cfg)
	prev := c.WrapTransport
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return &countingTransport{next: rt, m: m}
	}
	return c
}

// classifyRequest maps a request to (verb, resource) from the fixed label
// lists: /api/v1/[namespaces/NS/]RESOURCE[/NAME] and
// /apis/GROUP/VERSION/[namespaces/NS/]RESOURCE[/NAME].
func classifyRequest(r *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var rest []string
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		rest = parts[3:]
	default:
		return methodVerb(r.Method, false, false), "discovery"
	}
	if len(rest) == 0 {
		return methodVerb(r.Method, false, false), "discovery"
	}
	// namespaces/NS/RESOURCE... vs namespaces[/NAME]
	if rest[0] == "namespaces" && len(rest) >= 3 {
		rest = rest[2:]
	}
	resource = rest[0]
	named := len(rest) >= 2
	known := false
	for _, k := range apiResources {
		if k == resource {
			known = true
		}
	}
	if !known {
		resource = "other"
	}
	watch := r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1"
	return methodVerb(r.Method, named, watch), resource
}

func methodVerb(method string, named, watch bool) string {
	switch method {
	case http.MethodGet:
		switch {
		case watch:
			return "watch"
		case named:
			return "get"
		default:
			return "list"
		}
	case http.MethodPost:
		return "create"
	case http.MethodPut, http.MethodPatch:
		return "update"
	}
	return "other"
}
