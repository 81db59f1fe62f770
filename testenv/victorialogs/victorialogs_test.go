package victorialogs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func push(t *testing.T, s *Server, job, id string) {
	t.Helper()
	line := fmt.Sprintf(`{"id":%q}`, id)
	body, _ := json.Marshal(map[string]any{"streams": []any{map[string]any{
		"stream": map[string]string{"job": job},
		"values": []any{[]any{fmt.Sprint(time.Now().UnixNano()), line, map[string]string{"event_id": id}}},
	}}})
	resp, err := http.Post(s.PushURL()+"?disable_message_parsing=1", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("push: status %d", resp.StatusCode)
	}
}

// TestStartPushQueryRestart pushes through the Loki API, finds the entry by
// structured metadata, then stops and restarts the server and finds it again
// (same address, same data) and can push once more.
func TestStartPushQueryRestart(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	push(t, s, "vltest", "a-1")
	rows, err := s.WaitFor(ctx, `event_id:"a-1"`, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0]["job"] != "vltest" || rows[0]["_msg"] != `{"id":"a-1"}` {
		t.Fatalf("rows = %v", rows)
	}

	addr := s.Addr()
	s.Stop()
	if s.Running() {
		t.Fatal("running after Stop")
	}
	if _, err := http.Get(s.URL() + "/health"); err == nil {
		t.Fatal("health answered while stopped")
	}
	s.Restart()
	if s.Addr() != addr || !s.Running() {
		t.Fatalf("restart: addr %s (was %s), running %v", s.Addr(), addr, s.Running())
	}
	push(t, s, "vltest", "a-2")
	rows, err = s.WaitFor(ctx, `{job="vltest"}`, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("after restart: %d rows, want 2: %v", len(rows), rows)
	}
}

func TestQueryError(t *testing.T) {
	s := Start(t)
	if _, err := s.Query(context.Background(), `{job=`); err == nil {
		t.Fatal("bad LogsQL: no error")
	}
}
