package collector

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// TestReloadEndsStreamsOfRevokedCredentials: a tokens reload ends the open
// streams whose token was removed (Unauthenticated) or given other grants
// (Unavailable: reconnecting gets the new grants), counted; a stream whose
// token did not change keeps running and keeps receiving.
func TestReloadEndsStreamsOfRevokedCredentials(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.yaml")
	writeFile(t, tokens, []byte(tokensFileYML))
	cfgPath := filepath.Join(dir, "collector.yaml")
	writeFile(t, cfgPath, []byte(fmt.Sprintf(reloadConfig, 1<<20, tokens, filepath.Join(dir, "log"), filepath.Join(dir, "e.jsonl"), "Warning")))
	cfg, err := LoadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	r := startCollector(t, cfg, WithConfigPath(cfgPath))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addr := r.c.GRPCAddr()

	open := func(token, ws string) eventpipev1.Follow_FollowClient {
		t.Helper()
		s, err := eventpipev1.NewFollowClient(dial(t, addr, token)).Follow(ctx, &eventpipev1.FollowRequest{Workspace: ws})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Header(); err != nil {
			t.Fatal(err)
		}
		return s
	}
	kept := open(readerWS1, "ws1")    // unchanged by the reload
	removed := open(readerAll, "ws1") // removed by the reload
	changed := open(readerWS2, "ws2") // narrowed from ws2 to ws3
	eventually(t, "three open streams", func() bool {
		r.c.auth.mu.Lock()
		defer r.c.auth.mu.Unlock()
		return len(r.c.auth.open) == 3
	})

	renameWrite(t, tokens, `- {token: agent-token-0123456789, name: agent-a, role: agent, clusters: ["*"]}
- {token: reader-ws1-0123456789, name: reader-ws1, role: reader, workspaces: [ws1]}
- {token: reader-ws2-0123456789, name: reader-ws2, role: reader, workspaces: [ws3]}
`)
	for _, c := range []struct {
		name string
		s    eventpipev1.Follow_FollowClient
		want codes.Code
	}{{"removed token", removed, codes.Unauthenticated}, {"changed grants", changed, codes.Unavailable}} {
		_, err := c.s.Recv()
		if status.Code(err) != c.want {
			t.Errorf("%s: stream ended with %v, want %v", c.name, err, c.want)
		}
	}
	if got := counterValue(t, r.reg, "eventpipe_collector_streams_ended_by_reload_total", nil); got != 2 {
		t.Errorf("streams ended by reload = %v, want 2", got)
	}

	// The unchanged token's stream is still live.
	agent := dial(t, addr, agentToken)
	if _, err := ship(t, ctx, agent, batch(1, "prod", "1", occ("after/1", "sb-1", "ws1", "one", "gw"))); err != nil {
		t.Fatal(err)
	}
	m, err := kept.Recv()
	if err != nil || m.GetOccurrence().GetEventId() != "after/1" {
		t.Fatalf("kept stream: %v, %v; want after/1", m, err)
	}
}
