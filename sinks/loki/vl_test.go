package loki

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/file"
	"github.com/eventpipe/eventpipe/sinks/internal/jsonenc"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
	"github.com/eventpipe/eventpipe/testenv/victorialogs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newVLSink is a sink pushing to a real VictoriaLogs; the extra query
// parameter keeps the JSON line intact as _msg.
func newVLSink(t testing.TB, vl *victorialogs.Server, mut func(*Config)) *Sink {
	t.Helper()
	cfg := NewDefaultConfig()
	cfg.URL = vl.PushURL()
	cfg.QueryParams = map[string]string{"disable_message_parsing": "1"}
	if mut != nil {
		mut(&cfg)
	}
	s, err := New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func pushAll(t *testing.T, s *Sink, occs []*eventpipev1.Occurrence, batch int) {
	t.Helper()
	for i := 0; i < len(occs); i += batch {
		end := min(i+batch, len(occs))
		if err := s.Push(context.Background(), records(occs[i:end]...)); err != nil {
			t.Fatalf("push [%d:%d]: %v", i, end, err)
		}
	}
}

// streamLabels parses VictoriaLogs' _stream ({a="x",b="y"}) with the strict
// selector parser.
func streamLabels(t *testing.T, row map[string]any) map[string]string {
	t.Helper()
	s, _ := row["_stream"].(string)
	return parseSelector(t, strings.ReplaceAll(s, `",`, `", `))
}

// TestVictoriaLogsFindOneSandbox: occurrences pushed (protobuf+snappy and
// JSON) are found again by querying one sandbox id, with the exact line,
// the metadata and the bounded label set.
func TestVictoriaLogsFindOneSandbox(t *testing.T) {
	for _, enc := range []string{EncodingProtobuf, EncodingJSON} {
		t.Run(enc, func(t *testing.T) {
			vl := victorialogs.Start(t)
			s := newVLSink(t, vl, func(c *Config) { c.Encoding = enc })
			gen := sinktest.NewGenerator(7, "find-"+enc+"-")
			occs := gen.Batch(400)
			pushAll(t, s, occs, 100)

			want := map[string]*eventpipev1.Occurrence{}
			for _, o := range occs {
				if o.GetSandbox().GetId() == sinktest.SeedSandboxID {
					want[o.GetEventId()] = o
				}
			}
			if len(want) < 10 {
				t.Fatalf("generator gave only %d occurrences of the seed sandbox", len(want))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			q := fmt.Sprintf(`{job="eventpipe"} sandbox_id:=%q`, sinktest.SeedSandboxID)
			rows, err := vl.WaitFor(ctx, q, len(want))
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != len(want) {
				t.Fatalf("%d rows for the sandbox, want %d", len(rows), len(want))
			}
			for _, r := range rows {
				o := want[r["event_id"].(string)]
				if o == nil {
					t.Fatalf("unexpected row %v", r)
				}
				if line := string(appendLine(nil, o, DefaultMaxMessageBytes)); r["_msg"] != line {
					t.Fatalf("line changed on the way:\n got %v\nwant %s", r["_msg"], line)
				}
				if r["sandbox_name"] != o.GetSandbox().GetName() || r["reason"] != o.GetReason() ||
					r["occurred_at"] != string(jsonenc.AppendTime(nil, o.GetOccurredAt().AsTime())) {
					t.Fatalf("metadata of %s: %v", o.GetEventId(), r)
				}
				if pf := o.GetPullFailure(); pf != nil && r["pull_category"] != pf.GetCategory() {
					t.Fatalf("pull_category %v, want %s", r["pull_category"], pf.GetCategory())
				}
				labels := streamLabels(t, r)
				names := slices.Sorted(mapsKeys(labels))
				for _, n := range names {
					if !slices.Contains([]string{"job", "cluster", "namespace", "workspace", "type", "source"}, n) {
						t.Fatalf("unexpected label %q in %v", n, labels)
					}
				}
				if labels["workspace"] != sinktest.SeedWorkspace || labels["job"] != "eventpipe" {
					t.Fatalf("labels %v", labels)
				}
			}
		})
	}
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestVictoriaLogsBadInput: a 1 MiB message, invalid UTF-8 and label-like
// text in every field are delivered, never crash, and never change the
// label set.
func TestVictoriaLogsBadInput(t *testing.T) {
	vl := victorialogs.Start(t)
	s := newVLSink(t, vl, func(c *Config) {
		c.Labels.Fields = LabelFields // every allowed field, all hostile
		c.Tenant = TenantConfig{}
	})
	occs := append(sinktest.Hostile("hostile-"), hostile(pullFailure("sb", 1, time.Now())))
	if err := s.Push(context.Background(), records(occs...)); err != nil {
		t.Fatalf("push: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := vl.WaitFor(ctx, `{job="eventpipe"}`, len(occs))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(occs) {
		t.Fatalf("%d rows, want %d", len(rows), len(occs))
	}
	allowed := append([]string{"job"}, LabelFields...)
	for _, r := range rows {
		labels := streamLabels(t, r)
		if labels["job"] != "eventpipe" {
			t.Fatalf("job label changed: %v", labels)
		}
		for n, v := range labels {
			if !slices.Contains(allowed, n) {
				t.Fatalf("injected label %q=%q in %v", n, v, r["_stream"])
			}
			if strings.ContainsAny(v, "\n\r") || len(v) > DefaultMaxValueBytes {
				t.Fatalf("label %s=%q not sanitised", n, v)
			}
		}
		var line map[string]any
		if err := json.Unmarshal([]byte(r["_msg"].(string)), &line); err != nil {
			t.Fatalf("line is not JSON: %v", err)
		}
		if r["event_id"] == "hostile-big-message" {
			if line["message_truncated"] != true || len(line["message"].(string)) > DefaultMaxMessageBytes {
				t.Fatalf("1 MiB message not truncated: %d bytes", len(line["message"].(string)))
			}
		}
	}
}

// TestVictoriaLogsRestampAndReplay: an occurrence older than max_age gets
// the push time and keeps its own time in the line and metadata; a replay
// of a recent occurrence is an exact duplicate (same time, same line).
func TestVictoriaLogsRestampAndReplay(t *testing.T) {
	vl := victorialogs.Start(t)
	s := newVLSink(t, vl, nil)
	old := pullFailure("sb-old", 1, time.Now().Add(-26*time.Hour).Truncate(time.Second))
	recent := pullFailure("sb-recent", 2, time.Now().Add(-time.Minute))
	before := time.Now()
	if err := s.Push(context.Background(), records(old, recent)); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if err := s.Push(context.Background(), records(recent)); err != nil { // replay
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := vl.WaitFor(ctx, `{job="eventpipe"}`, 3)
	if err != nil {
		t.Fatal(err)
	}
	var recentRows []map[string]any
	for _, r := range rows {
		ts, err := time.Parse(time.RFC3339Nano, r["_time"].(string))
		if err != nil {
			t.Fatal(err)
		}
		switch r["event_id"] {
		case old.EventId:
			if ts.Before(before) || ts.After(after) {
				t.Fatalf("old occurrence stamped %s, want the push time in [%s, %s]", ts, before, after)
			}
			orig := old.OccurredAt.AsTime().Format(time.RFC3339Nano)
			if r["occurred_at"] != orig || !strings.Contains(r["_msg"].(string), `"occurred_at":"`+orig+`"`) {
				t.Fatalf("old occurrence lost its time: %v", r)
			}
		case recent.EventId:
			if !ts.Equal(recent.OccurredAt.AsTime()) {
				t.Fatalf("recent occurrence stamped %s, want %s", ts, recent.OccurredAt.AsTime())
			}
			recentRows = append(recentRows, r)
		}
	}
	if len(recentRows) != 2 || recentRows[0]["_msg"] != recentRows[1]["_msg"] || recentRows[0]["_time"] != recentRows[1]["_time"] {
		t.Fatalf("replay is not an exact duplicate: %v", recentRows)
	}
}

// vlTarget is a sinktest.Target on a real VictoriaLogs.
func vlTarget(t *testing.T) *sinktest.Target {
	vl := victorialogs.Start(t)
	return &sinktest.Target{
		NewPusher: func() (sinks.Pusher, error) {
			cfg := NewDefaultConfig()
			cfg.URL = vl.PushURL()
			cfg.QueryParams = map[string]string{"disable_message_parsing": "1"}
			cfg.Timeout = 2 * time.Second
			return New(cfg, nil, nil)
		},
		Delivered: func(ctx context.Context) ([]string, error) { return deliveredIDs(ctx, vl) },
		Outage: func(t *testing.T) func() {
			vl.Stop()
			return vl.Restart
		},
	}
}

func deliveredIDs(ctx context.Context, vl *victorialogs.Server) ([]string, error) {
	if !vl.Running() {
		return nil, fmt.Errorf("victoria-logs is stopped")
	}
	if err := vl.Flush(ctx); err != nil {
		return nil, err
	}
	rows, err := vl.Query(ctx, `{job="eventpipe"} | fields event_id`)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(rows))
	for _, r := range rows {
		id, _ := r["event_id"].(string)
		ids = append(ids, id)
	}
	return ids, nil
}

// TestContract runs the shared sink contract against a real VictoriaLogs.
func TestContract(t *testing.T) {
	sinktest.RunContract(t, sinktest.Harness{Name: "loki", NewTarget: vlTarget})
}

// TestVictoriaLogsOutageDrill: steady traffic through a runner while the
// server is stopped for a while and restarted: everything arrives.
func TestVictoriaLogsOutageDrill(t *testing.T) {
	vl := victorialogs.Start(t)
	s := newVLSink(t, vl, func(c *Config) { c.Timeout = time.Second })
	log := sinktest.NewMemLog()
	cur, err := log.Cursor("loki")
	if err != nil {
		t.Fatal(err)
	}
	rc := sinks.NewDefaultRunnerConfig("loki")
	rc.Batch.MaxRecords = 200
	rc.Batch.MaxWait = 50 * time.Millisecond
	rc.Retry.Initial = 20 * time.Millisecond
	rc.Retry.Max = 300 * time.Millisecond
	runner, err := sinks.NewRunner(rc, s, log, cur, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A second sink on the same log (the file sink) must keep flowing
	// while Loki is down.
	fcfg := file.NewDefaultConfig()
	fcfg.Path, fcfg.MaxBytes, fcfg.MaxFiles = filepath.Join(t.TempDir(), "events.jsonl"), 1<<30, 1
	fs, err := file.New(fcfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	fcur, err := log.Cursor("file")
	if err != nil {
		t.Fatal(err)
	}
	frc := sinks.NewDefaultRunnerConfig("file")
	frc.Batch.MaxWait = 20 * time.Millisecond
	fileRunner, err := sinks.NewRunner(frc, fs, log, fcur, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	runCtx, stopRunner := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	var runErr, fileErr error
	go func() { defer wg.Done(); runErr = runner.Run(runCtx) }()
	go func() { defer wg.Done(); fileErr = fileRunner.Run(runCtx) }()

	// Steady producer: 50 occurrences every 10 ms for 4 s (~20,000).
	gen := sinktest.NewGenerator(11, "drill-")
	var ids []string
	produce := func(d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			b := gen.Batch(50)
			if err := log.Append(ctx, b); err != nil {
				t.Fatal(err)
			}
			for _, o := range b {
				ids = append(ids, o.GetEventId())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	produce(time.Second)
	vl.Stop()
	stoppedAt := runner.Status().Cursor
	fileAtStop := fileRunner.Status().Cursor
	t.Logf("at stop: head %d, loki %d, file %d", log.LastOffset(), stoppedAt, fileAtStop)
	produce(2 * time.Second) // outage under traffic
	if st := runner.Status(); st.LastError == "" || st.Failed != 0 {
		t.Fatalf("during the outage: last error %q, failed %d", st.LastError, st.Failed)
	}
	duringOutage := runner.Status().Cursor
	headAtRestart := log.LastOffset()
	fileAtRestart := fileRunner.Status().Cursor
	// The file sink moved on with the traffic while Loki's cursor stood
	// still: by at least one default batch, or half of what was appended
	// (without -race on a quiet machine it stays caught up; with -race and
	// fsync on a loaded machine it is slower, but never stalled).
	if moved, appended := fileAtRestart-fileAtStop, headAtRestart-fileAtStop; moved < min(appended/2, sinks.DefaultMaxRecords) {
		t.Fatalf("file sink stalled during the Loki outage: moved %d of %d", moved, appended)
	}
	vl.Restart()
	produce(time.Second)
	last := log.LastOffset()
	for runner.Status().Cursor < last {
		if ctx.Err() != nil {
			t.Fatalf("cursor %d, want %d", runner.Status().Cursor, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for fileRunner.Status().Cursor < last {
		if ctx.Err() != nil {
			t.Fatalf("file cursor %d, want %d", fileRunner.Status().Cursor, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopRunner()
	wg.Wait()
	if runErr != nil || fileErr != nil {
		t.Fatal(runErr, fileErr)
	}
	if st := runner.Status(); st.Failed != 0 || st.Lost != 0 {
		t.Fatalf("status %+v", st)
	}
	// The cursor did not move past what was delivered before the outage
	// (at most the batch in flight when the server stopped).
	if duringOutage > stoppedAt+uint64(rc.Batch.MaxRecords) {
		t.Fatalf("cursor moved from %d to %d while the server was down", stoppedAt, duringOutage)
	}
	got, err := deliveredIDs(ctx, vl)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	var missing []string
	for _, id := range ids {
		if seen[id] == 0 {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d occurrences lost, e.g. %v", len(missing), len(ids), missing[:min(5, len(missing))])
	}
	t.Logf("outage drill: %d occurrences, %d rows (duplicates from retried batches: %d), loki cursor %d -> %d during the outage, file cursor %d -> %d (head %d)",
		len(ids), len(got), len(got)-len(seen), stoppedAt, duringOutage, fileAtStop, fileAtRestart, headAtRestart)
}

// TestVictoriaLogsResendIsByteIdentical: a sink pushes 200 occurrences; a
// restarted sink (a new process, minutes later: the runner resends from
// its last committed cursor, or another replica takes the partition over)
// pushes the last 100 again. Every resent entry is byte-identical to its
// first copy: stream labels, timestamp, line and structured metadata,
// including an old Event observed only recently (stamped with its
// observation, not the push time). Counted with a LogsQL stats query over
// the entries' whole content: 200 distinct entries. VictoriaLogs does not
// de-duplicate (it stores each copy: 300 rows); Loki drops an exact copy
// (README.md, "Resends"). The one entry that cannot be identical is shown
// too: an occurrence whose own time and observation are both out of Loki's
// window is stamped with the push time, so its copy differs in _time only.
func TestVictoriaLogsResendIsByteIdentical(t *testing.T) {
	vl := victorialogs.Start(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	occs := sinktest.NewGenerator(23, "resend-").Batch(200)
	for i, o := range occs {
		at := now.Add(-10*time.Minute + time.Duration(i)*10*time.Millisecond)
		o.OccurredAt, o.ObservedAt = timestamppb.New(at), timestamppb.New(at.Add(35*time.Millisecond))
	}
	relisted, stale := occs[150], occs[199]
	relisted.OccurredAt = timestamppb.New(now.Add(-26 * time.Hour))
	stale.OccurredAt, stale.ObservedAt = timestamppb.New(now.Add(-26*time.Hour)), timestamppb.New(now.Add(-25*time.Hour))

	first := newVLSink(t, vl, nil)
	pushAll(t, first, occs, 50)
	_ = first.Close()
	second := newVLSink(t, vl, nil)
	second.now = func() time.Time { return time.Now().Add(3 * time.Minute) } // the resend comes later
	pushAll(t, second, occs[100:], 50)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rows, err := vl.WaitFor(ctx, `{job="eventpipe"}`, 300)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 300 {
		t.Fatalf("%d rows, want 300 (VictoriaLogs keeps both copies)", len(rows))
	}
	// Rows of one event_id: the two copies of a resent entry must agree in
	// every field VictoriaLogs returns.
	byID := map[string][]map[string]any{}
	for _, r := range rows {
		id, _ := r["event_id"].(string)
		byID[id] = append(byID[id], r)
	}
	for i, o := range occs {
		got := byID[o.GetEventId()]
		want := 1
		if i >= 100 {
			want = 2
		}
		if len(got) != want {
			t.Fatalf("%s: %d rows, want %d", o.GetEventId(), len(got), want)
		}
		if want == 1 {
			continue
		}
		a, b := canonicalRow(t, got[0]), canonicalRow(t, got[1])
		if o == stale {
			if a == b {
				t.Errorf("the push-time stamped entry %s came back identical; it cannot (different push times)", o.GetEventId())
			}
			delete(got[0], "_time")
			delete(got[1], "_time")
			a, b = canonicalRow(t, got[0]), canonicalRow(t, got[1])
		}
		if a != b {
			t.Errorf("resend of %s differs:\n first %s\nresend %s", o.GetEventId(), a, b)
		}
	}
	if ts := byID[relisted.GetEventId()][0]["_time"]; ts != relisted.GetObservedAt().AsTime().Format(time.RFC3339Nano) {
		t.Errorf("relisted occurrence stamped %v, want its observed_at %s", ts, relisted.GetObservedAt().AsTime().Format(time.RFC3339Nano))
	}

	// The same count through LogsQL: entries grouped by their whole
	// content (stream, time, line, metadata).
	stats, err := vl.Query(ctx, `{job="eventpipe"} | stats by (_stream, _time, _msg, event_id, occurred_at, sandbox_id, sandbox_name, reason, pull_category, blocker_cause, container, image) count() as copies`)
	if err != nil {
		t.Fatal(err)
	}
	copies := map[string]int{}
	for _, r := range stats {
		copies[fmt.Sprint(r["copies"])]++
	}
	// 100 pushed once, 99 resent identically (2 copies each), and the
	// push-time stamped one as 2 groups of 1.
	if len(stats) != 201 || copies["1"] != 102 || copies["2"] != 99 {
		t.Errorf("LogsQL: %d distinct entries by content (copies: %v), want 201: 102 single, 99 resent identically", len(stats), copies)
	}
	t.Logf("VictoriaLogs: %d rows, %d distinct by content; copies per entry: %v", len(rows), len(stats), copies)
}

// canonicalRow is a row as sorted JSON, for comparing whole rows.
func canonicalRow(t *testing.T, r map[string]any) string {
	t.Helper()
	b, err := json.Marshal(r) // encoding/json sorts map keys
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
