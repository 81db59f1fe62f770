package check

import (
	"fmt"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// TargetLabels are attached by Prometheus (and the chart's
// ServiceMonitor/PodMonitor) to every scraped series, so a selector may use
// them with any metric.
var TargetLabels = map[string]bool{"job": true, "instance": true, "namespace": true, "pod": true, "container": true, "endpoint": true, "service": true}

// External are the series an alert may use that eventpipe does not export,
// each with where it comes from.
var External = map[string]string{
	"up":                                   "Prometheus, one per scrape target",
	"kubelet_volume_stats_available_bytes": "the kubelet (the collector's PersistentVolumeClaim)",
	"kubelet_volume_stats_capacity_bytes":  "the kubelet (the collector's PersistentVolumeClaim)",
}

// grafanaVars are the Grafana variables a dashboard query may use, with the
// value they are replaced by before parsing.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

var promParser = parser.NewParser(parser.Options{})

// CheckQuery parses a PromQL expression (Grafana variables replaced) and
// checks that each series it selects is exported by eventpipe (or External)
// with the labels it matches on. It returns the series names it selects.
func CheckQuery(cat *Catalogue, query string) ([]string, []string) {
	expr, err := promParser.ParseExpr(grafanaVars.Replace(query))
	if err != nil {
		return nil, []string{fmt.Sprintf("does not parse: %v", err)}
	}
	var problems []string
	names := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
		}
		if name == "" {
			problems = append(problems, fmt.Sprintf("selector %s names no metric", vs))
			return nil
		}
		names[name] = true
		if _, ok := External[name]; ok {
			return nil
		}
		fam, ok := cat.Lookup(name)
		if !ok {
			problems = append(problems, fmt.Sprintf("%s is not exported by eventpipe", name))
			return nil
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName || TargetLabels[m.Name] || fam.Labels[m.Name] || (m.Name == "le" && strings.HasSuffix(name, "_bucket")) {
				continue
			}
			problems = append(problems, fmt.Sprintf("%s has no label %q", name, m.Name))
		}
		return nil
	})
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, problems
}
