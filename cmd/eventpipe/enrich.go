//go:build !agentonly

package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/eventpipe/eventpipe/api/cliflag"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich"
)

// demoScenario reproduces both seeds of issue #5028 in managed workspace
// mode: img-missing (workload image not found) and sup-bad (supervisor image
// bad tag; workload pod Running 1/1, supervisor pod in ImagePullBackOff).
//
//go:embed testdata/demo.json
var demoScenario []byte

func init() {
	register("enrich", command{
		summary: "attribute and diagnose Kubernetes Events read as JSON from stdin",
		run:     runEnrich,
	})
}

func runEnrich(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cfg := enrich.NewDefaultConfig()
	fs := flag.NewFlagSet("enrich", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: eventpipe enrich [flags] < objects.json

Reads a kubectl List (kubectl get events,pods,pvc,namespaces,sandboxes -A -o json)
or a stream of JSON objects from stdin: core/v1 and events.k8s.io/v1 Events, Pods,
PersistentVolumeClaims, Namespaces and agents.x-k8s.io Sandboxes (v1beta1, v1alpha1).
Prints one JSON line per Event occurrence, in time order, or with -o text one
line per sandbox saying what blocks it. Other objects are ignored.

Flags:
`)
		fs.PrintDefaults()
	}
	output := "json"
	demo := false
	fs.StringVar(&cfg.Cluster, "cluster", cfg.Cluster, "cluster name stamped on every occurrence")
	fs.IntVar(&cfg.MaxMessageBytes, "max-message-bytes", cfg.MaxMessageBytes, "truncate messages longer than this (bytes)")
	fs.IntVar(&cfg.PersistentAfter, "persistent-after", cfg.PersistentAfter, "failures before a pull failure is persistent")
	fs.DurationVar(&cfg.PersistentWindow, "persistent-window", cfg.PersistentWindow, "failures further apart than this start a new count")
	fs.StringVar(&output, "output", output, "output format: json or text (table is another name of text)")
	fs.StringVar(&output, "o", output, "shorthand for --output")
	fs.BoolVar(&demo, "demo", false, "read the bundled seed scenario instead of stdin")
	if exit, ok := parseFlags(fs, "enrich", args, stderr); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "eventpipe enrich: unexpected arguments %q\n", fs.Args())
		return 2
	}
	output = cliflag.Output(output)
	if output != "json" && output != "text" {
		fmt.Fprintf(stderr, "eventpipe enrich: --output must be json or text, got %q\n", output)
		return 2
	}
	in := stdin
	source := "stdin"
	if demo {
		in, source = bytes.NewReader(demoScenario), "demo scenario"
	}
	snap, err := decodeInput(in)
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe enrich: malformed input on %s: %v\n", source, err)
		return 2
	}
	e, err := enrich.New(cfg, snap.lookups())
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe enrich: %v\n", err)
		return 2
	}
	occs := enrichSnapshot(e, snap)
	if output == "text" {
		err = writeTable(stdout, occs)
	} else {
		err = writeJSONLines(stdout, occs)
	}
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe enrich: write output: %v\n", err)
		return 1
	}
	return 0
}

// enrichSnapshot enriches every Event in time order (so the pull tracker
// sees failures as they happened), then diagnoses every pod's current
// waiting states and every Sandbox's refusal in its Ready condition as of
// the snapshot time, the latest time in the input.
func enrichSnapshot(e *enrich.Enricher, s *snapshot) []*eventpipev1.Occurrence {
	var asOf time.Time
	for _, ev := range s.events {
		if t := enrich.OccurrenceTime(ev, time.Time{}); t.After(asOf) {
			asOf = t
		}
	}
	if asOf.IsZero() {
		asOf = time.Now().UTC()
	}
	events := append([]*enrich.Event(nil), s.events...)
	sort.SliceStable(events, func(i, j int) bool {
		return enrich.OccurrenceTime(events[i], asOf).Before(enrich.OccurrenceTime(events[j], asOf))
	})
	out := make([]*eventpipev1.Occurrence, 0, len(events))
	for _, ev := range events {
		out = append(out, e.Enrich(ev, asOf).Occurrence)
	}
	podKeys := make([]string, 0, len(s.pods))
	for k := range s.pods {
		podKeys = append(podKeys, k)
	}
	sort.Strings(podKeys)
	for _, k := range podKeys {
		out = append(out, e.DiagnosePod(s.pods[k], asOf)...)
	}
	// A refused pod is said only in the Sandbox's Ready condition.
	crKeys := make([]string, 0, len(s.sandboxes))
	for k, cr := range s.sandboxes {
		if _, refused := enrich.SandboxRefusal(cr); refused {
			crKeys = append(crKeys, k)
		}
	}
	sort.Strings(crKeys)
	for _, k := range crKeys {
		if o := e.DiagnoseSandbox(s.sandboxes[k], asOf); o != nil {
			out = append(out, o)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		return out[i].GetOccurredAt().AsTime().Before(out[j].GetOccurredAt().AsTime())
	})
	return out
}

var jsonOptions = protojson.MarshalOptions{UseProtoNames: true}

// writeJSONLines prints one compact JSON object per occurrence. protojson
// randomises whitespace on purpose; compacting makes the output stable.
func writeJSONLines(w io.Writer, occs []*eventpipev1.Occurrence) error {
	var buf bytes.Buffer
	for _, o := range occs {
		b, err := jsonOptions.Marshal(o)
		if err != nil {
			return fmt.Errorf("encode occurrence %s: %w", o.GetEventId(), err)
		}
		buf.Reset()
		if err := json.Compact(&buf, b); err != nil {
			return fmt.Errorf("compact occurrence %s: %w", o.GetEventId(), err)
		}
		buf.WriteByte('\n')
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
	}
	return nil
}

// sandboxSummary is what the table says about one sandbox.
type sandboxSummary struct {
	key, name, workspace string
	// Per pod/container, the latest pull failure, or nil once a later
	// Pulled/Started/pull-free status says it got its image.
	blockers   map[string]*eventpipev1.Occurrence
	order      []string
	progress   *eventpipev1.Progress
	lastReason string
	events     int
}

func writeTable(w io.Writer, occs []*eventpipev1.Occurrence) error {
	byKey := map[string]*sandboxSummary{}
	var keys []string
	unattributed := 0
	for _, o := range occs {
		sb := o.GetSandbox()
		if sb == nil {
			unattributed++
			continue
		}
		key := sb.GetId()
		if key == "" {
			key = sb.GetCrNamespace() + "/" + sb.GetCrName()
		}
		s := byKey[key]
		if s == nil {
			s = &sandboxSummary{key: key, blockers: map[string]*eventpipev1.Occurrence{}}
			byKey[key] = s
			keys = append(keys, key)
		}
		s.events++
		if sb.GetName() != "" {
			s.name = sb.GetName()
		}
		if sb.GetWorkspace() != "" {
			s.workspace = sb.GetWorkspace()
		}
		s.lastReason = o.GetReason()
		if p := o.GetProgress(); p != nil {
			s.progress = p
		}
		ck := o.GetInvolvedObject().GetName() + "/" + o.GetContainer()
		switch {
		case o.GetPullFailure() != nil:
			if _, seen := s.blockers[ck]; !seen {
				s.order = append(s.order, ck)
			}
			s.blockers[ck] = o
		case o.GetContainer() != "" && (o.GetReason() == "Pulled" || o.GetReason() == "Started" || o.GetReason() == "Created"):
			if _, seen := s.blockers[ck]; seen {
				s.blockers[ck] = nil
			}
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := byKey[keys[i]], byKey[keys[j]]
		if a.workspace != b.workspace {
			return a.workspace < b.workspace
		}
		return a.name < b.name
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tWORKSPACE\tSTATE\tDIAGNOSIS")
	for _, k := range keys {
		s := byKey[k]
		state, diag := s.verdict()
		name := s.name
		if name == "" {
			name = s.key
		}
		fmt.Fprintf(tw, "%s\tworkspace=%s\t%s\t%s\n", oneLine(name), oneLine(s.workspace), state, oneLine(diag))
	}
	if unattributed > 0 {
		fmt.Fprintf(tw, "(no sandbox)\t-\t-\t%d events not attributed to any sandbox\n", unattributed)
	}
	return tw.Flush()
}

func (s *sandboxSummary) verdict() (state, diag string) {
	var parts []string
	for _, ck := range s.order {
		o := s.blockers[ck]
		if o == nil {
			continue
		}
		pf := o.GetPullFailure()
		what := "image"
		if r := o.GetImageRole(); r != "" && r != eventpipev1.ImageRoleUnknown {
			what = r + " image"
		}
		img := pf.GetImage()
		if img == "" {
			img = o.GetImage()
		}
		p := fmt.Sprintf("%s %s: %s (%s, %d failures)", what, img, pf.GetCategory(), pf.GetDisposition(), pf.GetAttempts())
		if c := pf.GetConfidence(); c != "" && c != eventpipev1.ConfidenceCertain {
			p = fmt.Sprintf("%s %s: %s, %s (%s, %d failures)", what, img, pf.GetCategory(), c, pf.GetDisposition(), pf.GetAttempts())
		}
		if d := pf.GetDetail(); d != "" && (pf.GetCategory() == eventpipev1.CategoryUnknown || pf.GetCategory() == eventpipev1.CategoryUnrecognised) {
			p += ": " + d
		}
		parts = append(parts, p)
	}
	if len(parts) > 0 {
		return "BLOCKED", strings.Join(parts, "; ")
	}
	if p := s.progress; p != nil {
		switch {
		case p.GetCompleteStep() == eventpipev1.StepStartingSandbox:
			return "STARTED", "workload container started"
		case p.GetActiveStep() == eventpipev1.StepStartingSandbox:
			return "STARTING", "workload image pulled"
		case p.GetActiveStep() == eventpipev1.StepPullingImage:
			if p.GetActiveDetail() != "" {
				return "PULLING", "pulling " + p.GetActiveDetail()
			}
			return "PULLING", "scheduled, pulling images"
		}
	}
	return "OK", fmt.Sprintf("%d events, last %s", s.events, s.lastReason)
}

// oneLine keeps a table cell on one line.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == '\t' {
			return ' '
		}
		return r
	}, s)
}

// newDemoEnricher is an Enricher with default config over a snapshot.
func newDemoEnricher(s *snapshot) (*enrich.Enricher, error) {
	return enrich.New(enrich.NewDefaultConfig(), s.lookups())
}
