package collector

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// renameWrite replaces path the way editors and kubectl do: write a temp
// file beside it, then rename over.
func renameWrite(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp~"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

const reloadConfig = `
grpc: {listen: "127.0.0.1:0", max_recv_bytes: %d}
http: {listen: "127.0.0.1:0"}
auth: {tokens_file: %q}
store: {dir: %q}
sinks:
  - name: archive
    type: file
    file: {path: %q}
    batch: {max_records: 100, max_wait: 20ms}
    filter: {types: [%s]}
`

// Sink filters and tokens change with the files, without a restart and
// without dropping an open stream; other changes are reported as needing a
// restart; a broken file changes nothing.
func TestHotReload(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.yaml")
	writeFile(t, tokens, []byte(tokensFileYML))
	jsonl := filepath.Join(dir, "events.jsonl")
	cfgPath := filepath.Join(dir, "collector.yaml")
	write := func(maxRecv int, types string) string {
		return fmt.Sprintf(reloadConfig, maxRecv, tokens, filepath.Join(dir, "log"), jsonl, types)
	}
	writeFile(t, cfgPath, []byte(write(1<<20, "Warning")))
	cfg, err := LoadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	r := startCollector(t, cfg, WithConfigPath(cfgPath))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addr := r.c.GRPCAddr()
	agent := dial(t, addr, agentToken)

	// A live follow stream that must survive both reloads.
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	live, err := eventpipev1.NewFollowClient(dial(t, addr, readerWS1)).Follow(lctx, &eventpipev1.FollowRequest{Workspace: "ws1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := live.Header(); err != nil {
		t.Fatal(err)
	}

	warn := occ("w/1", "sb-1", "ws1", "one", "gw")
	warn.Type = "Warning"
	if _, err := ship(t, ctx, agent, batch(1, "prod", "1", occ("n/1", "sb-1", "ws1", "one", "gw"), warn)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Warning in the file sink", func() bool { return readJSONL(t, jsonl)["w/1"] == 1 })
	if readJSONL(t, jsonl)["n/1"] != 0 {
		t.Fatal("filter types: [Warning] let a Normal event through")
	}

	// Filter reload: Normal events now pass.
	renameWrite(t, cfgPath, write(1<<20, "Warning, Normal"))
	eventually(t, "filter reload", func() bool {
		return counterValue(t, r.reg, "eventpipe_collector_config_reloads_total", map[string]string{"result": "applied"}) >= 1
	})
	if _, err := ship(t, ctx, agent, batch(1, "prod", "2", occ("n/2", "sb-1", "ws1", "one", "gw"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Normal event after the reload", func() bool { return readJSONL(t, jsonl)["n/2"] == 1 })

	// Tokens reload: a new agent token works, a removed reader token does not.
	renameWrite(t, tokens, `- {token: agent-token-0123456789, name: agent-a, role: agent}
- {token: new-agent-token-0123456789, name: agent-b, role: agent}
- {token: reader-ws1-0123456789, name: reader-ws1, role: reader, workspaces: [ws1]}
`)
	eventually(t, "the new token", func() bool {
		_, err := eventpipev1.NewIngestClient(dial(t, addr, "new-agent-token-0123456789")).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"})
		return err == nil
	})
	if _, err := follow(t, ctx, dial(t, addr, readerAll), &eventpipev1.FollowRequest{Workspace: "ws1", NoFollow: true}, 0); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("removed token: %v, want Unauthenticated", err)
	}

	// A change that needs a restart is reported, not applied.
	renameWrite(t, cfgPath, write(2<<20, "Warning, Normal"))
	eventually(t, "restart_required", func() bool {
		return counterValue(t, r.reg, "eventpipe_collector_config_reloads_total", map[string]string{"result": "restart_required"}) >= 1
	})
	// A broken file is refused and changes nothing.
	renameWrite(t, cfgPath, "grpc: [not, a, map]\n")
	eventually(t, "refused reload", func() bool {
		return counterValue(t, r.reg, "eventpipe_collector_config_reloads_total", map[string]string{"result": "failed"}) >= 1
	})
	if _, err := eventpipev1.NewIngestClient(agent).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: "prod"}); err != nil {
		t.Fatalf("after a refused reload: %v", err)
	}

	// The live stream saw everything of ws1, in order, across the reloads.
	if _, err := ship(t, ctx, agent, batch(1, "prod", "3", occ("after/1", "sb-1", "ws1", "one", "gw"))); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"n/1", "w/1", "n/2", "after/1"} {
		m, err := live.Recv()
		if err != nil || m.GetOccurrence().GetEventId() != want {
			t.Fatalf("live stream: %v, %v; want %s", m, err, want)
		}
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.Sinks = []SinkConfig{fileSink("archive", filepath.Join(dir, "events.jsonl"))}
	r := startCollector(t, cfg)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + r.c.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d: %s", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := ship(t, ctx, dial(t, r.c.GRPCAddr(), agentToken), batch(1, "prod", "1", occ("h/1", "sb", "ws1", "n", "gw"))); err != nil {
		t.Fatal(err)
	}
	_, body := get("/metrics")
	for _, name := range []string{
		"eventpipe_collector_ingested_occurrences_total 1",
		"eventpipe_collector_deduplicated_occurrences_total",
		"eventpipe_collector_ingest_batches_total 1",
		"eventpipe_collector_ack_latency_seconds_bucket",
		"eventpipe_collector_follow_subscribers 0",
		`eventpipe_collector_auth_failures_total{reason="bad_token"} 0`,
		`eventpipe_sink_sent_records_total{sink="archive"}`,
		`eventpipe_sink_lag_records{sink="archive"}`,
	} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %q", name)
		}
	}
	if !strings.Contains(body, "eventpipe_collector_log_") {
		t.Errorf("/metrics lacks the store's series (eventpipe_collector_log_*)")
	}
}
