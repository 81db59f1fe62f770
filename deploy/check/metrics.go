package check

import (
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Family is one metric family eventpipe exports.
type Family struct {
	Name   string
	Type   string          // counter, gauge, histogram, summary, untyped, or "" when only described
	Labels map[string]bool // variable and constant label names
}

// Catalogue is the set of metric families the eventpipe binaries export,
// built from two sources: the descriptors of every collector the agent, the
// collector and the sinks register (Recorder: a vector with no series yet is
// still known, with its label names), and a scrape of the real binary's
// /metrics (AddScrape: the Go runtime and process metrics it serves).
type Catalogue struct {
	mu       sync.Mutex
	families map[string]*Family
}

// NewCatalogue returns an empty catalogue.
func NewCatalogue() *Catalogue { return &Catalogue{families: map[string]*Family{}} }

func (c *Catalogue) add(name, typ string, labels []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.families[name]
	if f == nil {
		f = &Family{Name: name, Labels: map[string]bool{}}
		c.families[name] = f
	}
	if typ != "" {
		f.Type = typ
	}
	for _, l := range labels {
		f.Labels[l] = true
	}
}

// Names returns every family name, sorted.
func (c *Catalogue) Names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.families))
	for n := range c.families {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Lookup resolves a series name as Prometheus exposes it: a family name, or
// a histogram's or summary's _bucket/_sum/_count series.
func (c *Catalogue) Lookup(series string) (*Family, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.families[series]; ok {
		return f, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(series, suf)
		if !ok {
			continue
		}
		if f, ok := c.families[base]; ok && (f.Type == "histogram" || (f.Type == "summary" && suf != "_bucket")) {
			return f, true
		}
	}
	return nil, false
}

// Recorder is a prometheus.Registerer that registers into a real registry
// and records every descriptor it is given into a Catalogue.
type Recorder struct {
	*prometheus.Registry
	cat *Catalogue
}

// NewRecorder returns a Recorder over a new registry.
func NewRecorder(cat *Catalogue) *Recorder {
	return &Recorder{Registry: prometheus.NewRegistry(), cat: cat}
}

var (
	descName   = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)
	descConst  = regexp.MustCompile(`constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}\}$`)
	constLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)=`)
)

// Register records c's descriptors, then registers it.
func (r *Recorder) Register(c prometheus.Collector) error {
	typ := ""
	switch c.(type) {
	case prometheus.Histogram, *prometheus.HistogramVec:
		typ = "histogram"
	case prometheus.Summary, *prometheus.SummaryVec:
		typ = "summary"
	case prometheus.Counter, *prometheus.CounterVec, prometheus.CounterFunc:
		typ = "counter"
	case prometheus.Gauge, *prometheus.GaugeVec, prometheus.GaugeFunc:
		typ = "gauge"
	}
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	var errs []string
	for d := range ch {
		s := d.String()
		m := descName.FindStringSubmatch(s)
		if m == nil {
			errs = append(errs, s)
			continue
		}
		var labels []string
		if lm := descConst.FindStringSubmatch(s); lm != nil {
			for _, cl := range constLabel.FindAllStringSubmatch(lm[1], -1) {
				labels = append(labels, cl[1])
			}
			for _, vl := range strings.Split(lm[2], ",") {
				vl = strings.TrimSuffix(strings.TrimPrefix(vl, "c("), ")")
				if vl != "" {
					labels = append(labels, vl)
				}
			}
		}
		r.cat.add(m[1], typ, labels)
	}
	if len(errs) > 0 {
		return fmt.Errorf("unparsable descriptors: %v", errs)
	}
	return r.Registry.Register(c)
}

// MustRegister registers each collector and panics on the first error.
func (r *Recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// AddGathered adds what a gatherer currently holds (names, types, labels).
func (c *Catalogue) AddGathered(g prometheus.Gatherer) error {
	mfs, err := g.Gather()
	if err != nil {
		return err
	}
	for _, mf := range mfs {
		c.addFamily(mf)
	}
	return nil
}

// AddScrape adds the families of a Prometheus text exposition (/metrics).
func (c *Catalogue) AddScrape(r io.Reader) (int, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return 0, fmt.Errorf("parse /metrics: %w", err)
	}
	for _, mf := range mfs {
		c.addFamily(mf)
	}
	return len(mfs), nil
}

func (c *Catalogue) addFamily(mf *dto.MetricFamily) {
	var labels []string
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			labels = append(labels, lp.GetName())
		}
	}
	c.add(mf.GetName(), strings.ToLower(mf.GetType().String()), labels)
}
