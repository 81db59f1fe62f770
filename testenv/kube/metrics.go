package kube

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// RequestFilter selects apiserver_request_total series. Empty fields match
// anything; Verb matches case-insensitively (the metric uses LIST, WATCH,
// GET, POST, PUT, PATCH, DELETE, ...).
type RequestFilter struct {
	Group       string // "" also matches the core group, which the metric labels ""
	Version     string
	Resource    string
	Subresource string
	Verb        string
	Code        string
}

// RequestCount is one apiserver_request_total series.
type RequestCount struct {
	Group, Version, Resource, Subresource, Verb, Scope, Code string
	Count                                                    float64
}

// APIRequests reads apiserver_request_total from kube-apiserver's /metrics
// (with the admin token) and returns the series f selects. The counter
// counts requests of every client and restarts at 0 with the apiserver, so
// tests compare two readings taken around the code they measure.
func (c *Cluster) APIRequests(ctx context.Context, f RequestFilter) ([]RequestCount, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.apiserverURL+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("build metrics request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.adminToken)
	resp, err := c.httpClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read kube-apiserver metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("read kube-apiserver metrics: status %d: %s", resp.StatusCode, b)
	}
	return parseRequestTotal(resp.Body, f)
}

// APIRequestCount is the sum of the series APIRequests returns.
func (c *Cluster) APIRequestCount(ctx context.Context, f RequestFilter) (float64, error) {
	series, err := c.APIRequests(ctx, f)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, s := range series {
		sum += s.Count
	}
	return sum, nil
}

const requestTotal = "apiserver_request_total{"

func parseRequestTotal(r io.Reader, f RequestFilter) ([]RequestCount, error) {
	var out []RequestCount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, requestTotal) {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			return nil, fmt.Errorf("parse metrics: malformed line %q", line)
		}
		labels, err := parseLabels(line[len(requestTotal):end])
		if err != nil {
			return nil, fmt.Errorf("parse metrics line %q: %w", line, err)
		}
		val, err := strconv.ParseFloat(strings.Fields(line[end+1:])[0], 64)
		if err != nil {
			return nil, fmt.Errorf("parse metrics value in %q: %w", line, err)
		}
		rc := RequestCount{Group: labels["group"], Version: labels["version"], Resource: labels["resource"],
			Subresource: labels["subresource"], Verb: labels["verb"], Scope: labels["scope"], Code: labels["code"], Count: val}
		if f.matches(rc) {
			out = append(out, rc)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

func (f RequestFilter) matches(rc RequestCount) bool {
	return (f.Group == "" || f.Group == rc.Group) &&
		(f.Version == "" || f.Version == rc.Version) &&
		(f.Resource == "" || f.Resource == rc.Resource) &&
		(f.Subresource == "" || f.Subresource == rc.Subresource) &&
		(f.Verb == "" || strings.EqualFold(f.Verb, rc.Verb)) &&
		(f.Code == "" || f.Code == rc.Code)
}

// parseLabels parses `a="x",b="y"` (Prometheus text format escapes \\ \" \n).
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for len(s) > 0 {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return nil, fmt.Errorf("malformed labels %q", s)
		}
		name := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return nil, fmt.Errorf("unterminated label value in %q", s)
		}
		out[name] = val.String()
		s = strings.TrimPrefix(s[i+1:], ",")
	}
	return out, nil
}

// MetricSum reads kube-apiserver's /metrics and sums the samples of the
// series name (a counter, a gauge, or a histogram's _count / _sum) whose
// labels include every pair in labels. found is false when no series of
// that name exists (the metric is unknown to this apiserver version), so a
// test can tell "zero" from "not measured".
func (c *Cluster) MetricSum(ctx context.Context, name string, labels map[string]string) (sum float64, found bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.apiserverURL+"/metrics", nil)
	if err != nil {
		return 0, false, fmt.Errorf("build metrics request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.adminToken)
	resp, err := c.httpClient.Do(req)
	if err != nil {
		return 0, false, fmt.Errorf("read kube-apiserver metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return 0, false, fmt.Errorf("read kube-apiserver metrics: status %d: %s", resp.StatusCode, b)
	}
	return sumSeries(resp.Body, name, labels)
}

func sumSeries(r io.Reader, name string, want map[string]string) (sum float64, found bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || len(line) == len(name) {
			continue
		}
		var labels map[string]string
		rest := line[len(name):]
		switch rest[0] {
		case ' ':
		case '{':
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				return 0, false, fmt.Errorf("parse metrics: malformed line %q", line)
			}
			if labels, err = parseLabels(rest[1:end]); err != nil {
				return 0, false, fmt.Errorf("parse metrics line %q: %w", line, err)
			}
			rest = rest[end+1:]
		default:
			continue // another metric sharing the prefix
		}
		found = true
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return 0, false, fmt.Errorf("parse metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("parse metrics value in %q: %w", line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		return 0, false, fmt.Errorf("read metrics: %w", err)
	}
	return sum, found, nil
}
