package kube

import (
	"strings"
	"testing"
)

func TestParseRequestTotal(t *testing.T) {
	const text = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="events",scope="cluster",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="events.k8s.io",resource="events",scope="namespace",subresource="",verb="WATCH",version="v1"} 2
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PUT",version="v1"} 1.5e+01
apiserver_request_duration_seconds_bucket{le="0.1"} 4
`
	tests := []struct {
		f    RequestFilter
		want float64
		n    int
	}{
		{RequestFilter{}, 20, 3},
		{RequestFilter{Resource: "events"}, 5, 2},
		{RequestFilter{Resource: "events", Verb: "watch"}, 2, 1},
		{RequestFilter{Group: "events.k8s.io"}, 2, 1},
		{RequestFilter{Resource: "pods", Subresource: "status", Code: "201"}, 15, 1},
		{RequestFilter{Resource: "secrets"}, 0, 0},
	}
	for _, tt := range tests {
		got, err := parseRequestTotal(strings.NewReader(text), tt.f)
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, s := range got {
			sum += s.Count
		}
		if sum != tt.want || len(got) != tt.n {
			t.Errorf("%+v: sum %v over %d series, want %v over %d", tt.f, sum, len(got), tt.want, tt.n)
		}
	}
	if _, err := parseRequestTotal(strings.NewReader(`apiserver_request_total{code="200 3`+"\n"), RequestFilter{}); err == nil {
		t.Error("malformed line: no error")
	}
}

func TestParseLabelsEscapes(t *testing.T) {
	got, err := parseLabels(`a="x\"y",b="p\\q",c=""`)
	if err != nil {
		t.Fatal(err)
	}
	if got["a"] != `x"y` || got["b"] != `p\q` || got["c"] != "" {
		t.Errorf("got %q", got)
	}
}

func TestModulePathOf(t *testing.T) {
	if got := modulePathOf([]byte("// c\nmodule github.com/eventpipe/eventpipe\n\ngo 1.26\n")); got != ModulePath {
		t.Errorf("got %q", got)
	}
}

func TestSumSeries(t *testing.T) {
	text := `# HELP apiserver_watch_events_total x
apiserver_watch_events_total{group="",resource="events",version="v1"} 12
apiserver_watch_events_total{group="",resource="pods",version="v1"} 5
apiserver_watch_events_total_extra{resource="events"} 100
apiserver_watch_list_duration_seconds_count{resource="events",scope="cluster"} 2
plain_total 3
`
	for _, tt := range []struct {
		name   string
		labels map[string]string
		sum    float64
		found  bool
	}{
		{"apiserver_watch_events_total", map[string]string{"resource": "events"}, 12, true},
		{"apiserver_watch_events_total", nil, 17, true},
		{"apiserver_watch_events_total", map[string]string{"resource": "leases"}, 0, true},
		{"apiserver_watch_list_duration_seconds_count", map[string]string{"resource": "events"}, 2, true},
		{"plain_total", nil, 3, true},
		{"missing_total", nil, 0, false},
	} {
		sum, found, err := sumSeries(strings.NewReader(text), tt.name, tt.labels)
		if err != nil || sum != tt.sum || found != tt.found {
			t.Errorf("%s %v: %v %v %v, want %v %v", tt.name, tt.labels, sum, found, err, tt.sum, tt.found)
		}
	}
}
