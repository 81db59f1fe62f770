package enrich

import (
	"encoding/json"
	"strings"
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// blockerVocabEntry is one line of testdata/blockervocab/vocab.jsonl (see its
// README): a wording a Kubernetes component can emit, its format string
// and source, an Event or pod status composed from it, and the diagnosis
// it must get (kind "" for look-alikes).
type blockerVocabEntry struct {
	Component string          `json:"component"`
	Source    string          `json:"source"`
	Format    string          `json:"format"`
	Reason    string          `json:"reason"`
	Message   string          `json:"message"`
	Status    json.RawMessage `json:"status"`
	Kind      string          `json:"kind"`
	Cause     string          `json:"cause"`
	Why       string          `json:"why"`
}

func loadBlockerVocab(t testing.TB) []blockerVocabEntry {
	t.Helper()
	out := readJSONL[blockerVocabEntry](t, "testdata/blockervocab/vocab.jsonl")
	for n, e := range out {
		if e.Component == "" || e.Source == "" || e.Format == "" || (e.Reason == "" && e.Status == nil) {
			t.Fatalf("entry %d: component, source, format and a reason or status are required", n+1)
		}
		if (e.Kind == "") != (e.Cause == "") {
			t.Fatalf("entry %d: kind and cause go together", n+1)
		}
	}
	return out
}

// TestBlockerVocabulary: every wording in the components' own message
// catalogue (vocab.jsonl) gets its kind and cause through the corpus
// test's entry point, look-alikes get none, and each diagnosis has a fix
// without holes.
func TestBlockerVocabulary(t *testing.T) {
	entries := loadBlockerVocab(t)
	if len(entries) < 100 {
		t.Fatalf("want at least 100 wordings, have %d", len(entries))
	}
	var lookalikes int
	for i, e := range entries {
		m := blockerMessage{Reason: e.Reason, Message: e.Message, Kind: e.Kind, Cause: e.Cause}
		if e.Status != nil {
			if err := json.Unmarshal(e.Status, &m.Status); err != nil {
				t.Fatalf("line %d: status: %v", i+1, err)
			}
		}
		kind, cause, ok := classifyEntry(m)
		got, want := none, label(e.Kind, e.Cause)
		if ok {
			got = label(kind, cause)
		}
		if e.Kind == "" {
			lookalikes++
		}
		if got != want {
			t.Errorf("line %d (%s, %s): %s, want %s: %q %q", i+1, e.Component, e.Format, got, want, e.Reason, e.Message)
			continue
		}
		if !ok || m.Status != nil {
			continue
		}
		_, _, object, detail, _ := ClassifyBlocker(e.Reason, e.Message)
		if object == "" {
			// The enricher's fallback: the Event's involved object.
			switch e.Reason {
			case "FailedBinding", "ProvisioningFailed":
				object = "PersistentVolumeClaim/workspace-sb-7f3k2"
			case "FailedCreate":
				object = "ReplicaSet/sb-7f3k2"
			default:
				object = "Pod/sb-7f3k2-0"
			}
		}
		container := "agent"
		if kind != eventpipev1.BlockerKindContainer {
			container = "" // as recordBlocker sets it
		}
		b := &eventpipev1.Blocker{Kind: kind, Cause: cause, Object: object, Detail: detail, Container: container}
		fix := BlockerFix(b)
		if fix == "" || strings.Contains(fix, "  ") || strings.Contains(fix, "()") || strings.HasPrefix(fix, " ") {
			t.Errorf("line %d (%s): fix %q", i+1, e.Format, fix)
		}
	}
	if lookalikes < 10 {
		t.Errorf("want at least 10 look-alikes, have %d", lookalikes)
	}
}

// BenchmarkClassifyBlockerVocabulary classifies every wording of the
// vocabulary in turn (look-alikes included): the blocker rules' cost over
// the components' whole catalogue, not one message.
func BenchmarkClassifyBlockerVocabulary(b *testing.B) {
	entries := loadBlockerVocab(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e := &entries[i%len(entries)]
		ClassifyBlocker(e.Reason, e.Message)
	}
}
