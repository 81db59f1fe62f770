// Command drills is eventpipe's fault-drill suite: each drill runs the real
// `eventpipe collector` binary (built once into a temp dir) as a child
// process with its sinks (file, VictoriaLogs for Loki, kfake for Kafka), an
// agent shipping under load, breaks one thing (a SIGKILL, a damaged
// segment, a sink down, a black-holed network, a full disk), heals it, and
// reports per sink: created, acknowledged, delivered, duplicates (raw, and
// after dedupe by event_id), lost, and the time to recover.
//
//	go run ./bench/drills            # short form (what make test runs via go test)
//	go run ./bench/drills -full -out bench/drills.md
//	go run ./bench/drills -only loki-down,kafka-down
//	go run ./bench/drills -only power-cut -tags plant_ackbeforefsync   # a planted bug: must fail
//
// See bench/drills.md for the results and what each column means.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

func main() {
	full := flag.Bool("full", false, "the long form: 10-minute sink outages, a subscriber 100,000 records behind, a minute black-holed")
	short := flag.Bool("short", false, "the short form (the default)")
	only := flag.String("only", "", "comma-separated drill names to run (default all)")
	out := flag.String("out", "", "write the results as Markdown to this file")
	keep := flag.Bool("keep", false, "keep the work directory (logs, stores) for inspection")
	tags := flag.String("tags", "", "comma-separated build tags for the eventpipe binary: a planted bug (bench/drills.md)")
	flag.Parse()
	if *full && *short {
		fmt.Fprintln(os.Stderr, "drills: -full and -short exclude each other")
		os.Exit(2)
	}
	dir, err := os.MkdirTemp("", "eventpipe-drills-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "drills:", err)
		os.Exit(1)
	}
	if !*keep {
		defer os.RemoveAll(dir)
	}
	opts := Options{Full: *full, Dir: dir, Log: os.Stderr}
	if *only != "" {
		opts.Only = strings.Split(*only, ",")
	}
	if *tags != "" {
		opts.Tags = strings.Split(*tags, ",")
	}
	loadBefore := uptime()
	start := time.Now()
	results, err := Run(context.Background(), opts)
	elapsed := time.Since(start)
	loadAfter := uptime()
	table := Table(results)
	fmt.Println(table)
	fmt.Printf("elapsed %s; load before: %s; after: %s\n", elapsed.Round(time.Second), loadBefore, loadAfter)
	if *keep {
		fmt.Println("work directory kept:", dir)
	}
	if *out != "" {
		if werr := writeMarkdown(*out, opts, results, err, elapsed, loadBefore, loadAfter); werr != nil {
			fmt.Fprintln(os.Stderr, "drills:", werr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "drills:", err)
		os.Exit(1)
	}
	for _, r := range results {
		if !r.OK() {
			os.Exit(1)
		}
	}
}

// Run builds the binary, starts the shared servers and runs the drills in
// order. A drill that cannot run to its end is reported as a row with Err.
func Run(ctx context.Context, opts Options) ([]SinkResult, error) {
	want := map[string]bool{}
	for _, n := range opts.Only {
		found := false
		for _, d := range drills {
			found = found || d.name == n
		}
		if !found {
			return nil, fmt.Errorf("unknown drill %q", n)
		}
		want[n] = true
	}
	e, err := newEnv(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer e.close()
	// Lanes run concurrently in the short form (sequentially in the full
	// form, for clean recovery times): drills that share a server stay in
	// one lane (VictoriaLogs and kfake: lane 0; the control plane: lane 2).
	results := make([][]SinkResult, len(drills))
	lanes := map[int][]int{}
	for i, d := range drills {
		if len(want) > 0 && !want[d.name] {
			continue
		}
		lane := d.lane
		if opts.Full {
			lane = 0
		}
		lanes[lane] = append(lanes[lane], i)
	}
	var wg sync.WaitGroup
	for _, idx := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, i := range idx {
				d := drills[i]
				e.logf("drill %s: %s", d.name, d.what)
				start := time.Now()
				rs, err := d.run(ctx, e)
				if err != nil {
					rs = append(rs, SinkResult{Drill: d.name, Sink: "-", Err: err.Error()})
				}
				for _, r := range rs {
					e.logf("  %s", r.line())
				}
				e.logf("drill %s done in %s", d.name, time.Since(start).Round(time.Millisecond))
				results[i] = rs
			}
		}()
	}
	wg.Wait()
	var out []SinkResult
	for _, rs := range results {
		out = append(out, rs...)
	}
	return out, nil
}

func (r SinkResult) verdict() string {
	switch {
	case r.Sink == "-" && r.Err == "":
		return "not run"
	case r.OK() && r.AtMostOnce:
		return "ok (at most once)"
	case r.OK():
		return "ok"
	}
	return "FAIL"
}

func (r SinkResult) line() string {
	s := fmt.Sprintf("%-17s %-16s created %6d acked %6d delivered %6d raw-dup %5d dup-after-dedupe %d lost %d (counted %d) recover %s: %s",
		r.Drill, r.Sink, r.Created, r.Acked, r.Delivered, r.RawDup, r.DupAfter, r.Lost, r.Explained, r.Recover.Round(10*time.Millisecond), r.verdict())
	if r.Unknown > 0 {
		s += fmt.Sprintf(": %d ids never generated", r.Unknown)
	}
	if r.Err != "" {
		s += ": " + r.Err
	}
	return s
}

// Table renders the results as a Markdown table.
func Table(rs []SinkResult) string {
	var b strings.Builder
	b.WriteString("| drill | sink | created | acked | delivered | raw dup | dup after dedupe | lost | lost counted | recover | verdict | notes |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range rs {
		note := r.Note
		if r.Err != "" {
			note = "**" + r.Err + "** " + note
		}
		note = strings.ReplaceAll(strings.ReplaceAll(note, "|", "/"), "\n", " ")
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %s | %s | %s |\n",
			r.Drill, r.Sink, r.Created, r.Acked, r.Delivered, r.RawDup, r.DupAfter, r.Lost, r.Explained,
			r.Recover.Round(10*time.Millisecond), r.verdict(), note)
	}
	return b.String()
}

func uptime() string {
	out, err := exec.Command("uptime").Output()
	if err != nil {
		return "uptime: " + err.Error()
	}
	return strings.TrimSpace(string(out))
}

// writeMarkdown puts the results between the markers of their form in
// path (<!-- drills:short --> ... <!-- /drills:short -->), appending the
// section when the file lacks it, so the explanations around it stay.
func writeMarkdown(path string, opts Options, rs []SinkResult, runErr error, elapsed time.Duration, before, after string) error {
	form := "short"
	if opts.Full {
		form = "full"
	}
	if len(opts.Only) > 0 { // a partial run gets its own section
		form += ":" + strings.Join(opts.Only, ",")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "<!-- drills:%s -->\n", form)
	fmt.Fprintf(&b, "### %s form, %s\n\n", form, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "Load before: `%s`  \nLoad after: `%s`  \nElapsed: %s (binary build and server start included)\n\n", before, after, elapsed.Round(time.Second))
	if runErr != nil {
		fmt.Fprintf(&b, "**The suite stopped: %v**\n\n", runErr)
	}
	b.WriteString(Table(rs))
	fmt.Fprintf(&b, "<!-- /drills:%s -->\n", form)
	section := b.String()

	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(old)
	open, end := fmt.Sprintf("<!-- drills:%s -->\n", form), fmt.Sprintf("<!-- /drills:%s -->\n", form)
	i, j := strings.Index(doc, open), strings.Index(doc, end)
	if i >= 0 && j > i {
		doc = doc[:i] + section + doc[j+len(end):]
	} else {
		if doc != "" && !strings.HasSuffix(doc, "\n\n") {
			doc += "\n"
		}
		doc += section
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}
